//! A small stand-in for kube-apiserver, speaking the Kubernetes JSON and
//! watch protocol for exactly what the control thread uses: nodes (list and
//! watch) and configmaps (get, create, update). Plain HTTP/1.1, thread per
//! connection. A test fixture, not part of the product.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[derive(Default)]
struct State {
    version: u64,
    nodes: BTreeMap<String, Value>,
    /// Namespaced objects: (resource, namespace, name).
    objects: BTreeMap<(String, String, String), Value>,
    /// Node events after each version: (version, type, object).
    events: Vec<(u64, &'static str, Value)>,
    requests: Vec<String>,
    /// Tokens the TokenReview endpoint knows: token -> (username, audiences).
    tokens: BTreeMap<String, (String, Vec<String>)>,
    /// Every TokenReview body received, in order.
    token_reviews: Vec<Value>,
}

#[derive(Clone)]
pub(crate) struct FakeKube {
    pub addr: SocketAddr,
    state: Arc<(Mutex<State>, Condvar)>,
}

/// A node object: `edge` sets yurt-tunnel's edge label.
pub(crate) fn node(name: &str, ip: &str, ready: bool, edge: bool) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": name});
    if edge {
        labels["openyurt.io/is-edge-worker"] = json!("true");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]
        }
    })
}

/// Binds a loopback listener inside network namespace `netns` (or here).
#[allow(unsafe_code)]
fn bind(netns: Option<&str>) -> TcpListener {
    let Some(ns) = netns else {
        return TcpListener::bind("127.0.0.1:0").unwrap();
    };
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on this short-lived thread only; the socket keeps
        // the namespace it was created in.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        TcpListener::bind("127.0.0.1:0").unwrap()
    })
    .join()
    .unwrap()
}

