//! The target servers at the far end of every tunnel. The client's first
//! byte says what the connection is for, so one target serves every
//! scenario through any system:
//!
//! - `U` + u64 length: read that many bytes, answer `k` (upload);
//! - `D` + u64 length: send that many bytes, then wait for the close (download);
//! - `E`: echo everything (request/response and dial scenarios);
//! - `S`: send until the connection breaks (head-of-line scenario);
//! - `I`: answer `k`, then hold the connection idle (memory scenario).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub(crate) const CHUNK: usize = 256 * 1024;

/// Binds `ports` listeners on 127.0.0.1 and serves them on the current
/// tokio runtime; returns their addresses.
pub(crate) async fn start(ports: usize) -> std::io::Result<Vec<SocketAddr>> {
    let mut addrs = Vec::with_capacity(ports);
    for _ in 0..ports {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.set_reuseaddr(true)?;
        sock.bind("127.0.0.1:0".parse().expect("literal"))?;
        let l = sock.listen(4096)?;
        addrs.push(l.local_addr()?);
        tokio::spawn(accept_loop(l));
    }
    Ok(addrs)
}

async fn accept_loop(l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                tokio::spawn(serve(s));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
}

async fn serve(mut s: TcpStream) -> std::io::Result<()> {
    let cmd = s.read_u8().await?;
    match cmd {
        b'U' => {
            let mut left = s.read_u64().await?;
            let mut buf = vec![0u8; CHUNK];
            while left > 0 {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok(());
                }
                left = left.saturating_sub(n as u64);
            }
            s.write_all(b"k").await
        }
        b'D' => {
            let mut left = s.read_u64().await?;
            let buf = vec![0x5au8; CHUNK];
            while left > 0 {
                let n = (left as usize).min(CHUNK);
                s.write_all(&buf[..n]).await?;
                left -= n as u64;
            }
            hold(s).await
        }
        b'E' => {
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.map(|_| ())
        }
        b'S' => {
            let buf = vec![0x5au8; CHUNK];
            loop {
                s.write_all(&buf).await?;
            }
        }
        b'I' => {
            s.write_all(b"k").await?;
            hold(s).await
        }
        _ => Ok(()),
    }
}

/// Waits for the client to close (reading and dropping anything it sends).
async fn hold(mut s: TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 1024];
    while s.read(&mut buf).await? > 0 {}
    Ok(())
}
