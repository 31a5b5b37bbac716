//! The `oidc` auth-provider, `edgetunnel proxy` against the real `kubectl
//! proxy` (v1.32): a fake IdP (discovery and token endpoint, HTTPS with the
//! test CA, every request recorded) and the fake API server (which echoes
//! the `Authorization` it got). Each case runs both proxies on fresh copies
//! of the same kubeconfig and compares what the API server saw, what the
//! IdP was asked (method, path, headers, form body), the answer to the
//! client when it fails, and the auth-provider config written back.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::apiserver;
use support::fwd_proxy::{self, RecProxy};
use support::http_raw::{echoed_header, get_echo, Endpoint};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start};
use support::{outward_ip, Env};

/// One request the IdP got: method, target, headers (lower-case names,
/// sorted), body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: String,
}

/// How the token endpoint answers.
#[derive(Clone)]
struct TokenAnswer {
    /// Refuse a client given in a Basic header (401 invalid_client), so
    /// that oauth2 tries again with the client in the form.
    refuse_basic: bool,
    status: u16,
    body: String,
}

/// Redirects the IdP answers with (path, status, Location), and the
/// discovery document's `token_endpoint` (None: `<issuer>/token`).
#[derive(Clone, Default)]
struct Routes {
    redirects: Vec<(String, u16, String)>,
    token_endpoint: Option<String>,
}

struct FakeIdp {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    answer: Arc<Mutex<TokenAnswer>>,
    routes: Arc<Mutex<Routes>>,
}

impl FakeIdp {
    fn issuer(&self) -> String {
        format!("https://{}", self.addr)
    }
    fn route(&self, r: Routes) {
        *self.routes.lock().unwrap() = r;
    }
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
    fn answer(&self, a: TokenAnswer) {
        *self.answer.lock().unwrap() = a;
    }
}

fn read_request(r: &mut impl BufRead) -> Option<Seen> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    let mut len = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        let n = n.trim().to_ascii_lowercase();
        if n == "content-length" {
            len = v.trim().parse().ok()?;
        }
        headers.push((n, v.trim().to_string()));
    }
    headers.sort();
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Seen {
        method,
        target,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn start_idp(certs: &Path) -> FakeIdp {
    start_idp_on(
        &certs.join("server.crt"),
        &certs.join("server.key"),
        "127.0.0.1:0",
    )
}

/// The fake IdP on `bind`, serving this certificate.
fn start_idp_on(crt: &Path, key: &Path, bind: &str) -> FakeIdp {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut &std::fs::read(crt).unwrap()[..])
            .collect::<Result<_, _>>()
            .unwrap();
    let key: PrivateKeyDer<'static> =
        rustls_pemfile::private_key(&mut &std::fs::read(key).unwrap()[..])
            .unwrap()
            .unwrap();
    let cfg = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = TcpListener::bind(bind).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let answer = Arc::new(Mutex::new(TokenAnswer {
        refuse_basic: false,
        status: 200,
        body: String::new(),
    }));
    let routes = Arc::new(Mutex::new(Routes::default()));
    let (s2, a2, r2) = (seen.clone(), answer.clone(), routes.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let (cfg, seen, answer, routes) = (cfg.clone(), s2.clone(), a2.clone(), r2.clone());
            std::thread::spawn(move || {
                let Ok(tls) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let mut r = BufReader::new(rustls::StreamOwned::new(tls, conn));
                while let Some(req) = read_request(&mut r) {
                    seen.lock().unwrap().push(req.clone());
                    let rs = routes.lock().unwrap().clone();
                    let mut location = String::new();
                    let (status, body) = if let Some((_, code, to)) =
                        rs.redirects.iter().find(|(p, _, _)| *p == req.target)
                    {
                        location = format!("Location: {to}\r\n");
                        (*code, String::new())
                    } else if req.target == "/.well-known/openid-configuration" {
                        let token = rs
                            .token_endpoint
                            .unwrap_or_else(|| format!("https://{addr}/token"));
                        (
                            200,
                            format!(
                                "{{\"issuer\":\"https://{addr}\",\"token_endpoint\":\"{token}\"}}"
                            ),
                        )
                    } else if req.target == "/token" && req.method == "POST" {
                        let a = answer.lock().unwrap().clone();
                        let basic = req.headers.iter().any(|(n, _)| n == "authorization");
                        if a.refuse_basic && basic {
                            (401, "{\"error\":\"invalid_client\"}".to_string())
                        } else {
                            (a.status, a.body)
                        }
                    } else {
                        (404, "not found".to_string())
                    };
                    let w = r.get_mut();
                    let _ = write!(
                        w,
                        "HTTP/1.1 {status} X\r\n{location}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = w.flush();
                }
            });
        }
    });
    FakeIdp {
        addr,
        seen,
        answer,
        routes,
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An unsigned JWT with this `exp` and `sub`.
fn jwt(exp: i64, sub: &str) -> String {
    let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.c2ln",
        b("{\"alg\":\"RS256\",\"typ\":\"JWT\"}"),
        b(&format!(
            "{{\"iss\":\"idp\",\"sub\":\"{sub}\",\"exp\":{exp}}}"
        ))
    )
}

