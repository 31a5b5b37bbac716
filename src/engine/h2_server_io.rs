//! The byte stream an HTTP/2 server connection of ours reads (agent
//! listener, gRPC frontends). Placeholder: passes the stream through as is.

/// Wraps a server connection's (decrypted) stream before h2 sees it.
pub fn wrap<T>(io: T) -> impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    io
}
