//! Frames out: keepalive PINGs, GOAWAY, and the output queue the caller
//! writes from ([`ServerConn::take_output`], [`ServerConn::wrote`]).

use super::*;

/// The output queue and connection-level frames.
impl<U: Default> ServerConn<U> {
    /// Sends a PING for the keepalive; [`Event::Pong`] when it is answered.
    pub fn ping(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
        put_frame_header(&mut f, 8, PING, 0, 0);
        f.extend_from_slice(&PING_PAYLOAD);
        self.push_out(f);
        self.ping_out = true;
    }

    /// Graceful GOAWAY: streams open now finish, no new one is taken.
    pub fn go_away(&mut self) {
        if self.closed.is_some() || self.goaway_sent.is_some() {
            return;
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
        put_goaway(&mut f, self.last_stream, reason::NO_ERROR);
        self.push_out(f);
        self.goaway_sent = Some(self.last_stream);
    }

    /// Whether the client sent GOAWAY or we did.
    pub fn going_away(&self) -> bool {
        self.goaway_sent.is_some() || self.goaway_received
    }

    /// The queued output, in order; the caller writes it and then calls
    /// [`Self::wrote`].
    pub fn output(&self) -> &VecDeque<Bytes> {
        &self.out
    }

    /// Bytes of queued output.
    pub fn output_len(&self) -> usize {
        self.out_len
    }

    /// `n` bytes of the output were written: they leave the queue, and
    /// stream data waiting for room follows.
    pub fn wrote(&mut self, mut n: usize) {
        self.out_len -= n;
        while n > 0 {
            let Some(front) = self.out.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                self.out.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
        if self.out.is_empty() {
            self.out = VecDeque::new();
        }
        self.flush_all();
    }

    /// Takes all queued output at once (tests, fuzzing).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.out_len);
        for b in &self.out {
            v.extend_from_slice(b);
        }
        let n = v.len();
        self.wrote(n);
        v
    }

    pub(super) fn push_out(&mut self, frame: Vec<u8>) {
        self.out_len += frame.len();
        self.out.push_back(Bytes::from(frame));
    }

    pub(super) fn wake(&mut self, id: u32) {
        if self.events.back() != Some(&Event::Wake(id)) {
            self.events.push_back(Event::Wake(id));
        }
    }
}
