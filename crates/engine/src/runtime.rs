//! Worker threads: one monoio runtime per core, io_uring by default with a
//! fallback to epoll where io_uring is unavailable (e.g. container seccomp).

use std::future::Future;
use std::io;
use std::str::FromStr;

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

/// Which I/O driver the data-plane runtimes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Driver {
    /// io_uring when the kernel allows it, else epoll.
    #[default]
    Auto,
    /// io_uring only (fails where unavailable).
    Uring,
    /// epoll only.
    Legacy,
}

impl FromStr for Driver {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Driver::Auto),
            "uring" | "io_uring" | "iouring" => Ok(Driver::Uring),
            "legacy" | "epoll" => Ok(Driver::Legacy),
            other => Err(format!("unknown driver {other:?} (auto, uring, legacy)")),
        }
    }
}

impl Driver {
    /// The driver `Auto` resolves to on this machine.
    pub fn resolve(self) -> Driver {
        match self {
            Driver::Auto if monoio::utils::detect_uring() => Driver::Uring,
            Driver::Auto => Driver::Legacy,
            d => d,
        }
    }

    pub fn name(self) -> &'static str {
        match self.resolve() {
            Driver::Uring => "io_uring",
            _ => "epoll",
        }
    }
}

const RING_ENTRIES: u32 = 4096;

/// io_uring setup flags a ring asks for, strongest first: each worker owns
/// its ring (one thread submits, so `SINGLE_ISSUER`), completions are
/// posted when the worker asks for them instead of interrupting it with
/// task work (`DEFER_TASKRUN` from Linux 6.1, `COOP_TASKRUN` from 5.19).
/// A kernel that refuses a set gets the next, down to no flags.
/// `EDGETUNNEL_URING_SETUP` (`defer`, `coop` or `plain`) caps the strongest
/// set tried, for comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum UringSetup {
    Plain,
    Coop,
    Defer,
}

impl UringSetup {
    /// The strongest set allowed by the environment.
    pub fn wanted() -> UringSetup {
        match std::env::var("EDGETUNNEL_URING_SETUP").as_deref() {
            Ok("plain") => UringSetup::Plain,
            Ok("coop") => UringSetup::Coop,
            _ => UringSetup::Defer,
        }
    }

    /// The next weaker set to try when the kernel refuses this one.
    pub fn weaker(self) -> Option<UringSetup> {
        match self {
            UringSetup::Defer => Some(UringSetup::Coop),
            UringSetup::Coop => Some(UringSetup::Plain),
            UringSetup::Plain => None,
        }
    }

    fn builder(self) -> io_uring::Builder {
        let mut b = io_uring::IoUring::builder();
        match self {
            UringSetup::Plain => {}
            UringSetup::Coop => {
                b.setup_coop_taskrun();
            }
            UringSetup::Defer => {
                b.setup_single_issuer().setup_defer_taskrun();
            }
        }
        b
    }
}

/// An io_uring runtime with the strongest setup flags the kernel accepts.
fn uring_runtime() -> io::Result<monoio::Runtime<monoio::time::TimeDriver<IoUringDriver>>> {
    let mut setup = UringSetup::wanted();
    loop {
        let built = RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(RING_ENTRIES)
            .uring_builder(setup.builder())
            .enable_timer()
            .build();
        match (built, setup.weaker()) {
            (Ok(rt), _) => {
                tracing::debug!(?setup, "io_uring runtime");
                return Ok(rt);
            }
            (Err(e), Some(next)) => {
                tracing::debug!(?setup, error = %e, "io_uring setup refused; trying fewer flags");
                setup = next;
            }
            (Err(e), None) => return Err(e),
        }
    }
}

/// Runs `fut` to completion on a new runtime of the chosen driver, on the
/// calling thread.
pub fn block_on<F: Future>(driver: Driver, fut: F) -> io::Result<F::Output> {
    // Deadlines of a runtime that ran on this thread before are void.
    super::deadline::reset_thread();
    let _on = OnEngineRuntime::enter();
    Ok(match driver.resolve() {
        Driver::Uring => uring_runtime()?.block_on(fut),
        _ => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()?
            .block_on(fut),
    })
}

