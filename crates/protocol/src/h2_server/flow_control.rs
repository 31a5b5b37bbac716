//! Flow control both ways: window credit given back as the caller takes
//! data (one WINDOW_UPDATE once a quarter window is owed, held while the
//! output is past [`OUT_HIGH`]), and queued stream DATA sent as the
//! client's windows and the output queue allow.

use super::*;

/// Flow control.
impl<U: Default> ServerConn<U> {
    /// Gives `n` bytes of connection window back, in one WINDOW_UPDATE
    /// once a quarter of the window is owed (when the output has room).
    pub(super) fn conn_credit(&mut self, n: i64) {
        self.recv_unacked += n;
        self.credit(None, self.out_len < OUT_HIGH);
    }

    /// Stream `i`'s credit, once a quarter of its window is owed (when the
    /// output has room).
    pub(super) fn stream_credit(&mut self, i: usize) {
        self.credit(Some(i), self.out_len < OUT_HIGH);
    }

    /// Credit owed while the output was full goes out, all of it.
    pub(super) fn pay_owed_credit(&mut self) {
        self.credit_owed = false;
        self.credit(None, true);
        for i in 0..self.streams.len() {
            self.credit(Some(i), true);
        }
    }

    /// A WINDOW_UPDATE for the connection (`None`) or stream `i` if a
    /// quarter of its window is owed: queued when `room`, remembered
    /// otherwise.
    fn credit(&mut self, stream: Option<usize>, room: bool) {
        let (id, owed) = match stream {
            None if self.closed.is_none() => (0, &mut self.recv_unacked),
            Some(i) if self.streams[i].recv_side == RecvSide::Open => {
                let s = &mut self.streams[i];
                (s.id, &mut s.recv_unacked)
            }
            _ => return,
        };
        let window = if id == 0 {
            self.cfg.conn_window
        } else {
            self.cfg.stream_window
        };
        // A quarter owed: credit returned at half a window left a sender
        // on a long path idle for part of each round trip (grpc-go's BDP
        // estimation grows its own windows for the same reason).
        if *owed < i64::from(window) / 4 {
            return;
        }
        if !room {
            self.credit_owed = true;
            return;
        }
        let n = std::mem::take(owed);
        match stream {
            None => self.recv_window += n,
            Some(i) => self.streams[i].recv_window += n,
        }
        self.push_window_update(id, n as u32);
    }

    fn push_window_update(&mut self, id: u32, n: u32) {
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 4);
        put_window_update(&mut f, id, n);
        self.push_out(f);
    }

    /// Grows the receive windows of stream `id` by `stream` bytes and of
    /// the connection by `conn` (WINDOW_UPDATEs for them; credit then
    /// keeps going back a quarter of the configured window at a time). For
    /// a long-lived stream on a path whose bandwidth-delay product outgrows
    /// the windows set at the start.
    pub fn grow_recv_windows(&mut self, id: u32, stream: u32, conn: u32) {
        if self.closed.is_some() {
            return;
        }
        if conn > 0 {
            self.recv_window += i64::from(conn);
            self.push_window_update(0, conn);
        }
        let Some(i) = self.index(id) else { return };
        let s = &mut self.streams[i];
        if s.recv_side != RecvSide::Open || stream == 0 {
            return;
        }
        s.recv_window += i64::from(stream);
        self.push_window_update(id, stream);
    }

    pub(super) fn flush_all(&mut self) {
        let mut i = 0;
        while i < self.streams.len() {
            if self.out_len >= OUT_HIGH || self.send_window <= 0 {
                break;
            }
            if !self.flush_stream(i) {
                i += 1;
            }
        }
        self.evict_lingering_past_the_limit();
    }

    /// Moves the stream's queued data into the output as far as the windows
    /// and the output's room allow; then its end, once the data is out.
    /// Whether the stream was forgotten then (released by its caller, its
    /// request over: see [`ServerConn::release`]).
    pub(super) fn flush_stream(&mut self, i: usize) -> bool {
        let max_frame = self.peer_max_frame;
        let had = self.streams[i].pending_len;
        loop {
            let s = &mut self.streams[i];
            if s.pending_len == 0 {
                break;
            }
            let room = s.send_window.min(self.send_window);
            if room <= 0 || self.out_len >= OUT_HIGH {
                break;
            }
            let n = (room as usize).min(max_frame).min(s.pending_len);
            let mut head = Vec::with_capacity(FRAME_HEADER_LEN);
            put_frame_header(&mut head, n, DATA, 0, s.id);
            self.out.push_back(Bytes::from(head));
            let mut left = n;
            while left > 0 {
                let front = s
                    .pending
                    .front_mut()
                    .expect("pending_len counts the chunks");
                if front.len() <= left {
                    left -= front.len();
                    let b = s.pending.pop_front().expect("front exists");
                    self.out.push_back(b);
                } else {
                    self.out.push_back(front.split_to(left));
                    left = 0;
                }
            }
            s.pending_len -= n;
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            self.out_len += FRAME_HEADER_LEN + n;
        }
        let s = &mut self.streams[i];
        if s.pending_len == 0 {
            if s.pending.capacity() > 0 {
                s.pending = VecDeque::new();
            }
            let id = s.id;
            if s.send_side == SendSide::Ending {
                s.send_side = SendSide::Ended;
                match s.trailers.take() {
                    Some(block) => self.push_block(id, true, &block, Out::End(id)),
                    None => {
                        let mut f = Vec::with_capacity(FRAME_HEADER_LEN);
                        put_frame_header(&mut f, 0, DATA, END_STREAM, id);
                        self.push_frame(f, Out::End(id));
                    }
                }
            }
            if had > 0 {
                self.wake(id);
            }
            let s = &mut self.streams[i];
            if s.end_queued && s.send_side == SendSide::Ended {
                // Released before its end was written: now an ended stream
                // without its caller.
                if s.recv_side == RecvSide::Open {
                    s.end_queued = false;
                    self.lingering += 1;
                } else {
                    self.remove(i);
                    return true;
                }
            }
        }
        false
    }
}
