//! Deadlines for long-lived idle connections without a timer each.
//!
//! A monoio timer is 640 bytes and 128-byte aligned, and a connection that
//! waits for its idle limit or its next keepalive PING holds one for as long
//! as it waits: for an idle gRPC caller that was the largest allocation of
//! its connection after the tasks themselves. A [`Deadline`] is a slot in
//! this worker's table (about 64 bytes with its heap entry); one driver task
//! per worker holds the only timer, armed for the earliest deadline, and
//! wakes the connections whose deadlines passed.
//!
//! The table is thread-local: a deadline is polled only on the worker that
//! created it (a connection's whole path stays on one core). The driver
//! task is spawned on the first wait and ends with its runtime; a later
//! runtime on the same thread spawns its own.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::sharded_count::ShardedCount;

/// Slots held by a deadline, on every worker: `edgetunnel_deadlines`.
static HELD: ShardedCount = ShardedCount::new();

/// Deadlines held now, on every worker (a slot each).
pub fn held() -> usize {
    HELD.get()
}

/// A deadline a connection waits for, re-armed with [`Deadline::until`].
/// Dropping it frees its slot. Eight bytes: it sits in every idle
/// caller's task.
#[derive(Debug)]
pub struct Deadline {
    /// Its slot, or [`NO_SLOT`].
    idx: u32,
    gen: u32,
}

const NO_SLOT: u32 = u32::MAX;

impl Default for Deadline {
    fn default() -> Self {
        Deadline {
            idx: NO_SLOT,
            gen: 0,
        }
    }
}

impl Deadline {
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until `at`. The slot is kept between waits: re-arming moves
    /// it. The time is kept in the slot, so that the wait is a pointer.
    pub fn until(&mut self, at: Instant) -> Until<'_> {
        WHEEL.with(|w| w.borrow_mut().set(self, at));
        Until { deadline: self }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if self.idx != NO_SLOT {
            // `try_with`: the thread may be ending. The waker is dropped
            // outside the table's borrow.
            let waker = WHEEL.try_with(|w| w.borrow_mut().free(self.idx, self.gen));
            drop(waker);
        }
    }
}

/// The wait of [`Deadline::until`].
pub struct Until<'a> {
    deadline: &'a mut Deadline,
}

impl Future for Until<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let d = &*self.get_mut().deadline;
        WHEEL.with(|w| w.borrow_mut().poll(d, cx))
    }
}

/// Forgets every deadline of this thread and its driver: called when a
/// runtime starts on the thread ([`crate::runtime::block_on`]), since a
/// runtime that ended may not have dropped its tasks. A deadline left from
/// it completes at once when polled.
pub fn reset_thread() {
    // Wakers are dropped after the table's borrow ends: dropping the last
    // reference to a task drops the task, whose deadline frees its slot.
    let mut dropped: Vec<Waker> = Vec::new();
    WHEEL.with(|w| {
        let mut w = w.borrow_mut();
        HELD.add(-(w.live() as isize));
        for s in &mut w.slots {
            s.gen = s.gen.wrapping_add(1);
            dropped.extend(s.waker.take());
            s.queued = false;
        }
        w.free = (0..w.slots.len() as u32).collect();
        w.heap.clear();
        dropped.extend(w.driver.take());
        w.armed = None;
        w.running = false;
        w.epoch += 1;
    });
    drop(dropped);
}

thread_local! {
    static WHEEL: RefCell<Wheel> = RefCell::new(Wheel::default());
}

#[derive(Debug)]
struct Slot {
    gen: u32,
    at: Instant,
    waker: Option<Waker>,
    /// The heap holds an entry for `at`.
    queued: bool,
}

/// One worker's deadlines. Heap entries are not removed when a deadline
/// moves or is dropped; a stale one (its slot's generation or time
/// differs) is skipped when it comes up, and the heap is rebuilt once
/// stale entries outnumber live ones, so it stays within about twice the
/// live deadlines.
#[derive(Debug, Default)]
struct Wheel {
    slots: Vec<Slot>,
    free: Vec<u32>,
    heap: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// The driver task, while one runs on this thread's runtime.
    driver: Option<Waker>,
    /// When the driver's timer fires.
    armed: Option<Instant>,
    running: bool,
    /// Counts [`reset_thread`] calls: a driver of an earlier runtime
    /// dropped late leaves the current one's state alone.
    epoch: u64,
}

