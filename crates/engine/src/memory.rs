//! How the process keeps its memory small with many idle tunnels.
//!
//! Measured with 8,000 idle CONNECT tunnels (server and agent RSS per
//! tunnel, issue 15): 5.0-5.8 KB as the allocator left it, about 3.2 KB
//! with the two policies below, close to the live heap (heaptrack: about
//! 1.5-1.8 KB on the server and 1.6 KB on the agent).
//!
//! - **No transparent huge pages** ([`at_start`]). mimalloc asks for huge
//!   pages on its arenas (`madvise(MADV_HUGEPAGE)`), so the kernel backs
//!   them 2 MiB at a time: idle tunnels' small allocations, spread over the
//!   arena, kept whole huge pages resident (24-28 MB of `AnonHugePages` at
//!   8,000 tunnels). The process opts out with `PR_SET_THP_DISABLE`,
//!   and from its very start: mimalloc is built to make that call itself
//!   when it starts, before the runtime's first allocation
//!   (`MI_DEFAULT_ALLOW_THP=0`, .cargo/config.toml), and never to ask for
//!   huge pages (its `no_thp` feature); [`at_start`] makes sure. Before
//!   that, the runtime's allocations before `main` had faulted 4 MiB of
//!   huge pages (an idle agent: 19.8 MB resident, 15.8 MB without).
//!   `EDGETUNNEL_THP=on` lets the kernel use them again, for comparisons.
//! - **Trimming when quiet** ([`trim_when_quiet`]). Setting up a tunnel
//!   allocates more than the tunnel keeps (the head read, the dial, the
//!   routing, the first packets), and closing many tunnels frees a lot at
//!   once. mimalloc returns freed pages only on later allocator calls, so a
//!   worker that goes idle after a burst keeps them. Each data-plane
//!   thread samples its CPU time every [`TICK`]; once a busy interval is
//!   followed by a quiet one it asks the allocator, once, to return what
//!   it holds free ([`QuietDetector`] decides; pure, so it is tested
//!   without a clock). A steadily busy thread is not trimmed (its freed
//!   pages are about to be reused), an idle one only once. The thread's
//!   lent buffers go first ([`super::thread_buf::release_all`]): a busy
//!   spell wrote all their pages.
//!   `EDGETUNNEL_TRIM=off` turns it off, for comparisons.

use std::time::Duration;

/// How often a thread's CPU time is sampled.
pub const TICK: Duration = Duration::from_millis(100);

/// CPU time within one [`TICK`] from which a thread counts as busy (2%).
pub const BUSY: Duration = Duration::from_millis(2);

/// Decides when a thread has gone quiet after work: feed it the thread's
/// CPU time once per tick.
#[derive(Debug, Default)]
pub struct QuietDetector {
    last: Option<Duration>,
    /// Work was done since the last trim.
    worked: bool,
}

impl QuietDetector {
    /// The thread's CPU time at this tick; `true`: trim now.
    pub fn tick(&mut self, cpu: Duration) -> bool {
        let Some(last) = self.last.replace(cpu) else {
            // The first sample only sets the baseline; a thread's start-up
            // counts as work.
            self.worked = true;
            return false;
        };
        if cpu.saturating_sub(last) >= BUSY {
            self.worked = true;
            false
        } else {
            std::mem::take(&mut self.worked)
        }
    }

    /// The trim itself took CPU time: it is not work to trim for again.
    pub fn trimmed(&mut self, cpu: Duration) {
        self.last = Some(cpu);
    }
}

/// Applies the process-wide policy; call it first thing in `main`, before
/// the runtimes allocate. An error (a kernel without the `prctl`) costs
/// memory, nothing else: the caller logs it once logging is set up.
pub fn at_start() -> std::io::Result<()> {
    let on = std::env::var("EDGETUNNEL_THP").as_deref() == Ok("on");
    super::sys::set_transparent_huge_pages(on)
}

/// Runs the trimmer of the current thread until the runtime ends; spawn it
/// once per data-plane thread.
pub async fn trim_when_quiet() {
    if std::env::var("EDGETUNNEL_TRIM").as_deref() == Ok("off") {
        return;
    }
    let mut quiet = QuietDetector::default();
    loop {
        monoio::time::sleep(TICK).await;
        if quiet.tick(super::sys::thread_cpu_time()) {
            super::thread_buf::release_all();
            super::sys::release_free_memory();
            quiet.trimmed(super::sys::thread_cpu_time());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn trims_once_when_work_is_followed_by_quiet() {
        let mut q = QuietDetector::default();
        assert!(!q.tick(10 * MS), "the first sample is the baseline");
        // Start-up was work: the first quiet tick trims.
        assert!(q.tick(10 * MS));
        // Quiet stays quiet: no second trim.
        assert!(!q.tick(10 * MS));
        assert!(!q.tick(11 * MS));
        // A burst, still going on: no trim while busy.
        assert!(!q.tick(40 * MS));
        assert!(!q.tick(90 * MS));
        // It ends: one trim.
        assert!(q.tick(90 * MS));
        assert!(!q.tick(90 * MS));
    }

    #[test]
    fn the_trims_own_cost_is_not_work() {
        let mut q = QuietDetector::default();
        q.tick(Duration::ZERO);
        assert!(!q.tick(50 * MS));
        assert!(q.tick(50 * MS));
        // The trim took 5 ms of CPU time.
        q.trimmed(55 * MS);
        assert!(!q.tick(55 * MS), "no trim again for the trim's own cost");
        assert!(!q.tick(55 * MS));
    }

    #[test]
    fn light_activity_below_the_threshold_is_quiet() {
        let mut q = QuietDetector::default();
        q.tick(Duration::ZERO);
        assert!(q.tick(Duration::ZERO));
        // Timers and keepalives: 1 ms per tick is not a burst.
        for t in 1..20u32 {
            assert!(!q.tick(t * MS));
        }
    }

    /// A real thread: its CPU time stays put in a sleep and grows with
    /// work, and releasing free memory after freeing a burst succeeds.
    /// (The work runs until the thread has used 10 ms of CPU, so a loaded
    /// machine only makes it take longer.)
    #[test]
    fn thread_cpu_time_counts_this_threads_work() {
        let before = crate::sys::thread_cpu_time();
        std::thread::sleep(Duration::from_millis(20));
        let slept = crate::sys::thread_cpu_time();
        assert!(
            slept - before < Duration::from_millis(10),
            "{before:?} {slept:?}"
        );
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while crate::sys::thread_cpu_time() - slept < Duration::from_millis(10) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "20 s of busy work and the thread's CPU time did not grow by 10 ms"
            );
        }
        let burst: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 4096]).collect();
        drop(std::hint::black_box(burst));
        crate::sys::release_free_memory();
    }
}
