//! `edgetunnel proxy` against `kubectl proxy`, side by side in one run:
//! requests per second and p50/p99 latency (wrk) for small GETs and for a
//! 1 MiB response, both proxies in front of the same HTTPS upstream.
//!
//! `cargo bench --bench proxy` runs the full measurement (3 interleaved
//! rounds of 5 s per case and system) and writes `benches/results/proxy.json`;
//! under `cargo test` it runs a one-second smoke pass that only proves the
//! harness works. Figures are printed, never asserted. Needs `wrk` and
//! `kubectl` on PATH.
//!
//! `cargo bench --bench proxy -- --soak N` (issue 40) instead serves N
//! requests through each proxy in rounds (wrk with kept-alive connections,
//! wrk with `Connection: close`, and watches cancelled after their first
//! event, one for every 100 requests), sampling each proxy's resident
//! memory (and our live heap, `edgetunnel_heap_live_bytes`) after every
//! round and after a minute idle; it writes
//! `benches/results/proxy-soak/soak.json` and prints a table.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_edgetunnel");

struct Proc {
    child: Child,
    addr: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(mut cmd: Command) -> Proc {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn proxy");
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .expect("start line");
    let addr = line
        .trim()
        .strip_prefix("Starting to serve on ")
        .unwrap_or_else(|| panic!("unexpected {line:?}"))
        .to_string();
    Proc { child, addr }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU time the proxy process used per request, microseconds.
    cpu_us_per_req: f64,
    /// CPU time the upstream (this process) used per request.
    upstream_us_per_req: f64,
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are 11 and 12 after the ')'.
    (ticks(11) + ticks(12)) / 100.0
}

fn parse_latency(v: &str) -> Option<f64> {
    let v = v.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    num.trim().parse::<f64>().ok().map(|x| x * scale)
}

fn wrk(url: &str, conns: u32, secs: u32, pid: u32) -> Sample {
    wrk_with(url, conns, secs, pid, &[]).0
}

/// [`wrk`] with extra arguments; also the requests it completed.
fn wrk_with(url: &str, conns: u32, secs: u32, pid: u32, extra: &[&str]) -> (Sample, u64) {
    let pid = pid.to_string();
    let (c0, u0) = (cpu_seconds(&pid), cpu_seconds("self"));
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--latency",
        ])
        .args(extra)
        .arg(url)
        .output()
        .expect("run wrk (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    let (c1, u1) = (cpu_seconds(&pid), cpu_seconds("self"));
    let mut s = Sample {
        rps: 0.0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        cpu_us_per_req: 0.0,
        upstream_us_per_req: 0.0,
    };
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            s.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = t.strip_prefix("50%") {
            s.p50_ms = parse_latency(v).unwrap_or(f64::NAN);
        } else if let Some(v) = t.strip_prefix("99%") {
            s.p99_ms = parse_latency(v).unwrap_or(f64::NAN);
        }
    }
    let total = s.rps * secs as f64;
    if total > 0.0 {
        s.cpu_us_per_req = (c1 - c0) * 1e6 / total;
        s.upstream_us_per_req = (u1 - u0) * 1e6 / total;
    }
    if text.contains("Non-2xx") || text.contains("Socket errors") {
        eprintln!("  wrk reported errors:\n{text}");
    }
    // "  123456 requests in 5.00s, ..."
    let done = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or(0);
    (s, done)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

fn kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let p = dir.join("kubeconfig");
    apiserver::kubeconfig(&p, server, &dir.join("certs"), Some("bench-token"), false);
    p
}

