//! Go's `http.DetectContentType`: the WHATWG MIME sniffing algorithm as
//! Go implements it (its signature table and order, the HTML tag prefixes,
//! the mp4 box check, the binary-byte test for text), over at most the
//! first 512 bytes. Sans-I/O.

/// How many leading bytes the decision uses.
pub const SNIFF_LEN: usize = 512;

const HTML: &str = "text/html; charset=utf-8";

enum Sig {
    /// Case-insensitive tag prefix after leading whitespace, then ' ' or '>'.
    Html(&'static [u8]),
    Exact(&'static [u8], &'static str),
    Masked {
        mask: &'static [u8],
        pat: &'static [u8],
        skip_ws: bool,
        ct: &'static str,
    },
    Mp4,
    Text,
}

const fn masked(mask: &'static [u8], pat: &'static [u8], ct: &'static str) -> Sig {
    Sig::Masked {
        mask,
        pat,
        skip_ws: false,
        ct,
    }
}

const FONT_MASK: &[u8] = b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xFF\xFF";
const FONT_PAT: &[u8] = b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00LP";

/// Go's `sniffSignatures`, in its order.
const SIGNATURES: &[Sig] = &[
    Sig::Html(b"<!DOCTYPE HTML"),
    Sig::Html(b"<HTML"),
    Sig::Html(b"<HEAD"),
    Sig::Html(b"<SCRIPT"),
    Sig::Html(b"<IFRAME"),
    Sig::Html(b"<H1"),
    Sig::Html(b"<DIV"),
    Sig::Html(b"<FONT"),
    Sig::Html(b"<TABLE"),
    Sig::Html(b"<A"),
    Sig::Html(b"<STYLE"),
    Sig::Html(b"<TITLE"),
    Sig::Html(b"<B"),
    Sig::Html(b"<BODY"),
    Sig::Html(b"<BR"),
    Sig::Html(b"<P"),
    Sig::Html(b"<!--"),
    Sig::Masked {
        mask: b"\xFF\xFF\xFF\xFF\xFF",
        pat: b"<?xml",
        skip_ws: true,
        ct: "text/xml; charset=utf-8",
    },
    Sig::Exact(b"%PDF-", "application/pdf"),
    Sig::Exact(b"%!PS-Adobe-", "application/postscript"),
    // UTF BOMs.
    masked(
        b"\xFF\xFF\x00\x00",
        b"\xFE\xFF\x00\x00",
        "text/plain; charset=utf-16be",
    ),
    masked(
        b"\xFF\xFF\x00\x00",
        b"\xFF\xFE\x00\x00",
        "text/plain; charset=utf-16le",
    ),
    masked(
        b"\xFF\xFF\xFF\x00",
        b"\xEF\xBB\xBF\x00",
        "text/plain; charset=utf-8",
    ),
    // Images.
    Sig::Exact(b"\x00\x00\x01\x00", "image/x-icon"),
    Sig::Exact(b"\x00\x00\x02\x00", "image/x-icon"),
    Sig::Exact(b"BM", "image/bmp"),
    Sig::Exact(b"GIF87a", "image/gif"),
    Sig::Exact(b"GIF89a", "image/gif"),
    masked(
        b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF\xFF\xFF",
        b"RIFF\x00\x00\x00\x00WEBPVP",
        "image/webp",
    ),
    Sig::Exact(b"\x89PNG\x0D\x0A\x1A\x0A", "image/png"),
    Sig::Exact(b"\xFF\xD8\xFF", "image/jpeg"),
    // Audio and video.
    masked(b"\xFF\xFF\xFF\xFF", b".snd", "audio/basic"),
    masked(
        b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF",
        b"FORM\x00\x00\x00\x00AIFF",
        "audio/aiff",
    ),
    masked(b"\xFF\xFF\xFF", b"ID3", "audio/mpeg"),
    masked(b"\xFF\xFF\xFF\xFF\xFF", b"OggS\x00", "application/ogg"),
    masked(
        b"\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF",
        b"MThd\x00\x00\x00\x06",
        "audio/midi",
    ),
    masked(
        b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF",
        b"RIFF\x00\x00\x00\x00AVI ",
        "video/avi",
    ),
    masked(
        b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF",
        b"RIFF\x00\x00\x00\x00WAVE",
        "audio/wave",
    ),
    Sig::Mp4,
    Sig::Exact(b"\x1A\x45\xDF\xA3", "video/webm"),
    // Fonts.
    masked(FONT_MASK, FONT_PAT, "application/vnd.ms-fontobject"),
    Sig::Exact(b"\x00\x01\x00\x00", "font/ttf"),
    Sig::Exact(b"OTTO", "font/otf"),
    Sig::Exact(b"ttcf", "font/collection"),
    Sig::Exact(b"wOFF", "font/woff"),
    Sig::Exact(b"wOF2", "font/woff2"),
    // Archives.
    Sig::Exact(b"\x1F\x8B\x08", "application/x-gzip"),
    Sig::Exact(b"PK\x03\x04", "application/zip"),
    Sig::Exact(b"Rar!\x1A\x07\x00", "application/x-rar-compressed"),
    Sig::Exact(b"Rar!\x1A\x07\x01\x00", "application/x-rar-compressed"),
    Sig::Exact(b"\x00\x61\x73\x6D", "application/wasm"),
    Sig::Text,
];

fn is_ws(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' ')
}

