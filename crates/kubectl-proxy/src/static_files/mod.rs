//! `--www` static files under `--www-prefix`, as Go's `http.FileServer`
//! (net/http/fs.go `serveFile`/`serveContent`) answers them: redirects to
//! canonical paths, `index.html`, directory listings, Last-Modified and the
//! conditional headers ([`cond`]), single and multiple byte ranges
//! ([`ranges`]), MIME types from the extension ([`mime`]) or by sniffing
//! ([`sniff`]), no ETag. One deliberate difference: nothing outside the
//! directory is served, not even through a symbolic link (Go follows
//! links). All file-system work runs on a small blocking pool ([`pool`]),
//! never on a data-plane core.

pub mod pool;
// The header logic is sans-I/O, in the protocol crate; the old paths stay.
pub use protocol::kubectl::static_files::{cond, httpdate, ranges, sniff};

/// Extension to MIME type ([`protocol::kubectl::static_files::mime`])
/// and the process-wide table read from the system files.
pub mod mime {
    use std::sync::OnceLock;

    pub use protocol::kubectl::static_files::mime::*;

    /// The process-wide table, read from the system files on first use (call
    /// it off the data-plane cores: it may read files).
    pub fn system() -> &'static Table {
        static TABLE: OnceLock<Table> = OnceLock::new();
        TABLE.get_or_init(|| {
            let mut t = Table::builtin();
            for f in GLOBS_FILES {
                if let Ok(text) = std::fs::read(f) {
                    t.add_globs2(&String::from_utf8_lossy(&text));
                    return t;
                }
            }
            for f in TYPE_FILES {
                if let Ok(text) = std::fs::read(f) {
                    t.add_mime_types(&String::from_utf8_lossy(&text));
                }
            }
            t
        })
    }
}

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::forward::{error_response, reason};
use super::gourl::{clean, escape_path, html_escape};
use httpdate::Instant;
use protocol::http1::{self, Header};
use ranges::{ByteRange, Piece, RangeError};

/// How much of a file one pool job reads.
const CHUNK: usize = 64 * 1024;

/// What to send after the head.
pub enum Body {
    None,
    Bytes(Vec<u8>),
    /// Literal pieces and ranges of `file`, in order.
    File {
        file: Arc<File>,
        pieces: Vec<Piece>,
    },
}

/// A complete answer: the head (status line and headers) and the body.
pub struct StaticReply {
    pub head: Vec<u8>,
    pub body: Body,
}

/// The request as the file server needs it (owned: it crosses threads).
pub struct StaticRequest {
    /// The decoded path after the prefix.
    pub path: String,
    pub raw_query: String,
    pub method: String,
    pub headers: Vec<Header>,
    pub keep_alive: bool,
}

impl StaticRequest {
    fn header(&self, name: &str) -> Option<&str> {
        http1::get(&self.headers, name)
    }

    fn is_head(&self) -> bool {
        self.method == "HEAD"
    }
}

/// Serves `req` from `root` on the file pool.
pub async fn serve(root: PathBuf, req: StaticRequest) -> StaticReply {
    let keep = req.keep_alive;
    pool::run(move || serve_blocking(&root, &req))
        .await
        .unwrap_or_else(|| bytes(error_response(500, "500 Internal Server Error", keep)))
}

/// Writes `body`, reading file ranges on the file pool.
pub async fn write_body<W: AsyncWrite + Unpin>(w: &mut W, body: Body) -> io::Result<()> {
    match body {
        Body::None => Ok(()),
        Body::Bytes(b) => w.write_all(&b).await,
        Body::File { file, pieces } => {
            for p in pieces {
                match p {
                    Piece::Bytes(b) => w.write_all(&b).await?,
                    Piece::File(r) => write_range(w, &file, r).await?,
                }
            }
            Ok(())
        }
    }
}

