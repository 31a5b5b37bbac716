//! The soak's figures as Markdown tables (tunnels per system; RSS, live
//! heap, descriptors and tunnels left open per system and process) and
//! the names its samples use; pure, so that `tests/bench_report.rs` runs
//! its test.

use crate::model::Sample;
use crate::report::fmt3;

/// The scenario's name in samples.
pub(crate) const SCENARIO: &str = "soak";

/// The points of the soak at which each process's figures are recorded:
/// with the process's role they make a case ("server: before load").
pub(crate) const BEFORE: &str = "before load";
pub(crate) const BASELINE: &str = "baseline";
pub(crate) const END: &str = "end of load";
pub(crate) const AFTER_IDLE: &str = "after idle";
/// The case of a curve's sample: its value is the curve's peak.
pub(crate) const PEAK: &str = "peak";
/// RSS after the idle period over RSS before the load (per process).
pub(crate) const IDLE_RATIO: &str = "RSS after idle ÷ before load";

/// The case of `role`'s figure at `point`.
pub(crate) fn case(role: &str, point: &str) -> String {
    format!("{role}: {point}")
}

/// A column: its header, the point (None: the role alone) and the metric.
type Column<'a> = (&'a str, Option<&'a str>, &'a str);

const RSS: [Column; 9] = [
    ("before load", Some(BEFORE), "RSS MB"),
    ("baseline", Some(BASELINE), "RSS MB"),
    ("end of load", Some(END), "RSS MB"),
    ("after idle", Some(AFTER_IDLE), "RSS MB"),
    ("after idle ÷ before load", None, IDLE_RATIO),
    ("peak", Some(PEAK), "RSS MB"),
    ("B/tunnel", None, "RSS B/tunnel"),
    ("anonymous before load", Some(BEFORE), "anonymous RSS MB"),
    ("anonymous after idle", Some(AFTER_IDLE), "anonymous RSS MB"),
];

const HEAP: [Column; 6] = [
    ("before load", Some(BEFORE), "live heap MB"),
    ("baseline", Some(BASELINE), "live heap MB"),
    ("end of load", Some(END), "live heap MB"),
    ("after idle", Some(AFTER_IDLE), "live heap MB"),
    ("peak", Some(PEAK), "live heap MB"),
    ("B/tunnel", None, "live heap B/tunnel"),
];

const LEFT: [Column; 8] = [
    ("descriptors before load", Some(BEFORE), "descriptors"),
    ("descriptors at end of load", Some(END), "descriptors"),
    ("descriptors after idle", Some(AFTER_IDLE), "descriptors"),
    (
        "open connections after idle",
        Some(AFTER_IDLE),
        "open connections",
    ),
    (
        "pending dials after idle",
        Some(AFTER_IDLE),
        "pending dials",
    ),
    ("goroutines before load", Some(BEFORE), "goroutines"),
    ("goroutines after idle", Some(AFTER_IDLE), "goroutines"),
    (
        "committed heap MB after idle",
        Some(AFTER_IDLE),
        "committed heap MB",
    ),
];

/// The soak's tables, or nothing when it has no samples.
pub(crate) fn table(samples: &[Sample]) -> String {
    let of: Vec<&Sample> = samples.iter().filter(|s| s.scenario == SCENARIO).collect();
    let mut systems: Vec<&str> = Vec::new();
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for s in &of {
        if !systems.contains(&s.system.as_str()) {
            systems.push(&s.system);
        }
        if let Some((role, _)) = s.case.split_once(": ") {
            if !rows.contains(&(s.system.as_str(), role)) {
                rows.push((&s.system, role));
            }
        }
    }
    if systems.is_empty() {
        return String::new();
    }
    let value = |system: &str, case: &str, metric: &str| -> String {
        let mut v: Vec<f64> = of
            .iter()
            .filter(|s| s.system == system && s.case == case && s.metric == metric)
            .map(|s| s.value)
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).map_or("-".to_string(), |x| fmt3(*x))
    };
    let mut md = String::from("### soak: tunnels\n\n");
    md.push_str("| system | tunnels served | tunnels/s | failures |\n|---|---:|---:|---:|\n");
    for sys in &systems {
        let cells: Vec<String> = ["tunnels served", "tunnels/s", "failures"]
            .iter()
            .map(|m| value(sys, "load", m))
            .collect();
        md.push_str(&format!("| {sys} | {} |\n", cells.join(" | ")));
    }
    md.push('\n');
    for (title, columns) in [
        ("soak: RSS, MB", &RSS[..]),
        ("soak: live heap, MB", &HEAP[..]),
        ("soak: what is left open", &LEFT[..]),
    ] {
        md.push_str(&format!("### {title}\n\n| system | process |"));
        for (head, _, _) in columns {
            md.push_str(&format!(" {head} |"));
        }
        md.push_str(&format!("\n|---|---|{}\n", "---:|".repeat(columns.len())));
        for &(sys, role) in &rows {
            let cells: Vec<String> = columns
                .iter()
                .map(|&(_, point, metric)| {
                    let case = point.map_or(role.to_string(), |p| case(role, p));
                    value(sys, &case, metric)
                })
                .collect();
            md.push_str(&format!("| {sys} | {role} | {} |\n", cells.join(" | ")));
        }
        md.push('\n');
    }
    md.push_str(
        "Baseline: the first sample after 10,000 tunnels (quick mode: the first sample of \
         the load); after idle: the last sample of the idle period (60 s; quick: 10 s); \
         B/tunnel: the least-squares slope of the samples from the baseline to the end of the \
         load over tunnels served; peak: the highest sample; anonymous: RSS less the pages of mapped \
         files (the binary's pages that running code made resident). Live heap: edgetunnel's count \
         from its global allocator, the Go processes' `go_memstats_heap_inuse_bytes` (which \
         holds garbage until the next collection: a sawtooth between collections). Goal \
         (issue 40): memory flat over tunnels served (B/tunnel near 0), and RSS after a \
         minute idle within 5 % of the idle start (after idle ÷ before load ≤ 1.05).\n\n",
    );
    md
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn s(system: &str, case: &str, metric: &str, value: f64) -> Sample {
        Sample::of(SCENARIO, case, system, metric, value)
    }

    #[test]
    fn a_row_per_system_and_process_and_a_dash_where_not_measured() {
        let samples = vec![
            s("edgetunnel-grpc", "load", "tunnels served", 120_000.0),
            s("edgetunnel-grpc", "load", "failures", 0.0),
            s("edgetunnel-grpc", "server: before load", "RSS MB", 20.0),
            s("edgetunnel-grpc", "server: after idle", "RSS MB", 20.5),
            s("edgetunnel-grpc", "server", IDLE_RATIO, 1.03),
            s("edgetunnel-grpc", "server", "RSS B/tunnel", 0.5),
            s("edgetunnel-grpc", "agent: before load", "RSS MB", 19.0),
            s("anp-grpc", "load", "tunnels served", 40_000.0),
            s("anp-grpc", "agent: after idle", "live heap MB", 8.0),
        ];
        let md = table(&samples);
        assert!(md.contains("| edgetunnel-grpc | 120,000 | - | 0 |"), "{md}");
        assert!(
            md.contains("| edgetunnel-grpc | server | 20 | - | - | 20.5 | 1.03 | - | 0.5 |"),
            "{md}"
        );
        assert!(md.contains("| edgetunnel-grpc | agent | 19 |"), "{md}");
        assert!(
            md.contains("| anp-grpc | agent | - | - | - | 8 | - | - |"),
            "{md}"
        );
        assert_eq!(table(&[]), "");
    }
}
