//! Just enough SPDY/3.1 for the fake kubelet to serve a real `kubectl
//! exec` and `kubectl port-forward` through kube-apiserver: the upgrade
//! answer, SYN_STREAM / SYN_REPLY with zlib-compressed header blocks,
//! DATA with FIN, RST_STREAM, PING, GOAWAY (read and ignored),
//! WINDOW_UPDATE and SETTINGS (ignored: the peer's spdystream keeps no
//! flow-control window either).
//!
//! Written from the SPDY/3 draft (framing, section 2.2; the header block
//! and its compression dictionary, 2.6.10) and the Kubernetes streaming
//! protocols as documented: `v4.channel.k8s.io` exec (one stream per
//! `streamType` header: error, stdin, stdout, stderr; the error stream
//! ends with a JSON `metav1.Status`) and `portforward.k8s.io` (an error
//! and a data stream per connection, matched by `requestID`).
//!
//! The peer compresses its header blocks with the spec's preset
//! dictionary. flate2 here has the pure-Rust backend, which takes no
//! dictionary; so the inflater is primed with a stored (uncompressed)
//! deflate block holding the dictionary, whose output is dropped, and
//! then fed the peer's raw deflate data: its back-references into the
//! dictionary resolve into that block. The peer's DICTID must equal the
//! dictionary's Adler-32, which checks the dictionary too. Our own header
//! blocks are compressed without a dictionary (a zlib stream without
//! FDICT, which the peer's reader accepts).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::sync::atomic::Ordering;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::kubelet::{Head, Stats};

type Tls = rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;
const FLAG_FIN: u8 = 0x01;

/// The SPDY/3 header dictionary (draft section 2.6.10.1): these names,
/// each with a 4-byte big-endian length before it, then a tail of status
/// codes, reason phrases, dates and media types.
fn dictionary() -> Vec<u8> {
    const WORDS: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    let mut d = Vec::new();
    for w in WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    let codes = "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505";
    let phrases = "203 Non-Authoritative Information204 No Content301 Moved Permanently\
                   400 Bad Request401 Unauthorized403 Forbidden404 Not Found\
                   500 Internal Server Error501 Not Implemented503 Service Unavailable";
    let dates = "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 \
                 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT";
    let types = "chunked,text/html,image/png,image/jpg,image/gif,application/xml,\
                 application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=\
                 gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
    for s in [codes, phrases, dates, types] {
        d.extend_from_slice(s.as_bytes());
    }
    d
}

/// Adler-32 (RFC 1950), to check the peer's DICTID.
fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + x as u32) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// The peer's header blocks, one zlib stream across the connection.
struct Inflater {
    z: Decompress,
    /// Dictionary bytes still to drop from the output.
    skip: usize,
    started: bool,
}

impl Inflater {
    fn new() -> Inflater {
        Inflater {
            z: Decompress::new(false),
            skip: 0,
            started: false,
        }
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        let mut data = input;
        if !self.started {
            // CMF, FLG (FDICT set), DICTID.
            if data.len() < 6 || data[1] & 0x20 == 0 {
                return Err(format!(
                    "header block without a zlib dictionary: {data:02x?}"
                ));
            }
            let dict = dictionary();
            let id = u32::from_be_bytes([data[2], data[3], data[4], data[5]]);
            if id != adler32(&dict) {
                return Err(format!(
                    "peer's DICTID {id:08x} is not our dictionary's {:08x}",
                    adler32(&dict)
                ));
            }
            // A stored, non-final deflate block holding the dictionary.
            let len = dict.len() as u16;
            let mut primer = vec![0u8];
            primer.extend_from_slice(&len.to_le_bytes());
            primer.extend_from_slice(&(!len).to_le_bytes());
            primer.extend_from_slice(&dict);
            self.skip = dict.len();
            self.started = true;
            let out = self.run(&primer)?;
            assert!(out.is_empty());
            data = &data[6..];
        }
        self.run(data)
    }

