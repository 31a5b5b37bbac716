//! kubectl's `FilterServer`: comma-separated regular expression lists for
//! paths, methods and hosts, evaluated in kubectl's order, with Go's
//! `regexp` semantics ([`crate::go::regexp`]): the filter is a security
//! boundary, so a pattern means here exactly what it means to kubectl.

use crate::go::regexp::{GoRegex, GoRegexError};
use crate::go::url::split_host;

pub const DEFAULT_ACCEPT_PATHS: &str = "^.*";
pub const DEFAULT_REJECT_PATHS: &str = r"^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach";
pub const DEFAULT_ACCEPT_HOSTS: &str = r"^localhost$,^127\.0\.0\.1$,^\[::1\]$";
pub const DEFAULT_REJECT_METHODS: &str = "^$";

/// kubectl's message is Go's `regexp.Compile` error as is.
pub type FilterError = GoRegexError;

/// kubectl's `MakeRegexpArray`: an empty string is an empty list, otherwise
/// `strings.Split(s, ",")` and each part compiled on its own (unanchored,
/// as Go's `MatchString`), so `v{1,3}` is the two patterns `v{1` and `3}`.
pub fn regexp_list(s: &str) -> Result<Vec<GoRegex>, FilterError> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(GoRegex::new).collect()
}

/// kubectl's `matchesRegexp`: any member matching.
fn matches(s: &str, list: &[GoRegex]) -> bool {
    list.iter().any(|r| r.is_match(s))
}

#[derive(Debug, Clone)]
pub struct Filter {
    pub accept_paths: Vec<GoRegex>,
    pub reject_paths: Vec<GoRegex>,
    pub accept_hosts: Vec<GoRegex>,
    pub reject_methods: Vec<GoRegex>,
}

impl Filter {
    pub fn new(
        accept_paths: &str,
        reject_paths: &str,
        accept_hosts: &str,
        reject_methods: &str,
    ) -> Result<Filter, FilterError> {
        Ok(Filter {
            accept_paths: regexp_list(accept_paths)?,
            reject_paths: regexp_list(reject_paths)?,
            accept_hosts: regexp_list(accept_hosts)?,
            reject_methods: regexp_list(reject_methods)?,
        })
    }

    /// kubectl's `accept(method, path, host)`. `path` and `host` are Go
    /// strings as [`crate::go::regexp::go_runes`] renders them.
    pub fn accept(&self, method: &str, path: &str, host: &str) -> bool {
        if matches(path, &self.reject_paths) || matches(method, &self.reject_methods) {
            return false;
        }
        matches(path, &self.accept_paths) && matches(host, &self.accept_hosts)
    }

    /// The filter as kubectl's `ServeHTTP` applies it: the host part of the
    /// Host header by `net.SplitHostPort` (the whole header when that fails,
    /// so `[::1]` passes the default filter and `[::1]:8001` does not) and
    /// the decoded path.
    pub fn allows(&self, method: &str, decoded_path: &str, host_header: &str) -> bool {
        let host = split_host(host_header).unwrap_or(host_header);
        self.accept(method, decoded_path, host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default() -> Filter {
        Filter::new(
            DEFAULT_ACCEPT_PATHS,
            DEFAULT_REJECT_PATHS,
            DEFAULT_ACCEPT_HOSTS,
            DEFAULT_REJECT_METHODS,
        )
        .unwrap()
    }

    #[test]
    fn default_filter_follows_kubectl() {
        let f = default();
        assert!(f.allows("GET", "/api/v1/pods", "localhost:8001"));
        assert!(f.allows("GET", "/api/v1/pods", "127.0.0.1:8001"));
        // Without a port the whole Host header is matched.
        assert!(f.allows("GET", "/api/v1/pods", "localhost"));
        assert!(f.allows("GET", "/api/v1/pods", "[::1]"));
        // With a port the brackets are stripped, so `^\[::1\]$` fails.
        assert!(!f.allows("GET", "/api/v1/pods", "[::1]:8001"));
        assert!(!f.allows("POST", "/api/v1/namespaces/d/pods/p/exec", "localhost:1"));
        assert!(!f.allows("GET", "/api/v1/namespaces/d/pods/p/attach", "localhost:1"));
        assert!(f.allows("GET", "/apis/v1/namespaces/d/pods/p/exec", "localhost:1"));
        assert!(!f.allows("GET", "/api/v1", "example.com:80"));
    }

    #[test]
    fn lists_and_errors() {
        assert!(regexp_list("").unwrap().is_empty());
        assert_eq!(regexp_list("a,b").unwrap().len(), 2);
        assert!(regexp_list("(").is_err());
        let f = Filter::new("^/ok", "", ".*", "POST,PUT").unwrap();
        assert!(f.accept("GET", "/ok", ""));
        assert!(!f.accept("PUT", "/ok", ""));
        assert!(!f.accept("GET", "/no", ""));
    }
}
