//! Shutdown signalling: SIGTERM/SIGINT are blocked in every thread and taken
//! by one watcher thread with `sigwait`; tasks on any core await
//! [`Shutdown::wait`].

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

/// Blocks SIGTERM and SIGINT in the calling thread (call before spawning
/// workers so they inherit the mask) and starts a thread that triggers
/// `shutdown` for each one received.
pub fn install(shutdown: Arc<Shutdown>) -> std::io::Result<()> {
    let signals = super::sys::ShutdownSignals::block()?;
    std::thread::Builder::new()
        .name("edgetunnel-signals".into())
        .spawn(move || loop {
            if let Some(signal) = signals.wait() {
                tracing::info!(signal, "shutdown signal received");
                shutdown.trigger();
            }
        })?;
    Ok(())
}
