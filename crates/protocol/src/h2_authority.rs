//! Makes any client's `:authority` acceptable to the h2 crate (sans-I/O).
//!
//! h2 (0.4, `server.rs`, `convert_poll_message`) parses a request's
//! `:authority` with `http::uri::Authority` and resets the stream with
//! PROTOCOL_ERROR when that fails. Real clients send values it rejects:
//! grpc-go, dialing the raw socket path through a custom dialer as
//! kube-apiserver does for konnectivity, sends the percent-encoded path
//! (`%2Fetc%2Fkubernetes%2F...socket`), grpc C-core over `unix:/path` sends
//! a percent-encoded path too, and others send a bare path or nothing. The Go
//! server accepts any `:authority`; so do we.
//!
//! [`AuthorityFilter`] sits on the client-to-server byte stream, before h2.
//! It passes the 24-byte client preface and every frame through unchanged
//! except header blocks (HEADERS, then CONTINUATION frames up to
//! END_HEADERS). Each header block is HPACK-decoded with the client's dynamic
//! table state and re-encoded without dynamic-table insertion (fully indexed
//! static entries, or literals without indexing, never Huffman), so h2's
//! decoder table stays empty and in step whatever is changed. Every block is
//! re-encoded, which keeps that true from the first block on. While
//! re-encoding, an `:authority` whose value `http::uri::Authority` rejects is
//! dropped (h2 then sees a request without one, which it accepts); every
//! other field is kept, in order. The new block goes out as one HEADERS frame
//! (END_STREAM kept, padding and priority fields dropped) and as many
//! CONTINUATION frames as needed, each at most 16,384 bytes of payload (the
//! smallest SETTINGS_MAX_FRAME_SIZE there is), END_HEADERS on the last.
//!
//! Payload of other frames is never copied here when the caller can avoid
//! it: [`AuthorityFilter::skip`] consumes the longest prefix of the input
//! that passes through untouched (the caller hands those bytes on as they
//! are), [`AuthorityFilter::feed`] consumes the bytes the filter must hold
//! (a frame header not yet complete, header-block frames) and appends what
//! they turn into. For any input, at least one of the two makes progress.
//! [`AuthorityFilter::process`] does both in a loop for callers that just
//! want output bytes.
//!
//! Memory is bounded by [`Limits`]: the collected encoded block, the decoded
//! header list (counted as RFC 9113 counts SETTINGS_MAX_HEADER_LIST_SIZE)
//! and the HPACK dynamic table (the SETTINGS_HEADER_TABLE_SIZE the server
//! advertised; h2's default is 4,096). Going over a limit, an HPACK error, a
//! frame other than CONTINUATION inside a header block, a CONTINUATION
//! outside one, or a PUSH_PROMISE from the client is an [`Error`] (the
//! caller closes the connection); it is sticky.

use std::borrow::Cow;

use loona_hpack::decoder::DecoderError;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of an HTTP/2 frame header.
pub const FRAME_HEADER_LEN: usize = 9;
/// Largest payload of the frames we write: the HTTP/2 minimum
/// SETTINGS_MAX_FRAME_SIZE, which every server accepts.
pub const OUT_MAX_FRAME: usize = 16_384;

/// Frame types and flags (RFC 9113 section 6).
pub const TYPE_HEADERS: u8 = 0x1;
pub const TYPE_PUSH_PROMISE: u8 = 0x5;
pub const TYPE_CONTINUATION: u8 = 0x9;
pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const FLAG_PADDED: u8 = 0x8;
pub const FLAG_PRIORITY: u8 = 0x20;

/// Bounds on what one connection's filter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest header block collected, in encoded bytes of HEADERS and
    /// CONTINUATION payload (padding included).
    pub max_block: usize,
    /// Largest decoded header list: the sum over fields of name + value +
    /// 32 bytes. Also bounds the re-encoded block, which is never larger.
    pub max_list: usize,
    /// The SETTINGS_HEADER_TABLE_SIZE the server advertised: the largest
    /// dynamic table size update a client may send.
    pub max_table_size: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_block: 256 * 1024,
            // 16 frames of 16 KiB at most: far below the CONTINUATION count
            // h2 tolerates for its own max_header_list_size (16 MiB).
            max_list: 256 * 1024,
            max_table_size: 4_096,
        }
    }
}

/// Why the client's byte stream cannot be rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("HTTP/2 header block over {max} bytes")]
    BlockTooLarge { max: usize },
    #[error("HTTP/2 header list over {max} bytes decoded")]
    ListTooLarge { max: usize },
    #[error("HPACK decoding failed: {0}")]
    Hpack(String),
    #[error("HTTP/2 framing: {0}")]
    Frame(&'static str),
}

#[derive(Debug, Clone)]
enum State {
    /// Bytes of the client preface still to pass.
    Preface(usize),
    /// At a frame boundary; `AuthorityFilter::have` bytes of the next frame
    /// header are held.
    Head,
    /// Payload bytes of a pass-through frame still to pass.
    Pass(usize),
    /// Payload bytes of a HEADERS or CONTINUATION frame still to collect.
    Block(usize),
    Failed(Error),
}

