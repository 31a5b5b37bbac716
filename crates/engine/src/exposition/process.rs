//! The process families Go's client exports by default (`process_*`,
//! read from `/proc/self` at each scrape, as client_golang's
//! `process_collector_procfs.go` does) and `edgetunnel_build_info`. Shared
//! by the server's, the agent's and the proxy's `/metrics`.
//!
//! Reads a few small procfs files per scrape; never on a data-plane hot
//! path (scrapes are served by the admin listener).

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::sys::sysconf;

/// The commit this binary was built from (`git rev-parse` at build time,
/// `unknown` outside a git checkout).
pub const COMMIT: &str = env!("EDGETUNNEL_COMMIT");
/// The compiler that built it (`rustc --version`).
pub const RUSTC: &str = env!("EDGETUNNEL_RUSTC");
/// `--version`'s text: the crate version and the commit.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EDGETUNNEL_COMMIT"),
    ", ",
    env!("EDGETUNNEL_RUSTC"),
    ")"
);

/// What `/proc/self` says now; `None` where a file could not be read.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

/// Fields of `/proc/self/stat` after the command name (which may hold
/// spaces and parentheses): index 0 is field 3 (`state`).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// `btime` of `/proc/stat`: boot time, seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft "Max open files" limit in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    match soft {
        "unlimited" => Some(f64::INFINITY),
        n => n.parse().ok(),
    }
}

impl ProcessStats {
    /// Reads `/proc/self` (and `/proc/stat` for the boot time).
    pub fn read() -> ProcessStats {
        let ticks = sysconf(libc::_SC_CLK_TCK);
        let page = sysconf(libc::_SC_PAGESIZE);
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields);
        // Fields 14 utime, 15 stime, 22 starttime, 23 vsize, 24 rss
        // (proc(5)), here at index field - 3.
        let num = |i: usize| -> Option<f64> { fields.as_ref()?.get(i)?.parse().ok() };
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .as_deref()
            .and_then(boot_time);
        ProcessStats {
            cpu_seconds: num(11)
                .zip(num(12))
                .zip(ticks)
                .map(|((u, s), t)| (u + s) / t),
            virtual_bytes: num(20),
            resident_bytes: num(21).zip(page).map(|(r, p)| r * p),
            start_time_seconds: num(19).zip(ticks).zip(boot).map(|((s, t), b)| b + s / t),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as f64),
            max_fds: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .as_deref()
                .and_then(max_open_files),
        }
    }
}

/// Renders [`ProcessStats`] at each scrape, and the build info.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: Option<f64>) -> fmt::Result {
    if let Some(v) = v {
        ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
    }
    Ok(())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = ProcessStats::read();
        if let Some(cpu) = s.cpu_seconds {
            // Named without `_total`: the encoder adds it to counters.
            ConstCounter::new(cpu).encode(e.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                MetricType::Counter,
            )?)?;
        }
        gauge(
            &mut e,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            s.max_fds,
        )?;
        gauge(
            &mut e,
            "process_open_fds",
            "Number of open file descriptors.",
            s.open_fds,
        )?;
        gauge(
            &mut e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            s.resident_bytes,
        )?;
        gauge(
            &mut e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time_seconds,
        )?;
        gauge(
            &mut e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            s.virtual_bytes,
        )?;
        // Beside resident memory: what the program holds (a leak grows it)
        // and what the allocator took from the system (its retention).
        gauge(
            &mut e,
            "edgetunnel_heap_live_bytes",
            "Bytes allocated and not yet freed, counted by the global allocator.",
            crate::heap::live_bytes().map(|b| b as f64),
        )?;
        gauge(
            &mut e,
            "edgetunnel_heap_committed_bytes",
            "Bytes the allocator (mimalloc) has committed from the system.",
            crate::heap::committed_bytes().map(|b| b as f64),
        )?;
        gauge(
            &mut e,
            "edgetunnel_buffered_bytes",
            "Payload bytes queued for tunnels and streams and not yet written.",
            Some(crate::budget::buffered_bytes() as f64),
        )?;
        gauge(
            &mut e,
            "edgetunnel_thread_buffer_bytes",
            "Bytes of read and write buffers the data-plane threads keep between loans to connections (given back when a thread goes quiet).",
            Some(crate::thread_buf::held_bytes() as f64),
        )?;
        gauge(
            &mut e,
            "edgetunnel_tunnel_window_growth_bytes",
            "Bytes by which open tunnels' windows have grown past their first 2 MiB (window-growth, as the agent link's round trip asks).",
            Some(crate::window::window_growth_bytes() as f64),
        )?;
        gauge(
            &mut e,
            "edgetunnel_agent_link_window_growth_bytes",
            "Bytes by which agent links' own HTTP/2 receive windows have grown past 16 MiB (links whose tunnels have no growing windows, such as the Go agent's, as their round trip asks).",
            Some(crate::link_window::link_window_growth_bytes() as f64),
        )?;
        {
            let m = e.encode_descriptor(
                "edgetunnel_agent_link_rtt_seconds",
                "Round trips of agent links, read from the kernel (TCP_INFO) while tunnels carry data, at most every 250 ms a link.",
                None,
                MetricType::Histogram,
            )?;
            crate::window::link_rtt_histogram().encode(m)?;
        }
        gauge(
            &mut e,
            "edgetunnel_deadlines",
            "Idle and keepalive deadlines held by connections, on every worker.",
            Some(crate::deadline::held() as f64),
        )?;
        let labels = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", COMMIT),
            ("rustc", RUSTC),
        ];
        let mut m = e.encode_descriptor(
            "edgetunnel_build_info",
            "The build of this binary: crate version, git commit, compiler. Always 1.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_skip_a_command_with_spaces_and_parens() {
        let f = stat_fields("123 (a b) c) S 1 2 3").unwrap();
        assert_eq!(f, ["S", "1", "2", "3"]);
    }

    #[test]
    fn limits_and_boot_time_parse() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024.0));
        assert_eq!(boot_time("cpu 1 2\nbtime 1700000000\n"), Some(1.7e9));
    }

    #[test]
    fn this_process_reads_sanely() {
        let s = ProcessStats::read();
        assert!(s.resident_bytes.unwrap() > 0.0);
        assert!(s.virtual_bytes.unwrap() >= s.resident_bytes.unwrap());
        assert!(s.open_fds.unwrap() >= 3.0);
        assert!(s.max_fds.unwrap() >= s.open_fds.unwrap());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86400.0 * 365.0,
            "{start}"
        );
        assert!(s.cpu_seconds.unwrap() >= 0.0);
    }
}
