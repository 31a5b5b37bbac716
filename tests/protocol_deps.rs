//! The protocol crate (`crates/protocol`, `edgetunnel-protocol`) stays
//! sans-I/O: its dependency tree, as `cargo tree` resolves it for every
//! target, holds no runtime (monoio, tokio), no TLS (rustls), no HTTP/2 or
//! HTTP client stack (h2, hyper) and no Kubernetes client (kube,
//! k8s-openapi). The compiler already keeps it from using the main crate;
//! this keeps those crates out of its manifest (and so out of the fuzz
//! targets' build, which depends on it alone).

use std::process::Command;

/// Crate names (exact, or as the prefix of a `name-...` family) the
/// protocol crate must not pull in.
const FORBIDDEN: &[&str] = &[
    "monoio",
    "tokio",
    "rustls",
    "h2",
    "hyper",
    "kube",
    "k8s-openapi",
];

fn forbidden(name: &str) -> bool {
    name.contains("rustls")
        || FORBIDDEN
            .iter()
            .any(|f| name == *f || name.starts_with(&format!("{f}-")))
}

#[test]
fn protocol_crate_depends_on_no_runtime_tls_or_kube() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "-p",
            "edgetunnel-protocol",
            "-e",
            "normal",
            "--target",
            "all",
            "--prefix",
            "none",
        ])
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Lines are `name vX.Y.Z [(path)] [(*)]`.
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.contains(&"edgetunnel-protocol") && names.contains(&"thiserror"),
        "unexpected cargo tree output:\n{stdout}"
    );
    let mut bad: Vec<&str> = names.into_iter().filter(|n| forbidden(n)).collect();
    bad.sort_unstable();
    bad.dedup();
    assert!(
        bad.is_empty(),
        "edgetunnel-protocol must stay sans-I/O, but its tree has {bad:?}:\n{stdout}"
    );
}

#[test]
fn the_forbidden_names_match_as_meant() {
    for n in [
        "tokio",
        "tokio-rustls",
        "rustls-pemfile",
        "h2",
        "kube-client",
        "k8s-openapi",
    ] {
        assert!(forbidden(n), "{n}");
    }
    for n in [
        "http",
        "httparse",
        "bytes",
        "h2o",
        "kubelet-ish",
        "tokenizer",
    ] {
        assert!(!forbidden(n), "{n}");
    }
}
