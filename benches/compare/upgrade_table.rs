//! The upgrade scenario's figures as a Markdown table (one row per
//! system: dials and failures across the replacements, tunnels cut, how
//! long until the new server carried tunnels) and the names its samples
//! use; pure, so that `tests/bench_report.rs` runs its test.

use crate::model::Sample;
use crate::report::fmt3;

/// The scenario's name in samples.
pub(crate) const SCENARIO: &str = "upgrade";

/// Cases: the load before the first replacement, and each replacement
/// (its repetition number), from its start to the next one's.
pub(crate) const STEADY: &str = "before the first replacement";
pub(crate) const RESTART: &str = "replacement";

/// Metrics.
pub(crate) const DIALS: &str = "dials";
pub(crate) const FAILED: &str = "failed dials";
pub(crate) const LONGEST_MS: &str = "longest dial ms";
pub(crate) const CUT: &str = "tunnels cut";
pub(crate) const HELD: &str = "tunnels held";
pub(crate) const READY_S: &str = "new server ready s";
pub(crate) const OLD_GONE_S: &str = "old server gone s";

/// The table, or nothing when the scenario has no samples.
pub(crate) fn table(samples: &[Sample]) -> String {
    let of: Vec<&Sample> = samples.iter().filter(|s| s.scenario == SCENARIO).collect();
    let mut systems: Vec<&str> = Vec::new();
    for s in &of {
        if !systems.contains(&s.system.as_str()) {
            systems.push(&s.system);
        }
    }
    if systems.is_empty() {
        return String::new();
    }
    let values = |system: &str, case: &str, metric: &str| -> Vec<f64> {
        of.iter()
            .filter(|s| s.system == system && s.case == case && s.metric == metric)
            .map(|s| s.value)
            .collect()
    };
    let sum = |v: &[f64]| -> String {
        if v.is_empty() {
            "-".to_string()
        } else {
            fmt3(v.iter().sum())
        }
    };
    let per = |v: &[f64]| -> String {
        if v.is_empty() {
            return "-".to_string();
        }
        v.iter().map(|x| fmt3(*x)).collect::<Vec<_>>().join(", ")
    };
    let mut md = String::from(
        "### upgrade: the server replaced under load\n\n\
         | system | replacements | dials | failed dials | failed per replacement | \
         tunnels cut / held | longest dial, ms | new server ready, s | old server gone, s | \
         failed before the first |\n\
         |---|---:|---:|---:|---|---:|---|---|---|---:|\n",
    );
    for sys in &systems {
        let dials = values(sys, RESTART, DIALS);
        let failed = values(sys, RESTART, FAILED);
        let cut = values(sys, RESTART, CUT);
        let held = values(sys, RESTART, HELD);
        md.push_str(&format!(
            "| {sys} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |\n",
            dials.len(),
            sum(&dials),
            sum(&failed),
            per(&failed),
            sum(&cut),
            sum(&held),
            per(&values(sys, RESTART, LONGEST_MS)),
            per(&values(sys, RESTART, READY_S)),
            per(&values(sys, RESTART, OLD_GONE_S)),
            sum(&values(sys, STEADY, FAILED)),
        ));
    }
    md.push_str(
        "\nEach replacement counts the dials started from its start until the next one's (the \
         last: until the load stopped). New server ready: until it carried tunnels (handover: it \
         took the listeners and printed READY; plain restart: it listened again and an agent had \
         linked). Old server gone: handover, until the old process exited after its drain; plain \
         restart, until it exited after SIGTERM. Goal (issue 45): no failed dial and no tunnel cut \
         through the handover.\n\n",
    );
    md
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn s(system: &str, case: &str, metric: &str, value: f64, rep: u32) -> Sample {
        Sample {
            rep,
            ..Sample::of(SCENARIO, case, system, metric, value)
        }
    }

    #[test]
    fn a_row_per_system_with_sums_and_each_replacement() {
        let mut samples = Vec::new();
        for (rep, failed) in [(0, 0.0), (1, 0.0)] {
            samples.push(s(
                "edgetunnel-connect uds handover",
                RESTART,
                DIALS,
                500.0,
                rep,
            ));
            samples.push(s(
                "edgetunnel-connect uds handover",
                RESTART,
                FAILED,
                failed,
                rep,
            ));
            samples.push(s("edgetunnel-connect uds handover", RESTART, CUT, 0.0, rep));
            samples.push(s(
                "edgetunnel-connect uds handover",
                RESTART,
                HELD,
                5.0,
                rep,
            ));
        }
        samples.push(s("anp-uds plain restart", RESTART, DIALS, 480.0, 0));
        samples.push(s("anp-uds plain restart", RESTART, FAILED, 61.0, 0));
        samples.push(s("anp-uds plain restart", RESTART, READY_S, 1.25, 0));
        samples.push(s("anp-uds plain restart", STEADY, FAILED, 0.0, 0));
        let md = table(&samples);
        assert!(
            md.contains("| edgetunnel-connect uds handover | 2 | 1,000 | 0 | 0, 0 | 0 / 10 | - | - | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| anp-uds plain restart | 1 | 480 | 61 | 61 | - / - | - | 1.25 | - | 0 |"),
            "{md}"
        );
        assert_eq!(table(&[]), "");
    }
}
