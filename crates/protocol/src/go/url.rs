//! Go's `net/url` and `net/http` path rules, reproduced so that
//! `edgetunnel proxy` sees a request exactly as `kubectl proxy` (a Go
//! program) does: the decoded `Path`, the `RawPath` kept beside it, the
//! escaped path written upstream, `path.Clean`, and `net.SplitHostPort`.
//! Pure functions, no I/O.

/// A request target split the way Go's `url.ParseRequestURI` splits it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestUrl {
    /// Scheme and host of an absolute-form target (`http://host/path`).
    pub scheme: String,
    pub host: String,
    /// Decoded path.
    pub path: String,
    /// The path as sent, when it differs from Go's default encoding of `path`.
    pub raw_path: String,
    /// Query without the `?`.
    pub raw_query: String,
    /// A target ending in a lone `?` (kept when writing it back).
    pub force_query: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("invalid URL escape {0:?}")]
    Escape(String),
    #[error("invalid URI for request")]
    InvalidUri,
}

fn is_hex(c: u8) -> bool {
    c.is_ascii_hexdigit()
}

fn unhex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

/// Go's `unescape(s, encodePath)`: `%XX` decoded, `+` kept, a bad escape
/// an error.
pub fn unescape_path(s: &str) -> Result<String, UrlError> {
    let b = s.as_bytes();
    if !b.contains(&b'%') {
        return Ok(s.to_string());
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if i + 2 >= b.len() || !is_hex(b[i + 1]) || !is_hex(b[i + 2]) {
                let end = (i + 3).min(b.len());
                return Err(UrlError::Escape(
                    String::from_utf8_lossy(&b[i..end]).into_owned(),
                ));
            }
            out.push(unhex(b[i + 1]) << 4 | unhex(b[i + 2]));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    // Go strings hold any bytes; an invalid byte is one U+FFFD, as Go's
    // regexp (the filter) and range loops see it.
    Ok(match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => crate::go::regexp::go_runes(e.as_bytes()).into_owned(),
    })
}

/// Go's `shouldEscape(c, encodePath)`.
fn should_escape_path(c: u8) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => c == b'?',
        _ => true,
    }
}

/// Go's `escape(s, encodePath)`.
pub fn escape_path(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if should_escape_path(c) {
            out.push('%');
            out.push(HEX[(c >> 4) as usize] as char);
            out.push(HEX[(c & 15) as usize] as char);
        } else {
            out.push(c as char);
        }
    }
    out
}

/// Go's `validEncoded(s, encodePath)`.
fn valid_encoded(s: &str) -> bool {
    s.bytes().all(|c| match c {
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':'
        | b'@' | b'[' | b']' | b'%' => true,
        c => !should_escape_path(c),
    })
}

impl RequestUrl {
    /// Go's `url.ParseRequestURI` for an HTTP request target (not CONNECT's
    /// authority form, which the caller handles).
    pub fn parse(target: &str) -> Result<RequestUrl, UrlError> {
        let mut url = RequestUrl::default();
        let mut rest = target;
        if rest == "*" {
            url.path = "*".to_string();
            return Ok(url);
        }
        if rest.ends_with('?') && rest.matches('?').count() == 1 {
            url.force_query = true;
            rest = &rest[..rest.len() - 1];
        } else if let Some((a, q)) = rest.split_once('?') {
            url.raw_query = q.to_string();
            rest = a;
        }
        if !rest.starts_with('/') {
            // Absolute form: scheme "://" authority path.
            let Some((scheme, after)) = rest.split_once(':') else {
                return Err(UrlError::InvalidUri);
            };
            let valid_scheme = scheme.bytes().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || b"+-.".contains(&c)))
            });
            if scheme.is_empty() || !valid_scheme || !after.starts_with("//") {
                return Err(UrlError::InvalidUri);
            }
            url.scheme = scheme.to_ascii_lowercase();
            let after = &after[2..];
            let (authority, path) = match after.find('/') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            };
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            url.host = host.to_string();
            rest = path;
        }
        url.set_path(rest)?;
        Ok(url)
    }

    /// Go's `URL.setPath`.
    pub fn set_path(&mut self, p: &str) -> Result<(), UrlError> {
        self.path = unescape_path(p)?;
        self.raw_path = if escape_path(&self.path) == p {
            String::new()
        } else {
            p.to_string()
        };
        Ok(())
    }

    /// Go's `URL.EscapedPath`.
    pub fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty() && valid_encoded(&self.raw_path) {
            if let Ok(p) = unescape_path(&self.raw_path) {
                if p == self.path {
                    return self.raw_path.clone();
                }
            }
        }
        if self.path == "*" {
            return "*".to_string();
        }
        escape_path(&self.path)
    }

    /// Go's `URL.RequestURI` for a URL without scheme: escaped path
    /// (at least `/`) and the query.
    pub fn request_uri(&self) -> String {
        let mut s = self.escaped_path();
        if s.is_empty() {
            s.push('/');
        }
        if self.force_query || !self.raw_query.is_empty() {
            s.push('?');
            s.push_str(&self.raw_query);
        }
        s
    }
}