    fn run(&mut self, mut input: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let (i0, o0) = (self.z.total_in(), self.z.total_out());
            let st = self
                .z
                .decompress(input, &mut buf, FlushDecompress::Sync)
                .map_err(|e| format!("inflate: {e}"))?;
            let used = (self.z.total_in() - i0) as usize;
            let made = (self.z.total_out() - o0) as usize;
            input = &input[used..];
            let mut produced = &buf[..made];
            let drop = self.skip.min(produced.len());
            self.skip -= drop;
            produced = &produced[drop..];
            out.extend_from_slice(produced);
            if st == Status::StreamEnd || (input.is_empty() && made < buf.len()) {
                return Ok(out);
            }
            if used == 0 && made == 0 {
                return Ok(out);
            }
        }
    }
}

/// Our header blocks: one zlib stream, no dictionary, a sync flush per
/// block.
struct Deflater(Compress);

impl Deflater {
    fn block(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (n, v) in headers {
            for s in [n, v] {
                raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                raw.extend_from_slice(s.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            out.reserve(256);
            let before = self.0.total_in();
            self.0
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .expect("deflate");
            input = &input[(self.0.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                return out;
            }
        }
    }
}

/// Parses a header block: (lower-case name, value) pairs.
fn parse_headers(b: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut at = 0;
    let u32_at = |at: &mut usize| -> Result<usize, String> {
        let v = b
            .get(*at..*at + 4)
            .ok_or("short header block")?
            .try_into()
            .map(u32::from_be_bytes)
            .map_err(|_| "short")?;
        *at += 4;
        Ok(v as usize)
    };
    let n = u32_at(&mut at)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut two = [String::new(), String::new()];
        for s in &mut two {
            let len = u32_at(&mut at)?;
            let bytes = b.get(at..at + len).ok_or("short header block")?;
            *s = String::from_utf8_lossy(bytes).into_owned();
            at += len;
        }
        let [name, value] = two;
        out.push((name.to_ascii_lowercase(), value));
    }
    Ok(out)
}

enum Frame {
    Control {
        kind: u16,
        flags: u8,
        data: Vec<u8>,
    },
    Data {
        stream: u32,
        flags: u8,
        data: Vec<u8>,
    },
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Frame> {
    let mut h = [0u8; 8];
    r.read_exact(&mut h)?;
    let flags = h[4];
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    let mut data = vec![0u8; len];
    r.read_exact(&mut data)?;
    if h[0] & 0x80 != 0 {
        let version = u16::from_be_bytes([h[0] & 0x7f, h[1]]);
        if version != 3 {
            return Err(std::io::Error::other(format!("SPDY version {version}")));
        }
        Ok(Frame::Control {
            kind: u16::from_be_bytes([h[2], h[3]]),
            flags,
            data,
        })
    } else {
        Ok(Frame::Data {
            stream: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
            flags,
            data,
        })
    }
}

fn control(kind: u16, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80, 3];
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(data);
    f
}

fn data_frame(stream: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut f = stream.to_be_bytes().to_vec();
    f.push(flags);
    f.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(data);
    f
}

/// One SPDY session on the kubelet's side.
struct Session<'a> {
    w: &'a mut Tls,
    deflate: &'a mut Deflater,
}

impl Session<'_> {
    fn send(&mut self, frame: &[u8]) -> Result<(), String> {
        self.w
            .write_all(frame)
            .and_then(|_| self.w.flush())
            .map_err(|e| format!("write: {e}"))
    }

    fn reply(&mut self, stream: u32) -> Result<(), String> {
        let mut d = stream.to_be_bytes().to_vec();
        d.extend_from_slice(&self.deflate.block(&[]));
        self.send(&control(SYN_REPLY, 0, &d))
    }

    /// Data on `stream` in frames of at most 32 KiB, FIN on the last when
    /// `fin` (an empty FIN frame for empty data).
    fn data(&mut self, stream: u32, data: &[u8], fin: bool) -> Result<(), String> {
        if data.is_empty() {
            return if fin {
                self.send(&data_frame(stream, FLAG_FIN, &[]))
            } else {
                Ok(())
            };
        }
        let chunks: Vec<&[u8]> = data.chunks(32 * 1024).collect();
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            self.send(&data_frame(
                stream,
                if fin && last { FLAG_FIN } else { 0 },
                c,
            ))?;
        }
        Ok(())
    }
}

