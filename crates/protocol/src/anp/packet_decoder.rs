//! A stream of gRPC messages to ANP Packets (sans-I/O), with DATA payload
//! handed on as the received chunks' own slices.
//!
//! HTTP/2 cuts a stream into DATA frames, and reads cut frames further:
//! grpc-go sends frames of at most 16 KiB (`http2MaxFrameLen` in
//! `internal/transport/http_util.go`, used as the frame limit by
//! `processData` in `internal/transport/controlbuf.go`), so most DATA
//! packets of a konnectivity-client upload (ANP
//! `konnectivity-client/pkg/client/conn.go` `Write`: one packet per
//! write) span chunks. Joining them into one buffer to decode the Packet
//! copied every payload byte once more (9.2 % of the CPU of a 1-stream
//! gRPC upload, `benches/results/compare/anchors/PROFILE.md`).
//!
//! [`PacketDecoder`] reads the Packet's header instead: a DATA packet laid
//! out as every encoder we know writes it (`Packet{type: DATA(1), data(4):
//! Data{connectID(1), data(3)}}`, fields in number order as protobuf-go
//! marshals them, `internal/impl/codec_message.go` `orderedCoderFields`;
//! prost does the same) is given out as one `Frame::Data` per slice of its
//! payload, as those slices arrive. Any other message (control packets,
//! DATA with an error text, fields out of order, unknown fields) is
//! gathered whole and decoded by prost, as before.
//!
//! So a split of the input changes only where one DATA packet's payload is
//! cut into pieces, never the bytes of a connection, the order of packets
//! or an error. Memory stays bounded by the chunks not yet handed out: a
//! length prefix above `max_message` is an error before anything of its
//! body is kept, and a streamed payload is never held back.

use bytes::Bytes;

use crate::anp::grpc_frame::{FrameDecoder, FrameError};
use crate::anp::packet::{self, Frame, PacketError};
use crate::anp::pb::{Data, PacketType};

/// The longest DATA header read before the payload: the Packet's type
/// (2 bytes), the Data field's tag and length (1 + 5), connectID (1 + 10)
/// and the data field's tag and length (1 + 5).
const MAX_DATA_HEAD: usize = 32;

/// Incremental decoder of a gRPC stream of Packets.
#[derive(Debug)]
pub struct PacketDecoder {
    frames: FrameDecoder,
    /// The DATA packet whose payload is being handed out, while `left` > 0
    /// (flat fields, not an `Option` of a struct: 64 bytes in all, as the
    /// `FrameDecoder` alone was, inline in every gRPC stream's task).
    connect_id: i64,
    /// Its payload bytes still to come (a gRPC length is 32 bits); 0 when
    /// no DATA packet is being handed out.
    left: u32,
    /// A piece of it was handed out already.
    given: bool,
    /// The last packet handed out was a later piece of a DATA packet.
    continued: bool,
}

impl PacketDecoder {
    pub fn new(max_message: usize) -> Self {
        Self {
            frames: FrameDecoder::new(max_message),
            connect_id: 0,
            left: 0,
            given: false,
            continued: false,
        }
    }

    /// Bytes received but not yet handed out.
    pub fn buffered(&self) -> usize {
        self.frames.buffered()
    }

    /// Whether the last packet handed out continues the one before it: a
    /// later piece of the same DATA packet's payload, not a packet the
    /// peer sent (for counting packets).
    pub fn continued(&self) -> bool {
        self.continued
    }

    /// Appends a chunk of the stream.
    pub fn push(&mut self, chunk: Bytes) {
        self.frames.push(chunk);
    }

    /// See [`FrameDecoder::compact`].
    pub fn compact(&mut self) {
        self.frames.compact();
    }

    /// Call at end of stream: an error if a message was cut short.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.left > 0 {
            Err(FrameError::Truncated {
                buffered: self.frames.buffered(),
            })
        } else {
            self.frames.finish()
        }
    }

    /// The next packet (or piece of a DATA packet's payload); `Ok(None)`
    /// if more input is needed. The outer error ends the stream; the inner
    /// one is a message that is not a usable Packet (consumed: the caller
    /// may go on, e.g. past a type it does not know).
    pub fn next_packet(&mut self) -> Result<Option<Result<Frame, PacketError>>, FrameError> {
        if self.left > 0 {
            let Some(piece) = self.frames.take_piece(self.left as usize) else {
                return Ok(None);
            };
            self.continued = self.given;
            self.given = true;
            self.left -= piece.len() as u32;
            return Ok(Some(Ok(data_piece(self.connect_id, piece))));
        }
        let Some(len) = self.frames.start_message()? else {
            return Ok(None);
        };
        let want = len.min(MAX_DATA_HEAD);
        if self.frames.buffered() < want {
            return Ok(None);
        }
        let mut head = [0u8; MAX_DATA_HEAD];
        let head = &mut head[..want];
        self.frames.peek(head);
        if let Some((connect_id, head_len)) = data_head(head, len) {
            self.frames.hand_off_message();
            self.frames.skip(head_len);
            self.connect_id = connect_id;
            self.left = (len - head_len) as u32;
            self.given = false;
            return self.next_packet();
        }
        self.continued = false;
        Ok(self.frames.next_message()?.map(packet::decode))
    }
}

fn data_piece(connect_id: i64, data: Bytes) -> Frame {
    Frame::Data(Data {
        connect_id,
        error: String::new(),
        data,
    })
}

/// For a message of `len` bytes starting with `head`: its connectID and
/// the length of everything before the payload, if it is a DATA packet
/// with a payload, no error text, and nothing after the payload (so that
/// prost would decode it to exactly `Data{connect_id, data: payload}`).
fn data_head(head: &[u8], len: usize) -> Option<(i64, usize)> {
    let mut pos = 0;
    let byte = |pos: &mut usize| {
        let b = *head.get(*pos)?;
        *pos += 1;
        Some(b)
    };
    // Packet.type = DATA (field 1, varint), then Packet.data (field 4,
    // length-delimited) reaching the end of the message.
    if byte(&mut pos)? != 0x08 || byte(&mut pos)? != PacketType::Data as u8 {
        return None;
    }
    if byte(&mut pos)? != 0x22 {
        return None;
    }
    let data_len = varint(head, &mut pos)?;
    if (pos as u64).checked_add(data_len)? != len as u64 {
        return None;
    }
    // Data.connectID (field 1, varint) if not zero, then Data.data (field
    // 3, length-delimited) reaching the end.
    let mut connect_id = 0;
    let mut tag = byte(&mut pos)?;
    if tag == 0x08 {
        connect_id = varint(head, &mut pos)? as i64;
        tag = byte(&mut pos)?;
    }
    if tag != 0x1a {
        return None;
    }
    let payload = varint(head, &mut pos)?;
    if payload == 0 || (pos as u64).checked_add(payload)? != len as u64 {
        return None;
    }
    Some((connect_id, pos))
}

/// A protobuf varint at `pos` (at most 10 bytes, as prost reads them).
fn varint(head: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *head.get(*pos)?;
        *pos += 1;
        if i == 9 && b > 1 {
            return None;
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests;