/// The HTTPS fake API server both proxies front (in a directory of fresh
/// certificates), a kubeconfig naming it, and the `kubectl` to run.
fn upstream() -> (tempfile::TempDir, apiserver::FakeApiServer, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new(BIN)
        .args(["certs", "init"])
        .arg(dir.path().join("certs"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let api = apiserver::start(&dir.path().join("certs"));
    let kc = kubeconfig(
        dir.path(),
        &format!("https://127.0.0.1:{}", api.addr.port()),
    );
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    (dir, api, kc, kubectl)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--soak") {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .expect("--soak N");
        return soak(n);
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (reps, secs) = if full { (3, 5) } else { (1, 1) };
    let (_dir, _api, kc, kubectl) = upstream();
    let go = start({
        let mut c = Command::new(&kubectl);
        c.arg(format!("--kubeconfig={}", kc.display()))
            .args(["proxy", "--port=0"]);
        c
    });
    let ours = start({
        let mut c = Command::new(BIN);
        c.args([
            "proxy",
            "--port=0",
            &format!("--kubeconfig={}", kc.display()),
        ])
        .env("EDGETUNNEL_LOG", "warn");
        c
    });
    std::thread::sleep(Duration::from_millis(300));
    let cases = [
        ("small GET", "/api/v1/namespaces/default/pods", 32u32),
        ("1 MiB GET", "/bytes/1048576", 8u32),
    ];
    let systems = [("edgetunnel proxy", &ours), ("kubectl proxy", &go)];
    let mut json = Vec::new();
    let mut table = vec![
        "| case | system | req/s median (min-max) | p50 ms | p99 ms | proxy CPU us/req |"
            .to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    let mut ratios = Vec::new();
    for (case, path, conns) in cases {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); systems.len()];
        for rep in 0..reps {
            // Alternate the order each round so drift hits both alike.
            let order: Vec<usize> = if rep % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
            for i in order {
                let (name, p) = systems[i];
                let url = format!("http://{}{}", p.addr, path);
                let s = wrk(&url, conns, secs, p.child.id());
                eprintln!(
                    "{case:10} {name:17} round {rep}: {:>9.0} req/s  p50 {:.2} ms  p99 {:.2} ms  proxy CPU {:.1} us/req  upstream CPU {:.1} us/req",
                    s.rps, s.p50_ms, s.p99_ms, s.cpu_us_per_req, s.upstream_us_per_req
                );
                samples[i].push(s);
            }
        }
        let mut med = Vec::new();
        for (i, (name, _)) in systems.iter().enumerate() {
            let mut rps: Vec<f64> = samples[i].iter().map(|s| s.rps).collect();
            let mut p50: Vec<f64> = samples[i].iter().map(|s| s.p50_ms).collect();
            let mut p99: Vec<f64> = samples[i].iter().map(|s| s.p99_ms).collect();
            let (lo, hi) = (
                rps.iter().cloned().fold(f64::MAX, f64::min),
                rps.iter().cloned().fold(0.0, f64::max),
            );
            let mut cpu: Vec<f64> = samples[i].iter().map(|s| s.cpu_us_per_req).collect();
            let m = (median(&mut rps), median(&mut p50), median(&mut p99));
            let cpu = median(&mut cpu);
            table.push(format!(
                "| {case} | {name} | {:.0} ({lo:.0}-{hi:.0}) | {:.2} | {:.2} | {cpu:.1} |",
                m.0, m.1, m.2
            ));
            json.push(format!(
                "{{\"case\":\"{case}\",\"system\":\"{name}\",\"rps\":{:?},\"p50_ms\":{:?},\"p99_ms\":{:?},\"median_rps\":{:.1},\"median_p50_ms\":{:.3},\"median_p99_ms\":{:.3},\"cpu_us_per_req\":{:?}}}",
                samples[i].iter().map(|s| s.rps).collect::<Vec<_>>(),
                samples[i].iter().map(|s| s.p50_ms).collect::<Vec<_>>(),
                samples[i].iter().map(|s| s.p99_ms).collect::<Vec<_>>(),
                m.0,
                m.1,
                m.2,
                samples[i].iter().map(|s| s.cpu_us_per_req).collect::<Vec<_>>()
            ));
            med.push(m);
        }
        let ratio = med[0].0 / med[1].0.max(1e-9);
        ratios.push(format!(
            "{case}: edgetunnel/kubectl req/s ratio {ratio:.2}x, p99 {:.2} ms vs {:.2} ms",
            med[0].2, med[1].2
        ));
    }
    println!("\n{}\n", table.join("\n"));
    for r in &ratios {
        println!("{r}");
    }
    if full {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/proxy.json");
        let text = format!(
            "{{\"bench\":\"proxy\",\"date\":\"{}\",\"rounds\":{reps},\"seconds\":{secs},\"results\":[\n{}\n],\"ratios\":{:?}}}\n",
            chrono_like_now(),
            json.join(",\n"),
            ratios
        );
        std::fs::write(&out, text).unwrap();
        println!("wrote {}", out.display());
    }
}

/// UTC date from the `date` command (no extra dependency).
fn chrono_like_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// A field of `/proc/PID/status` in bytes: `VmRSS` (resident memory),
/// `RssAnon` (its anonymous part: what the process allocated, without the
/// pages of its binary and libraries that running code made resident).
fn status_bytes(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb * 1024.0)
}

