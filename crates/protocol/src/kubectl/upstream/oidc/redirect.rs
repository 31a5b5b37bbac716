//! Redirects on the IdP client, sans-I/O: what Go's `http.Client` (net/http
//! client.go, Go 1.23 as kubectl v1.32 is built with) decides when an answer
//! is a 3xx: whether to follow it (`redirectBehavior`: 301/302/303 turn any
//! method but GET/HEAD into a body-less GET, 307/308 repeat method and body),
//! where to (`URL.Parse(Location)`, RFC 3986 resolution as Go's
//! `ResolveReference`), whether the `Authorization` header goes along (once a
//! hop leaves the first request's host for one that is neither it nor a
//! subdomain of it, it is dropped for the rest of the chain:
//! `shouldCopyHeaderOnRedirect`), the `Referer` sent, and the stop after 10
//! requests (`defaultCheckRedirect`). As in Go 1.23, whether the body goes
//! along is decided per hop: a 307 after a 303 sends the first POST's body
//! with the GET again (kubectl does; tests/kubectl_proxy/proxy_diff_oidc.rs checks it).
//! Strings in, decisions out.

/// `defaultCheckRedirect`: a redirect is refused once this many requests
/// were sent.
pub const MAX_REQUESTS: usize = 10;

/// Go's `redirectBehavior` for a request whose body can be sent again
/// (every request the IdP client makes has `GetBody`): `Some((method,
/// include_body))` to follow, `None` to hand the answer back.
pub fn redirect_behavior(method: &str, status: u16) -> Option<(String, bool)> {
    match status {
        301..=303 => {
            let m = if method == "GET" || method == "HEAD" {
                method
            } else {
                "GET"
            };
            Some((m.to_string(), false))
        }
        307 | 308 => Some((method.to_string(), true)),
        _ => None,
    }
}

/// The parts of a URL or reference this module needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Parts<'a> {
    scheme: Option<&'a str>,
    /// `//authority` present (even empty).
    authority: Option<&'a str>,
    path: &'a str,
    query: Option<&'a str>,
}

/// Splits as Go's `url.Parse` does for the parts kept (the fragment is
/// dropped: it is never sent).
fn split(raw: &str) -> Result<Parts<'_>, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(format!(
            "parse {raw:?}: net/url: invalid control character in URL"
        ));
    }
    let raw = raw.split('#').next().unwrap_or("");
    // Go's getScheme.
    let mut scheme = None;
    let mut rest = raw;
    for (i, c) in raw.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err(format!("parse {raw:?}: missing protocol scheme")),
            ':' => {
                scheme = Some(&raw[..i]);
                rest = &raw[i + 1..];
                break;
            }
            _ => break,
        }
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.strip_prefix("//") {
        Some(r) => match r.find('/') {
            Some(i) => (Some(&r[..i]), &r[i..]),
            None => (Some(r), ""),
        },
        None => (None, rest),
    };
    Ok(Parts {
        scheme,
        authority,
        path,
        query,
    })
}

