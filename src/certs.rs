//! `edgetunnel certs`: a private CA and the certificates a local setup or a
//! small cluster needs, with no other tooling.
//!
//! Layout of `certs init DIR`:
//! - `DIR`: `ca.crt`, `server.crt/key`, `agent.crt/key`,
//!   `proxy-client.crt/key` (what `--certs-dir DIR` reads, server and
//!   agent alike);
//! - the CA's key apart, in `--ca-dir` (default `DIR-ca`, a sibling, mode
//!   0700): `ca.crt`, `ca.key`. It never lands where the certificates
//!   copied to nodes are.
//!
//! `certs issue ROLE OUT --ca-dir CA` signs one more certificate with that
//! CA into `OUT`: `ca.crt` and `ROLE.crt/key`, so an edge node gets a
//! directory of its own (`certs issue agent node-1 --name node-1 --name
//! 10.0.0.5`), or a server its renewed certificate.
//!
//! Nothing is overwritten without `--force` (checked for every file before
//! anything is written). Certificates start a few minutes in the past
//! (clock skew) and last `--days` (365) or, for the CA, `--ca-days` (3650);
//! no leaf outlives its CA. Files are written to a temporary name and
//! renamed (a server watching them never reads half a file), keys with
//! mode 0600 from the start.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Subcommand;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

// `edgetunnel certs`'s subcommands. They live here, and `cli` re-uses
// them, so that this module names no face above it. (A line comment: a
// doc comment here would become clap's help text.)
#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Write a new CA into --ca-dir (default DIR-ca: its key stays off the
    /// nodes) and ca.crt with a server, an agent and a proxy-client
    /// certificate into DIR. Refuses to replace existing files without
    /// --force.
    Init {
        dir: PathBuf,
        /// Server certificate names (DNS or IP); repeatable.
        #[arg(long = "server-name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
        server_names: Vec<String>,
        /// Agent certificate common name (and DNS name).
        #[arg(long, default_value = "edgetunnel-agent")]
        agent_name: String,
        /// Where the CA (ca.crt, ca.key) goes; default: DIR-ca beside DIR.
        #[arg(long)]
        ca_dir: Option<PathBuf>,
        /// Days the server, agent and proxy-client certificates last.
        #[arg(long, default_value_t = DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        days: u32,
        /// Days the CA lasts.
        #[arg(long, default_value_t = DEFAULT_CA_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        ca_days: u32,
        /// Replace existing files (a new CA: certificates from the old one
        /// stop being trusted).
        #[arg(long)]
        force: bool,
    },
    /// Sign one more certificate with an existing CA: writes ca.crt and
    /// ROLE.crt/ROLE.key into OUT (for an agent, all one edge node needs).
    /// Refuses to replace a different existing file without --force.
    Issue {
        /// server, agent or proxy-client.
        #[arg(value_enum)]
        role: CertRole,
        out: PathBuf,
        /// The CA directory (`certs init`'s DIR-ca).
        #[arg(long)]
        ca_dir: PathBuf,
        /// DNS names or IP addresses (repeatable): the SANs; an agent's
        /// first name is also its CN (the agent ID that
        /// --bind-agent-identity accepts). Default: as `certs init`.
        #[arg(long = "name")]
        names: Vec<String>,
        /// Days the certificate lasts (never past the CA).
        #[arg(long, default_value_t = DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        days: u32,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
}

/// Which certificate `certs issue` signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertRole {
    /// serverAuth, CN edgetunnel-server.
    Server,
    /// clientAuth, CN the first --name.
    Agent,
    /// clientAuth toward kubelets, CN tunnel-proxy-client, O openyurt:yurttunnel.
    ProxyClient,
}

