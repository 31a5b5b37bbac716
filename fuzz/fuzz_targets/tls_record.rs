//! The TLS 1.3 record parser (`tls_record`) under arbitrary chunking: the
//! same records, the same events and the same error as a one-shot parse;
//! never more than one record held; post-handshake messages bounded. The
//! AEAD is left out (it is ring's): each record's body less its 16-byte
//! tag stands for the opened inner plaintext. The first ClientHello check
//! runs on the raw input too (it must not panic, and a prefix of a
//! decided input is undecided or decided the same).
//!
//! The anti-flood counters ride along: however the records come, no more
//! than `MAX_EMPTY_RECORDS` empty ones in a row and `MAX_KEY_UPDATES`
//! KeyUpdates without application data between them are taken.
//!
//! Input: `n` (1 byte), then `n % 16` chunk-size bytes, then the stream.
#![no_main]

use edgetunnel_protocol::tls_record::{
    self as rec, Inbound, Receiver, RecordError, HEADER_LEN, MAX_HANDSHAKE_MESSAGE, MAX_RECORD,
    TAG_LEN,
};
use libfuzzer_sys::fuzz_target;

/// What one record gives, after "opening" it.
fn act(r: &mut Receiver, record: &[u8]) -> Result<Inbound, RecordError> {
    let inner = &record[HEADER_LEN..record.len() - TAG_LEN];
    let (typ, len) = rec::inner_content(inner)?;
    let out = r.record(typ, &inner[..len]);
    assert!(r.held() < MAX_HANDSHAKE_MESSAGE + 4);
    out
}

fn one_shot(mut s: &[u8]) -> (Vec<Inbound>, Option<RecordError>) {
    let mut r = Receiver::new(true);
    let mut out = Vec::new();
    // Taken records that were empty, in a row; KeyUpdates since data.
    let (mut empty_run, mut key_updates) = (0usize, 0usize);
    loop {
        match rec::complete_record(s) {
            Ok(Some(len)) => {
                match act(&mut r, &s[..len]) {
                    Ok(e) => {
                        let inner = &s[HEADER_LEN..len - TAG_LEN];
                        let content = rec::inner_content(inner).map(|(_, l)| l).unwrap_or(0);
                        empty_run = if content == 0 { empty_run + 1 } else { 0 };
                        assert!(empty_run <= usize::from(rec::MAX_EMPTY_RECORDS));
                        match &e {
                            Inbound::Data if content > 0 => key_updates = 0,
                            Inbound::Messages(m) => {
                                key_updates += m
                                    .iter()
                                    .filter(|m| matches!(m, rec::Message::KeyUpdate { .. }))
                                    .count();
                                assert!(key_updates <= usize::from(rec::MAX_KEY_UPDATES));
                            }
                            _ => {}
                        }
                        out.push(e)
                    }
                    Err(e) => return (out, Some(e)),
                }
                s = &s[len..];
            }
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some(decided) = rec::client_hello_offers_tls13(data) {
        for cut in [1, data.len() / 2, data.len().saturating_sub(1)] {
            if let Some(d) = rec::client_hello_offers_tls13(&data[..cut.min(data.len())]) {
                // A cut ClientHello is undecided or (not a ClientHello at
                // all) refused outright.
                assert!(!d || d == decided);
            }
        }
    }
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    let want = one_shot(stream);

    let mut r = Receiver::new(true);
    let mut buf: Vec<u8> = Vec::new();
    let mut got = Vec::new();
    let mut err = None;
    let mut pos = 0;
    let mut i = 0;
    'feed: while pos < stream.len() {
        let b = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255);
        i += 1;
        let len = (1 + usize::from(b) * usize::from(b)).min(stream.len() - pos);
        buf.extend_from_slice(&stream[pos..pos + len]);
        pos += len;
        loop {
            match rec::complete_record(&buf) {
                Ok(Some(l)) => {
                    let rec: Vec<u8> = buf.drain(..l).collect();
                    match act(&mut r, &rec) {
                        Ok(e) => got.push(e),
                        Err(e) => {
                            err = Some(e);
                            break 'feed;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break 'feed;
                }
            }
        }
        assert!(buf.len() < MAX_RECORD, "held {} bytes", buf.len());
    }
    assert_eq!(got, want.0);
    assert_eq!(err, want.1);
});
