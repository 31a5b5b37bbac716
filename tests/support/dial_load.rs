//! A steady load of CONNECT dials (each: the answer, then 1 KiB echoed)
//! for tests that change the server under it (listener handover), and a
//! watch that socket paths never go missing meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::{connect_and_echo, Server, WAIT};

/// Dials in a loop until `stop`, through `via` (TCP address or socket
/// path), counting successes and keeping every failure's description.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    pub ok: Arc<AtomicUsize>,
    pub failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

pub(crate) enum Via {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl Via {
    /// Two loops through `server`'s TCP CONNECT frontend and two through
    /// its unix socket: about 50 dials a second with [`Load::start`].
    pub(crate) fn both_frontends(server: &Server) -> Vec<Via> {
        vec![
            Via::Tcp(server.connect),
            Via::Tcp(server.connect),
            Via::Unix(server.connect_uds.clone()),
            Via::Unix(server.connect_uds.clone()),
        ]
    }
}

impl Load {
    /// About 50 dials a second over `vias`, each tunnel closed once its
    /// echo came back.
    pub(crate) fn start(vias: Vec<Via>, target: String) -> Load {
        Load::holding(vias, target, Duration::ZERO)
    }

    /// With `hold` above zero, each loop keeps its tunnel open that long
    /// after the echo and dials again at once: with a few loops a tunnel
    /// is always open (and a dial always pending) through the server.
    pub(crate) fn holding(vias: Vec<Via>, target: String, hold: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = vias
            .into_iter()
            .map(|via| {
                let (stop, ok, failures, target) =
                    (stop.clone(), ok.clone(), failures.clone(), target.clone());
                thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let r = match &via {
                            Via::Tcp(a) => TcpStream::connect(a)
                                .map_err(|e| format!("connect {a}: {e}"))
                                .and_then(|mut s| {
                                    s.set_read_timeout(Some(WAIT)).unwrap();
                                    connect_and_echo(&mut s, &target, 1024)?;
                                    thread::sleep(hold);
                                    Ok(())
                                }),
                            Via::Unix(p) => UnixStream::connect(p)
                                .map_err(|e| format!("connect {}: {e}", p.display()))
                                .and_then(|mut s| {
                                    s.set_read_timeout(Some(WAIT)).unwrap();
                                    connect_and_echo(&mut s, &target, 1024)?;
                                    thread::sleep(hold);
                                    Ok(())
                                }),
                        };
                        match r {
                            Ok(()) => {
                                ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => failures.lock().unwrap().push(e),
                        }
                        // About 50 dials a second over the threads.
                        if hold.is_zero() {
                            thread::sleep(Duration::from_millis(60));
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    /// Dials that succeeded so far.
    pub(crate) fn dialled(&self) -> usize {
        self.ok.load(Ordering::SeqCst)
    }

    /// Waits until `count` dials succeeded; past [`WAIT`], fails with
    /// `what` (the round, logs).
    pub(crate) fn wait_past(&self, count: usize, what: impl Fn() -> String) {
        let deadline = Instant::now() + WAIT;
        while self.dialled() < count {
            assert!(
                Instant::now() < deadline,
                "dials stopped at {} of {count}: {}",
                self.dialled(),
                what()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::SeqCst), failures)
    }
}

/// Watches that `paths` exist, every millisecond, until stopped: the
/// number of looks that found one missing.
pub(crate) fn watch_paths(paths: Vec<PathBuf>, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut missing = 0;
        while !stop.load(Ordering::SeqCst) {
            missing += paths.iter().filter(|p| !Path::new(p).exists()).count();
            thread::sleep(Duration::from_millis(1));
        }
        missing
    })
}

/// A tunnel held open across a change of server still carries 64 KiB both
/// ways.
pub(crate) fn still_echoes(s: &mut (impl Read + Write), tag: u8) {
    let data = vec![tag; 64 * 1024];
    s.write_all(&data).unwrap();
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back)
        .expect("echo through the held tunnel");
    assert_eq!(back, data);
}

/// Reports `ok` successes and the `failures` of `what` (dials, tunnels,
/// requests), and fails the test when any failed, quoting the first ten
/// and `context` (logs, taken only then).
pub(crate) fn assert_none_failed(
    what: &str,
    ok: usize,
    failures: &[String],
    context: impl FnOnce() -> String,
) {
    eprintln!("{ok} {what}, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {} {what} failed: {:?}\n{}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(10)],
        context()
    );
}
