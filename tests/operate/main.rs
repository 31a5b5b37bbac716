//! Operating it: logs and their formats, errors that name the cause, the
//! Go binaries' command-line faces, and a server whose stdout and stderr
//! are closed.

#[path = "../support/mod.rs"]
mod support;

mod closed_stdout;
mod compat_flags;
mod operator_errors;
mod ops_logs;