impl CertRole {
    /// The files' base name, as `--certs-dir` looks for them.
    pub fn file_base(self) -> &'static str {
        match self {
            CertRole::Server => "server",
            CertRole::Agent => "agent",
            CertRole::ProxyClient => "proxy-client",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("generating certificates: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("refusing to overwrite {}: pass --force to replace them (to sign one more certificate with an existing CA: edgetunnel certs issue ROLE OUT --ca-dir CA_DIR)", .0.join(", "))]
    Exists(Vec<String>),
    #[error("reading the CA from {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

/// Leaf certificates' lifetime unless told.
pub const DEFAULT_DAYS: u32 = 365;
/// The CA's lifetime unless told.
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// How far in the past certificates start (clocks differ a little).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
const DAY: Duration = Duration::from_secs(86_400);

/// What `certs init` makes.
#[derive(Debug, Clone)]
pub struct CertsSpec {
    /// Subject alternative names of the server certificate (DNS names or IPs).
    pub server_names: Vec<String>,
    /// Common name (and DNS name) of the agent certificate.
    pub agent_name: String,
    /// Where the CA goes (None: `DIR-ca`).
    pub ca_dir: Option<PathBuf>,
    pub days: u32,
    pub ca_days: u32,
    pub force: bool,
}

impl Default for CertsSpec {
    fn default() -> Self {
        Self {
            server_names: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            agent_name: "edgetunnel-agent".into(),
            ca_dir: None,
            days: DEFAULT_DAYS,
            ca_days: DEFAULT_CA_DAYS,
            force: false,
        }
    }
}

/// The CA directory `certs init DIR` uses without `--ca-dir`: `DIR-ca`
/// beside `DIR`.
pub fn default_ca_dir(dir: &Path) -> Result<PathBuf, CertsError> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .ok_or_else(|| {
            CertsError::Invalid(format!(
                "{}: name the certificates directory, or give --ca-dir",
                dir.display()
            ))
        })?;
    Ok(dir.with_file_name(format!("{name}-ca")))
}

fn write_err(path: &Path) -> impl Fn(std::io::Error) -> CertsError + '_ {
    move |source| CertsError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// Creates `dir` (and parents); `private`: mode 0700.
fn make_dir(dir: &Path, private: bool) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    if private {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(write_err(dir))?;
    }
    Ok(())
}

/// One file to write: path, contents, private (0600).
struct Out {
    path: PathBuf,
    contents: String,
    private: bool,
}

impl Out {
    fn new(dir: &Path, name: &str, contents: String, private: bool) -> Out {
        Out {
            path: dir.join(name),
            contents,
            private,
        }
    }
}

/// Refuses (listing them all) if any file exists with other contents,
/// unless `force`.
fn check_free(files: &[Out], force: bool) -> Result<(), CertsError> {
    if force {
        return Ok(());
    }
    let taken: Vec<String> = files
        .iter()
        .filter(|f| {
            f.path.exists()
                && std::fs::read_to_string(&f.path).map_or(true, |old| old != f.contents)
        })
        .map(|f| f.path.display().to_string())
        .collect();
    if taken.is_empty() {
        Ok(())
    } else {
        Err(CertsError::Exists(taken))
    }
}

/// Writes to a temporary file beside the target (0600 from creation for
/// keys) and renames it over the target.
fn write_all(files: &[Out]) -> Result<(), CertsError> {
    for f in files {
        let tmp = f.path.with_extension("edgetunnel-tmp");
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        o.mode(if f.private { 0o600 } else { 0o644 });
        let mut file = o.open(&tmp).map_err(write_err(&tmp))?;
        // An old temporary file keeps its mode: set it.
        if f.private {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(write_err(&tmp))?;
        }
        file.write_all(f.contents.as_bytes())
            .and_then(|_| file.sync_all())
            .map_err(write_err(&tmp))?;
        std::fs::rename(&tmp, &f.path).map_err(write_err(&f.path))?;
    }
    Ok(())
}

/// A CA able to sign, and when it stops being valid.
struct Ca {
    cert: Certificate,
    key: KeyPair,
    pem: String,
    not_after: SystemTime,
}

fn new_ca(days: u32) -> Result<Ca, CertsError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "edgetunnel local CA");
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    let not_after = now + DAY * days.max(1);
    p.not_before = (now - BACKDATE).into();
    p.not_after = not_after.into();
    let key = KeyPair::generate()?;
    let cert = p.self_signed(&key)?;
    Ok(Ca {
        pem: cert.pem(),
        cert,
        key,
        not_after,
    })
}