impl Sig {
    fn matches(&self, data: &[u8], first_non_ws: usize) -> Option<&'static str> {
        match *self {
            Sig::Exact(sig, ct) => data.starts_with(sig).then_some(ct),
            Sig::Masked {
                mask,
                pat,
                skip_ws,
                ct,
            } => {
                let d = if skip_ws { &data[first_non_ws..] } else { data };
                (d.len() >= pat.len() && pat.iter().zip(mask).zip(d).all(|((p, m), b)| b & m == *p))
                    .then_some(ct)
            }
            Sig::Html(tag) => {
                let d = &data[first_non_ws..];
                if d.len() < tag.len() + 1 {
                    return None;
                }
                let same = tag.iter().zip(d).all(|(&t, &b)| {
                    let b = if t.is_ascii_uppercase() { b & 0xDF } else { b };
                    t == b
                });
                (same && matches!(d[tag.len()], b' ' | b'>')).then_some(HTML)
            }
            Sig::Mp4 => {
                if data.len() < 12 {
                    return None;
                }
                let size = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
                if data.len() < size || !size.is_multiple_of(4) || &data[4..8] != b"ftyp" {
                    return None;
                }
                (8..size)
                    .step_by(4)
                    .filter(|&st| st != 12)
                    .any(|st| &data[st..st + 3] == b"mp4")
                    .then_some("video/mp4")
            }
            Sig::Text => data[first_non_ws..]
                .iter()
                .all(|&b| !matches!(b, 0x00..=0x08 | 0x0B | 0x0E..=0x1A | 0x1C..=0x1F))
                .then_some("text/plain; charset=utf-8"),
        }
    }
}

/// Go's `http.DetectContentType`.
pub fn detect(data: &[u8]) -> &'static str {
    let data = &data[..data.len().min(SNIFF_LEN)];
    let first_non_ws = data.iter().take_while(|&&b| is_ws(b)).count();
    SIGNATURES
        .iter()
        .find_map(|s| s.matches(data, first_non_ws))
        .unwrap_or("application/octet-stream")
}

#[cfg(test)]
mod tests {
    use super::detect;

    #[test]
    fn go_sniff_tests() {
        // Cases from Go's net/http sniff_test.go.
        let cases: &[(&[u8], &str)] = &[
            (b"", "text/plain; charset=utf-8"),
            (b"\x00\x01\x02\x03", "application/octet-stream"),
            (b"Hello, world!", "text/plain; charset=utf-8"),
            (b"\xFF\xFEH\x00e\x00", "text/plain; charset=utf-16le"),
            (b"\xFE\xFF\x00H\x00e", "text/plain; charset=utf-16be"),
            (b"\xEF\xBB\xBFHi", "text/plain; charset=utf-8"),
            (b"\n<html>blah", "text/html; charset=utf-8"),
            (
                b"<HtMl><bOdY>blah blah blah</body></html>",
                "text/html; charset=utf-8",
            ),
            (b"  <!-- x -->", "text/html; charset=utf-8"),
            (b"<html", "text/plain; charset=utf-8"),
            (b"<htmlx>", "text/plain; charset=utf-8"),
            (b"\n<?xml!", "text/xml; charset=utf-8"),
            (b"%PDF-1.4", "application/pdf"),
            (b"%!PS-Adobe-3.0", "application/postscript"),
            (b"BMxx", "image/bmp"),
            (b"GIF87a", "image/gif"),
            (b"GIF89a...", "image/gif"),
            (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp"),
            (b"\x89PNG\x0D\x0A\x1A\x0Axx", "image/png"),
            (b"\xFF\xD8\xFF\xE0", "image/jpeg"),
            (b".sndxx", "audio/basic"),
            (b"FORM\x00\x00\x00\x00AIFFxx", "audio/aiff"),
            (b"ID3\x03", "audio/mpeg"),
            (b"OggS\x00\x02", "application/ogg"),
            (b"MThd\x00\x00\x00\x06\x00\x01", "audio/midi"),
            (b"RIFF,O\n\x00AVI LISTx", "video/avi"),
            (b"RIFFb\xb8\x00\x00WAVEfmt ", "audio/wave"),
            (
                b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom<\x06t\xbfmdat",
                "video/mp4",
            ),
            (b"\x1A\x45\xDF\xA3\x01", "video/webm"),
            (b"\x00\x01\x00\x00\x00", "font/ttf"),
            (b"OTTO\x00", "font/otf"),
            (b"ttcf\x00", "font/collection"),
            (b"wOFF\x00", "font/woff"),
            (b"wOF2\x00", "font/woff2"),
            (b"\x1F\x8B\x08\x08", "application/x-gzip"),
            (b"PK\x03\x04\x0A", "application/zip"),
            (b"Rar!\x1A\x07\x00", "application/x-rar-compressed"),
            (b"Rar!\x1A\x07\x01\x00", "application/x-rar-compressed"),
            (b"\x00\x61\x73\x6D\x01", "application/wasm"),
            (b"\x1b[0m text", "text/plain; charset=utf-8"),
        ];
        for (data, want) in cases {
            assert_eq!(detect(data), *want, "{data:?}");
        }
        let mut eot = vec![0u8; 34];
        eot.extend_from_slice(b"LPxx");
        assert_eq!(detect(&eot), "application/vnd.ms-fontobject");
        // Only the first 512 bytes count.
        let mut late = vec![b'a'; 512];
        late.push(0);
        assert_eq!(detect(&late), "text/plain; charset=utf-8");
    }
}
