//! HTTP/2 wire pieces the server writes (RFC 9113 section 4, RFC 7541):
//! frame headers, header blocks cut into HEADERS and CONTINUATION frames,
//! and HPACK fields encoded without the dynamic table (static indexes and
//! raw literals), so the client's decoder table never changes because of
//! us.

use super::frame_type::{CONTINUATION, HEADERS};

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of an HTTP/2 frame header.
pub const FRAME_HEADER_LEN: usize = 9;

/// Frame flags (RFC 9113 section 6).
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

/// Appends a frame header.
pub fn put_frame_header(out: &mut Vec<u8>, len: usize, ty: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// Writes an encoded header block as HEADERS + CONTINUATION frames of at
/// most `max_frame` bytes of payload each (END_STREAM on the HEADERS
/// frame with `end_stream`, END_HEADERS on the last).
pub fn write_block(
    out: &mut Vec<u8>,
    stream: u32,
    end_stream: bool,
    block: &[u8],
    max_frame: usize,
) {
    let frames = block.len().div_ceil(max_frame).max(1);
    out.reserve(block.len() + frames * FRAME_HEADER_LEN);
    let mut rest = block;
    let mut first = true;
    loop {
        let n = rest.len().min(max_frame);
        let last = n == rest.len();
        let mut flags = if last { END_HEADERS } else { 0 };
        let ty = if first {
            if end_stream {
                flags |= END_STREAM;
            }
            HEADERS
        } else {
            CONTINUATION
        };
        put_frame_header(out, n, ty, flags, stream);
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        first = false;
        if last {
            return;
        }
    }
}

/// The HPACK static table (RFC 7541 Appendix A), index 1 first.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Appends one field with no dynamic-table effect: an indexed static
/// entry when name and value match one, else a literal without indexing,
/// with the static name index when there is one. Strings are raw (no
/// Huffman).
pub fn encode_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let mut name_index = 0;
    for (i, &(n, v)) in STATIC_TABLE.iter().enumerate() {
        if n == name {
            if v == value {
                put_int(out, 0x80, 7, i + 1);
                return;
            }
            if name_index == 0 {
                name_index = i + 1;
            }
        }
    }
    // Literal Header Field without Indexing (RFC 7541 6.2.2): 0000xxxx.
    put_int(out, 0x00, 4, name_index);
    if name_index == 0 {
        put_string(out, name);
    }
    put_string(out, value);
}

/// An HPACK integer (RFC 7541 5.1) with `prefix` bits in the first byte,
/// whose other bits are `first`.
fn put_int(out: &mut Vec<u8>, first: u8, prefix: u8, mut v: usize) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A raw (not Huffman-coded) HPACK string literal.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoder_uses_static_entries_and_long_integers() {
        let mut out = Vec::new();
        encode_field(&mut out, b":method", b"POST");
        encode_field(&mut out, b":path", b"/x");
        encode_field(&mut out, b":authority", b"");
        encode_field(&mut out, b"x", &[b'y'; 300]);
        assert_eq!(&out[..5], &[0x83, 0x04, 0x02, b'/', b'x']);
        assert_eq!(out[5], 0x81);
        // New name, then a 300-byte value: 127 + 173 = 0x7f, 0xad, 0x01.
        assert_eq!(&out[6..12], &[0x00, 0x01, b'x', 0x7f, 0xad, 0x01]);
        // loona-hpack (the server's own decoder) reads it back.
        let mut d = loona_hpack::Decoder::new();
        assert_eq!(d.decode(&out).unwrap(), expected());
    }

    fn expected() -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":path".to_vec(), b"/x".to_vec()),
            (b":authority".to_vec(), b"".to_vec()),
            (b"x".to_vec(), vec![b'y'; 300]),
        ]
    }
}
