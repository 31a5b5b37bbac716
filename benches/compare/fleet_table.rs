//! The fleet scenario's figures as one Markdown table (a row per system
//! and fleet size, a column per metric), with the targets of issue 30;
//! pure, so that `tests/bench_report.rs` runs its test.

use crate::model::Sample;
use crate::report::fmt3;

/// The fleet figures as one Markdown table: a row per (system, N), a
/// column per metric (median over repetitions); targets of issue 30 below.
pub(crate) fn table(samples: &[Sample]) -> String {
    let of: Vec<&Sample> = samples.iter().filter(|s| s.scenario == "fleet").collect();
    let mut rows: Vec<(&str, &str)> = Vec::new();
    let mut metrics: Vec<&str> = Vec::new();
    for s in &of {
        if !rows.contains(&(s.system.as_str(), s.case.as_str())) {
            rows.push((&s.system, &s.case));
        }
        if !metrics.contains(&s.metric.as_str()) {
            metrics.push(&s.metric);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let mut md =
        String::from("### fleet at a glance (median of repetitions; - = not measured)\n\n");
    md.push_str(&format!("| system | agents | {} |\n", metrics.join(" | ")));
    md.push_str(&format!("|---|---|{}\n", "---:|".repeat(metrics.len())));
    for (sys, case) in rows {
        let cells: Vec<String> = metrics
            .iter()
            .map(|m| {
                let mut v: Vec<f64> = of
                    .iter()
                    .filter(|s| s.system == sys && s.case == case && s.metric == *m)
                    .map(|s| s.value)
                    .collect();
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).map_or("-".to_string(), |x| fmt3(*x))
            })
            .collect();
        md.push_str(&format!(
            "| {sys} | {} | {} |\n",
            case.trim_end_matches(" agents"),
            cells.join(" | ")
        ));
    }
    let ratios = p99_ratios(samples);
    if !ratios.is_empty() {
        let parts: Vec<String> = ratios
            .iter()
            .map(|(case, sys, r)| {
                format!("{sys} {}: {}×", case.trim_end_matches(" agents"), fmt3(*r))
            })
            .collect();
        md.push_str(&format!(
            "\nDial p99 against the smallest fleet's (goal: ≤ 1.2× at 10,000): {}.\n",
            parts.join(", ")
        ));
    }
    md.push_str(
        "\nTargets (issue 30, this 2-core machine): 10,000 agents at ≤ 25 KB server RSS each; \
         after kill -9 and restart all 10,000 linked within 60 s, none giving up, ≤ 1.1 TokenReviews \
         per agent; dial p99 at 10,000 within 1.2× of the smallest fleet's.\n\n",
    );
    md
}

/// The dial p99 metric's name.
pub(crate) const DIAL_P99: &str = "dial p99 ms";
/// Its ratio to the smallest fleet's.
#[allow(dead_code)] // the bench records it; tests/bench_report.rs builds this file too
pub(crate) const DIAL_P99_RATIO: &str = "dial p99 ÷ smallest";

/// Each size's dial p99 over the smallest size's, per system: (case,
/// system, ratio) for every size but the smallest.
pub(crate) fn p99_ratios(samples: &[Sample]) -> Vec<(String, String, f64)> {
    let p99: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.scenario == "fleet" && s.metric == DIAL_P99)
        .collect();
    let size = |case: &str| -> usize {
        case.trim_end_matches(" agents")
            .parse()
            .unwrap_or(usize::MAX)
    };
    let median = |system: &str, case: &str| -> Option<f64> {
        let mut v: Vec<f64> = p99
            .iter()
            .filter(|s| s.system == system && s.case == case)
            .map(|s| s.value)
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let mut out = Vec::new();
    let mut systems: Vec<&str> = p99.iter().map(|s| s.system.as_str()).collect();
    systems.sort_unstable();
    systems.dedup();
    for sys in systems {
        let mut cases: Vec<&str> = p99
            .iter()
            .filter(|s| s.system == sys)
            .map(|s| s.case.as_str())
            .collect();
        cases.sort_by_key(|c| size(c));
        cases.dedup();
        let Some((&smallest, rest)) = cases.split_first() else {
            continue;
        };
        let Some(base) = median(sys, smallest).filter(|b| *b > 0.0) else {
            continue;
        };
        for c in rest {
            if let Some(v) = median(sys, c) {
                out.push((c.to_string(), sys.to_string(), v / base));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn s(system: &str, case: &str, metric: &str, value: f64) -> Sample {
        Sample::of("fleet", case, system, metric, value)
    }

    #[test]
    fn a_row_per_system_and_size_and_a_dash_where_not_measured() {
        let samples = vec![
            s("edgetunnel", "100 agents", "cold connect s", 0.5),
            s("edgetunnel", "100 agents", "dial p99 ms", 2.0),
            s("anp-go", "100 agents", "cold connect s", 0.25),
            s("edgetunnel", "1000 agents", "cold connect s", 1.5),
        ];
        let md = table(&samples);
        assert!(
            md.contains("| system | agents | cold connect s | dial p99 ms |"),
            "{md}"
        );
        assert!(md.contains("| edgetunnel | 100 | 0.5 | 2 |"), "{md}");
        assert!(md.contains("| anp-go | 100 | 0.25 | - |"), "{md}");
        assert!(md.contains("| edgetunnel | 1000 | 1.5 | - |"), "{md}");
        assert_eq!(table(&[]), "");
    }

    #[test]
    fn dial_p99_is_compared_with_the_smallest_fleet() {
        let samples = vec![
            s("edgetunnel", "1000 agents", DIAL_P99, 3.0),
            s("edgetunnel", "10 agents", DIAL_P99, 2.0),
            s("edgetunnel", "10000 agents", DIAL_P99, 2.5),
            s("edgetunnel", "10 agents", "cold connect s", 9.0),
        ];
        let r = p99_ratios(&samples);
        assert_eq!(
            r,
            vec![
                ("1000 agents".to_string(), "edgetunnel".to_string(), 1.5),
                ("10000 agents".to_string(), "edgetunnel".to_string(), 1.25),
            ]
        );
        let md = table(&samples);
        assert!(
            md.contains("edgetunnel 1000: 1.5×, edgetunnel 10000: 1.25×"),
            "{md}"
        );
        assert!(p99_ratios(&samples[..1]).is_empty());
    }
}
