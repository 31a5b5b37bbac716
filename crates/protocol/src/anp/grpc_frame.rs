//! gRPC length-prefixed message framing (sans-I/O).
//!
//! Every gRPC message on an HTTP/2 stream is `flag:u8 | length:u32be | message`.
//! [`FrameDecoder`] takes the stream's DATA chunks as they arrive (split or
//! coalesced arbitrarily) and yields whole messages. A message that lies inside
//! one chunk is returned as a slice of that chunk (no copy); only a message that
//! straddles chunks is gathered into a new buffer. ANP Packets are read with
//! [`crate::packet_decoder::PacketDecoder`] instead, which hands a DATA
//! packet's payload on as the chunks' own slices.
//!
//! Memory is bounded by the caller draining [`FrameDecoder::next_message`]
//! after each push: a declared length above `max_message` is an error before
//! any of its body is buffered.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

/// Size of the gRPC message prefix.
pub const HEADER_LEN: usize = 5;

/// Default largest message accepted (the gRPC-Go default receive limit).
pub const DEFAULT_MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Why a byte stream is not a valid sequence of gRPC messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("gRPC message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("compressed gRPC message received but no compression was negotiated")]
    CompressionNotNegotiated,
    #[error("invalid gRPC compressed-flag byte {0:#04x}")]
    BadFlag(u8),
    #[error("stream ended inside a gRPC message ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
}

/// The most bytes [`FrameDecoder::compact`] copies out of their chunks.
pub const COMPACT_MAX: usize = 1024;

/// Incremental decoder for a stream of gRPC messages.
#[derive(Debug)]
pub struct FrameDecoder {
    chunks: VecDeque<Bytes>,
    buffered: usize,
    /// At most `u32::MAX - 1` (a gRPC length is 32 bits).
    max_message: u32,
    /// Length of the message whose header has been consumed, or
    /// [`NO_MESSAGE`]. Kept as 32 bits with a sentinel, not an
    /// `Option<usize>`, so that the decoder is 48 bytes: it sits inline in
    /// every gRPC stream's task (see `an_idle_callers_tasks_stay_small`).
    pending_len: u32,
}

/// `pending_len` when no message is started (above any `max_message`).
const NO_MESSAGE: u32 = u32::MAX;

