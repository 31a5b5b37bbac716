//! One direction of the emulated link, without I/O: what happens to a
//! packet that arrives at a given instant.
//!
//! The model is a FIFO bottleneck followed by a delay line:
//!
//! - **Queue.** A packet starts to serialize at `max(arrival, previous
//!   departure)` and departs `len * 8 / rate` later. The queue is the
//!   backlog in bytes still to be serialized when the packet arrives
//!   (`(previous departure - arrival) * rate / 8`, the packet being sent
//!   included). A packet that would take the backlog above the byte bound
//!   is dropped at the tail. With a fixed rate a byte bound is a time
//!   bound too: `queue_bytes * 8 / rate` seconds of queueing delay at most.
//! - **Loss.** A packet admitted to the queue is lost with probability
//!   `loss` (seeded RNG): it still takes its slot on the wire, as a
//!   corrupted frame on a real link does.
//! - **Delay.** A packet is delivered at its departure plus the one-way
//!   delay plus a uniform random jitter in `[0, jitter]`; without
//!   `reorder`, never before the packet delivered ahead of it.
//!
//! A rate of 0 is no bottleneck (no serialization, no queue).

use std::time::{Duration, Instant};

/// The shape of one direction.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shape {
    /// One-way delay.
    pub delay: Duration,
    /// Uniform extra delay in `[0, jitter]` per packet.
    pub jitter: Duration,
    /// Whether jittered packets may overtake each other.
    pub reorder: bool,
    /// Bottleneck rate in bits per second (IP packets, headers counted);
    /// 0: unlimited.
    pub rate_bps: u64,
    /// Most bytes waiting for the bottleneck (tail drop above).
    pub queue_bytes: u64,
    /// Probability that a packet is lost, in `[0, 1]`.
    pub loss: f64,
}

/// What becomes of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Delivered at this instant.
    Deliver(Instant),
    /// Dropped at the tail of a full queue.
    QueueFull,
    /// Lost on the wire.
    Lost,
}

/// One direction's state: the last departure and delivery.
pub(crate) struct Direction {
    shape: Shape,
    rng: fastrand::Rng,
    last_departure: Option<Instant>,
    last_delivery: Option<Instant>,
}

impl Direction {
    pub(crate) fn new(shape: Shape, seed: u64) -> Direction {
        Direction {
            shape,
            rng: fastrand::Rng::with_seed(seed),
            last_departure: None,
            last_delivery: None,
        }
    }

    /// Bytes waiting for the bottleneck at `now`.
    pub(crate) fn backlog(&self, now: Instant) -> u64 {
        match self.last_departure {
            Some(d) if d > now && self.shape.rate_bps > 0 => {
                let ns = (d - now).as_nanos();
                (ns * self.shape.rate_bps as u128 / 8_000_000_000) as u64
            }
            _ => 0,
        }
    }

    /// Time to serialize `len` bytes.
    fn serialization(&self, len: usize) -> Duration {
        if self.shape.rate_bps == 0 {
            return Duration::ZERO;
        }
        let ns = len as u128 * 8_000_000_000 / self.shape.rate_bps as u128;
        Duration::from_nanos(ns as u64)
    }

    /// The fate of a packet of `len` bytes arriving at `now`.
    pub(crate) fn admit(&mut self, now: Instant, len: usize) -> Verdict {
        let departure = if self.shape.rate_bps == 0 {
            now
        } else {
            if self.backlog(now) + len as u64 > self.shape.queue_bytes {
                return Verdict::QueueFull;
            }
            let start = self.last_departure.map_or(now, |d| d.max(now));
            let d = start + self.serialization(len);
            self.last_departure = Some(d);
            d
        };
        if self.shape.loss > 0.0 && self.rng.f64() < self.shape.loss {
            return Verdict::Lost;
        }
        let mut at = departure + self.shape.delay;
        if !self.shape.jitter.is_zero() {
            let j = self.rng.u64(0..=self.shape.jitter.as_nanos() as u64);
            at += Duration::from_nanos(j);
        }
        if !self.shape.reorder {
            if let Some(prev) = self.last_delivery {
                at = at.max(prev);
            }
            self.last_delivery = Some(at);
        }
        Verdict::Deliver(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            delay: Duration::from_millis(10),
            jitter: Duration::ZERO,
            reorder: false,
            rate_bps: 8_000_000, // 1 byte a microsecond
            queue_bytes: 3000,
            loss: 0.0,
        }
    }

    fn at(v: Verdict) -> Instant {
        match v {
            Verdict::Deliver(t) => t,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fifo_serializes_then_delays() {
        let t0 = Instant::now();
        let mut d = Direction::new(shape(), 1);
        let us = Duration::from_micros;
        // 1000 bytes take 1 ms on the wire, then 10 ms of delay.
        assert_eq!(at(d.admit(t0, 1000)), t0 + us(11_000));
        // Arrives while the first is on the wire: waits for it.
        assert_eq!(d.backlog(t0 + us(500)), 500);
        assert_eq!(at(d.admit(t0 + us(500), 1000)), t0 + us(12_000));
        // 500 + 1000 bytes wait; 1500 more would make 3000: still fits.
        assert_eq!(at(d.admit(t0 + us(500), 1500)), t0 + us(13_500));
        // The queue holds 3000 bytes now: one more byte is dropped.
        assert_eq!(d.admit(t0 + us(500), 1), Verdict::QueueFull);
        // An idle link again: no wait.
        assert_eq!(
            at(d.admit(t0 + us(20_000), 1000)),
            t0 + us(20_000 + 1000 + 10_000)
        );
    }

    #[test]
    fn unlimited_rate_only_delays() {
        let t0 = Instant::now();
        let mut d = Direction::new(
            Shape {
                rate_bps: 0,
                ..shape()
            },
            1,
        );
        for _ in 0..100 {
            assert_eq!(at(d.admit(t0, 65_000)), t0 + Duration::from_millis(10));
        }
    }

    #[test]
    fn loss_rate_and_seed() {
        let t0 = Instant::now();
        let s = Shape {
            rate_bps: 0,
            loss: 0.01,
            ..shape()
        };
        let count = |seed| {
            let mut d = Direction::new(s.clone(), seed);
            (0..100_000)
                .filter(|_| d.admit(t0, 100) == Verdict::Lost)
                .count()
        };
        let n = count(7);
        assert!((800..1200).contains(&n), "{n} lost of 100,000 at 1 %");
        assert_eq!(count(7), n, "same seed, same losses");
    }

    #[test]
    fn jitter_never_reorders_unless_asked() {
        let t0 = Instant::now();
        let s = Shape {
            rate_bps: 0,
            jitter: Duration::from_millis(5),
            ..shape()
        };
        let mut d = Direction::new(s.clone(), 3);
        let mut prev = t0;
        for i in 0..1000 {
            let t = at(d.admit(t0 + Duration::from_micros(i * 10), 100));
            assert!(t >= prev);
            assert!(t >= t0 + Duration::from_millis(10));
            prev = t;
        }
        let mut d = Direction::new(Shape { reorder: true, ..s }, 3);
        let times: Vec<Instant> = (0..1000)
            .map(|i| at(d.admit(t0 + Duration::from_micros(i * 10), 100)))
            .collect();
        assert!(times.windows(2).any(|w| w[1] < w[0]), "some overtake");
    }
}
