//! The record layer against rustls as the peer (a real TLS stack: its
//! handshake, its records, its KeyUpdate and tickets), over in-memory
//! pipes, with a relay between the two that can corrupt a byte.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

struct Pki {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

fn pki() -> Pki {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    Pki {
        cert: c.cert.der().clone(),
        key: c.key_pair.serialize_der(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_cfg(
    p: &Pki,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ServerConfig> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(p.key.clone()));
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![p.cert.clone()], key)
        .unwrap();
    c.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(c)
}

fn client_cfg(p: &Pki) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(p.cert.clone()).unwrap();
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(c)
}

fn name() -> ServerName<'static> {
    ServerName::try_from("localhost").unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Our server over `io`, as the agent listener runs it (ClientHello
/// looked at first).
async fn our_server(
    mut io: DuplexStream,
    cfg: &Arc<rustls::ServerConfig>,
) -> RecordStream<DuplexStream> {
    let (tls13, first) = sniff_client_hello(&mut io).await.unwrap();
    assert!(tls13);
    accept(io, first, server_config(cfg)).await.unwrap().stream
}

/// Copies `a` to `b` and back; the byte at offset `flip` of the a-to-b
/// direction is inverted (`usize::MAX`: none).
async fn relay(a: DuplexStream, b: DuplexStream, flip: usize) {
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = async move {
        let mut buf = vec![0u8; 4096];
        let mut at = 0usize;
        loop {
            let n = match ar.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if (at..at + n).contains(&flip) {
                buf[flip - at] ^= 0xff;
            }
            at += n;
            if bw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = bw.shutdown().await;
    };
    let down = async move {
        let _ = tokio::io::copy(&mut br, &mut aw).await;
        let _ = aw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Bytes flow both ways across a KeyUpdate the rustls client sends (it
/// asks for ours too, as `refresh_traffic_keys` does), and across one we
/// send on our own after a few records; close_notify ends the stream.
#[test]
fn key_updates_from_a_rustls_client_and_from_us() {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS13]);
    let ccfg = client_cfg(&p);
    rt().block_on(async {
        let (c, s) = tokio::io::duplex(64 * 1024);
        let client = async {
            let mut tls = tokio_rustls::TlsConnector::from(ccfg.clone())
                .connect(name(), c)
                .await
                .unwrap();
            let first = pattern(100_000, 1);
            tls.write_all(&first).await.unwrap();
            tls.flush().await.unwrap();
            let mut got = vec![0u8; 100_000];
            tls.read_exact(&mut got).await.unwrap();
            assert!(got == pattern(100_000, 2));
            // A real KeyUpdate, mid-stream.
            tls.get_mut().1.refresh_traffic_keys().unwrap();
            tls.write_all(&pattern(50_000, 3)).await.unwrap();
            tls.flush().await.unwrap();
            let mut got = vec![0u8; 300_000];
            tls.read_exact(&mut got).await.unwrap();
            assert!(got == pattern(300_000, 4), "data after the key updates");
            tls.shutdown().await.unwrap();
            let mut rest = Vec::new();
            tls.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        };
        let server = async {
            let mut s = our_server(s, &scfg).await;
            let mut got = vec![0u8; 100_000];
            s.read_exact(&mut got).await.unwrap();
            assert!(got == pattern(100_000, 1));
            s.write_all(&pattern(100_000, 2)).await.unwrap();
            s.flush().await.unwrap();
            let rx_key = s.rx.seq();
            let mut got = vec![0u8; 50_000];
            s.read_exact(&mut got).await.unwrap();
            assert!(
                got == pattern(50_000, 3),
                "data after the client's KeyUpdate"
            );
            assert!(s.rx.seq() < rx_key, "the receiving key changed");
            // Our own KeyUpdate after 5 records (of 19 to send).
            s.set_key_refresh_after(5);
            let tx_before = s.tx.seq();
            s.write_all(&pattern(300_000, 4)).await.unwrap();
            s.flush().await.unwrap();
            assert!(s.tx.seq() < tx_before + 19, "the sending key changed");
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty(), "close_notify is a clean EOF");
            s.shutdown().await.unwrap();
            assert_eq!(s.held(), 0, "nothing held once idle");
        };
        tokio::join!(client, server);
    });
}

/// Our client against a rustls server: it takes the server's tickets,
/// follows the server's KeyUpdate (and answers the request for ours).
#[test]
fn our_client_takes_tickets_and_key_updates() {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS13]);
    let ccfg = client_config(&client_cfg(&p));
    rt().block_on(async {
        let (c, s) = tokio::io::duplex(64 * 1024);
        let server = async {
            let mut tls = tokio_rustls::TlsAcceptor::from(scfg.clone())
                .accept(s)
                .await
                .unwrap();
            tls.write_all(&pattern(70_000, 5)).await.unwrap();
            tls.flush().await.unwrap();
            tls.get_mut().1.refresh_traffic_keys().unwrap();
            tls.write_all(&pattern(70_000, 6)).await.unwrap();
            tls.flush().await.unwrap();
            let mut got = vec![0u8; 200_000];
            tls.read_exact(&mut got).await.unwrap();
            assert!(got == pattern(200_000, 7));
            tls.shutdown().await.unwrap();
        };
        let client = async {
            let mut s = connect(c, name(), ccfg.clone()).await.unwrap().stream;
            let mut got = vec![0u8; 140_000];
            s.read_exact(&mut got).await.unwrap();
            assert!(got[..70_000] == pattern(70_000, 5)[..]);
            assert!(got[70_000..] == pattern(70_000, 6)[..]);
            s.write_all(&pattern(200_000, 7)).await.unwrap();
            s.flush().await.unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        };
        tokio::join!(server, client);
    });
}

/// A byte flipped in transit: the record fails authentication, the read
/// says so, and the peer is told (bad_record_mac).
#[test]
fn a_corrupted_record_is_a_clear_error() {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS13]);
    let ccfg = client_cfg(&p);
    rt().block_on(async {
        let (c, m1) = tokio::io::duplex(64 * 1024);
        let (m2, s) = tokio::io::duplex(64 * 1024);
        // The handshake is a few KB; 30,000 is well inside the data.
        let mitm = relay(m1, m2, 30_000);
        let client = async {
            let mut tls = tokio_rustls::TlsConnector::from(ccfg.clone())
                .connect(name(), c)
                .await
                .unwrap();
            let _ = tls.write_all(&pattern(100_000, 1)).await;
            let _ = tls.flush().await;
            let mut buf = Vec::new();
            let e = tls.read_to_end(&mut buf).await.unwrap_err();
            assert!(e.to_string().contains("BadRecordMac"), "{e}");
        };
        let server = async {
            let mut s = our_server(s, &scfg).await;
            let mut got = Vec::new();
            let e = s.read_to_end(&mut got).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("bad_record_mac"), "{e}");
            assert!(got.len() < 30_000 && got[..] == pattern(100_000, 1)[..got.len()]);
            // Later reads keep failing.
            assert!(s.read(&mut [0u8; 10]).await.is_err());
            drop(s);
        };
        tokio::join!(mitm, client, server);
    });
}

