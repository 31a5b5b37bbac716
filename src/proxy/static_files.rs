//! `--www` static files under `--www-prefix`, as Go's `http.FileServer`
//! answers them (redirects to canonical paths, `index.html`, directory
//! listings, Last-Modified / If-Modified-Since, a single byte range), with
//! one deliberate difference: nothing outside the directory is served, not
//! even through a symbolic link (Go follows links).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::forward::{error_response, simple_response};
use super::gourl::{clean, escape_path, html_escape};
use super::http1::{self, Header};

/// What to send: a head and body bytes, or a head and a file range.
pub enum StaticReply {
    Bytes(Vec<u8>),
    File {
        head: Vec<u8>,
        file: File,
        offset: u64,
        len: u64,
    },
}

fn redirect(location: &str, query: &str, keep: bool) -> StaticReply {
    let loc = if query.is_empty() {
        location.to_string()
    } else {
        format!("{location}?{query}")
    };
    StaticReply::Bytes(simple_response(301, None, &[("Location", &loc)], b"", keep))
}

fn not_found(keep: bool) -> StaticReply {
    StaticReply::Bytes(error_response(404, "404 page not found", keep))
}

/// Resolves `name` (a cleaned, rooted path) under `root`, refusing anything
/// that lands outside it after following links.
fn resolve(root: &Path, name: &str) -> Result<PathBuf, std::io::Error> {
    let joined = root.join(name.trim_start_matches('/'));
    let real = joined.canonicalize()?;
    let real_root = root.canonicalize()?;
    if real.starts_with(&real_root) {
        Ok(real)
    } else {
        Err(std::io::ErrorKind::NotFound.into())
    }
}

fn io_error(e: &std::io::Error, keep: bool) -> StaticReply {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => not_found(keep),
        std::io::ErrorKind::PermissionDenied => {
            StaticReply::Bytes(error_response(403, "403 Forbidden", keep))
        }
        _ => StaticReply::Bytes(error_response(500, "500 Internal Server Error", keep)),
    }
}

/// Serves `url_path` (the decoded path after the prefix) from `root`.
pub fn serve(
    root: &Path,
    url_path: &str,
    raw_query: &str,
    method: &str,
    headers: &[Header],
    keep: bool,
) -> StaticReply {
    let upath = if url_path.starts_with('/') {
        url_path.to_string()
    } else {
        format!("/{url_path}")
    };
    if upath.ends_with("/index.html") {
        return redirect("./", raw_query, keep);
    }
    let name = clean(&upath);
    let path = match resolve(root, &name) {
        Ok(p) => p,
        Err(e) => return io_error(&e, keep),
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => return io_error(&e, keep),
    };
    if meta.is_dir() {
        if !upath.ends_with('/') {
            return redirect(&format!("{}/", base(&upath)), raw_query, keep);
        }
        let index = path.join("index.html");
        if let Ok(m) = std::fs::metadata(&index) {
            if m.is_file() {
                return file_reply(&index, &m, "index.html", method, headers, keep);
            }
        }
        return dir_listing(&path, &meta, method, headers, keep);
    }
    if upath.ends_with('/') {
        let b = base(&upath);
        let b = if b == "/" || b == "." { "" } else { b };
        return redirect(&format!("../{b}"), raw_query, keep);
    }
    file_reply(&path, &meta, &name, method, headers, keep)
}

/// Go's `path.Base`.
fn base(p: &str) -> &str {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        return "/";
    }
    t.rsplit('/').next().unwrap_or(t)
}

fn not_modified(meta: &std::fs::Metadata, headers: &[Header]) -> bool {
    let (Some(since), Ok(mtime)) = (http1::get(headers, "if-modified-since"), meta.modified())
    else {
        return false;
    };
    match parse_http_date(since) {
        Some(t) => unix_secs(mtime) <= t,
        None => false,
    }
}

fn dir_listing(
    path: &Path,
    meta: &std::fs::Metadata,
    method: &str,
    headers: &[Header],
    keep: bool,
) -> StaticReply {
    if not_modified(meta, headers) {
        return StaticReply::Bytes(simple_response(304, None, &[], b"", keep));
    }
    let mut names: Vec<String> = match std::fs::read_dir(path) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|e| {
                let mut n = e.file_name().to_string_lossy().into_owned();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    n.push('/');
                }
                n
            })
            .collect(),
        Err(e) => return io_error(&e, keep),
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
    let lm = meta.modified().map(http_date).unwrap_or_default();
    let body = if method == "HEAD" {
        Vec::new()
    } else {
        body.into_bytes()
    };
    StaticReply::Bytes(simple_response(
        200,
        Some("text/html; charset=utf-8"),
        &[("Last-Modified", &lm)],
        &body,
        keep,
    ))
}

