//! The configurations of the haproxy mutual-TLS pair (the comparison
//! bench's `haproxy-tls-pair` anchor and the WAN bench's haproxy system
//! include this file): a cloud haproxy that takes the client's plain
//! connection and originates mutual TLS 1.3 to an edge haproxy that
//! terminates it and connects to the target; TCP mode, timeouts 1 h,
//! haproxy's default TLS session cache resuming sessions between the two.

use std::path::{Path, PathBuf};

/// The TLS 1.3 suite of edgetunnel's agent link (crates/engine/src/tls.rs
/// lets rustls pick it first), as OpenSSL names it.
pub(crate) const SUITE: &str = "TLS_AES_128_GCM_SHA256";

/// One route through the pair: the cloud haproxy listens in clear on
/// `cloud_bind` and connects with TLS to `edge_addr`, where the edge
/// haproxy listens (`edge_bind`) and connects to `target` in clear.
pub(crate) struct Route {
    pub cloud_bind: String,
    pub edge_addr: String,
    pub edge_bind: String,
    pub target: String,
}

/// The certificates of a `certs init` directory the pair uses: the edge
/// presents `server`, the cloud `agent`, both checked against `ca.crt`
/// (and the edge's against the name `localhost`).
pub(crate) struct PairCerts {
    pub edge_pem: PathBuf,
    pub cloud_pem: PathBuf,
    pub ca: PathBuf,
}

impl PairCerts {
    /// Writes the PEM bundles haproxy's `crt` wants (certificate then
    /// key) next to the certificates in `certs`.
    pub(crate) fn bundle(certs: &Path) -> Result<PairCerts, String> {
        Ok(PairCerts {
            edge_pem: bundle(certs, "server")?,
            cloud_pem: bundle(certs, "agent")?,
            ca: certs.join("ca.crt"),
        })
    }
}

/// A PEM file with `name`.crt then `name`.key (haproxy's `crt`).
fn bundle(certs: &Path, name: &str) -> Result<PathBuf, String> {
    let read = |ext: &str| {
        std::fs::read_to_string(certs.join(format!("{name}.{ext}")))
            .map_err(|e| format!("reading {name}.{ext}: {e}"))
    };
    let pem = format!("{}\n{}", read("crt")?, read("key")?);
    let path = certs.join(format!("{name}.pem"));
    std::fs::write(&path, pem).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// The (edge, cloud) configurations for `routes`: the edge requires the
/// client certificate from the CA, both sides TLS 1.3 and [`SUITE`] only;
/// `maxconn` global and per section.
pub(crate) fn configs(maxconn: usize, routes: &[Route], certs: &PairCerts) -> (String, String) {
    let head = format!(
        "global\n    maxconn {maxconn}\n    ssl-default-bind-options ssl-min-ver TLSv1.3\n    \
         ssl-default-server-options ssl-min-ver TLSv1.3\n\n\
         defaults\n    mode tcp\n    maxconn {maxconn}\n    timeout connect 1h\n    \
         timeout client 1h\n    timeout server 1h\n    timeout client-fin 1h\n    \
         timeout server-fin 1h\n"
    );
    let (mut edge, mut cloud) = (head.clone(), head);
    for (i, r) in routes.iter().enumerate() {
        edge.push_str(&format!(
            "\nlisten e{i}\n    bind {} ssl crt {} ca-file {} verify required \
             ciphersuites {SUITE}\n    maxconn {maxconn}\n    server t{i} {}\n",
            r.edge_bind,
            certs.edge_pem.display(),
            certs.ca.display(),
            r.target
        ));
        cloud.push_str(&format!(
            "\nlisten c{i}\n    bind {}\n    maxconn {maxconn}\n    \
             server e{i} {} ssl crt {} ca-file {} verify required \
             verifyhost localhost sni str(localhost) ciphersuites {SUITE}\n",
            r.cloud_bind,
            r.edge_addr,
            certs.cloud_pem.display(),
            certs.ca.display()
        ));
    }
    (edge, cloud)
}
