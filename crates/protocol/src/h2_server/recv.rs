//! Frames in: the read state (client preface, frame heads, DATA passed
//! on as slices of the input) and what each frame type does to the
//! connection: DATA against the windows we granted, SETTINGS, PING,
//! GOAWAY, RST_STREAM, WINDOW_UPDATE, PRIORITY; header blocks go on to
//! [`super::headers`].

use super::*;

/// Settings one SETTINGS frame may carry (Go's server refuses more).
const MAX_SETTINGS_PER_FRAME: usize = 100;

pub(super) enum In {
    /// Bytes of the client preface still expected.
    Preface(usize),
    /// At a frame boundary.
    Head,
    /// Inside a DATA frame: payload bytes still to pass on, then padding
    /// to skip. `stream` is 0 when the frame is ignored; with `keep`
    /// false the payload is dropped (its window was given back) but
    /// END_STREAM still ends the stream.
    Data {
        stream: u32,
        keep: bool,
        left: usize,
        pad: usize,
        end: bool,
    },
}

impl<U: Default> ServerConn<U> {
    pub(super) fn recv_frames(&mut self, input: &mut BytesMut) -> Result<(), ConnError> {
        loop {
            match self.input {
                In::Preface(left) => {
                    let at = PREFACE.len() - left;
                    let n = left.min(input.len());
                    if input[..n] != PREFACE[at..at + n] {
                        return Err(conn_err(reason::PROTOCOL_ERROR, "bad client preface"));
                    }
                    input.advance(n);
                    if n == left {
                        self.input = In::Head;
                    } else {
                        self.input = In::Preface(left - n);
                        return Ok(());
                    }
                }
                In::Data {
                    stream,
                    keep,
                    left,
                    pad,
                    end,
                } => {
                    if left > 0 {
                        let n = left.min(input.len());
                        if n == 0 {
                            return Ok(());
                        }
                        if !keep {
                            input.advance(n);
                            self.input = In::Data {
                                stream,
                                keep,
                                left: left - n,
                                pad,
                                end,
                            };
                            continue;
                        }
                        self.data_chunk(stream, &input[..n]);
                        input.advance(n);
                        self.input = In::Data {
                            stream,
                            keep,
                            left: left - n,
                            pad,
                            end,
                        };
                        continue;
                    }
                    let n = pad.min(input.len());
                    input.advance(n);
                    if n < pad {
                        self.input = In::Data {
                            stream,
                            keep,
                            left: 0,
                            pad: pad - n,
                            end,
                        };
                        return Ok(());
                    }
                    self.input = In::Head;
                    if end && stream != 0 {
                        self.end_of_request(stream);
                    }
                }
                In::Head => {
                    self.check_floods()?;
                    if input.len() < FRAME_HEADER_LEN || self.frames_left == 0 {
                        return Ok(());
                    }
                    self.frames_left -= 1;
                    let len = usize::from(input[0]) << 16
                        | usize::from(input[1]) << 8
                        | usize::from(input[2]);
                    let (ty, flags) = (input[3], input[4]);
                    let id =
                        u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
                    if len > self.cfg.max_frame as usize {
                        return Err(conn_err(reason::FRAME_SIZE_ERROR, "frame too large"));
                    }
                    if !self.got_settings && (ty != SETTINGS || flags & ACK != 0) {
                        return Err(conn_err(
                            reason::PROTOCOL_ERROR,
                            "first frame is not SETTINGS",
                        ));
                    }
                    if self.block.is_some() && ty != CONTINUATION {
                        return Err(conn_err(reason::PROTOCOL_ERROR, "header block interrupted"));
                    }
                    if ty == DATA {
                        let padded = flags & PADDED != 0;
                        if padded && input.len() < FRAME_HEADER_LEN + 1 {
                            return Ok(());
                        }
                        let pad = if padded {
                            usize::from(input[FRAME_HEADER_LEN])
                        } else {
                            0
                        };
                        if padded && pad + 1 > len {
                            return Err(conn_err(reason::PROTOCOL_ERROR, "padding too long"));
                        }
                        input.advance(FRAME_HEADER_LEN + usize::from(padded));
                        let (stream, keep) = self.data_head(id, len, pad + usize::from(padded))?;
                        self.input = In::Data {
                            stream,
                            keep,
                            left: len - pad - usize::from(padded),
                            pad,
                            end: flags & END_STREAM != 0,
                        };
                        continue;
                    }
                    if input.len() < FRAME_HEADER_LEN + len {
                        // Wait for the whole frame (at most max_frame).
                        input.reserve(FRAME_HEADER_LEN + len - input.len());
                        return Ok(());
                    }
                    input.advance(FRAME_HEADER_LEN);
                    let payload = input.split_to(len);
                    self.frame(ty, flags, id, &payload)?;
                }
            }
        }
    }

