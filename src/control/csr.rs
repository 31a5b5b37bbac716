//! Certificates from Kubernetes CertificateSigningRequests, as yurt-tunnel
//! requested them: the profiles (signer, subject, usages, SANs), the key and
//! request generation, the renewal schedule, and the `kube` calls that
//! create a request and wait for the signed certificate. Files are written
//! key first, certificate second, each atomically; the certificate watcher
//! then swaps the pair into the running TLS configs.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;

#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("building the request: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("Kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("CertificateSigningRequest {name} was {how}: {message}")]
    Refused {
        name: String,
        how: String,
        message: String,
    },
    #[error("CertificateSigningRequest {0} not signed in time")]
    Timeout(String),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// What to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub signer: String,
    pub common_name: String,
    pub organization: Vec<String>,
    pub usages: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Profile {
    /// The tunnel server's serving certificate.
    pub fn server(dns_names: Vec<String>, ips: Vec<IpAddr>) -> Profile {
        Profile {
            signer: "kubernetes.io/kubelet-serving".into(),
            common_name: "system:node:tunnel-server".into(),
            organization: vec!["system:nodes".into()],
            usages: vec![
                "digital signature".into(),
                "key encipherment".into(),
                "server auth".into(),
            ],
            dns_names,
            ips,
        }
    }

    /// The interception listener's client certificate toward kubelets.
    pub fn proxy_client() -> Profile {
        Profile {
            signer: "kubernetes.io/kube-apiserver-client".into(),
            common_name: "tunnel-proxy-client".into(),
            organization: vec!["openyurt:yurttunnel".into()],
            usages: vec![
                "digital signature".into(),
                "key encipherment".into(),
                "client auth".into(),
            ],
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    /// An agent's client certificate (SANs: the node name and address).
    pub fn agent(node: &str, ips: Vec<IpAddr>) -> Profile {
        Profile {
            signer: "kubernetes.io/kube-apiserver-client".into(),
            common_name: "tunnel-agent-client".into(),
            organization: vec!["openyurt:yurttunnel".into()],
            usages: vec![
                "digital signature".into(),
                "key encipherment".into(),
                "client auth".into(),
            ],
            dns_names: vec![node.to_string()],
            ips,
        }
    }

    /// A new key and a PEM certificate request for it: (request, key).
    pub fn request(&self) -> Result<(String, String), rcgen::Error> {
        let mut names: Vec<String> = self.dns_names.clone();
        names.extend(self.ips.iter().map(|ip| ip.to_string()));
        let mut p = rcgen::CertificateParams::new(names)?;
        p.distinguished_name = rcgen::DistinguishedName::new();
        for o in &self.organization {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, o.as_str());
        }
        p.distinguished_name
            .push(rcgen::DnType::CommonName, self.common_name.as_str());
        let key = rcgen::KeyPair::generate()?;
        let csr = p.serialize_request(&key)?;
        Ok((csr.pem()?, key.serialize_pem()))
    }
}

/// When to renew a certificate valid from `not_before` to `not_after`: at
/// 80% of its lifetime (client-go's certificate manager renews between 70%
/// and 90%).
pub fn renew_at(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let life = not_after
        .duration_since(not_before)
        .unwrap_or(Duration::ZERO);
    not_before + life.mul_f64(0.8)
}

/// The validity period of the first certificate in a PEM file.
pub fn validity(pem: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let der = rustls_pemfile::certs(&mut &pem[..]).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let t = |ts: i64| UNIX_EPOCH + Duration::from_secs(ts.max(0) as u64);
    Some((
        t(cert.validity().not_before.timestamp()),
        t(cert.validity().not_after.timestamp()),
    ))
}

/// A Service's addresses for a serving certificate: cluster IPs, external
/// IPs and load-balancer ingress (IPs, and hostnames as DNS names).
pub fn service_addresses(svc: &Service) -> (Vec<IpAddr>, Vec<String>) {
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut names = Vec::new();
    let mut add = |s: &str| match s.parse::<IpAddr>() {
        Ok(ip) if !ips.contains(&ip) => ips.push(ip),
        Ok(_) => {}
        Err(_) if !s.is_empty() && s != "None" => names.push(s.to_string()),
        Err(_) => {}
    };
    if let Some(spec) = &svc.spec {
        spec.cluster_ip.iter().for_each(|s| add(s));
        spec.cluster_ips.iter().flatten().for_each(|s| add(s));
        spec.external_ips.iter().flatten().for_each(|s| add(s));
    }
    for ing in svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
    {
        ing.ip.iter().for_each(|s| add(s));
        ing.hostname.iter().for_each(|s| add(s));
    }
    (ips, names)
}

/// A certificate file pair kept signed by Kubernetes.
#[derive(Debug, Clone)]
pub struct Job {
    pub profile: Profile,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Request names start with this (`generateName`).
    pub name_prefix: String,
    /// Services (`namespace`, `name`) whose addresses join the SANs, read
    /// again at every renewal (the serving certificate).
    pub services: Vec<super::manager::ObjectRef>,
}

impl Job {
    /// Whether the pair is missing or due for renewal at `now`.
    pub fn due(&self, now: SystemTime) -> bool {
        match std::fs::read(&self.cert)
            .ok()
            .and_then(|pem| validity(&pem))
        {
            Some((from, until)) => now >= renew_at(from, until),
            None => true,
        }
    }
}

fn write_atomic(path: &Path, text: &str, private: bool) -> Result<(), CsrError> {
    let err = |source| CsrError::Write {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("csr-tmp");
    std::fs::write(&tmp, text).map_err(err)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)
}

/// Creates a request for `job`, waits (up to `wait`) for its certificate,
/// and writes the key and certificate files.
pub async fn obtain(client: &Client, job: &Job, wait: Duration) -> Result<(), CsrError> {
    let mut profile = job.profile.clone();
    for svc_ref in &job.services {
        let (ns, name) = (&svc_ref.namespace, &svc_ref.name);
        let api: Api<Service> = Api::namespaced(client.clone(), ns);
        match api.get_opt(name).await? {
            Some(svc) => {
                let (ips, names) = service_addresses(&svc);
                for ip in ips {
                    if !profile.ips.contains(&ip) {
                        profile.ips.push(ip);
                    }
                }
                profile.dns_names.extend(
                    names
                        .into_iter()
                        .filter(|n| !job.profile.dns_names.contains(n)),
                );
            }
            None => tracing::debug!(
                "service {ns}/{name} not found; its addresses are not in the certificate"
            ),
        }
    }
    let (request, key) = profile.request()?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(job.name_prefix.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: profile.signer.clone(),
            usages: Some(profile.usages.clone()),
            ..Default::default()
        },
        status: None,
    };
    let created = api.create(&PostParams::default(), &csr).await?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(%name, signer = %job.profile.signer, cn = %job.profile.common_name, "certificate requested; waiting for approval");
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(status) = api.get_opt(&name).await?.and_then(|c| c.status) {
            for c in status.conditions.iter().flatten() {
                if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
                    return Err(CsrError::Refused {
                        name,
                        how: c.type_.to_lowercase(),
                        message: c.message.clone().unwrap_or_default(),
                    });
                }
            }
            if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                write_atomic(&job.key, &key, true)?;
                write_atomic(&job.cert, &String::from_utf8_lossy(&cert.0), false)?;
                tracing::info!(%name, file = %job.cert.display(), "certificate issued");
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CsrError::Timeout(name));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_requests() {
        let p = Profile::server(
            vec!["tunnel.example".into()],
            vec!["10.0.0.2".parse().unwrap()],
        );
        assert_eq!(p.signer, "kubernetes.io/kubelet-serving");
        let (csr, key) = p.request().unwrap();
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(key.contains("PRIVATE KEY"));
        let a = Profile::agent("node-1", vec![]);
        assert_eq!(a.dns_names, vec!["node-1".to_string()]);
        assert_eq!(
            Profile::proxy_client().organization,
            vec!["openyurt:yurttunnel".to_string()]
        );
    }

    #[test]
    fn renewal_at_eighty_percent() {
        let from = UNIX_EPOCH + Duration::from_secs(1000);
        let until = from + Duration::from_secs(100);
        assert_eq!(renew_at(from, until), from + Duration::from_secs(80));
    }
}
