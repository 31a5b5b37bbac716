//! Client certificates from exec credential plugins, `edgetunnel proxy`
//! against the real `kubectl proxy` on the same fake API server (which
//! records the common name of the certificate each request came with):
//! the plugin's certificate is presented, cached until its
//! `expirationTimestamp`, replaced after expiry and after a 401, and new
//! requests then use the new one (no idle connection made with the old one
//! is reused), over HTTP/1.1 and HTTP/2 upstreams; a static client
//! certificate in the kubeconfig wins and the plugin never runs; half pairs
//! and pairs that do not match are refused with client-go's words.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::apiserver;
use support::http_raw::{echoed_header, get_echo, Endpoint};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start};
use support::Env;

const V1: &str = "client.authentication.k8s.io/v1";
const FAR: &str = "2099-01-01T00:00:00Z";

/// One request through a proxy: status, the common name the upstream saw
/// (None: no certificate or no echo), the Authorization it saw, the body.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    cn: Option<String>,
    authorization: Option<String>,
}

fn get_full(ep: &Endpoint, path: &str) -> (Seen, String) {
    let (r, v) = match get_echo(ep, path) {
        Ok(got) => got,
        // Status 0: the proxy closed without an answer.
        Err(e) => {
            let seen = Seen {
                status: 0,
                cn: None,
                authorization: None,
            };
            return (seen, e.to_string());
        }
    };
    let seen = Seen {
        status: r.status,
        cn: v["client_cn"].as_str().map(str::to_string),
        authorization: echoed_header(&v, "authorization"),
    };
    (seen, String::from_utf8_lossy(&r.body).into_owned())
}

fn get(ep: &Endpoint, path: &str) -> Seen {
    get_full(ep, path).0
}

/// A plugin script printing `<dir>/<run>.json` (the last one given once
/// the runs outnumber them) and counting its runs in `<dir>/count`.
struct Plugin {
    dir: PathBuf,
    script: PathBuf,
}

