//! The Kubernetes manifests in deploy/ run as they are: every container's
//! command selects an entry point the image has (the Dockerfile's links)
//! and its args translate (Go binaries' flags) and parse (edgetunnel's own).

use std::path::{Path, PathBuf};

use clap::Parser;
use edgetunnel::cli::Cli;
use edgetunnel::compat::{self, Binary, Host};

/// A pod's view: the files the manifests name exist, the environment is
/// what their `env` would give.
struct Pod;

impl Host for Pod {
    fn env(&self, name: &str) -> Option<String> {
        match name {
            "NODE_NAME" => Some("node-1".into()),
            _ => None,
        }
    }
    fn uuid(&self) -> String {
        "00000000-0000-4000-8000-000000000000".into()
    }
    fn exists(&self, _: &Path) -> bool {
        true
    }
    fn read(&self, _: &Path) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
    }
}

/// (command, args) of every container in a manifest, read line by line
/// (the manifests use block lists for both).
fn containers(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    let mut command = Vec::new();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("command:") {
            command = rest
                .trim()
                .trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .map(|s| s.trim().trim_matches('"').to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
        if t == "args:" {
            let indent = line.len() - line.trim_start().len();
            let mut args = Vec::new();
            while let Some(next) = lines.peek() {
                let n = next.trim();
                let ind = next.len() - next.trim_start().len();
                if n.starts_with('#') || n.is_empty() {
                    lines.next();
                    continue;
                }
                if ind <= indent || !n.starts_with("- ") {
                    break;
                }
                args.push(n[2..].trim().to_string());
                lines.next();
            }
            out.push((std::mem::take(&mut command), args));
        }
    }
    out
}

fn manifests() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut all = Vec::new();
    for dir in [root.clone(), root.join("konnectivity")] {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "yaml") {
                all.push(e.path());
            }
        }
    }
    all
}

#[test]
fn every_manifest_container_command_line_is_accepted() {
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let mut checked = 0;
    for path in manifests() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (command, args) in containers(&text) {
            let argv: Vec<String> = match command.first().map(|c| c.trim_start_matches('/')) {
                Some(name) => {
                    let binary = Binary::from_name(name)
                        .unwrap_or_else(|| panic!("{}: unknown command {name}", path.display()));
                    assert!(
                        dockerfile.contains(name),
                        "the image has no {name} entry point"
                    );
                    let t = compat::translate(binary, &args, &Pod)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    t.argv
                }
                None => std::iter::once("edgetunnel".to_string())
                    .chain(args.iter().cloned())
                    .collect(),
            };
            // `$(NODE_NAME)` and the like are the kubelet's to expand.
            let argv: Vec<String> = argv
                .iter()
                .map(|a| {
                    a.replace("$(NODE_NAME)", "node-1")
                        .replace("$(NODE_IP)", "10.0.0.1")
                        .replace("$(TUNNEL_CLUSTER_IP)", "10.96.0.10")
                })
                .collect();
            assert!(!argv.iter().any(|a| a.contains("$(")), "{argv:?}");
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("{}: {argv:?}: {e}", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} containers found");
}