/// An oidc config map, in the order written.
type Config<'a> = Vec<(&'a str, String)>;

/// A kubeconfig whose user has this oidc config (YAML lines under
/// `config:`).
fn kubeconfig(path: &Path, server: &str, certs: &Path, config: &[(&str, String)]) {
    let mut lines = String::new();
    for (k, v) in config {
        lines.push_str(&format!("        {k}: {v:?}\n"));
    }
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: test\n  user:\n    auth-provider:\n      name: oidc\n      config:\n{lines}contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
            certs.join("ca.crt").display()
        ),
    )
    .unwrap();
}

/// The user's auth-provider config as written in `path`.
fn provider_config(path: &Path) -> serde_json::Value {
    let doc: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["users"][0]["user"]["auth-provider"]["config"].clone()
}

/// GET through a proxy: status, the Authorization the API server saw (or
/// the body when the proxy answered itself).
fn get(ep: &Endpoint, path: &str) -> (u16, String) {
    let (r, v) = get_echo(ep, path).expect("exchange");
    (
        r.status,
        echoed_header(&v, "authorization")
            .unwrap_or_else(|| String::from_utf8_lossy(&r.body).trim().to_string()),
    )
}

/// What one proxy did in a scenario.
#[derive(Debug)]
struct Run {
    /// Per step: (status, Authorization seen or body), IdP requests made.
    steps: Vec<((u16, String), Vec<Seen>)>,
    written: serde_json::Value,
    /// What the forward proxy recorded during the run.
    proxied: Vec<String>,
}

/// Runs `paths` through kubectl and through ours, each on its own copy of
/// the kubeconfig `config` describes.
fn both(
    env: &Env,
    name: &str,
    idp: &FakeIdp,
    server: &str,
    config: &[(&str, String)],
    paths: &[&str],
) -> (Run, Run) {
    both_env(env, name, idp, server, config, paths, Net::default())
}

const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The proxy variables both proxies get (no others), and the forward proxy
/// whose record each run keeps.
#[derive(Clone, Copy, Default)]
struct Net<'a> {
    vars: &'a [(&'a str, String)],
    rec: Option<&'a RecProxy>,
}

