//! What the grid measured, and its report: `wan.json` (every case and
//! dial row, rewritten after each case so a broken run keeps what it
//! had), `wan.md` (the goals checked, dial round trips, tables of
//! MB/s with ratios to the ceiling and to ANP) and one plot per loss.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::bed::System;
use crate::flows::{Delivered, DialTimes, Direction};
use crate::options::Options;
use crate::{plot, run_facts};

/// What one case moved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moved {
    pub mb_s: f64,
    pub bytes: u64,
    pub secs: f64,
    /// Packets the link dropped at random / at its full queue meanwhile.
    pub lost: u64,
    pub drops: u64,
}

/// One case: a system, RTT, loss, tunnel count and direction.
pub(crate) struct Cell {
    pub rtt: f64,
    pub loss: f64,
    pub tunnels: usize,
    pub dir: Direction,
    pub system: System,
    pub result: Result<Moved, String>,
    /// The 1-minute load average when it ended: what else ran.
    pub load1: f64,
}

impl Cell {
    pub(crate) fn new(
        rtt: f64,
        loss: f64,
        tunnels: usize,
        dir: Direction,
        system: System,
        r: Result<(Delivered, u64, u64), String>,
    ) -> Cell {
        let result = r.map(|(d, lost, drops)| Moved {
            mb_s: d.mb_per_s(),
            bytes: d.bytes,
            secs: d.secs,
            lost,
            drops,
        });
        let load1 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN);
        Cell {
            rtt,
            loss,
            tunnels,
            dir,
            system,
            result,
            load1,
        }
    }

    /// The progress line.
    pub(crate) fn line(&self) -> String {
        let what = match &self.result {
            Ok(m) => format!(
                "{:>8} MB/s  (link: {} lost, {} tail drops; load {:.1})",
                mbs(m.mb_s),
                m.lost,
                m.drops,
                self.load1
            ),
            Err(e) => format!("FAILED: {e}"),
        };
        format!(
            "RTT {:>3} ms  loss {:<4}%  {} tunnel(s) {:<8}  {:<20} {what}",
            self.rtt,
            self.loss,
            self.tunnels,
            self.dir.name(),
            self.system.label()
        )
    }
}

/// Dials of one system at one RTT: medians in ms.
pub(crate) struct DialRow {
    pub rtt: f64,
    pub loss: f64,
    pub system: System,
    /// (open, first byte, dials)
    pub result: Result<(f64, f64, usize), String>,
}

impl DialRow {
    pub(crate) fn new(rtt: f64, loss: f64, system: System, r: Result<DialTimes, String>) -> Self {
        let result = r.map(|t| {
            let n = t.open_ms.len();
            (median(t.open_ms), median(t.first_byte_ms), n)
        });
        DialRow {
            rtt,
            loss,
            system,
            result,
        }
    }

