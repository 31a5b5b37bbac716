//! `Range: bytes=...` as Go's `http.ServeContent` reads it (`parseRange`:
//! suffix ranges, clamping, ranges past the end dropped, 416 only when none
//! overlaps, `strconv.ParseInt` numbers) and the `multipart/byteranges`
//! body layout Go's `mime/multipart` writer produces for several ranges.
//! Sans-I/O.

/// One satisfiable range: `len` bytes from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub len: u64,
}

impl ByteRange {
    /// `bytes a-b/size` (Go prints `start+len-1` even for an empty range).
    pub fn content_range(&self, size: u64) -> String {
        format!(
            "bytes {}-{}/{}",
            self.start,
            (self.start + self.len) as i128 - 1,
            size
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("invalid range")]
    Invalid,
    #[error("invalid range: failed to overlap")]
    NoOverlap,
}

/// Go's ASCII space trimming (`textproto.TrimString`).
pub fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

/// Go's `strconv.ParseInt(s, 10, 64)`.
fn parse_int(s: &str) -> Option<i64> {
    let d = s.strip_prefix(['+', '-']).unwrap_or(s);
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Go's `parseRange`: an empty header is no range (empty list).
pub fn parse(s: &str, size: u64) -> Result<Vec<ByteRange>, RangeError> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let size = i64::try_from(size).map_err(|_| RangeError::Invalid)?;
    let spec = s.strip_prefix("bytes=").ok_or(RangeError::Invalid)?;
    let mut out = Vec::new();
    let mut no_overlap = false;
    for ra in spec.split(',') {
        let ra = trim(ra);
        if ra.is_empty() {
            continue;
        }
        let (start, end) = ra.split_once('-').ok_or(RangeError::Invalid)?;
        let (start, end) = (trim(start), trim(end));
        let (st, len);
        if start.is_empty() {
            if end.is_empty() || end.starts_with('-') {
                return Err(RangeError::Invalid);
            }
            let i = parse_int(end)
                .filter(|i| *i >= 0)
                .ok_or(RangeError::Invalid)?;
            let i = i.min(size);
            st = size - i;
            len = size - st;
        } else {
            let i = parse_int(start)
                .filter(|i| *i >= 0)
                .ok_or(RangeError::Invalid)?;
            if i >= size {
                no_overlap = true;
                continue;
            }
            st = i;
            if end.is_empty() {
                len = size - st;
            } else {
                let e = parse_int(end)
                    .filter(|e| st <= *e)
                    .ok_or(RangeError::Invalid)?;
                len = e.min(size - 1) - st + 1;
            }
        }
        out.push(ByteRange {
            start: st as u64,
            len: len as u64,
        });
    }
    if no_overlap && out.is_empty() {
        return Err(RangeError::NoOverlap);
    }
    Ok(out)
}

/// Sum of the range lengths (Go ignores the ranges when it exceeds the size).
pub fn total(ranges: &[ByteRange]) -> u64 {
    ranges.iter().map(|r| r.len).fold(0, u64::saturating_add)
}

/// A piece of a multipart body: literal bytes or a range of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Bytes(Vec<u8>),
    File(ByteRange),
}

/// A random boundary as Go's `multipart.Writer` makes (30 bytes, hex).
pub fn boundary() -> String {
    (0..30)
        .map(|_| format!("{:02x}", fastrand::u8(..)))
        .collect()
}

/// The body of a `multipart/byteranges` answer, as Go's writer lays it out
/// (part headers sorted: Content-Range, Content-Type), and its length.
pub fn multipart(
    ranges: &[ByteRange],
    ctype: &str,
    size: u64,
    boundary: &str,
) -> (Vec<Piece>, u64) {
    let mut pieces = Vec::with_capacity(ranges.len() * 2 + 1);
    let mut total = 0u64;
    for (i, r) in ranges.iter().enumerate() {
        let lead = if i == 0 { "" } else { "\r\n" };
        let head = format!(
            "{lead}--{boundary}\r\nContent-Range: {}\r\nContent-Type: {ctype}\r\n\r\n",
            r.content_range(size)
        );
        total += head.len() as u64 + r.len;
        pieces.push(Piece::Bytes(head.into_bytes()));
        pieces.push(Piece::File(*r));
    }
    let close = format!("\r\n--{boundary}--\r\n");
    total += close.len() as u64;
    pieces.push(Piece::Bytes(close.into_bytes()));
    (pieces, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, len: u64) -> ByteRange {
        ByteRange { start, len }
    }

    #[test]
    fn go_parse_range_cases() {
        // From Go's net/http ServeFileRangeTests and parseRange semantics.
        assert_eq!(parse("", 10), Ok(vec![]));
        assert_eq!(parse("bytes=0-4", 10), Ok(vec![r(0, 5)]));
        assert_eq!(parse("bytes=2-", 10), Ok(vec![r(2, 8)]));
        assert_eq!(parse("bytes=-5", 10), Ok(vec![r(5, 5)]));
        assert_eq!(parse("bytes=-15", 10), Ok(vec![r(0, 10)]));
        assert_eq!(parse("bytes=0-20", 10), Ok(vec![r(0, 10)]));
        assert_eq!(parse("bytes=-0", 10), Ok(vec![r(10, 0)]));
        assert_eq!(parse("bytes=0-0,-2", 10), Ok(vec![r(0, 1), r(8, 2)]));
        assert_eq!(parse("bytes= 1 - 2 ,,", 10), Ok(vec![r(1, 2)]));
        assert_eq!(parse("bytes=+1-+2", 10), Ok(vec![r(1, 2)]));
        assert_eq!(parse("bytes=20-,0-1", 10), Ok(vec![r(0, 2)]));
        assert_eq!(parse("bytes=20-", 10), Err(RangeError::NoOverlap));
        assert_eq!(parse("bytes=0-", 0), Err(RangeError::NoOverlap));
        for bad in [
            "bits=0-1",
            "bytes=5",
            "bytes=--5",
            "bytes=-",
            "bytes=3-2",
            "bytes=a-b",
            "bytes=-1-2",
            "bytes=1_0-",
            "bytes=99999999999999999999-",
        ] {
            assert_eq!(parse(bad, 10), Err(RangeError::Invalid), "{bad}");
        }
        // "bytes=" has no ranges: Go returns an empty list, not an error.
        assert_eq!(parse("bytes=", 10), Ok(vec![]));
        assert_eq!(parse("bytes=-5", 0), Ok(vec![r(0, 0)]));
        assert_eq!(r(0, 0).content_range(0), "bytes 0--1/0");
    }

    #[test]
    fn content_range_of_empty_suffix() {
        assert_eq!(r(10, 0).content_range(10), "bytes 10-9/10");
    }

    #[test]
    fn multipart_layout_and_length() {
        let rs = [r(0, 4), r(5, 3)];
        let (pieces, len) = multipart(&rs, "text/plain; charset=utf-8", 33, &"b".repeat(60));
        let mut body = Vec::new();
        for p in &pieces {
            match p {
                Piece::Bytes(b) => body.extend_from_slice(b),
                Piece::File(r) => body.extend(std::iter::repeat_n(b'x', r.len as usize)),
            }
        }
        // The length Go's kubectl sent for this request.
        assert_eq!(len, 349);
        assert_eq!(body.len() as u64, len);
        assert!(body.starts_with(b"--bbb"));
        assert!(body.ends_with(b"--\r\n"));
        assert_eq!(boundary().len(), 60);
    }
}
