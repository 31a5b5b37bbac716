//! The direction of the workspace's crates, as `cargo metadata` resolves
//! them (normal and build dependencies, transitively):
//! - the `kubectl proxy` drop-in (`crates/kubectl-proxy`) uses nothing of
//!   the tunnel: it never depends on the root package (`edgetunnel`);
//! - the engine (`crates/engine`) names no role: it depends on neither the
//!   root package nor the kubectl proxy crate;
//! - the protocol crate (`crates/protocol`) depends on no other crate of
//!   ours (its external dependencies are `tests/protocol_deps.rs`'s);
//! - every crate under `crates/` is a default member, so plain `cargo test`
//!   and `cargo build` at the root cover it.
//!
//! A dev-dependency may not break the rules either: a test of the engine
//! reaching the tunnel would blur the layers the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

const ROOT: &str = "edgetunnel";
const PROTOCOL: &str = "edgetunnel-protocol";
const ENGINE: &str = "edgetunnel-engine";
const KUBECTL_PROXY: &str = "edgetunnel-kubectl-proxy";

/// Dependency edges by package name: who -> (whom, dev-only).
type Graph = BTreeMap<String, Vec<(String, bool)>>;

fn metadata() -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["metadata", "--offline", "--format-version", "1"])
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON")
}

/// The resolved graph by name. An edge is dev-only when every kind it has
/// is `dev` (a normal or build edge has kind `null` or `"build"`).
fn graph(meta: &Value) -> Graph {
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut g = Graph::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
        let from = names[node["id"].as_str().unwrap()].to_string();
        let edges = node["deps"]
            .as_array()
            .expect("deps")
            .iter()
            .map(|d| {
                let to = names[d["pkg"].as_str().unwrap()].to_string();
                let dev_only = d["dep_kinds"]
                    .as_array()
                    .expect("dep_kinds")
                    .iter()
                    .all(|k| k["kind"].as_str() == Some("dev"));
                (to, dev_only)
            })
            .collect();
        g.entry(from).or_default().extend::<Vec<_>>(edges);
    }
    g
}

/// What `from` reaches: its direct dependencies of every kind, and from
/// there normal and build dependencies (what those crates link).
fn reaches(g: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = g
        .get(from)
        .into_iter()
        .flatten()
        .map(|(to, _)| to.as_str())
        .collect();
    while let Some(n) = todo.pop() {
        if n == from || !seen.insert(n.to_string()) {
            continue;
        }
        todo.extend(
            g.get(n)
                .into_iter()
                .flatten()
                .filter(|(_, dev_only)| !dev_only)
                .map(|(to, _)| to.as_str()),
        );
    }
    seen
}

/// The rules; each broken one as a sentence.
fn broken_rules(g: &Graph) -> Vec<String> {
    let mut broken = Vec::new();
    let mut forbid = |who: &str, whom: &str, why: &str| {
        if reaches(g, who).contains(whom) {
            broken.push(format!("{who} depends on {whom}: {why}"));
        }
    };
    forbid(
        KUBECTL_PROXY,
        ROOT,
        "the kubectl proxy uses nothing of the tunnel",
    );
    forbid(ENGINE, ROOT, "the engine names no role");
    forbid(ENGINE, KUBECTL_PROXY, "the engine names no role");
    for ours in [ROOT, ENGINE, KUBECTL_PROXY] {
        forbid(
            PROTOCOL,
            ours,
            "the protocol crate uses no other crate of ours",
        );
    }
    broken
}

#[test]
fn workspace_crates_depend_downward_only() {
    let meta = metadata();
    let g = graph(&meta);
    // The graph is the one meant: every crate is there, with the expected
    // downward edges.
    assert!(reaches(&g, KUBECTL_PROXY).contains(ENGINE), "{g:?}");
    assert!(reaches(&g, KUBECTL_PROXY).contains(PROTOCOL), "{g:?}");
    assert!(reaches(&g, ENGINE).contains(PROTOCOL), "{g:?}");
    assert!(reaches(&g, ROOT).contains(KUBECTL_PROXY), "{g:?}");
    let broken = broken_rules(&g);
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn every_crate_is_a_default_member() {
    let meta = metadata();
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let members = |key: &str| -> BTreeSet<&str> {
        meta[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} in cargo metadata"))
            .iter()
            .map(|id| name_of[id.as_str().unwrap()])
            .collect()
    };
    let all = members("workspace_members");
    let default = members("workspace_default_members");
    for name in [ROOT, PROTOCOL, ENGINE, KUBECTL_PROXY] {
        assert!(all.contains(name), "{name} is not a workspace member");
    }
    assert_eq!(default, all, "plain `cargo test` must cover every crate");
}

/// The rules catch each kind of edge they forbid: direct, transitive, and
/// a dev-dependency; a dev-dependency further down does not count.
#[test]
fn the_rules_catch_a_back_edge() {
    let base = |extra: &[(&str, &str, bool)]| {
        let mut g = Graph::new();
        for (a, b, dev) in [
            (ROOT, KUBECTL_PROXY, false),
            (ROOT, ENGINE, false),
            (ROOT, PROTOCOL, false),
            (KUBECTL_PROXY, ENGINE, false),
            (KUBECTL_PROXY, PROTOCOL, false),
            (ENGINE, PROTOCOL, false),
            (PROTOCOL, "bytes", false),
        ]
        .iter()
        .chain(extra)
        {
            g.entry(a.to_string())
                .or_default()
                .push((b.to_string(), *dev));
        }
        g
    };
    assert!(broken_rules(&base(&[])).is_empty());
    // Direct.
    let b = broken_rules(&base(&[(KUBECTL_PROXY, ROOT, false)]));
    assert_eq!(b.len(), 1, "{b:?}");
    assert!(b[0].starts_with("edgetunnel-kubectl-proxy depends on edgetunnel:"));
    // Through a crate in between.
    let b = broken_rules(&base(&[
        (ENGINE, "some-helper", false),
        ("some-helper", KUBECTL_PROXY, false),
    ]));
    assert!(
        b.iter()
            .any(|s| s.starts_with("edgetunnel-engine depends on edgetunnel-kubectl-proxy:")),
        "{b:?}"
    );
    // A direct dev-dependency counts.
    let b = broken_rules(&base(&[(PROTOCOL, ENGINE, true)]));
    assert!(
        b.iter()
            .any(|s| s.starts_with("edgetunnel-protocol depends on edgetunnel-engine:")),
        "{b:?}"
    );
    // A dev-dependency of a dependency is not linked: allowed.
    let b = broken_rules(&base(&[("bytes", ROOT, true)]));
    assert!(b.is_empty(), "{b:?}");
}
