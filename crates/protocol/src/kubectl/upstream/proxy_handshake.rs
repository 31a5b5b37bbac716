//! Client side of the two proxy handshakes an upstream connection may need
//! before TLS: HTTP `CONNECT` (as Go's `net/http` transport writes it:
//! `CONNECT host:port HTTP/1.1`, `Host`, `User-Agent: Go-http-client/1.1`,
//! `Proxy-Authorization` from the proxy URL's userinfo; any status but 200
//! fails with the status text) and SOCKS5 (RFC 1928 CONNECT with the
//! target as a domain name or IP, RFC 1929 user/password when the URL has
//! one, as golang.org/x/net/proxy). Sans-I/O: bytes in, bytes out.

use std::net::IpAddr;

use crate::http1::{self, HeadLimit};

/// Limit on a CONNECT answer's head.
pub const CONNECT_RESPONSE_LIMIT: HeadLimit = HeadLimit {
    bytes: 16 * 1024,
    headers: 64,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHandshakeError {
    /// Go: the CONNECT status text (`Forbidden`, ...).
    #[error("{0}")]
    Refused(String),
    #[error("malformed proxy response: {0}")]
    Malformed(String),
    #[error("proxy sent data before the tunnel was used")]
    TrailingData,
    /// x/net/proxy's wording: `proxy: SOCKS5 proxy at ADDR failed to connect: ...`.
    #[error("socks connect tcp {0}->{1}: {2}")]
    Socks(String, String, String),
    #[error("target name too long for SOCKS5")]
    NameTooLong,
}

/// The CONNECT request for `target` (`host:port`).
pub fn connect_request(target: &str, proxy_auth: Option<&str>) -> Vec<u8> {
    let mut s = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: Go-http-client/1.1\r\n"
    );
    if let Some(a) = proxy_auth {
        s.push_str("Proxy-Authorization: ");
        s.push_str(a);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// Reads the CONNECT answer from `buf`: `Ok(false)` while incomplete,
/// `Ok(true)` once a 200 head is complete and nothing follows it.
pub fn parse_connect_response(buf: &[u8]) -> Result<bool, ProxyHandshakeError> {
    let (head, n) = match http1::parse_response(buf, CONNECT_RESPONSE_LIMIT) {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(false),
        Err(e) => return Err(ProxyHandshakeError::Malformed(e.to_string())),
    };
    if head.status != 200 {
        return Err(ProxyHandshakeError::Refused(if head.reason.is_empty() {
            head.status.to_string()
        } else {
            head.reason
        }));
    }
    if buf.len() > n {
        return Err(ProxyHandshakeError::TrailingData);
    }
    Ok(true)
}

/// What the SOCKS5 client wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocksStep {
    /// Write these bytes, then read more.
    Send(Vec<u8>),
    /// Read more bytes.
    Read,
    /// The tunnel is open.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SocksState {
    Greeting,
    Auth,
    Connect,
    Done,
}

/// A SOCKS5 client handshake for one CONNECT.
#[derive(Debug)]
pub struct Socks5Client {
    proxy: String,
    target_host: String,
    target_port: u16,
    user: Option<(String, String)>,
    state: SocksState,
    buf: Vec<u8>,
}

impl Socks5Client {
    /// A handshake toward `target_host:target_port` through the proxy at
    /// `proxy` (named in errors); returns the greeting to send first.
    pub fn new(
        proxy: &str,
        target_host: &str,
        target_port: u16,
        user: Option<(String, String)>,
    ) -> Result<(Socks5Client, Vec<u8>), ProxyHandshakeError> {
        let host = target_host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<IpAddr>().is_err() && host.len() > 255 {
            return Err(ProxyHandshakeError::NameTooLong);
        }
        let greeting = if user.is_some() {
            vec![5, 2, 0, 2]
        } else {
            vec![5, 1, 0]
        };
        Ok((
            Socks5Client {
                proxy: proxy.to_string(),
                target_host: host.to_string(),
                target_port,
                user,
                state: SocksState::Greeting,
                buf: Vec::new(),
            },
            greeting,
        ))
    }

    fn fail(&self, why: &str) -> ProxyHandshakeError {
        ProxyHandshakeError::Socks(
            self.proxy.clone(),
            crate::go::net::join_host_port(&self.target_host, self.target_port),
            why.to_string(),
        )
    }

    fn connect_request(&self) -> Vec<u8> {
        let mut out = vec![5, 1, 0];
        match self.target_host.parse::<IpAddr>() {
            Ok(IpAddr::V4(v)) => {
                out.push(1);
                out.extend_from_slice(&v.octets());
            }
            Ok(IpAddr::V6(v)) => {
                out.push(4);
                out.extend_from_slice(&v.octets());
            }
            Err(_) => {
                out.push(3);
                out.push(self.target_host.len() as u8);
                out.extend_from_slice(self.target_host.as_bytes());
            }
        }
        out.extend_from_slice(&self.target_port.to_be_bytes());
        out
    }

    /// Feeds bytes read from the proxy. After `Done`, bytes fed beyond the
    /// handshake are an error (the proxy must not speak first).
    pub fn feed(&mut self, data: &[u8]) -> Result<SocksStep, ProxyHandshakeError> {
        self.buf.extend_from_slice(data);
        match self.state {
            SocksState::Greeting => {
                if self.buf.len() < 2 {
                    return Ok(SocksStep::Read);
                }
                let (ver, method) = (self.buf[0], self.buf[1]);
                self.buf.drain(..2);
                if ver != 5 {
                    return Err(self.fail(&format!("unexpected protocol version {ver}")));
                }
                match (method, &self.user) {
                    (0, _) => {
                        self.state = SocksState::Connect;
                        Ok(SocksStep::Send(self.connect_request()))
                    }
                    (2, Some((u, p))) => {
                        if u.is_empty() || u.len() > 255 || p.len() > 255 {
                            return Err(self.fail("invalid username/password"));
                        }
                        let mut out = vec![1, u.len() as u8];
                        out.extend_from_slice(u.as_bytes());
                        out.push(p.len() as u8);
                        out.extend_from_slice(p.as_bytes());
                        self.state = SocksState::Auth;
                        Ok(SocksStep::Send(out))
                    }
                    _ => Err(self.fail("no acceptable authentication methods")),
                }
            }
            SocksState::Auth => {
                if self.buf.len() < 2 {
                    return Ok(SocksStep::Read);
                }
                let status = self.buf[1];
                self.buf.drain(..2);
                if status != 0 {
                    return Err(self.fail("username/password authentication failed"));
                }
                self.state = SocksState::Connect;
                Ok(SocksStep::Send(self.connect_request()))
            }
            SocksState::Connect => {
                if self.buf.len() < 5 {
                    return Ok(SocksStep::Read);
                }
                if self.buf[0] != 5 {
                    return Err(self.fail(&format!("unexpected protocol version {}", self.buf[0])));
                }
                if self.buf[1] != 0 {
                    return Err(self.fail(&reply_text(self.buf[1])));
                }
                let addr_len = match self.buf[3] {
                    1 => 4,
                    4 => 16,
                    3 => 1 + self.buf[4] as usize,
                    t => return Err(self.fail(&format!("unknown address type {t}"))),
                };
                let total = 4 + addr_len + 2;
                if self.buf.len() < total {
                    return Ok(SocksStep::Read);
                }
                if self.buf.len() > total {
                    return Err(ProxyHandshakeError::TrailingData);
                }
                self.buf.clear();
                self.state = SocksState::Done;
                Ok(SocksStep::Done)
            }
            SocksState::Done => {
                if !self.buf.is_empty() {
                    return Err(ProxyHandshakeError::TrailingData);
                }
                Ok(SocksStep::Done)
            }
        }
    }
}

/// RFC 1928 reply texts, as x/net/internal/socks names them.
fn reply_text(code: u8) -> String {
    match code {
        1 => "general SOCKS server failure".into(),
        2 => "connection not allowed by ruleset".into(),
        3 => "network unreachable".into(),
        4 => "host unreachable".into(),
        5 => "connection refused".into(),
        6 => "TTL expired".into(),
        7 => "command not supported".into(),
        8 => "address type not supported".into(),
        c => format!("unknown code: {c}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_request_as_go() {
        assert_eq!(
            connect_request("10.0.0.1:6443", Some("Basic dTpw")),
            b"CONNECT 10.0.0.1:6443 HTTP/1.1\r\nHost: 10.0.0.1:6443\r\nUser-Agent: Go-http-client/1.1\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
        );
    }

    #[test]
    fn connect_responses() {
        assert_eq!(parse_connect_response(b"HTTP/1.1 200 Conn"), Ok(false));
        assert_eq!(
            parse_connect_response(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Ok(true)
        );
        assert_eq!(
            parse_connect_response(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n"),
            Err(ProxyHandshakeError::Refused(
                "Proxy Authentication Required".into()
            ))
        );
        assert_eq!(
            parse_connect_response(b"HTTP/1.0 200 OK\r\n\r\nxx"),
            Err(ProxyHandshakeError::TrailingData)
        );
        assert!(matches!(
            parse_connect_response(b"SSH-2.0\r\n\r\n"),
            Err(ProxyHandshakeError::Malformed(_))
        ));
        let big = vec![b'a'; 20_000];
        assert!(parse_connect_response(&big).is_err());
    }

    #[test]
    fn socks5_with_password_and_domain() {
        let (mut c, g) = Socks5Client::new(
            "p:1080",
            "api.example",
            6443,
            Some(("u".into(), "pw".into())),
        )
        .unwrap();
        assert_eq!(g, [5, 2, 0, 2]);
        assert_eq!(c.feed(&[5]).unwrap(), SocksStep::Read);
        assert_eq!(
            c.feed(&[2]).unwrap(),
            SocksStep::Send(vec![1, 1, b'u', 2, b'p', b'w'])
        );
        let mut req = vec![5, 1, 0, 3, 11];
        req.extend_from_slice(b"api.example");
        req.extend_from_slice(&6443u16.to_be_bytes());
        assert_eq!(c.feed(&[1, 0]).unwrap(), SocksStep::Send(req));
        assert_eq!(c.feed(&[5, 0, 0, 1, 0, 0]).unwrap(), SocksStep::Read);
        assert_eq!(c.feed(&[0, 0, 0, 0]).unwrap(), SocksStep::Done);
    }

    #[test]
    fn socks5_refusals() {
        let (mut c, g) = Socks5Client::new("p:1080", "10.0.0.1", 443, None).unwrap();
        assert_eq!(g, [5, 1, 0]);
        assert_eq!(
            c.feed(&[5, 0]).unwrap(),
            SocksStep::Send(vec![5, 1, 0, 1, 10, 0, 0, 1, 1, 187])
        );
        assert_eq!(
            c.feed(&[5, 5, 0, 1, 0]).unwrap_err().to_string(),
            "socks connect tcp p:1080->10.0.0.1:443: connection refused"
        );
        let (mut c, _) = Socks5Client::new("p:1080", "::1", 443, None).unwrap();
        assert!(c.feed(&[5, 0xff]).is_err());
        let (mut c, _) = Socks5Client::new("p:1080", "h", 1, None).unwrap();
        assert!(c.feed(&[4, 0]).is_err());
        let (mut c, _) =
            Socks5Client::new("p:1080", "h", 1, Some(("u".into(), "".into()))).unwrap();
        let _ = c.feed(&[5, 2]).unwrap();
        assert!(c.feed(&[1, 1]).is_err());
    }
}
