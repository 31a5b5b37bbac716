//! `edgetunnel certs`, run as a user runs it:
//! - `certs init DIR` writes what the server and a local agent read into
//!   DIR and the CA key into a directory of its own (`DIR-ca`, or
//!   `--ca-dir`), never into DIR, which is what gets copied around;
//! - certificates have a validity an operator expects (leaves 365 days, the
//!   CA 3650, from a few minutes ago; `--days`/`--ca-days` change it), not
//!   rcgen's 1975-4096 default;
//! - a second `certs init` into the same place is refused without
//!   `--force` and changes nothing; with it, a new CA replaces the old;
//! - `certs issue agent OUT --ca-dir ...` issues another agent certificate
//!   from the same CA into a directory holding exactly what one edge node
//!   needs (ca.crt, agent.crt, agent.key), with the names that
//!   `--bind-agent-identity` checks; a server started from `certs init`
//!   admits that agent.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use support::*;

fn certs(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("certs")
        .args(args)
        .output()
        .expect("run edgetunnel certs")
}

fn ok(args: &[&str]) -> String {
    let out = certs(args);
    assert!(out.status.success(), "certs {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// (not before, not after) in Unix seconds, subject CN, SANs as text.
fn cert_info(p: &Path) -> (i64, i64, String, Vec<String>) {
    let pem = std::fs::read(p).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    let v = cert.validity();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or("")
        .to_string();
    let sans = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|s| {
            s.value
                .general_names
                .iter()
                .map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
                    x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                        4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string(),
                        16 => {
                            std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap()).to_string()
                        }
                        _ => format!("{b:?}"),
                    },
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default();
    (v.not_before.timestamp(), v.not_after.timestamp(), cn, sans)
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

const DAY: i64 = 86_400;

/// Valid from a little before now for about `days` days.
fn assert_validity(p: &Path, days: i64) {
    let (nb, na, _, _) = cert_info(p);
    let t = now();
    assert!(
        nb <= t && nb >= t - 3600,
        "{}: not before {nb}, now {t}",
        p.display()
    );
    assert!(
        (na - (t + days * DAY)).abs() < DAY,
        "{}: not after {na}, want about now + {days} days",
        p.display()
    );
}

#[test]
fn init_keeps_the_ca_key_apart_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("certs");
    let d = dir.to_str().unwrap();
    let said = ok(&["init", d]);
    let ca_dir = tmp.path().join("certs-ca");
    assert_eq!(
        names(&dir),
        [
            "agent.crt",
            "agent.key",
            "ca.crt",
            "proxy-client.crt",
            "proxy-client.key",
            "server.crt",
            "server.key"
        ],
        "no CA key where the nodes' files are"
    );
    assert_eq!(names(&ca_dir), ["ca.crt", "ca.key"]);
    assert!(said.contains(ca_dir.to_str().unwrap()), "{said}");
    assert_eq!(mode(&ca_dir), 0o700);
    assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);
    for k in ["agent.key", "server.key", "proxy-client.key"] {
        assert_eq!(mode(&dir.join(k)), 0o600, "{k}");
    }
    assert_eq!(
        std::fs::read(dir.join("ca.crt")).unwrap(),
        std::fs::read(ca_dir.join("ca.crt")).unwrap()
    );
    for leaf in ["server.crt", "agent.crt", "proxy-client.crt"] {
        assert_validity(&dir.join(leaf), 365);
    }
    assert_validity(&ca_dir.join("ca.crt"), 3650);

    // Again: refused, nothing touched.
    let before = std::fs::read(dir.join("ca.crt")).unwrap();
    let key_before = std::fs::read(ca_dir.join("ca.key")).unwrap();
    let out = certs(&["init", d]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second init succeeded");
    assert!(err.contains("--force"), "{err}");
    assert!(err.contains("ca.key") || err.contains("ca.crt"), "{err}");
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), before);
    assert_eq!(std::fs::read(ca_dir.join("ca.key")).unwrap(), key_before);
    // Only the CA directory holding a CA is enough to refuse.
    let other = tmp.path().join("other");
    let out = certs(&[
        "init",
        other.to_str().unwrap(),
        "--ca-dir",
        ca_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "init over an existing CA succeeded");
    assert!(!other.join("agent.crt").exists());
    assert_eq!(std::fs::read(ca_dir.join("ca.key")).unwrap(), key_before);

    // --force: a new CA, and the validity flags.
    ok(&["init", d, "--force", "--days", "30", "--ca-days", "100"]);
    assert_ne!(std::fs::read(dir.join("ca.crt")).unwrap(), before);
    assert_ne!(std::fs::read(ca_dir.join("ca.key")).unwrap(), key_before);
    assert_validity(&dir.join("agent.crt"), 30);
    assert_validity(&ca_dir.join("ca.crt"), 100);
    // A leaf never outlives its CA.
    ok(&["init", d, "--force", "--days", "400", "--ca-days", "10"]);
    assert_validity(&dir.join("server.crt"), 10);
}

#[test]
fn issue_another_agent_from_the_same_ca() {
    let env = Env::new();
    let ca_dir = env.path("certs-ca");
    assert!(
        !env.certs().join("ca.key").exists(),
        "the CA key sits with the certificates"
    );
    let node = env.path("node-2");
    let n = node.to_str().unwrap();
    let ca = ca_dir.to_str().unwrap();
    ok(&[
        "issue", "agent", n, "--ca-dir", ca, "--name", "node-2", "--name", "10.0.0.7",
    ]);
    assert_eq!(names(&node), ["agent.crt", "agent.key", "ca.crt"]);
    assert_eq!(mode(&node.join("agent.key")), 0o600);
    let (_, _, cn, sans) = cert_info(&node.join("agent.crt"));
    assert_eq!(cn, "node-2");
    assert_eq!(sans, ["node-2", "10.0.0.7"]);
    assert_validity(&node.join("agent.crt"), 365);
    // Again: refused without --force, fine with it.
    let first = std::fs::read(node.join("agent.crt")).unwrap();
    let out = certs(&["issue", "agent", n, "--ca-dir", ca, "--name", "node-2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(std::fs::read(node.join("agent.crt")).unwrap(), first);
    ok(&[
        "issue", "agent", n, "--ca-dir", ca, "--name", "node-2", "--name", "10.0.0.7", "--force",
    ]);
    assert_ne!(std::fs::read(node.join("agent.crt")).unwrap(), first);

    // The server from `certs init` admits it, bound to its names.
    let server = Server::start(&env, &["--bind-agent-identity"]);
    // Only the node's directory.
    let mut cmd = Command::new(BIN);
    cmd.arg("agent")
        .args(["--certs-dir", n])
        .args(["--server-addr", &server.agent.to_string()])
        .args(["--server-name", "localhost"])
        .args(["--agent-id", "node-2"])
        .args(["--agent-identifiers", "host=node-2&ipv4=10.0.0.7"]);
    let agent = Proc::spawn(cmd, env.path("agent-node-2.log"));
    agent.wait_line("CONNECTED");
    // Without a CA there is nothing to issue from.
    let out = certs(&[
        "issue",
        "agent",
        env.path("x").to_str().unwrap(),
        "--ca-dir",
        env.path("no-ca").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
}
