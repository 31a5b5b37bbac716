//! Extension to MIME type as Go's `mime.TypeByExtension` on Unix: Go's
//! built-in table, then the system database: the first freedesktop
//! `globs2` file found (entries for extensions already known are skipped,
//! so built-ins win), or else every `mime.types` file in Go's list
//! (these override built-ins). Entries go through a port of Go's
//! `mime.ParseMediaType` (a type Go refuses is dropped); a bare `text/sub`
//! gets `charset=utf-8`, and a `text/` type with other parameters but no
//! charset becomes "" (unknown), as Go's `FormatMediaType` gives it. Lookup
//! tries the extension as given, then lower-cased. The table building is
//! sans-I/O ([`Table::add_globs2`], [`Table::add_mime_types`]); the kubectl
//! proxy crate's `static_files::mime::system` reads the files once.

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

/// Why Go's `mime.ParseMediaType` refuses a media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MediaTypeError {
    /// `checkMediaTypeDisposition`: the part before `;` is not `token` or
    /// `token/token`.
    #[error("mime: invalid media type")]
    Type,
    /// A parameter is not `; token = value` (Go's `ErrInvalidMediaParameter`).
    #[error("mime: invalid media parameter")]
    Parameter,
    /// One parameter name twice with different values.
    #[error("mime: duplicate parameter name")]
    Duplicate,
}

/// Go's `isTSpecial` (mime/grammar.go).
fn is_tspecial(b: u8) -> bool {
    b"()<>@,;:\\\"/[]?=".contains(&b)
}

/// Go's `isTokenChar`: printable ASCII other than space and tspecials.
fn is_token_byte(b: u8) -> bool {
    b > 0x20 && b < 0x7f && !is_tspecial(b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_token_byte)
}

/// Go's `strings.ToLower`: rune by rune `unicode.ToLower`, which maps
/// U+0130 to a plain `i` (Rust's full mapping adds U+0307) and knows no
/// final sigma.
fn go_lower(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{130}' => 'i',
            c => c.to_lowercase().next().unwrap_or(c),
        })
        .collect()
}

/// Go's `consumeToken`: the leading token and the rest (an empty token
/// when the first byte is not a token byte).
fn consume_token(v: &str) -> (&str, &str) {
    let end = v.bytes().position(|b| !is_token_byte(b)).unwrap_or(v.len());
    // Token bytes are ASCII, so `end` is a character boundary.
    v.split_at(end)
}

/// Go's `consumeValue`: a token or a quoted string (a backslash escapes
/// only a tspecial; CR or LF, or no closing quote, fail). `None` on failure.
fn consume_value(v: &str) -> Option<(String, &str)> {
    let bytes = v.as_bytes();
    if bytes.first() != Some(&b'"') {
        let (tok, rest) = consume_token(v);
        return (!tok.is_empty()).then(|| (tok.to_string(), rest));
    }
    let mut out = Vec::new();
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return Some((String::from_utf8_lossy(&out).into_owned(), &v[i + 1..])),
            b'\\' if i + 1 < bytes.len() && is_tspecial(bytes[i + 1]) => {
                out.push(bytes[i + 1]);
                i += 2;
                continue;
            }
            b'\r' | b'\n' => return None,
            b => out.push(b),
        }
        i += 1;
    }
    None
}

/// Go's `consumeMediaParam`: `; name = value` (name lower-cased).
fn consume_param(v: &str) -> Option<(String, String, &str)> {
    let rest = v.trim_start().strip_prefix(';')?.trim_start();
    let (name, rest) = consume_token(rest);
    if name.is_empty() {
        return None;
    }
    let rest = rest.trim_start().strip_prefix('=')?.trim_start();
    let (value, rest) = consume_value(rest)?;
    Some((go_lower(name), value, rest))
}