fn file_reply(
    path: &Path,
    meta: &std::fs::Metadata,
    name: &str,
    method: &str,
    headers: &[Header],
    keep: bool,
) -> StaticReply {
    if not_modified(meta, headers) {
        return StaticReply::Bytes(simple_response(304, None, &[], b"", keep));
    }
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return io_error(&e, keep),
    };
    let size = meta.len();
    let ctype = content_type(name, &mut file);
    let lm = meta.modified().map(http_date).unwrap_or_default();
    let (status, offset, len, range_hdr) =
        match http1::get(headers, "range").and_then(|r| parse_range(r, size)) {
            Some(Ok((start, end))) => (
                206,
                start,
                end - start + 1,
                Some(format!("bytes {start}-{end}/{size}")),
            ),
            Some(Err(())) => {
                let cr = format!("bytes */{size}");
                return StaticReply::Bytes(simple_response(
                    416,
                    Some("text/plain; charset=utf-8"),
                    &[("Content-Range", &cr)],
                    b"invalid range: failed to overlap\n",
                    keep,
                ));
            }
            None => (200, 0, size, None),
        };
    let mut extra = vec![("Accept-Ranges", "bytes"), ("Last-Modified", lm.as_str())];
    if let Some(r) = &range_hdr {
        extra.push(("Content-Range", r));
    }
    let mut head = simple_response(status, Some(&ctype), &extra, b"", keep);
    // simple_response wrote Content-Length: 0; put the real length in.
    let cl0 = b"Content-Length: 0\r\n";
    if let Some(pos) = head.windows(cl0.len()).position(|w| w == cl0) {
        head.splice(
            pos..pos + cl0.len(),
            format!("Content-Length: {len}\r\n").into_bytes(),
        );
    }
    if method == "HEAD" {
        return StaticReply::Bytes(head);
    }
    StaticReply::File {
        head,
        file,
        offset,
        len,
    }
}

/// A single `bytes=a-b` range: `None` to serve everything (absent, multi or
/// unparsable), `Err` when it cannot be satisfied.
fn parse_range(r: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = r.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 || size == 0 {
            return Some(Err(()));
        }
        return Some(Ok((size.saturating_sub(n), size - 1)));
    }
    let start: u64 = a.parse().ok()?;
    if start >= size {
        return Some(Err(()));
    }
    let end = if b.is_empty() {
        size - 1
    } else {
        b.parse::<u64>().ok()?.min(size - 1)
    };
    if end < start {
        return None;
    }
    Some(Ok((start, end)))
}

/// Go's built-in extension table, else a sniff of the first bytes.
fn content_type(name: &str, file: &mut File) -> String {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    let known = match ext.as_deref() {
        Some("avif") => Some("image/avif"),
        Some("css") => Some("text/css; charset=utf-8"),
        Some("gif") => Some("image/gif"),
        Some("htm") | Some("html") => Some("text/html; charset=utf-8"),
        Some("jpeg") | Some("jpg") => Some("image/jpeg"),
        Some("js") | Some("mjs") => Some("text/javascript; charset=utf-8"),
        Some("json") => Some("application/json"),
        Some("pdf") => Some("application/pdf"),
        Some("png") => Some("image/png"),
        Some("svg") => Some("image/svg+xml"),
        Some("wasm") => Some("application/wasm"),
        Some("webp") => Some("image/webp"),
        Some("xml") => Some("text/xml; charset=utf-8"),
        Some("txt") => Some("text/plain; charset=utf-8"),
        _ => None,
    };
    if let Some(k) = known {
        return k.to_string();
    }
    use std::io::Read;
    let mut buf = [0u8; 512];
    let n = file.read(&mut buf).unwrap_or(0);
    let _ = std::io::Seek::seek(file, std::io::SeekFrom::Start(0));
    let sniff = &buf[..n];
    let text = sniff
        .iter()
        .all(|&b| b >= 0x20 || b == b'\n' || b == b'\r' || b == b'\t' || b == 0x0c || b == 0x1b);
    if sniff.starts_with(b"<!DOCTYPE HTML") || sniff.starts_with(b"<html") {
        "text/html; charset=utf-8".into()
    } else if text {
        "text/plain; charset=utf-8".into()
    } else {
        "application/octet-stream".into()
    }
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Days since 1970-01-01 to (year, month 1-12, day).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `Mon, 02 Jan 2006 15:04:05 GMT`.
pub fn http_date(t: SystemTime) -> String {
    let s = unix_secs(t);
    let days = s.div_euclid(86_400);
    let rem = s.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn parse_http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let d: u32 = parts[1].parse().ok()?;
    let m = MONTHS.iter().position(|x| *x == parts[2])? as u32 + 1;
    let y: i64 = parts[3].parse().ok()?;
    let hms: Vec<i64> = parts[4]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_136_214_245);
        assert_eq!(http_date(t), "Mon, 02 Jan 2006 15:04:05 GMT");
        assert_eq!(
            parse_http_date("Mon, 02 Jan 2006 15:04:05 GMT"),
            Some(1_136_214_245)
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Some(Ok((0, 9))));
        assert_eq!(parse_range("bytes=-10", 100), Some(Ok((90, 99))));
        assert_eq!(parse_range("bytes=50-", 100), Some(Ok((50, 99))));
        assert_eq!(parse_range("bytes=200-", 100), Some(Err(())));
        assert_eq!(parse_range("bytes=0-1,3-4", 100), None);
    }

    #[test]
    fn serves_files_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link")).unwrap();
        let body = |r: StaticReply| match r {
            StaticReply::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
            StaticReply::File { head, .. } => String::from_utf8_lossy(&head).into_owned(),
        };
        let ok = body(serve(dir.path(), "a.txt", "", "GET", &[], true));
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.contains("Content-Length: 5\r\n"),
            "{ok}"
        );
        assert!(
            body(serve(dir.path(), "../../etc/passwd", "", "GET", &[], true))
                .starts_with("HTTP/1.1 404")
        );
        assert!(body(serve(dir.path(), "link", "", "GET", &[], true)).starts_with("HTTP/1.1 404"));
        let r = body(serve(dir.path(), "sub", "q=1", "GET", &[], true));
        assert!(
            r.starts_with("HTTP/1.1 301") && r.contains("Location: sub/?q=1\r\n"),
            "{r}"
        );
        let l = body(serve(dir.path(), "", "", "GET", &[], true));
        assert!(
            l.contains("<a href=\"a.txt\">a.txt</a>") && l.contains("<a href=\"sub/\">sub/</a>"),
            "{l}"
        );
    }
}