impl Wheel {
    /// Slots held by a deadline.
    fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Points `d` at `at` (taking a slot if it has none).
    fn set(&mut self, d: &mut Deadline, at: Instant) {
        let valid = self
            .slots
            .get(d.idx as usize)
            .is_some_and(|s| s.gen == d.gen);
        if !valid {
            let (idx, gen) = self.take_slot(at);
            d.idx = idx;
            d.gen = gen;
            return;
        }
        let s = &mut self.slots[d.idx as usize];
        if s.at != at {
            s.at = at;
            s.queued = false;
        }
    }

    fn poll(&mut self, d: &Deadline, cx: &mut Context<'_>) -> Poll<()> {
        let Some(s) = self
            .slots
            .get_mut(d.idx as usize)
            .filter(|s| s.gen == d.gen)
        else {
            // Its runtime ended ([`reset_thread`]): done.
            return Poll::Ready(());
        };
        let at = s.at;
        if Instant::now() >= at {
            return Poll::Ready(());
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        if !s.queued {
            s.queued = true;
            self.heap.push(Reverse((at, d.idx, d.gen)));
            self.compact();
        }
        if !self.running {
            self.running = true;
            monoio::spawn(Driver {
                timer: None,
                timer_at: None,
                _guard: DriverGuard { epoch: self.epoch },
            });
        } else if self.armed.is_none_or(|a| at < a) {
            if let Some(driver) = &self.driver {
                driver.wake_by_ref();
            }
        }
        Poll::Pending
    }

    fn take_slot(&mut self, at: Instant) -> (u32, u32) {
        HELD.add(1);
        if let Some(idx) = self.free.pop() {
            let s = &mut self.slots[idx as usize];
            s.at = at;
            s.queued = false;
            return (idx, s.gen);
        }
        let idx = u32::try_from(self.slots.len())
            .ok()
            .filter(|&i| i != NO_SLOT)
            .expect("fewer than 2^32 - 1 deadlines");
        self.slots.push(Slot {
            gen: 0,
            at,
            waker: None,
            queued: false,
        });
        (idx, 0)
    }

    /// Frees a slot; returns its waker, for the caller to drop once the
    /// table is no longer borrowed.
    fn free(&mut self, idx: u32, gen: u32) -> Option<Waker> {
        let s = self.slots.get_mut(idx as usize).filter(|s| s.gen == gen)?;
        s.gen = s.gen.wrapping_add(1);
        s.queued = false;
        HELD.add(-1);
        let waker = s.waker.take();
        self.free.push(idx);
        self.compact();
        waker
    }

    /// Rebuilds the heap from the queued slots once stale entries
    /// outnumber them.
    fn compact(&mut self) {
        if self.heap.len() <= 2 * self.live() + 64 {
            return;
        }
        self.heap = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.queued)
            .map(|(i, s)| Reverse((s.at, i as u32, s.gen)))
            .collect();
    }

    /// Takes the wakers of the deadlines that passed by `now`; returns the
    /// earliest one still ahead.
    fn due(&mut self, now: Instant, wake: &mut Vec<Waker>) -> Option<Instant> {
        while let Some(Reverse((at, idx, gen))) = self.heap.peek().copied() {
            let s = &mut self.slots[idx as usize];
            if s.gen != gen || s.at != at || !s.queued {
                self.heap.pop();
                continue;
            }
            if at > now {
                return Some(at);
            }
            self.heap.pop();
            s.queued = false;
            wake.extend(s.waker.take());
        }
        None
    }
}

/// Marks the thread's driver gone when its task is dropped (its runtime
/// ended), so that the next runtime on this thread spawns another.
struct DriverGuard {
    epoch: u64,
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        let _ = WHEEL.try_with(|w| {
            // Not while the table is borrowed (a reset drops old tasks
            // outside its borrow, so this is only a safeguard).
            let Ok(mut w) = w.try_borrow_mut() else {
                return;
            };
            if w.epoch != self.epoch {
                return;
            }
            w.running = false;
            w.armed = None;
            let driver = w.driver.take();
            drop(w);
            drop(driver);
        });
    }
}

