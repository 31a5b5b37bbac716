//! Request header blocks: HEADERS and CONTINUATION collected into one
//! block (with the CONTINUATION flood check), decoded with the client's
//! HPACK state into a [`RequestHead`] or request trailers, and the
//! concurrent-stream limit a new request meets.

use super::*;

/// A header block being collected (HEADERS then CONTINUATION).
pub(super) struct Block {
    pub(super) stream: u32,
    pub(super) end_stream: bool,
    /// The HEADERS frame's priority made the stream depend on itself.
    pub(super) self_dependent: bool,
    pub(super) bytes: Vec<u8>,
    /// CONTINUATION frames so far without END_HEADERS.
    pub(super) continuations: u32,
}

impl<U: Default> ServerConn<U> {
    pub(super) fn headers(&mut self, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        if id == 0 {
            return Err(conn_err(reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut p = p;
        let mut pad = 0;
        if flags & PADDED != 0 {
            let Some((&n, rest)) = p.split_first() else {
                return Err(conn_err(reason::FRAME_SIZE_ERROR, "HEADERS size"));
            };
            pad = usize::from(n);
            p = rest;
        }
        let mut self_dependent = false;
        if flags & PRIORITY_FLAG != 0 {
            if p.len() < 5 {
                return Err(conn_err(reason::FRAME_SIZE_ERROR, "HEADERS size"));
            }
            self_dependent = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff == id;
            p = &p[5..];
        }
        if pad > p.len() {
            return Err(conn_err(reason::PROTOCOL_ERROR, "padding too long"));
        }
        let fragment = &p[..p.len() - pad];
        let block = Block {
            stream: id,
            end_stream: flags & END_STREAM != 0,
            self_dependent,
            bytes: fragment.to_vec(),
            continuations: 0,
        };
        self.check_block_size(block.bytes.len())?;
        if flags & END_HEADERS != 0 {
            self.header_block(block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    pub(super) fn continuation(&mut self, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        let Some(mut block) = self.block.take() else {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "CONTINUATION outside a block",
            ));
        };
        if block.stream != id {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "CONTINUATION on another stream",
            ));
        }
        block.bytes.extend_from_slice(p);
        self.check_block_size(block.bytes.len())?;
        if flags & END_HEADERS == 0 {
            // An empty CONTINUATION adds nothing to the block's size: the
            // frames are counted too, up to what the largest header list
            // takes in the smallest frames a client may send, plus a
            // quarter, at least 5 (the h2 crate's bound,
            // src/codec/framed_read.rs `calc_max_continuation_frames`).
            block.continuations += 1;
            let needed = (self.cfg.max_header_list / MIN_MAX_FRAME).max(1);
            if block.continuations > (needed + needed / 4).max(5) {
                return Err(flood_err(
                    Flood::Continuation,
                    "too many CONTINUATION frames",
                ));
            }
        }
        if flags & END_HEADERS != 0 {
            self.header_block(block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    pub(super) fn check_block_size(&self, n: usize) -> Result<(), ConnError> {
        if n > self.cfg.max_header_list as usize {
            return Err(conn_err(
                reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        Ok(())
    }

    /// A whole header block: decoded (always, for the HPACK state), then a
    /// request, a request's trailers, or a stream or connection error.
    pub(super) fn header_block(&mut self, block: Block) -> Result<(), ConnError> {
        let id = block.stream;
        let known = self.index(id);
        let trailers = known.is_some_and(|i| self.streams[i].recv_side == RecvSide::Open);
        let decoded = decode_head(
            &mut self.decoder,
            &block.bytes,
            self.cfg.max_header_list,
            trailers,
            self.cfg.keep_fields,
        )?;
        if let Some(i) = known {
            match self.streams[i].recv_side {
                // Trailers end the request; without END_STREAM, or with a
                // pseudo-header, the request is malformed (RFC 9113 8.1).
                RecvSide::Open => {
                    if !block.end_stream || decoded.is_err() || block.self_dependent {
                        self.error_reset(i, reason::PROTOCOL_ERROR);
                    } else {
                        self.end_of_request(id);
                    }
                }
                // Half-closed (remote): RFC 9113 5.1, STREAM_CLOSED.
                RecvSide::Ended => self.error_reset(i, reason::STREAM_CLOSED),
                RecvSide::PeerReset(_) => self.closed_stream_frame(id),
                // We reset it: sent before the client saw that.
                RecvSide::Reset(_) => {}
            }
            return Ok(());
        }
        if id <= self.last_stream {
            if self.recent_resets.contains(&id) {
                // Trailers in flight when we reset the stream.
                return Ok(());
            }
            // A stream already closed, or a new one whose id is not above
            // the last: RFC 9113 5.1.1, a connection error.
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "HEADERS on a closed stream or below the last stream id",
            ));
        }
        if id.is_multiple_of(2) {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "even stream id from a client",
            ));
        }
        self.last_stream = id;
        if block.self_dependent {
            // RFC 9113 5.3.1: a stream error.
            self.error_reset_unknown(id, reason::PROTOCOL_ERROR);
            return Ok(());
        }
        if self.goaway_sent.is_some() {
            // Past our GOAWAY: not processed (the client retries elsewhere).
            // (The client's own GOAWAY concerns streams we would open.)
            self.push_rst(id, reason::REFUSED_STREAM, Out::Answer);
            return Ok(());
        }
        if self.active_streams() >= self.cfg.max_streams as usize {
            // Past the limit we advertised (RFC 9113 5.1.2): a client that
            // waits for our ends never gets here, one that keeps doing it
            // is counted.
            self.error_reset_unknown(id, reason::REFUSED_STREAM);
            return Ok(());
        }
        let head = match decoded {
            // A body announced on a request that has none is malformed.
            Ok(h) if !(block.end_stream && h.content_length.is_some_and(|n| n > 0)) => h,
            _ => {
                self.error_reset_unknown(id, reason::PROTOCOL_ERROR);
                return Ok(());
            }
        };
        // Most connections carry one stream (konnectivity-client opens a
        // connection per tunnel): the first few grow the table one at a
        // time rather than to 4 at once.
        if self.streams.len() < 4 {
            self.streams.reserve_exact(1);
            self.ids.reserve_exact(1);
        }
        // In id order (see `index`).
        debug_assert!(self.streams.last().is_none_or(|s| s.id < id));
        self.ids.push(id);
        self.streams.push(Stream {
            id,
            user: Default::default(),
            recv: RecvBuffer::default(),
            held: 0,
            recv_side: if block.end_stream {
                RecvSide::Ended
            } else {
                RecvSide::Open
            },
            recv_window: i64::from(self.cfg.stream_window),
            recv_unacked: 0,
            send_side: SendSide::Idle,
            send_window: self.peer_initial_window,
            pending: VecDeque::new(),
            pending_len: 0,
            trailers: None,
            content_left: head.content_length,
            released: false,
            end_queued: false,
            taken: false,
        });
        self.events.push_back(Event::Request {
            stream: id,
            head,
            end_stream: block.end_stream,
        });
        Ok(())
    }

    /// Streams that count against SETTINGS_MAX_CONCURRENT_STREAMS the way
    /// the client counts them: grpc-go takes a stream off its count when it
    /// receives our END_STREAM or a RST_STREAM, or sends its own RST_STREAM
    /// (internal/transport/http2_client.go, closeStream and the stream
    /// quota), so a stream whose end is written, or that the client reset,
    /// does not count, even while its caller still holds it. An end still
    /// queued counts: the client cannot have seen it (and a client that
    /// does not read cannot make us queue answers without end).
    pub(super) fn active_streams(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| !matches!(s.send_side, SendSide::Ended | SendSide::Reset(_)))
            .count()
            + self.ends_unwritten()
    }
}

/// Header fields of a request: what [`RequestHead`] keeps, or why the
/// request is malformed (a stream error). An HPACK failure or an
/// oversized list is a connection error (the HPACK state is lost).
///
/// With `trailers`, the block ends a request: any pseudo-header makes it
/// malformed (RFC 9113 8.1) and none is required.
pub(super) fn decode_head(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
    max_list: u32,
    trailers: bool,
    keep_fields: bool,
) -> Result<Result<RequestHead, &'static str>, ConnError> {
    let mut head = RequestHead::default();
    let mut list = 0usize;
    let mut over = false;
    let mut malformed: Option<&'static str> = None;
    let mut regular_seen = false;
    let (mut method, mut path, mut scheme) = (false, false, false);
    let res = decoder.decode_with_cb(block, |name: Cow<[u8]>, value: Cow<[u8]>| {
        list += name.len() + value.len() + 32;
        if list > max_list as usize {
            over = true;
        }
        if over || malformed.is_some() {
            return;
        }
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        if let Some(pseudo) = name.strip_prefix(b":") {
            if trailers {
                malformed = Some("pseudo-header in trailers");
                return;
            }
            if regular_seen {
                malformed = Some("pseudo-header after a regular field");
                return;
            }
            let seen = match pseudo {
                b"method" => std::mem::replace(&mut method, true),
                b"path" => std::mem::replace(&mut path, true),
                b"scheme" => std::mem::replace(&mut scheme, true),
                b"authority" => head.authority.is_some(),
                _ => {
                    malformed = Some("unknown pseudo-header");
                    return;
                }
            };
            if seen {
                malformed = Some("pseudo-header repeated");
                return;
            }
            match pseudo {
                b"method" => head.method = text(&value),
                b"path" => head.path = text(&value),
                b"authority" => head.authority = Some(text(&value)),
                _ => {}
            }
            return;
        }
        regular_seen = true;
        if name.iter().any(|b| b.is_ascii_uppercase()) {
            malformed = Some("upper-case field name");
            return;
        }
        match &*name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => malformed = Some("connection-specific field"),
            b"te" if &*value != b"trailers" => malformed = Some("te other than trailers"),
            b"content-type" if head.content_type.is_none() => {
                head.content_type = Some(text(&value))
            }
            b"content-length" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u64>().ok());
                match (n, head.content_length) {
                    (Some(n), None) => head.content_length = Some(n),
                    (Some(n), Some(m)) if n == m => {}
                    _ => malformed = Some("bad content-length"),
                }
            }
            _ if keep_fields && !trailers => head.fields.push((text(&name), value.into_owned())),
            _ => {}
        }
    });
    match res {
        Ok(()) => {}
        // A size update must open a block (RFC 7541 4.2): one at the end is
        // a decoding error.
        Err(DecoderError::SizeUpdateAtEnd) => {
            return Err(conn_err(
                reason::COMPRESSION_ERROR,
                "HPACK table size update at the end of a block",
            ))
        }
        Err(_) => return Err(conn_err(reason::COMPRESSION_ERROR, "HPACK decoding failed")),
    }
    if over {
        return Err(conn_err(reason::ENHANCE_YOUR_CALM, "header list too large"));
    }
    if let Some(m) = malformed {
        return Ok(Err(m));
    }
    if !trailers && (!(method && path && scheme) || head.path.is_empty()) {
        return Ok(Err("missing pseudo-header"));
    }
    Ok(Ok(head))
}
