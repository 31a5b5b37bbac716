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
    md.push_str(
        "\nTargets (issue 30, this 2-core machine): 10,000 agents at ≤ 25 KB server RSS each; \
         after kill -9 and restart all 10,000 linked within 60 s, none giving up, ≤ 1.1 TokenReviews \
         per agent; dial p99 at 10,000 within 1.2× of the smallest fleet's.\n\n",
    );
    md
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn s(system: &str, case: &str, metric: &str, value: f64) -> Sample {
        Sample {
            scenario: "fleet".into(),
            case: case.into(),
            system: system.into(),
            metric: metric.into(),
            value,
            rep: 0,
            higher_is_better: false,
            cdf: Vec::new(),
        }
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
}
