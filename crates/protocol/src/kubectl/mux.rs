//! Request routing as kubectl's `http.ServeMux` does it: the API prefix and
//! (with `--www`) the static prefix as subtree patterns, path cleaning with
//! a 301 to the clean path, the `/tree` -> `/tree/` redirect, 404 for the
//! rest; then kubectl's prefix stripping for each handler.

use crate::go::url::{clean_path, escape_path, RequestUrl};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// 301 to `location` (before Go's `Redirect` rewrites it).
    Redirect(String),
    NotFound,
    /// 400 with an empty body (`OPTIONS *` and the like).
    BadRequest,
    /// A static file: the decoded path below the static prefix.
    Static(String),
    /// Forward upstream with this URL (prefix stripped as kubectl does).
    Proxy(RequestUrl),
}

#[derive(Debug, Clone)]
pub struct Mux {
    /// Ends with `/`.
    pub api_prefix: String,
    /// Ends with `/`; only with `--www`.
    pub static_prefix: Option<String>,
}

enum Handler {
    Api,
    Static,
}

impl Mux {
    fn patterns(&self) -> impl Iterator<Item = (&str, Handler)> {
        std::iter::once((self.api_prefix.as_str(), Handler::Api))
            .chain(self.static_prefix.as_deref().map(|p| (p, Handler::Static)))
    }

    /// The longest subtree pattern that `path` falls under.
    fn lookup(&self, path: &str) -> Option<(&str, Handler)> {
        self.patterns()
            .filter(|(p, _)| path.starts_with(p))
            .max_by_key(|(p, _)| p.len())
    }

    /// Whether `path` ends exactly at a pattern (Go's `exactMatch` for a
    /// subtree pattern: as many slashes as the pattern has segments).
    fn exact(&self, path: &str) -> bool {
        match self.lookup(path) {
            Some((p, _)) => {
                path.ends_with('/') && p.matches('/').count() == path.matches('/').count()
            }
            None => false,
        }
    }

    /// Routes a request with `method` and target `url`.
    pub fn route(&self, method: &str, target: &str, url: &RequestUrl) -> Route {
        if target == "*" {
            return Route::BadRequest;
        }
        let escaped = url.escaped_path();
        let path = if method == "CONNECT" {
            escaped.clone()
        } else {
            clean_path(&escaped)
        };
        // The /tree -> /tree/ redirect.
        if !self.exact(&path) && !path.ends_with('/') {
            let slashed = format!("{path}/");
            if self.exact(&slashed) {
                return Route::Redirect(url_string(&format!("{}/", clean_path(&url.path)), url));
            }
        }
        if method != "CONNECT" && path != escaped {
            return Route::Redirect(url_string(&path, url));
        }
        let Some((pattern, handler)) = self.lookup(&path) else {
            return Route::NotFound;
        };
        match handler {
            Handler::Static => {
                // http.StripPrefix on Path and RawPath.
                let stripped = url.path.strip_prefix(pattern);
                let raw_ok = url.raw_path.is_empty() || url.raw_path.starts_with(pattern);
                match stripped {
                    Some(p) if raw_ok => Route::Static(p.to_string()),
                    _ => Route::NotFound,
                }
            }
            Handler::Api => {
                if pattern.starts_with("/api") {
                    return Route::Proxy(url.clone());
                }
                // kubectl's stripLeaveSlash: on the decoded path only.
                let Some(p) = url.path.strip_prefix(pattern) else {
                    return Route::NotFound;
                };
                let p = if !p.is_empty() && !p.starts_with('/') {
                    format!("/{p}")
                } else {
                    p.to_string()
                };
                let mut out = url.clone();
                out.path = p;
                Route::Proxy(out)
            }
        }
    }
}

/// `url.URL{Path: path, RawQuery: ..}.String()`.
fn url_string(path: &str, url: &RequestUrl) -> String {
    let mut s = escape_path(path);
    if !url.raw_query.is_empty() {
        s.push('?');
        s.push_str(&url.raw_query);
    }
    s
}

/// What Go's `http.Redirect` puts in Location for a path-only URL: cleaned
/// with the trailing slash kept, the query after it.
pub fn redirect_location(url: &str) -> String {
    let (path, query) = match url.find('?') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    let mut cleaned = crate::go::url::clean(path);
    if path.ends_with('/') && !cleaned.ends_with('/') {
        cleaned.push('/');
    }
    crate::go::url::hex_escape_non_ascii(&format!("{cleaned}{query}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mux(api: &str, stat: Option<&str>) -> Mux {
        Mux {
            api_prefix: api.to_string(),
            static_prefix: stat.map(str::to_string),
        }
    }

    fn route(m: &Mux, method: &str, target: &str) -> Route {
        m.route(method, target, &RequestUrl::parse(target).unwrap())
    }

    #[test]
    fn root_prefix_forwards_everything_clean() {
        let m = mux("/", None);
        match route(&m, "GET", "/api/v1/pods?watch=1") {
            Route::Proxy(u) => assert_eq!(u.request_uri(), "/api/v1/pods?watch=1"),
            r => panic!("{r:?}"),
        }
        assert_eq!(route(&m, "GET", "/a/../b"), Route::Redirect("/b".into()));
        assert_eq!(
            route(&m, "GET", "//x?q=1"),
            Route::Redirect("/x?q=1".into())
        );
    }

    #[test]
    fn custom_prefix_strips_and_redirects() {
        let m = mux("/custom/", Some("/static/"));
        match route(&m, "GET", "/custom/api/v1") {
            Route::Proxy(u) => assert_eq!(u.request_uri(), "/api/v1"),
            r => panic!("{r:?}"),
        }
        assert_eq!(
            route(&m, "GET", "/custom"),
            Route::Redirect("/custom/".into())
        );
        assert_eq!(
            route(&m, "GET", "/static"),
            Route::Redirect("/static/".into())
        );
        assert_eq!(route(&m, "GET", "/other"), Route::NotFound);
        assert_eq!(
            route(&m, "GET", "/static/a/b.txt"),
            Route::Static("a/b.txt".into())
        );
    }

    #[test]
    fn api_prefix_is_not_stripped() {
        let m = mux("/api/", None);
        match route(&m, "GET", "/api/v1") {
            Route::Proxy(u) => assert_eq!(u.path, "/api/v1"),
            r => panic!("{r:?}"),
        }
        assert_eq!(route(&m, "GET", "/apis/x"), Route::NotFound);
    }

    #[test]
    fn go_redirect_location() {
        assert_eq!(redirect_location("/a/./b/?x"), "/a/b/?x");
        assert_eq!(redirect_location("/é"), "/%c3%a9");
    }
}