/// The client-to-server stream rewriter; see the module documentation.
pub struct AuthorityFilter {
    state: State,
    limits: Limits,
    /// A frame header being gathered.
    head: [u8; FRAME_HEADER_LEN],
    have: usize,
    decoder: loona_hpack::Decoder<'static>,
    /// Between a HEADERS frame without END_HEADERS and the CONTINUATION
    /// frame that ends its block.
    in_block: bool,
    block_stream: u32,
    block_end_stream: bool,
    /// The header block collected so far (fragments, padding removed once
    /// each frame is whole).
    block: Vec<u8>,
    /// Where the current frame's payload starts in `block`, its type and
    /// flags.
    frame_start: usize,
    frame_type: u8,
    frame_flags: u8,
    /// The re-encoded block (scratch, reused).
    enc: Vec<u8>,
    dropped: u64,
    blocks: u64,
}

impl std::fmt::Debug for AuthorityFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFilter")
            .field("state", &self.state)
            .field("have", &self.have)
            .field("in_block", &self.in_block)
            .field("block", &self.block.len())
            .field("dropped", &self.dropped)
            .field("blocks", &self.blocks)
            .finish()
    }
}

impl Default for AuthorityFilter {
    fn default() -> Self {
        Self::new()
    }
}

/// Scratch buffers above this capacity are released once used.
const KEEP_CAPACITY: usize = 4 * 1024;

