//! Socket types of the proxy: client connections (TCP or unix) and upstream
//! connections (plain, TLS, or TLS through a TLS proxy), as poll-style streams over monoio so that
//! rustls (tokio-rustls) can sit on them. Thin delegation only.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use monoio::net::tcp::stream_poll::TcpStreamPoll;
use monoio::net::unix::stream_poll::UnixStreamPoll;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use engine::read_ahead::ReadAhead;

pub(super) enum ClientIo {
    Tcp(TcpStreamPoll),
    Unix(UnixStreamPoll),
}

pub(super) enum UpstreamIo {
    Plain(TcpStreamPoll),
    Tls(Box<tokio_rustls::client::TlsStream<ReadAhead<TcpStreamPoll>>>),
    /// TLS to the API server inside TLS to an `https://` proxy.
    Nested(Box<tokio_rustls::client::TlsStream<UpstreamIo>>),
}

impl UpstreamIo {
    /// The ALPN protocol the API server chose (None without TLS to it).
    pub(super) fn alpn(&self) -> Option<&[u8]> {
        match self {
            UpstreamIo::Plain(_) => None,
            UpstreamIo::Tls(t) => t.get_ref().1.alpn_protocol(),
            UpstreamIo::Nested(t) => t.get_ref().1.alpn_protocol(),
        }
    }
}

macro_rules! delegate {
    ($ty:ident, $($var:ident),+) => {
        impl AsyncRead for $ty {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$var(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
        impl AsyncWrite for $ty {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$var(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }
            fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$var(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }
            fn is_write_vectored(&self) -> bool {
                match self {
                    $($ty::$var(s) => s.is_write_vectored(),)+
                }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$var(s) => Pin::new(s).poll_flush(cx),)+
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$var(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate!(ClientIo, Tcp, Unix);
delegate!(UpstreamIo, Plain, Tls, Nested);

/// Go's wording for a socket error (`connection refused`, ...).
pub(super) fn go_error_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            // std writes strerror's text followed by " (os error N)".
            let full = e.to_string();
            let suffix = format!(" (os error {code})");
            let s = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
                None => s,
            }
        }
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::go_error_text;
    use std::io;

    #[test]
    fn socket_errors_in_go_wording() {
        let refused = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(go_error_text(&refused), "connection refused");
        let unreachable = io::Error::from_raw_os_error(libc::ENETUNREACH);
        assert_eq!(go_error_text(&unreachable), "network is unreachable");
        let other = io::Error::other("tls handshake");
        assert_eq!(go_error_text(&other), "tls handshake");
    }
}