impl FakeKube {
    pub(crate) fn start(netns: Option<&str>) -> FakeKube {
        let l = bind(netns);
        let addr = l.local_addr().unwrap();
        let fk = FakeKube {
            addr,
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
        };
        let f = fk.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let f = f.clone();
                std::thread::spawn(move || f.serve(s));
            }
        });
        fk
    }

    fn change<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (m, cv) = &*self.state;
        let mut st = m.lock().unwrap();
        let r = f(&mut st);
        cv.notify_all();
        r
    }

    pub(crate) fn put_node(&self, mut n: Value) {
        self.change(|st| {
            st.version += 1;
            n["metadata"]["resourceVersion"] = json!(st.version.to_string());
            let name = n["metadata"]["name"].as_str().unwrap().to_string();
            let kind = if st.nodes.contains_key(&name) {
                "MODIFIED"
            } else {
                "ADDED"
            };
            st.events.push((st.version, kind, n.clone()));
            st.nodes.insert(name, n);
        })
    }

    pub(crate) fn delete_node(&self, name: &str) {
        self.change(|st| {
            if let Some(mut n) = st.nodes.remove(name) {
                st.version += 1;
                n["metadata"]["resourceVersion"] = json!(st.version.to_string());
                st.events.push((st.version, "DELETED", n));
            }
        })
    }

    pub(crate) fn put_configmap(&self, ns: &str, name: &str, data: Value) {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
        self.store("configmaps", ns, name, cm);
    }

    /// Stores `obj` (a new resourceVersion, the namespace filled in).
    fn store(&self, resource: &str, ns: &str, name: &str, mut obj: Value) -> Value {
        self.change(|st| {
            st.version += 1;
            obj["metadata"]["namespace"] = json!(ns);
            obj["metadata"]["name"] = json!(name);
            obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
            st.objects.insert(
                (resource.to_string(), ns.to_string(), name.to_string()),
                obj.clone(),
            );
            obj
        })
    }

    pub(crate) fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.state
            .0
            .lock()
            .unwrap()
            .objects
            .get(&(resource.to_string(), ns.to_string(), name.to_string()))
            .cloned()
    }

    pub(crate) fn configmap(&self, ns: &str, name: &str) -> Option<Value> {
        self.object("configmaps", ns, name)
    }

    /// Handles get/create/update of a namespaced object; an update with a
    /// stale resourceVersion is a 409 Conflict, as in Kubernetes.
    fn object_request(
        &self,
        w: &mut TcpStream,
        method: &str,
        resource: &str,
        ns: &str,
        name: Option<&str>,
        body: &[u8],
    ) -> bool {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match (method, name) {
            ("GET", Some(name)) => match self.object(resource, ns, name) {
                Some(o) => reply(w, 200, &o),
                None => reply(
                    w,
                    404,
                    &status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
                ),
            },
            ("POST", None) => {
                let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
                if self.object(resource, ns, &name).is_some() {
                    reply(w, 409, &status(409, "AlreadyExists", "already exists"))
                } else {
                    let o = self.store(resource, ns, &name, v);
                    reply(w, 201, &o)
                }
            }
            ("PUT", Some(name)) => {
                let current = self.object(resource, ns, name);
                let stale = match (&current, v["metadata"]["resourceVersion"].as_str()) {
                    (Some(c), Some(rv)) => c["metadata"]["resourceVersion"].as_str() != Some(rv),
                    (None, _) => true,
                    _ => false,
                };
                if stale {
                    reply(
                        w,
                        409,
                        &status(409, "Conflict", "the object has been modified"),
                    )
                } else {
                    let o = self.store(resource, ns, name, v);
                    reply(w, 200, &o)
                }
            }
            _ => reply(
                w,
                405,
                &status(405, "MethodNotAllowed", "method not allowed"),
            ),
        }
    }

    /// Stores `obj` as it is given (a new resourceVersion): e.g. a lease
    /// written by another program.
    pub(crate) fn put_object(&self, resource: &str, ns: &str, name: &str, obj: Value) -> Value {
        self.store(resource, ns, name, obj)
    }

    /// The `resource` objects of `ns` whose labels have every `k=v` of
    /// `selector` (equality requirements only), as a List.
    pub(crate) fn list(&self, resource: &str, ns: &str, selector: Option<&str>) -> Value {
        let want: Vec<(&str, &str)> = selector
            .unwrap_or("")
            .split(',')
            .filter(|r| !r.is_empty())
            .map(|r| r.split_once('=').unwrap_or((r, "")))
            .map(|(k, v)| (k.trim(), v.trim_start_matches('=').trim()))
            .collect();
        let st = self.state.0.lock().unwrap();
        let items: Vec<Value> = st
            .objects
            .iter()
            .filter(|(k, _)| k.0 == resource && k.1 == ns)
            .map(|(_, v)| v.clone())
            .filter(|o| {
                want.iter()
                    .all(|(k, v)| o["metadata"]["labels"][*k].as_str() == Some(*v))
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": st.version.to_string()}, "items": items})
    }

    /// Removes an object; returns whether it was there.
    pub(crate) fn remove_object(&self, resource: &str, ns: &str, name: &str) -> bool {
        self.change(|st| {
            st.objects
                .remove(&(resource.to_string(), ns.to_string(), name.to_string()))
                .is_some()
        })
    }

    /// DELETE honouring `preconditions.resourceVersion` (409 on mismatch).
    fn delete_request(
        &self,
        w: &mut TcpStream,
        resource: &str,
        ns: &str,
        name: &str,
        body: &[u8],
    ) -> bool {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let Some(current) = self.object(resource, ns, name) else {
            return reply(
                w,
                404,
                &status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
            );
        };
        if let Some(rv) = v["preconditions"]["resourceVersion"].as_str() {
            if current["metadata"]["resourceVersion"].as_str() != Some(rv) {
                return reply(
                    w,
                    409,
                    &status(409, "Conflict", "precondition failed: resourceVersion"),
                );
            }
        }
        self.remove_object(resource, ns, name);
        reply(
            w,
            200,
            &json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200}),
        )
    }

    /// Stores a Service with a cluster IP and a load-balancer ingress IP.
    pub(crate) fn put_service(&self, ns: &str, name: &str, cluster_ip: &str, lb_ip: &str) {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"clusterIP": cluster_ip, "ports": [{"port": 10262}]},
            "status": {"loadBalancer": {"ingress": [{"ip": lb_ip}]}}});
        self.store("services", ns, name, svc);
    }

    /// CertificateSigningRequests, oldest first.
    pub(crate) fn csrs(&self) -> Vec<Value> {
        self.state
            .0
            .lock()
            .unwrap()
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "certificatesigningrequests")
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Approves and signs every pending request with the CA in `certs`
    /// (ca.crt, and ca.key in the CA directory beside it), valid for `secs` seconds; returns how many.
    pub(crate) fn sign_pending(&self, certs: &std::path::Path, secs: u64) -> usize {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let ca_pem = std::fs::read_to_string(certs.join("ca.crt")).unwrap();
        let ca_key =
            rcgen::KeyPair::from_pem(&std::fs::read_to_string(super::ca_key(certs)).unwrap())
                .unwrap();
        let ca = rcgen::CertificateParams::from_ca_cert_pem(&ca_pem)
            .unwrap()
            .self_signed(&ca_key)
            .unwrap();
        let mut n = 0;
        for csr in self.csrs() {
            if csr["status"]["certificate"].is_string() {
                continue;
            }
            let name = csr["metadata"]["name"].as_str().unwrap().to_string();
            let pem = String::from_utf8(
                b64.decode(csr["spec"]["request"].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap();
            let mut req = rcgen::CertificateSigningRequestParams::from_pem(&pem).unwrap();
            let now = std::time::SystemTime::now();
            req.params.not_before = (now - Duration::from_secs(1)).into();
            req.params.not_after = (now + Duration::from_secs(secs)).into();
            let cert = req.signed_by(&ca, &ca_key).unwrap();
            let mut signed = csr.clone();
            signed["status"] = json!({
                "conditions": [{"type": "Approved", "status": "True", "reason": "Test", "message": "approved by the test"}],
                "certificate": b64.encode(cert.pem()),
            });
            self.store("certificatesigningrequests", "", &name, signed);
            n += 1;
        }
        n
    }

    /// Registers `token` for the TokenReview endpoint: it authenticates as
    /// `username` for any of `audiences`.
    pub(crate) fn put_token(&self, token: &str, username: &str, audiences: &[&str]) {
        self.change(|st| {
            st.tokens.insert(
                token.to_string(),
                (
                    username.to_string(),
                    audiences.iter().map(|a| a.to_string()).collect(),
                ),
            );
        })
    }

    /// Every TokenReview body received so far, oldest first.
    pub(crate) fn token_reviews(&self) -> Vec<Value> {
        self.state.0.lock().unwrap().token_reviews.clone()
    }

    /// Answers a TokenReview as kube-apiserver does: authenticated with the
    /// user and the matching audiences when the token is known and one of
    /// `spec.audiences` is its audience, else unauthenticated with an error.
    fn token_review(&self, body: &[u8]) -> Value {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let known = self.change(|st| {
            st.token_reviews.push(v.clone());
            v["spec"]["token"]
                .as_str()
                .and_then(|t| st.tokens.get(t).cloned())
        });
        let wanted: Vec<String> = v["spec"]["audiences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let status = match known {
            None => json!({"authenticated": false, "user": {},
                "error": "[invalid bearer token, token lookup failed]"}),
            Some((user, auds)) => {
                let matched: Vec<&String> = wanted.iter().filter(|a| auds.contains(a)).collect();
                if matched.is_empty() {
                    json!({"authenticated": false, "user": {},
                        "error": format!("[invalid bearer token, token audiences {auds:?} is invalid for the target audiences {wanted:?}]")})
                } else {
                    json!({"authenticated": true,
                        "user": {"username": user, "uid": "uid-1", "groups": ["system:serviceaccounts", "system:authenticated"]},
                        "audiences": matched})
                }
            }
        };
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {"creationTimestamp": null}, "spec": v["spec"].clone(), "status": status})
    }

    /// Request lines seen so far.
    pub(crate) fn requests(&self) -> Vec<String> {
        self.state.0.lock().unwrap().requests.clone()
    }

    fn serve(&self, s: TcpStream) {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        loop {
            let Some((method, target, body)) = super::http_raw::read_request(&mut r) else {
                return;
            };
            self.state
                .0
                .lock()
                .unwrap()
                .requests
                .push(format!("{method} {target}"));
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let q: BTreeMap<&str, &str> = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
            let ok = match (method.as_str(), segs.as_slice()) {
                ("GET", ["api", "v1", "nodes"])
                    if q.get("watch").is_some_and(|v| *v == "true" || *v == "1") =>
                {
                    let from: u64 = q
                        .get("resourceVersion")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let secs: u64 = q
                        .get("timeoutSeconds")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(30);
                    self.watch(&mut w, from, Duration::from_secs(secs.min(30)))
                }
                ("GET", ["api", "v1", "nodes"]) => {
                    // One `key=value` label selector, if any.
                    let selector = q.get("labelSelector").map(|v| percent_decode(v));
                    let wanted =
                        |n: &Value| match selector.as_deref().and_then(|s| s.split_once('=')) {
                            Some((k, v)) => n["metadata"]["labels"][k].as_str() == Some(v),
                            None => true,
                        };
                    let st = self.state.0.lock().unwrap();
                    let list = json!({"apiVersion": "v1", "kind": "NodeList",
                        "metadata": {"resourceVersion": st.version.to_string()},
                        "items": st.nodes.values().filter(|n| wanted(n)).cloned().collect::<Vec<_>>()});
                    drop(st);
                    reply(&mut w, 200, &list)
                }
                (m, ["api", "v1", "namespaces", ns, "services", rest @ ..]) => {
                    self.object_request(&mut w, m, "services", ns, rest.first().copied(), &body)
                }
                (m, ["api", "v1", "namespaces", ns, "endpoints", rest @ ..]) => {
                    self.object_request(&mut w, m, "endpoints", ns, rest.first().copied(), &body)
                }
                (m, ["api", "v1", "namespaces", ns, "configmaps", rest @ ..]) => {
                    self.object_request(&mut w, m, "configmaps", ns, rest.first().copied(), &body)
                }
                ("POST", ["apis", "certificates.k8s.io", "v1", "certificatesigningrequests"]) => {
                    let mut v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let n = self.change(|st| {
                        st.version += 1;
                        st.version
                    });
                    let prefix = v["metadata"]["generateName"]
                        .as_str()
                        .unwrap_or("csr-")
                        .to_string();
                    let name = format!("{prefix}{n:05}");
                    v["apiVersion"] = json!("certificates.k8s.io/v1");
                    v["kind"] = json!("CertificateSigningRequest");
                    let o = self.store("certificatesigningrequests", "", &name, v);
                    reply(&mut w, 201, &o)
                }
                (
                    "GET",
                    ["apis", "certificates.k8s.io", "v1", "certificatesigningrequests", name],
                ) => self.object_request(
                    &mut w,
                    "GET",
                    "certificatesigningrequests",
                    "",
                    Some(name),
                    &body,
                ),
                ("POST", ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
                    let r = self.token_review(&body);
                    reply(&mut w, 201, &r)
                }
                ("GET", ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases"]) => {
                    let selector = q.get("labelSelector").map(|v| percent_decode(v));
                    let list = self.list("leases", ns, selector.as_deref());
                    reply(&mut w, 200, &list)
                }
                (
                    "DELETE",
                    ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", name],
                ) => self.delete_request(&mut w, "leases", ns, name, &body),
                (
                    m,
                    ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", rest @ ..],
                ) => self.object_request(&mut w, m, "leases", ns, rest.first().copied(), &body),
                _ => reply(
                    &mut w,
                    404,
                    &status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    ),
                ),
            };
            if !ok {
                return;
            }
        }
    }

    /// Streams node events after version `from` until `timeout`.
    fn watch(&self, w: &mut TcpStream, from: u64, timeout: Duration) -> bool {
        if write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").is_err() {
            return false;
        }
        let deadline = Instant::now() + timeout;
        let mut seen = from;
        let (m, cv) = &*self.state;
        loop {
            let st = m.lock().unwrap();
            let (st, _) = cv
                .wait_timeout_while(
                    st,
                    deadline.saturating_duration_since(Instant::now()),
                    |st| st.events.last().is_none_or(|e| e.0 <= seen),
                )
                .unwrap();
            let pending: Vec<_> = st.events.iter().filter(|e| e.0 > seen).cloned().collect();
            drop(st);
            for (v, kind, obj) in pending {
                seen = v;
                let line = format!("{}\n", json!({"type": kind, "object": obj}));
                if write!(w, "{:x}\r\n{line}\r\n", line.len()).is_err() || w.flush().is_err() {
                    return false;
                }
            }
            if Instant::now() >= deadline {
                return write!(w, "0\r\n\r\n").is_ok();
            }
        }
    }
}

/// Decodes a query value: `+` is a space, `%XX` a byte (a bad escape
/// stays as it is).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn reply(w: &mut TcpStream, code: u16, v: &Value) -> bool {
    let body = v.to_string();
    write!(
        w,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .is_ok()
}

/// A kubeconfig pointing at the fake server (no credentials).
pub(crate) fn kubeconfig(path: &std::path::Path, addr: SocketAddr) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\n"
    );
    std::fs::write(path, text).unwrap();
}