    /// Checks a DATA frame's header and charges the windows; the stream
    /// the frame belongs to (0: ignored) and whether its payload is kept.
    pub(super) fn data_head(
        &mut self,
        id: u32,
        len: usize,
        padding: usize,
    ) -> Result<(u32, bool), ConnError> {
        if id == 0 {
            return Err(conn_err(reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let body = (len - padding) as u64;
        let len = len as i64;
        if len > self.recv_window {
            return Err(conn_err(
                reason::FLOW_CONTROL_ERROR,
                "DATA past the connection window",
            ));
        }
        self.recv_window -= len;
        if id > self.last_stream {
            return Err(conn_err(reason::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let Some(i) = self.index(id) else {
            // Closed: a stream error STREAM_CLOSED (RFC 9113 5.1), unless
            // we reset it ourselves lately (what was in flight is ignored).
            self.conn_credit(len);
            self.closed_stream_frame(id);
            return Ok((0, false));
        };
        match self.streams[i].recv_side {
            RecvSide::Open => {}
            RecvSide::Ended => {
                // Half-closed (remote): RFC 9113 5.1, STREAM_CLOSED.
                self.conn_credit(len);
                self.error_reset(i, reason::STREAM_CLOSED);
                return Ok((0, false));
            }
            RecvSide::PeerReset(_) => {
                self.conn_credit(len);
                self.closed_stream_frame(id);
                return Ok((0, false));
            }
            RecvSide::Reset(_) => {
                self.conn_credit(len);
                return Ok((0, false));
            }
        }
        if len > self.streams[i].recv_window {
            self.conn_credit(len);
            self.error_reset(i, reason::FLOW_CONTROL_ERROR);
            return Ok((0, false));
        }
        if let Some(left) = self.streams[i].content_left {
            if body > left {
                // More than the content-length announced (RFC 9113 8.1.1).
                self.conn_credit(len);
                self.error_reset(i, reason::PROTOCOL_ERROR);
                return Ok((0, false));
            }
            self.streams[i].content_left = Some(left - body);
        }
        self.streams[i].recv_window -= len;
        if self.streams[i].released {
            // Nobody reads it: the connection's window comes back at once,
            // the stream's does not (the client is not asked for more).
            self.conn_credit(len);
            return Ok((id, false));
        }
        // Padding is given back at once.
        let padding = padding as i64;
        if padding > 0 {
            self.streams[i].recv_unacked += padding;
            self.conn_credit(padding);
            self.stream_credit(i);
        }
        Ok((id, true))
    }

    /// A DATA or HEADERS frame on a stream that is closed: RST_STREAM
    /// STREAM_CLOSED (RFC 9113 5.1), once, unless we reset the stream
    /// lately (then the frame was in flight: ignored).
    pub(super) fn closed_stream_frame(&mut self, id: u32) {
        if !self.recent_resets.contains(&id) {
            self.error_reset_unknown(id, reason::STREAM_CLOSED);
        }
    }

    pub(super) fn data_chunk(&mut self, stream: u32, chunk: &[u8]) {
        if stream == 0 {
            // Dropped; its window was given back at the frame's head.
            return;
        }
        let n = chunk.len() as i64;
        match self.index(stream) {
            Some(i) if self.streams[i].recv_side == RecvSide::Open => {
                self.streams[i].recv.push(chunk);
                self.wake(stream);
            }
            // Reset meanwhile (or dropped): the bytes are not wanted.
            _ => self.conn_credit(n),
        }
    }

    /// END_STREAM from the client (on DATA or trailers).
    pub(super) fn end_of_request(&mut self, stream: u32) {
        let Some(i) = self.index(stream) else { return };
        if self.streams[i].recv_side != RecvSide::Open {
            return;
        }
        if self.streams[i].content_left.is_some_and(|n| n > 0) {
            // Less than the content-length announced (RFC 9113 8.1.1).
            self.error_reset(i, reason::PROTOCOL_ERROR);
            return;
        }
        self.streams[i].recv_side = RecvSide::Ended;
        if self.streams[i].end_queued {
            // Forgotten once its end is written.
        } else if self.streams[i].released {
            self.remove(i);
        } else {
            self.wake(stream);
        }
    }

    pub(super) fn frame(&mut self, ty: u8, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        match ty {
            HEADERS => self.headers(flags, id, p),
            CONTINUATION => self.continuation(flags, id, p),
            PRIORITY => {
                if id == 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if p.len() != 5 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "PRIORITY size"));
                }
                if u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff == id {
                    // A stream cannot depend on itself (RFC 9113 5.3.1).
                    match self.index(id) {
                        Some(i) => self.error_reset(i, reason::PROTOCOL_ERROR),
                        None => self.error_reset_unknown(id, reason::PROTOCOL_ERROR),
                    }
                }
                Ok(())
            }
            RST_STREAM => {
                if id == 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
                }
                if p.len() != 4 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "RST_STREAM size"));
                }
                if id > self.last_stream {
                    return Err(conn_err(
                        reason::PROTOCOL_ERROR,
                        "RST_STREAM on an idle stream",
                    ));
                }
                let code = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
                // The client stops counting the stream as it resets it.
                self.forget_end(id);
                if let Some(i) = self.index(id) {
                    if !self.streams[i].taken
                        && !matches!(self.streams[i].recv_side, RecvSide::PeerReset(_))
                    {
                        self.pending_resets += 1;
                        if self.pending_resets as usize > MAX_PENDING_RESETS {
                            return Err(flood_err(
                                Flood::RapidReset,
                                "too many streams reset before they were taken",
                            ));
                        }
                    }
                    self.drop_received(i);
                    let s = &mut self.streams[i];
                    s.recv_side = RecvSide::PeerReset(code);
                    if !matches!(s.send_side, SendSide::Ended) {
                        s.send_side = SendSide::Reset(code);
                    }
                    s.pending.clear();
                    s.pending_len = 0;
                    if s.released {
                        self.remove(i);
                    } else {
                        self.wake(id);
                    }
                }
                Ok(())
            }
            SETTINGS => self.settings(flags, id, p),
            PUSH_PROMISE => Err(conn_err(
                reason::PROTOCOL_ERROR,
                "PUSH_PROMISE from a client",
            )),
            PING => {
                if id != 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                if p.len() != 8 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "PING size"));
                }
                if flags & ACK != 0 {
                    if self.ping_out && p == PING_PAYLOAD {
                        self.ping_out = false;
                        self.events.push_back(Event::Pong);
                    }
                } else {
                    let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
                    put_frame_header(&mut f, 8, PING, ACK, 0);
                    f.extend_from_slice(p);
                    self.push_frame(f, Out::Answer);
                }
                Ok(())
            }
            GOAWAY => {
                if id != 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if p.len() < 8 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "GOAWAY size"));
                }
                self.goaway_received = true;
                self.events.push_back(Event::GoAway {
                    last_stream: u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
                    code: u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                });
                Ok(())
            }
            WINDOW_UPDATE => self.window_update(id, p),
            // Unknown types are ignored (RFC 9113 section 4.1).
            _ => Ok(()),
        }
    }

    pub(super) fn settings(&mut self, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        if id != 0 {
            return Err(conn_err(reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if flags & ACK != 0 {
            if !p.is_empty() {
                return Err(conn_err(
                    reason::FRAME_SIZE_ERROR,
                    "SETTINGS ACK with payload",
                ));
            }
            return Ok(());
        }
        if !p.len().is_multiple_of(6) {
            return Err(conn_err(reason::FRAME_SIZE_ERROR, "SETTINGS size"));
        }
        // Go's server hangs up on more than 100 entries or a duplicate
        // (x/net/http2 server.go `processSettings`: "suspiciously large
        // settings frames"); one frame of 256 KiB carried 43,690
        // INITIAL_WINDOW_SIZE entries, each a walk over every stream.
        let n = p.len() / 6;
        if n > MAX_SETTINGS_PER_FRAME {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "more than 100 settings in one SETTINGS frame",
            ));
        }
        let keys: Vec<u16> = p
            .chunks_exact(6)
            .map(|s| u16::from_be_bytes([s[0], s[1]]))
            .collect();
        if keys.iter().enumerate().any(|(i, k)| keys[..i].contains(k)) {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "a setting repeated in one SETTINGS frame",
            ));
        }
        self.got_settings = true;
        // A new initial window applies to the open streams once per frame
        // (as the h2 crate does), after the frame was checked.
        let mut initial_window = None;
        for s in p.chunks_exact(6) {
            let key = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match key {
                SETTINGS_ENABLE_PUSH if v > 1 => {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1"));
                }
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(v) > MAX_WINDOW {
                        return Err(conn_err(
                            reason::FLOW_CONTROL_ERROR,
                            "INITIAL_WINDOW_SIZE too large",
                        ));
                    }
                    initial_window = Some(i64::from(v));
                }
                SETTINGS_MAX_FRAME_SIZE => {
                    if !(MIN_MAX_FRAME..=MAX_MAX_FRAME).contains(&v) {
                        return Err(conn_err(
                            reason::PROTOCOL_ERROR,
                            "MAX_FRAME_SIZE out of range",
                        ));
                    }
                    self.peer_max_frame = v as usize;
                }
                // Our encoder never uses the dynamic table; we open no
                // streams; header list sizes of our heads are tiny.
                SETTINGS_HEADER_TABLE_SIZE
                | SETTINGS_MAX_CONCURRENT_STREAMS
                | SETTINGS_MAX_HEADER_LIST_SIZE => {}
                _ => {}
            }
        }
        if let Some(v) = initial_window {
            let delta = v - self.peer_initial_window;
            self.peer_initial_window = v;
            for s in &mut self.streams {
                s.send_window += delta;
                if s.send_window > MAX_WINDOW {
                    return Err(conn_err(
                        reason::FLOW_CONTROL_ERROR,
                        "stream window overflow",
                    ));
                }
            }
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN);
        put_frame_header(&mut f, 0, SETTINGS, ACK, 0);
        self.push_frame(f, Out::Answer);
        self.flush_all();
        Ok(())
    }

    pub(super) fn window_update(&mut self, id: u32, p: &[u8]) -> Result<(), ConnError> {
        if p.len() != 4 {
            return Err(conn_err(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE size"));
        }
        let inc = i64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff);
        if id == 0 {
            if inc == 0 {
                return Err(conn_err(reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            self.send_window += inc;
            if self.send_window > MAX_WINDOW {
                return Err(conn_err(
                    reason::FLOW_CONTROL_ERROR,
                    "connection window overflow",
                ));
            }
            self.flush_all();
            return Ok(());
        }
        if id > self.last_stream {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        let Some(i) = self.index(id) else {
            return Ok(());
        };
        if inc == 0 {
            self.error_reset(i, reason::PROTOCOL_ERROR);
            return Ok(());
        }
        self.streams[i].send_window += inc;
        if self.streams[i].send_window > MAX_WINDOW {
            self.error_reset(i, reason::FLOW_CONTROL_ERROR);
            return Ok(());
        }
        self.flush_stream(i);
        self.evict_lingering_past_the_limit();
        Ok(())
    }
}
