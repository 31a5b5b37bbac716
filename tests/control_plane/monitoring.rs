//! deploy/monitoring against a live scrape: every metric the Grafana
//! dashboard's queries (and its variables) and the alert rules' expressions
//! name exists in the /metrics of a running server and agent after a
//! little traffic (a CONNECT tunnel); the rules file parses and each rule
//! has expr, for, a severity label and summary/description annotations;
//! `promtool check rules` passes when promtool is installed (Debian's
//! `prometheus` package), and says it was skipped otherwise.

use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use support::prom_text::{self, Families};
use support::{connect_tcp, echo_roundtrip, echo_server, Agent, Env, Server};

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

const DASHBOARD: &str = "edgetunnel-dashboard.json";
const RULES: &str = "edgetunnel-alerts.rules.yml";

/// The metric names a PromQL expression reads: identifiers that are not
/// functions, keywords, label names (in `{}` or `by (...)`-like lists) or
/// durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let strip = |re: &str, s: &str| {
        regex::Regex::new(re)
            .unwrap()
            .replace_all(s, " ")
            .to_string()
    };
    let mut e = strip(r#""([^"\\]|\\.)*""#, expr);
    e = strip(r"\{[^}]*\}", &e);
    e = strip(r"\[[^\]]*\]", &e);
    e = strip(r"\boffset\s+[0-9a-z]+", &e);
    e = strip(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
        &e,
    );
    // label_values(metric, label): the label is not a metric.
    e = strip(r",\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)", &e);
    let keywords = ["and", "or", "unless", "bool", "offset", "by", "without"];
    let ident = regex::Regex::new(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?").unwrap();
    ident
        .captures_iter(&e)
        .filter(|c| c.get(1).is_none())
        .map(|c| c[0].trim().to_string())
        .filter(|n| !keywords.contains(&n.as_str()))
        .filter(|n| {
            // Not part of a number (1e6) or a Grafana variable ($agent).
            let at = e.find(n.as_str()).unwrap();
            !e[..at].ends_with(|ch: char| ch.is_ascii_digit() || ch == '$' || ch == '.')
        })
        .collect()
}

/// Every `expr` of the dashboard's targets and every variable's `query`.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(monitoring().join(DASHBOARD)).unwrap();
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().unwrap_or("").to_string();
        for t in p["targets"].as_array().expect("targets") {
            out.push((title.clone(), t["expr"].as_str().expect("expr").to_string()));
        }
    }
    for v in d["templating"]["list"].as_array().expect("variables") {
        if v["type"] == "query" {
            let q = v["query"].as_str().expect("query").to_string();
            out.push((format!("variable {}", v["name"]), q));
        }
    }
    out
}

/// Every rule of the rules file, checked for form.
fn rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(monitoring().join(RULES)).unwrap();
    let r: Value = serde_saphyr::from_str(&text).expect("the rules file is YAML");
    let mut out = Vec::new();
    for g in r["groups"].as_array().expect("groups") {
        assert!(g["name"].is_string(), "a group without a name");
        for rule in g["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name").to_string();
            let expr = rule["expr"].as_str().expect("expr").to_string();
            assert!(!expr.trim().is_empty(), "{name}: empty expr");
            assert!(rule["for"].is_string(), "{name}: no `for`");
            let sev = rule["labels"]["severity"].as_str();
            assert!(
                matches!(sev, Some("critical" | "warning")),
                "{name}: severity {sev:?}"
            );
            for a in ["summary", "description"] {
                assert!(rule["annotations"][a].is_string(), "{name}: no {a}");
            }
            out.push((name, expr));
        }
    }
    out
}

#[test]
fn promql_metric_names_are_extracted() {
    let n = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{instance=~"$x", b="c"}[5m]))) / ignoring(x) b_total > 1e6 and on (y) c"#,
    );
    assert_eq!(
        n,
        BTreeSet::from(["a_bucket".into(), "b_total".into(), "c".into()])
    );
    let n = metric_names("min_over_time(h[1h]) > 2 * min_over_time(h[1h] offset 1d) and h > 1");
    assert_eq!(n, BTreeSet::from(["h".into()]));
    let n = metric_names("label_values(edgetunnel_agents_connected, instance)");
    assert_eq!(n, BTreeSet::from(["edgetunnel_agents_connected".into()]));
}

#[test]
fn dashboard_and_rules_name_only_metrics_a_live_scrape_has() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let (agent, agent_admin) =
        Agent::start_with_admin(&env, server.agent, "node-1", "host=node-1", &[]);
    server.wait_agent_links(2.0, &agent.proc);
    // A little traffic: one CONNECT tunnel, bytes both ways.
    let echo = echo_server("127.0.0.1");
    let (code, _, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(code, 200);
    assert_eq!(echo_roundtrip(s, b"hello tunnel"), b"hello tunnel");
    let scrapes: [(&str, Families); 2] = [
        ("server", prom_text::scrape(server.admin)),
        ("agent", prom_text::scrape(agent_admin)),
    ];
    let known = |name: &str| scrapes.iter().any(|(_, f)| prom_text::knows(f, name));

    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{} dashboard queries", queries.len());
    let alerts = rules();
    assert!(alerts.len() >= 5, "{} alert rules", alerts.len());
    for (what, expr) in queries.iter().chain(alerts.iter()) {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what}: no metric in {expr}");
        for n in names {
            if !known(&n) {
                missing.push(format!("{what}: {n} (in {expr})"));
            }
            used.insert(n);
        }
    }
    assert!(missing.is_empty(), "not in a live scrape: {missing:#?}");
    // What an operator watches is all there.
    for must in [
        "edgetunnel_agents_connected",
        "konnectivity_network_proxy_server_dial_failure_count",
        "edgetunnel_open_connections",
        "edgetunnel_bytes_total",
        "edgetunnel_keepalive_timeouts_total",
        "edgetunnel_agents_refused_total",
        "konnectivity_network_proxy_agent_known_server_count",
        "konnectivity_network_proxy_server_culled_leases_count",
    ] {
        assert!(
            used.contains(must),
            "the dashboard or rules never use {must}"
        );
    }
    eprintln!("metrics used by deploy/monitoring: {used:?}");
}

#[test]
fn promtool_checks_the_rules() {
    let file = monitoring().join(RULES);
    match Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&file)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "promtool check rules:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: promtool not installed (Debian: apt-get install prometheus)"
            );
        }
        Err(e) => panic!("running promtool: {e}"),
    }
}