/// The worker's one timer: armed for the earliest deadline.
struct Driver {
    timer: Option<Pin<Box<monoio::time::Sleep>>>,
    timer_at: Option<Instant>,
    _guard: DriverGuard,
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut wake = Vec::new();
        loop {
            let next = WHEEL.with(|w| {
                let mut w = w.borrow_mut();
                if !w.driver.as_ref().is_some_and(|d| d.will_wake(cx.waker())) {
                    w.driver = Some(cx.waker().clone());
                }
                let next = w.due(Instant::now(), &mut wake);
                w.armed = next;
                next
            });
            // Woken outside the table's borrow.
            wake.drain(..).for_each(Waker::wake);
            let Some(at) = next else {
                self.timer = None;
                self.timer_at = None;
                return Poll::Pending;
            };
            if self.timer_at != Some(at) {
                let wait = at.saturating_duration_since(Instant::now());
                self.timer = Some(Box::pin(monoio::time::sleep(wait)));
                self.timer_at = Some(at);
            }
            let timer = self.timer.as_mut().expect("armed above");
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.timer_at = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    fn run<F: Future<Output = ()>>(f: F) {
        reset_thread();
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime");
        rt.block_on(f);
    }

    fn live() -> (usize, usize) {
        WHEEL.with(|w| {
            let w = w.borrow();
            (w.live(), w.heap.len())
        })
    }

    #[test]
    fn deadlines_fire_in_order_and_not_early() {
        run(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let start = Instant::now();
            let mut tasks = Vec::new();
            for ms in [60u64, 20, 40] {
                let order = order.clone();
                tasks.push(monoio::spawn(async move {
                    let at = start + Duration::from_millis(ms);
                    Deadline::new().until(at).await;
                    assert!(Instant::now() >= at, "fired before its time");
                    order.borrow_mut().push(ms);
                }));
            }
            for t in tasks {
                t.await;
            }
            assert_eq!(*order.borrow(), vec![20, 40, 60]);
            assert_eq!(live().0, 0, "every slot freed");
        });
    }

    #[test]
    fn an_earlier_deadline_rearms_the_driver() {
        run(async {
            let start = Instant::now();
            let (done, finished) = futures::channel::oneshot::channel::<()>();
            // A far deadline (10 s) arms the driver first; its task ends
            // when the near deadline fired (or at 5 s, another wake-up).
            let far = monoio::spawn(async move {
                let mut d = Deadline::new();
                let _ = monoio::select! {
                    _ = d.until(start + Duration::from_secs(10)) => false,
                    _ = finished => true,
                    _ = monoio::time::sleep(Duration::from_secs(5)) => true,
                };
            });
            monoio::time::sleep(Duration::from_millis(5)).await;
            let mut near = Deadline::new();
            near.until(start + Duration::from_millis(30)).await;
            let took = start.elapsed();
            let _ = done.send(());
            // 30 ms when re-armed, seconds when not (the driver left armed
            // for the far deadline): 2 s tells them apart with margin for a
            // loaded machine.
            assert!(took < Duration::from_secs(2), "near deadline took {took:?}");
            far.await;
        });
    }

    #[test]
    fn moving_a_deadline_keeps_one_slot_and_the_heap_bounded() {
        run(async {
            let fired = Rc::new(Cell::new(false));
            let f = fired.clone();
            let mut d = Deadline::new();
            let far = Instant::now() + Duration::from_secs(3600);
            // Re-armed many times (a connection's loop does so per event):
            // the heap is compacted, the slot stays one.
            for i in 0..1000u64 {
                let at = far + Duration::from_millis(i);
                let mut w = std::pin::pin!(d.until(at));
                let waker = futures::task::noop_waker();
                assert!(w
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending());
            }
            let (slots, heap) = live();
            assert_eq!(slots, 1);
            assert!(heap <= 2 * slots + 65, "heap of {heap} entries");
            drop(d);
            assert_eq!(live().0, 0);
            let mut d = Deadline::new();
            d.until(Instant::now() + Duration::from_millis(10)).await;
            f.set(true);
            assert!(fired.get());
        });
    }

    #[test]
    fn a_second_runtime_on_the_thread_gets_its_own_driver() {
        for _ in 0..2 {
            run(async {
                let at = Instant::now() + Duration::from_millis(10);
                Deadline::new().until(at).await;
            });
        }
    }
}
