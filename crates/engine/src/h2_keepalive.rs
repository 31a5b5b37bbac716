//! HTTP/2 keepalive for long-lived connections whose peer may vanish
//! without a FIN (agent links on both ends, gRPC frontend callers): a PING
//! every interval, and the connection given up when one stays unanswered.
//! The callers count [`KeepaliveError::Timeout`] in their /metrics
//! (`edgetunnel_keepalive_timeouts_total{peer}`).

use std::time::{Duration, Instant};

/// Why a connection's keepalive gave up.
#[derive(Debug, thiserror::Error)]
pub enum KeepaliveError {
    /// The connection failed under the PING.
    #[error("keepalive ping failed: {0}")]
    Ping(#[from] h2::Error),
    /// The peer did not answer in time: it is silent (frozen, or its path
    /// is gone).
    #[error("keepalive ping timed out (not answered within {0:?})")]
    Timeout(Duration),
}

/// When PINGs go out and when their answers are due, without the
/// connection: a PING `every` after the connection starts or the last PONG
/// came, and the connection lost when a PING is not answered within twice
/// that. A caller that already runs a timer (the gRPC frontend's idle
/// timer) drives it with that one timer instead of a second.
#[derive(Debug, Clone)]
pub struct PingSchedule {
    every: Duration,
    next_ping: Instant,
    /// A PING is out and its PONG is due by then.
    pong_due: Option<Instant>,
}

/// What [`PingSchedule::on_tick`] asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum PingStep {
    /// Nothing yet: look again at [`PingSchedule::deadline`].
    Wait,
    /// Send a PING now (its PONG is then awaited).
    Ping,
    /// The PING went unanswered: the peer is gone.
    Lost,
}

impl PingSchedule {
    pub fn new(every: Duration, now: Instant) -> Self {
        PingSchedule {
            every,
            next_ping: now + every,
            pong_due: None,
        }
    }

    /// When the caller must call [`Self::on_tick`] again.
    pub fn deadline(&self) -> Instant {
        self.pong_due.unwrap_or(self.next_ping)
    }

    /// Whether a PING is out (the caller then listens for its PONG).
    pub fn awaiting_pong(&self) -> bool {
        self.pong_due.is_some()
    }

    pub fn on_tick(&mut self, now: Instant) -> PingStep {
        match self.pong_due {
            Some(due) if now >= due => PingStep::Lost,
            Some(_) => PingStep::Wait,
            None if now >= self.next_ping => {
                self.pong_due = Some(now + self.unanswered_limit());
                PingStep::Ping
            }
            None => PingStep::Wait,
        }
    }

    /// The PONG came.
    pub fn on_pong(&mut self, now: Instant) {
        self.pong_due = None;
        self.next_ping = now + self.every;
    }

    /// [`Self::on_tick`] carried out with the connection's `send_ping`:
    /// sends the PING that is due; `Err` when the peer is lost (its PING went
    /// unanswered, or the connection failed under a new one).
    pub fn drive(
        &mut self,
        send_ping: impl FnOnce() -> Result<(), KeepaliveError>,
        now: Instant,
    ) -> Result<(), KeepaliveError> {
        match self.on_tick(now) {
            PingStep::Wait => Ok(()),
            PingStep::Ping => send_ping(),
            PingStep::Lost => Err(KeepaliveError::Timeout(self.unanswered_limit())),
        }
    }

    /// How long a PING may go unanswered.
    pub fn unanswered_limit(&self) -> Duration {
        self.every * 2
    }
}

/// Sends an HTTP/2 PING every `every` and fails when one is not answered
/// within twice that ([`PingSchedule`]). Never returns otherwise; without a
/// `PingPong` (already taken) it waits forever.
pub async fn keep_alive(ping: Option<h2::PingPong>, every: Duration) -> KeepaliveError {
    let Some(mut p) = ping else {
        return futures::future::pending().await;
    };
    let mut schedule = PingSchedule::new(every, Instant::now());
    loop {
        let wait = schedule
            .deadline()
            .saturating_duration_since(Instant::now());
        if schedule.awaiting_pong() {
            let pong = futures::future::poll_fn(|cx| p.poll_pong(cx));
            match monoio::time::timeout(wait, pong).await {
                Ok(Ok(_)) => schedule.on_pong(Instant::now()),
                Ok(Err(e)) => return e.into(),
                Err(_) => {}
            }
        } else {
            monoio::time::sleep(wait).await;
        }
        let send_ping = || p.send_ping(h2::Ping::opaque()).map_err(Into::into);
        if let Err(e) = schedule.drive(send_ping, Instant::now()) {
            return e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn pings_every_interval_after_the_last_pong() {
        let t0 = Instant::now();
        let mut s = PingSchedule::new(10 * S, t0);
        assert_eq!(s.deadline(), t0 + 10 * S);
        assert_eq!(s.on_tick(t0 + 9 * S), PingStep::Wait);
        assert_eq!(s.on_tick(t0 + 10 * S), PingStep::Ping);
        assert!(s.awaiting_pong());
        // The PONG is due within twice the interval.
        assert_eq!(s.deadline(), t0 + 30 * S);
        assert_eq!(s.on_tick(t0 + 12 * S), PingStep::Wait, "one PING at a time");
        s.on_pong(t0 + 12 * S);
        assert!(!s.awaiting_pong());
        assert_eq!(s.deadline(), t0 + 22 * S);
        assert_eq!(s.on_tick(t0 + 22 * S), PingStep::Ping);
    }

    #[test]
    fn an_unanswered_ping_loses_the_peer_after_twice_the_interval() {
        let t0 = Instant::now();
        let mut s = PingSchedule::new(S, t0);
        assert_eq!(s.on_tick(t0 + S), PingStep::Ping);
        assert_eq!(s.on_tick(t0 + 2 * S), PingStep::Wait);
        assert_eq!(s.on_tick(t0 + 3 * S), PingStep::Lost);
        assert_eq!(s.unanswered_limit(), 2 * S);
    }

    #[test]
    fn a_late_tick_pings_at_once() {
        let t0 = Instant::now();
        let mut s = PingSchedule::new(S, t0);
        assert_eq!(s.on_tick(t0 + 5 * S), PingStep::Ping);
        assert_eq!(s.deadline(), t0 + 7 * S);
    }
}
