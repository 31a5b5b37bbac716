//! Authentication toward the API server, `edgetunnel proxy` against the real
//! `kubectl proxy` on the same fake API server: no credentials to an
//! `http://` server, impersonation headers (kubeconfig and `--as*` flags),
//! exec credential plugins (run count: cached, re-run after a 401 and after
//! expiry), kubectl's refusals of bad user entries; and the in-cluster
//! service account (ours only: kubectl's paths are fixed).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::apiserver;
use support::http_raw::{get_echo, Endpoint};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, run_briefly, start, Running};
use support::{Env, BIN};

/// GET through a proxy: status and the upstream's echo (if JSON).
fn get(ep: &Endpoint, path: &str) -> (u16, serde_json::Value) {
    let (r, v) = get_echo(ep, path).expect("exchange");
    (r.status, v)
}

/// The upstream-seen headers whose names start with one of `prefixes`,
/// sorted (the fake server lower-cases names).
fn seen(v: &serde_json::Value, prefixes: &[&str]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = v["headers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string())))
                .filter(|(n, _)| prefixes.iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

const AUTH: &[&str] = &["authorization", "impersonate-"];

fn pair(env: &Env, kubectl: &Path, name: &str, kc: &Path, flags: &[&str]) -> (Running, Running) {
    let flags: Vec<String> = ["--port=0"]
        .iter()
        .chain(flags)
        .map(|s| s.to_string())
        .collect();
    let go = start(
        kubectl_cmd(kubectl, kc, &flags),
        env.path(&format!("{name}-kubectl.log")),
    );
    let ours = start(ours_cmd(kc, &flags), env.path(&format!("{name}-ours.log")));
    (go, ours)
}

/// A kubeconfig with `server` (CA of the test certs) and this user entry.
fn kubeconfig(path: &Path, server: &str, certs: &Path, user_yaml: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: test\n  user:\n{user_yaml}contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
        certs.join("ca.crt").display()
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

const IMPERSONATION: &str = "    as: alice\n    as-uid: \"u-1\"\n    as-groups: [\"g1\", \"g 2\"]\n    as-user-extra:\n      \"Scopes/x y\": [\"a b\", \"c%d\"]\n      reason: [\"\u{e9}\"]\n      \"pct%\": [\"1\"]\n";

#[test]
fn no_credentials_to_http_servers_but_impersonation() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start_plain();
    let server = format!("http://127.0.0.1:{}", api.addr.port());
    let kc = env.path("kc-http.yaml");
    kubeconfig(
        &kc,
        &server,
        &certs,
        &format!("    token: kubeconfig-token\n{IMPERSONATION}"),
    );
    let kc_basic = env.path("kc-http-basic.yaml");
    kubeconfig(
        &kc_basic,
        &server,
        &certs,
        "    username: u\n    password: p\n",
    );
    for (name, kc, flags) in [
        ("http-kubeconfig", &kc, vec![]),
        (
            "http-flags",
            &kc,
            vec![
                "--token=flag-token",
                "--as=bob",
                "--as-group=x",
                "--as-uid=9",
            ],
        ),
        ("http-basic", &kc_basic, vec![]),
        (
            "http-basic-flags",
            &kc_basic,
            vec!["--username=fu", "--password=fp"],
        ),
    ] {
        let (go, ours) = pair(&env, &kubectl, name, kc, &flags);
        let (gs, gv) = get(&go.ep, "/api/v1/pods");
        let (os, ov) = get(&ours.ep, "/api/v1/pods");
        assert_eq!((gs, os), (200, 200), "{name}");
        let (g, o) = (seen(&gv, AUTH), seen(&ov, AUTH));
        assert!(
            !o.iter().any(|(n, _)| n == "authorization"),
            "{name}: credentials sent to an http server: {o:?}"
        );
        assert_eq!(g, o, "{name}: kubectl vs ours");
    }
}

#[test]
fn impersonation_matches_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let kc = env.path("kc-imp.yaml");
    kubeconfig(
        &kc,
        &server,
        &certs,
        &format!("    token: tls-token\n{IMPERSONATION}"),
    );
    let kc_plain = env.path("kc-noimp.yaml");
    kubeconfig(&kc_plain, &server, &certs, "    token: tls-token\n");
    for (name, kc, flags) in [
        ("imp-kubeconfig", &kc, vec![]),
        (
            "imp-flags-over-kubeconfig",
            &kc,
            vec!["--as=bob", "--as-group=a,b", "--as-group=c", "--as-uid=9"],
        ),
        (
            "imp-flags",
            &kc_plain,
            vec!["--as=system:serviceaccount:ns:sa"],
        ),
        (
            "imp-flags-groups",
            &kc_plain,
            vec!["--as=carol", "--as-group=devs", "--as-group=ops"],
        ),
        ("empty-token-flag", &kc_plain, vec!["--token=", "--as=dave"]),
    ] {
        let (go, ours) = pair(&env, &kubectl, name, kc, &flags);
        let (gs, gv) = get(&go.ep, "/api/v1/namespaces");
        let (os, ov) = get(&ours.ep, "/api/v1/namespaces");
        assert_eq!((gs, os), (200, 200), "{name}");
        let (g, o) = (seen(&gv, AUTH), seen(&ov, AUTH));
        assert!(
            g.iter().any(|(n, _)| n == "impersonate-user"),
            "{name}: {g:?}"
        );
        assert_eq!(g, o, "{name}: kubectl vs ours");
    }
}

#[test]
fn bad_user_entries_refused_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let server = "https://127.0.0.1:1";
    let cases = [
        ("groups-without-user", "    as-groups: [g]\n", vec![]),
        ("uid-without-user", "    as-uid: \"1\"\n", vec![]),
        (
            "token-and-basic",
            "    token: t\n    username: u\n    password: p\n",
            vec![],
        ),
        (
            "flag-group-without-user",
            "    token: t\n",
            vec!["--as-group=g"],
        ),
    ];
    for (name, user, flags) in cases {
        let kc = env.path(&format!("{name}.yaml"));
        kubeconfig(&kc, server, &certs, user);
        let flags: Vec<String> = ["--port=0"]
            .iter()
            .chain(&flags)
            .map(|s| s.to_string())
            .collect();
        // A proxy that does not refuse starts serving: killed after 10 s.
        let run = |c: Command| run_briefly(env.path(&format!("{name}-{}.err", fastrand_name())), c);
        let (gok, gerr) = run(kubectl_cmd(&kubectl, &kc, &flags));
        let (ook, oerr) = run(ours_cmd(&kc, &flags));
        assert!(!gok && !ook, "{name}: both must refuse: {gerr} / {oerr}");
        let want = gerr
            .lines()
            .find_map(|l| {
                let l = l.trim_start_matches("error: ").trim_start_matches("* ");
                (l.contains("requesting") || l.contains("more than one")).then(|| l.to_string())
            })
            .unwrap_or_else(|| panic!("{name}: kubectl said {gerr}"));
        assert!(oerr.contains(&want), "{name}: want {want:?}, ours: {oerr}");
    }
}

fn fastrand_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// An exec plugin script: counts its runs in `count`, prints an
/// ExecCredential with token `tok-<run>` (and `expiry` when given), and
/// records its KUBERNETES_EXEC_INFO and arguments.
fn plugin(dir: &Path, api_version: &str, expiry: Option<&str>) -> (PathBuf, PathBuf) {
    let script = dir.join(format!("plugin-{}.sh", api_version.replace('/', "_")));
    let count = dir.join(format!("count-{}", api_version.replace('/', "_")));
    let exp = expiry
        .map(|e| format!(",\"expirationTimestamp\":\"{e}\""))
        .unwrap_or_default();
    let text = format!(
        "#!/bin/sh\nn=$(( $(cat {c} 2>/dev/null || echo 0) + 1 ))\necho $n > {c}\necho \"$KUBERNETES_EXEC_INFO\" > {c}.info\necho \"$@ $PLUGIN_ENV\" > {c}.args\nprintf '{{\"kind\":\"ExecCredential\",\"apiVersion\":\"{api_version}\",\"status\":{{\"token\":\"tok-%s\"{exp}}}}}' $n\n",
        c = count.display()
    );
    std::fs::write(&script, text).unwrap();
    let _ = Command::new("chmod").arg("+x").arg(&script).status();
    (script, count)
}

fn runs(count: &Path) -> u32 {
    std::fs::read_to_string(count)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn exec_user(script: &Path, api_version: &str) -> String {
    format!(
        "    exec:\n      apiVersion: {api_version}\n      command: {}\n      args: [\"--flag\", \"x y\"]\n      env:\n      - name: PLUGIN_ENV\n        value: from-kubeconfig\n      interactiveMode: IfAvailable\n      provideClusterInfo: true\n",
        script.display()
    )
}

/// Runs the same scenario against one proxy: returns the tokens the
/// upstream saw and the plugin's run count after each step.
fn exec_scenario(ep: &Endpoint, count: &Path) -> Vec<(String, u32)> {
    let token = |v: &serde_json::Value| {
        seen(v, &["authorization"])
            .first()
            .map(|(_, t)| t.clone())
            .unwrap_or_default()
    };
    let mut steps = Vec::new();
    for _ in 0..3 {
        let (s, v) = get(ep, "/api/v1/pods");
        assert_eq!(s, 200);
        steps.push((token(&v), runs(count)));
    }
    // A 401: the plugin runs again, the next request carries the new token.
    let (s, _) = get(ep, "/status/401");
    assert_eq!(s, 401);
    steps.push(("after-401".into(), runs(count)));
    for _ in 0..2 {
        let (_, v) = get(ep, "/api/v1/pods");
        steps.push((token(&v), runs(count)));
    }
    steps
}

#[test]
fn exec_plugin_cached_and_rerun_on_401_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    for api_version in [
        "client.authentication.k8s.io/v1",
        "client.authentication.k8s.io/v1beta1",
    ] {
        let mut results = Vec::new();
        for who in ["kubectl", "ours"] {
            let dir = env.path(&format!("exec-{who}-{}", api_version.replace('/', "_")));
            std::fs::create_dir_all(&dir).unwrap();
            let (script, count) = plugin(&dir, api_version, Some("2099-01-01T00:00:00Z"));
            let kc = dir.join("kc.yaml");
            kubeconfig(&kc, &server, &certs, &exec_user(&script, api_version));
            let flags = vec!["--port=0".to_string()];
            let cmd = if who == "kubectl" {
                kubectl_cmd(&kubectl, &kc, &flags)
            } else {
                ours_cmd(&kc, &flags)
            };
            let p = start(cmd, dir.join("proxy.log"));
            let steps = exec_scenario(&p.ep, &count);
            let info: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(format!("{}.info", count.display())).unwrap(),
            )
            .unwrap();
            let args = std::fs::read_to_string(format!("{}.args", count.display())).unwrap();
            results.push((steps, info, args));
        }
        let (go, ours) = (&results[0], &results[1]);
        assert_eq!(
            ours.0.first().map(|s| s.0.as_str()),
            Some("Bearer tok-1"),
            "{api_version}: {:?}",
            ours.0
        );
        assert_eq!(go.0, ours.0, "{api_version}: tokens and run counts");
        assert_eq!(go.2, ours.2, "{api_version}: plugin args and env");
        assert_eq!(go.1["apiVersion"], ours.1["apiVersion"]);
        assert_eq!(go.1["kind"], ours.1["kind"]);
        assert_eq!(
            go.1["spec"]["interactive"], ours.1["spec"]["interactive"],
            "{api_version}"
        );
        assert_eq!(
            go.1["spec"]["cluster"]["server"], ours.1["spec"]["cluster"]["server"],
            "{api_version}: {} / {}",
            go.1, ours.1
        );
    }
}