/// `%xx` and `+` decoding of a query value (a bad escape stays as it is).
fn unescape(v: &str) -> String {
    percent_encoding::percent_decode_str(&v.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Answers an `/exec/...` or `/portForward/...` upgrade and serves the
/// session until the peer closes it. A request that is not a SPDY/3.1
/// upgrade gets 400.
pub(crate) fn serve_upgrade(mut r: BufReader<Tls>, head: &Head, st: &Stats) {
    let exec = head.path().starts_with("/exec/");
    let want = if exec {
        "v4.channel.k8s.io"
    } else {
        "portforward.k8s.io"
    };
    let offered: Vec<String> = head
        .all("x-stream-protocol-version")
        .iter()
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .collect();
    let upgrade = head.header("upgrade").unwrap_or("");
    if !upgrade.eq_ignore_ascii_case("SPDY/3.1") || !offered.iter().any(|v| v == want) {
        let body = format!("want an upgrade to SPDY/3.1 with {want}; got {upgrade:?} {offered:?}");
        let _ = write!(
            r.get_mut(),
            "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = r.get_mut().flush();
        return;
    }
    let w = r.get_mut();
    if write!(
        w,
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {want}\r\n\r\n"
    )
    .and_then(|_| w.flush())
    .is_err()
    {
        return;
    }
    let result = if exec {
        let command: Vec<String> = head
            .query_all("command")
            .iter()
            .map(|c| unescape(c))
            .collect();
        let expect: Vec<&str> = [
            ("stdin", "input"),
            ("stdout", "output"),
            ("stderr", "error"),
        ]
        .iter()
        .filter(|(_, q)| {
            head.query(q).as_deref() == Some("1") || head.query(q).as_deref() == Some("true")
        })
        .map(|(s, _)| *s)
        .collect();
        serve_exec(&mut r, &command, &expect, st)
    } else {
        serve_port_forward(&mut r, st)
    };
    if let Err(e) = result {
        eprintln!("fake kubelet: SPDY session for {}: {e}", head.target);
    }
}

/// The next frame, answering PINGs and skipping what needs no action;
/// `None` when the peer closed the connection.
fn next_frame(
    r: &mut BufReader<Tls>,
    inflate: &mut Inflater,
) -> Result<Option<(u32, Incoming)>, String> {
    loop {
        let f = match read_frame(r) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(format!("read frame: {e}")),
        };
        match f {
            Frame::Data {
                stream,
                flags,
                data,
            } => return Ok(Some((stream, Incoming::Data(data, flags & FLAG_FIN != 0)))),
            Frame::Control { kind, flags, data } => match kind {
                SYN_STREAM => {
                    if data.len() < 10 {
                        return Err("short SYN_STREAM".into());
                    }
                    let id = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) & 0x7fff_ffff;
                    let block = inflate.inflate(&data[10..])?;
                    let headers = parse_headers(&block)?;
                    return Ok(Some((id, Incoming::Syn(headers, flags & FLAG_FIN != 0))));
                }
                RST_STREAM => {
                    let id = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) & 0x7fff_ffff;
                    return Ok(Some((id, Incoming::Reset)));
                }
                PING => return Ok(Some((0, Incoming::Ping(data)))),
                HEADERS => {
                    // Keep the zlib stream in step.
                    if data.len() > 4 {
                        inflate.inflate(&data[4..])?;
                    }
                }
                GOAWAY | SETTINGS | WINDOW_UPDATE => {}
                other => return Err(format!("unexpected control frame {other}")),
            },
        }
    }
}

