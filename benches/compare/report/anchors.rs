//! The report's "Against the anchors" section: every edgetunnel system
//! beside each anchor (the systems that do a tunnel's work: the mutual-TLS
//! haproxy and stunnel pairs, the Go ANP), figure by figure, with the
//! ratio and, where issue 29 set one, the goal and whether it was met.
//!
//! The figures are the CPU per unit of work (per GB, per request, per
//! connection; total and its kernel part) beside the rates and the memory
//! per idle connection: CPU per unit of work changes little with the
//! processor or the machine's load, so the conclusion holds where the
//! rates move.

use super::{aggregate, fmt3, fmt_ratio, is_edgetunnel, md_row, md_table_head, md_text, ratio};
use crate::model::{Sample, SystemKind};

/// The anchors, in table order.
const ANCHORS: [SystemKind; 5] = [
    SystemKind::HaproxyTlsPair,
    SystemKind::StunnelPair,
    SystemKind::AnpUds,
    SystemKind::AnpTcp,
    SystemKind::AnpGrpc,
];

/// The goal of a figure against an anchor: the least ratio (> 1 =
/// edgetunnel better) that meets it, and how the issue says it.
fn goal(anchor: SystemKind, metric: &str) -> Option<(f64, &'static str)> {
    match anchor {
        SystemKind::HaproxyTlsPair => match metric {
            "CPU s/GB" | "CPU µs/req" => Some((1.0, "at or below")),
            "req/s" | "conn/s" => Some((1.0, "at or above")),
            _ => None,
        },
        SystemKind::AnpUds | SystemKind::AnpTcp | SystemKind::AnpGrpc => match metric {
            "CPU s/GB" | "CPU µs/req" => Some((5.0, "5x less")),
            "bytes/conn" => Some((10.0, "a tenth")),
            _ => None,
        },
        _ => None,
    }
}

/// The rows of the section: (scenario, case filter, metric). A `None`
/// case takes every case of the scenario.
const FIGURES: [(&str, Option<&str>, &str); 12] = [
    ("bulk", None, "CPU s/GB"),
    ("bulk", None, "kernel s/GB"),
    ("bulk", None, "Gbit/s"),
    ("latency", Some("saturation"), "CPU µs/req"),
    ("latency", Some("saturation"), "kernel µs/req"),
    ("latency", Some("saturation"), "req/s"),
    ("latency", Some("saturation"), "client µs/req"),
    ("dial", None, "CPU µs/conn"),
    ("dial", None, "kernel µs/conn"),
    ("dial", None, "conn/s"),
    ("hol", Some("healthy stream during the stall"), "Gbit/s"),
    ("memory", None, "bytes/conn"),
];

