//! Certificates that change under running listeners. The rustls configs
//! hold a resolver whose current key pair can be swapped: a new certificate
//! is used by the next handshake, live connections keep theirs. The control
//! thread watches the files and swaps (see `control::manager`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

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
        let ck = certified(&self.cert, &self.key)?;
        *self.current.write().expect("cert lock") = ck;
        *self.stamp.write().expect("stamp lock") = now;
        Ok(true)
    }

    /// Loads the pair now, changed or not (SIGHUP). On an error the old
    /// pair stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let now = (mtime(&self.cert), mtime(&self.key));
        let ck = certified(&self.cert, &self.key)?;
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
