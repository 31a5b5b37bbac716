//! Stream state (RFC 9113 5.1): each stream's receive and send sides and
//! the caller's operations on a request: take its data, send the
//! response head, DATA and trailers, reset, release; which closed
//! streams are remembered.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecvSide {
    Open,
    Ended,
    /// We reset the stream (or the connection failed): frames the client
    /// had sent before it saw our RST_STREAM are ignored.
    Reset(u32),
    /// The client reset it: it sends nothing more on it (RFC 9113 5.1).
    PeerReset(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendSide {
    /// No response head yet.
    Idle,
    Open,
    /// The end (trailers or an empty END_STREAM DATA) waits behind the
    /// queued data.
    Ending,
    Ended,
    Reset(u32),
}

pub(super) struct Stream<U> {
    pub(super) id: u32,
    pub(super) user: U,
    pub(super) recv: RecvBuffer,
    /// Taken by the caller and not yet used ([`ServerConn::consumed`]):
    /// still counted against the windows.
    pub(super) held: i64,
    pub(super) recv_side: RecvSide,
    /// Window we granted minus what arrived.
    pub(super) recv_window: i64,
    /// Taken by the caller and not yet granted back.
    pub(super) recv_unacked: i64,
    pub(super) send_side: SendSide,
    pub(super) send_window: i64,
    pub(super) pending: VecDeque<Bytes>,
    pub(super) pending_len: usize,
    /// The encoded trailer block that ends the stream; `None` with
    /// `Ending`: an empty DATA frame with END_STREAM.
    pub(super) trailers: Option<Vec<u8>>,
    /// Request body bytes the `content-length` still announces (`None`:
    /// no content-length).
    pub(super) content_left: Option<u64>,
    /// The caller released it after the response ended while the request
    /// goes on: what the client still sends is checked and dropped until
    /// it ends its side (see [`ServerConn::release`]).
    pub(super) released: bool,
    /// Released with its end queued behind data that waits for the
    /// client's windows or the output's room: kept until the end is
    /// written (not counted in `lingering` until then).
    pub(super) end_queued: bool,
    /// The caller took its [`Event::Request`].
    pub(super) taken: bool,
}

/// Stream operations (the caller's side of a request).
impl<U: Default> ServerConn<U> {
    pub(super) fn index(&self, id: u32) -> Option<usize> {
        // Kept in id order (new streams have higher ids than any before,
        // and removal keeps the order): a binary search, not a scan per
        // frame (40x the CPU per byte with 1,000 streams open).
        debug_assert_eq!(self.ids.len(), self.streams.len());
        self.ids.binary_search(&id).ok()
    }

    /// The caller's value on stream `id`.
    pub fn user(&mut self, id: u32) -> Option<&mut U> {
        let i = self.index(id)?;
        Some(&mut self.streams[i].user)
    }

    /// Every live stream's caller value (to wake them all).
    pub fn users(&mut self) -> impl Iterator<Item = &mut U> {
        self.streams.iter_mut().map(|s| &mut s.user)
    }

    /// Open streams.
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// The next piece of a request body. Its flow-control credit comes back
    /// to the client once the caller says it used the bytes
    /// ([`Self::consumed`]): a caller that gathers them (a gRPC message
    /// taken whole) holds them against the windows.
    pub fn take_data(&mut self, id: u32) -> Recv {
        let Some(i) = self.index(id) else {
            return Recv::Reset(reason::CANCEL);
        };
        let s = &mut self.streams[i];
        if let Some(b) = s.recv.pop() {
            s.held += b.len() as i64;
            return Recv::Data(b);
        }
        match s.recv_side {
            RecvSide::Open => Recv::Pending,
            RecvSide::Ended => Recv::End,
            RecvSide::Reset(code) | RecvSide::PeerReset(code) => Recv::Reset(code),
        }
    }

    /// The caller used `n` bytes of what it took from stream `id`: their
    /// window goes back to the client (one WINDOW_UPDATE once half a window
    /// is owed). Bytes of a stream that is gone were given back already.
    pub fn consumed(&mut self, id: u32, n: usize) {
        let Some(i) = self.index(id) else { return };
        let s = &mut self.streams[i];
        let n = (n as i64).min(s.held);
        if n <= 0 {
            return;
        }
        s.held -= n;
        s.recv_unacked += n;
        self.conn_credit(n);
        self.stream_credit(i);
    }

    /// Whether the stream was reset (by the client or an error), and how.
    pub fn reset_reason(&self, id: u32) -> Option<u32> {
        let i = self.index(id)?;
        match self.streams[i].send_side {
            SendSide::Reset(code) => Some(code),
            _ => None,
        }
    }

    /// Sends the response head (`:status` 200 and `fields`); with `end`,
    /// the response ends there (a trailers-only response).
    pub fn send_head(
        &mut self,
        id: u32,
        fields: &[(&str, &str)],
        end: bool,
    ) -> Result<(), SendError> {
        let i = self.live(id)?;
        if self.streams[i].send_side != SendSide::Idle {
            return Err(SendError::Ended);
        }
        let mut block = Vec::with_capacity(64);
        encode_field(&mut block, b":status", b"200");
        for (n, v) in fields {
            encode_field(&mut block, n.as_bytes(), v.as_bytes());
        }
        let kind = if end { Out::End(id) } else { Out::Plain };
        self.push_block(id, end, &block, kind);
        self.streams[i].send_side = if end { SendSide::Ended } else { SendSide::Open };
        Ok(())
    }

    /// Queues response body bytes; they go out as the client's windows
    /// allow. Wait for [`Self::send_pending`] to reach 0 before queuing
    /// more (an [`Event::Wake`] comes when it does).
    pub fn send_data(&mut self, id: u32, data: Bytes) -> Result<(), SendError> {
        let i = self.live(id)?;
        let s = &mut self.streams[i];
        if s.send_side != SendSide::Open {
            return Err(SendError::Ended);
        }
        if data.is_empty() {
            return Ok(());
        }
        s.pending_len += data.len();
        s.pending.push_back(data);
        self.flush_stream(i);
        Ok(())
    }

    /// Bytes queued on the stream and not yet in the output.
    pub fn send_pending(&self, id: u32) -> Result<usize, SendError> {
        let i = self.live(id)?;
        Ok(self.streams[i].pending_len)
    }

    /// Ends the response with trailers (`fields`), after the queued data.
    pub fn send_trailers(&mut self, id: u32, fields: &[(&str, &str)]) -> Result<(), SendError> {
        let i = self.live(id)?;
        let s = &mut self.streams[i];
        if s.send_side != SendSide::Open {
            return Err(SendError::Ended);
        }
        let mut block = Vec::with_capacity(64);
        for (n, v) in fields {
            encode_field(&mut block, n.as_bytes(), v.as_bytes());
        }
        s.trailers = Some(block);
        s.send_side = SendSide::Ending;
        self.flush_stream(i);
        Ok(())
    }

    /// Resets the stream (our side gives up on it).
    pub fn reset(&mut self, id: u32, code: u32) {
        if let Some(i) = self.index(id) {
            self.reset_stream(i, code);
        }
    }

    /// The caller is done with the stream. A response not ended is reset
    /// (CANCEL). A response whose end is queued behind data (trailers
    /// after a message waiting for the client's window) goes out first,
    /// as the h2 crate sends what a dropped stream queued: the stream is
    /// kept without its caller, still counted against the concurrency
    /// limit, until its end is written. A response ended while the request
    /// goes on keeps the stream, without its caller, until the client ends
    /// or resets its side: what it still sends is checked (content-length,
    /// trailers) and dropped, as RFC 9113 8.1 lets a server answer before
    /// the request ends. At most `max_streams` such streams are kept; past
    /// that the oldest is told to stop (RST_STREAM NO_ERROR) and
    /// forgotten. Otherwise the stream is forgotten.
    pub fn release(&mut self, id: u32) {
        let Some(i) = self.index(id) else { return };
        let s = &self.streams[i];
        if s.released {
            return;
        }
        match (s.send_side, s.recv_side) {
            // Over on both sides, or reset: nothing to tell the client.
            (SendSide::Reset(_), _) | (SendSide::Ended, _) if s.recv_side != RecvSide::Open => {}
            (SendSide::Reset(_), _) => {}
            (SendSide::Ending, _) => {
                self.drop_received(i);
                let s = &mut self.streams[i];
                s.released = true;
                s.end_queued = true;
                s.user = U::default();
                return;
            }
            (SendSide::Ended, RecvSide::Open) => {
                self.drop_received(i);
                let s = &mut self.streams[i];
                s.released = true;
                s.user = U::default();
                self.lingering += 1;
                if self.lingering > self.cfg.max_streams as usize {
                    self.evict_oldest_lingering();
                }
                return;
            }
            _ => self.push_rst(id, reason::CANCEL, Out::End(id)),
        }
        self.remove(i);
    }

    /// Forgets stream `i`.
    pub(super) fn remove(&mut self, i: usize) {
        self.drop_received(i);
        let s = &self.streams[i];
        if s.released && !s.end_queued {
            self.lingering -= 1;
        }
        self.streams.remove(i);
        self.ids.remove(i);
        if self.streams.is_empty() {
            self.streams = Vec::new();
            self.ids = Vec::new();
        }
    }

    /// Past `max_streams` streams kept after their response, the oldest
    /// go (see [`Self::release`]).
    pub(super) fn evict_lingering_past_the_limit(&mut self) {
        while self.lingering > self.cfg.max_streams as usize {
            self.evict_oldest_lingering();
        }
    }

    pub(super) fn evict_oldest_lingering(&mut self) {
        let oldest = self
            .streams
            .iter()
            .enumerate()
            .filter(|(_, s)| s.released && !s.end_queued)
            .min_by_key(|(_, s)| s.id)
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            let id = self.streams[i].id;
            self.push_rst(id, reason::NO_ERROR, Out::Answer);
            self.remove(i);
        }
    }

    pub(super) fn live(&self, id: u32) -> Result<usize, SendError> {
        if self.closed.is_some() {
            return Err(SendError::ConnClosed);
        }
        let i = self.index(id).ok_or(SendError::Gone)?;
        match self.streams[i].send_side {
            SendSide::Reset(code) => Err(SendError::Reset(code)),
            _ => Ok(i),
        }
    }

    /// Resets stream `i` for an error of the client's (counted: see
    /// [`MAX_ERROR_RESETS`]).
    pub(super) fn error_reset(&mut self, i: usize, code: u32) {
        if !matches!(self.streams[i].send_side, SendSide::Reset(_)) {
            self.error_resets = self.error_resets.saturating_add(1);
            if self.error_resets > MAX_ERROR_RESETS {
                // The connection ends after this frame: no RST_STREAM
                // past the bound (as the h2 crate sends none).
                return;
            }
        }
        self.reset_stream(i, code);
    }

    /// Resets stream `id`, of which we keep no state (refused past the
    /// concurrency limit, a malformed request, one depending on itself, a
    /// frame on a closed stream), for an error of the client's: counted
    /// too (see [`MAX_ERROR_RESETS`]), as the h2 crate counts its
    /// refusals (`count_pending_refusal`) and its own resets.
    pub(super) fn error_reset_unknown(&mut self, id: u32, code: u32) {
        self.error_resets = self.error_resets.saturating_add(1);
        if self.error_resets <= MAX_ERROR_RESETS {
            self.push_rst(id, code, Out::Answer);
        }
    }

    pub(super) fn reset_stream(&mut self, i: usize, code: u32) {
        let s = &mut self.streams[i];
        if matches!(s.send_side, SendSide::Reset(_)) {
            return;
        }
        // A stream still counted ends with this reset; one whose end is
        // queued already was ended by that.
        let kind = if s.send_side == SendSide::Ended {
            Out::Answer
        } else {
            Out::End(s.id)
        };
        s.send_side = SendSide::Reset(code);
        if s.recv_side == RecvSide::Open {
            s.recv_side = RecvSide::Reset(code);
        }
        s.pending.clear();
        s.pending_len = 0;
        let id = s.id;
        self.drop_received(i);
        self.push_rst(id, code, kind);
        if self.streams[i].released {
            self.remove(i);
        } else {
            self.wake(id);
        }
    }

    /// Received data nobody will take or use: its connection window is
    /// given back.
    pub(super) fn drop_received(&mut self, i: usize) {
        let s = &mut self.streams[i];
        let unread = s.recv.clear() as i64 + std::mem::take(&mut s.held);
        if unread > 0 {
            self.conn_credit(unread);
        }
    }

    /// Queues a RST_STREAM; the id is remembered for a while, so that the
    /// frames the client sent before it sees it are ignored.
    pub(super) fn push_rst(&mut self, id: u32, code: u32, kind: Out) {
        self.recent_resets[self.recent_next] = id;
        self.recent_next = (self.recent_next + 1) % RECENT_RESETS;
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 4);
        put_frame_header(&mut f, 4, RST_STREAM, 0, id);
        f.extend_from_slice(&code.to_be_bytes());
        self.push_frame(f, kind);
    }

    /// A header block as HEADERS and CONTINUATION frames.
    pub(super) fn push_block(&mut self, id: u32, end: bool, block: &[u8], kind: Out) {
        let mut f = Vec::new();
        write_block(&mut f, id, end, block, self.peer_max_frame);
        self.push_frame(f, kind);
    }
}