impl AuthorityFilter {
    /// A filter for a new connection, before the client preface.
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(limits.max_table_size);
        decoder.set_max_table_size(limits.max_table_size);
        AuthorityFilter {
            state: State::Preface(PREFACE.len()),
            limits,
            head: [0; FRAME_HEADER_LEN],
            have: 0,
            decoder,
            in_block: false,
            block_stream: 0,
            block_end_stream: false,
            block: Vec::new(),
            frame_start: 0,
            frame_type: 0,
            frame_flags: 0,
            enc: Vec::new(),
            dropped: 0,
            blocks: 0,
        }
    }

    /// `:authority` fields dropped so far.
    pub fn dropped_authorities(&self) -> u64 {
        self.dropped
    }

    /// Header blocks re-encoded so far.
    pub fn header_blocks(&self) -> u64 {
        self.blocks
    }

    /// The error the filter stopped on, if any.
    pub fn error(&self) -> Option<&Error> {
        match &self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// How many of the next input bytes are already known to pass through
    /// untouched (the rest of the preface or of a pass-through frame's
    /// payload). More may pass: [`skip`](Self::skip) decides on frame
    /// headers as it meets them.
    pub fn pass_len(&self) -> usize {
        match self.state {
            State::Preface(n) | State::Pass(n) => n,
            _ => 0,
        }
    }

    /// Whether the next input byte may pass through untouched, so that a
    /// caller can read straight into its destination and then call
    /// [`skip`](Self::skip) on what arrived. False while the filter holds
    /// part of a frame header or a header block (then input goes to
    /// [`feed`](Self::feed)) or has failed.
    pub fn may_pass(&self) -> bool {
        match self.state {
            State::Preface(_) | State::Pass(_) => true,
            State::Head => self.have == 0 && !self.in_block,
            State::Block(_) | State::Failed(_) => false,
        }
    }

    /// Whether the filter holds input it has not given out yet (part of a
    /// frame header or of a header block): the stream ending now ends it
    /// inside a frame.
    pub fn holds_partial(&self) -> bool {
        match self.state {
            State::Head => self.have > 0 || self.in_block,
            State::Block(_) => true,
            _ => false,
        }
    }

    /// Consumes the longest prefix of `input` that passes through unchanged
    /// and returns its length: the caller hands `input[..n]` on as it is.
    /// Stops at the first byte the filter must hold (the start of a header
    /// frame, or a frame header not complete in `input`); that byte and
    /// the ones after go to [`feed`](Self::feed).
    pub fn skip(&mut self, input: &[u8]) -> usize {
        let mut pos = 0;
        loop {
            let rem = input.len() - pos;
            match self.state {
                State::Preface(left) => {
                    let n = left.min(rem);
                    pos += n;
                    self.state = if n == left {
                        State::Head
                    } else {
                        State::Preface(left - n)
                    };
                    if n < left {
                        return pos;
                    }
                }
                State::Pass(left) => {
                    let n = left.min(rem);
                    pos += n;
                    if n < left {
                        self.state = State::Pass(left - n);
                        return pos;
                    }
                    self.state = State::Head;
                }
                State::Head => {
                    if self.have > 0 || self.in_block || rem < FRAME_HEADER_LEN {
                        return pos;
                    }
                    let h = &input[pos..pos + FRAME_HEADER_LEN];
                    if is_header_type(h[3]) {
                        return pos;
                    }
                    pos += FRAME_HEADER_LEN;
                    self.state = State::Pass(frame_len(h));
                }
                State::Block(_) | State::Failed(_) => return pos,
            }
        }
    }

    /// Consumes the prefix of `input` that the filter must hold (a frame
    /// header not yet complete, header-block frames) and returns its
    /// length. What those bytes turn into is appended to `out`: a held
    /// frame header once it is known to pass, a re-encoded header block
    /// once its END_HEADERS frame is complete. Stops where
    /// [`skip`](Self::skip) can go on.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Error> {
        let mut pos = 0;
        loop {
            let rem = input.len() - pos;
            match self.state {
                State::Failed(ref e) => return Err(e.clone()),
                State::Preface(_) | State::Pass(_) => return Ok(pos),
                State::Head => {
                    if self.have == 0 && !self.in_block {
                        if rem == 0 {
                            return Ok(pos);
                        }
                        if rem >= FRAME_HEADER_LEN && !is_header_type(input[pos + 3]) {
                            // A whole pass-through frame header: skip's.
                            return Ok(pos);
                        }
                    }
                    let n = (FRAME_HEADER_LEN - self.have).min(rem);
                    self.head[self.have..self.have + n].copy_from_slice(&input[pos..pos + n]);
                    self.have += n;
                    pos += n;
                    if self.have < FRAME_HEADER_LEN {
                        return Ok(pos);
                    }
                    self.have = 0;
                    if let Err(e) = self.on_frame_header(out) {
                        return Err(self.fail(e));
                    }
                }
                State::Block(left) => {
                    let n = left.min(rem);
                    self.block.extend_from_slice(&input[pos..pos + n]);
                    pos += n;
                    if n < left {
                        self.state = State::Block(left - n);
                        return Ok(pos);
                    }
                    if let Err(e) = self.on_frame_end(out) {
                        return Err(self.fail(e));
                    }
                }
            }
        }
    }

    /// Runs all of `input` through the filter, appending every output byte
    /// (passed through or rewritten) to `out`. For callers that do not
    /// need to avoid the copy of pass-through bytes.
    pub fn process(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        let mut pos = 0;
        while pos < input.len() {
            let n = self.skip(&input[pos..]);
            out.extend_from_slice(&input[pos..pos + n]);
            pos += n;
            pos += self.feed(&input[pos..], out)?;
        }
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Error {
        self.state = State::Failed(e.clone());
        self.block = Vec::new();
        self.enc = Vec::new();
        e
    }

    /// A whole frame header is in `self.head`.
    fn on_frame_header(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let h = self.head;
        let len = frame_len(&h);
        let (ty, flags) = (h[3], h[4]);
        let stream = stream_id(&h);
        if self.in_block {
            if ty != TYPE_CONTINUATION {
                return Err(Error::Frame(
                    "a frame other than CONTINUATION inside a header block",
                ));
            }
            if stream != self.block_stream {
                return Err(Error::Frame(
                    "CONTINUATION on another stream than its HEADERS",
                ));
            }
        } else {
            match ty {
                TYPE_HEADERS => {
                    self.in_block = true;
                    self.block_stream = stream;
                    self.block_end_stream = flags & FLAG_END_STREAM != 0;
                    self.block.clear();
                }
                TYPE_CONTINUATION => {
                    return Err(Error::Frame("CONTINUATION without a header block"))
                }
                TYPE_PUSH_PROMISE => return Err(Error::Frame("PUSH_PROMISE from a client")),
                _ => {
                    out.extend_from_slice(&h);
                    self.state = State::Pass(len);
                    return Ok(());
                }
            }
        }
        if self.block.len() + len > self.limits.max_block {
            return Err(Error::BlockTooLarge {
                max: self.limits.max_block,
            });
        }
        self.frame_start = self.block.len();
        self.frame_type = ty;
        self.frame_flags = flags;
        self.state = State::Block(len);
        Ok(())
    }

    /// The current HEADERS or CONTINUATION frame's payload is all in
    /// `self.block[self.frame_start..]`.
    fn on_frame_end(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        if self.frame_type == TYPE_HEADERS {
            let payload = &self.block[self.frame_start..];
            let mut start = 0;
            let mut pad = 0;
            if self.frame_flags & FLAG_PADDED != 0 {
                let Some(&p) = payload.first() else {
                    return Err(Error::Frame("PADDED HEADERS frame without a pad length"));
                };
                pad = usize::from(p);
                start = 1;
            }
            if self.frame_flags & FLAG_PRIORITY != 0 {
                start += 5;
            }
            if start + pad > payload.len() {
                return Err(Error::Frame("HEADERS frame padding exceeds its payload"));
            }
            let end = self.frame_start + payload.len() - pad;
            self.block.truncate(end);
            self.block.drain(self.frame_start..self.frame_start + start);
        }
        self.state = State::Head;
        if self.frame_flags & FLAG_END_HEADERS != 0 {
            self.in_block = false;
            self.finish_block(out)?;
        }
        Ok(())
    }

    /// Decodes the whole block, re-encodes it and writes it out as frames.
    fn finish_block(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let max_list = self.limits.max_list;
        let mut list = 0usize;
        let mut over = false;
        let mut dropped = 0u64;
        let enc = &mut self.enc;
        enc.clear();
        let res = self
            .decoder
            .decode_with_cb(&self.block, |name: Cow<[u8]>, value: Cow<[u8]>| {
                if over {
                    return;
                }
                list += name.len() + value.len() + 32;
                if list > max_list {
                    over = true;
                    return;
                }
                if &*name == b":authority" && http::uri::Authority::try_from(&*value).is_err() {
                    dropped += 1;
                    return;
                }
                encode_field(enc, &name, &value);
            });
        match res {
            // A size update ending the block: the table change is applied
            // and every field was seen (h2's decoder accepts this too).
            Ok(()) | Err(DecoderError::SizeUpdateAtEnd) => {}
            Err(e) => return Err(Error::Hpack(e.to_string())),
        }
        if over {
            return Err(Error::ListTooLarge { max: max_list });
        }
        self.dropped += dropped;
        self.blocks += 1;
        write_block(
            out,
            self.block_stream,
            self.block_end_stream,
            &self.enc,
            OUT_MAX_FRAME,
        );
        self.block.clear();
        if self.block.capacity() > KEEP_CAPACITY {
            self.block = Vec::new();
        }
        if self.enc.capacity() > KEEP_CAPACITY {
            self.enc = Vec::new();
        }
        Ok(())
    }
}

fn is_header_type(ty: u8) -> bool {
    matches!(ty, TYPE_HEADERS | TYPE_CONTINUATION | TYPE_PUSH_PROMISE)
}

fn frame_len(h: &[u8]) -> usize {
    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2])
}

