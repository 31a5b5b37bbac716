//! The handshake on rustls' unbuffered API, driven over a poll-style
//! socket, ending in the traffic secrets and a [`KernelConnection`] for
//! key updates and tickets (rustls' `kernel` module: what kTLS setups
//! use). Errors are `io::Error`s wrapping the `rustls::Error`, as
//! tokio-rustls gives them, so the explanations in `engine::tls` apply;
//! a fatal alert rustls queued is sent before the error is returned.
//!
//! [`KernelConnection`]: rustls::kernel::KernelConnection

use std::io;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ExtractedSecrets, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::keys::RecordKey;
use super::stream::{Established, Kernel, RecordStream};
use protocol::tls_record::MAX_RECORD;

/// The two unbuffered connection types, as the driver needs them.
trait Side {
    type Data;
    const IS_CLIENT: bool;
    fn common(&self) -> &rustls::CommonState;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error>;
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    const IS_CLIENT: bool = false;
    fn common(&self) -> &rustls::CommonState {
        self
    }
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection()
            .map(|(s, k)| (s, Kernel::Server(k)))
    }
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    const IS_CLIENT: bool = true;
    fn common(&self) -> &rustls::CommonState {
        self
    }
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection()
            .map(|(s, k)| (s, Kernel::Client(k)))
    }
}

/// A handshake that ended in TLS 1.2: the caller goes back to rustls'
/// own records (the server never gets here: it looks at the ClientHello
/// first).
#[derive(Debug, thiserror::Error)]
#[error("the peer negotiated TLS 1.2; edgetunnel's record layer is TLS 1.3 only")]
pub struct NotTls13;

/// An established connection and what the handshake proved.
pub struct Done<T> {
    pub stream: RecordStream<T>,
    /// The peer's certificate chain, leaf first (verified by rustls).
    pub peer_certificates: Option<Vec<CertificateDer<'static>>>,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The server's handshake over `io`, with `first` the bytes already read
/// from it (the ClientHello looked at). `config` must allow secret
/// extraction ([`records_config`](super::server_config)).
pub async fn accept<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    first: BytesMut,
    config: Arc<rustls::ServerConfig>,
) -> io::Result<Done<T>> {
    let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
    drive(conn, io, first).await
}

/// The client's handshake over `io`; [`NotTls13`] (as the error's inner
/// value) when the server chose TLS 1.2.
pub async fn connect<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
) -> io::Result<Done<T>> {
    let conn = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
    drive(conn, io, BytesMut::new()).await
}

async fn drive<S: Side, T: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    mut io: T,
    mut incoming: BytesMut,
) -> io::Result<Done<T>> {
    let mut outgoing: Vec<u8> = Vec::new();
    // Application data that came with the handshake (rustls opened it).
    let mut early: Vec<u8> = Vec::new();
    loop {
        enum Next {
            Read,
            Transmit,
            Again,
            Done,
        }
        let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming[..]);
        let next = match state {
            Err(e) => {
                // The alert rustls queued for the peer, if any.
                let mut alert = Vec::new();
                let UnbufferedStatus { state, .. } = conn.process(&mut []);
                if let Ok(ConnectionState::EncodeTlsData(mut enc)) = state {
                    alert.resize(64, 0);
                    if let Ok(n) = enc.encode(&mut alert) {
                        alert.truncate(n);
                        let _ = io.write_all(&alert).await;
                        let _ = io.flush().await;
                    }
                }
                return Err(tls_error(e));
            }
            Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                let at = outgoing.len();
                outgoing.resize(at + 4096, 0);
                let n = match enc.encode(&mut outgoing[at..]) {
                    Ok(n) => n,
                    Err(EncodeError::InsufficientSize(s)) => {
                        outgoing.resize(at + s.required_size, 0);
                        enc.encode(&mut outgoing[at..])
                            .map_err(|e| io::Error::other(e.to_string()))?
                    }
                    Err(e) => return Err(io::Error::other(e.to_string())),
                };
                outgoing.truncate(at + n);
                Next::Again
            }
            Ok(ConnectionState::TransmitTlsData(t)) => {
                t.done();
                Next::Transmit
            }
            Ok(ConnectionState::BlockedHandshake) => Next::Read,
            Ok(ConnectionState::ReadTraffic(mut r)) => {
                while let Some(rec) = r.next_record() {
                    let rec = rec.map_err(tls_error)?;
                    discard += rec.discard;
                    early.extend_from_slice(rec.payload);
                }
                Next::Again
            }
            Ok(ConnectionState::WriteTraffic(_)) => Next::Done,
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the TLS connection during the handshake",
                ))
            }
            Ok(other) => {
                return Err(io::Error::other(format!(
                    "unexpected TLS handshake state {other:?}"
                )))
            }
        };
        incoming.advance(discard);
        // (A server sending before the client's Finished, which ours
        // never does: wait for the handshake's end all the same.)
        let next = match next {
            Next::Done if conn.common().is_handshaking() => Next::Read,
            n => n,
        };
        match next {
            Next::Again => {}
            Next::Transmit => {
                io.write_all(&outgoing).await?;
                io.flush().await?;
                outgoing.clear();
            }
            Next::Read => {
                if incoming.capacity() - incoming.len() < 4096 {
                    incoming.reserve(MAX_RECORD);
                }
                if io.read_buf(&mut incoming).await? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "tls handshake eof",
                    ));
                }
            }
            Next::Done => break,
        }
    }
    if !outgoing.is_empty() {
        io.write_all(&outgoing).await?;
        io.flush().await?;
    }
    if conn.common().protocol_version() != Some(ProtocolVersion::TLSv1_3) {
        return Err(io::Error::new(io::ErrorKind::Unsupported, NotTls13));
    }
    let peer_certificates = conn
        .common()
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
    let (secrets, kernel) = conn.into_kernel().map_err(tls_error)?;
    let key = |(seq, s): (u64, rustls::ConnectionTrafficSecrets)| {
        RecordKey::new(s, seq).map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e))
    };
    let established = Established {
        tx: key(secrets.tx)?,
        rx: key(secrets.rx)?,
        kernel,
        is_client: S::IS_CLIENT,
        rest: incoming,
    };
    let mut stream = RecordStream::new(io, established);
    stream.set_early(early);
    Ok(Done {
        stream,
        peer_certificates,
    })
}