impl Plugin {
    fn new(dir: &Path, answers: &[String]) -> Plugin {
        std::fs::create_dir_all(dir).unwrap();
        for (i, a) in answers.iter().enumerate() {
            std::fs::write(dir.join(format!("{}.json", i + 1)), a).unwrap();
        }
        std::fs::write(dir.join("last.json"), answers.last().unwrap()).unwrap();
        let script = dir.join("plugin.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nd={}\nn=$(( $(cat $d/count 2>/dev/null || echo 0) + 1 ))\necho $n > $d/count\nf=$d/$n.json\n[ -f $f ] || f=$d/last.json\ncat $f\n",
                dir.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Plugin {
            dir: dir.to_path_buf(),
            script,
        }
    }

    fn runs(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    fn user_yaml(&self) -> String {
        format!(
            "    exec:\n      apiVersion: {V1}\n      command: {}\n      interactiveMode: Never\n",
            self.script.display()
        )
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A certificate for `cn` signed by the test CA: (cert PEM, key PEM).
fn issue(env: &Env, cn: &str) -> (String, String) {
    let (c, k) = env.issue(
        &format!("client-{cn}"),
        cn,
        &[],
        &[rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    (
        std::fs::read_to_string(c).unwrap(),
        std::fs::read_to_string(k).unwrap(),
    )
}

/// An ExecCredential (v1) with these status fields.
fn answer(cert: Option<&str>, key: Option<&str>, token: Option<&str>, expiry: &str) -> String {
    let mut status = vec![format!("\"expirationTimestamp\":\"{expiry}\"")];
    if let Some(c) = cert {
        status.push(format!("\"clientCertificateData\":{}", json_str(c)));
    }
    if let Some(k) = key {
        status.push(format!("\"clientKeyData\":{}", json_str(k)));
    }
    if let Some(t) = token {
        status.push(format!("\"token\":{}", json_str(t)));
    }
    format!(
        "{{\"kind\":\"ExecCredential\",\"apiVersion\":\"{V1}\",\"status\":{{{}}}}}",
        status.join(",")
    )
}

fn cert_answer(pair: &(String, String), expiry: &str) -> String {
    answer(Some(&pair.0), Some(&pair.1), None, expiry)
}

/// A kubeconfig with `server` (CA of the test certs) and this user entry.
fn kubeconfig(path: &Path, server: &str, certs: &Path, user_yaml: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: test\n  user:\n{user_yaml}contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
        certs.join("ca.crt").display()
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

const WHO: [&str; 2] = ["kubectl", "ours"];

/// Starts kubectl's or our proxy on a kubeconfig for `server` with `user`.
fn proxy(
    env: &Env,
    who: &str,
    name: &str,
    server: &str,
    user: &str,
) -> support::proxy_proc::Running {
    let dir = env.path(&format!("{name}-{who}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kc.yaml");
    kubeconfig(&kc, server, &env.certs(), user);
    let flags = vec!["--port=0".to_string()];
    let cmd = if who == "kubectl" {
        kubectl_cmd(&kubectl(), &kc, &flags)
    } else {
        ours_cmd(&kc, &flags)
    };
    start(cmd, dir.join("proxy.log"))
}

type Steps = Vec<(&'static str, Seen, u32)>;

/// Cached, then a 401: the plugin runs again and the next requests carry
/// its new certificate.
fn rotate_on_401(env: &Env, server: &str, name: &str, with_token: bool) -> Vec<Steps> {
    let (one, two) = (issue(env, "plugin-one"), issue(env, "plugin-two"));
    let token = |t: &'static str| with_token.then_some(t);
    let answers = [
        answer(Some(&one.0), Some(&one.1), token("tok-1"), FAR),
        answer(Some(&two.0), Some(&two.1), token("tok-2"), FAR),
    ];
    WHO.iter()
        .map(|who| {
            let plugin = Plugin::new(&env.path(&format!("{name}-{who}-plugin")), &answers);
            let p = proxy(env, who, name, server, &plugin.user_yaml());
            let mut steps: Steps = Vec::new();
            for _ in 0..3 {
                steps.push(("first", get(&p.ep, "/api/v1/pods"), plugin.runs()));
            }
            let s = get(&p.ep, "/status/401");
            steps.push(("401", s, plugin.runs()));
            for _ in 0..3 {
                steps.push(("after", get(&p.ep, "/api/v1/pods"), plugin.runs()));
            }
            steps
        })
        .collect()
}

/// Checks the steps of [`rotate_on_401`]. kubectl closes every connection
/// when the certificate changes (client-go's `connTracker.CloseAll` in
/// exec.go's `refreshCredsLocked`), which races with its own answers: now
/// and then the 401 itself is cut (the client sees the connection close,
/// status 0 here) or, over HTTP/2, the next request fails with 500. With
/// `racy` (kubectl) those two outcomes are accepted at those two steps;
/// ours must show the answers kubectl gives when the race goes well.
fn expect_rotation(steps: &Steps, with_token: bool, racy: bool) {
    let tok = |t: &str| with_token.then(|| format!("Bearer {t}"));
    let mut first_after = true;
    for (label, seen, runs) in steps {
        let want = match *label {
            "first" => (200, Some("plugin-one".to_string()), tok("tok-1"), 1),
            "401" => (401, None, None, 2),
            _ => (200, Some("plugin-two".to_string()), tok("tok-2"), 2),
        };
        let got = (
            seen.status,
            seen.cn.clone(),
            seen.authorization.clone(),
            *runs,
        );
        let raced = racy
            && match *label {
                "401" => got == (0, None, None, 2),
                "after" => first_after && got == (500, None, None, 2),
                _ => false,
            };
        if *label == "after" {
            first_after = false;
        }
        if !raced {
            assert_eq!(got, want, "{label}: {steps:?}");
        }
    }
}

#[test]
fn plugin_certificate_presented_cached_and_rotated_after_401_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let r = rotate_on_401(&env, &server, "h1", false);
    expect_rotation(&r[0], false, true);
    expect_rotation(&r[1], false, false);
}

#[test]
fn plugin_certificate_and_token_over_http2_rotated_after_401_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start_h2(&env.certs());
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let r = rotate_on_401(&env, &server, "h2", true);
    expect_rotation(&r[0], true, true);
    expect_rotation(&r[1], true, false);
}

#[test]
fn expired_plugin_certificate_replaced_on_new_connections_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let (one, two) = (issue(&env, "soon-expired"), issue(&env, "renewed"));
    let mut results = Vec::new();
    for who in WHO {
        // Valid for 3 to 4 s from now (whole seconds): starting the proxy
        // (kubectl runs the plugin then) and the two requests below take
        // about 0.6 s beside two busy loops on 2 cores: 5 times that is
        // the margin before the certificate expires under them.
        let soon = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 4).unwrap();
        let answers = [cert_answer(&one, &soon.to_string()), cert_answer(&two, FAR)];
        let plugin = Plugin::new(&env.path(&format!("expiry-{who}-plugin")), &answers);
        let p = proxy(&env, who, "expiry", &server, &plugin.user_yaml());
        let mut steps = Vec::new();
        for _ in 0..2 {
            steps.push((get(&p.ep, "/api/v1/pods"), plugin.runs()));
        }
        let wait = soon.as_second() + 1 - jiff::Timestamp::now().as_second();
        std::thread::sleep(Duration::from_secs(wait.max(0) as u64 + 1));
        for _ in 0..3 {
            steps.push((get(&p.ep, "/api/v1/pods"), plugin.runs()));
        }
        results.push(steps);
    }
    let cn = |s: &str| Some(s.to_string());
    let want: Vec<(u16, Option<String>, u32)> = vec![
        (200, cn("soon-expired"), 1),
        (200, cn("soon-expired"), 1),
        (200, cn("renewed"), 2),
        (200, cn("renewed"), 2),
        (200, cn("renewed"), 2),
    ];
    for (who, steps) in WHO.iter().zip(&results) {
        let got: Vec<_> = steps
            .iter()
            .map(|(s, n)| (s.status, s.cn.clone(), *n))
            .collect();
        assert_eq!(got, want, "{who}");
    }
}

#[test]
fn static_client_certificate_wins_over_plugin_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let plugin_pair = issue(&env, "from-plugin");
    let (c, k) = env.issue(
        "static",
        "static-user",
        &[],
        &[rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    let mut results = Vec::new();
    for who in WHO {
        let plugin = Plugin::new(
            &env.path(&format!("static-{who}-plugin")),
            &[cert_answer(&plugin_pair, FAR)],
        );
        let user = format!(
            "    client-certificate: {c}\n    client-key: {k}\n{}",
            plugin.user_yaml()
        );
        let p = proxy(&env, who, "static", &server, &user);
        let a = get(&p.ep, "/api/v1/pods");
        let b = get(&p.ep, "/status/401");
        let c = get(&p.ep, "/api/v1/pods");
        results.push((a, b.status, c, plugin.runs()));
    }
    assert_eq!(results[0].0.cn.as_deref(), Some("static-user"));
    assert_eq!(results[0].3, 0, "kubectl never runs the plugin");
    assert_eq!(results[0], results[1], "kubectl / ours");
}

/// Plugins whose pair is unusable: the request fails with client-go's
/// words, and the answer is the same from both proxies.
#[test]
fn unusable_plugin_pairs_refused_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let (a, b) = (issue(&env, "half-a"), issue(&env, "half-b"));
    let cases = [
        (
            "cert-only",
            answer(Some(&a.0), None, Some("tok"), FAR),
            "exec plugin returned only certificate or key, not both",
        ),
        (
            "key-only",
            answer(None, Some(&a.1), None, FAR),
            "exec plugin returned only certificate or key, not both",
        ),
        (
            "mismatch",
            answer(Some(&a.0), Some(&b.1), None, FAR),
            "failed parsing client key/certificate: tls: private key does not match public key",
        ),
    ];
    for (name, ans, words) in cases {
        let mut results = Vec::new();
        for who in WHO {
            let plugin = Plugin::new(
                &env.path(&format!("{name}-{who}-plugin")),
                std::slice::from_ref(&ans),
            );
            let p = proxy(&env, who, name, &server, &plugin.user_yaml());
            let (seen, body) = get_full(&p.ep, "/api/v1/pods");
            // Give the log a moment to be written.
            std::thread::sleep(Duration::from_millis(200));
            let log = p.log_text();
            assert!(
                log.contains(words) || body.contains(words),
                "{name} {who}: {body:?} / {log}"
            );
            results.push(seen);
        }
        assert_ne!(results[0].status, 200, "{name}: {:?}", results[0]);
        assert_eq!(results[0], results[1], "{name}: kubectl / ours");
    }
}