async fn write_range<W: AsyncWrite + Unpin>(
    w: &mut W,
    file: &Arc<File>,
    r: ByteRange,
) -> io::Result<()> {
    let (mut off, end) = (r.start, r.start + r.len);
    while off < end {
        let want = ((end - off) as usize).min(CHUNK);
        let f = Arc::clone(file);
        let chunk = pool::run(move || read_full_at(&f, off, want))
            .await
            .ok_or_else(|| io::Error::other("file pool gone"))??;
        if chunk.len() < want {
            // The file shrank under us: end the connection, as Go does.
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        w.write_all(&chunk).await?;
        off += want as u64;
    }
    Ok(())
}

/// Up to `want` bytes at `off` (fewer only at end of file).
fn read_full_at(file: &File, off: u64, want: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

fn bytes(all: Vec<u8>) -> StaticReply {
    StaticReply {
        head: all,
        body: Body::None,
    }
}

/// A generated answer; a HEAD request gets the head alone (with the
/// length the body would have had, as Go's server reports it).
fn answer(all: Vec<u8>, req: &StaticRequest) -> StaticReply {
    if req.is_head() {
        if let Some(p) = all.windows(4).position(|w| w == b"\r\n\r\n") {
            return bytes(all[..p + 4].to_vec());
        }
    }
    bytes(all)
}

/// A head with headers in Go's (sorted) order; `len` None: no
/// Content-Length (304).
fn head(status: u16, headers: &[(&str, &str)], len: Option<u64>, keep: bool) -> Vec<u8> {
    let reason = match status {
        206 => "Partial Content",
        412 => "Precondition Failed",
        416 => "Requested Range Not Satisfiable",
        s => reason(s),
    };
    let mut all: Vec<(&str, String)> = headers.iter().map(|(n, v)| (*n, v.to_string())).collect();
    if let Some(l) = len {
        all.push(("Content-Length", l.to_string()));
    }
    // Go's server adds Date to every answer (item 7 of issue 14).
    all.push(("Date", crate::forward::now_http_date()));
    all.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
    for (n, v) in all {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    if !keep {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.into_bytes()
}

fn redirect(location: &str, req: &StaticRequest) -> StaticReply {
    let loc = if req.raw_query.is_empty() {
        location.to_string()
    } else {
        format!("{location}?{}", req.raw_query)
    };
    bytes(head(
        301,
        &[("Location", &loc)],
        empty_len(req),
        req.keep_alive,
    ))
}

/// The Content-Length Go's server gives an answer whose handler wrote no
/// body and set no length: 0, except for HEAD, where it cannot know.
fn empty_len(req: &StaticRequest) -> Option<u64> {
    (!req.is_head()).then_some(0)
}

/// Resolves `name` (a cleaned, rooted path) under `root`, refusing anything
/// that lands outside it after following links.
fn resolve(root: &Path, name: &str) -> io::Result<PathBuf> {
    let joined = root.join(name.trim_start_matches('/'));
    let real = joined.canonicalize()?;
    let real_root = root.canonicalize()?;
    if real.starts_with(&real_root) {
        Ok(real)
    } else {
        Err(io::ErrorKind::NotFound.into())
    }
}

/// Go's `toHTTPError`.
fn io_error(e: &io::Error, req: &StaticRequest) -> StaticReply {
    let keep = req.keep_alive;
    let all = match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => {
            error_response(404, "404 page not found", keep)
        }
        io::ErrorKind::PermissionDenied => error_response(403, "403 Forbidden", keep),
        _ => error_response(500, "500 Internal Server Error", keep),
    };
    answer(all, req)
}

fn open(root: &Path, name: &str) -> io::Result<(File, std::fs::Metadata)> {
    let file = File::open(resolve(root, name)?)?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

/// Go's `serveFile` with `redirect` set, on the calling (pool) thread.
fn serve_blocking(root: &Path, req: &StaticRequest) -> StaticReply {
    let upath = if req.path.starts_with('/') {
        req.path.clone()
    } else {
        format!("/{}", req.path)
    };
    if upath.ends_with("/index.html") {
        return redirect("./", req);
    }
    let name = clean(&upath);
    let (mut file, mut meta) = match open(root, &name) {
        Ok(x) => x,
        Err(e) => return io_error(&e, req),
    };
    let mut base_name = base(&name).to_string();
    if meta.is_dir() {
        if !upath.ends_with('/') {
            return redirect(&format!("{}/", base(&upath)), req);
        }
        let index = format!("{}/index.html", name.trim_end_matches('/'));
        if let Ok((f, m)) = open(root, &index) {
            (file, meta, base_name) = (f, m, "index.html".to_string());
        }
    } else if upath.ends_with('/') {
        let b = base(&upath);
        let b = if b == "/" || b == "." { "" } else { b };
        return redirect(&format!("../{b}"), req);
    }
    let mtime = meta.modified().ok().and_then(Instant::of_mtime);
    if meta.is_dir() {
        if cond::if_modified_since(&req.method, req.header("if-modified-since"), mtime) {
            return bytes(head(304, &[], None, req.keep_alive));
        }
        return dir_listing(root, &name, &base_name, mtime, req);
    }
    serve_content(file, &meta, &base_name, mtime, req)
}

/// Go's `path.Base`.
fn base(p: &str) -> &str {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        return "/";
    }
    t.rsplit('/').next().unwrap_or(t)
}

/// Go's `dirList`, for the directory `name` (or its `index.html` when that
/// is itself a directory).
fn dir_listing(
    root: &Path,
    name: &str,
    base_name: &str,
    mtime: Option<Instant>,
    req: &StaticRequest,
) -> StaticReply {
    let dir = if base_name == "index.html" {
        format!("{}/index.html", name.trim_end_matches('/'))
    } else {
        name.to_string()
    };
    let listing = resolve(root, &dir).and_then(std::fs::read_dir).map(|rd| {
        rd.filter_map(Result::ok)
            .map(|e| {
                let mut n = e.file_name().to_string_lossy().into_owned();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    n.push('/');
                }
                n
            })
            .collect::<Vec<_>>()
    });
    let mut names = match listing {
        Ok(n) => n,
        Err(_) => {
            return answer(
                error_response(500, "Error reading directory", req.keep_alive),
                req,
            )
        }
    };
    names.sort();
    let mut body = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for n in &names {
        let mut href = escape_path(n).replace('#', "%23");
        if href.split('/').next().is_some_and(|s| s.contains(':')) {
            href = format!("./{href}");
        }
        body.push_str(&format!("<a href=\"{href}\">{}</a>\n", html_escape(n)));
    }
    body.push_str("</pre>\n");
    let lm = mtime.map(|t| httpdate::format(t.secs));
    let mut hs = vec![("Content-Type", "text/html; charset=utf-8")];
    if let Some(lm) = &lm {
        hs.push(("Last-Modified", lm));
    }
    let h = head(200, &hs, Some(body.len() as u64), req.keep_alive);
    StaticReply {
        head: h,
        body: if req.is_head() {
            Body::None
        } else {
            Body::Bytes(body.into_bytes())
        },
    }
}

/// Go's `serveError` for ranges: `http.Error` without Last-Modified.
fn range_error(e: RangeError, size: u64, req: &StaticRequest) -> StaticReply {
    let text = format!("{e}\n");
    let cr = format!("bytes */{size}");
    let mut hs = vec![
        ("Content-Type", "text/plain; charset=utf-8"),
        ("X-Content-Type-Options", "nosniff"),
    ];
    if e == RangeError::NoOverlap {
        hs.push(("Content-Range", &cr));
    }
    let h = head(416, &hs, Some(text.len() as u64), req.keep_alive);
    StaticReply {
        head: h,
        body: if req.is_head() {
            Body::None
        } else {
            Body::Bytes(text.into_bytes())
        },
    }
}

/// Go's `serveContent` for a regular file.
fn serve_content(
    file: File,
    meta: &std::fs::Metadata,
    name: &str,
    mtime: Option<Instant>,
    req: &StaticRequest,
) -> StaticReply {
    let keep = req.keep_alive;
    let lm = mtime.map(|t| httpdate::format(t.secs));
    let lm_header: Vec<(&str, &str)> = lm.iter().map(|l| ("Last-Modified", l.as_str())).collect();
    let conds = cond::Conditions {
        method: &req.method,
        if_match: req.header("if-match"),
        if_unmodified_since: req.header("if-unmodified-since"),
        if_none_match: req.header("if-none-match"),
        if_modified_since: req.header("if-modified-since"),
        if_range: req.header("if-range"),
        range: req.header("range"),
    };
    let range = match cond::decide(&conds, mtime) {
        cond::Decision::PreconditionFailed => {
            return bytes(head(412, &lm_header, empty_len(req), keep));
        }
        cond::Decision::NotModified => return bytes(head(304, &lm_header, None, keep)),
        cond::Decision::Serve(r) => r,
    };
    let ctype = match mime::system().lookup(mime::ext(name)) {
        Some(t) => t.to_string(),
        None => match read_full_at(&file, 0, sniff::SNIFF_LEN) {
            Ok(start) => sniff::detect(&start).to_string(),
            Err(e) => return io_error(&e, req),
        },
    };
    let size = meta.len();
    let mut ranges = match ranges::parse(range, size) {
        Ok(r) => r,
        Err(RangeError::NoOverlap) if size == 0 => Vec::new(),
        Err(e) => return range_error(e, size, req),
    };
    if ranges::total(&ranges) > size {
        ranges.clear();
    }
    // (status, length, body pieces, Content-Range, Content-Type)
    let (status, len, pieces, cr, ct) = match ranges.as_slice() {
        [] => (
            200,
            size,
            vec![Piece::File(ByteRange {
                start: 0,
                len: size,
            })],
            None,
            ctype,
        ),
        [one] => (
            206,
            one.len,
            vec![Piece::File(*one)],
            Some(one.content_range(size)),
            ctype,
        ),
        many => {
            let b = ranges::boundary();
            let (p, l) = ranges::multipart(many, &ctype, size, &b);
            (
                206,
                l,
                p,
                None,
                format!("multipart/byteranges; boundary={b}"),
            )
        }
    };
    let mut hs: Vec<(&str, &str)> = vec![("Accept-Ranges", "bytes"), ("Content-Type", &ct)];
    hs.extend_from_slice(&lm_header);
    if let Some(cr) = &cr {
        hs.push(("Content-Range", cr));
    }
    StaticReply {
        head: head(status, &hs, Some(len), keep),
        body: if req.is_head() || len == 0 {
            Body::None
        } else {
            Body::File {
                file: Arc::new(file),
                pieces,
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, query: &str, method: &str, headers: &[(&str, &str)]) -> StaticRequest {
        StaticRequest {
            path: path.into(),
            raw_query: query.into(),
            method: method.into(),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_string(),
                    value: v.as_bytes().to_vec(),
                })
                .collect(),
            keep_alive: true,
        }
    }

    fn text(r: &StaticReply) -> String {
        let mut s = String::from_utf8_lossy(&r.head).into_owned();
        if let Body::Bytes(b) = &r.body {
            s.push_str(&String::from_utf8_lossy(b));
        }
        s
    }

    #[test]
    fn answers_carry_a_date_as_go_servers_do() {
        let h =
            String::from_utf8(head(200, &[("Content-Type", "text/plain")], Some(1), true)).unwrap();
        let date = h
            .lines()
            .find(|l| l.starts_with("Date: "))
            .expect("a Date header");
        assert!(date.ends_with(" GMT"), "{date}");
        let names: Vec<&str> = h
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(n, _)| n)
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "Go's sorted header order");
    }

    #[test]
    fn serves_files_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link")).unwrap();
        let d = dir.path();
        let ok = text(&serve_blocking(d, &req("a.txt", "", "GET", &[])));
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.contains("Content-Length: 5\r\n"),
            "{ok}"
        );
        let esc = text(&serve_blocking(d, &req("../../etc/passwd", "", "GET", &[])));
        assert!(esc.starts_with("HTTP/1.1 404"), "{esc}");
        let link = text(&serve_blocking(d, &req("link", "", "GET", &[])));
        assert!(link.starts_with("HTTP/1.1 404"), "{link}");
        let r = text(&serve_blocking(d, &req("sub", "q=1", "GET", &[])));
        assert!(
            r.starts_with("HTTP/1.1 301") && r.contains("Location: sub/?q=1\r\n"),
            "{r}"
        );
        let l = text(&serve_blocking(d, &req("", "", "GET", &[])));
        assert!(
            l.contains("<a href=\"a.txt\">a.txt</a>") && l.contains("<a href=\"sub/\">sub/</a>"),
            "{l}"
        );
        // HEAD: the listing's length, no body; errors without their text.
        let h = serve_blocking(d, &req("", "", "HEAD", &[]));
        assert!(matches!(h.body, Body::None) && text(&h).contains("Content-Length: 1"));
        let nf = text(&serve_blocking(d, &req("nope", "", "HEAD", &[])));
        assert!(
            nf.ends_with("\r\n\r\n") && nf.contains("Content-Length: 19\r\n"),
            "{nf}"
        );
    }

    #[test]
    fn ranges_and_conditions() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "0123456789").unwrap();
        let d = dir.path();
        let one = serve_blocking(d, &req("f", "", "GET", &[("Range", "bytes=2-4")]));
        let t = text(&one);
        assert!(t.starts_with("HTTP/1.1 206") && t.contains("Content-Range: bytes 2-4/10\r\n"));
        assert!(
            matches!(one.body, Body::File { ref pieces, .. } if pieces == &[Piece::File(ByteRange { start: 2, len: 3 })])
        );
        let many = text(&serve_blocking(
            d,
            &req("f", "", "GET", &[("Range", "bytes=0-0,-1")]),
        ));
        assert!(
            many.contains("Content-Type: multipart/byteranges; boundary="),
            "{many}"
        );
        let none = text(&serve_blocking(
            d,
            &req("f", "", "GET", &[("Range", "bytes=10-")]),
        ));
        assert!(none.starts_with("HTTP/1.1 416") && none.contains("Content-Range: bytes */10\r\n"));
        assert!(!none.contains("Last-Modified"), "{none}");
        let pf = text(&serve_blocking(
            d,
            &req("f", "", "GET", &[("If-Match", "\"x\"")]),
        ));
        assert!(
            pf.starts_with("HTTP/1.1 412") && pf.contains("Last-Modified: "),
            "{pf}"
        );
        let nm = text(&serve_blocking(
            d,
            &req("f", "", "GET", &[("If-None-Match", "*")]),
        ));
        assert!(
            nm.starts_with("HTTP/1.1 304") && !nm.contains("Content-Length"),
            "{nm}"
        );
        // Sniffed: no extension, binary start.
        std::fs::write(dir.path().join("png"), b"\x89PNG\r\n\x1a\n....").unwrap();
        let png = text(&serve_blocking(d, &req("png", "", "GET", &[])));
        assert!(png.contains("Content-Type: image/png\r\n"), "{png}");
    }
}