/// Bad records after the handshake: a length over the limit, a record
/// not of type application_data. An error each, nothing buffered for it.
#[test]
fn lying_lengths_and_types_are_refused() {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS13]);
    let ccfg = client_cfg(&p);
    for (bad, want) in [
        (&[23u8, 3, 3, 0xff, 0xff][..], "more than the 16640"),
        (&[22u8, 3, 3, 0, 40][..], "outer type 22"),
        (&[23u8, 3, 3, 0, 3, 1, 2, 3][..], "too short"),
    ] {
        rt().block_on(async {
            let (c, s) = tokio::io::duplex(64 * 1024);
            let client = async {
                // The handshake through rustls, then raw bytes.
                let mut tls = tokio_rustls::TlsConnector::from(ccfg.clone())
                    .connect(name(), c)
                    .await
                    .unwrap();
                // Once the server is past its handshake (it wrote).
                let mut ok = [0u8; 2];
                tls.read_exact(&mut ok).await.unwrap();
                let (mut raw, _) = tls.into_inner();
                raw.write_all(bad).await.unwrap();
                let mut sink = Vec::new();
                let _ = raw.read_to_end(&mut sink).await;
            };
            let server = async {
                let mut s = our_server(s, &scfg).await;
                s.write_all(b"ok").await.unwrap();
                s.flush().await.unwrap();
                let e = s.read(&mut [0u8; 100]).await.unwrap_err();
                assert!(e.to_string().contains(want), "{e}");
                assert!(s.rbuf.len() <= bad.len());
                // Nothing more is written after the fatal alert.
                let w = s.write_all(b"more").await.unwrap_err();
                assert!(w.to_string().contains("after a fatal alert"), "{w}");
                drop(s);
            };
            tokio::join!(client, server);
        });
    }
}

