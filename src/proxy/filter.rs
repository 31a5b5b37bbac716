//! kubectl's `FilterServer`: comma-separated regular expression lists for
//! paths, methods and hosts, evaluated in kubectl's order.

use regex::{Regex, RegexSet};

use super::gourl::split_host;

pub const DEFAULT_ACCEPT_PATHS: &str = "^.*";
pub const DEFAULT_REJECT_PATHS: &str = r"^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach";
pub const DEFAULT_ACCEPT_HOSTS: &str = r"^localhost$,^127\.0\.0\.1$,^\[::1\]$";
pub const DEFAULT_REJECT_METHODS: &str = "^$";

#[derive(Debug, thiserror::Error)]
#[error("invalid regular expression {pattern:?}: {source}")]
pub struct FilterError {
    pattern: String,
    source: regex::Error,
}

/// kubectl's `MakeRegexpArray`: an empty string is an empty list, otherwise
/// each comma-separated part is one expression (unanchored, as Go's
/// `MatchString`).
pub fn regexp_list(s: &str) -> Result<Vec<Regex>, FilterError> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|p| {
            Regex::new(p).map_err(|source| FilterError {
                pattern: p.to_string(),
                source,
            })
        })
        .collect()
}

/// One list as a set matched in a single pass (any member matching).
fn set(s: &str) -> Result<RegexSet, FilterError> {
    let list = regexp_list(s)?;
    RegexSet::new(list.iter().map(Regex::as_str)).map_err(|source| FilterError {
        pattern: s.to_string(),
        source,
    })
}

fn matches(s: &str, list: &RegexSet) -> bool {
    list.is_match(s)
}

#[derive(Debug, Clone)]
pub struct Filter {
    pub accept_paths: RegexSet,
    pub reject_paths: RegexSet,
    pub accept_hosts: RegexSet,
    pub reject_methods: RegexSet,
}

impl Filter {
    pub fn new(
        accept_paths: &str,
        reject_paths: &str,
        accept_hosts: &str,
        reject_methods: &str,
    ) -> Result<Filter, FilterError> {
        Ok(Filter {
            accept_paths: set(accept_paths)?,
            reject_paths: set(reject_paths)?,
            accept_hosts: set(accept_hosts)?,
            reject_methods: set(reject_methods)?,
        })
    }

    /// kubectl's `accept(method, path, host)`.
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
