//! Profiling hook: with `COMPARE_PROFILE` set to a command, each bulk and
//! latency measurement runs that command attached to the system's
//! processes for exactly the measured window (from the first CPU snapshot
//! to the second), then stops it with SIGINT so that it writes its report.
//! The command may name `{pids}` (the system's pids, comma-separated, as
//! `perf -p` and `strace -p` take them) and `{out}` (a path prefix under
//! `COMPARE_PROFILE_DIR`, default `target/compare-profile/`, naming the
//! system, scenario, case and repetition). For example:
//!
//! ```text
//! COMPARE_PROFILE='perf record -g -o {out}.data -p {pids}'
//! COMPARE_PROFILE='perf stat -e task-clock,context-switches -o {out}.txt -p {pids}'
//! COMPARE_PROFILE='strace -c -f -o {out}.strace -p {pids}'
//! ```
//!
//! `COMPARE_PROFILE_ONLY=saturation` (a substring of `{out}`'s name)
//! limits it to the matching cases.
//!
//! The profiler's own CPU is not counted (it is not one of the system's
//! processes) but it shares the machine: profile in runs of their own,
//! not in the runs whose figures are reported.

use std::cell::RefCell;
use std::path::PathBuf;
use std::process::{Child, Command};

use crate::cpu::Snapshot;
use crate::systems::Running;

/// The profiler command and the child attached to the current window.
pub(crate) struct Profiler {
    cmd: Option<String>,
    only: Option<String>,
    dir: PathBuf,
    child: RefCell<Option<Child>>,
}

impl Profiler {
    pub(crate) fn from_env() -> Profiler {
        let cmd = std::env::var("COMPARE_PROFILE")
            .ok()
            .filter(|c| !c.trim().is_empty());
        let dir = std::env::var_os("COMPARE_PROFILE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target/compare-profile"));
        if cmd.is_some() {
            let _ = std::fs::create_dir_all(&dir);
        }
        Profiler {
            cmd,
            only: std::env::var("COMPARE_PROFILE_ONLY").ok(),
            dir,
            child: RefCell::new(None),
        }
    }

    /// The CPU snapshot of `r` that opens or closes a measured window;
    /// the profiler starts right after the opening one and is stopped
    /// right before the closing one.
    pub(crate) fn snapshot(&self, r: &Running, what: &str) -> Option<Snapshot> {
        let Some(cmd) = &self.cmd else {
            return r.cpu_snapshot();
        };
        if self.only.as_deref().is_some_and(|o| !what.contains(o)) {
            return r.cpu_snapshot();
        }
        if let Some(mut child) = self.child.borrow_mut().take() {
            // SAFETY: kill(2) on the pid of a child we have not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
            let _ = child.wait();
            return r.cpu_snapshot();
        }
        let snap = r.cpu_snapshot();
        let pids: Vec<String> = r.pids().iter().map(|p| p.to_string()).collect();
        let name: String = format!("{}-{what}", r.label)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let out = self.dir.join(name);
        let line = cmd
            .replace("{pids}", &pids.join(","))
            .replace("{out}", &out.to_string_lossy());
        match Command::new("sh")
            .arg("-c")
            .arg(format!("exec {line}"))
            .spawn()
        {
            Ok(child) => {
                // perf and strace need a moment to attach.
                std::thread::sleep(std::time::Duration::from_millis(300));
                *self.child.borrow_mut() = Some(child);
            }
            Err(e) => eprintln!("COMPARE_PROFILE: {line}: {e}"),
        }
        snap
    }
}
