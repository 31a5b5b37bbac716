//! Signals: SIGTERM/SIGINT/SIGHUP are blocked in every thread and taken by
//! one watcher thread with `sigwait`. SIGTERM and SIGINT request shutdown
//! (tasks on any core await [`Shutdown::wait`]); SIGHUP runs the role's
//! reload (certificates from their files) and never ends the process.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A broadcast latch counting shutdown requests (first: drain, second: now).
#[derive(Default)]
pub struct Shutdown {
    count: AtomicU32,
    wakers: Mutex<Vec<Waker>>,
}

impl Shutdown {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn requested(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }

    pub fn trigger(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        let wakers = std::mem::take(&mut *self.wakers.lock().expect("shutdown lock"));
        for w in wakers {
            w.wake();
        }
    }

    /// Resolves once at least `n` requests arrived.
    pub fn wait(self: &Arc<Self>, n: u32) -> WaitShutdown {
        WaitShutdown {
            latch: self.clone(),
            n,
        }
    }
}

pub struct WaitShutdown {
    latch: Arc<Shutdown>,
    n: u32,
}

impl Future for WaitShutdown {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.latch.requested() >= self.n {
            return Poll::Ready(());
        }
        self.latch
            .wakers
            .lock()
            .expect("shutdown lock")
            .push(cx.waker().clone());
        if self.latch.requested() >= self.n {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (call before
/// spawning workers so they inherit the mask) and starts a thread that
/// triggers `shutdown` for each SIGTERM/SIGINT and runs `on_hangup` for
/// each SIGHUP.
pub fn install(
    shutdown: Arc<Shutdown>,
    on_hangup: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    let signals = super::sys::ShutdownSignals::block()?;
    std::thread::Builder::new()
        .name("edgetunnel-signals".into())
        .spawn(move || loop {
            match signals.wait() {
                Some(libc::SIGHUP) => {
                    tracing::info!("SIGHUP received: reloading");
                    on_hangup();
                }
                Some(signal) => {
                    tracing::info!(signal, "shutdown signal received");
                    shutdown.trigger();
                }
                None => {}
            }
        })?;
    Ok(())
}

/// The SIGHUP action of a role with certificate files: load each pair now,
/// whether or not its files look changed, and log the outcome.
pub fn reload_certs(
    certs: Vec<Arc<super::cert_reload::ReloadingCert>>,
) -> impl Fn() + Send + 'static {
    move || {
        if certs.is_empty() {
            tracing::info!("SIGHUP: nothing to reload (no certificate files)");
        }
        for cert in &certs {
            match cert.reload() {
                Ok(()) => tracing::info!(
                    file = %cert.path().display(),
                    "SIGHUP: certificate reloaded; new handshakes use it"
                ),
                Err(e) => tracing::warn!(
                    file = %cert.path().display(),
                    "SIGHUP: certificate not reloaded (old one stays): {e}"
                ),
            }
        }
    }
}