/// The CA in `dir` (`ca.crt`, `ca.key`).
fn load_ca(dir: &Path) -> Result<Ca, CertsError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| CertsError::Ca {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    };
    let bad = |name: &str, e: &dyn std::fmt::Display| CertsError::Ca {
        path: dir.join(name).display().to_string(),
        reason: e.to_string(),
    };
    let pem = read("ca.crt")?;
    let key = KeyPair::from_pem(&read("ca.key")?).map_err(|e| bad("ca.key", &e))?;
    let params = CertificateParams::from_ca_cert_pem(&pem).map_err(|e| bad("ca.crt", &e))?;
    let not_after = SystemTime::from(params.not_after);
    // Signing needs rcgen's Certificate: the same subject and key, so the
    // leaves chain to the ca.crt on disk.
    let cert = params.self_signed(&key).map_err(|e| bad("ca.crt", &e))?;
    if cert.der().is_empty() {
        return Err(bad("ca.crt", &"empty"));
    }
    Ok(Ca {
        cert,
        key,
        pem,
        not_after,
    })
}

/// What one leaf certificate is.
struct Leaf {
    common_name: String,
    organization: Option<&'static str>,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
}

impl Leaf {
    fn for_role(role: CertRole, names: &[String]) -> Result<Leaf, CertsError> {
        Ok(match role {
            CertRole::Server => Leaf {
                common_name: "edgetunnel-server".into(),
                organization: None,
                sans: if names.is_empty() {
                    CertsSpec::default().server_names
                } else {
                    names.to_vec()
                },
                usage: ExtendedKeyUsagePurpose::ServerAuth,
            },
            CertRole::Agent => {
                let sans = if names.is_empty() {
                    vec![CertsSpec::default().agent_name]
                } else {
                    names.to_vec()
                };
                Leaf {
                    common_name: sans[0].clone(),
                    organization: None,
                    sans,
                    usage: ExtendedKeyUsagePurpose::ClientAuth,
                }
            }
            // The interception listener's client certificate toward
            // kubelets (yurt-tunnel's proxy client: CN tunnel-proxy-client,
            // O openyurt:yurttunnel, from openyurt
            // pkg/yurttunnel/constants/constants.go).
            CertRole::ProxyClient => {
                if !names.is_empty() {
                    return Err(CertsError::Invalid(
                        "the proxy-client certificate takes no --name".into(),
                    ));
                }
                Leaf {
                    common_name: "tunnel-proxy-client".into(),
                    organization: Some("openyurt:yurttunnel"),
                    sans: Vec::new(),
                    usage: ExtendedKeyUsagePurpose::ClientAuth,
                }
            }
        })
    }

