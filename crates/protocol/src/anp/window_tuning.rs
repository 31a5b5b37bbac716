//! Receive-window auto-tuning for one tunneled connection (the `window`
//! extension, grown under `window-growth`): the receiver doubles the window
//! it grants while a window's worth is consumed within a few round trips,
//! which means the sender is held by the window rather than by the path or
//! the local reader, up to a cap. A stalled reader consumes nothing, so its
//! window never grows.
//!
//! The rule is quic-go's (`internal/flowcontrol/base_flow_controller.go`,
//! `maybeAdjustWindowSize`, after Chromium's QUIC): an epoch starts at an
//! acknowledgement; once more than half the window has been consumed in
//! it, the window doubles if that took less than `4 x fraction x RTT`
//! (fraction: the part of the window consumed), and a new epoch starts.
//! Windows settle below four times the path's bandwidth-delay product.
//!
//! Pure: the time, the round trip and the room left come in as arguments.
//! The state is one word ([`Epoch`]: when the epoch started and the bytes
//! consumed in it), so the engine's `window` module keeps it in an atomic
//! beside each connection's window: an idle tunnel holds no more than it
//! did before windows grew.

use std::time::Duration;

/// The tuning epoch of one connection's receive window: when it started,
/// in microseconds of the caller's clock (a `u32`: it wraps every 71.6
/// minutes, and an epoch idle that long may look fast once, which grows
/// the window one step at most), and the bytes consumed in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Epoch {
    start_us: u32,
    bytes: u32,
}

impl Epoch {
    /// An epoch that starts at `now_us` (when the connection is
    /// established, and at each decision).
    pub fn starting(now_us: u32) -> Epoch {
        Epoch {
            start_us: now_us,
            bytes: 0,
        }
    }

    /// Bytes consumed in this epoch so far.
    pub fn bytes(self) -> u32 {
        self.bytes
    }

    /// The epoch as one word (for an atomic).
    pub fn to_bits(self) -> u64 {
        (u64::from(self.start_us) << 32) | u64::from(self.bytes)
    }

    /// The epoch [`Self::to_bits`] gave.
    pub fn from_bits(bits: u64) -> Epoch {
        Epoch {
            start_us: (bits >> 32) as u32,
            bytes: bits as u32,
        }
    }

    /// `taken` more bytes of a window of `window` were consumed and are
    /// acknowledged at `now_us`. Returns the epoch that follows and how
    /// many bytes the window should grow by (0: none), at most up to
    /// `cap`; the caller grants what it can. Without a round trip no
    /// growth is decided.
    pub fn on_ack(
        self,
        taken: u64,
        window: u64,
        now_us: u32,
        rtt: Option<Duration>,
        cap: u64,
    ) -> (Epoch, u64) {
        let bytes = u64::from(self.bytes).saturating_add(taken);
        if bytes <= window / 2 {
            let bytes = bytes.min(u64::from(u32::MAX)) as u32;
            return (Epoch { bytes, ..self }, 0);
        }
        let elapsed = Duration::from_micros(u64::from(now_us.wrapping_sub(self.start_us)));
        let fast = rtt.is_some_and(|rtt| {
            let fraction = bytes as f64 / window as f64;
            elapsed.as_secs_f64() < 4.0 * fraction * rtt.as_secs_f64()
        });
        let growth = if fast {
            window.min(cap.saturating_sub(window))
        } else {
            0
        };
        (Epoch::starting(now_us), growth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const RTT: Duration = Duration::from_millis(100);
    const RTT_US: u32 = 100_000;

    /// A receiver: the window it grants and its epoch.
    struct Rx {
        window: u64,
        epoch: Epoch,
        now_us: u32,
    }

    impl Rx {
        fn new(window: u64, now_us: u32) -> Rx {
            Rx {
                window,
                epoch: Epoch::starting(now_us),
                now_us,
            }
        }

        /// `taken` bytes acknowledged `every_us` after the last; the growth
        /// decided (the window grows by `share` of it).
        fn ack(&mut self, taken: u64, every_us: u32, share: u64) -> u64 {
            self.now_us = self.now_us.wrapping_add(every_us);
            let (next, g) = self
                .epoch
                .on_ack(taken, self.window, self.now_us, Some(RTT), 64 * MIB);
            self.epoch = next;
            self.window += g / share;
            g
        }

        /// Acknowledges the window in quarters, each `every_us` apart; the
        /// growth each time.
        fn quarters(&mut self, every_us: u32, n: usize) -> Vec<u64> {
            (0..n)
                .map(|_| self.ack(self.window / 4, every_us, 1))
                .collect()
        }
    }

    #[test]
    fn a_window_consumed_within_round_trips_doubles_up_to_the_cap() {
        let mut rx = Rx::new(2 * MIB, 1_000);
        // A window a round trip: the window holds the sender.
        let mut sizes = vec![rx.window];
        for _ in 0..12 {
            rx.quarters(RTT_US / 4, 3);
            sizes.push(rx.window);
        }
        assert_eq!(
            sizes[..6],
            [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB]
        );
        assert_eq!(rx.window, 64 * MIB, "the cap holds");
    }

    #[test]
    fn a_window_consumed_slowly_does_not_grow() {
        // The path (or the reader) holds the sender below a quarter window
        // a round trip (the window is over four times the path's
        // bandwidth-delay product).
        let mut rx = Rx::new(2 * MIB, 0);
        let grown = rx.quarters(RTT_US * 3 / 2, 40);
        assert!(grown.iter().all(|&g| g == 0), "{grown:?}");
        assert_eq!(rx.window, 2 * MIB);
    }

    #[test]
    fn no_round_trip_no_growth() {
        let mut epoch = Epoch::starting(0);
        for k in 1..10 {
            let (next, g) = epoch.on_ack(MIB, 2 * MIB, k * 1_000, None, 64 * MIB);
            assert_eq!(g, 0);
            epoch = next;
        }
    }

    #[test]
    fn growth_is_limited_to_what_the_caller_grants() {
        let mut rx = Rx::new(2 * MIB, 0);
        for _ in 0..3 {
            // The budget had room for a quarter of what was asked.
            rx.ack(MIB / 2, RTT_US / 8, 4);
        }
        assert_eq!(rx.window, 2 * MIB + MIB / 2);
    }

    /// The clock is a wrapping `u32` of microseconds: an epoch across the
    /// wrap is timed right.
    #[test]
    fn an_epoch_across_the_clocks_wrap() {
        let mut rx = Rx::new(2 * MIB, u32::MAX - 10_000);
        rx.quarters(RTT_US / 4, 3);
        assert_eq!(rx.window, 4 * MIB, "fast across the wrap");
        let mut rx = Rx::new(2 * MIB, u32::MAX - 10_000);
        rx.quarters(RTT_US * 2, 3);
        assert_eq!(rx.window, 2 * MIB, "slow across the wrap");
    }

    #[test]
    fn an_epoch_is_one_word() {
        let e = Epoch::starting(0xdead_beef)
            .on_ack(12_345, 2 * MIB, 0xdead_beef, None, 64 * MIB)
            .0;
        assert_eq!(e.bytes(), 12_345);
        assert_eq!(Epoch::from_bits(e.to_bits()), e);
        assert_eq!(std::mem::size_of::<Epoch>(), 8);
    }
}
