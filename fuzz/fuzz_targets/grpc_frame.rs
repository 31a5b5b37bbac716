//! FrameDecoder under arbitrary chunking: the same messages (and the same
//! error) as a one-shot reference parse, bounded buffering, and every message
//! fed to packet::decode. PacketDecoder under the same chunking: the same
//! packets as packet::decode of each whole message once a DATA packet's
//! pieces are joined, pieces that are slices of the pushed chunks, and the
//! same end.
//!
//! Input: `n` (1 byte), then `n % 16` chunk-size bytes, then the stream.
#![no_main]

use bytes::Bytes;
use edgetunnel_protocol::anp::grpc_frame::{FrameDecoder, FrameError, HEADER_LEN};
use edgetunnel_protocol::anp::packet::{self, Frame};
use edgetunnel_protocol::anp::packet_decoder::PacketDecoder;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 64 * 1024;

/// Straightforward parse of the whole stream at once.
fn reference(mut s: &[u8]) -> (Vec<&[u8]>, Result<(), FrameError>) {
    let mut out = Vec::new();
    loop {
        if s.is_empty() {
            return (out, Ok(()));
        }
        if s.len() < HEADER_LEN {
            return (out, Err(FrameError::Truncated { buffered: s.len() }));
        }
        match s[0] {
            0 => {}
            1 => return (out, Err(FrameError::CompressionNotNegotiated)),
            f => return (out, Err(FrameError::BadFlag(f))),
        }
        let len = u32::from_be_bytes([s[1], s[2], s[3], s[4]]) as usize;
        if len > MAX {
            return (out, Err(FrameError::TooLarge { len, max: MAX }));
        }
        if s.len() - HEADER_LEN < len {
            return (out, Err(FrameError::Truncated { buffered: s.len() }));
        }
        out.push(&s[HEADER_LEN..HEADER_LEN + len]);
        s = &s[HEADER_LEN + len..];
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    let (want, want_end) = reference(stream);
    packets(sizes, stream, &want, &want_end);

    let mut d = FrameDecoder::new(MAX);
    let mut got: Vec<Bytes> = Vec::new();
    let mut err = None;
    let mut pos = 0;
    let mut i = 0;
    // Bytes the decoder may hold once drained: a partial header or a
    // partial message of at most MAX bytes.
    let drained_bound = MAX.max(HEADER_LEN);
    'feed: while pos < stream.len() {
        let b = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255);
        i += 1;
        if b == 0 {
            d.push(Bytes::new());
        }
        let len = (1 + usize::from(b) * usize::from(b) / 8).min(stream.len() - pos);
        d.push(Bytes::copy_from_slice(&stream[pos..pos + len]));
        pos += len;
        assert!(d.buffered() < drained_bound + len);
        loop {
            match d.next_message() {
                Ok(Some(m)) => {
                    let _ = packet::decode(m.clone());
                    got.push(m);
                }
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break 'feed;
                }
            }
        }
        assert!(
            d.buffered() < drained_bound,
            "buffered {} after drain",
            d.buffered()
        );
    }
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(&g[..], *w);
    }
    match (err, want_end) {
        (Some(e), Err(w)) => assert_eq!(e, w),
        (None, Ok(())) => d.finish().unwrap(),
        (None, Err(FrameError::Truncated { .. })) => {
            assert!(matches!(d.finish(), Err(FrameError::Truncated { .. })))
        }
        (e, w) => panic!("chunked decoder ended with {e:?}, reference with {w:?}"),
    }
});

/// The same chunk lengths as the FrameDecoder pass.
fn chunk_len(sizes: &[u8], i: usize, left: usize) -> usize {
    let b = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255);
    (1 + usize::from(b) * usize::from(b) / 8).min(left)
}

/// A decoded packet or the text of why a message is not one.
type Got = Result<Frame, String>;

fn packets(sizes: &[u8], stream: &[u8], want: &[&[u8]], want_end: &Result<(), FrameError>) {
    let want: Vec<Got> = want
        .iter()
        .map(|m| packet::decode(Bytes::copy_from_slice(m)).map_err(|e| e.to_string()))
        .collect();
    let mut d = PacketDecoder::new(MAX);
    let mut got: Vec<Got> = Vec::new();
    let mut err = None;
    let (mut pos, mut i) = (0, 0);
    // Every chunk pushed, kept alive so that a piece's address is proof.
    let mut pushed: Vec<Bytes> = Vec::new();
    let sliced = |pushed: &[Bytes], piece: &[u8]| {
        let at = piece.as_ptr() as usize;
        pushed.iter().rev().any(|c| {
            let start = c.as_ptr() as usize;
            (start..start + c.len()).contains(&at)
        })
    };
    'feed: while pos < stream.len() {
        let len = chunk_len(sizes, i, stream.len() - pos);
        i += 1;
        let chunk = Bytes::copy_from_slice(&stream[pos..pos + len]);
        pushed.push(chunk.clone());
        d.push(chunk);
        pos += len;
        loop {
            match d.next_packet() {
                Ok(Some(p)) => {
                    let p = p.map_err(|e| e.to_string());
                    if !d.continued() {
                        got.push(p);
                        continue;
                    }
                    // A later piece of the DATA packet before: join it.
                    let (Ok(Frame::Data(piece)), Some(Ok(Frame::Data(first)))) =
                        (p, got.last_mut())
                    else {
                        panic!("a continued piece that does not follow a DATA packet")
                    };
                    assert_eq!(piece.connect_id, first.connect_id);
                    assert!(!piece.data.is_empty());
                    assert!(sliced(&pushed, &piece.data), "a copied piece");
                    first.data = [&first.data[..], &piece.data[..]].concat().into();
                }
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break 'feed;
                }
            }
        }
        assert!(
            d.buffered() < MAX.max(HEADER_LEN),
            "buffered {} after drain",
            d.buffered()
        );
    }
    // A stream cut inside a DATA packet may have handed out its first bytes.
    let truncated = matches!(want_end, Err(FrameError::Truncated { .. }));
    if truncated && got.len() == want.len() + 1 {
        assert!(matches!(got.pop(), Some(Ok(Frame::Data(_)))));
    }
    assert_eq!(got, want);
    match (err, want_end) {
        (Some(e), Err(w)) => assert_eq!(&e, w),
        (None, Ok(())) => d.finish().unwrap(),
        (None, Err(FrameError::Truncated { .. })) => {
            assert!(matches!(d.finish(), Err(FrameError::Truncated { .. })))
        }
        (e, w) => panic!("packet decoder ended with {e:?}, reference with {w:?}"),
    }
}
