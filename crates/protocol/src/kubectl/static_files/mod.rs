//! The pure parts of Go's `http.FileServer` (net/http/fs.go) for
//! `--www`: HTTP dates ([`httpdate`]), Range headers and multipart layouts
//! ([`ranges`]), the conditional-header decision ([`cond`]), content
//! sniffing ([`sniff`]) and extension-to-type tables ([`mime`]). Opening,
//! listing and reading files stays in the kubectl proxy crate's
//! `static_files`.

pub mod cond;
pub mod httpdate;
pub mod mime;
pub mod ranges;
pub mod sniff;
