//! Prometheus metrics of the tunnel: plain atomics shared by all cores
//! (updated per dial or per chunk, never per byte), rendered as text.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the dial latency histogram buckets.
const DIAL_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Outcome of a dial, a label of `edgetunnel_dials_total`.
#[derive(Debug, Clone, Copy)]
pub enum DialResult {
    Success,
    Failure,
    Timeout,
    NoAgent,
}

#[derive(Default)]
pub struct Metrics {
    pub agents_connected: AtomicI64,
    pub open_connections: AtomicI64,
    pub pending_dials: AtomicI64,
    dials: [AtomicU64; 4],
    pub bytes_to_agent: AtomicU64,
    pub bytes_from_agent: AtomicU64,
    pub frontend_errors: AtomicU64,
    pub agent_protocol_errors: AtomicU64,
    dial_buckets: [AtomicU64; DIAL_BUCKETS.len()],
    dial_count: AtomicU64,
    dial_sum_micros: AtomicU64,
}

impl Metrics {
    pub fn dial_done(&self, result: DialResult, elapsed: Duration) {
        self.dials[result as usize].fetch_add(1, Relaxed);
        if let DialResult::Success = result {
            let secs = elapsed.as_secs_f64();
            for (i, le) in DIAL_BUCKETS.iter().enumerate() {
                if secs <= *le {
                    self.dial_buckets[i].fetch_add(1, Relaxed);
                }
            }
            self.dial_count.fetch_add(1, Relaxed);
            self.dial_sum_micros
                .fetch_add(elapsed.as_micros() as u64, Relaxed);
        }
    }

    pub fn dials(&self, result: DialResult) -> u64 {
        self.dials[result as usize].load(Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let gauge = |s: &mut String, name: &str, help: &str, v: i64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut s,
            "edgetunnel_agents_connected",
            "Agent connections registered.",
            self.agents_connected.load(Relaxed),
        );
        gauge(
            &mut s,
            "edgetunnel_open_connections",
            "Tunneled connections open.",
            self.open_connections.load(Relaxed),
        );
        gauge(
            &mut s,
            "edgetunnel_pending_dials",
            "Dials waiting for the agent's answer.",
            self.pending_dials.load(Relaxed),
        );
        let _ = writeln!(
            s,
            "# HELP edgetunnel_dials_total Dials by result.\n# TYPE edgetunnel_dials_total counter"
        );
        for (i, label) in ["success", "failure", "timeout", "no_agent"]
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                s,
                "edgetunnel_dials_total{{result=\"{label}\"}} {}",
                self.dials[i].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP edgetunnel_bytes_total Payload bytes relayed.\n# TYPE edgetunnel_bytes_total counter");
        let _ = writeln!(
            s,
            "edgetunnel_bytes_total{{direction=\"to_agent\"}} {}",
            self.bytes_to_agent.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "edgetunnel_bytes_total{{direction=\"from_agent\"}} {}",
            self.bytes_from_agent.load(Relaxed)
        );
        let _ = writeln!(s, "# HELP edgetunnel_frontend_errors_total Frontend requests refused or broken.\n# TYPE edgetunnel_frontend_errors_total counter\nedgetunnel_frontend_errors_total {}", self.frontend_errors.load(Relaxed));
        let _ = writeln!(s, "# HELP edgetunnel_agent_protocol_errors_total Agent connections closed for bad input.\n# TYPE edgetunnel_agent_protocol_errors_total counter\nedgetunnel_agent_protocol_errors_total {}", self.agent_protocol_errors.load(Relaxed));
        let _ = writeln!(s, "# HELP edgetunnel_dial_duration_seconds Time from DIAL_REQ to a successful DIAL_RSP.\n# TYPE edgetunnel_dial_duration_seconds histogram");
        for (i, le) in DIAL_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                s,
                "edgetunnel_dial_duration_seconds_bucket{{le=\"{le}\"}} {}",
                self.dial_buckets[i].load(Relaxed)
            );
        }
        let count = self.dial_count.load(Relaxed);
        let _ = writeln!(
            s,
            "edgetunnel_dial_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            s,
            "edgetunnel_dial_duration_seconds_sum {}",
            self.dial_sum_micros.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(s, "edgetunnel_dial_duration_seconds_count {count}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.dial_done(DialResult::Success, Duration::from_millis(3));
        m.dial_done(DialResult::NoAgent, Duration::ZERO);
        let text = m.render();
        assert!(text.contains("edgetunnel_dial_duration_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(text.contains("edgetunnel_dial_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("edgetunnel_dial_duration_seconds_bucket{le=\"+Inf\"} 1"));
        assert!(text.contains("edgetunnel_dials_total{result=\"no_agent\"} 1"));
    }
}