/// One sample of a `/metrics` endpoint (NaN when absent).
fn scrape(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return f64::NAN;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// `n` watches through the proxy at `addr`, each cancelled (the
/// connection closed) once its first event came.
fn cancelled_watches(addr: &str, n: usize) {
    use std::io::{Read, Write};
    for _ in 0..n {
        let mut s = std::net::TcpStream::connect(addr).expect("connect proxy");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(
            b"GET /api/v1/namespaces/default/pods/quiet?watch=true HTTP/1.1\r\nHost: localhost\r\n\r\n",
        );
        let mut seen = Vec::new();
        let mut b = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("ADDED") {
            match s.read(&mut b) {
                Ok(k) if k > 0 => seen.extend_from_slice(&b[..k]),
                _ => panic!("a watch got no event: {}", String::from_utf8_lossy(&seen)),
            }
        }
    }
}

/// A soak sample: requests served so far, resident memory and live heap.
#[derive(Clone, Copy)]
struct Mem {
    served: u64,
    rss: f64,
    anon: f64,
    heap: f64,
}

/// See the module documentation (`--soak N`).
fn soak(n: u64) {
    let (_dir, _api, kc, kubectl) = upstream();
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let ours = start({
        let mut c = Command::new(BIN);
        c.args([
            "proxy",
            "--port=0",
            &format!("--kubeconfig={}", kc.display()),
        ])
        .arg(format!("--metrics-bind={metrics}"))
        .env("EDGETUNNEL_LOG", "warn");
        c
    });
    let go = start({
        let mut c = Command::new(&kubectl);
        c.arg(format!("--kubeconfig={}", kc.display()))
            .args(["proxy", "--port=0"]);
        c
    });
    std::thread::sleep(Duration::from_millis(300));
    let systems = [
        ("edgetunnel proxy", &ours, Some(metrics.as_str())),
        ("kubectl proxy", &go, None),
    ];
    let sample = |p: &Proc, m: Option<&str>, served: u64| Mem {
        served,
        rss: status_bytes(p.child.id(), "VmRSS"),
        anon: status_bytes(p.child.id(), "RssAnon"),
        heap: m.map_or(f64::NAN, |m| scrape(m, "edgetunnel_heap_live_bytes")),
    };
    let mut series: Vec<Vec<Mem>> = systems
        .iter()
        .map(|(_, p, m)| vec![sample(p, *m, 0)])
        .collect();
    let mut served = [0u64; 2];
    let mut watches = [0usize; 2];
    let started = std::time::Instant::now();
    let url = |p: &Proc| format!("http://{}/api/v1/namespaces/default/pods", p.addr);
    while served.iter().any(|&s| s < n) {
        // Interleaved, so that drift on a shared machine hits both alike.
        for (i, (name, p, m)) in systems.iter().enumerate() {
            if served[i] >= n {
                continue;
            }
            let (_, kept) = wrk_with(&url(p), 32, 5, p.child.id(), &[]);
            let (_, closed) = wrk_with(&url(p), 8, 2, p.child.id(), &["-H", "Connection: close"]);
            let w = ((kept + closed) / 100) as usize;
            cancelled_watches(&p.addr, w);
            served[i] += kept + closed + w as u64;
            watches[i] += w;
            let s = sample(p, *m, served[i]);
            eprintln!(
                "{name:17} {:>9} requests, {:>6} watches cancelled: RSS {:.1} MB, live heap {:.2} MB ({:.0} s)",
                served[i],
                watches[i],
                s.rss / 1e6,
                s.heap / 1e6,
                started.elapsed().as_secs_f64()
            );
            series[i].push(s);
        }
    }
    eprintln!("idle for 60 s");
    std::thread::sleep(Duration::from_secs(60));
    let idle: Vec<Mem> = systems
        .iter()
        .enumerate()
        .map(|(i, (_, p, m))| sample(p, *m, served[i]))
        .collect();
    let mut table = vec![
        "| system | requests | watches cancelled | RSS idle start MB | RSS at 10k MB | RSS at end MB | RSS after 60 s idle MB | RSS bytes/request (10k to end) | anonymous RSS idle start / at 10k / end / idle MB | live heap at 10k / end / idle MB |".to_string(),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|".to_string(),
    ];
    let mut json = Vec::new();
    for (i, (name, _, _)) in systems.iter().enumerate() {
        let v = &series[i];
        let first = v[0];
        let at10k = *v.iter().find(|s| s.served >= 10_000).unwrap_or(&v[1]);
        let end = *v.last().unwrap();
        let slope = (end.rss - at10k.rss) / (end.served - at10k.served).max(1) as f64;
        let mb = |x: f64| x / 1e6;
        table.push(format!(
            "| {name} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {slope:.2} | {:.1} / {:.1} / {:.1} / {:.1} | {:.2} / {:.2} / {:.2} |",
            end.served,
            watches[i],
            mb(first.rss),
            mb(at10k.rss),
            mb(end.rss),
            mb(idle[i].rss),
            mb(first.anon),
            mb(at10k.anon),
            mb(end.anon),
            mb(idle[i].anon),
            mb(at10k.heap),
            mb(end.heap),
            mb(idle[i].heap)
        ));
        json.push(format!(
            "{{\"system\":\"{name}\",\"watches_cancelled\":{},\"samples\":[{}],\"idle\":{{\"rss\":{},\"rss_anon\":{},\"heap\":{}}}}}",
            watches[i],
            v.iter()
                .map(|s| format!(
                    "{{\"served\":{},\"rss\":{},\"rss_anon\":{},\"heap\":{}}}",
                    s.served,
                    s.rss,
                    s.anon,
                    if s.heap.is_nan() { "null".into() } else { s.heap.to_string() }
                ))
                .collect::<Vec<_>>()
                .join(","),
            idle[i].rss,
            idle[i].anon,
            if idle[i].heap.is_nan() { "null".into() } else { idle[i].heap.to_string() }
        ));
    }
    println!("\n{}\n", table.join("\n"));
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/proxy-soak");
    std::fs::create_dir_all(&out).unwrap();
    let text = format!(
        "{{\"bench\":\"proxy soak\",\"date\":\"{}\",\"requests\":{n},\"results\":[\n{}\n]}}\n",
        chrono_like_now(),
        json.join(",\n")
    );
    std::fs::write(out.join("soak.json"), text).unwrap();
    std::fs::write(out.join("table.md"), table.join("\n") + "\n").unwrap();
    println!("wrote {}", out.display());
}