    /// (certificate PEM, key PEM), valid `days` but not past the CA.
    fn sign(&self, ca: &Ca, days: u32) -> Result<(String, String), CertsError> {
        let mut p = CertificateParams::new(self.sans.clone())?;
        p.distinguished_name
            .push(DnType::CommonName, self.common_name.as_str());
        if let Some(o) = self.organization {
            p.distinguished_name.push(DnType::OrganizationName, o);
        }
        p.extended_key_usages = vec![self.usage.clone()];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = SystemTime::now();
        p.not_before = (now - BACKDATE).into();
        p.not_after = (now + DAY * days.max(1)).min(ca.not_after).into();
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &ca.cert, &ca.key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// `certs init`: a new CA in the CA directory, and the server, agent and
/// proxy-client certificates with `ca.crt` in `dir`. Returns the CA
/// directory.
pub fn init(dir: &Path, spec: &CertsSpec) -> Result<PathBuf, CertsError> {
    let ca_dir = match &spec.ca_dir {
        Some(d) => d.clone(),
        None => default_ca_dir(dir)?,
    };
    if ca_dir == dir {
        return Err(CertsError::Invalid(
            "--ca-dir must not be the certificates directory: the CA key stays apart".into(),
        ));
    }
    let ca = new_ca(spec.ca_days)?;
    let role = |r: CertRole, names: &[String]| -> Result<(String, String), CertsError> {
        Leaf::for_role(r, names)?.sign(&ca, spec.days)
    };
    let (server_crt, server_key) = role(CertRole::Server, &spec.server_names)?;
    let (agent_crt, agent_key) = role(CertRole::Agent, std::slice::from_ref(&spec.agent_name))?;
    let (pc_crt, pc_key) = role(CertRole::ProxyClient, &[])?;
    let ca_files = [
        Out::new(&ca_dir, "ca.crt", ca.pem.clone(), false),
        Out::new(&ca_dir, "ca.key", ca.key.serialize_pem(), true),
    ];
    let files = [
        Out::new(dir, "ca.crt", ca.pem.clone(), false),
        Out::new(dir, "server.crt", server_crt, false),
        Out::new(dir, "server.key", server_key, true),
        Out::new(dir, "agent.crt", agent_crt, false),
        Out::new(dir, "agent.key", agent_key, true),
        Out::new(dir, "proxy-client.crt", pc_crt, false),
        Out::new(dir, "proxy-client.key", pc_key, true),
    ];
    // A fresh CA differs from anything on disk: any file there refuses.
    check_free(&ca_files, spec.force)?;
    check_free(&files, spec.force)?;
    make_dir(&ca_dir, true)?;
    make_dir(dir, false)?;
    write_all(&ca_files)?;
    write_all(&files)?;
    Ok(ca_dir)
}

/// `certs issue`: one more certificate for `role` signed by the CA in
/// `ca_dir`, with `ca.crt`, into `out`.
pub fn issue(
    role: CertRole,
    out: &Path,
    ca_dir: &Path,
    names: &[String],
    days: u32,
    force: bool,
) -> Result<(), CertsError> {
    let ca = load_ca(ca_dir)?;
    let (crt, key) = Leaf::for_role(role, names)?.sign(&ca, days)?;
    let base = role.file_base();
    let files = [
        Out::new(out, "ca.crt", ca.pem.clone(), false),
        Out::new(out, &format!("{base}.crt"), crt, false),
        Out::new(out, &format!("{base}.key"), key, true),
    ];
    check_free(&files, force)?;
    make_dir(out, false)?;
    write_all(&files)
}

/// Runs a `certs` subcommand, telling the user what went where.
pub fn run(cmd: CertsCommand) -> Result<(), crate::BoxError> {
    match cmd {
        CertsCommand::Init {
            dir,
            server_names,
            agent_name,
            ca_dir,
            days,
            ca_days,
            force,
        } => {
            let spec = CertsSpec {
                server_names,
                agent_name,
                ca_dir,
                days,
                ca_days,
                force,
            };
            let ca_dir = init(&dir, &spec)?;
            println!(
                "wrote ca.crt, server.crt/key, agent.crt/key, proxy-client.crt/key to {}",
                dir.display()
            );
            println!(
                "wrote the CA (ca.crt, ca.key) to {}: keep it off the nodes; one more agent: edgetunnel certs issue agent OUT_DIR --ca-dir {} --name NODE_NAME [--name NODE_IP]",
                ca_dir.display(),
                ca_dir.display()
            );
        }
        CertsCommand::Issue {
            role,
            out,
            ca_dir,
            names,
            days,
            force,
        } => {
            issue(role, &out, &ca_dir, &names, days, force)?;
            let base = role.file_base();
            println!("wrote ca.crt, {base}.crt, {base}.key to {}", out.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::tls::{client_config, server_config, ClientCert, TlsFiles};

    #[test]
    fn generated_files_make_valid_tls_configs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let ca_dir = init(&dir, &CertsSpec::default()).unwrap();
        assert_eq!(ca_dir, tmp.path().join("certs-ca"));
        let p = |n: &str| dir.join(n);
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
        // Issued later from the same CA: the same ca.crt, a usable pair.
        let node = tmp.path().join("node");
        issue(CertRole::Agent, &node, &ca_dir, &["n1".into()], 10, false).unwrap();
        assert_eq!(
            std::fs::read(node.join("ca.crt")).unwrap(),
            std::fs::read(p("ca.crt")).unwrap()
        );
        client_config(&TlsFiles {
            cert: node.join("agent.crt"),
            key: node.join("agent.key"),
            ca: node.join("ca.crt"),
        })
        .unwrap();
    }

    #[test]
    fn ca_dir_names() {
        assert_eq!(
            default_ca_dir(Path::new("/etc/edgetunnel/pki")).unwrap(),
            Path::new("/etc/edgetunnel/pki-ca")
        );
        assert_eq!(
            default_ca_dir(Path::new("certs/")).unwrap(),
            Path::new("certs-ca")
        );
        assert!(default_ca_dir(Path::new(".")).is_err());
        assert!(default_ca_dir(Path::new("/")).is_err());
    }
}