/// Go's `path.Clean`.
pub fn clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// `net/http`'s `cleanPath`: rooted, cleaned, trailing slash kept.
pub fn clean_path(p: &str) -> String {
    if p.is_empty() {
        return "/".to_string();
    }
    let p = if p.starts_with('/') {
        p.to_string()
    } else {
        format!("/{p}")
    };
    let mut np = clean(&p);
    if p.ends_with('/') && np != "/" {
        np.push('/');
    }
    np
}

/// Go's `net.SplitHostPort`, returning only the host; `None` where Go
/// returns an error (kubectl then filters on an empty host).
pub fn split_host(hostport: &str) -> Option<&str> {
    let i = hostport.rfind(':')?;
    let (host, j, k) = if hostport.starts_with('[') {
        let end = hostport.find(']')?;
        if end + 1 == hostport.len() || end + 1 != i {
            return None;
        }
        (&hostport[1..end], 1, end + 1)
    } else {
        let host = &hostport[..i];
        if host.contains(':') {
            return None;
        }
        (host, 0, 0)
    };
    if hostport[j..].contains('[') || hostport[k..].contains(']') {
        return None;
    }
    Some(host)
}

/// `net/http`'s `htmlEscape` (for redirect bodies and directory listings).
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `net/http`'s `hexEscapeNonASCII` (for Location headers).
pub fn hex_escape_non_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b >= 0x80 {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_raw_path_only_when_it_differs() {
        let u = RequestUrl::parse("/api/v1/a%2Fb?x=1").unwrap();
        assert_eq!(u.path, "/api/v1/a/b");
        assert_eq!(u.raw_path, "/api/v1/a%2Fb");
        assert_eq!(u.raw_query, "x=1");
        assert_eq!(u.request_uri(), "/api/v1/a%2Fb?x=1");
        let u = RequestUrl::parse("/a%20b").unwrap();
        assert_eq!(u.path, "/a b");
        assert_eq!(u.raw_path, "");
        assert_eq!(u.request_uri(), "/a%20b");
        let u = RequestUrl::parse("/a%41").unwrap();
        assert_eq!(u.path, "/aA");
        assert_eq!(u.raw_path, "/a%41");
        assert_eq!(u.escaped_path(), "/a%41");
        assert!(RequestUrl::parse("/a%zz").is_err());
        assert!(RequestUrl::parse("/a%4").is_err());
        assert!(RequestUrl::parse("foo").is_err());
        let u = RequestUrl::parse("http://example.com:80/x?y").unwrap();
        assert_eq!(
            (u.host.as_str(), u.path.as_str(), u.raw_query.as_str()),
            ("example.com:80", "/x", "y")
        );
        let u = RequestUrl::parse("/q?").unwrap();
        assert!(u.force_query);
        assert_eq!(u.request_uri(), "/q?");
    }

    #[test]
    fn stripped_path_loses_raw_form_as_in_go() {
        let mut u = RequestUrl::parse("/custom/a%2Fb").unwrap();
        u.path = "/a/b".to_string();
        assert_eq!(u.escaped_path(), "/a/b");
    }

    #[test]
    fn clean_matches_go() {
        for (i, o) in [
            ("", "."),
            ("/", "/"),
            ("/../a", "/a"),
            ("a/../..", ".."),
            ("/a/./b/", "/a/b"),
            ("//a//b", "/a/b"),
            ("a/b/../../..", ".."),
        ] {
            assert_eq!(clean(i), o, "{i}");
        }
        assert_eq!(clean_path("/a/b/"), "/a/b/");
        assert_eq!(clean_path("a"), "/a");
        assert_eq!(clean_path("/a/../"), "/");
        assert_eq!(clean_path("//x/"), "/x/");
    }

    #[test]
    fn split_host_port_matches_go() {
        assert_eq!(split_host("localhost:8001"), Some("localhost"));
        assert_eq!(split_host("localhost"), None);
        assert_eq!(split_host("[::1]:8001"), Some("::1"));
        assert_eq!(split_host("[::1]"), None);
        assert_eq!(split_host("::1"), None);
        assert_eq!(split_host(":80"), Some(""));
        assert_eq!(split_host("a]:80"), None);
    }
}
