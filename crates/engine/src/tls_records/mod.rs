//! Our own TLS 1.3 record layer for the agent link (both ends): rustls
//! does the handshake (its unbuffered API, [`handshake`]), then
//! [`RecordStream`] seals and opens records in place with ring, with the
//! traffic secrets rustls hands over (as kTLS setups take them). rustls
//! 0.23 copies the plaintext into a new buffer before sealing and copies
//! each opened record twice (PROFILE.md of issue 29: 15.6-19.2 % and
//! 2.6-7.1 % of all CPU in bulk); here the plaintext is copied once each
//! way, into and out of buffers that are reused.
//!
//! The framing and its rules are sans-I/O in `protocol::tls_record`; this
//! module owns the keys, the buffers and the socket.
//!
//! It is the default ([`Mode::Own`]). A TLS 1.2 link stays on rustls: the
//! server looks at the ClientHello first ([`Mode`], [`sniff_client_hello`]);
//! a client that finds its server chose TLS 1.2 connects again through
//! rustls ([`handshake::NotTls13`]). `EDGETUNNEL_TLS_RECORDS=rustls` keeps
//! every agent link on rustls (the way back). Which one a link got
//! ([`LinkTls`]) is in the "agent connected" / "connected to server" log
//! lines and in `edgetunnel_agent_link_tls_total` at both ends.

mod handshake;
mod keys;
mod stream;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

pub use handshake::{accept, connect, Done, NotTls13};
pub use stream::RecordStream;

use protocol::tls_record::{self, HEADER_LEN, MAX_PLAINTEXT};

/// Who seals the agent link's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Our record layer (TLS 1.3; TLS 1.2 links stay on rustls): the
    /// default, or `EDGETUNNEL_TLS_RECORDS=own`.
    Own,
    /// rustls' records on every link: `EDGETUNNEL_TLS_RECORDS=rustls`.
    Rustls,
}

/// The environment variable that chooses [`Mode`]: `rustls` or `own`.
pub const MODE_ENV: &str = "EDGETUNNEL_TLS_RECORDS";

impl Mode {
    /// From [`MODE_ENV`] (read once per process); unset or empty:
    /// [`Mode::Own`], the default since issue 29's gates passed (the Go
    /// peers, TLS 1.2 peers, the suites run with `own`).
    pub fn from_env() -> Mode {
        static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
        *MODE.get_or_init(|| Self::parse(std::env::var(MODE_ENV).ok().as_deref()))
    }

    /// [`MODE_ENV`]'s value (None: unset) as a mode; anything else than
    /// `own` or `rustls` gets a warning and the default.
    fn parse(value: Option<&str>) -> Mode {
        match value {
            Some("rustls") => Mode::Rustls,
            Some("own") | Some("") | None => Mode::Own,
            Some(other) => {
                tracing::warn!(
                    "{MODE_ENV}={other:?} is neither \"own\" nor \"rustls\": using own (the default)"
                );
                Mode::Own
            }
        }
    }
}

/// What an agent link's TLS came to: who seals its records, and the TLS
/// version (rustls speaks 1.2 and 1.3 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkTls {
    /// TLS 1.3, our record layer.
    Own,
    /// TLS 1.3, rustls' records (`EDGETUNNEL_TLS_RECORDS=rustls`).
    Rustls13,
    /// TLS 1.2: always rustls' records.
    Rustls12,
}

impl LinkTls {
    /// Every value, in the order of [`LinkTls::index`].
    pub const ALL: [LinkTls; 3] = [LinkTls::Own, LinkTls::Rustls13, LinkTls::Rustls12];

    /// A link on rustls' records that negotiated `version`.
    pub fn rustls(version: Option<rustls::ProtocolVersion>) -> LinkTls {
        match version {
            Some(rustls::ProtocolVersion::TLSv1_3) => LinkTls::Rustls13,
            _ => LinkTls::Rustls12,
        }
    }

    /// Position in [`LinkTls::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `own` or `rustls` (a log field, a metric label).
    pub fn record_layer(self) -> &'static str {
        match self {
            LinkTls::Own => "own",
            LinkTls::Rustls13 | LinkTls::Rustls12 => "rustls",
        }
    }

    /// `1.3` or `1.2` (a log field, a metric label).
    pub fn version(self) -> &'static str {
        match self {
            LinkTls::Own | LinkTls::Rustls13 => "1.3",
            LinkTls::Rustls12 => "1.2",
        }
    }
}

static SERVER_CHOSE_TLS12: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A server of this agent chose TLS 1.2: later links go through rustls.
pub fn note_server_chose_tls12() {
    SERVER_CHOSE_TLS12.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn server_chose_tls12() -> bool {
    SERVER_CHOSE_TLS12.load(std::sync::atomic::Ordering::Relaxed)
}

/// A server configuration that lets rustls hand over the traffic secrets.
pub fn server_config(base: &Arc<rustls::ServerConfig>) -> Arc<rustls::ServerConfig> {
    let mut c = (**base).clone();
    c.enable_secret_extraction = true;
    Arc::new(c)
}

/// A client configuration that lets rustls hand over the traffic secrets.
pub fn client_config(base: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut c = (**base).clone();
    c.enable_secret_extraction = true;
    Arc::new(c)
}

/// Reads the connection's first TLS record (the ClientHello, at most one
/// record's worth) and says whether it offers TLS 1.3; returns the bytes
/// read, which the handshake (ours or rustls') takes as its start. EOF or
/// anything not a ClientHello: `false`, with what was read.
pub async fn sniff_client_hello<T: AsyncRead + Unpin>(io: &mut T) -> io::Result<(bool, BytesMut)> {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + MAX_PLAINTEXT);
    loop {
        if let Some(tls13) = tls_record::client_hello_offers_tls13(&buf) {
            return Ok((tls13, buf));
        }
        if io.read_buf(&mut buf).await? == 0 {
            return Ok((false, buf));
        }
    }
}

/// An agent link's TLS stream: rustls' or ours.
pub enum Link<R, O> {
    Rustls(R),
    Own(O),
}

impl<R: AsyncRead + Unpin, O: AsyncRead + Unpin> AsyncRead for Link<R, O> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Rustls(r) => Pin::new(r).poll_read(cx, buf),
            Link::Own(o) => Pin::new(o).poll_read(cx, buf),
        }
    }
}

impl<R: AsyncWrite + Unpin, O: AsyncWrite + Unpin> AsyncWrite for Link<R, O> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Rustls(r) => Pin::new(r).poll_write(cx, buf),
            Link::Own(o) => Pin::new(o).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Rustls(r) => Pin::new(r).poll_write_vectored(cx, bufs),
            Link::Own(o) => Pin::new(o).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Link::Rustls(r) => r.is_write_vectored(),
            Link::Own(o) => o.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Rustls(r) => Pin::new(r).poll_flush(cx),
            Link::Own(o) => Pin::new(o).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Rustls(r) => Pin::new(r).poll_shutdown(cx),
            Link::Own(o) => Pin::new(o).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests;
