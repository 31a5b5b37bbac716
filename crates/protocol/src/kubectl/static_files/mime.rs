//! Extension to MIME type as Go's `mime.TypeByExtension` on Unix: Go's
//! built-in table, then the system database: the first freedesktop
//! `globs2` file found (entries for extensions already known are skipped,
//! so built-ins win), or else every `mime.types` file in Go's list
//! (these override built-ins). `text/*` types get `charset=utf-8`. Lookup
//! tries the extension as given, then lower-cased. The table building is
//! sans-I/O ([`Table::add_globs2`], [`Table::add_mime_types`]); the main
//! crate's `proxy::static_files::mime::system` reads the files once.

use std::collections::HashMap;

/// Go's `builtinTypesLower`.
const BUILTIN: &[(&str, &str)] = &[
    (".avif", "image/avif"),
    (".css", "text/css; charset=utf-8"),
    (".gif", "image/gif"),
    (".htm", "text/html; charset=utf-8"),
    (".html", "text/html; charset=utf-8"),
    (".jpeg", "image/jpeg"),
    (".jpg", "image/jpeg"),
    (".js", "text/javascript; charset=utf-8"),
    (".json", "application/json"),
    (".mjs", "text/javascript; charset=utf-8"),
    (".pdf", "application/pdf"),
    (".png", "image/png"),
    (".svg", "image/svg+xml"),
    (".wasm", "application/wasm"),
    (".webp", "image/webp"),
    (".xml", "text/xml; charset=utf-8"),
];

/// Go's `mimeGlobs` and `typeFiles` (mime/type_unix.go).
pub const GLOBS_FILES: &[&str] = &["/usr/local/share/mime/globs2", "/usr/share/mime/globs2"];
pub const TYPE_FILES: &[&str] = &[
    "/etc/mime.types",
    "/etc/apache2/mime.types",
    "/etc/apache/mime.types",
    "/etc/httpd/conf/mime.types",
];

#[derive(Debug, Default, Clone)]
pub struct Table {
    exact: HashMap<String, String>,
    lower: HashMap<String, String>,
}

/// A media type Go's `mime.ParseMediaType` would accept, roughly: a
/// `type/subtype` of token characters.
fn valid_media_type(t: &str) -> bool {
    let base = t.split(';').next().unwrap_or("").trim();
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&b))
    };
    matches!(base.split_once('/'), Some((a, b)) if token(a) && token(b))
}

impl Table {
    /// The built-in table alone.
    pub fn builtin() -> Table {
        let mut t = Table::default();
        for (e, m) in BUILTIN {
            t.exact.insert((*e).to_string(), (*m).to_string());
            t.lower.insert((*e).to_string(), (*m).to_string());
        }
        t
    }

    /// Go's `setExtensionType`.
    fn set(&mut self, ext: &str, mime: &str) {
        if !valid_media_type(mime) {
            return;
        }
        let mut m = mime.to_string();
        if m.starts_with("text/") && !m.to_ascii_lowercase().contains("charset=") {
            let base = m
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            m = format!("{base}; charset=utf-8");
        }
        self.exact.insert(ext.to_string(), m.clone());
        self.lower.insert(ext.to_lowercase(), m);
    }

    /// Go's `loadMimeGlobsFile` over the file's text.
    pub fn add_globs2(&mut self, text: &str) {
        for line in text.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 3 || f[0].is_empty() || f[2].len() < 3 {
                continue;
            }
            if f[0].starts_with('#') || !f[2].starts_with("*.") {
                continue;
            }
            let ext = &f[2][1..];
            if ext.contains(['?', '*', '[']) || self.exact.contains_key(ext) {
                continue;
            }
            self.set(ext, f[1]);
        }
    }

    /// Go's `loadMimeFile` over the file's text.
    pub fn add_mime_types(&mut self, text: &str) {
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() <= 1 || f[0].starts_with('#') {
                continue;
            }
            for ext in &f[1..] {
                if ext.starts_with('#') {
                    break;
                }
                self.set(&format!(".{ext}"), f[0]);
            }
        }
    }

    /// Go's `TypeByExtension` (`ext` with its dot); `None` when unknown.
    pub fn lookup(&self, ext: &str) -> Option<&str> {
        if ext.is_empty() {
            return None;
        }
        self.exact
            .get(ext)
            .or_else(|| self.lower.get(&ext.to_lowercase()))
            .map(String::as_str)
    }
}

/// Go's `filepath.Ext`: from the last dot of the last element, or "".
pub fn ext(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.rfind('.').map(|i| &last[i..]).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_and_case() {
        let t = Table::builtin();
        assert_eq!(t.lookup(".html"), Some("text/html; charset=utf-8"));
        assert_eq!(t.lookup(".HTML"), Some("text/html; charset=utf-8"));
        assert_eq!(t.lookup(".txt"), None);
        assert_eq!(t.lookup(""), None);
    }

    #[test]
    fn globs2_keeps_first_and_builtins() {
        let mut t = Table::builtin();
        t.add_globs2(
            "# comment\n80:text/x-foo:*.foo\n50:text/x-bar:*.foo\n\
             50:application/x-evil:*.html\n50:application/x-so:*.so.[0-9]*\n\
             50:text/x-c++src:*.C:cs\n10:bad\n",
        );
        assert_eq!(t.lookup(".foo"), Some("text/x-foo; charset=utf-8"));
        assert_eq!(t.lookup(".html"), Some("text/html; charset=utf-8"));
        assert_eq!(t.lookup(".C"), Some("text/x-c++src; charset=utf-8"));
        assert_eq!(t.lookup(".c"), Some("text/x-c++src; charset=utf-8"));
        assert_eq!(t.lookup(".so.1"), None);
    }

    #[test]
    fn mime_types_override() {
        let mut t = Table::builtin();
        t.add_mime_types(
            "# x\ntext/plain txt text # not this\napplication/x-mine html\nimage/bad\n",
        );
        assert_eq!(t.lookup(".txt"), Some("text/plain; charset=utf-8"));
        assert_eq!(t.lookup(".text"), Some("text/plain; charset=utf-8"));
        assert_eq!(t.lookup(".not"), None);
        assert_eq!(t.lookup(".html"), Some("application/x-mine"));
    }

    #[test]
    fn extensions() {
        assert_eq!(ext("a/b.tar.gz"), ".gz");
        assert_eq!(ext("a.b/c"), "");
        assert_eq!(ext(".bashrc"), ".bashrc");
        assert_eq!(ext("x."), ".");
    }
}
