//! kubectl's klog verbosity (`-v`, `--vmodule`) mapped onto edgetunnel's
//! tracing filter. kubectl logs its proxy's filter decisions at -v4
//! (proxy_server.go) and one line per upstream round trip at -v6
//! (client-go round_trippers.go: `GET URL 200 OK in 1 milliseconds`);
//! edgetunnel adds `edgetunnel=debug` to the log filter from -v4 on and
//! writes the same round-trip line (at info) from -v6 on. `--vmodule`
//! entries count when their pattern (a glob on Go file names, as klog
//! matches them) names one of the kubectl files that log those lines.

/// Verbosity from which edgetunnel's own debug logs are on.
pub const DEBUG: i64 = 4;
/// Verbosity from which each upstream round trip is logged.
pub const ROUND_TRIPS: i64 = 6;

/// The kubectl/client-go files whose logs the proxy's logs stand for.
const FILES: [&str; 3] = ["proxy_server", "upgradeaware", "round_trippers"];

/// The verbosity in effect: `-v`, raised by `--vmodule` entries naming the
/// proxy's files (malformed entries were refused when flags were parsed).
pub fn verbosity(v: i64, vmodule: &str) -> i64 {
    let mut out = v;
    for entry in vmodule.split(',').filter(|e| !e.is_empty()) {
        let Some((pat, n)) = entry.split_once('=') else {
            continue;
        };
        let Ok(n) = n.parse::<i64>() else { continue };
        if FILES.iter().any(|f| glob(pat.as_bytes(), f.as_bytes())) {
            out = out.max(n);
        }
    }
    out
}

/// The tracing filter for `base` (the --log filter) at `verbosity`.
pub fn filter(base: &str, verbosity: i64) -> String {
    if verbosity >= DEBUG {
        format!("{base},edgetunnel=debug")
    } else {
        base.to_string()
    }
}

/// klog's pattern match (Go's `filepath.Match` with `*` and `?`).
fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
        _ => false,
    }
}

/// client-go's round-trip line at -v6 (`round_trippers.go`).
pub fn round_trip_line(method: &str, url: &str, status: u16, reason: &str, ms: u128) -> String {
    format!("{method} {url} {status} {reason} in {ms} milliseconds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmodule_raises_verbosity_for_proxy_files() {
        assert_eq!(verbosity(2, ""), 2);
        assert_eq!(verbosity(0, "round_trippers=6"), 6);
        assert_eq!(verbosity(0, "round*=7,foo=9"), 7);
        assert_eq!(verbosity(5, "proxy_server=1"), 5);
        assert_eq!(verbosity(0, "*=4"), 4);
        assert_eq!(verbosity(0, "proxy_?erver=4"), 4);
        assert_eq!(verbosity(0, "proxy=4"), 0);
        assert_eq!(filter("warn", 3), "warn");
        assert_eq!(filter("warn", 4), "warn,edgetunnel=debug");
        assert_eq!(
            round_trip_line("GET", "http://h/api", 200, "OK", 1),
            "GET http://h/api 200 OK in 1 milliseconds"
        );
    }
}
