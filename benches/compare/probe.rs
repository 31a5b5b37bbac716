//! What the harness reads of a running process from outside: its resident
//! memory and open descriptors from /proc, and its Prometheus text from
//! a /metrics endpoint (edgetunnel's admin listener, the Go ANP's admin
//! and health ports). Reads only; a process that is gone or a port that
//! does not answer gives None (or 0 where noted).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// VmRSS of `pid`, bytes (0 when gone).
pub(crate) fn rss(pid: u32) -> u64 {
    kib_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// The `field` line of a /proc file that counts in kB ("VmRSS:   1234
/// kB"), in bytes; 0 when the file or the line is missing.
pub(crate) fn kib_field(path: &str, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Descriptors `pid` holds open (entries of /proc/PID/fd), None when gone.
pub(crate) fn open_fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|rd| rd.count())
}

/// The whole answer (head and body) to `GET /metrics` at `addr`, None
/// when it does not answer within a few seconds. Asked in HTTP/1.0, so
/// that the body comes whole: Go's server sends a large body to an
/// HTTP/1.1 client in chunks, whose size lines can cut a metric's line.
pub(crate) fn metrics_text(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The sum of every series of metric `name` in Prometheus text (`name`
/// alone or with labels; not `name_total` or `name_bucket`), None when
/// the text has none.
pub(crate) fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(labelled) = rest.strip_prefix('{') {
            labelled.rsplit_once('}').map(|(_, v)| v)
        } else {
            rest.starts_with(' ').then_some(rest)
        };
        if let Some(v) = value.and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok()) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// The first of `names` that `text` has, summed over its series.
pub(crate) fn first_metric(text: &str, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| metric_sum(text, n))
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[test]
    fn sums_the_series_of_one_name_only() {
        let text = "# HELP x_open Open.\n# TYPE x_open gauge\n\
                    x_open{kind=\"a\"} 2\nx_open{kind=\"b\"} 3.5\n\
                    x_open_total 9\nx_opened 7\nx_live 1.2e+06\n";
        assert_eq!(metric_sum(text, "x_open"), Some(5.5));
        assert_eq!(metric_sum(text, "x_live"), Some(1.2e6));
        assert_eq!(metric_sum(text, "x_gone"), None);
        assert_eq!(first_metric(text, &["x_gone", "x_opened"]), Some(7.0));
    }

    #[test]
    fn this_process_has_memory_and_descriptors() {
        let me = std::process::id();
        assert!(rss(me) > 0);
        assert!(open_fds(me).is_some_and(|n| n > 0));
        assert_eq!(rss(u32::MAX), 0);
    }
}
