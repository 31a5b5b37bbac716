//! A stream's received DATA until the caller takes it: copied out of the
//! caller's read buffer into blocks of the stream's own, so that what a
//! stream holds is what the client sent on it (counted against the windows
//! we granted) and nothing else.
//!
//! Slices of the read buffer (as the h2 crate hands DATA on) keep that
//! whole buffer alive: a client that sends 4 KiB DATA frames each among
//! other frames (ignored ones, padding, other streams) made every 4 KiB of
//! window hold a 64 KiB read buffer, 16 times the window (issue 39, finding
//! 4). Go's `net/http2` and grpc-go copy DATA payload out of their read
//! buffers in the same way.
//!
//! A piece that arrives while the stream holds nothing gets a block of its
//! own size (the caller usually takes it at once); pieces that arrive
//! behind others are packed into blocks of at least [`BLOCK`] bytes, so
//! that a stream holds at most its queued bytes, one partly filled block
//! and a slot per block, whatever the frame sizes.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// The least size of a block that packs pieces behind others: a frame of
/// grpc-go's (16 KiB) fills one.
const BLOCK: usize = 16 * 1024;

#[derive(Debug, Default)]
pub(super) struct RecvBuffer {
    blocks: VecDeque<BytesMut>,
    len: usize,
}

impl RecvBuffer {
    /// Bytes held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Copies `data` in after what is held.
    pub(super) fn push(&mut self, mut data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.len += data.len();
        if let Some(back) = self.blocks.back_mut() {
            let n = (back.capacity() - back.len()).min(data.len());
            back.extend_from_slice(&data[..n]);
            data = &data[n..];
            if data.is_empty() {
                return;
            }
        }
        let size = if self.blocks.is_empty() {
            data.len()
        } else {
            data.len().max(BLOCK)
        };
        let mut block = BytesMut::with_capacity(size);
        block.extend_from_slice(data);
        self.blocks.push_back(block);
    }

    /// The oldest block; the queue's room is given back once it is empty.
    pub(super) fn pop(&mut self) -> Option<Bytes> {
        let block = self.blocks.pop_front()?;
        if self.blocks.is_empty() {
            self.blocks = VecDeque::new();
        }
        self.len -= block.len();
        Some(block.freeze())
    }

    /// Drops everything held; how many bytes that was.
    pub(super) fn clear(&mut self) -> usize {
        let n = self.len;
        *self = RecvBuffer::default();
        n
    }

    /// Bytes allocated for what is held (blocks and their slots).
    pub(super) fn allocated(&self) -> usize {
        self.blocks.iter().map(BytesMut::capacity).sum::<usize>()
            + self.blocks.capacity() * std::mem::size_of::<BytesMut>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_alone_gets_a_block_of_its_size_and_later_ones_are_packed() {
        let mut r = RecvBuffer::default();
        r.push(b"abc");
        assert_eq!(r.allocated() - 4 * std::mem::size_of::<BytesMut>(), 3);
        // 1,000 one-byte pieces behind it share one block.
        for _ in 0..1_000 {
            r.push(b"x");
        }
        assert_eq!(r.len(), 1_003);
        assert_eq!(r.blocks.len(), 2);
        assert_eq!(r.pop().unwrap(), Bytes::from_static(b"abc"));
        assert_eq!(r.pop().unwrap().len(), 1_000);
        assert_eq!(r.pop(), None);
        assert_eq!(r.allocated(), 0, "an emptied buffer holds no room");
    }

    #[test]
    fn what_is_held_stays_within_its_bytes_and_one_block() {
        let mut r = RecvBuffer::default();
        let mut total = 0;
        for n in [1usize, 4096, 7, 16_384, 100_000, 3, 262_144, 9] {
            r.push(&vec![1u8; n]);
            total += n;
            let slots = r.blocks.capacity() * std::mem::size_of::<BytesMut>();
            assert!(
                r.allocated() - slots <= total + BLOCK,
                "{} for {total}",
                r.allocated()
            );
        }
        assert_eq!(r.clear(), total);
        assert_eq!(r.allocated(), 0);
    }
}
