//! The proxy's response path on arbitrary bytes: head parsing, framing,
//! the client head, and the chunked decoder, which must find the same end
//! and payload however the input is split.
#![no_main]

use edgetunnel_protocol::kubectl::forward;
use edgetunnel_protocol::http1::{self, ChunkedDecoder, Framing};
use libfuzzer_sys::fuzz_target;

fn decode(input: &[u8], step: usize) -> Option<(Vec<u8>, usize, bool)> {
    let mut d = ChunkedDecoder::new();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < input.len() && !d.is_done() {
        let end = (pos + step).min(input.len());
        let p = d.advance(&input[pos..end]).ok()?;
        assert!(p.consumed <= end - pos);
        for r in &p.data {
            assert!(r.end <= p.consumed);
            out.extend_from_slice(&input[pos + r.start..pos + r.end]);
        }
        pos += p.consumed;
        if p.consumed == 0 {
            break;
        }
    }
    Some((out, pos, d.is_done()))
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let step = 1 + data[0] as usize % 17;
    let body = &data[1..];
    // The chunked decoder: split-independent.
    let whole = decode(body, body.len().max(1));
    let split = decode(body, step);
    if let (Some(a), Some(b)) = (&whole, &split) {
        assert_eq!(a, b);
        assert!(a.0.len() <= body.len());
    }
    if let Ok(Some((head, n))) = http1::parse_response(body, http1::HeadLimit::GO_SERVER) {
        assert!(n <= body.len());
        for method in ["GET", "HEAD"] {
            if let Ok(f) = http1::response_framing(method, &head) {
                let (out, mode, _) = forward::response_head(&head, f, 1, true, forward::is_gzipped(&head));
                assert!(out.ends_with(b"\r\n\r\n"));
                if f == Framing::None {
                    assert_eq!(mode, forward::ClientBody::None);
                }
            }
        }
    }
});
