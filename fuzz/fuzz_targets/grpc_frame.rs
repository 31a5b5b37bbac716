//! FrameDecoder under arbitrary chunking: the same messages (and the same
//! error) as a one-shot reference parse, bounded buffering, and every message
//! fed to packet::decode.
//!
//! Input: `n` (1 byte), then `n % 16` chunk-size bytes, then the stream.
#![no_main]

use bytes::Bytes;
use edgetunnel_protocol::anp::grpc_frame::{FrameDecoder, FrameError, HEADER_LEN};
use edgetunnel_protocol::anp::packet;
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