    pub(crate) fn line(&self) -> String {
        match &self.result {
            Ok((open, first, n)) => format!(
                "dial RTT {:>3} ms  {:<20} open {open:.1} ms{}, first byte {first:.1} ms{} (median of {n})",
                self.rtt,
                self.system.label(),
                trips(*open, self.rtt),
                trips(*first, self.rtt)
            ),
            Err(e) => format!(
                "dial RTT {:>3} ms  {:<20} FAILED: {e}",
                self.rtt,
                self.system.label()
            ),
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// " (N RTT)" for a latency at a round trip, nothing at RTT 0.
fn trips(ms: f64, rtt: f64) -> String {
    if rtt > 0.0 {
        format!(" ({:.2} RTT)", ms / rtt)
    } else {
        String::new()
    }
}

/// MB/s with three significant digits or so.
pub(crate) fn mbs(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The whole run: its settings, facts about it and what it measured.
pub(crate) struct Grid {
    pub date: String,
    pub machine: String,
    pub commit: String,
    pub command: String,
    pub load_start: String,
    pub load_end: String,
    pub rtts: Vec<f64>,
    pub losses: Vec<f64>,
    pub tunnels: Vec<usize>,
    pub directions: Vec<Direction>,
    pub systems: Vec<System>,
    pub rate_mbit: f64,
    pub mtu: usize,
    /// TCP congestion control on both sides of the link.
    pub cc: String,
    pub window_secs: f64,
    pub warmup_rtts: f64,
    pub warmup_min_secs: f64,
    pub dials_per_rtt: usize,
    pub cells: Vec<Cell>,
    pub dials: Vec<DialRow>,
    pub notes: Vec<String>,
}

impl Grid {
    pub(crate) fn new(o: &Options) -> Grid {
        Grid {
            date: run_facts::today(),
            machine: run_facts::machine(),
            commit: run_facts::commit(&crate::support::repo()),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            load_start: run_facts::loadavg(),
            load_end: String::new(),
            rtts: o.rtts.clone(),
            losses: o.losses.clone(),
            tunnels: o.tunnels.clone(),
            directions: o.directions.clone(),
            systems: o.systems.clone(),
            rate_mbit: o.rate_mbit,
            mtu: o.mtu,
            cc: o.cc.clone().unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
                    .unwrap_or_default();
                format!("{} (the host's default)", host.trim())
            }),
            window_secs: o.window.as_secs_f64(),
            warmup_rtts: o.warmup_rtts,
            warmup_min_secs: o.warmup_min.as_secs_f64(),
            dials_per_rtt: o.dials,
            cells: Vec::new(),
            dials: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub(crate) fn note(&mut self, n: String) {
        println!("note: {n}");
        self.notes.push(n);
    }

    pub(crate) fn finish(&mut self) {
        self.load_end = run_facts::loadavg();
    }

    /// Every case and dial row that failed, as lines.
    pub(crate) fn failures(&self) -> Vec<String> {
        let cells = self.cells.iter().filter(|c| c.result.is_err());
        let dials = self.dials.iter().filter(|d| d.result.is_err());
        cells
            .map(Cell::line)
            .chain(dials.map(DialRow::line))
            .collect()
    }

    /// MB/s of a case, if it ran and succeeded.
    pub(crate) fn value(
        &self,
        system: System,
        rtt: f64,
        loss: f64,
        tunnels: usize,
        dir: Direction,
    ) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| {
                c.system == system
                    && c.rtt == rtt
                    && c.loss == loss
                    && c.tunnels == tunnels
                    && c.dir == dir
            })
            .and_then(|c| c.result.as_ref().ok())
            .map(|m| m.mb_s)
    }

    /// Systems that have at least one case, in the grid's order.
    pub(crate) fn systems_run(&self) -> Vec<System> {
        let mut v: Vec<System> = self.systems.clone();
        v.retain(|s| self.cells.iter().any(|c| c.system == *s));
        v
    }

    pub(crate) fn save_json(&self, out: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(out)?;
        let text = serde_json::to_string_pretty(&self.json()).map_err(std::io::Error::other)?;
        std::fs::write(out.join("wan.json"), text + "\n")
    }

    fn json(&self) -> Value {
        let cells: Vec<Value> = self
            .cells
            .iter()
            .map(|c| {
                let mut v = json!({
                    "system": c.system.name(),
                    "rtt_ms": c.rtt,
                    "loss_percent": c.loss,
                    "tunnels": c.tunnels,
                    "direction": c.dir.name(),
                    "load_average_1min": c.load1,
                });
                match &c.result {
                    Ok(m) => {
                        v["mb_per_s"] = json!(m.mb_s);
                        v["bytes"] = json!(m.bytes);
                        v["secs"] = json!(m.secs);
                        v["link_lost_packets"] = json!(m.lost);
                        v["link_tail_drops"] = json!(m.drops);
                    }
                    Err(e) => v["error"] = json!(e),
                }
                v
            })
            .collect();
        let dials: Vec<Value> = self
            .dials
            .iter()
            .map(|d| {
                let mut v = json!({
                    "system": d.system.name(),
                    "rtt_ms": d.rtt,
                    "loss_percent": d.loss,
                });
                match &d.result {
                    Ok((open, first, n)) => {
                        v["open_ms_median"] = json!(open);
                        v["first_byte_ms_median"] = json!(first);
                        v["dials"] = json!(n);
                    }
                    Err(e) => v["error"] = json!(e),
                }
                v
            })
            .collect();
        json!({
            "date": self.date,
            "machine": self.machine,
            "commit": self.commit,
            "command": self.command,
            "load_average_start": self.load_start,
            "load_average_end": self.load_end,
            "rate_mbit": self.rate_mbit,
            "mtu": self.mtu,
            "congestion_control": self.cc,
            "window_secs": self.window_secs,
            "warmup_rtts": self.warmup_rtts,
            "warmup_min_secs": self.warmup_min_secs,
            "notes": self.notes,
            "cases": cells,
            "dials": dials,
        })
    }
}

/// Writes wan.json, wan.md and the plots into `out`; the files written.
pub(crate) fn write_all(grid: &Grid, out: &Path) -> std::io::Result<Vec<PathBuf>> {
    grid.save_json(out)?;
    let mut files = vec![out.join("wan.json")];
    let mut plots = Vec::new();
    for &loss in &grid.losses {
        let name = format!("throughput-loss-{loss}.svg");
        let svg = plot::throughput_svg(grid, loss).map_err(std::io::Error::other)?;
        std::fs::write(out.join(&name), svg)?;
        files.push(out.join(&name));
        plots.push((loss, name));
    }
    std::fs::write(out.join("wan.md"), markdown(grid, &plots))?;
    files.insert(1, out.join("wan.md"));
    Ok(files)
}

fn markdown(g: &Grid, plots: &[(f64, String)]) -> String {
    let mut md = String::from("# edgetunnel over an emulated WAN\n\n");
    md.push_str(&format!("- **Date:** {}\n", g.date));
    md.push_str(&format!("- **Machine:** {}\n", g.machine));
    md.push_str(&format!("- **Commit:** {}\n", g.commit));
    md.push_str(&format!("- **Command:** `{}`\n", g.command));
    md.push_str(&format!(
        "- **Load average:** {} at the start, {} at the end\n",
        g.load_start, g.load_end
    ));
    md.push_str(&format!(
        "- **Link:** `wanlink` between two network namespaces: {} Mbit/s ({:.1} MB/s of IP \
         packets) each way, MTU {}, a queue of one bandwidth-delay product (at least 64 KiB) \
         with tail drop, random loss per direction as given, no jitter; socket buffers up to \
         128 MiB; TCP congestion control {} everywhere. Only the system's own link crosses it: client and server (or the cloud \
         haproxy) share the cloud side, agent (or the edge haproxy) and target the edge's.\n",
        g.rate_mbit,
        g.rate_mbit / 8.0,
        g.mtu,
        g.cc
    ));
    md.push_str(&format!(
        "- **Cases:** all tunnels of a case stream at once for a warm-up of {} round trips \
         (at least {} s), then a window of {} s; MB/s is the bytes the receivers took in the \
         window (every byte checked against the pattern) over its length, all tunnels \
         together. The ceiling is plain TCP over the same link with as many connections. \
         Ratios: to the ceiling (`x`), and for edgetunnel to the Go ANP doing the same work \
         (`x ANP`: CONNECT to ANP http-connect, gRPC to ANP grpc).\n\n",
        g.warmup_rtts, g.warmup_min_secs, g.window_secs
    ));
    if !g.notes.is_empty() {
        md.push_str("**Notes**\n\n");
        for n in &g.notes {
            md.push_str(&format!("- {}\n", n.replace('\n', " ")));
        }
        md.push('\n');
    }
    md.push_str(&goals(g));
    md.push_str(&dial_tables(g));
    for &loss in &g.losses {
        md.push_str(&format!("## Throughput, loss {loss} %\n\n"));
        if let Some((_, file)) = plots.iter().find(|p| p.0 == loss) {
            md.push_str(&format!(
                "![throughput against RTT, loss {loss} %]({file})\n\n"
            ));
        }
        for &tunnels in &g.tunnels {
            for &dir in &g.directions {
                md.push_str(&throughput_table(g, loss, tunnels, dir));
            }
        }
    }
    md
}

fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

fn head(first: &str, g: &Grid) -> String {
    let mut h = vec![first.to_string()];
    h.extend(g.rtts.iter().map(|r| format!("RTT {r} ms")));
    let mut s = row(&h);
    s.push_str(&row(&std::iter::once("---".to_string())
        .chain(g.rtts.iter().map(|_| "---:".to_string()))
        .collect::<Vec<_>>()));
    s
}

fn throughput_table(g: &Grid, loss: f64, tunnels: usize, dir: Direction) -> String {
    let t = if tunnels == 1 { "tunnel" } else { "tunnels" };
    let mut md = format!("### {tunnels} {t}, {}, MB/s\n\n", dir.name());
    md.push_str(&head("system", g));
    for system in g.systems_run() {
        let mut cells = vec![system.label().to_string()];
        for &rtt in &g.rtts {
            let v = g.value(system, rtt, loss, tunnels, dir);
            let ceiling = g.value(System::Plain, rtt, loss, tunnels, dir);
            let twin = system
                .anp_twin()
                .and_then(|a| g.value(a, rtt, loss, tunnels, dir));
            cells.push(match v {
                None => "—".into(),
                Some(v) if system == System::Plain => mbs(v),
                Some(v) => {
                    let mut r = Vec::new();
                    if let Some(c) = ceiling {
                        r.push(format!("{:.2}x", v / c));
                    }
                    if let Some(a) = twin {
                        r.push(format!("{:.2}x ANP", v / a));
                    }
                    if r.is_empty() {
                        mbs(v)
                    } else {
                        format!("{} ({})", mbs(v), r.join(", "))
                    }
                }
            });
        }
        md.push_str(&row(&cells));
    }
    md.push('\n');
    md
}

fn dial_tables(g: &Grid) -> String {
    if g.dials.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "## Dial latency\n\nMedian of {} dials one after another, at the first loss of the \
         grid ({} %), in ms and in round trips of the link. *Open*: from the client's dial \
         to the stream being usable (CONNECT's `200`, gRPC's DIAL_RSP, TCP's handshake; the \
         haproxy pair's cloud side answers at once on loopback). *First byte*: to the first \
         byte echoed by the target through it (one more round trip when the open waited \
         for the far end).\n\n",
        g.dials_per_rtt,
        g.losses.first().copied().unwrap_or(0.0)
    );
    for (what, pick) in [("open", 0), ("first byte", 1)] {
        md.push_str(&format!("### {what}\n\n"));
        md.push_str(&head("system", g));
        for system in g.systems_run() {
            let mut cells = vec![system.label().to_string()];
            for &rtt in &g.rtts {
                let d = g.dials.iter().find(|d| d.system == system && d.rtt == rtt);
                cells.push(match d.map(|d| &d.result) {
                    Some(Ok((open, first, _))) => {
                        let ms = if pick == 0 { *open } else { *first };
                        format!("{ms:.1} ms{}", trips(ms, rtt))
                    }
                    Some(Err(_)) => "failed".into(),
                    None => "—".into(),
                });
            }
            md.push_str(&row(&cells));
        }
        md.push('\n');
    }
    md
}

/// One goal of issue 41 for one system and direction: the figures it is
/// judged on and whether every one passes.
struct Goal {
    text: &'static str,
    loss: f64,
    tunnels: usize,
    /// The least ratio to the ceiling at RTT <= 100 ms and above; None:
    /// the least ratio to the Go ANP is 1.
    to_ceiling: Option<(f64, f64)>,
}

const GOALS: [Goal; 4] = [
    Goal {
        text: "1 tunnel, no loss: ≥ 0.9x plain TCP at RTT ≤ 100 ms, ≥ 0.8x at 300 ms",
        loss: 0.0,
        tunnels: 1,
        to_ceiling: Some((0.9, 0.8)),
    },
    Goal {
        text: "1 tunnel, no loss: ≥ the Go ANP at every RTT",
        loss: 0.0,
        tunnels: 1,
        to_ceiling: None,
    },
    Goal {
        text: "8 tunnels, no loss: ≥ 0.9x the ceiling at every RTT",
        loss: 0.0,
        tunnels: 8,
        to_ceiling: Some((0.9, 0.9)),
    },
    Goal {
        text: "8 tunnels, 1 % loss: ≥ the Go ANP at every RTT",
        loss: 1.0,
        tunnels: 8,
        to_ceiling: None,
    },
];

fn goals(g: &Grid) -> String {
    let mut md = String::from(
        "## Issue 41's goals\n\nEach goal for each edgetunnel frontend and direction: the \
         ratio at every RTT measured (to the ceiling, or to the Go ANP doing the same work), \
         and whether all of them pass. One run on a shared machine: a ratio within a few \
         percent of its bound is within the noise.\n\n",
    );
    md.push_str("| goal | system | direction | ratios by RTT | met |\n|---|---|---|---|---|\n");
    let mut any = false;
    for goal in &GOALS {
        for system in [System::EtConnect, System::EtGrpc] {
            for &dir in &g.directions {
                let mut figures = Vec::new();
                let mut met = true;
                for &rtt in &g.rtts {
                    let Some(v) = g.value(system, rtt, goal.loss, goal.tunnels, dir) else {
                        continue;
                    };
                    let (base, bound) = match goal.to_ceiling {
                        Some((near, far)) => (
                            g.value(System::Plain, rtt, goal.loss, goal.tunnels, dir),
                            if rtt <= 100.0 { near } else { far },
                        ),
                        None => (
                            system
                                .anp_twin()
                                .and_then(|a| g.value(a, rtt, goal.loss, goal.tunnels, dir)),
                            1.0,
                        ),
                    };
                    let Some(base) = base else { continue };
                    let r = v / base;
                    met &= r >= bound;
                    figures.push(format!("{rtt} ms: {r:.2}x"));
                }
                if figures.is_empty() {
                    continue;
                }
                any = true;
                md.push_str(&row(&[
                    goal.text.to_string(),
                    system.label().to_string(),
                    dir.name().to_string(),
                    figures.join(", "),
                    if met { "yes" } else { "**no**" }.to_string(),
                ]));
            }
        }
    }
    if !any {
        md.push_str("| (no case of the grid bears on a goal) | | | | |\n");
    }
    md.push('\n');
    md
}