/// [`both`] with these proxy variables (and no others) in the
/// environment of both proxies.
fn both_env(
    env: &Env,
    name: &str,
    idp: &FakeIdp,
    server: &str,
    config: &[(&str, String)],
    paths: &[&str],
    net: Net<'_>,
) -> (Run, Run) {
    let Net { vars, rec } = net;
    let kubectl = kubectl();
    let mut runs = Vec::new();
    for who in ["kubectl", "ours"] {
        let dir = env.path(&format!("{name}-{who}"));
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("kubeconfig");
        kubeconfig(&kc, server, &env.certs(), config);
        let flags = vec!["--port=0".to_string()];
        let mut cmd = if who == "kubectl" {
            kubectl_cmd(&kubectl, &kc, &flags)
        } else {
            ours_cmd(&kc, &flags)
        };
        for v in PROXY_VARS {
            cmd.env_remove(v);
        }
        cmd.envs(vars.iter().map(|(k, v)| (k, v)));
        idp.take();
        if let Some(r) = rec {
            r.clear();
        }
        let p = start(cmd, dir.join("proxy.log"));
        // Start-up requests (kubectl asks nothing of the IdP at start).
        let mut steps = vec![((0, "start".to_string()), idp.take())];
        for path in paths {
            let r = get(&p.ep, path);
            steps.push((r, idp.take()));
        }
        drop(p);
        runs.push(Run {
            steps,
            written: provider_config(&kc),
            proxied: rec.map(|r| r.lines()).unwrap_or_default(),
        });
    }
    let ours = runs.pop().unwrap();
    (runs.pop().unwrap(), ours)
}

/// The IdP-seen requests without what Go's transport adds for itself
/// (`Accept-Encoding: gzip`; we ask for no compression).
fn comparable(steps: &[((u16, String), Vec<Seen>)]) -> Vec<((u16, String), Vec<Seen>)> {
    steps
        .iter()
        .map(|(r, seen)| {
            let seen = seen
                .iter()
                .map(|s| Seen {
                    headers: s
                        .headers
                        .iter()
                        .filter(|(n, _)| n != "accept-encoding")
                        .cloned()
                        .collect(),
                    ..s.clone()
                })
                .collect();
            (r.clone(), seen)
        })
        .collect()
}

fn setup() -> (Env, apiserver::FakeApiServer, FakeIdp, String, PathBuf) {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let idp = start_idp(&certs);
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let ca = certs.join("ca.crt");
    (env, api, idp, server, ca)
}

#[test]
fn valid_id_token_is_the_bearer_and_a_401_refreshes_nothing() {
    let (env, _api, idp, server, ca) = setup();
    let token = jwt(now() + 3600, "alice");
    let config = [
        ("idp-issuer-url", idp.issuer()),
        ("client-id", "kube".to_string()),
        ("client-secret", "secret".to_string()),
        ("idp-certificate-authority", ca.display().to_string()),
        ("id-token", token.clone()),
        ("refresh-token", "rt-1".to_string()),
    ];
    let (go, ours) = both(
        &env,
        "valid",
        &idp,
        &server,
        &config,
        &["/api/v1/pods", "/status/401", "/api/v1/pods"],
    );
    let want = format!("Bearer {token}");
    assert_eq!(ours.steps[1].0, (200, want.clone()), "{:?}", ours.steps);
    assert_eq!(ours.steps[3].0, (200, want), "token kept after a 401");
    assert!(
        ours.steps.iter().all(|(_, s)| s.is_empty()),
        "no IdP request: {:?}",
        ours.steps
    );
    assert_eq!(comparable(&go.steps), comparable(&ours.steps));
    assert_eq!(go.written, ours.written);
    assert_eq!(ours.written["id-token"], token.as_str(), "file untouched");
}