/// The section, or nothing when no anchor and no edgetunnel system ran
/// a scenario of [`FIGURES`].
pub(super) fn section(samples: &[Sample]) -> String {
    let figures: Vec<Sample> = samples
        .iter()
        .filter(|s| FIGURES.iter().any(|f| f.0 == s.scenario))
        .cloned()
        .collect();
    let aggs = aggregate(&figures);
    let present = |name: &str| aggs.iter().any(|a| a.system == name);
    let anchors: Vec<SystemKind> = ANCHORS.into_iter().filter(|k| present(k.name())).collect();
    let ets = super::unique(
        aggs.iter()
            .map(|a| a.system)
            .filter(|s| is_edgetunnel(s) && !s.contains("--workers")),
    );
    if anchors.is_empty() || ets.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Against the anchors\n\n\
         The anchors do a tunnel's work: four sockets and mutual TLS between the halves \
         (haproxy-tls-pair, stunnel-pair: TLS 1.3 TLS\\_AES\\_128\\_GCM\\_SHA256 with the \
         certificates of edgetunnel's agent link), or are the incumbent (anp-uds, anp-tcp: \
         ANP's Go proxy-server in http-connect mode; anp-grpc: in gRPC mode on a unix socket, \
         the same work as edgetunnel-grpc; each with its Go proxy-agent). Each cell is \
         the anchor's median, then the ratio (> 1 = edgetunnel better), then the goal of \
         issue 29 where it set one. CPU is user + kernel of all the system's processes; \
         the kernel part has its own rows.\n\n",
    );
    for et in &ets {
        md.push_str(&format!("### {}\n\n", md_text(et)));
        let mut head = vec!["figure".to_string(), md_text(et)];
        head.extend(anchors.iter().map(|k| md_text(k.name())));
        md_table_head(&mut md, &head, 1);
        for (scenario, only, metric) in FIGURES {
            let cases = super::unique(
                aggs.iter()
                    .filter(|a| a.scenario == scenario && a.metric == metric)
                    .filter(|a| only.is_none_or(|c| a.case == c))
                    .map(|a| a.case),
            );
            for case in cases {
                let find = |sys: &str| {
                    aggs.iter().find(|a| {
                        a.scenario == scenario
                            && a.case == case
                            && a.metric == metric
                            && a.system == sys
                    })
                };
                let Some(mine) = find(et) else { continue };
                let mut row = vec![
                    format!("{scenario} · {} · {}", md_text(case), md_text(metric)),
                    fmt3(mine.median),
                ];
                for &k in &anchors {
                    row.push(match find(k.name()) {
                        None => "—".to_string(),
                        Some(theirs) => {
                            let r = ratio(mine, theirs);
                            // The anchor moved nothing (ANP's healthy stream
                            // behind a stalled one): no finite ratio.
                            let r_text = if r.is_infinite() {
                                "∞".to_string()
                            } else {
                                format!("{}x", fmt_ratio(r))
                            };
                            let mut c = format!("{} · {r_text}", fmt3(theirs.median));
                            if let Some((least, words)) = goal(k, metric) {
                                let met = if r >= least { "met" } else { "**not met**" };
                                c.push_str(&format!(" · goal {words}: {met}"));
                            }
                            c
                        }
                    });
                }
                md.push_str(&md_row(&row));
            }
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn sample(scenario: &str, case: &str, system: &str, metric: &str, value: f64) -> Sample {
        Sample {
            higher_is_better: metric == "req/s",
            ..Sample::of(scenario, case, system, metric, value)
        }
    }

    /// A goal is met at its ratio and not below it, the anchor's value and
    /// the ratio stand in the cell, and an anchor that did not run the
    /// case shows "—".
    #[test]
    fn goals_against_each_anchor() {
        let sat = |sys: &str, metric: &str, v: f64| sample("latency", "saturation", sys, metric, v);
        let samples = vec![
            sat("edgetunnel-connect", "CPU µs/req", 20.0),
            sat("edgetunnel-connect", "req/s", 900.0),
            sat("anp-uds", "CPU µs/req", 100.0),
            sat("anp-uds", "req/s", 1000.0),
            sat("haproxy-tls-pair", "CPU µs/req", 19.0),
            sample(
                "memory",
                "1000 idle",
                "edgetunnel-connect",
                "bytes/conn",
                4000.0,
            ),
            sample("memory", "1000 idle", "anp-uds", "bytes/conn", 39_000.0),
        ];
        let md = section(&samples);
        let row = |prefix: &str| {
            md.lines()
                .find(|l| l.starts_with(&format!("| {prefix}")))
                .unwrap_or_else(|| panic!("no row {prefix} in\n{md}"))
                .to_string()
        };
        let cpu = row("latency · saturation · CPU µs/req");
        assert!(
            cpu.contains("| 19 · 0.95x · goal at or below: **not met** |"),
            "{cpu}"
        );
        assert!(cpu.contains("| 100 · 5.00x · goal 5x less: met |"), "{cpu}");
        let rate = row("latency · saturation · req/s");
        assert!(rate.contains("| — | 1,000 · 0.90x |"), "{rate}");
        let mem = row("memory · 1000 idle · bytes/conn");
        assert!(mem.contains("9.75x · goal a tenth: **not met**"), "{mem}");
        // No anchor ran: no section.
        assert_eq!(section(&samples[..2]), "");
    }
}