/// Go's `percentHexUnescape`; `None` on a bad `%` escape (`+` is itself,
/// bytes that are not UTF-8 are replaced).
fn percent_unescape(s: &str) -> Option<String> {
    let bytes = crate::go::percent::decode(s, crate::go::percent::Plus::Literal)?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Go's `decode2231Enc`: `charset'lang'percent-encoded`, for `us-ascii`
/// and `utf-8` only.
fn decode_2231(v: &str) -> Option<String> {
    let (charset, v) = v.split_once('\'')?;
    let (_lang, encoded) = v.split_once('\'')?;
    match go_lower(charset).as_str() {
        "us-ascii" | "utf-8" => percent_unescape(encoded),
        _ => None,
    }
}

/// Go's `mime.ParseMediaType` (mime/mediatype.go): the lower-cased type
/// and the parameters by lower-cased name, RFC 2231 continuations
/// (`name*`, `name*0`, `name*1*`, ...) stitched together; a trailing `;`
/// is allowed.
pub fn parse_media_type(v: &str) -> Result<(String, HashMap<String, String>), MediaTypeError> {
    let base = v.split(';').next().unwrap_or("");
    let media = go_lower(base).trim().to_string();
    match consume_token(&media) {
        ("", _) => return Err(MediaTypeError::Type),
        (_, "") => {}
        (_, rest) => match rest.strip_prefix('/').map(consume_token) {
            Some((sub, "")) if !sub.is_empty() => {}
            _ => return Err(MediaTypeError::Type),
        },
    }
    let mut params: HashMap<String, String> = HashMap::new();
    let mut continuation: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut rest = &v[base.len()..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let Some((name, value, after)) = consume_param(rest) else {
            if rest.trim() == ";" {
                break;
            }
            return Err(MediaTypeError::Parameter);
        };
        let map = match name.split_once('*') {
            Some((base_name, _)) => continuation.entry(base_name.to_string()).or_default(),
            None => &mut params,
        };
        if map.get(&name).is_some_and(|old| *old != value) {
            return Err(MediaTypeError::Duplicate);
        }
        map.insert(name, value);
        rest = after;
    }
    for (name, pieces) in continuation {
        if let Some(v) = pieces.get(&format!("{name}*")) {
            if let Some(d) = decode_2231(v) {
                params.insert(name, d);
            }
            continue;
        }
        let mut joined = String::new();
        let mut valid = false;
        for n in 0.. {
            let simple = format!("{name}*{n}");
            if let Some(v) = pieces.get(&simple) {
                valid = true;
                joined.push_str(v);
                continue;
            }
            let Some(v) = pieces.get(&format!("{simple}*")) else {
                break;
            };
            valid = true;
            let part = if n == 0 {
                decode_2231(v)
            } else {
                percent_unescape(v)
            };
            joined.push_str(&part.unwrap_or_default());
        }
        if valid {
            params.insert(name, joined);
        }
    }
    Ok((media, params))
}

/// Go's `mime.FormatMediaType`: `t` must be exactly `token/token` (no
/// parameters, no spaces), else the result is empty; names lower-cased and
/// sorted, values quoted unless tokens; a non-ASCII value gives "".
pub fn format_media_type(t: &str, params: &HashMap<String, String>) -> String {
    let Some((major, sub)) = t.split_once('/') else {
        return String::new();
    };
    if !is_token(major) || !is_token(sub) {
        return String::new();
    }
    let mut out = format!(
        "{}/{}",
        major.to_ascii_lowercase(),
        sub.to_ascii_lowercase()
    );
    let mut names: Vec<&String> = params.keys().collect();
    names.sort();
    for name in names {
        let value = &params[name];
        if !is_token(name) || !value.is_ascii() {
            return String::new();
        }
        out.push_str("; ");
        out.push_str(&name.to_ascii_lowercase());
        out.push('=');
        if is_token(value) {
            out.push_str(value);
        } else {
            out.push('"');
            for c in value.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        }
    }
    out
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

    /// Go's `setExtensionType` (mime/type.go): a type `ParseMediaType`
    /// refuses is dropped; a type starting with `text/` (case-sensitive, on
    /// the text as written) whose `charset` parameter is missing or empty
    /// becomes `FormatMediaType(type, params + charset=utf-8)`, which is
    /// empty unless the type was a bare `text/sub`: an empty type is stored
    /// (it hides any earlier entry and counts as "seen" for `globs2`) and
    /// looks up as unknown, as Go's `TypeByExtension` returns "".
    fn set(&mut self, ext: &str, mime: &str) {
        let Ok((_, mut params)) = parse_media_type(mime) else {
            return;
        };
        let m = if mime.starts_with("text/") && params.get("charset").is_none_or(String::is_empty) {
            params.insert("charset".to_string(), "utf-8".to_string());
            format_media_type(mime, &params)
        } else {
            mime.to_string()
        };
        self.exact.insert(ext.to_string(), m.clone());
        self.lower.insert(go_lower(ext), m);
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
            .or_else(|| self.lower.get(&go_lower(ext)))
            .map(String::as_str)
            .filter(|m| !m.is_empty())
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

    /// Issue 32 (the `static_files` fuzz crash): a `text/` type whose
    /// parameters Go's `ParseMediaType` refuses was kept, with no charset,
    /// because only the part before `;` was checked and `charset=` was
    /// looked for as a substring. Go's `setExtensionType` drops such an
    /// entry; a `text/` type with parameters but no charset becomes "".
    #[test]
    fn text_types_as_go_sets_them() {
        let mut t = Table::builtin();
        t.add_mime_types(
            // The line from the fuzz input (\x0c is whitespace to Go's
            // strings.Fields too): parameters Go cannot parse.
            "text/p;\\l\0\0\0\u{fffd}chcrset=\u{fffd}\x0f\0charsEt=\x0c\x0c.\x0c?\x0c\u{fffd}\n\
             text/p;\\l;charset=x bad\n\
             text/plain;xcharset=1 xcs\n\
             text/plain;charset=latin1 latin\n\
             text/plain;CHARSET=latin1 upper\n\
             text/plain;charset*=utf-8''x%41 ext\n\
             text/plain;charset=\"\" quoted\n\
             text/plain; semi\n\
             text/X-Foo xfoo\n\
             Text/Plain cap\n\
             text/plain;a=1;a=2 dup\n\
             text/plain;x=1 html\n",
        );
        for e in [
            "..",
            ".?",
            ".\u{fffd}",
            ".bad",
            ".xcs",
            ".semi",
            ".dup",
            ".quoted",
            ".html",
        ] {
            assert_eq!(t.lookup(e), None, "{e}");
        }
        assert_eq!(t.lookup(".latin"), Some("text/plain;charset=latin1"));
        assert_eq!(t.lookup(".upper"), Some("text/plain;CHARSET=latin1"));
        assert_eq!(t.lookup(".ext"), Some("text/plain;charset*=utf-8''x%41"));
        assert_eq!(t.lookup(".xfoo"), Some("text/x-foo; charset=utf-8"));
        assert_eq!(t.lookup(".cap"), Some("Text/Plain"));

        // In globs2 an emptied entry still counts as the first one seen.
        let mut g = Table::builtin();
        g.add_globs2("50:text/plain;x=1:*.foo\n40:text/x-bar:*.foo\n30:text/x-baz :*.baz\n");
        assert_eq!(g.lookup(".foo"), None);
        assert_eq!(g.lookup(".baz"), None);
    }

    #[test]
    fn media_type_parser() {
        let (t, p) = parse_media_type(" Text/HTML ; Charset=\"u\\\"8\" ;").unwrap();
        assert_eq!(t, "text/html");
        assert_eq!(p["charset"], "u\"8");
        let (_, p) = parse_media_type("a/b; name*0=x; name*1*=%41; name*2=c").unwrap();
        assert_eq!(p["name"], "xAc");
        let (_, p) = parse_media_type("a/b; c=1; c=1").unwrap();
        assert_eq!(p["c"], "1");
        assert_eq!(parse_media_type("a/b c"), Err(MediaTypeError::Type));
        assert_eq!(parse_media_type("a/"), Err(MediaTypeError::Type));
        assert_eq!(parse_media_type("a/b; c"), Err(MediaTypeError::Parameter));
        assert_eq!(
            parse_media_type("a/b; c=\"x"),
            Err(MediaTypeError::Parameter)
        );
        assert_eq!(
            parse_media_type("a/b; c=1; C=2"),
            Err(MediaTypeError::Duplicate)
        );
        let utf8 = HashMap::from([("charset".to_string(), "utf-8".to_string())]);
        assert_eq!(
            format_media_type("Text/Plain", &utf8),
            "text/plain; charset=utf-8"
        );
        assert_eq!(format_media_type("text/plain;", &utf8), "");
        let q = HashMap::from([("n".to_string(), "a b\"".to_string())]);
        assert_eq!(format_media_type("a/b", &q), "a/b; n=\"a b\\\"\"");
    }

    #[test]
    fn extensions() {
        assert_eq!(ext("a/b.tar.gz"), ".gz");
        assert_eq!(ext("a.b/c"), "");
        assert_eq!(ext(".bashrc"), ".bashrc");
        assert_eq!(ext("x."), ".");
    }
}
