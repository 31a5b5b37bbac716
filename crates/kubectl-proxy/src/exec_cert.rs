//! A client certificate from an exec credential plugin's answer
//! (`clientCertificateData`/`clientKeyData`) turned into a rustls key, with
//! Go's checks and wording. Here rather than in
//! [`protocol::kubectl::upstream::exec_credential`] because it needs rustls.

use protocol::kubectl::upstream::exec_credential::ExecCredentialError;

/// The plugin's `clientCertificateData`/`clientKeyData` as a rustls key,
/// checked as Go's `tls.X509KeyPair` checks them (client-go,
/// `refreshCredsLocked`): PEM certificates (leaf first) and one PEM private
/// key of a supported type whose public half is the leaf's. Error texts are
/// Go's (crypto/tls `X509KeyPair`).
pub fn client_key(
    cert_pem: &str,
    key_pem: &str,
) -> Result<rustls::sign::CertifiedKey, ExecCredentialError> {
    let bad = |s: &str| ExecCredentialError::KeyPair(s.to_string());
    let certs: Vec<rustls::pki_types::CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|_| bad("tls: failed to find any PEM data in certificate input"))?;
    if certs.is_empty() {
        return Err(bad("tls: failed to find any PEM data in certificate input"));
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .ok()
        .flatten()
        .ok_or_else(|| bad("tls: failed to find any PEM data in key input"))?;
    let provider = rustls::crypto::ring::default_provider();
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|_| bad("tls: failed to parse private key"))?;
    let ck = rustls::sign::CertifiedKey::new(certs, signer);
    match ck.keys_match() {
        Ok(()) => Ok(ck),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(bad("tls: private key does not match public key"))
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(ck),
        Err(_) => Err(bad("x509: malformed certificate")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cn: &str) -> (String, String) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn client_key_as_go_x509_key_pair() {
        let (c1, k1) = pair("one");
        let (c2, k2) = pair("two");
        let ck = client_key(&c1, &k1).unwrap();
        assert_eq!(ck.cert.len(), 1);
        // A chain: every certificate kept, leaf first.
        let chain = format!("{c1}{c2}");
        assert_eq!(client_key(&chain, &k1).unwrap().cert.len(), 2);
        let err = |c: &str, k: &str| match client_key(c, k) {
            Err(ExecCredentialError::KeyPair(s)) => s,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        };
        assert_eq!(err(&c1, &k2), "tls: private key does not match public key");
        assert_eq!(
            err("not pem", &k1),
            "tls: failed to find any PEM data in certificate input"
        );
        assert_eq!(
            err(&c1, &c1),
            "tls: failed to find any PEM data in key input"
        );
        assert_eq!(
            ExecCredentialError::KeyPair("x".into()).to_string(),
            "failed parsing client key/certificate: x"
        );
    }
}