#[test]
fn exec_plugin_expired_credentials_rerun_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let api_version = "client.authentication.k8s.io/v1";
    let mut counts = Vec::new();
    for who in ["kubectl", "ours"] {
        let dir = env.path(&format!("expired-{who}"));
        std::fs::create_dir_all(&dir).unwrap();
        // Already expired: every request runs the plugin again.
        let (script, count) = plugin(&dir, api_version, Some("2000-01-01T00:00:00Z"));
        let kc = dir.join("kc.yaml");
        kubeconfig(&kc, &server, &certs, &exec_user(&script, api_version));
        let flags = vec!["--port=0".to_string()];
        let cmd = if who == "kubectl" {
            kubectl_cmd(&kubectl, &kc, &flags)
        } else {
            ours_cmd(&kc, &flags)
        };
        let p = start(cmd, dir.join("proxy.log"));
        let mut seen_tokens = Vec::new();
        for _ in 0..3 {
            let (s, v) = get(&p.ep, "/api/v1/pods");
            assert_eq!(s, 200);
            seen_tokens.push(seen(&v, &["authorization"]));
        }
        counts.push((runs(&count), seen_tokens));
    }
    // Both run the plugin again for every request (kubectl also from the
    // TLS client-certificate callback of each handshake, so it may run
    // more often): each request carries a new token.
    for (who, (n, tokens)) in ["kubectl", "ours"].iter().zip(&counts) {
        assert!(*n >= 3, "{who}: {n} runs");
        let mut t: Vec<_> = tokens.iter().map(|v| v[0].1.clone()).collect();
        t.dedup();
        assert_eq!(t.len(), 3, "{who}: {tokens:?}");
    }
    assert_eq!(counts[1].0, 3, "ours: one run per request");
}