/// A server that speaks TLS 1.2 only: our client says so (the agent then
/// connects through rustls).
#[test]
fn tls12_is_left_to_rustls() {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS12]);
    let ccfg = client_config(&client_cfg(&p));
    rt().block_on(async {
        let (c, s) = tokio::io::duplex(64 * 1024);
        let server = async {
            let mut tls = match tokio_rustls::TlsAcceptor::from(scfg.clone())
                .accept(s)
                .await
            {
                Ok(t) => t,
                Err(_) => return,
            };
            let _ = tls.read(&mut [0u8; 10]).await;
        };
        let client = async {
            let e = match connect(c, name(), ccfg.clone()).await {
                Ok(_) => panic!("TLS 1.2 taken"),
                Err(e) => e,
            };
            assert!(e.get_ref().is_some_and(|i| i.is::<NotTls13>()), "{e}");
        };
        tokio::join!(server, client);
    });
    // A ClientHello without TLS 1.3 keeps a server on rustls.
    let tls12_client = {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(p.cert.clone()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    };
    rt().block_on(async {
        let (c, mut s) = tokio::io::duplex(64 * 1024);
        let client = async {
            let _ = tokio_rustls::TlsConnector::from(tls12_client)
                .connect(name(), c)
                .await;
        };
        let server = async {
            let (tls13, first) = sniff_client_hello(&mut s).await.unwrap();
            assert!(!tls13);
            assert!(first.len() > 5);
            drop(s);
        };
        tokio::join!(client, server);
    });
}

#[test]
fn own_is_the_default_and_rustls_the_way_back() {
    assert_eq!(Mode::parse(None), Mode::Own);
    assert_eq!(Mode::parse(Some("")), Mode::Own);
    assert_eq!(Mode::parse(Some("own")), Mode::Own);
    assert_eq!(Mode::parse(Some("rustls")), Mode::Rustls);
    assert_eq!(Mode::parse(Some("openssl")), Mode::Own);
    for (i, t) in LinkTls::ALL.iter().enumerate() {
        assert_eq!(t.index(), i);
    }
    assert_eq!(
        LinkTls::rustls(Some(rustls::ProtocolVersion::TLSv1_2)),
        LinkTls::Rustls12
    );
    assert_eq!(
        LinkTls::rustls(Some(rustls::ProtocolVersion::TLSv1_3)),
        LinkTls::Rustls13
    );
}

/// A hostile record sequence a hand-sealing client sends after the
/// handshake (our client's record layer, made to seal what a peer may
/// choose: empty records, KeyUpdates, warning alerts).
#[derive(Debug, Clone, Copy)]
enum Hostile {
    /// `n` empty application_data records.
    Empty(usize),
    /// `n` KeyUpdates, each asking (or not) for ours.
    KeyUpdates(usize, bool),
    /// `n` user_canceled warnings, each followed by a byte of data.
    Warnings(usize),
    /// `n` times: an empty record, then a KeyUpdate (each resets the
    /// other's count in rustls).
    EmptyThenKeyUpdate(usize),
}

