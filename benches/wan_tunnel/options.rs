//! The command line of the WAN bench.

use std::path::PathBuf;
use std::time::Duration;

use crate::bed::System;
use crate::flows::Direction;

pub(crate) const USAGE: &str = "\
usage: benches/run --scenarios wan [--rtts MS,..] [--losses PCT,..] [--tunnels N,..]
         [--directions download,upload] [--systems a,b,..] [--secs S]
         [--warmup-rtts K] [--warmup-min-secs S] [--dials N] [--rate-mbit R]
         [--mtu M] [--cc NAME] [--rmem-default B] [--out DIR]
  The WAN grid (issue 41): every system over an emulated link between two
  network namespaces (crates/wanlink), one case per RTT x loss x tunnels x
  direction, each streaming for a fixed time; root, iproute2, /dev/net/tun.
  --rtts        round trips, ms (default 0,20,100,300)
  --losses      random loss per direction, percent (default 0,0.1,1)
  --tunnels     streams at once per case (default 1,8)
  --directions  download (edge to cloud), upload (default both)
  --systems     subset of plain-tcp,edgetunnel-connect,edgetunnel-grpc,
                anp-connect,anp-grpc,haproxy-tls-pair (default all; anp-*
                need the real peers: EDGETUNNEL_PEERS or ../shared/peers)
  --secs S      the measured window of each case (default 4; the grid
                then takes about 45 minutes here)
  --warmup-rtts K, --warmup-min-secs S
                streaming before the window: K round trips, at least S
                seconds (default 20 and 1: slow start and window growth)
  --dials N     dials timed per system at each RTT, at the first loss given
                (default 10; 0: none)
  --rate-mbit R the link's rate (default 500), --mtu M its MTU (default 1500)
  --cc NAME     TCP congestion control in both namespaces (e.g. cubic; by
                default the host's, which new namespaces inherit; a
                namespace may only pick one the host lists in
                net.ipv4.tcp_allowed_congestion_control)
  --rmem-default B
                the initial TCP receive buffer in both namespaces (the
                middle of net.ipv4.tcp_rmem, default the kernel's 131072):
                where a receiver's window starts before autotuning
  --out DIR     where wan.md, wan.json and the plots go (default
                benches/results/wan/grid-<date>-<time>/)
Without --bench (cargo test) a smoke pass of seconds: RTT 10 ms, no loss,
2 tunnels, plain TCP and edgetunnel's two frontends, into target/wan-smoke/.";

pub(crate) struct Options {
    pub smoke: bool,
    pub rtts: Vec<f64>,
    pub losses: Vec<f64>,
    pub tunnels: Vec<usize>,
    pub directions: Vec<Direction>,
    pub systems: Vec<System>,
    pub window: Duration,
    pub warmup_rtts: f64,
    pub warmup_min: Duration,
    pub dials: usize,
    pub rate_mbit: f64,
    pub mtu: usize,
    /// TCP congestion control of the namespaces; None: the host's.
    pub cc: Option<String>,
    /// The middle of `net.ipv4.tcp_rmem` in the namespaces; None: 131072.
    pub rmem_default: Option<u64>,
    pub out: Option<PathBuf>,
}

impl Options {
    /// The warm-up before the window at round trip `rtt_ms`.
    pub(crate) fn warmup(&self, rtt_ms: f64) -> Duration {
        Duration::from_secs_f64(rtt_ms * self.warmup_rtts / 1000.0).max(self.warmup_min)
    }
}

fn list<T: std::str::FromStr>(flag: &str, v: &str) -> Result<Vec<T>, String> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("{flag}: cannot read {x:?}"))
        })
        .collect()
}

fn secs(flag: &str, v: &str) -> Result<Duration, String> {
    let s: f64 = v
        .parse()
        .map_err(|_| format!("{flag}: cannot read {v:?}"))?;
    Ok(Duration::from_secs_f64(s.max(0.0)))
}

/// The options, or the text to print (usage or an error).
pub(crate) fn parse() -> Result<Options, String> {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let mut o = if smoke {
        Options {
            smoke,
            rtts: vec![10.0],
            losses: vec![0.0],
            tunnels: vec![2],
            directions: vec![Direction::Down, Direction::Up],
            systems: vec![System::Plain, System::EtConnect, System::EtGrpc],
            window: Duration::from_millis(300),
            warmup_rtts: 20.0,
            warmup_min: Duration::from_millis(200),
            dials: 2,
            rate_mbit: 100.0,
            mtu: 1500,
            cc: None,
            rmem_default: None,
            out: None,
        }
    } else {
        Options {
            smoke,
            rtts: vec![0.0, 20.0, 100.0, 300.0],
            losses: vec![0.0, 0.1, 1.0],
            tunnels: vec![1, 8],
            directions: vec![Direction::Down, Direction::Up],
            systems: System::ALL.to_vec(),
            window: Duration::from_secs(4),
            warmup_rtts: 20.0,
            warmup_min: Duration::from_secs(1),
            dials: 10,
            rate_mbit: 500.0,
            mtu: 1500,
            cc: None,
            rmem_default: None,
            out: None,
        }
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--rtts" => o.rtts = list(&a, &val()?)?,
            "--losses" => o.losses = list(&a, &val()?)?,
            "--tunnels" => o.tunnels = list(&a, &val()?)?,
            "--directions" => {
                o.directions = val()?
                    .split(',')
                    .map(|d| match d.trim() {
                        "download" | "down" => Ok(Direction::Down),
                        "upload" | "up" => Ok(Direction::Up),
                        x => Err(format!(
                            "--directions: {x:?} is neither download nor upload"
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--systems" => {
                o.systems = val()?
                    .split(',')
                    .map(|s| System::from_name(s.trim()).ok_or(format!("unknown system {s}")))
                    .collect::<Result<_, _>>()?
            }
            "--secs" => o.window = secs(&a, &val()?)?,
            "--warmup-rtts" => {
                o.warmup_rtts = val()?.parse().map_err(|_| "--warmup-rtts K".to_string())?
            }
            "--warmup-min-secs" => o.warmup_min = secs(&a, &val()?)?,
            "--dials" => o.dials = val()?.parse().map_err(|_| "--dials N".to_string())?,
            "--rate-mbit" => {
                o.rate_mbit = val()?.parse().map_err(|_| "--rate-mbit R".to_string())?
            }
            "--mtu" => o.mtu = val()?.parse().map_err(|_| "--mtu M".to_string())?,
            "--cc" => o.cc = Some(val()?),
            "--rmem-default" => {
                o.rmem_default = Some(
                    val()?
                        .parse()
                        .map_err(|_| "--rmem-default BYTES".to_string())?,
                )
            }
            "--out" => o.out = Some(PathBuf::from(val()?)),
            "-h" | "--help" => return Err(USAGE.to_string()),
            // cargo passes `--bench` and filters through.
            _ => {}
        }
    }
    // The ceiling first: every ratio needs it.
    o.systems
        .sort_by_key(|s| System::ALL.iter().position(|x| x == s));
    o.systems.dedup();
    Ok(o)
}
