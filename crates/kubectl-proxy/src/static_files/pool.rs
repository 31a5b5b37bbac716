//! A small pool of blocking threads for `--www` file-system work (stat,
//! open, directory reads, file reads), so a data-plane core never waits on
//! the disk: a core hands a closure over and awaits its result.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// Worker threads: file work is rare next to proxying, two keep a slow
/// disk from serialising everything.
const WORKERS: usize = 2;

fn sender() -> &'static Mutex<Sender<Job>> {
    static TX: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx: Arc<Mutex<Receiver<Job>>> = Arc::new(Mutex::new(rx));
        for i in 0..WORKERS {
            let rx = Arc::clone(&rx);
            let spawned = std::thread::Builder::new()
                .name(format!("www-fs-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a --www file thread");
            }
        }
        Mutex::new(tx)
    })
}

/// Runs `f` on a pool thread; `None` if the pool is gone.
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = futures::channel::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    sender().lock().ok()?.send(job).ok()?;
    rx.await.ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_off_the_calling_thread() {
        let here = std::thread::current().id();
        let there = engine::runtime::block_on(
            engine::runtime::Driver::Legacy,
            super::run(|| std::thread::current().id()),
        )
        .unwrap();
        assert!(there.is_some_and(|t| t != here));
    }
}
