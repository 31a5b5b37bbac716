//! The HTTP/2 `:authority` filter on an arbitrary client byte stream, cut
//! into chunks at input-chosen points and driven with `skip`/`feed` as the
//! I/O glue drives it: no panic, progress on every call, the same output
//! (and the same error) as one `process` call over the whole stream, and
//! an idempotent result: the output, run through a fresh filter, comes out
//! unchanged with nothing dropped (its header blocks use no dynamic table
//! and keep only valid authorities).
//!
//! Input: `n` (1 byte), then `n % 16` chunk-size bytes, then the stream.
#![no_main]

use edgetunnel_protocol::h2_authority::{AuthorityFilter, Error};
use libfuzzer_sys::fuzz_target;

fn whole(stream: &[u8]) -> (Vec<u8>, Result<(), Error>, AuthorityFilter) {
    let mut f = AuthorityFilter::new();
    let mut out = Vec::new();
    let res = f.process(stream, &mut out);
    (out, res, f)
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    let (want, want_res, wf) = whole(stream);

    let mut f = AuthorityFilter::new();
    let mut out = Vec::new();
    let mut res = Ok(());
    let mut pos = 0;
    let mut i = 0;
    'feed: while pos < stream.len() {
        let b = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255);
        i += 1;
        let len = (1 + usize::from(b) * usize::from(b) / 8).min(stream.len() - pos);
        let chunk = &stream[pos..pos + len];
        pos += len;
        let mut p = 0;
        while p < chunk.len() {
            let known = f.pass_len();
            let may = f.may_pass();
            let s = f.skip(&chunk[p..]);
            assert!(s >= known.min(chunk.len() - p));
            if !may {
                assert_eq!(s, 0);
            }
            out.extend_from_slice(&chunk[p..p + s]);
            p += s;
            match f.feed(&chunk[p..], &mut out) {
                Ok(m) => {
                    assert!(s > 0 || m > 0 || p == chunk.len(), "no progress");
                    p += m;
                }
                Err(e) => {
                    assert_eq!(f.error(), Some(&e));
                    res = Err(e);
                    break 'feed;
                }
            }
        }
    }
    assert_eq!(res, want_res);
    assert_eq!(out, want);
    if res.is_ok() {
        assert_eq!(f.holds_partial(), wf.holds_partial());
        assert_eq!(f.dropped_authorities(), wf.dropped_authorities());
    }

    // Idempotence.
    let (again, again_res, af) = whole(&want);
    assert_eq!(again_res, Ok(()), "output rejected");
    assert_eq!(again, want);
    assert_eq!(af.dropped_authorities(), 0);
    if want_res.is_ok() && !wf.holds_partial() {
        assert_eq!(af.header_blocks(), wf.header_blocks());
    }
});
