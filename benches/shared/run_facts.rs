//! Facts about a bench run for the top of its report (the comparison
//! bench and the WAN bench include this file): the date, the machine, the
//! commit measured and the load average, since the machine is shared and
//! what else ran is part of every figure.

use std::process::Command;

/// /proc/loadavg's 1, 5 and 15 minute figures, with the core count.
pub(crate) fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let f: Vec<&str> = l.split_whitespace().take(3).collect();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{} (1, 5, 15 min) on {cores} cores", f.join(", "))
}

/// The date and time now, UTC, to the minute.
pub(crate) fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Cores and CPU model, RAM and kernel.
pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb >> 20);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores ({cpu}), {mem} GiB RAM, Linux {}",
        kernel.trim()
    )
}

/// The commit of the repository at `repo` (`git rev-parse --short HEAD`),
/// with `+changes` when its work tree differs from it.
pub(crate) fn commit(repo: &std::path::Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown (no git)".to_string();
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}+changes")
    } else {
        head
    }
}
