//! The `--www` header parsers on arbitrary text: HTTP dates (the three
//! formats), Range headers, conditional-header decisions, content sniffing
//! and the mime.types / globs2 readers. No panics; a parsed date formats
//! back to the same second; ranges stay inside the file and the multipart
//! layout's length is the length of its bytes; a MIME table holds only types
//! Go's `ParseMediaType` accepts, `text/` ones with a charset.
#![no_main]

use edgetunnel_protocol::kubectl::static_files::{cond, httpdate, mime, ranges, sniff};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let size = u64::from_le_bytes(data[1..9].try_into().unwrap()) % (1 << 40);
    let rest = &data[9..];
    let text = String::from_utf8_lossy(rest);
    match data[0] % 5 {
        0 => {
            if let Some(t) = httpdate::parse(&text) {
                if (-62_135_596_800..253_402_300_800).contains(&t.secs) {
                    let again = httpdate::parse(&httpdate::format(t.secs)).map(|i| i.secs);
                    assert_eq!(again, Some(t.secs));
                }
            }
        }
        1 => {
            if let Ok(rs) = ranges::parse(&text, size) {
                for r in &rs {
                    assert!(r.start <= size && r.len <= size - r.start);
                    let _ = r.content_range(size);
                }
                if rs.len() > 1 && ranges::total(&rs) <= size {
                    let (pieces, len) = ranges::multipart(&rs, "text/plain", size, "b");
                    let sum: u64 = pieces
                        .iter()
                        .map(|p| match p {
                            ranges::Piece::Bytes(b) => b.len() as u64,
                            ranges::Piece::File(r) => r.len,
                        })
                        .sum();
                    assert_eq!(sum, len);
                }
            }
        }
        2 => {
            let mut parts = text.split('\n');
            let mut next = || parts.next();
            let c = cond::Conditions {
                method: next().unwrap_or("GET"),
                if_match: next(),
                if_unmodified_since: next(),
                if_none_match: next(),
                if_modified_since: next(),
                if_range: next(),
                range: next(),
            };
            let mtime = (size != 0).then_some(httpdate::Instant {
                secs: size as i64,
                nanos: 0,
            });
            if let cond::Decision::Serve(r) = cond::decide(&c, mtime) {
                assert!(r.is_empty() || Some(r) == c.range);
            }
            let _ = cond::scan_etag(&text);
        }
        3 => {
            let ct = sniff::detect(rest);
            if rest.len() > sniff::SNIFF_LEN {
                assert_eq!(ct, sniff::detect(&rest[..sniff::SNIFF_LEN]));
            }
        }
        _ => {
            let mut t = mime::Table::builtin();
            t.add_globs2(&text);
            t.add_mime_types(&text);
            for word in text.split_whitespace().take(16) {
                if let Some(m) = t.lookup(mime::ext(word)) {
                    // Go's setExtensionType stores only types its
                    // ParseMediaType accepts, and a `text/` one with a
                    // non-empty charset parameter (any case or RFC 2231
                    // form), or "" (unknown).
                    let (_, params) = mime::parse_media_type(m)
                        .unwrap_or_else(|e| panic!("{word:?} -> {m:?}: {e}"));
                    if m.starts_with("text/") {
                        assert!(
                            params.get("charset").is_some_and(|c| !c.is_empty()),
                            "{m:?}"
                        );
                    }
                }
            }
        }
    }
});