fn stream_id(h: &[u8]) -> u32 {
    u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff
}

/// Appends a frame header.
pub fn put_frame_header(out: &mut Vec<u8>, len: usize, ty: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// Writes an encoded header block as HEADERS + CONTINUATION frames of at
/// most `max_frame` bytes of payload each (END_STREAM on the HEADERS
/// frame with `end_stream`, END_HEADERS on the last).
pub fn write_block(
    out: &mut Vec<u8>,
    stream: u32,
    end_stream: bool,
    block: &[u8],
    max_frame: usize,
) {
    let frames = block.len().div_ceil(max_frame).max(1);
    out.reserve(block.len() + frames * FRAME_HEADER_LEN);
    let mut rest = block;
    let mut first = true;
    loop {
        let n = rest.len().min(max_frame);
        let last = n == rest.len();
        let mut flags = if last { FLAG_END_HEADERS } else { 0 };
        let ty = if first {
            if end_stream {
                flags |= FLAG_END_STREAM;
            }
            TYPE_HEADERS
        } else {
            TYPE_CONTINUATION
        };
        put_frame_header(out, n, ty, flags, stream);
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        first = false;
        if last {
            return;
        }
    }
}

/// The HPACK static table (RFC 7541 Appendix A), index 1 first.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Appends one field with no dynamic-table effect: an indexed static
/// entry when name and value match one, else a literal without indexing,
/// with the static name index when there is one. Strings are raw (no
/// Huffman).
pub fn encode_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let mut name_index = 0;
    for (i, &(n, v)) in STATIC_TABLE.iter().enumerate() {
        if n == name {
            if v == value {
                put_int(out, 0x80, 7, i + 1);
                return;
            }
            if name_index == 0 {
                name_index = i + 1;
            }
        }
    }
    // Literal Header Field without Indexing (RFC 7541 6.2.2): 0000xxxx.
    put_int(out, 0x00, 4, name_index);
    if name_index == 0 {
        put_string(out, name);
    }
    put_string(out, value);
}

