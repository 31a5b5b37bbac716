//! `edgetunnel certs init DIR`: a private CA plus a server and an agent
//! certificate, so a local setup runs with no other tooling.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("generating certificates: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// What to put in the generated certificates.
#[derive(Debug, Clone)]
pub struct CertsSpec {
    /// Subject alternative names of the server certificate (DNS names or IPs).
    pub server_names: Vec<String>,
    /// Common name of the agent certificate.
    pub agent_name: String,
}

impl Default for CertsSpec {
    fn default() -> Self {
        Self {
            server_names: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            agent_name: "edgetunnel-agent".into(),
        }
    }
}

fn write(dir: &Path, name: &str, contents: &str, private: bool) -> Result<(), CertsError> {
    let path = dir.join(name);
    let err = |source| CertsError::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&path, contents).map_err(err)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    Ok(())
}

/// Writes `ca.crt ca.key server.crt server.key agent.crt agent.key
/// proxy-client.crt proxy-client.key` to `dir`.
pub fn init(dir: &Path, spec: &CertsSpec) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "edgetunnel local CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(names)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![usage];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &ca, &ca_key)?;
        Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
    };
    let (server_crt, server_key) = leaf(
        spec.server_names.clone(),
        "edgetunnel-server",
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let (agent_crt, agent_key) = leaf(
        vec![spec.agent_name.clone()],
        &spec.agent_name,
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    write(dir, "ca.crt", &ca.pem(), false)?;
    write(dir, "ca.key", &ca_key.serialize_pem(), true)?;
    write(dir, "server.crt", &server_crt, false)?;
    write(dir, "server.key", &server_key, true)?;
    // The interception listener's client certificate toward kubelets
    // (yurt-tunnel's proxy client: CN tunnel-proxy-client, O openyurt:yurttunnel).
    let (pc_crt, pc_key) = {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name
            .push(DnType::CommonName, "tunnel-proxy-client");
        p.distinguished_name
            .push(DnType::OrganizationName, "openyurt:yurttunnel");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        (p.signed_by(&key, &ca, &ca_key)?.pem(), key.serialize_pem())
    };
    write(dir, "agent.crt", &agent_crt, false)?;
    write(dir, "agent.key", &agent_key, true)?;
    write(dir, "proxy-client.crt", &pc_crt, false)?;
    write(dir, "proxy-client.key", &pc_key, true)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tls::{client_config, server_config, ClientCert, TlsFiles};

    #[test]
    fn generated_files_make_valid_tls_configs() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &CertsSpec::default()).unwrap();
        let p = |n: &str| dir.path().join(n);
        server_config(
            &TlsFiles {
                cert: p("server.crt"),
                key: p("server.key"),
                ca: p("ca.crt"),
            },
            ClientCert::Required,
            &Default::default(),
        )
        .unwrap();
        client_config(&TlsFiles {
            cert: p("agent.crt"),
            key: p("agent.key"),
            ca: p("ca.crt"),
        })
        .unwrap();
    }
}
