//! Network namespaces for tests that need their own iptables and links
//! (root and iproute2 needed).
#![allow(dead_code)]

use std::process::{Command, Output};

/// A network namespace, deleted on drop.
pub(crate) struct Netns(pub String);

impl Netns {
    pub(crate) fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        let out = Command::new("ip")
            .args(["netns", "add", name])
            .output()
            .expect("run ip");
        assert!(
            out.status.success(),
            "ip netns add {name} (root and iproute2 needed): {out:?}"
        );
        sh(name, "ip link set lo up");
        Netns(name.to_string())
    }

    pub(crate) fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program]);
        c
    }

    /// `cmd` run inside this namespace (`ip netns exec NAME PROGRAM ARGS`, with the
    /// command's environment and working directory; `ip netns exec` execs it,
    /// so the child is the program itself).
    pub(crate) fn exec(&self, cmd: &Command) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

pub(crate) fn check(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn sh(ns: &str, script: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", script])
        .output()
        .expect("run sh");
    check(out, script)
}

pub(crate) fn save(ns: &Netns) -> String {
    sh(&ns.0, "iptables-save -t nat")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}
