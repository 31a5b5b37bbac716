//! The tracing wrapper's HTTP/1.1 stream follower on arbitrary bytes, for
//! requests and for responses: no panics, and the same events however the
//! stream is split into reads.
#![no_main]

use edgetunnel_protocol::http1::trace::Tracker;
use libfuzzer_sys::fuzz_target;

fn run(requests: bool, data: &[u8], step: usize) -> Vec<edgetunnel_protocol::http1::trace::Event> {
    let mut t = if requests { Tracker::requests() } else { Tracker::responses() };
    let mut methods = ["GET", "HEAD", "POST"].iter().cycle().map(|m| m.to_string());
    let mut out = Vec::new();
    for c in data.chunks(step) {
        out.extend(t.feed(c, || methods.next()));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let requests = data[0] & 1 == 0;
    let step = 1 + data[1] as usize % 13;
    let body = &data[2..];
    let whole = run(requests, body, body.len().max(1));
    let split = run(requests, body, step);
    // A head cut by a read boundary is parsed once complete: below the
    // follower's 64 KiB head limit the split cannot change what it sees.
    if body.len() < 60_000 {
        assert_eq!(whole, split);
    }
});
