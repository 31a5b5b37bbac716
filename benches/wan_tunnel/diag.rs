//! `WAN_DIAG=FILE`: while a case streams, once a second, the TCP state of
//! every connection across the link from both ends (`ss -tin`: an agent
//! link's, plain TCP's, the other systems'), and for edgetunnel its window
//! and round-trip metrics and the CPU seconds of each thread of server and
//! agent, appended to FILE. For diagnosing a cell, not for the grid's
//! figures (sampling costs a little CPU).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bed::Bed;
use crate::support::netns::sh;
use crate::support::wan::CLOUD_IP;

pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Metrics worth a line.
const KEEP: [&str; 9] = [
    "edgetunnel_buffered_bytes",
    "edgetunnel_tunnel_window",
    "edgetunnel_agent_link_rtt_seconds_sum",
    "edgetunnel_agent_link_rtt_seconds_count",
    "edgetunnel_agent_link_window",
    "bytes_to_agent",
    "bytes_from_agent",
    "edgetunnel_budget",
    "full_receive",
];

fn metrics(ns: &str, admin: SocketAddr) -> String {
    let text = sh(
        ns,
        &format!("curl -s --max-time 2 http://{admin}/metrics || true"),
    );
    text.lines()
        .filter(|l| !l.starts_with('#') && KEEP.iter().any(|k| l.contains(k)))
        .map(|l| format!("    {l}\n"))
        .collect()
}

/// CPU seconds so far of each thread of process `pid`, one line each
/// (`cpu THREAD SECONDS`).
fn threads_cpu(pid: u32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return String::new();
    };
    let mut out = String::new();
    for t in dir.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let name = stat
            .split_once('(')
            .and_then(|(_, r)| r.rsplit_once(')'))
            .map_or("?", |(n, _)| n);
        let tid = t.file_name().to_string_lossy().into_owned();
        let secs = crate::support::wan::cpu_secs_of(&stat);
        out.push_str(&format!("    cpu {name}/{tid} {secs:.2}\n"));
    }
    out
}

impl Sampler {
    pub(crate) fn start(bed: &Bed, what: &str) -> Option<Sampler> {
        let path = std::env::var_os("WAN_DIAG")?;
        // Plain TCP and the other systems: the link's TCP state only.
        let admins = bed.admins;
        let pids = bed.pids;
        let cloud = bed.wan.cloud.0.clone();
        let edge = bed.wan.edge.0.clone();
        let what = what.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let thread = std::thread::spawn(move || {
            let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            else {
                return;
            };
            let t0 = Instant::now();
            let _ = writeln!(f, "=== {what}");
            while !done.load(Ordering::Relaxed) {
                let t = t0.elapsed().as_secs_f64();
                let filter = format!("( dst {CLOUD_IP} or src {CLOUD_IP} )");
                let ss_c = sh(&cloud, &format!("ss -tin state established '{filter}'"));
                let ss_e = sh(&edge, &format!("ss -tin state established '{filter}'"));
                let (m_s, m_a) = match admins {
                    Some((server, agent)) => (metrics(&cloud, server), metrics(&edge, agent)),
                    None => Default::default(),
                };
                let (c_s, c_a) = match pids {
                    Some((server, agent)) => (threads_cpu(server), threads_cpu(agent)),
                    None => Default::default(),
                };
                let _ = write!(
                    f,
                    "--- t={t:.1}\n  cloud ss:\n{ss_c}\n  edge ss:\n{ss_e}\n  server:\n{m_s}{c_s}  agent:\n{m_a}{c_a}"
                );
                let until = Instant::now() + Duration::from_secs(1);
                while Instant::now() < until && !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Some(Sampler {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