fn send_hostile(s: &mut RecordStream<DuplexStream>, h: Hostile) {
    match h {
        Hostile::Empty(n) => {
            for _ in 0..n {
                s.seal(protocol::tls_record::APPLICATION_DATA, &[]).unwrap();
            }
        }
        Hostile::KeyUpdates(n, requested) => {
            for _ in 0..n {
                s.send_key_update(requested).unwrap();
            }
        }
        Hostile::Warnings(n) => {
            for _ in 0..n {
                s.seal(protocol::tls_record::ALERT, &[&[1, 90]]).unwrap();
                s.seal(protocol::tls_record::APPLICATION_DATA, &[b"."])
                    .unwrap();
            }
        }
        Hostile::EmptyThenKeyUpdate(n) => {
            for _ in 0..n {
                s.seal(protocol::tls_record::APPLICATION_DATA, &[]).unwrap();
                s.send_key_update(false).unwrap();
            }
        }
    }
}

/// What a server made of a hostile sequence followed by "ping": the bytes
/// it read (data records of the sequence, then "ping") and whether it
/// then ended the connection with an error.
#[derive(Debug, PartialEq)]
enum Verdict {
    Open,
    Closed,
}

async fn verdict_of<S: tokio::io::AsyncRead + Unpin>(server: &mut S, h: Hostile) -> Verdict {
    let want: Vec<u8> = match h {
        Hostile::Warnings(n) => [vec![b'.'; n], b"ping".to_vec()].concat(),
        _ => b"ping".to_vec(),
    };
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.len() < want.len() {
        match server.read(&mut buf).await {
            Ok(0) | Err(_) => return Verdict::Closed,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    assert_eq!(got, want, "{h:?}: no forged or lost byte");
    Verdict::Open
}

/// Runs `h` against our server (`own`) or rustls' (`false`).
fn run_hostile(own: bool, h: Hostile) -> Verdict {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS13]);
    let ccfg = client_config(&client_cfg(&p));
    rt().block_on(async {
        let (c, s) = tokio::io::duplex(1 << 20);
        let client = async {
            let mut cl = connect(c, name(), ccfg.clone()).await.unwrap().stream;
            // Once the server is past its handshake (it wrote).
            let mut ok = [0u8; 2];
            cl.read_exact(&mut ok).await.unwrap();
            send_hostile(&mut cl, h);
            cl.seal(protocol::tls_record::APPLICATION_DATA, &[b"ping"])
                .unwrap();
            std::future::poll_fn(|cx| cl.poll_drain(cx)).await.unwrap();
            // Keep reading (KeyUpdate answers, alerts) until the server
            // is done with us.
            let mut sink = [0u8; 1024];
            while let Ok(n) = cl.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        let server = async {
            let v = if own {
                let mut sv = our_server(s, &scfg).await;
                sv.write_all(b"ok").await.unwrap();
                sv.flush().await.unwrap();
                let v = verdict_of(&mut sv, h).await;
                drop(sv);
                v
            } else {
                let mut sv = tokio_rustls::TlsAcceptor::from(scfg.clone())
                    .accept(s)
                    .await
                    .unwrap();
                sv.write_all(b"ok").await.unwrap();
                sv.flush().await.unwrap();
                let v = verdict_of(&mut sv, h).await;
                drop(sv);
                v
            };
            v
        };
        let (_, v) = tokio::join!(client, server);
        v
    })
}

/// The differential test against rustls (issue 39): the same hostile
/// record sequences to our server and to rustls' must get the same
/// verdict (taken, or the connection ended), and neither delivers a byte
/// that was not sent. The one deliberate difference is stated.
#[test]
fn hostile_record_sequences_get_the_verdicts_rustls_gives() {
    use protocol::tls_record::{MAX_EMPTY_RECORDS, MAX_KEY_UPDATES, MAX_WARNING_ALERTS};
    let e = usize::from(MAX_EMPTY_RECORDS);
    let k = usize::from(MAX_KEY_UPDATES);
    let w = usize::from(MAX_WARNING_ALERTS);
    let cases = [
        (Hostile::Empty(e), Verdict::Open),
        (Hostile::Empty(e + 1), Verdict::Closed),
        (Hostile::Empty(3_000), Verdict::Closed),
        (Hostile::KeyUpdates(k, false), Verdict::Open),
        (Hostile::KeyUpdates(k + 1, false), Verdict::Closed),
        (Hostile::KeyUpdates(k, true), Verdict::Open),
        (Hostile::KeyUpdates(k + 1, true), Verdict::Closed),
        (Hostile::KeyUpdates(2_000, true), Verdict::Closed),
        (Hostile::Warnings(w), Verdict::Open),
        (Hostile::Warnings(w + 1), Verdict::Closed),
    ];
    let mut report = Vec::new();
    for (h, want) in cases {
        let ours = run_hostile(true, h);
        let theirs = run_hostile(false, h);
        report.push(format!("{h:?}: ours {ours:?}, rustls {theirs:?}"));
        assert_eq!(
            ours,
            theirs,
            "{h:?}: verdicts differ\n{}",
            report.join("\n")
        );
        assert_eq!(ours, want, "{h:?}\n{}", report.join("\n"));
    }
    // Stricter than rustls on purpose: there an empty record restarts the
    // KeyUpdate count and a KeyUpdate the empty-record count, so the pair
    // repeated is never bounded; here only data with content restarts the
    // KeyUpdate count.
    let h = Hostile::EmptyThenKeyUpdate(k + 1);
    assert_eq!(run_hostile(true, h), Verdict::Closed, "{h:?}");
    eprintln!("{}", report.join("\n"));
}

/// A peer that asks for KeyUpdates (each followed by data, so the count
/// never runs out) and never reads: one answer waits at a time, so what
/// the server holds stays small however many it asks for (before, every
/// request queued its own answer: 25 MiB of requests held 22 MiB).
#[test]
fn key_update_requests_from_a_peer_that_never_reads_queue_one_answer() {
    let p = pki();
    let scfg = server_cfg(&p, &[&rustls::version::TLS13]);
    let ccfg = client_config(&client_cfg(&p));
    rt().block_on(async {
        let (c, s) = tokio::io::duplex(4096);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let client = async {
            let mut cl = connect(c, name(), ccfg.clone()).await.unwrap().stream;
            let mut ok = [0u8; 2];
            cl.read_exact(&mut ok).await.unwrap();
            for _ in 0..20_000 {
                cl.send_key_update(true).unwrap();
                cl.seal(protocol::tls_record::APPLICATION_DATA, &[b"d"])
                    .unwrap();
                std::future::poll_fn(|cx| cl.poll_drain(cx)).await.unwrap();
            }
            // Not read until the server has looked at what it holds.
            let _ = done_rx.await;
        };
        let server = async {
            let mut sv = our_server(s, &scfg).await;
            sv.write_all(b"ok").await.unwrap();
            sv.flush().await.unwrap();
            let mut got = 0;
            let mut buf = [0u8; 64];
            let mut most = 0;
            while got < 20_000 {
                got += sv.read(&mut buf).await.unwrap();
                most = most.max(sv.held());
            }
            assert!(
                most <= 256 * 1024,
                "the server held up to {most} bytes for a peer that does not read"
            );
            eprintln!("held at most {most} bytes over 20,000 KeyUpdate requests");
            let _ = done_tx.send(());
        };
        tokio::join!(client, server);
    });
}
