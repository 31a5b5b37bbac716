//! The client side of the benches' tunnels (the comparison bench and the
//! WAN bench include this file): opens a connection that ends at a target
//! through an [`Entry`] (plain TCP, HTTP CONNECT over TCP, a unix socket or
//! mutual TLS, or gRPC ProxyService as konnectivity-client does it) and
//! gives back one byte stream type for all of them.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use protocol::anp::{grpc_frame, packet};
use protocol::PROXY_PATH;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How a client opens a connection that ends at one target.
#[derive(Clone, Debug)]
pub(crate) enum Entry {
    /// Connect here; the bytes reach the target (direct, relays, reverse tunnels).
    Tcp(SocketAddr),
    /// Connect to `proxy`, send `CONNECT target`, expect 200, then raw bytes.
    Connect {
        proxy: SocketAddr,
        target: SocketAddr,
    },
    /// `Connect` over the unix socket `path` (ANP's frontend as
    /// kube-apiserver dials it).
    ConnectUds { path: PathBuf, target: SocketAddr },
    /// `Connect` inside TLS with a client certificate (`tls`), to a
    /// frontend that is mutual TLS only (ANP's TCP frontend).
    ConnectTls {
        proxy: SocketAddr,
        target: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
    },
    /// Open an HTTP/2 connection to `server`, call `/ProxyService/Proxy`,
    /// DIAL_REQ `target`, then DATA packets.
    Grpc {
        server: SocketAddr,
        target: SocketAddr,
    },
    /// `Grpc` over the unix socket `path` (ANP's gRPC frontend as
    /// kube-apiserver dials it).
    GrpcUds { path: PathBuf, target: SocketAddr },
}

/// A tunneled (or direct) byte stream.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
    Grpc(Box<GrpcConn>),
}

impl Conn {
    /// The TCP socket under the stream, if any (for SO_LINGER).
    pub(crate) fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Conn::Tcp(s) => Some(s),
            Conn::Tls(s) => Some(s.get_ref().0),
            Conn::Unix(_) | Conn::Grpc(_) => None,
        }
    }
}

/// The name the TLS frontends' certificate (`certs init` server.crt) is
/// checked against.
const TLS_NAME: &str = "localhost";

/// Opens a connection through `entry`; `source` picks the client's loopback
/// address (many source addresses lift the ephemeral-port limit when
/// 100,000 connections go to one listener).
pub(crate) async fn open(entry: &Entry, source: Option<IpAddr>) -> io::Result<Conn> {
    match entry {
        Entry::Tcp(addr) => Ok(Conn::Tcp(tcp(*addr, source).await?)),
        Entry::Connect { proxy, target } => {
            let mut s = tcp(*proxy, source).await?;
            connect_handshake(&mut s, *target).await?;
            Ok(Conn::Tcp(s))
        }
        Entry::ConnectUds { path, target } => {
            let mut s = UnixStream::connect(path).await?;
            connect_handshake(&mut s, *target).await?;
            Ok(Conn::Unix(s))
        }
        Entry::ConnectTls { proxy, target, tls } => {
            let s = tcp(*proxy, source).await?;
            let name =
                rustls::pki_types::ServerName::try_from(TLS_NAME).map_err(io::Error::other)?;
            let mut s = TlsConnector::from(tls.clone()).connect(name, s).await?;
            connect_handshake(&mut s, *target).await?;
            Ok(Conn::Tls(Box::new(s)))
        }
        Entry::Grpc { server, target } => {
            let io = tcp(*server, source).await?;
            let authority = server.to_string();
            Ok(Conn::Grpc(Box::new(
                GrpcConn::open(io, &authority, *target).await?,
            )))
        }
        Entry::GrpcUds { path, target } => {
            let io = UnixStream::connect(path).await?;
            // A unix socket has no host: ANP's gRPC server does not look
            // at the authority.
            Ok(Conn::Grpc(Box::new(
                GrpcConn::open(io, "127.0.0.1", *target).await?,
            )))
        }
    }
}

async fn tcp(addr: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpStream> {
    let sock = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(ip) = source {
        sock.bind(SocketAddr::new(ip, 0))?;
    }
    let s = sock.connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

async fn connect_handshake(
    s: &mut (impl AsyncRead + AsyncWrite + Unpin),
    target: SocketAddr,
) -> io::Result<()> {
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    // A TLS stream may keep written bytes buffered until flushed.
    s.flush().await?;
    // The target says nothing before the client's command, so nothing past
    // the head can arrive here.
    let mut head = Vec::with_capacity(128);
    let mut buf = [0u8; 256];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::other("CONNECT: closed before an answer"));
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 8192 {
            return Err(io::Error::other("CONNECT: answer head too long"));
        }
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(io::Error::other(format!(
            "CONNECT refused: {}",
            String::from_utf8_lossy(&head).lines().next().unwrap_or("")
        )));
    }
    Ok(())
}

