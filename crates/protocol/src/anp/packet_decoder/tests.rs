use bytes::Bytes;
use prost::Message;

use super::*;
use crate::anp::grpc_frame;
use crate::anp::packet::{encode, Encoded};
use crate::anp::pb::Packet;

fn wire(frames: &[Frame]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|f| encode(f.clone()).to_vec())
        .collect()
}

/// A gRPC message of raw Packet bytes (for encodings prost never writes).
fn raw_message(packet: &[u8]) -> Vec<u8> {
    let mut m = grpc_frame::header(packet.len()).to_vec();
    m.extend_from_slice(packet);
    m
}

/// Decodes `wire` pushed in pieces cut at `cuts`; the packets, and the
/// framing error that ended the stream if any.
fn decode_cut(wire: &[u8], cuts: &[usize], max: usize) -> (Vec<Frame>, Option<FrameError>) {
    let mut d = PacketDecoder::new(max);
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&wire.len())) {
        let end = end.clamp(start, wire.len());
        d.push(Bytes::copy_from_slice(&wire[start..end]));
        start = end;
        loop {
            match d.next_packet() {
                Ok(Some(Ok(f))) => out.push(f),
                Ok(Some(Err(e))) => panic!("a bad packet in the test stream: {e}"),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, d.finish().err())
}

/// Consecutive payload pieces of one connection joined (what a socket
/// receives is the same either way).
fn joined(frames: Vec<Frame>) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for f in frames {
        if let (Some(Frame::Data(last)), Frame::Data(d)) = (out.last_mut(), &f) {
            let piece = |d: &Data| d.error.is_empty() && !d.data.is_empty();
            if piece(last) && piece(d) && last.connect_id == d.connect_id {
                let mut v = last.data.to_vec();
                v.extend_from_slice(&d.data);
                last.data = Bytes::from(v);
                continue;
            }
        }
        out.push(f);
    }
    out
}

fn mixed_stream() -> (Vec<u8>, Vec<Frame>) {
    let big: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let frames = vec![
        packet::dial_request("tcp", "node:10250", 3),
        packet::data(9, Bytes::from(big.clone())),
        packet::data(0, Bytes::from_static(b"connect id zero")),
        packet::data(9, Bytes::new()),
        packet::window_update(9, 4096),
        packet::half_close(9),
        packet::data(-1, Bytes::from_static(b"x")),
        packet::data(i64::MAX, Bytes::from(big[..300].to_vec())),
        packet::close_request(9),
        Frame::Drain,
    ];
    let mut w = wire(&frames);
    // DATA with its fields in reverse order: prost reads it, the header
    // reader must leave it to prost.
    let mut rev = vec![
        0x22, 0x08, 0x1a, 0x03, b'a', b'b', b'c', 0x08, 0x05, 0x08, 0x04,
    ];
    rev[1] = 7;
    w.extend(raw_message(&rev));
    let reversed = packet::data(5, Bytes::from_static(b"abc"));
    let mut want = frames;
    want.push(reversed);
    (w, want)
}

#[test]
fn reversed_fields_decode_as_prost_does() {
    let (w, want) = mixed_stream();
    let msg = Bytes::copy_from_slice(&w[w.len() - 11..]);
    assert_eq!(packet::decode(msg).unwrap(), want[want.len() - 1]);
}

#[test]
fn any_split_gives_the_same_packets() {
    let (w, want) = mixed_stream();
    let (whole, err) = decode_cut(&w, &[], 1 << 20);
    assert_eq!(err, None);
    assert_eq!(whole, want, "in one chunk, one packet per message");
    let mut splits: Vec<Vec<usize>> = (0..w.len()).step_by(97).map(|c| vec![c]).collect();
    splits.push((1..w.len()).collect()); // a byte at a time
    splits.push((0..w.len()).step_by(16_384 + 9).collect());
    let mut rng = fastrand::Rng::with_seed(29);
    for _ in 0..50 {
        let mut cuts: Vec<usize> = (0..rng.usize(1..40))
            .map(|_| rng.usize(..w.len()))
            .collect();
        cuts.sort_unstable();
        splits.push(cuts);
    }
    for cuts in splits {
        let (got, err) = decode_cut(&w, &cuts, 1 << 20);
        assert_eq!(err, None, "cuts {cuts:?}");
        assert_eq!(joined(got), want, "cuts {cuts:?}");
    }
}

#[test]
fn spanning_data_is_handed_on_as_the_chunks_slices() {
    let payload: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    let Encoded { head, payload: p } = encode_data_of(&payload);
    let w = [&head[..], &p[..]].concat();
    // Cut as grpc-go would send it: 16 KiB frames, the first with the head.
    let chunks: Vec<Bytes> = w.chunks(16_384).map(Bytes::copy_from_slice).collect();
    let mut d = PacketDecoder::new(1 << 20);
    let mut got = Vec::new();
    let mut continued = Vec::new();
    for c in &chunks {
        d.push(c.clone());
        while let Some(f) = d.next_packet().unwrap() {
            got.push(f.unwrap());
            continued.push(d.continued());
        }
    }
    assert!(
        !continued[0] && continued[1..].iter().all(|&c| c),
        "{continued:?}"
    );
    d.finish().unwrap();
    let mut all = Vec::new();
    for f in &got {
        let Frame::Data(piece) = f else {
            panic!("a DATA piece, got {f:?}")
        };
        assert_eq!(piece.connect_id, 77);
        let at = piece.data.as_ptr() as usize;
        assert!(
            chunks.iter().any(|c| {
                let start = c.as_ptr() as usize;
                (start..start + c.len()).contains(&at)
            }),
            "a piece of {} bytes is a copy, not a slice of a received chunk",
            piece.data.len()
        );
        all.extend_from_slice(&piece.data);
    }
    assert_eq!(all, payload);
    assert_eq!(got.len(), chunks.len(), "one piece per chunk");
}

