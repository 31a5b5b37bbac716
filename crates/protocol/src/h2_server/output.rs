//! Frames out: keepalive PINGs, GOAWAY, and the output queue the caller
//! writes from ([`ServerConn::take_output`], [`ServerConn::wrote`]).
//!
//! The caller keeps reading while the output waits for the client (a
//! grpc-go client stops reading once 50 of its own answers wait to be
//! written, `maxQueuedTransportResponseFrames` in grpc-go's
//! internal/transport/controlbuf.go: if we stopped too, neither side would
//! read again). What reading adds to the output is bounded instead:
//! stream DATA waits past [`OUT_HIGH`], window credit waits while the
//! output is past it, a stream counts against the concurrency limit until
//! its end is written (the client sees it no sooner), and answers to the
//! client's frames (PING and SETTINGS acknowledgements, RST_STREAMs of
//! streams never counted) end the connection past
//! [`MAX_UNWRITTEN_ANSWERS`], as Go's server does past 10,000
//! (`maxQueuedControlFrames`, golang.org/x/net/http2/server.go).

use super::*;

/// What a queued frame is to the bounds on unwritten output.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// Counted by neither bound (DATA, heads, credit, our own PING, GOAWAY).
    Plain,
    /// The end of stream `id` (END_STREAM or RST_STREAM): the stream
    /// counts against the concurrency limit until it is written.
    End(u32),
    /// An answer to the client's frames (see [`MAX_UNWRITTEN_ANSWERS`]).
    Answer,
}

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
        self.written += n as u64;
        while let Some(&(at, id)) = self.unwritten.front() {
            if at > self.written {
                break;
            }
            self.unwritten.pop_front();
            self.forget_mark(id);
        }
        if self.unwritten.is_empty() && self.unwritten.capacity() > 0 {
            self.unwritten = VecDeque::new();
        }
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
        // Credit owed goes out before the data waiting for room: a client
        // sending while it downloads is not held up behind our data.
        if self.credit_owed && self.out_len < OUT_HIGH {
            self.pay_owed_credit();
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
        self.push_frame(frame, Out::Plain);
    }

    /// Queues `frame`, remembering where it ends when a bound counts it.
    pub(super) fn push_frame(&mut self, frame: Vec<u8>, kind: Out) {
        self.out_len += frame.len();
        self.out.push_back(Bytes::from(frame));
        let id = match kind {
            Out::Plain => return,
            Out::End(id) => {
                self.ends_unwritten += 1;
                id
            }
            Out::Answer => {
                self.answers_unwritten += 1;
                0
            }
        };
        self.unwritten
            .push_back((self.written + self.out_len as u64, id));
    }

    /// Stream `id`'s queued end no longer counts (the client reset it: it
    /// stopped counting the stream then).
    pub(super) fn forget_end(&mut self, id: u32) {
        if self.ends_unwritten == 0 {
            return;
        }
        if let Some(k) = self.unwritten.iter().position(|&(_, i)| i == id) {
            self.unwritten.remove(k);
            self.forget_mark(id);
        }
    }

    fn forget_mark(&mut self, id: u32) {
        if id == 0 {
            self.answers_unwritten -= 1;
        } else {
            self.ends_unwritten -= 1;
        }
    }

    /// Streams whose end is queued and not yet written.
    pub(super) fn ends_unwritten(&self) -> usize {
        self.ends_unwritten as usize
    }

    pub(super) fn wake(&mut self, id: u32) {
        if self.events.back() != Some(&Event::Wake(id)) {
            self.events.push_back(Event::Wake(id));
        }
    }
}