enum Incoming {
    Syn(Vec<(String, String)>, bool),
    Data(Vec<u8>, bool),
    Reset,
    Ping(Vec<u8>),
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> &'a str {
    h.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// Exec: `echo ARGS...` writes its arguments; `cat` copies stdin to
/// stdout; `exit N` ends with exit code N; anything else exit code 127.
fn serve_exec(
    r: &mut BufReader<Tls>,
    command: &[String],
    expect: &[&str],
    st: &Stats,
) -> Result<(), String> {
    let mut inflate = Inflater::new();
    let mut deflate = Deflater(Compress::new(Compression::default(), true));
    let mut streams: HashMap<String, u32> = HashMap::new();
    let program = command.first().map(String::as_str).unwrap_or("");
    let mut finished = false;
    while let Some((id, msg)) = next_frame(r, &mut inflate)? {
        let mut s = Session {
            w: r.get_mut(),
            deflate: &mut deflate,
        };
        match msg {
            Incoming::Ping(p) => s.send(&control(PING, 0, &p))?,
            Incoming::Syn(h, _) => {
                streams.insert(header(&h, "streamtype").to_string(), id);
                s.reply(id)?;
            }
            Incoming::Data(d, fin) => {
                if program == "cat" && !finished && Some(&id) == streams.get("stdin") {
                    if let Some(&out) = streams.get("stdout") {
                        s.data(out, &d, false)?;
                    }
                    if fin {
                        finish(&mut s, &streams, 0)?;
                        finished = true;
                        st.exec_done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            Incoming::Reset => {}
        }
        // Every stream there: run what needs no stdin.
        let all = streams.contains_key("error") && expect.iter().all(|k| streams.contains_key(*k));
        if all && !finished && program != "cat" {
            let code = match program {
                "echo" => {
                    let line = format!("{}\n", command[1..].join(" "));
                    if let Some(&out) = streams.get("stdout") {
                        s.data(out, line.as_bytes(), false)?;
                    }
                    0
                }
                "exit" => command.get(1).and_then(|c| c.parse().ok()).unwrap_or(1),
                _ => 127,
            };
            finish(&mut s, &streams, code)?;
            finished = true;
            st.exec_done.fetch_add(1, Ordering::SeqCst);
        }
    }
    Ok(())
}

/// FIN on stdout and stderr, then the exit status on the error stream.
fn finish(s: &mut Session, streams: &HashMap<String, u32>, code: i32) -> Result<(), String> {
    for k in ["stdout", "stderr"] {
        if let Some(&id) = streams.get(k) {
            s.data(id, &[], true)?;
        }
    }
    let status = if code == 0 {
        r#"{"metadata":{},"status":"Success"}"#.to_string()
    } else {
        format!(
            r#"{{"metadata":{{}},"status":"Failure","message":"command terminated with non-zero exit code: exit status {code}","reason":"NonZeroExitCode","details":{{"causes":[{{"reason":"ExitCode","message":"{code}"}}]}}}}"#
        )
    };
    let err = *streams.get("error").ok_or("no error stream")?;
    s.data(err, status.as_bytes(), true)
}

/// Port-forward: each `requestID` has an error and a data stream; data
/// is echoed; when the peer ends the data stream, both get our FIN.
fn serve_port_forward(r: &mut BufReader<Tls>, st: &Stats) -> Result<(), String> {
    let mut inflate = Inflater::new();
    let mut deflate = Deflater(Compress::new(Compression::default(), true));
    // stream id -> (request id, stream type)
    let mut kinds: HashMap<u32, (String, String)> = HashMap::new();
    // request id -> its error stream
    let mut errors: HashMap<String, u32> = HashMap::new();
    while let Some((id, msg)) = next_frame(r, &mut inflate)? {
        let mut s = Session {
            w: r.get_mut(),
            deflate: &mut deflate,
        };
        match msg {
            Incoming::Ping(p) => s.send(&control(PING, 0, &p))?,
            Incoming::Syn(h, _) => {
                let req = header(&h, "requestid").to_string();
                let kind = header(&h, "streamtype").to_string();
                if kind == "error" {
                    errors.insert(req.clone(), id);
                }
                kinds.insert(id, (req, kind));
                s.reply(id)?;
            }
            Incoming::Data(d, fin) => {
                let Some((req, kind)) = kinds.get(&id) else {
                    continue;
                };
                if kind != "data" {
                    continue;
                }
                s.data(id, &d, fin)?;
                if fin {
                    if let Some(&e) = errors.get(req) {
                        s.data(e, &[], true)?;
                    }
                    st.portforward_done.fetch_add(1, Ordering::SeqCst);
                }
            }
            Incoming::Reset => {}
        }
    }
    Ok(())
}