/// One konnectivity-client style tunnel: its own HTTP/2 connection, one
/// `/ProxyService/Proxy` stream, DIAL_REQ then DATA packets both ways.
pub(crate) struct GrpcConn {
    send: h2::SendStream<Bytes>,
    recv: h2::RecvStream,
    decoder: grpc_frame::FrameDecoder,
    connect_id: i64,
    /// Payload received and not yet read.
    readable: Bytes,
    /// Encoded packets not yet handed to h2 (waiting for window).
    pending: Bytes,
    eof: bool,
}

const MAX_MESSAGE: usize = 16 << 20;

impl GrpcConn {
    async fn open<T>(io: T, authority: &str, target: SocketAddr) -> io::Result<Self>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(4 << 20)
            .initial_connection_window_size(8 << 20)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut client = client.ready().await.map_err(io::Error::other)?;
        let req = http::Request::post(format!("http://{authority}{PROXY_PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(io::Error::other)?;
        let (resp, mut send) = client.send_request(req, false).map_err(io::Error::other)?;
        let random = fastrand::i64(1..);
        let dial = packet::encode(packet::dial_request("tcp", &target.to_string(), random));
        send.send_data(Bytes::from(dial.to_vec()), false)
            .map_err(io::Error::other)?;
        let recv = resp.await.map_err(io::Error::other)?.into_body();
        let mut c = GrpcConn {
            send,
            recv,
            decoder: grpc_frame::FrameDecoder::new(MAX_MESSAGE),
            connect_id: 0,
            readable: Bytes::new(),
            pending: Bytes::new(),
            eof: false,
        };
        loop {
            match c.next_frame().await? {
                Some(packet::Frame::DialResponse(r)) if r.random == random => {
                    if !r.error.is_empty() || r.connect_id == 0 {
                        return Err(io::Error::other(format!("dial failed: {}", r.error)));
                    }
                    c.connect_id = r.connect_id;
                    return Ok(c);
                }
                Some(_) => {}
                None => return Err(io::Error::other("stream ended before DIAL_RSP")),
            }
        }
    }

    async fn next_frame(&mut self) -> io::Result<Option<packet::Frame>> {
        std::future::poll_fn(|cx| self.poll_frame(cx)).await
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<packet::Frame>>> {
        loop {
            if let Some(msg) = self.decoder.next_message().map_err(io::Error::other)? {
                let frame = packet::decode(msg).map_err(io::Error::other)?;
                return Poll::Ready(Ok(Some(frame)));
            }
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    let _ = self.recv.flow_control().release_capacity(chunk.len());
                    self.decoder.push(chunk);
                }
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                None => return Poll::Ready(Ok(None)),
            }
        }
    }

    /// Hands queued packet bytes to h2 as its flow-control window allows.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            self.send.reserve_capacity(self.pending.len());
            let cap = self.send.capacity();
            if cap == 0 {
                match ready!(self.send.poll_capacity(cx)) {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                    None => return Poll::Ready(Err(io::Error::other("stream closed"))),
                }
            }
            let chunk = self.pending.split_to(cap.min(self.pending.len()));
            self.send
                .send_data(chunk, false)
                .map_err(io::Error::other)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.readable.is_empty() && !this.eof {
            match ready!(this.poll_frame(cx))? {
                Some(packet::Frame::Data(d)) if d.connect_id == this.connect_id => {
                    this.readable = d.data;
                }
                Some(packet::Frame::CloseResponse(_)) | None => this.eof = true,
                Some(_) => {}
            }
        }
        let n = this.readable.len().min(buf.remaining());
        buf.put_slice(&this.readable[..n]);
        this.readable.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        let n = buf.len().min(1 << 20);
        let data = packet::encode_data(this.connect_id, Bytes::copy_from_slice(&buf[..n]));
        this.pending = Bytes::from(data.to_vec());
        // Best effort now; the rest goes on the next write or flush.
        let _ = this.poll_drain(cx)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drain(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if this.pending.is_empty() && this.connect_id != 0 {
            let close = packet::encode(packet::close_request(this.connect_id));
            this.connect_id = 0;
            this.pending = Bytes::from(close.to_vec());
            ready!(this.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Grpc(g) => Pin::new(g.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Grpc(g) => Pin::new(g.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Grpc(g) => Pin::new(g.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Grpc(g) => Pin::new(g.as_mut()).poll_shutdown(cx),
        }
    }
}