#[test]
fn expired_id_token_refreshed_and_persisted_as_kubectl() {
    let (env, _api, idp, server, ca) = setup();
    let fresh = jwt(4_102_444_800, "alice-refreshed");
    let answer = |refresh: Option<&str>| {
        let rt = refresh
            .map(|r| format!(",\"refresh_token\":\"{r}\""))
            .unwrap_or_default();
        format!(
            "{{\"access_token\":\"at\",\"token_type\":\"Bearer\",\"expires_in\":3600,\"id_token\":\"{fresh}\"{rt}}}"
        )
    };
    let ca_data = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&ca).unwrap());
    let cases: Vec<(&str, TokenAnswer, Config)> = vec![
        (
            "basic-new-refresh-token",
            TokenAnswer {
                refuse_basic: false,
                status: 200,
                body: answer(Some("rt-2")),
            },
            vec![
                ("idp-issuer-url", idp.issuer()),
                ("client-id", "kube cli".to_string()),
                ("client-secret", "s&c+t/=".to_string()),
                ("idp-certificate-authority", ca.display().to_string()),
                ("id-token", jwt(now() - 100, "alice")),
                ("refresh-token", "rt 1/+".to_string()),
                ("extra-scopes", "groups,email".to_string()),
            ],
        ),
        (
            // The IdP refuses the client in a header: oauth2 asks again
            // with it in the form. No refresh_token in the answer: the
            // file keeps the old one. Issuer with a trailing slash, CA as
            // data, expired within the 10 s leeway.
            "params-same-refresh-token",
            TokenAnswer {
                refuse_basic: true,
                status: 200,
                body: answer(None),
            },
            vec![
                ("idp-issuer-url", format!("{}/", idp.issuer())),
                ("client-id", "kube".to_string()),
                ("client-secret", "sec".to_string()),
                ("idp-certificate-authority-data", ca_data.clone()),
                ("id-token", jwt(now() + 5, "alice")),
                ("refresh-token", "rt-1".to_string()),
            ],
        ),
        (
            // No id-token at all, no client secret.
            "no-id-token",
            TokenAnswer {
                refuse_basic: true,
                status: 200,
                body: answer(Some("rt-3")),
            },
            vec![
                ("idp-issuer-url", idp.issuer()),
                ("client-id", "kube".to_string()),
                ("idp-certificate-authority-data", ca_data),
                ("refresh-token", "rt-1".to_string()),
            ],
        ),
    ];
    for (name, token_answer, config) in cases {
        idp.answer(token_answer);
        let (go, ours) = both(
            &env,
            name,
            &idp,
            &server,
            &config,
            &["/api/v1/pods", "/api/v1/pods"],
        );
        assert_eq!(
            ours.steps[1].0,
            (200, format!("Bearer {fresh}")),
            "{name}: {:?}",
            ours.steps
        );
        // kubectl's start-up request refreshes before it serves; ours too.
        assert!(
            !ours.steps[0].1.is_empty(),
            "{name}: the IdP was asked at start"
        );
        assert!(
            ours.steps[1].1.is_empty() && ours.steps[2].1.is_empty(),
            "{name}: cached: {:?}",
            ours.steps
        );
        assert_eq!(
            comparable(&go.steps),
            comparable(&ours.steps),
            "{name}: kubectl vs ours"
        );
        assert_eq!(go.written, ours.written, "{name}: persisted config");
        assert_eq!(ours.written["id-token"], fresh.as_str(), "{name}");
    }
}

#[test]
fn unusable_tokens_fail_as_kubectl() {
    let (env, _api, idp, server, ca) = setup();
    let base = |id: Option<String>, rt: Option<&str>| {
        let mut c = vec![
            ("idp-issuer-url", idp.issuer()),
            ("client-id", "kube".to_string()),
            ("idp-certificate-authority", ca.display().to_string()),
        ];
        if let Some(id) = id {
            c.push(("id-token", id));
        }
        if let Some(rt) = rt {
            c.push(("refresh-token", rt.to_string()));
        }
        c
    };
    let cases = [
        (
            "expired-no-refresh-token",
            base(Some(jwt(now() - 100, "a")), None),
            None,
            "No valid id-token, and cannot refresh without refresh-token",
        ),
        (
            "not-a-jwt",
            base(Some("abc.def".to_string()), Some("rt")),
            None,
            "ID Token is not a valid JWT",
        ),
        (
            "refused-refresh",
            base(Some(jwt(now() - 100, "a")), Some("rt")),
            Some(TokenAnswer {
                refuse_basic: false,
                status: 400,
                body: "{\"error\":\"invalid_grant\",\"error_description\":\"token expired\"}"
                    .to_string(),
            }),
            "failed to refresh token: oauth2: \"invalid_grant\" \"token expired\"",
        ),
        (
            "answer-without-id-token",
            base(Some(jwt(now() - 100, "a")), Some("rt")),
            Some(TokenAnswer {
                refuse_basic: false,
                status: 200,
                body: "{\"access_token\":\"at\"}".to_string(),
            }),
            "token response did not contain an id_token",
        ),
    ];
    for (name, config, token_answer, want) in cases {
        if let Some(a) = token_answer {
            idp.answer(a);
        }
        let (go, ours) = both(&env, name, &idp, &server, &config, &["/api/v1/pods"]);
        let (status, body) = &ours.steps[1].0;
        assert_ne!(*status, 200, "{name}: {body}");
        assert!(body.contains(want), "{name}: want {want:?} in {body}");
        assert_eq!(
            comparable(&go.steps),
            comparable(&ours.steps),
            "{name}: kubectl vs ours"
        );
        assert_eq!(go.written, ours.written, "{name}: file untouched by both");
    }
}