/// Go's `resolvePath`: `reference` merged onto `base`, dot segments removed;
/// the result starts with `/` unless it is empty.
fn resolve_path(base: &str, reference: &str) -> String {
    let full = if reference.is_empty() {
        base.to_string()
    } else if !reference.starts_with('/') {
        let dir = base.rfind('/').map_or("", |i| &base[..=i]);
        format!("{dir}{reference}")
    } else {
        reference.to_string()
    };
    if full.is_empty() {
        return String::new();
    }
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = full.trim_start_matches('/').split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// `base.Parse(reference)` (Go `URL.ResolveReference`) as text, without a
/// fragment. `base` is absolute.
pub fn resolve(base: &str, reference: &str) -> Result<String, String> {
    let r = split(reference)?;
    let b = split(base)?;
    // Go lower-cases the scheme.
    let scheme = r.scheme.or(b.scheme).unwrap_or("").to_ascii_lowercase();
    let join = |auth: &str, path: &str, query: Option<&str>| {
        let q = query.map(|q| format!("?{q}")).unwrap_or_default();
        format!("{scheme}://{auth}{path}{q}")
    };
    if r.scheme.is_some() || r.authority.is_some() {
        let auth = r.authority.unwrap_or("");
        return Ok(join(auth, &resolve_path(r.path, ""), r.query));
    }
    let auth = b.authority.unwrap_or("");
    let query = if r.path.is_empty() && r.query.is_none() {
        b.query
    } else {
        r.query
    };
    Ok(join(auth, &resolve_path(b.path, r.path), query))
}

/// `URL.Host` (userinfo dropped, port kept) and `URL.Hostname()`.
fn host_of(url: &str) -> (String, String) {
    let auth = split(url)
        .ok()
        .and_then(|p| p.authority)
        .unwrap_or("")
        .to_string();
    let host = auth.rsplit_once('@').map_or(auth.as_str(), |(_, h)| h);
    let name = if let Some(r) = host.strip_prefix('[') {
        r.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    (host.to_string(), name.to_string())
}

/// Go's `isDomainOrSubdomain` (ASCII names compare as written: Go's
/// `idnaASCII` keeps them).
fn is_domain_or_subdomain(sub: &str, parent: &str) -> bool {
    if sub == parent {
        return true;
    }
    if sub.contains([':', '%']) {
        return false;
    }
    sub.len() > parent.len()
        && sub.ends_with(parent)
        && sub.as_bytes()[sub.len() - parent.len() - 1] == b'.'
}

/// Go's `refererForURL`: the previous URL without userinfo, none from
/// https to http.
fn referer(last: &str, next: &str) -> Option<String> {
    let (l, n) = (split(last).ok()?, split(next).ok()?);
    let lower = |s: Option<&str>| s.map(str::to_ascii_lowercase);
    if lower(l.scheme).as_deref() == Some("https") && lower(n.scheme).as_deref() == Some("http") {
        return None;
    }
    match l.authority.and_then(|a| a.rsplit_once('@')) {
        Some((user, _)) => Some(last.replacen(&format!("{user}@"), "", 1)),
        None => Some(last.to_string()),
    }
}

/// The next request of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub method: String,
    pub url: String,
    /// Send the first request's body (and its length) again.
    pub body: bool,
    /// Send the first request's `Authorization` (if it had one).
    pub authorization: bool,
    pub referer: Option<String>,
}

/// What to do with an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It is the answer.
    Done,
    Follow(Hop),
    /// Go's `url.Error`: `{op} {url:?}: {error}`.
    Fail {
        url: String,
        error: String,
    },
}

/// One request and its redirects (`Client.do`).
#[derive(Debug, Clone)]
pub struct Chain {
    first_method: String,
    first_host: String,
    first_name: String,
    strip_auth: bool,
    sent: usize,
}

impl Chain {
    pub fn new(method: &str, url: &str) -> Chain {
        let (first_host, first_name) = host_of(url);
        Chain {
            first_method: method.to_string(),
            first_host,
            first_name,
            strip_auth: false,
            sent: 0,
        }
    }

    /// `url.Error`'s Op: the first request's method ("Get", "Post").
    pub fn op(&self) -> String {
        let mut m = self.first_method.to_ascii_lowercase();
        if let Some(c) = m.get_mut(..1) {
            c.make_ascii_uppercase();
        }
        m
    }