impl FrameDecoder {
    pub fn new(max_message: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            buffered: 0,
            max_message: max_message.min(NO_MESSAGE as usize - 1) as u32,
            pending_len: NO_MESSAGE,
        }
    }

    /// Bytes received but not yet returned as messages.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// Appends a chunk of the stream.
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.buffered += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    /// Gives back the chunk queue's room when nothing is buffered: a
    /// stream that waits for its peer (an idle tunnel) holds none. Called
    /// when the input runs dry, so a busy stream reallocates at most once
    /// per read, not per chunk.
    pub fn release_if_empty(&mut self) {
        if self.chunks.is_empty() && self.chunks.capacity() > 0 {
            self.chunks = VecDeque::new();
        }
    }

    /// Called when the input runs dry: gives the room back when nothing is
    /// buffered ([`Self::release_if_empty`]), and copies a few bytes kept
    /// (at most [`COMPACT_MAX`]: a message's prefix or start) out of the
    /// chunks they came in, so that they do not keep those chunks alive.
    pub fn compact(&mut self) {
        if self.buffered == 0 || self.buffered > COMPACT_MAX {
            self.release_if_empty();
            return;
        }
        let mut joined = BytesMut::with_capacity(self.buffered);
        for c in self.chunks.drain(..) {
            joined.extend_from_slice(&c);
        }
        self.chunks = VecDeque::from([joined.freeze()]);
    }

    /// Call at end of stream: an error if a message was cut short.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffered == 0 && self.pending_len == NO_MESSAGE {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buffered,
            })
        }
    }

    /// Returns the next whole message, `Ok(None)` if more input is needed.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, FrameError> {
        let Some(len) = self.start_message()? else {
            return Ok(None);
        };
        if self.buffered < len {
            return Ok(None);
        }
        self.pending_len = NO_MESSAGE;
        self.buffered -= len;
        Ok(Some(self.take(len)))
    }

    /// The length of the message at the front, its prefix consumed (and
    /// checked) on the first call; `Ok(None)` until the prefix is here.
    pub(crate) fn start_message(&mut self) -> Result<Option<usize>, FrameError> {
        if self.pending_len != NO_MESSAGE {
            return Ok(Some(self.pending_len as usize));
        }
        if self.buffered < HEADER_LEN {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        self.peek(&mut header);
        self.skip(HEADER_LEN);
        match header[0] {
            0 => {}
            1 => return Err(FrameError::CompressionNotNegotiated),
            other => return Err(FrameError::BadFlag(other)),
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        if len > self.max_message {
            return Err(FrameError::TooLarge {
                len: len as usize,
                max: self.max_message as usize,
            });
        }
        self.pending_len = len;
        Ok(Some(len as usize))
    }

    /// The message started by [`Self::start_message`] is no longer this
    /// decoder's: the caller takes its bytes with [`Self::skip`] and
    /// [`Self::take_piece`].
    pub(crate) fn hand_off_message(&mut self) {
        self.pending_len = NO_MESSAGE;
    }

    /// Copies up to `out.len()` bytes from the front without consuming
    /// them (prefix and packet header bytes only); how many were copied.
    pub(crate) fn peek(&self, out: &mut [u8]) -> usize {
        let mut filled = 0;
        for chunk in &self.chunks {
            if filled == out.len() {
                break;
            }
            let n = chunk.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&chunk[..n]);
            filled += n;
        }
        filled
    }

    /// Drops `n` buffered bytes from the front (`n` <= [`Self::buffered`]).
    pub(crate) fn skip(&mut self, mut n: usize) {
        self.buffered -= n;
        while n > 0 {
            let front = self.chunks.front_mut().expect("buffered count is exact");
            let k = front.len().min(n);
            front.advance(k);
            n -= k;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    /// Up to `max` bytes from the front, as a slice of the chunk they sit
    /// in (never a copy); `None` when nothing is buffered.
    pub(crate) fn take_piece(&mut self, max: usize) -> Option<Bytes> {
        let front = self.chunks.front_mut()?;
        let piece = if front.len() <= max {
            self.chunks.pop_front().expect("a front chunk")
        } else {
            front.split_to(max)
        };
        self.buffered -= piece.len();
        Some(piece)
    }

    /// Takes `len` bytes from the front: a zero-copy slice when they sit in
    /// one chunk.
    fn take(&mut self, len: usize) -> Bytes {
        if len == 0 {
            return Bytes::new();
        }
        let front = self.chunks.front_mut().expect("buffered count is exact");
        if front.len() >= len {
            let out = front.split_to(len);
            if front.is_empty() {
                self.chunks.pop_front();
            }
            return out;
        }
        let mut out = BytesMut::with_capacity(len);
        while out.len() < len {
            let front = self.chunks.front_mut().expect("buffered count is exact");
            let n = front.len().min(len - out.len());
            out.extend_from_slice(&front[..n]);
            front.advance(n);
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
        out.freeze()
    }
}

/// The 5-byte prefix of an uncompressed message of `len` bytes.
pub fn header(len: usize) -> [u8; HEADER_LEN] {
    let l = u32::try_from(len).expect("gRPC messages are < 4 GiB");
    let b = l.to_be_bytes();
    [0, b[0], b[1], b[2], b[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(msgs: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            out.extend_from_slice(&header(m.len()));
            out.extend_from_slice(m);
        }
        out
    }

    #[test]
    fn coalesced_and_empty_messages() {
        let mut d = FrameDecoder::new(100);
        d.push(Bytes::from(framed(&[b"abc", b"", b"hello"])));
        assert_eq!(d.next_message().unwrap().unwrap(), &b"abc"[..]);
        assert_eq!(d.next_message().unwrap().unwrap(), &b""[..]);
        assert_eq!(d.next_message().unwrap().unwrap(), &b"hello"[..]);
        assert_eq!(d.next_message().unwrap(), None);
        d.finish().unwrap();
    }

    #[test]
    fn a_few_bytes_kept_are_copied_out_of_their_chunks() {
        let wire = framed(&[&[7u8; 100_000], b"tail message"]);
        let big = Bytes::from(wire[..100_010].to_vec());
        let range = big.as_ptr() as usize..big.as_ptr() as usize + big.len();
        let mut d = FrameDecoder::new(1 << 20);
        d.push(big);
        assert_eq!(d.next_message().unwrap().unwrap().len(), 100_000);
        // 5 bytes of the next message are left, in the 100 KB chunk.
        assert_eq!(d.buffered(), 5);
        d.compact();
        let kept = d.chunks.front().unwrap();
        assert!(!range.contains(&(kept.as_ptr() as usize)), "copied out");
        d.push(Bytes::copy_from_slice(&wire[100_010..]));
        assert_eq!(d.next_message().unwrap().unwrap(), &b"tail message"[..]);
        // More than COMPACT_MAX kept: left where it is.
        let mut d = FrameDecoder::new(1 << 20);
        let part = Bytes::from(wire[..COMPACT_MAX + 100].to_vec());
        let at = part.as_ptr() as usize;
        d.push(part);
        d.compact();
        assert_eq!(d.chunks.front().unwrap().as_ptr() as usize, at);
    }

    #[test]
    fn an_emptied_decoder_gives_its_room_back() {
        let wire = framed(&[b"first", b"second"]);
        let mut d = FrameDecoder::new(100);
        d.push(Bytes::copy_from_slice(&wire[..8]));
        d.push(Bytes::copy_from_slice(&wire[8..]));
        assert_eq!(d.next_message().unwrap().unwrap(), &b"first"[..]);
        // Bytes still buffered: the room stays.
        d.release_if_empty();
        assert!(d.chunks.capacity() > 0);
        assert_eq!(d.next_message().unwrap().unwrap(), &b"second"[..]);
        d.release_if_empty();
        assert_eq!(d.chunks.capacity(), 0, "an idle decoder holds no room");
        // And it decodes on afterwards.
        d.push(Bytes::from(framed(&[b"third"])));
        assert_eq!(d.next_message().unwrap().unwrap(), &b"third"[..]);
    }

    #[test]
    fn byte_at_a_time() {
        let wire = framed(&[b"first message", b"second"]);
        let mut d = FrameDecoder::new(100);
        let mut got = Vec::new();
        for b in wire {
            d.push(Bytes::copy_from_slice(&[b]));
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![&b"first message"[..], &b"second"[..]]);
    }

    #[test]
    fn message_inside_one_chunk_is_not_copied() {
        let chunk = Bytes::from(framed(&[b"payload bytes"]));
        let start = chunk.as_ptr() as usize;
        let mut d = FrameDecoder::new(100);
        d.push(chunk.clone());
        let m = d.next_message().unwrap().unwrap();
        assert_eq!(m.as_ptr() as usize, start + HEADER_LEN);
    }

    #[test]
    fn oversized_is_rejected_before_buffering_body() {
        let mut d = FrameDecoder::new(10);
        d.push(Bytes::copy_from_slice(&header(11)));
        assert_eq!(
            d.next_message(),
            Err(FrameError::TooLarge { len: 11, max: 10 })
        );
    }

    #[test]
    fn compressed_and_bad_flags() {
        let mut d = FrameDecoder::new(10);
        d.push(Bytes::from_static(&[1, 0, 0, 0, 1, 0]));
        assert_eq!(d.next_message(), Err(FrameError::CompressionNotNegotiated));
        let mut d = FrameDecoder::new(10);
        d.push(Bytes::from_static(&[7, 0, 0, 0, 0]));
        assert_eq!(d.next_message(), Err(FrameError::BadFlag(7)));
    }

    #[test]
    fn truncated_stream_is_reported() {
        let mut d = FrameDecoder::new(10);
        d.push(Bytes::from_static(&[0, 0, 0, 0, 4, 1]));
        assert_eq!(d.next_message().unwrap(), None);
        assert!(matches!(d.finish(), Err(FrameError::Truncated { .. })));
    }
}