/// A config whose id-token is expired: the first request refreshes.
fn expired(issuer: String, ca: &Path) -> Config<'static> {
    vec![
        ("idp-issuer-url", issuer),
        ("client-id", "kube".to_string()),
        ("client-secret", "secret".to_string()),
        ("idp-certificate-authority", ca.display().to_string()),
        ("id-token", jwt(now() - 100, "alice")),
        ("refresh-token", "rt-1".to_string()),
    ]
}

/// The token endpoint's answer with this id-token and a new refresh token.
fn fresh_answer(id_token: &str) -> TokenAnswer {
    TokenAnswer {
        refuse_basic: false,
        status: 200,
        body: format!(
            "{{\"access_token\":\"at\",\"token_type\":\"Bearer\",\"id_token\":\"{id_token}\",\"refresh_token\":\"rt-2\"}}"
        ),
    }
}

#[test]
fn idp_through_the_environment_proxy_as_kubectl() {
    let Some(ip) = outward_ip() else {
        eprintln!("skipped: no non-loopback address on this machine");
        return;
    };
    // The API server on loopback (never proxied), the IdP on the outward
    // address with a certificate for it.
    let (env, _api, _unused, server, ca) = setup();
    let (crt, key) = env.issue(
        "idp",
        "idp",
        &[&ip.to_string()],
        &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
    );
    let idp = start_idp_on(Path::new(&crt), Path::new(&key), &format!("{ip}:0"));
    let fresh = jwt(4_102_444_800, "alice-refreshed");
    idp.answer(fresh_answer(&fresh));
    let proxy = fwd_proxy::start_http("127.0.0.1:0");
    let p = format!("http://{}", proxy.addr);
    let connect = format!("CONNECT {} auth=-", idp.addr);
    let cases = [
        ("idp-https-proxy", vec![("HTTPS_PROXY", p.clone())], true),
        (
            "idp-https-proxy-lower",
            vec![("https_proxy", p.clone())],
            true,
        ),
        (
            "idp-no-proxy",
            vec![("HTTPS_PROXY", p.clone()), ("NO_PROXY", ip.to_string())],
            false,
        ),
        // An https IdP ignores HTTP_PROXY.
        (
            "idp-http-proxy-only",
            vec![("HTTP_PROXY", p.clone())],
            false,
        ),
    ];
    for (name, vars, proxied) in cases {
        let (go, ours) = both_env(
            &env,
            name,
            &idp,
            &server,
            &expired(idp.issuer(), &ca),
            &["/api/v1/pods"],
            Net {
                vars: &vars,
                rec: Some(&proxy),
            },
        );
        assert_eq!(
            ours.steps[1].0,
            (200, format!("Bearer {fresh}")),
            "{name}: {:?}",
            ours.steps
        );
        assert_eq!(comparable(&go.steps), comparable(&ours.steps), "{name}");
        assert_eq!(go.written, ours.written, "{name}: persisted config");
        // kubectl keeps its tunnel for the token POST after discovery; we
        // open one per request: the same CONNECT, maybe more than once.
        for (who, run) in [("kubectl", &go), ("ours", &ours)] {
            assert_eq!(
                !run.proxied.is_empty(),
                proxied,
                "{name}: {who}: {:?}",
                run.proxied
            );
            assert!(
                run.proxied.iter().all(|l| *l == connect),
                "{name}: {who}: {:?}",
                run.proxied
            );
        }
    }
}

