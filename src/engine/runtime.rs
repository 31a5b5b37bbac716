//! Worker threads: one monoio runtime per core, io_uring by default with a
//! fallback to epoll where io_uring is unavailable (e.g. container seccomp).

use std::future::Future;
use std::io;
use std::str::FromStr;

use monoio::{FusionDriver, IoUringDriver, LegacyDriver, RuntimeBuilder};

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

/// Runs `fut` to completion on a new runtime of the chosen driver, on the
/// calling thread.
pub fn block_on<F: Future>(driver: Driver, fut: F) -> io::Result<F::Output> {
    Ok(match driver {
        Driver::Auto => RuntimeBuilder::<FusionDriver>::new()
            .with_entries(RING_ENTRIES)
            .enable_timer()
            .build()?
            .block_on(fut),
        Driver::Uring => RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(RING_ENTRIES)
            .enable_timer()
            .build()?
            .block_on(fut),
        Driver::Legacy => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()?
            .block_on(fut),
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
            .spawn(move || block_on(driver, make(idx)).and_then(|r| r))?;
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
