//! A stand-in for kube-apiserver's TokenReview endpoint, for the fleet
//! scenario: plain HTTP/1.1 with keep-alive on loopback, a thread per
//! connection, `POST /apis/authentication.k8s.io/v1/tokenreviews` answered
//! as kube-apiserver does for a valid ServiceAccount token (authenticated,
//! user `system:serviceaccount:NS:SA`, the audiences asked), anything else
//! 404. It counts the reviews; a kubeconfig pointing at it is written for
//! the server's `--kube`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

pub(crate) const NAMESPACE: &str = "kube-system";
pub(crate) const SERVICE_ACCOUNT: &str = "konnectivity-agent";
pub(crate) const AUDIENCE: &str = "system:konnectivity-server";
/// Tokens it accepts start with this.
pub(crate) const TOKEN_PREFIX: &str = "fleet-token-";

/// The running endpoint (its listener thread lives as long as the process).
pub(crate) struct FakeReviews {
    pub addr: SocketAddr,
    pub reviews: Arc<AtomicU64>,
}

impl FakeReviews {
    pub(crate) fn start() -> std::io::Result<FakeReviews> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let reviews = Arc::new(AtomicU64::new(0));
        let count = reviews.clone();
        std::thread::Builder::new()
            .name("fake-tokenreview".into())
            .spawn(move || {
                for s in l.incoming().flatten() {
                    let count = count.clone();
                    let _ = std::thread::Builder::new()
                        .stack_size(128 << 10)
                        .spawn(move || serve(s, &count));
                }
            })?;
        Ok(FakeReviews { addr, reviews })
    }

    pub(crate) fn count(&self) -> u64 {
        self.reviews.load(Ordering::Relaxed)
    }

    /// A kubeconfig for the server's `--kube`, no credentials.
    pub(crate) fn kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
                 users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
                 current-context: fake\n",
                self.addr
            ),
        )
    }
}

fn serve(s: TcpStream, count: &AtomicU64) {
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let (code, v) = if line.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews") {
            count.fetch_add(1, Ordering::Relaxed);
            (201, review(&body))
        } else {
            (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
            )
        };
        let body = v.to_string();
        let head = format!(
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if w.write_all(head.as_bytes())
            .and_then(|_| w.write_all(body.as_bytes()))
            .is_err()
        {
            return;
        }
    }
}

fn review(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let ok = v["spec"]["token"]
        .as_str()
        .is_some_and(|t| t.starts_with(TOKEN_PREFIX));
    let status = if ok {
        json!({"authenticated": true,
            "user": {"username": format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"),
                     "uid": "uid-fleet", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "audiences": v["spec"]["audiences"].clone()})
    } else {
        json!({"authenticated": false, "user": {}, "error": "[invalid bearer token]"})
    };
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {"creationTimestamp": null}, "spec": v["spec"].clone(), "status": status})
}