fn encode_data_of(payload: &[u8]) -> Encoded {
    packet::encode_data(77, Bytes::copy_from_slice(payload))
}

#[test]
fn a_lying_length_prefix_holds_nothing_back() {
    // A DATA packet that declares 4 MiB of payload and sends 100 bytes:
    // they are handed out as they come, nothing is reserved for the rest.
    let head = packet::encode_data(3, Bytes::from(vec![0; 4 << 20])).head;
    let mut d = PacketDecoder::new(grpc_frame::DEFAULT_MAX_MESSAGE + 64);
    d.push(head);
    assert!(d.next_packet().unwrap().is_none());
    d.push(Bytes::from(vec![1u8; 100]));
    let Some(Ok(Frame::Data(p))) = d.next_packet().unwrap() else {
        panic!("a piece")
    };
    assert_eq!((p.connect_id, p.data.len(), d.buffered()), (3, 100, 0));
    assert!(!d.continued(), "the first piece is the packet itself");
    assert!(d.next_packet().unwrap().is_none());
    assert!(matches!(d.finish(), Err(FrameError::Truncated { .. })));
    // Above the limit: an error before any of the body is kept.
    let mut d = PacketDecoder::new(1000);
    d.push(packet::encode_data(3, Bytes::from(vec![0; 1001])).head);
    assert!(matches!(d.next_packet(), Err(FrameError::TooLarge { .. })));
}

#[test]
fn unknown_types_and_bad_packets_are_consumed() {
    // Packet{type: 99}, then a DATA packet with no Data payload.
    let mut w = raw_message(&[0x08, 99]);
    w.extend(raw_message(&[0x08, 0x04]));
    w.extend(wire(&[packet::data(1, Bytes::from_static(b"after"))]));
    let mut d = PacketDecoder::new(1000);
    d.push(Bytes::from(w));
    assert!(matches!(
        d.next_packet(),
        Ok(Some(Err(PacketError::UnknownType(99))))
    ));
    assert!(matches!(
        d.next_packet(),
        Ok(Some(Err(PacketError::MissingPayload { .. })))
    ));
    assert_eq!(
        d.next_packet().unwrap().unwrap().unwrap(),
        packet::data(1, Bytes::from_static(b"after"))
    );
    d.finish().unwrap();
}

#[test]
fn data_heads_the_reader_leaves_to_prost() {
    let len_of = |p: &[u8]| p.len();
    for (packet, why) in [
        (
            &[
                0x08, 0x04, 0x22, 0x05, 0x08, 0x01, 0x1a, 0x01, b'x', 0x78, 0x01,
            ][..],
            "a field after the payload",
        ),
        (
            &[0x08, 0x04, 0x22, 0x06, 0x08, 0x01, 0x12, 0x01, b'e', 0x1a][..],
            "an error text",
        ),
        (
            &[0x08, 0x84, 0x00, 0x22, 0x03, 0x1a, 0x01, b'x'][..],
            "a type in two bytes",
        ),
        (
            &[0x22, 0x03, 0x1a, 0x01, b'x', 0x08, 0x04][..],
            "the type last",
        ),
        (
            &[0x08, 0x04, 0x22, 0x02, 0x1a, 0x00][..],
            "an empty payload",
        ),
    ] {
        assert_eq!(data_head(packet, len_of(packet)), None, "{why}");
    }
    let good = [0x08, 0x04, 0x22, 0x05, 0x08, 0x01, 0x1a, 0x01, b'x'];
    assert_eq!(data_head(&good, good.len()), Some((1, 8)));
    // What prost makes of a canonical head is what the reader makes of it.
    let msg = Bytes::copy_from_slice(&good);
    let Frame::Data(d) = packet::from_packet(Packet::decode(msg).unwrap()).unwrap() else {
        panic!("DATA")
    };
    assert_eq!((d.connect_id, &d.data[..]), (1, &b"x"[..]));
}

/// The decoder sits inline in every gRPC stream's task (a caller's stream
/// future is guarded at 1,184 bytes, the 1,280-byte allocator class with
/// monoio's header and the span): no bigger than the `FrameDecoder` (64
/// bytes) it replaced there. An `Option` of the streaming state made it 88
/// and the stream's future 1,208 bytes.
#[test]
fn the_decoder_is_as_small_as_the_frame_decoder_was() {
    assert!(std::mem::size_of::<FrameDecoder>() <= 48);
    assert!(std::mem::size_of::<PacketDecoder>() <= 64);
}