    /// After the answer `status` (with `location`) to `method url`.
    pub fn next(&mut self, method: &str, url: &str, status: u16, location: Option<&str>) -> Step {
        self.sent += 1;
        let Some((next_method, body)) = redirect_behavior(method, status) else {
            return Step::Done;
        };
        let loc = match location {
            None | Some("") => return Step::Done,
            Some(l) => l,
        };
        let next = match resolve(url, loc) {
            Ok(u) => u,
            Err(e) => {
                return Step::Fail {
                    url: url.to_string(),
                    error: format!("failed to parse Location header {loc:?}: {e}"),
                }
            }
        };
        let (host, name) = host_of(&next);
        if !self.strip_auth
            && host != self.first_host
            && !is_domain_or_subdomain(&name, &self.first_name)
        {
            self.strip_auth = true;
        }
        if self.sent >= MAX_REQUESTS {
            return Step::Fail {
                url: loc.to_string(),
                error: format!("stopped after {MAX_REQUESTS} redirects"),
            };
        }
        Step::Follow(Hop {
            method: next_method,
            referer: referer(url, &next),
            url: next,
            body,
            authorization: !self.strip_auth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behavior_by_status_and_method() {
        let f = |m: &str, s| redirect_behavior(m, s);
        for s in [301, 302, 303] {
            assert_eq!(f("POST", s), Some(("GET".into(), false)), "{s}");
            assert_eq!(f("GET", s), Some(("GET".into(), false)), "{s}");
            assert_eq!(f("HEAD", s), Some(("HEAD".into(), false)), "{s}");
        }
        for s in [307, 308] {
            assert_eq!(f("POST", s), Some(("POST".into(), true)), "{s}");
            assert_eq!(f("GET", s), Some(("GET".into(), true)), "{s}");
        }
        for s in [200, 300, 304, 305, 306, 309, 400] {
            assert_eq!(f("POST", s), None, "{s}");
        }
    }

    #[test]
    fn location_resolved_as_go() {
        let b = "https://idp:8443/a/b/c?x=1#f";
        let cases = [
            ("https://other/t", "https://other/t"),
            ("http://other", "http://other"),
            ("//other:1/p?q", "https://other:1/p?q"),
            ("/t", "https://idp:8443/t"),
            ("t", "https://idp:8443/a/b/t"),
            ("../t", "https://idp:8443/a/t"),
            ("../../../../t", "https://idp:8443/t"),
            ("./", "https://idp:8443/a/b/"),
            ("..", "https://idp:8443/a/"),
            ("?y=2", "https://idp:8443/a/b/c?y=2"),
            ("", "https://idp:8443/a/b/c?x=1"),
            ("#g", "https://idp:8443/a/b/c?x=1"),
            ("/p/./q/../r#frag", "https://idp:8443/p/r"),
            ("HTTPS://x/y", "https://x/y"),
        ];
        for (r, want) in cases {
            assert_eq!(resolve(b, r).as_deref(), Ok(want), "{r:?}");
        }
        assert!(resolve(b, ":x")
            .unwrap_err()
            .contains("missing protocol scheme"));
        assert!(resolve(b, "/a\u{1}")
            .unwrap_err()
            .contains("control character"));
    }

    fn hop(c: &mut Chain, m: &str, u: &str, s: u16, l: &str) -> Hop {
        match c.next(m, u, s, Some(l)) {
            Step::Follow(h) => h,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn post_302_is_a_get_without_body_and_307_keeps_both() {
        let u = "https://idp/token";
        let mut c = Chain::new("POST", u);
        let h = hop(&mut c, "POST", u, 302, "/t2");
        assert_eq!(
            h,
            Hop {
                method: "GET".into(),
                url: "https://idp/t2".into(),
                body: false,
                authorization: true,
                referer: Some(u.into()),
            }
        );
        let mut c = Chain::new("POST", u);
        let h = hop(&mut c, "POST", u, 307, "https://idp:443/t3");
        assert_eq!(
            (h.method.as_str(), h.body, h.authorization),
            ("POST", true, true)
        );
        assert_eq!(c.op(), "Post");
    }

    #[test]
    fn authorization_kept_for_subdomains_dropped_for_the_rest_of_the_chain() {
        let u = "https://example.com:1/p";
        let mut c = Chain::new("GET", u);
        // Another port of the same host; a subdomain.
        assert!(hop(&mut c, "GET", u, 302, "https://example.com:2/p").authorization);
        assert!(hop(&mut c, "GET", u, 302, "https://id.example.com/p").authorization);
        // Not a subdomain: dropped, and not restored on the way back.
        assert!(!hop(&mut c, "GET", u, 302, "https://badexample.com/p").authorization);
        assert!(!hop(&mut c, "GET", u, 302, "https://example.com:1/p").authorization);
        let mut c = Chain::new("GET", "https://127.0.0.1:9/");
        assert!(
            !hop(
                &mut c,
                "GET",
                "https://127.0.0.1:9/",
                307,
                "https://localhost:9/"
            )
            .authorization
        );
        let mut c = Chain::new("GET", "https://[::1]:9/");
        assert!(hop(&mut c, "GET", "https://[::1]:9/", 307, "https://[::1]:8/").authorization);
    }

    #[test]
    fn referer_without_userinfo_and_none_to_plain_http() {
        let mut c = Chain::new("GET", "https://u:p@idp/a");
        let h = hop(&mut c, "GET", "https://u:p@idp/a", 302, "/b");
        assert_eq!(h.url, "https://u:p@idp/b");
        assert_eq!(h.referer.as_deref(), Some("https://idp/a"));
        let h = hop(&mut c, "GET", "https://idp/b", 302, "http://idp/c");
        assert_eq!(h.referer, None);
    }

    #[test]
    fn no_location_or_other_status_is_the_answer_and_ten_requests_stop() {
        let u = "https://idp/";
        let mut c = Chain::new("GET", u);
        assert_eq!(c.next("GET", u, 302, None), Step::Done);
        assert_eq!(c.next("GET", u, 302, Some("")), Step::Done);
        assert_eq!(c.next("GET", u, 200, Some("/x")), Step::Done);
        let mut c = Chain::new("GET", u);
        for _ in 0..9 {
            hop(&mut c, "GET", u, 302, "/again");
        }
        assert_eq!(
            c.next("GET", u, 302, Some("/again")),
            Step::Fail {
                url: "/again".into(),
                error: "stopped after 10 redirects".into()
            }
        );
        let mut c = Chain::new("GET", u);
        match c.next("GET", u, 301, Some(":bad")) {
            Step::Fail { url, error } => {
                assert_eq!(url, u);
                assert!(error.starts_with("failed to parse Location header \":bad\""));
            }
            other => panic!("{other:?}"),
        }
    }
}