/// An HPACK integer (RFC 7541 5.1) with `prefix` bits in the first byte,
/// whose other bits are `first`.
fn put_int(out: &mut Vec<u8>, first: u8, prefix: u8, mut v: usize) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A raw (not Huffman-coded) HPACK string literal.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERCENT: &str = "%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket";

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn fields(list: &[(&str, &str)]) -> Fields {
        list.iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn request(authority: &str) -> Fields {
        fields(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/ProxyService/Proxy"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ])
    }

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_frame_header(&mut v, payload.len(), ty, flags, stream);
        v.extend_from_slice(payload);
        v
    }

    /// Literal without indexing, new name, raw strings: what a simple
    /// client sends.
    fn lit(name: &str, value: &str) -> Vec<u8> {
        let mut v = vec![0x00];
        put_string(&mut v, name.as_bytes());
        put_string(&mut v, value.as_bytes());
        v
    }

    /// Literal with incremental indexing, new name.
    fn lit_inc(name: &str, value: &str) -> Vec<u8> {
        let mut v = vec![0x40];
        put_string(&mut v, name.as_bytes());
        put_string(&mut v, value.as_bytes());
        v
    }

    /// Literal with incremental indexing, name by index.
    fn lit_inc_idx(index: usize, value: &str) -> Vec<u8> {
        let mut v = Vec::new();
        put_int(&mut v, 0x40, 6, index);
        put_string(&mut v, value.as_bytes());
        v
    }

    /// Literal never indexed, name by index.
    fn lit_never_idx(index: usize, value: &str) -> Vec<u8> {
        let mut v = Vec::new();
        put_int(&mut v, 0x10, 4, index);
        put_string(&mut v, value.as_bytes());
        v
    }

    fn indexed(index: usize) -> Vec<u8> {
        let mut v = Vec::new();
        put_int(&mut v, 0x80, 7, index);
        v
    }

    fn size_update(size: usize) -> Vec<u8> {
        let mut v = Vec::new();
        put_int(&mut v, 0x20, 5, size);
        v
    }

    fn block_of(list: &Fields) -> Vec<u8> {
        let mut b = Vec::new();
        for (n, v) in list {
            b.extend(lit(
                std::str::from_utf8(n).unwrap(),
                std::str::from_utf8(v).unwrap(),
            ));
        }
        b
    }

    fn preface_and_settings() -> Vec<u8> {
        let mut v = PREFACE.to_vec();
        v.extend(frame(0x4, 0, 0, &[]));
        v
    }

    /// A frame as the output stream carries it.
    #[derive(Debug, PartialEq, Eq)]
    struct Frame {
        ty: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    }

    /// Splits an output stream (after the preface) into frames.
    fn frames(mut s: &[u8]) -> Vec<Frame> {
        assert_eq!(&s[..24], PREFACE);
        s = &s[24..];
        let mut out = Vec::new();
        while !s.is_empty() {
            let len = frame_len(s);
            out.push(Frame {
                ty: s[3],
                flags: s[4],
                stream: stream_id(s),
                payload: s[9..9 + len].to_vec(),
            });
            s = &s[9 + len..];
        }
        out
    }

    /// Decodes a block the way a decoder whose dynamic table must stay
    /// empty would: only static indices and literals without indexing are
    /// accepted.
    fn decode_stateless(mut b: &[u8]) -> Fields {
        fn int(b: &mut &[u8], prefix: u8) -> usize {
            let max = (1usize << prefix) - 1;
            let mut v = usize::from(b[0]) & max;
            *b = &b[1..];
            if v < max {
                return v;
            }
            let mut shift = 0;
            loop {
                let x = b[0];
                *b = &b[1..];
                v += usize::from(x & 0x7f) << shift;
                shift += 7;
                if x & 0x80 == 0 {
                    return v;
                }
            }
        }
        fn string(b: &mut &[u8]) -> Vec<u8> {
            assert_eq!(b[0] & 0x80, 0, "Huffman in output");
            let n = int(b, 7);
            let s = b[..n].to_vec();
            *b = &b[n..];
            s
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let first = b[0];
            if first & 0x80 != 0 {
                let i = int(&mut b, 7);
                assert!((1..=61).contains(&i), "dynamic index {i} in output");
                let (n, v) = STATIC_TABLE[i - 1];
                out.push((n.to_vec(), v.to_vec()));
            } else {
                assert_eq!(first & 0xf0, 0, "representation {first:#04x} in output");
                let i = int(&mut b, 4);
                let name = if i == 0 {
                    string(&mut b)
                } else {
                    assert!(i <= 61, "dynamic name index {i} in output");
                    STATIC_TABLE[i - 1].0.to_vec()
                };
                out.push((name, string(&mut b)));
            }
        }
        out
    }

    fn run(input: &[u8]) -> Result<Vec<u8>, Error> {
        let mut f = AuthorityFilter::new();
        let mut out = Vec::new();
        f.process(input, &mut out)?;
        assert!(!f.holds_partial());
        Ok(out)
    }

    /// The header blocks of an output stream, decoded statelessly, with
    /// their stream and END_STREAM; checks the framing rules on the way.
    fn blocks(out: &[u8]) -> Vec<(u32, bool, Fields)> {
        let mut res = Vec::new();
        let mut cur: Option<(u32, bool, Vec<u8>)> = None;
        for f in frames(out) {
            match f.ty {
                TYPE_HEADERS => {
                    assert!(cur.is_none());
                    assert_eq!(f.flags & !(FLAG_END_STREAM | FLAG_END_HEADERS), 0);
                    assert!(f.payload.len() <= OUT_MAX_FRAME);
                    cur = Some((f.stream, f.flags & FLAG_END_STREAM != 0, f.payload));
                }
                TYPE_CONTINUATION => {
                    let c = cur.as_mut().expect("CONTINUATION without HEADERS");
                    assert_eq!(c.0, f.stream);
                    assert_eq!(f.flags & !FLAG_END_HEADERS, 0);
                    assert!(f.payload.len() <= OUT_MAX_FRAME);
                    c.2.extend(f.payload);
                }
                _ => {
                    assert!(cur.is_none(), "frame inside a header block");
                    continue;
                }
            }
            if f.flags & FLAG_END_HEADERS != 0 {
                let (s, es, b) = cur.take().unwrap();
                res.push((s, es, decode_stateless(&b)));
            }
        }
        assert!(cur.is_none());
        res
    }

    fn without_authority(list: &Fields) -> Fields {
        list.iter()
            .filter(|(n, _)| n != b":authority")
            .cloned()
            .collect()
    }

    #[test]
    fn valid_authority_is_kept() {
        for a in ["localhost", "example.com:443", "127.0.0.1:8090", "[::1]:1"] {
            let list = request(a);
            let mut input = preface_and_settings();
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block_of(&list)));
            let out = run(&input).unwrap();
            assert_eq!(blocks(&out), vec![(1, false, list)]);
        }
    }

    #[test]
    fn rejected_authorities_are_dropped() {
        for a in [
            PERCENT,
            "/tmp/x.sock",
            "",
            "a b",
            "a/b",
            "[::1",
            "\u{e9}.example",
        ] {
            assert!(http::uri::Authority::try_from(a).is_err(), "{a}");
            let list = request(a);
            let mut input = preface_and_settings();
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &block_of(&list)));
            let mut f = AuthorityFilter::new();
            let mut out = Vec::new();
            f.process(&input, &mut out).unwrap();
            assert_eq!(f.dropped_authorities(), 1);
            assert_eq!(blocks(&out), vec![(3, false, without_authority(&list))]);
        }
    }

    #[test]
    fn other_frames_pass_untouched_and_are_skipped() {
        let mut input = preface_and_settings();
        input.extend(frame(0x8, 0, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
        input.extend(frame(0x0, 0, 1, &[7u8; 1000])); // DATA
        input.extend(frame(0x6, 0, 0, &[1; 8])); // PING
        input.extend(frame(0xfa, 0x3, 9, b"unknown type")); // unknown
        input.extend(frame(0x0, 0x1, 1, &[])); // empty DATA, END_STREAM
        let mut f = AuthorityFilter::new();
        assert_eq!(f.pass_len(), 24);
        assert_eq!(f.skip(&input), input.len());
        assert!(f.may_pass());
        assert_eq!(run(&input).unwrap(), input);
    }

    #[test]
    fn skip_stops_at_a_header_frame_and_at_a_partial_frame_header() {
        let mut input = preface_and_settings();
        let data = frame(0x0, 0, 1, &[1; 100]);
        input.extend(&data);
        let at_headers = input.len();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &block_of(&request("a")),
        ));
        let mut f = AuthorityFilter::new();
        assert_eq!(f.skip(&input), at_headers);
        assert!(f.may_pass());
        let mut f = AuthorityFilter::new();
        // Part of the DATA frame header only: nothing decided on it.
        let cut = at_headers - data.len() + 4;
        assert_eq!(f.skip(&input[..cut]), cut - 4);
        let mut out = Vec::new();
        assert_eq!(f.feed(&input[cut - 4..cut], &mut out), Ok(4));
        assert!(out.is_empty() && !f.may_pass() && f.holds_partial());
        // The rest of it: the held header comes out, the payload is skip's.
        assert_eq!(f.feed(&input[cut..], &mut out), Ok(5));
        assert_eq!(out, &data[..9]);
        assert_eq!(f.pass_len(), 100);
        assert_eq!(f.skip(&input[cut + 5..]), 100);
    }

    #[test]
    fn dynamic_table_across_blocks() {
        // Block 1: the client indexes a bad :authority (static name 1), a
        // custom field and a good one; index 62 is the newest entry.
        let mut b1 = Vec::new();
        b1.extend(indexed(3)); // :method POST
        b1.extend(indexed(6)); // :scheme http
        b1.extend(lit_inc_idx(4, "/ProxyService/Proxy"));
        b1.extend(lit_inc_idx(1, PERCENT));
        b1.extend(lit_inc("x-custom", "v1"));
        b1.extend(lit_inc_idx(31, "application/grpc"));
        // Table now (newest first): 62 content-type, 63 x-custom,
        // 64 :authority, 65 :path.
        let mut b2 = Vec::new();
        b2.extend(indexed(3));
        b2.extend(indexed(6));
        b2.extend(indexed(65));
        b2.extend(indexed(64)); // the bad :authority again, by reference
        b2.extend(lit_never_idx(63, "v2")); // name by dynamic index
        b2.extend(indexed(62));
        // Block 3: table emptied by a size update to 0 and resized; then
        // new entries, referenced within the same block.
        let mut b3 = size_update(0);
        b3.extend(size_update(4096));
        b3.extend(indexed(3));
        b3.extend(indexed(6));
        b3.extend(lit_inc_idx(1, "good.example:8090"));
        b3.extend(indexed(62));
        b3.extend(lit_inc_idx(4, "/p"));
        b3.extend(lit_inc("x-other", "1"));
        b3.extend(indexed(62));
        // Block 4: a size update too small to keep everything evicts.
        let mut b4 = size_update(60);
        b4.extend(indexed(62)); // x-other: 1 (40 bytes) survives
        let mut input = preface_and_settings();
        for (i, b) in [&b1, &b2, &b3, &b4].into_iter().enumerate() {
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 2 * i as u32 + 1, b));
        }
        let mut f = AuthorityFilter::new();
        let mut out = Vec::new();
        f.process(&input, &mut out).unwrap();
        assert_eq!(f.dropped_authorities(), 2);
        assert_eq!(f.header_blocks(), 4);
        let got = blocks(&out);
        let rq = |path: &str| fields(&[(":method", "POST"), (":scheme", "http"), (":path", path)]);
        let mut w1 = rq("/ProxyService/Proxy");
        w1.extend(fields(&[
            ("x-custom", "v1"),
            ("content-type", "application/grpc"),
        ]));
        let mut w2 = rq("/ProxyService/Proxy");
        w2.extend(fields(&[
            ("x-custom", "v2"),
            ("content-type", "application/grpc"),
        ]));
        let w3 = fields(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "good.example:8090"),
            (":authority", "good.example:8090"),
            (":path", "/p"),
            ("x-other", "1"),
            ("x-other", "1"),
        ]);
        let w4 = fields(&[("x-other", "1")]);
        assert_eq!(
            got,
            vec![
                (1, false, w1),
                (3, false, w2),
                (5, false, w3),
                (7, false, w4)
            ]
        );
        // Evicted entries are gone: index 63 no longer exists.
        let mut bad = input.clone();
        bad.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 9, &indexed(63)));
        assert!(matches!(run(&bad), Err(Error::Hpack(_))));
        // A size update above the advertised table size is an error.
        let mut bad = preface_and_settings();
        bad.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &size_update(4097)));
        assert!(matches!(run(&bad), Err(Error::Hpack(_))));
    }

    #[test]
    fn rfc7541_huffman_examples() {
        // RFC 7541 C.4.1-C.4.3: requests with Huffman coding, each block
        // referencing entries the previous ones added.
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let b1 = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        let b2 = hex("8286 84be 5886 a8eb 1064 9cbf");
        let b3 = hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 8925 a849 e95b b8e8 b4bf");
        let mut input = preface_and_settings();
        for (i, b) in [b1, b2, b3].iter().enumerate() {
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 2 * i as u32 + 1, b));
        }
        let got = blocks(&run(&input).unwrap());
        let base = |scheme: &str, path: &str| {
            fields(&[
                (":method", "GET"),
                (":scheme", scheme),
                (":path", path),
                (":authority", "www.example.com"),
            ])
        };
        let w1 = base("http", "/");
        let mut w2 = base("http", "/");
        w2.extend(fields(&[("cache-control", "no-cache")]));
        let mut w3 = base("https", "/index.html");
        w3.extend(fields(&[("custom-key", "custom-value")]));
        assert_eq!(got, vec![(1, false, w1), (3, false, w2), (5, false, w3)]);
    }

    #[test]
    fn continuation_frames_are_joined_and_large_blocks_split() {
        let mut list = request(PERCENT);
        let big = "x".repeat(40_000);
        list.push((b"x-big".to_vec(), big.clone().into_bytes()));
        let block = block_of(&list);
        // In: HEADERS + 4 CONTINUATION of arbitrary sizes, on stream 5.
        let cuts = [0, 7, 20_000, 20_001, 39_000, block.len()];
        let mut input = preface_and_settings();
        for w in cuts.windows(2) {
            let (ty, first) = if w[0] == 0 {
                (TYPE_HEADERS, true)
            } else {
                (TYPE_CONTINUATION, false)
            };
            let mut flags = if w[1] == block.len() {
                FLAG_END_HEADERS
            } else {
                0
            };
            if first {
                flags |= FLAG_END_STREAM;
            }
            input.extend(frame(ty, flags, 5, &block[w[0]..w[1]]));
        }
        input.extend(frame(0x0, 0, 5, b"after"));
        let out = run(&input).unwrap();
        let fr = frames(&out);
        // 40 KiB re-encoded: HEADERS, CONTINUATION, CONTINUATION, then DATA.
        let kinds: Vec<(u8, u8, usize)> = fr
            .iter()
            .skip(1)
            .map(|f| (f.ty, f.flags, f.payload.len()))
            .collect();
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        assert_eq!(kinds[0], (TYPE_HEADERS, FLAG_END_STREAM, OUT_MAX_FRAME));
        assert_eq!(kinds[1], (TYPE_CONTINUATION, 0, OUT_MAX_FRAME));
        assert_eq!(
            (kinds[2].0, kinds[2].1),
            (TYPE_CONTINUATION, FLAG_END_HEADERS)
        );
        assert_eq!(kinds[3], (0x0, 0, 5));
        assert_eq!(blocks(&out), vec![(5, true, without_authority(&list))]);
    }

    #[test]
    fn end_stream_is_kept_and_trailers_rewritten() {
        let list = request("localhost");
        let mut input = preface_and_settings();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &block_of(&list),
        ));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &block_of(&list)));
        input.extend(frame(0x0, 0, 3, b"body"));
        let trailers = fields(&[("grpc-status", "0")]);
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &block_of(&trailers),
        ));
        let out = run(&input).unwrap();
        assert_eq!(
            blocks(&out),
            vec![
                (1, true, list.clone()),
                (3, false, list),
                (3, true, trailers)
            ]
        );
    }

    #[test]
    fn padding_and_priority_are_removed() {
        let list = request(PERCENT);
        let block = block_of(&list);
        let mut payload = vec![3u8]; // pad length
        payload.extend([0x80, 0, 0, 0, 16]); // exclusive, depends on 0, weight 16
        payload.extend(&block[..10]);
        payload.extend([0, 0, 0]);
        let mut input = preface_and_settings();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            1,
            &payload,
        ));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &block[10..]));
        // Padded only, with an empty fragment and the whole block after.
        let mut payload = vec![2u8, 0, 0];
        let mut p2 = frame(TYPE_HEADERS, FLAG_PADDED, 3, &payload);
        p2.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &block));
        input.extend(p2);
        let out = run(&input).unwrap();
        let want = without_authority(&list);
        assert_eq!(
            blocks(&out),
            vec![(1, true, want.clone()), (3, false, want)]
        );
        for f in frames(&out).iter().filter(|f| f.ty == TYPE_HEADERS) {
            assert_eq!(f.flags & (FLAG_PADDED | FLAG_PRIORITY), 0);
        }
        // Padding longer than the payload, or a missing pad length.
        payload = vec![5u8, 1, 2];
        let mut bad = preface_and_settings();
        bad.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_END_HEADERS,
            1,
            &payload,
        ));
        assert!(matches!(run(&bad), Err(Error::Frame(_))));
        let mut bad = preface_and_settings();
        bad.extend(frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[]));
        assert!(matches!(run(&bad), Err(Error::Frame(_))));
        let mut bad = preface_and_settings();
        bad.extend(frame(
            TYPE_HEADERS,
            FLAG_PRIORITY | FLAG_END_HEADERS,
            1,
            &[0, 0],
        ));
        assert!(matches!(run(&bad), Err(Error::Frame(_))));
    }

    /// A stream with a bit of everything, for the splitting tests.
    fn mixed_stream() -> Vec<u8> {
        let mut input = preface_and_settings();
        input.extend(frame(0x8, 0, 0, &[0, 1, 0, 0]));
        let mut b1 = Vec::new();
        b1.extend(indexed(3));
        b1.extend(indexed(6));
        b1.extend(lit_inc_idx(4, "/ProxyService/Proxy"));
        b1.extend(lit_inc_idx(1, PERCENT));
        b1.extend(lit_inc("te", "trailers"));
        input.extend(frame(TYPE_HEADERS, 0, 1, &b1[..5]));
        input.extend(frame(TYPE_CONTINUATION, 0, 1, &b1[5..9]));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &b1[9..]));
        input.extend(frame(0x0, 0, 1, &[9; 300]));
        let mut b2 = indexed(3);
        b2.extend(indexed(6));
        b2.extend(indexed(64));
        b2.extend(indexed(63));
        b2.extend(indexed(62));
        let mut p = vec![4u8];
        p.extend(&b2);
        p.extend([0; 4]);
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &p,
        ));
        input.extend(frame(0x6, 0, 0, &[2; 8]));
        input.extend(frame(0x0, 0x1, 1, &[8; 17]));
        input
    }

    #[test]
    fn any_split_gives_the_same_output() {
        let input = mixed_stream();
        let whole = run(&input).unwrap();
        assert_eq!(blocks(&whole).len(), 2);
        for cut in 0..=input.len() {
            let mut f = AuthorityFilter::new();
            let mut out = Vec::new();
            f.process(&input[..cut], &mut out).unwrap();
            f.process(&input[cut..], &mut out).unwrap();
            assert_eq!(out, whole, "cut at {cut}");
        }
        // One byte at a time, alternating skip and feed by hand.
        let mut f = AuthorityFilter::new();
        let mut out = Vec::new();
        for b in input.chunks(1) {
            let n = f.skip(b);
            out.extend_from_slice(&b[..n]);
            if n == 0 {
                assert_eq!(f.feed(b, &mut out), Ok(1));
            }
        }
        assert_eq!(out, whole);
        // Three pieces at many places.
        for a in (0..input.len()).step_by(7) {
            for b in (a..input.len()).step_by(13) {
                let mut f = AuthorityFilter::new();
                let mut out = Vec::new();
                for piece in [&input[..a], &input[a..b], &input[b..]] {
                    f.process(piece, &mut out).unwrap();
                }
                assert_eq!(out, whole, "cuts at {a}, {b}");
            }
        }
    }

    #[test]
    fn oversize_blocks_and_lists_are_errors() {
        let limits = Limits {
            max_block: 1000,
            max_list: 2000,
            max_table_size: 4096,
        };
        // HEADERS + CONTINUATION adding up to more than max_block.
        let mut input = preface_and_settings();
        input.extend(frame(TYPE_HEADERS, 0, 1, &[0x82; 600]));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82; 401]));
        let mut f = AuthorityFilter::with_limits(limits);
        let mut out = Vec::new();
        assert_eq!(
            f.process(&input, &mut out),
            Err(Error::BlockTooLarge { max: 1000 })
        );
        // Sticky.
        assert_eq!(
            f.feed(b"x", &mut out),
            Err(Error::BlockTooLarge { max: 1000 })
        );
        assert!(f.error().is_some());
        // A small block that references a big dynamic entry many times.
        let mut b = lit_inc("x-big", &"v".repeat(500));
        b.extend(indexed(62));
        b.extend(indexed(62));
        b.extend(indexed(62));
        let mut input = preface_and_settings();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &b));
        let mut f = AuthorityFilter::with_limits(limits);
        assert_eq!(
            f.process(&input, &mut Vec::new()),
            Err(Error::ListTooLarge { max: 2000 })
        );
        // The default block limit is 256 KiB.
        let mut input = preface_and_settings();
        input.extend(frame(TYPE_HEADERS, 0, 1, &[0x82; 200_000]));
        input.extend(frame(
            TYPE_CONTINUATION,
            FLAG_END_HEADERS,
            1,
            &[0x82; 70_000],
        ));
        assert_eq!(run(&input), Err(Error::BlockTooLarge { max: 256 * 1024 }));
    }

    #[test]
    fn framing_errors() {
        let block = block_of(&request("a"));
        let cases: Vec<Vec<u8>> = vec![
            // DATA inside a header block.
            [frame(TYPE_HEADERS, 0, 1, &block), frame(0x0, 0, 1, b"x")].concat(),
            // CONTINUATION for another stream.
            [
                frame(TYPE_HEADERS, 0, 1, &block),
                frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[]),
            ]
            .concat(),
            // CONTINUATION out of nowhere.
            frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &block),
            // PUSH_PROMISE from a client.
            frame(TYPE_PUSH_PROMISE, FLAG_END_HEADERS, 1, &[0, 0, 0, 2]),
        ];
        for c in cases {
            let mut input = preface_and_settings();
            input.extend(c);
            assert!(matches!(run(&input), Err(Error::Frame(_))), "{input:?}");
        }
        // Bad HPACK: an index past the tables, a truncated string.
        for b in [indexed(70), vec![0x00, 0x05, b'a']] {
            let mut input = preface_and_settings();
            input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &b));
            assert!(matches!(run(&input), Err(Error::Hpack(_))));
        }
    }

    #[test]
    fn trailing_size_update_is_accepted() {
        let mut b = block_of(&request("localhost"));
        b.extend(size_update(100));
        let mut input = preface_and_settings();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &b));
        assert_eq!(
            blocks(&run(&input).unwrap()),
            vec![(1, false, request("localhost"))]
        );
    }

    #[test]
    fn held_bytes_are_reported() {
        let mut input = preface_and_settings();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &block_of(&request("a")),
        ));
        let mut f = AuthorityFilter::new();
        let mut out = Vec::new();
        f.process(&input[..input.len() - 1], &mut out).unwrap();
        assert!(f.holds_partial());
        f.process(&input[input.len() - 1..], &mut out).unwrap();
        assert!(!f.holds_partial());
    }

    #[test]
    fn encoder_uses_static_entries_and_long_integers() {
        let mut out = Vec::new();
        encode_field(&mut out, b":method", b"POST");
        encode_field(&mut out, b":path", b"/x");
        encode_field(&mut out, b":authority", b"");
        encode_field(&mut out, b"x", &[b'y'; 300]);
        assert_eq!(&out[..5], &[0x83, 0x04, 0x02, b'/', b'x']);
        assert_eq!(out[5], 0x81);
        // New name, then a 300-byte value: 127 + 173 = 0x7f, 0xad, 0x01.
        assert_eq!(&out[6..12], &[0x00, 0x01, b'x', 0x7f, 0xad, 0x01]);
        assert_eq!(
            decode_stateless(&out),
            vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":path".to_vec(), b"/x".to_vec()),
                (b":authority".to_vec(), b"".to_vec()),
                (b"x".to_vec(), vec![b'y'; 300]),
            ]
        );
        // And loona-hpack reads it the same.
        let mut d = loona_hpack::Decoder::new();
        assert_eq!(d.decode(&out).unwrap(), decode_stateless(&out));
    }
}