#[test]
fn idp_redirects_followed_as_kubectl() {
    let (env, _api, idp, server, ca) = setup();
    let fresh = jwt(4_102_444_800, "alice-refreshed");
    let port = idp.addr.port();
    let base = idp.issuer();
    // Another name of the same server: not the first request's host.
    let other = format!("https://localhost:{port}");
    let r = |p: &str, code: u16, to: &str| (p.to_string(), code, to.to_string());
    let discovery = "/.well-known/openid-configuration";
    // (name, issuer path, routes, refreshed)
    let cases: Vec<(&str, &str, Routes, bool)> = vec![
        (
            "discovery-302-relative",
            "/r302",
            Routes {
                redirects: vec![r(&format!("/r302{discovery}"), 302, discovery)],
                token_endpoint: None,
            },
            true,
        ),
        (
            "discovery-307-other-host",
            "/r307",
            Routes {
                redirects: vec![r(
                    &format!("/r307{discovery}"),
                    307,
                    &format!("{other}{discovery}"),
                )],
                token_endpoint: None,
            },
            true,
        ),
        (
            // The POST repeated with its body; the Basic header dropped.
            "token-307-other-host",
            "",
            Routes {
                redirects: vec![r("/t307", 307, &format!("{other}/token"))],
                token_endpoint: Some(format!("{base}/t307")),
            },
            true,
        ),
        (
            "token-308-same-host",
            "",
            Routes {
                redirects: vec![r("/t308", 308, "token")],
                token_endpoint: Some(format!("{base}/t308")),
            },
            true,
        ),
        (
            // The POST becomes a GET without body: the IdP refuses it.
            "token-302-get",
            "",
            Routes {
                redirects: vec![r("/t302", 302, "/token")],
                token_endpoint: Some(format!("{base}/t302")),
            },
            false,
        ),
        (
            "token-303-then-307",
            "",
            Routes {
                redirects: vec![r("/t303", 303, "/t307b"), r("/t307b", 307, "/token")],
                token_endpoint: Some(format!("{base}/t303")),
            },
            false,
        ),
        (
            "discovery-loop",
            "/loop",
            Routes {
                redirects: vec![r(
                    &format!("/loop{discovery}"),
                    302,
                    &format!("/loop{discovery}"),
                )],
                token_endpoint: None,
            },
            false,
        ),
    ];
    for (name, issuer_path, routes, refreshed) in cases {
        idp.route(routes);
        idp.answer(fresh_answer(&fresh));
        let (go, ours) = both(
            &env,
            name,
            &idp,
            &server,
            &expired(format!("{base}{issuer_path}"), &ca),
            &["/api/v1/pods"],
        );
        let (status, body) = &ours.steps[1].0;
        if refreshed {
            assert_eq!(
                (*status, body.as_str()),
                (200, format!("Bearer {fresh}").as_str()),
                "{name}"
            );
        } else {
            assert_ne!(*status, 200, "{name}: {body}");
        }
        let redirected = ours
            .steps
            .iter()
            .flat_map(|(_, seen)| seen)
            .any(|s| s.headers.iter().any(|(n, _)| n == "referer"));
        assert!(redirected, "{name}: no redirect followed: {:?}", ours.steps);
        assert_eq!(
            comparable(&go.steps),
            comparable(&ours.steps),
            "{name}: kubectl vs ours"
        );
        assert_eq!(go.written, ours.written, "{name}: persisted config");
    }
}