/// [`block_on`] for a data-plane thread: the thread also hands freed
/// memory back to the system whenever it goes quiet after work (see
/// [`super::memory`]).
pub fn block_on_worker<F: Future>(driver: Driver, fut: F) -> io::Result<F::Output> {
    block_on(driver, async move {
        monoio::spawn(super::memory::trim_when_quiet());
        fut.await
    })
}

/// Starts `workers` threads, each running `make(index)` on its own runtime,
/// and waits for all of them. Returns the first error.
pub fn run_workers<M, F>(workers: usize, driver: Driver, make: M) -> io::Result<()>
where
    M: Fn(usize) -> F + Send + Sync + 'static,
    F: Future<Output = io::Result<()>>,
{
    let make = std::sync::Arc::new(make);
    let mut handles = Vec::with_capacity(workers);
    for idx in 0..workers {
        let make = make.clone();
        let h = std::thread::Builder::new()
            .name(format!("edgetunnel-w{idx}"))
            .spawn(move || block_on_worker(driver, make(idx)).and_then(|r| r))?;
        handles.push(h);
    }
    let mut result = Ok(());
    for h in handles {
        let r = h
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("worker thread panicked")));
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// Number of cores available to this process.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Wakes the task of `waker` behind the tasks already ready on this core,
/// not in front of them: a task that wakes itself while polled goes to the
/// front of monoio's run queue and would run again at once, holding the
/// core (monoio has no cooperative budget). A small task spawned behind
/// the others makes the wake. For loops that stop on a budget (accepts,
/// reads) so that the rest of the core runs before they go on.
///
/// Off an engine runtime (the record layer under tokio in tests), a plain
/// wake: tokio's own budget keeps that fair.
///
/// The wake waits for the driver (a timer due at once, which fires when the
/// core parks): monoio's io_uring
/// driver takes the readiness of poll-io sockets (every TLS handshake, every
/// HTTP/2 connection waiting for input) only when its run queue empties and
/// it parks, so a task that always yields behind the others kept that queue
/// full and starved them all: a handshake waited 48 ms for its first byte at
/// the median, 374 ms at p90, behind one connection of tiny HTTP/2 frames
/// (1.4 ms with the epoll driver; `benches/flood_latency.rs`).
pub fn wake_behind_others(waker: &std::task::Waker) {
    if ON_ENGINE_RUNTIME.get() {
        let waker = waker.clone();
        monoio::spawn(async move {
            monoio::time::sleep(std::time::Duration::ZERO).await;
            waker.wake()
        });
    } else {
        waker.wake_by_ref();
    }
}

/// A task's yields behind the core's others ([`wake_behind_others`]) that
/// the task can ask about: until the yield's own wake comes, the task was
/// woken early by someone else (a stream of an HTTP/2 connection releasing
/// its handles) and its next turn must not start yet. Without it, a
/// connection whose streams each woke it ran turn after turn without the
/// core parking: 240 parks a second, and a handshake on its worker waited
/// 4.4x its quiet median behind a client opening streams it made us reset.
///
/// Holds nothing until the first yield.
#[derive(Default)]
pub struct YieldGate(Option<std::rc::Rc<std::cell::Cell<bool>>>);

impl YieldGate {
    /// [`wake_behind_others`], remembered until its wake.
    pub fn yield_now(&mut self, waker: &std::task::Waker) {
        if !ON_ENGINE_RUNTIME.get() {
            waker.wake_by_ref();
            return;
        }
        let flag = self.0.get_or_insert_with(Default::default);
        flag.set(true);
        let flag = flag.clone();
        let waker = waker.clone();
        monoio::spawn(async move {
            monoio::time::sleep(std::time::Duration::ZERO).await;
            flag.set(false);
            waker.wake()
        });
    }

    /// Whether the last yield's wake is still to come.
    pub fn waiting(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.get())
    }
}

thread_local! {
    /// This thread is inside [`block_on`] (a monoio runtime of ours).
    static ON_ENGINE_RUNTIME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the thread as running an engine runtime while it lives.
struct OnEngineRuntime(bool);

impl OnEngineRuntime {
    fn enter() -> Self {
        OnEngineRuntime(ON_ENGINE_RUNTIME.replace(true))
    }
}

impl Drop for OnEngineRuntime {
    fn drop(&mut self) {
        ON_ENGINE_RUNTIME.set(self.0);
    }
}
