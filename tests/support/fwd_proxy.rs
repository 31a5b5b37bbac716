//! Small recording forward proxies for the upstream-proxy tests, on real
//! sockets, thread per connection, written from RFC 7231 / RFC 1928 /
//! RFC 1929 independently of the proxy's own code: an HTTP proxy
//! (CONNECT tunnels, absolute-form requests forwarded one per upstream
//! connection) and a SOCKS5 proxy (optional user/password). Each records
//! one line per tunnel or request: `CONNECT host:port auth=…`,
//! `GET http://… auth=…`, `SOCKS host:port user=…`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

pub(crate) struct RecProxy {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl RecProxy {
    pub(crate) fn lines(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
    pub(crate) fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }
}

fn relay(a: TcpStream, b: TcpStream) {
    let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    let t = thread::spawn(move || {
        let _ = std::io::copy(&mut a2, &mut b2);
        let _ = b2.shutdown(Shutdown::Write);
    });
    let (mut a, mut b) = (a, b);
    let _ = std::io::copy(&mut b, &mut a);
    let _ = a.shutdown(Shutdown::Write);
    let _ = t.join();
}

fn serve<F>(bind: &str, f: F) -> RecProxy
where
    F: Fn(TcpStream, &Mutex<Vec<String>>) + Send + Sync + 'static,
{
    let l = TcpListener::bind(bind).expect("bind proxy");
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s2, f) = (seen.clone(), Arc::new(f));
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            let (s, f) = (s2.clone(), f.clone());
            thread::spawn(move || f(c, &s));
        }
    });
    RecProxy { addr, seen }
}

/// An HTTP proxy on `bind` (e.g. `127.0.0.1:0`).
pub(crate) fn start_http(bind: &str) -> RecProxy {
    serve(bind, |c, seen| {
        let mut r = BufReader::new(c.try_clone().unwrap());
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 {
                    return;
                }
                if h.trim().is_empty() {
                    break;
                }
                headers.push(h);
            }
            let auth = headers
                .iter()
                .find_map(|h| {
                    let (n, v) = h.split_once(':')?;
                    n.eq_ignore_ascii_case("proxy-authorization")
                        .then(|| v.trim().to_string())
                })
                .unwrap_or_else(|| "-".into());
            let mut parts = line.split_whitespace();
            let (method, target) = (
                parts.next().unwrap_or("").to_string(),
                parts.next().unwrap_or("").to_string(),
            );
            seen.lock()
                .unwrap()
                .push(format!("{method} {target} auth={auth}"));
            let mut c = c.try_clone().unwrap();
            if method == "CONNECT" {
                if auth == "Basic ZGVueTpkZW55" {
                    let _ = c.write_all(
                        b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
                    );
                    return;
                }
                let Ok(up) = TcpStream::connect(&target) else {
                    let _ = c.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
                    return;
                };
                let _ = c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                relay(c, up);
                return;
            }
            // Absolute form: forward this request alone on a new connection.
            let Some(rest) = target.strip_prefix("http://") else {
                let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                return;
            };
            let (hostport, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            let hostport = if hostport.contains(':') {
                hostport.to_string()
            } else {
                format!("{hostport}:80")
            };
            let Ok(mut up) = TcpStream::connect(&hostport) else {
                let _ = c.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
                return;
            };
            let mut head = format!("{method} {path} HTTP/1.1\r\n");
            let mut len = 0usize;
            for h in &headers {
                let n = h
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                if n == "proxy-authorization" {
                    continue;
                }
                if n == "content-length" {
                    len = h.split_once(':').unwrap().1.trim().parse().unwrap_or(0);
                }
                head.push_str(h);
            }
            head.push_str("\r\n");
            let mut body = vec![0u8; len];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            let _ = up.write_all(head.as_bytes());
            let _ = up.write_all(&body);
            let _ = up.shutdown(Shutdown::Write);
            let mut answer = Vec::new();
            let _ = up.read_to_end(&mut answer);
            if c.write_all(&answer).is_err() {
                return;
            }
        }
    })
}

/// A SOCKS5 proxy on `bind`; with `user`, only that user/password.
pub(crate) fn start_socks5(bind: &str, user: Option<(&str, &str)>) -> RecProxy {
    let user = user.map(|(u, p)| (u.to_string(), p.to_string()));
    serve(bind, move |mut c, seen| {
        let mut b = [0u8; 2];
        if c.read_exact(&mut b).is_err() || b[0] != 5 {
            return;
        }
        let mut methods = vec![0u8; b[1] as usize];
        if c.read_exact(&mut methods).is_err() {
            return;
        }
        let mut who = "-".to_string();
        if let Some((u, p)) = &user {
            if !methods.contains(&2) {
                let _ = c.write_all(&[5, 0xff]);
                return;
            }
            let _ = c.write_all(&[5, 2]);
            let mut v = [0u8; 2];
            if c.read_exact(&mut v).is_err() {
                return;
            }
            let mut name = vec![0u8; v[1] as usize];
            let mut pl = [0u8; 1];
            if c.read_exact(&mut name).is_err() || c.read_exact(&mut pl).is_err() {
                return;
            }
            let mut pass = vec![0u8; pl[0] as usize];
            if c.read_exact(&mut pass).is_err() {
                return;
            }
            let ok = name == u.as_bytes() && pass == p.as_bytes();
            let _ = c.write_all(&[1, if ok { 0 } else { 1 }]);
            if !ok {
                return;
            }
            who = String::from_utf8_lossy(&name).into_owned();
        } else {
            let _ = c.write_all(&[5, 0]);
        }
        let mut h = [0u8; 4];
        if c.read_exact(&mut h).is_err() || h[1] != 1 {
            return;
        }
        let host = match h[3] {
            1 => {
                let mut a = [0u8; 4];
                let _ = c.read_exact(&mut a);
                std::net::Ipv4Addr::from(a).to_string()
            }
            4 => {
                let mut a = [0u8; 16];
                let _ = c.read_exact(&mut a);
                format!("[{}]", std::net::Ipv6Addr::from(a))
            }
            3 => {
                let mut l = [0u8; 1];
                let _ = c.read_exact(&mut l);
                let mut n = vec![0u8; l[0] as usize];
                let _ = c.read_exact(&mut n);
                String::from_utf8_lossy(&n).into_owned()
            }
            _ => return,
        };
        let mut p = [0u8; 2];
        if c.read_exact(&mut p).is_err() {
            return;
        }
        let target = format!("{host}:{}", u16::from_be_bytes(p));
        seen.lock()
            .unwrap()
            .push(format!("SOCKS {target} user={who}"));
        let Ok(up) = TcpStream::connect(&target) else {
            let _ = c.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]);
            return;
        };
        let _ = c.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        relay(c, up);
    })
}
