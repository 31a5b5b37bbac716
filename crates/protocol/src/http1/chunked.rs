//! Chunked transfer coding (RFC 9112 section 7.1), sans-I/O: finds where a
//! chunked body ends and which input bytes are payload, without copying,
//! within explicit limits on chunk-size lines and trailers.

use std::ops::Range;

/// Longest chunk-size line (with extensions) and all trailers together.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size { digits: u8, ext: bool, line: usize },
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf { empty: bool },
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked encoding: {0}")]
pub struct ChunkError(&'static str);

/// What one call to [`ChunkedDecoder::advance`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ChunkProgress {
    /// Bytes of the input that belong to this body.
    pub consumed: usize,
    /// Payload byte ranges within the consumed input.
    pub data: Vec<Range<usize>>,
    /// The body ended at `consumed`.
    pub done: bool,
}

/// Tracks a chunked body byte by byte (payload in bulk).
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    size: u64,
    trailers: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size {
                digits: 0,
                ext: false,
                line: 0,
            },
            size: 0,
            trailers: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    fn start_size() -> ChunkState {
        ChunkState::Size {
            digits: 0,
            ext: false,
            line: 0,
        }
    }

    /// Feeds `input`; stops at the end of the body.
    pub fn advance(&mut self, input: &[u8]) -> Result<ChunkProgress, ChunkError> {
        use ChunkState::*;
        let mut p = ChunkProgress::default();
        let mut i = 0;
        while i < input.len() && self.state != Done {
            if self.state == Data {
                let take = (self.size.min((input.len() - i) as u64)) as usize;
                p.data.push(i..i + take);
                i += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = DataCr;
                }
                continue;
            }
            let c = input[i];
            i += 1;
            self.state = match self.state {
                Size { digits, ext, line } => {
                    if line >= MAX_CHUNK_LINE {
                        return Err(ChunkError("chunk size line too long"));
                    }
                    match c {
                        b'\r' | b'\n' if digits == 0 => return Err(ChunkError("empty chunk size")),
                        b'\r' => SizeLf,
                        b'\n' => self.size_done(),
                        _ if ext => Size {
                            digits,
                            ext,
                            line: line + 1,
                        },
                        b';' | b' ' | b'\t' => Size {
                            digits,
                            ext: true,
                            line: line + 1,
                        },
                        c if c.is_ascii_hexdigit() => {
                            if digits >= 16 {
                                return Err(ChunkError("chunk size too large"));
                            }
                            let d = (c as char).to_digit(16).unwrap_or(0) as u64;
                            self.size = self.size << 4 | d;
                            Size {
                                digits: digits + 1,
                                ext,
                                line: line + 1,
                            }
                        }
                        _ => return Err(ChunkError("invalid chunk size")),
                    }
                }
                SizeLf => match c {
                    b'\n' => self.size_done(),
                    _ => return Err(ChunkError("expected LF after chunk size")),
                },
                DataCr => match c {
                    b'\r' => DataLf,
                    b'\n' => Self::start_size(),
                    _ => return Err(ChunkError("missing CRLF after chunk data")),
                },
                DataLf => match c {
                    b'\n' => Self::start_size(),
                    _ => return Err(ChunkError("missing LF after chunk data")),
                },
                TrailerStart | TrailerLine => {
                    self.trailers += 1;
                    if self.trailers > MAX_TRAILERS {
                        return Err(ChunkError("trailers too large"));
                    }
                    let empty = self.state == TrailerStart;
                    match c {
                        b'\r' => TrailerLf { empty },
                        b'\n' if empty => Done,
                        b'\n' => TrailerStart,
                        _ => TrailerLine,
                    }
                }
                TrailerLf { empty } => match c {
                    b'\n' if empty => Done,
                    b'\n' => TrailerStart,
                    _ => return Err(ChunkError("expected LF in trailer")),
                },
                Data | Done => unreachable!("handled above"),
            };
        }
        p.consumed = i;
        p.done = self.state == Done;
        Ok(p)
    }

    fn size_done(&mut self) -> ChunkState {
        if self.size == 0 {
            ChunkState::TrailerStart
        } else {
            ChunkState::Data
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], step: usize) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < input.len() && !d.is_done() {
            let end = (pos + step).min(input.len());
            let p = d.advance(&input[pos..end])?;
            for r in p.data {
                out.extend_from_slice(&input[pos + r.start..pos + r.end]);
            }
            pos += p.consumed;
            if p.consumed == 0 {
                break;
            }
        }
        assert!(d.is_done(), "not done");
        Ok((out, pos))
    }

    #[test]
    fn chunked_in_any_split() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for step in 1..body.len() {
            let (data, end) = decode_all(body, step).unwrap();
            assert_eq!(data, b"hello world");
            assert_eq!(&body[end..], b"NEXT");
        }
        assert!(decode_all(b"zz\r\n", 3).is_err());
        assert!(decode_all(b"1\r\nab\r\n", 8).is_err());
        assert!(decode_all(b"11111111111111111\r\n", 30).is_err());
    }
}
