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
//! Pure: the time, the round trip and the room left come in as arguments
//! (the engine's `window` module keeps one per connection).

use std::time::{Duration, Instant};

/// One connection's receive window and its tuning epoch.
#[derive(Debug, Clone)]
pub struct Tuner {
    window: u64,
    epoch_start: Option<Instant>,
    epoch_bytes: u64,
}

impl Tuner {
    /// A window of `window` bytes, its first epoch not started.
    pub fn new(window: u64) -> Tuner {
        Tuner {
            window,
            epoch_start: None,
            epoch_bytes: 0,
        }
    }

    /// The window granted now.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Starts the first epoch (when the connection is established), unless
    /// one runs.
    pub fn start(&mut self, now: Instant) {
        self.epoch_start.get_or_insert(now);
    }

    /// `taken` more bytes were consumed and are acknowledged now. Returns
    /// how many bytes the window should grow by (0: none), at most up to
    /// `cap`; the caller grants what it can and reports it to
    /// [`Self::grew`]. Without a round trip no growth is decided.
    pub fn on_ack(&mut self, taken: u64, now: Instant, rtt: Option<Duration>, cap: u64) -> u64 {
        let Some(start) = self.epoch_start else {
            self.epoch_start = Some(now);
            return 0;
        };
        self.epoch_bytes += taken;
        if self.epoch_bytes <= self.window / 2 {
            return 0;
        }
        let fast = rtt.is_some_and(|rtt| {
            let fraction = self.epoch_bytes as f64 / self.window as f64;
            now.duration_since(start).as_secs_f64() < 4.0 * fraction * rtt.as_secs_f64()
        });
        self.epoch_start = Some(now);
        self.epoch_bytes = 0;
        if fast {
            self.window.min(cap.saturating_sub(self.window))
        } else {
            0
        }
    }

    /// The window grew by `by` bytes (granted to the peer).
    pub fn grew(&mut self, by: u64) {
        self.window += by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const RTT: Duration = Duration::from_millis(100);

    /// Acknowledges the window in quarters, each `every` apart; the growth
    /// each time.
    fn run(t: &mut Tuner, at: &mut Instant, every: Duration, quarters: usize) -> Vec<u64> {
        let mut grown = Vec::new();
        for _ in 0..quarters {
            *at += every;
            let g = t.on_ack(t.window() / 4, *at, Some(RTT), 64 * MIB);
            t.grew(g);
            grown.push(g);
        }
        grown
    }

    #[test]
    fn a_window_consumed_within_round_trips_doubles_up_to_the_cap() {
        let mut t = Tuner::new(2 * MIB);
        let mut at = Instant::now();
        t.start(at);
        // A window a round trip: the window holds the sender.
        let mut sizes = vec![t.window()];
        for _ in 0..12 {
            run(&mut t, &mut at, RTT / 4, 3);
            sizes.push(t.window());
        }
        assert_eq!(
            sizes[..6],
            [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB]
        );
        assert_eq!(t.window(), 64 * MIB, "the cap holds");
    }

    #[test]
    fn a_window_consumed_slowly_does_not_grow() {
        // The path (or the reader) holds the sender below a quarter window
        // a round trip (the window is over four times the path's
        // bandwidth-delay product).
        let mut t = Tuner::new(2 * MIB);
        let mut at = Instant::now();
        t.start(at);
        let grown = run(&mut t, &mut at, RTT * 3 / 2, 40);
        assert!(grown.iter().all(|&g| g == 0), "{grown:?}");
        assert_eq!(t.window(), 2 * MIB);
    }

    #[test]
    fn no_round_trip_no_growth_and_a_stalled_reader_never_grows() {
        let mut t = Tuner::new(2 * MIB);
        let at = Instant::now();
        t.start(at);
        for k in 1..10 {
            assert_eq!(t.on_ack(MIB, at + RTT * k / 100, None, 64 * MIB), 0);
        }
        // Nothing consumed: nothing acknowledged, nothing decided.
        let mut t = Tuner::new(2 * MIB);
        t.start(at);
        assert_eq!(t.window(), 2 * MIB);
    }

    #[test]
    fn growth_is_limited_to_what_the_caller_grants() {
        let mut t = Tuner::new(2 * MIB);
        let mut at = Instant::now();
        t.start(at);
        for _ in 0..3 {
            at += RTT / 8;
            let g = t.on_ack(MIB / 2, at, Some(RTT), 64 * MIB);
            // The budget had room for a quarter of what was asked.
            t.grew(g / 4);
        }
        assert_eq!(t.window(), 2 * MIB + MIB / 2);
    }
}
