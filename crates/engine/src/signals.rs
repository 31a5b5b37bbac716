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
    waiters: Mutex<Waiters>,
}

/// The wakers of the [`WaitShutdown`]s pending now: a slot each, taken at
/// the first poll, kept across polls and wakes, freed when the waiter is
/// dropped. (A waker pushed at every poll and dropped only at shutdown
/// held 16 bytes and the task it names, about 100 bytes a tunnel on the
/// server, 65 on the agent, 600 a gRPC caller: issue 40.) At most as many
/// slots as waiters at once.
#[derive(Default)]
struct Waiters {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Waiters {
    /// Stores `waker` in `slot` (taking one if it has none); returns the
    /// waker it replaced, to be dropped once the lock is released.
    fn register(&mut self, slot: &mut u32, waker: &Waker) -> Option<Waker> {
        match *slot {
            NO_SLOT => {
                let i = match self.free.pop() {
                    Some(i) => i,
                    None => {
                        self.slots.push(None);
                        self.slots.len() - 1
                    }
                };
                self.slots[i] = Some(waker.clone());
                *slot = u32::try_from(i).expect("fewer than 2^32 - 1 waiters");
                None
            }
            i => match &mut self.slots[i as usize] {
                Some(w) if w.will_wake(waker) => None,
                w => w.replace(waker.clone()),
            },
        }
    }

    /// Frees `slot`; returns its waker, to be dropped outside the lock
    /// (dropping a task's last waker drops the task, whose own waiters
    /// take this lock).
    fn release(&mut self, slot: u32) -> Option<Waker> {
        let slot = slot as usize;
        self.free.push(slot);
        let w = self.slots[slot].take();
        if self.free.len() == self.slots.len() {
            // Nobody waits: the table goes back to nothing.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        w
    }

    /// Waiters registered now.
    fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
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
        // Waiters stay registered (one for a second request polls again);
        // they are woken outside the lock.
        let wakers: Vec<Waker> = {
            let w = self.waiters.lock().expect("shutdown lock");
            w.slots.iter().flatten().cloned().collect()
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Resolves once at least `n` requests arrived.
    pub fn wait(self: &Arc<Self>, n: u32) -> WaitShutdown {
        WaitShutdown {
            latch: self.clone(),
            n,
            slot: NO_SLOT,
        }
    }

    /// Blocks the calling thread (a control thread, never a worker) until
    /// at least `n` requests arrived.
    pub fn wait_blocking(self: &Arc<Self>, n: u32) {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut wait = self.wait(n);
        while Pin::new(&mut wait).poll(&mut cx).is_pending() {
            std::thread::park();
        }
    }

    /// Waiters registered now (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.waiters.lock().expect("shutdown lock").len()
    }
}

/// A waiter's slot before its first poll.
const NO_SLOT: u32 = u32::MAX;

/// Sixteen bytes: every connection's task waits on one.
pub struct WaitShutdown {
    latch: Arc<Shutdown>,
    n: u32,
    /// Its slot in the latch's [`Waiters`] once polled, else [`NO_SLOT`].
    slot: u32,
}

impl Future for WaitShutdown {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.latch.requested() >= this.n {
            return Poll::Ready(());
        }
        let replaced = this
            .latch
            .waiters
            .lock()
            .expect("shutdown lock")
            .register(&mut this.slot, cx.waker());
        drop(replaced);
        if this.latch.requested() >= this.n {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for WaitShutdown {
    fn drop(&mut self) {
        let slot = std::mem::replace(&mut self.slot, NO_SLOT);
        if slot != NO_SLOT {
            let waker = self
                .latch
                .waiters
                .lock()
                .expect("shutdown lock")
                .release(slot);
            drop(waker);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll(w: &mut WaitShutdown, waker: &Waker) -> Poll<()> {
        Pin::new(w).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_waiter_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<WaitShutdown>(), 16);
    }

    /// A waiter polled at every wake of a long-lived task (an agent link
    /// wakes for each packet) holds one slot, not one per poll, and none
    /// once dropped.
    #[test]
    fn a_waiter_polled_many_times_holds_one_slot_until_dropped() {
        let latch = Shutdown::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut waits: Vec<_> = (0..3).map(|_| latch.wait(1)).collect();
        for _ in 0..10_000 {
            for w in &mut waits {
                assert!(poll(w, &waker).is_pending());
            }
        }
        assert_eq!(latch.waiting(), 3);
        // Another task polls one of them: its waker replaces the first.
        let other = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        assert!(poll(&mut waits[0], &other).is_pending());
        assert_eq!(latch.waiting(), 3);
        waits.pop();
        assert_eq!(latch.waiting(), 2);
        drop(waits);
        assert_eq!(latch.waiting(), 0);
        assert_eq!(latch.waiters.lock().unwrap().slots.capacity(), 0);
    }

    /// The first request wakes every waiter; one that waits for the
    /// second stays registered and is woken again.
    #[test]
    fn requests_wake_waiters_and_a_second_request_wakes_the_patient_one() {
        let latch = Shutdown::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (mut first, mut second) = (latch.wait(1), latch.wait(2));
        assert!(poll(&mut first, &waker).is_pending());
        assert!(poll(&mut second, &waker).is_pending());
        latch.trigger();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(poll(&mut first, &waker).is_ready());
        assert!(poll(&mut second, &waker).is_pending());
        latch.trigger();
        assert_eq!(count.0.load(Ordering::SeqCst), 4);
        assert!(poll(&mut second, &waker).is_ready());
        // A waiter made after the request is ready at once.
        assert!(poll(&mut latch.wait(2), &waker).is_ready());
    }
}
