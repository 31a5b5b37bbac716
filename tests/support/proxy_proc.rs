//! Starting `kubectl proxy` and `edgetunnel proxy` processes for tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::http_raw::Endpoint;
use super::BIN;

/// The kubectl to compare against (`$KUBECTL` or `kubectl` on PATH).
pub(crate) fn kubectl() -> PathBuf {
    let p = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    let ok = Command::new(&p)
        .args(["version", "--client"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "kubectl is required for this test (set KUBECTL or install it)"
    );
    p
}

/// A proxy process, killed on drop.
pub(crate) struct Running {
    pub child: Child,
    pub ep: Endpoint,
    pub log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts a proxy process and waits for `Starting to serve on ADDR`.
pub(crate) fn start(mut cmd: Command, log: PathBuf) -> Running {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut child = cmd.spawn().expect("spawn proxy");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| {
            panic!(
                "no start line; stderr: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
    let shown = line
        .strip_prefix("Starting to serve on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    Running {
        child,
        ep: Endpoint::parse(shown),
        log,
    }
}

/// `edgetunnel proxy --kubeconfig K FLAGS`.
pub(crate) fn ours_cmd(kubeconfig: &Path, flags: &[String]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("proxy")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(flags)
        .env("EDGETUNNEL_LOG", "warn");
    c
}

/// `kubectl --kubeconfig K proxy FLAGS`.
pub(crate) fn kubectl_cmd(kubectl: &Path, kubeconfig: &Path, flags: &[String]) -> Command {
    let mut c = Command::new(kubectl);
    c.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("proxy")
        .args(flags);
    c
}

/// Runs a proxy command that is expected to refuse its configuration: one
/// that does not starts serving and is killed after 10 s. Returns (exited
/// successfully or kept serving, stderr written to `log`).
pub(crate) fn run_briefly(log: PathBuf, mut c: Command) -> (bool, String) {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("run");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let ok = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.success();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    (ok, std::fs::read_to_string(&log).unwrap_or_default())
}
