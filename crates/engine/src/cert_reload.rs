//! Certificates that change under running listeners. The rustls configs
//! hold a resolver whose current key pair can be swapped: a new certificate
//! is used by the next handshake, live connections keep theirs. The control
//! thread watches the files and swaps (see `control::manager`).
//!
//! Every reload attempt is counted by its result in
//! `edgetunnel_certificate_reloads_total{result="ok"|"failed"}`
//! ([`reload_counts`]), process-wide, so an operator sees a renewal taken
//! or a broken pair left out without reading the log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::SystemTime;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

use super::tls::{load_certs, load_key, TlsError};

/// The current certificate and key, swappable.
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
    cert: PathBuf,
    key: PathBuf,
    /// Modification times of the files last loaded.
    stamp: RwLock<(Option<SystemTime>, Option<SystemTime>)>,
}

fn certified(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let provider = rustls::crypto::ring::default_provider();
    let ck =
        CertifiedKey::from_der(load_certs(cert)?, load_key(key)?, &provider).map_err(|source| {
            TlsError::KeyPair {
                cert: cert.display().to_string(),
                key: key.display().to_string(),
                source,
            }
        })?;
    Ok(Arc::new(ck))
}

/// Reload attempts by result (`ok`, `failed`), shared by every metrics
/// registry of a role that reloads certificates (server, agent).
pub fn reload_counts() -> Family<[(&'static str, &'static str); 1], Counter> {
    static COUNTS: OnceLock<Family<[(&'static str, &'static str); 1], Counter>> = OnceLock::new();
    COUNTS
        .get_or_init(|| {
            let f = Family::default();
            // Both results shown from the start, at 0.
            for r in ["ok", "failed"] {
                f.get_or_create_owned(&[("result", r)]);
            }
            f
        })
        .clone()
}

/// Counts one reload attempt by its outcome and hands the outcome back.
fn counted<T>(r: Result<T, TlsError>) -> Result<T, TlsError> {
    let result = if r.is_ok() { "ok" } else { "failed" };
    reload_counts().get_or_create(&[("result", result)]).inc();
    r
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl ReloadingCert {
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<ReloadingCert>, TlsError> {
        Ok(Arc::new(ReloadingCert {
            current: RwLock::new(certified(cert, key)?),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            stamp: RwLock::new((mtime(cert), mtime(key))),
        }))
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current.read().expect("cert lock").clone()
    }

    /// Reloads when either file changed since the last load. A pair that
    /// does not load (say, the key written before the certificate) is left
    /// for the next check; the old pair stays in use meanwhile.
    /// Returns whether a new certificate is now in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = (mtime(&self.cert), mtime(&self.key));
        if *self.stamp.read().expect("stamp lock") == now {
            return Ok(false);
        }
        let ck = counted(certified(&self.cert, &self.key))?;
        *self.current.write().expect("cert lock") = ck;
        *self.stamp.write().expect("stamp lock") = now;
        Ok(true)
    }

    /// Loads the pair now, changed or not (SIGHUP). On an error the old
    /// pair stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let now = (mtime(&self.cert), mtime(&self.key));
        let ck = counted(certified(&self.cert, &self.key))?;
        *self.current.write().expect("cert lock") = ck;
        *self.stamp.write().expect("stamp lock") = now;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.cert
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _issuers: &[&[u8]],
        _schemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(result: &'static str) -> u64 {
        reload_counts().get_or_create(&[("result", result)]).get()
    }

    fn write_pair(dir: &Path) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    /// Each reload is counted by its result; the only test here that
    /// reloads, so the deltas are exact.
    #[test]
    fn reloads_are_counted_by_result() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = write_pair(dir.path());
        let pair = ReloadingCert::load(&c, &k).unwrap();
        let (ok, failed) = (count("ok"), count("failed"));
        // Unchanged files: no attempt, nothing counted.
        assert!(!pair.reload_if_changed().unwrap());
        pair.reload().unwrap();
        assert_eq!((count("ok"), count("failed")), (ok + 1, failed));
        // A key that does not load: counted as failed, the old pair stays.
        let before = pair.get();
        std::fs::write(&k, "not a key").unwrap();
        assert!(pair.reload().is_err());
        assert_eq!((count("ok"), count("failed")), (ok + 1, failed + 1));
        assert!(Arc::ptr_eq(&before, &pair.get()));
        // A new pair: taken by the change check.
        let new = dir.path().join("new");
        std::fs::create_dir(&new).unwrap();
        let (c2, k2) = write_pair(&new);
        std::fs::rename(c2, &c).unwrap();
        std::fs::rename(k2, &k).unwrap();
        let stamp = *pair.stamp.read().unwrap();
        if stamp == (mtime(&c), mtime(&k)) {
            // Same mtimes (a coarse clock): forget the stamp.
            *pair.stamp.write().unwrap() = (None, None);
        }
        assert!(pair.reload_if_changed().unwrap());
        assert_eq!((count("ok"), count("failed")), (ok + 2, failed + 1));
        assert!(!Arc::ptr_eq(&before, &pair.get()));
    }
}