#[test]
fn in_cluster_service_account_token_reread() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let sa = env.path("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), "sa-token-1\n").unwrap();
    std::fs::copy(certs.join("ca.crt"), sa.join("ca.crt")).unwrap();
    let home = env.path("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["proxy", "--port=0"])
        .env_remove("KUBECONFIG")
        .env("HOME", &home)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", api.addr.port().to_string())
        .env("EDGETUNNEL_SERVICEACCOUNT_DIR", &sa)
        .env("EDGETUNNEL_LOG", "warn");
    let p = start(cmd, env.path("incluster.log"));
    let auth = |v: &serde_json::Value| seen(v, &["authorization"]);
    let (s, v) = get(&p.ep, "/api/v1/pods");
    assert_eq!(s, 200, "{}", p.log_text());
    assert_eq!(
        auth(&v),
        vec![("authorization".into(), "Bearer sa-token-1".into())]
    );
    // The kubelet rotates the token; a 401 makes the proxy read it again.
    std::fs::write(sa.join("token"), "sa-token-2\n").unwrap();
    let (_, v) = get(&p.ep, "/api/v1/pods");
    assert_eq!(auth(&v)[0].1, "Bearer sa-token-1", "cached until refused");
    assert_eq!(get(&p.ep, "/status/401").0, 401);
    let (_, v) = get(&p.ep, "/api/v1/pods");
    assert_eq!(auth(&v)[0].1, "Bearer sa-token-2");
}
