//! Connections to the API server through a proxy, `edgetunnel proxy`
//! against the real `kubectl proxy` with the same kubeconfig and
//! environment: kubeconfig `proxy-url` (http CONNECT with Basic
//! credentials, socks5 with user/password, absolute-form requests for an
//! `http://` server), `HTTPS_PROXY` with and without a matching `NO_PROXY`
//! (the API server on a non-loopback address: loopback is never proxied
//! from the environment), and kubectl's refusal of a bad `proxy-url`.
//! Both must go through the recording proxy the same way and get the same
//! answers.

use crate::support;

use std::path::Path;
use std::process::Command;

use support::apiserver;
use support::fwd_proxy::{self, RecProxy};
use support::http_raw::{echoed_header, get_echo, upgrade_echo, Endpoint};
use support::proxy_proc::{self, kubectl, kubectl_cmd, ours_cmd, start, Running};
use support::{outward_ip, Env};

const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// GET through a proxy: status, and the upstream's method, target and
/// Authorization as echoed.
fn get(ep: &Endpoint, path: &str) -> (u16, String) {
    let (r, v) = get_echo(ep, path).expect("exchange");
    let auth = echoed_header(&v, "authorization").unwrap_or_default();
    (
        r.status,
        format!("{} {} auth={auth}", v["method"], v["target"]),
    )
}

fn with_env(mut c: Command, vars: &[(&str, String)]) -> Command {
    for v in PROXY_VARS {
        c.env_remove(v);
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

fn kubeconfig(path: &Path, server: &str, certs: &Path, cluster_extra: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\n{cluster_extra}users:\n- name: test\n  user:\n    token: tok-1\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
        certs.join("ca.crt").display()
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

/// One proxy's answers and what the recording proxy saw meanwhile.
type Run = (Vec<(u16, String)>, Vec<String>);

/// Runs kubectl, then ours, each asking `paths`; returns each one's
/// answers and the proxy's record of each run.
fn both(
    env: &Env,
    name: &str,
    kc: &Path,
    vars: &[(&str, String)],
    proxy: &RecProxy,
    paths: &[&str],
) -> [Run; 2] {
    each(env, name, kc, vars, proxy, |ep| {
        paths.iter().map(|path| get(ep, path)).collect()
    })
}

/// Runs kubectl, then ours, with `vars` in the environment; `ask` talks to
/// each; returns what it returned and the proxy's record of each run.
fn each<T>(
    env: &Env,
    name: &str,
    kc: &Path,
    vars: &[(&str, String)],
    proxy: &RecProxy,
    ask: impl Fn(&Endpoint) -> T,
) -> [(T, Vec<String>); 2] {
    let kubectl = kubectl();
    let flags = vec!["--port=0".to_string()];
    let mut out = Vec::new();
    for who in ["kubectl", "ours"] {
        proxy.clear();
        let cmd = if who == "kubectl" {
            kubectl_cmd(&kubectl, kc, &flags)
        } else {
            ours_cmd(kc, &flags)
        };
        let p: Running = start(with_env(cmd, vars), env.path(&format!("{name}-{who}.log")));
        let answers = ask(&p.ep);
        drop(p);
        // kubectl's own start-up /version calls are not compared.
        let lines = proxy
            .lines()
            .into_iter()
            .filter(|l| !l.contains("/version"))
            .collect();
        out.push((answers, lines));
    }
    let ours = out.pop().expect("two runs");
    let go = out.pop().expect("two runs");
    [go, ours]
}

/// The proxy recorded at least one line, each of them `want`.
fn assert_all_through(who: &str, lines: &[String], want: &str) {
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l == want),
        "{who} through the proxy: {lines:?}"
    );
}

const PATHS: &[&str] = &["/api/v1/namespaces/a/pods", "/apis/x/v1/things?w=1"];

#[test]
fn proxy_url_http_connect_with_credentials() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let proxy = fwd_proxy::start_http("127.0.0.1:0");
    let kc = env.path("kc.yaml");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    kubeconfig(
        &kc,
        &server,
        &certs,
        &format!("    proxy-url: http://us%3Aer:p%40w@{}\n", proxy.addr),
    );
    // The environment must not matter when proxy-url is set.
    let vars = [("HTTPS_PROXY", "http://127.0.0.1:1".to_string())];
    let [go, ours] = both(&env, "connect", &kc, &vars, &proxy, PATHS);
    assert_eq!(go.0, ours.0, "answers");
    assert!(go.0.iter().all(|(s, _)| *s == 200), "{:?}", go.0);
    let want = format!(
        "CONNECT 127.0.0.1:{} auth=Basic dXM6ZXI6cEB3",
        api.addr.port()
    );
    assert_all_through("kubectl", &go.1, &want);
    assert_all_through("ours", &ours.1, &want);
}

#[test]
fn proxy_url_socks5_with_password() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let proxy = fwd_proxy::start_socks5("127.0.0.1:0", Some(("sockuser", "s3cret")));
    let kc = env.path("kc.yaml");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    kubeconfig(
        &kc,
        &server,
        &certs,
        &format!("    proxy-url: socks5://sockuser:s3cret@{}\n", proxy.addr),
    );
    let [go, ours] = both(&env, "socks", &kc, &[], &proxy, PATHS);
    assert_eq!(go.0, ours.0, "answers");
    assert!(go.0.iter().all(|(s, _)| *s == 200), "{:?}", go.0);
    let want = format!("SOCKS 127.0.0.1:{} user=sockuser", api.addr.port());
    assert_all_through("kubectl", &go.1, &want);
    assert_all_through("ours", &ours.1, &want);
}

#[test]
fn proxy_url_http_server_absolute_form() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start_plain();
    let proxy = fwd_proxy::start_http("127.0.0.1:0");
    let kc = env.path("kc.yaml");
    let server = format!("http://127.0.0.1:{}", api.addr.port());
    kubeconfig(
        &kc,
        &server,
        &certs,
        &format!("    proxy-url: http://pu:pp@{}\n", proxy.addr),
    );
    let [go, ours] = both(&env, "absolute", &kc, &[], &proxy, PATHS);
    assert_eq!(go.0, ours.0, "answers");
    assert!(go.0.iter().all(|(s, _)| *s == 200), "{:?}", go.0);
    let want: Vec<String> = PATHS
        .iter()
        .map(|p| format!("GET {server}{p} auth=Basic cHU6cHA="))
        .collect();
    assert_eq!(go.1, want, "kubectl");
    assert_eq!(ours.1, want, "ours");
}

#[test]
fn https_proxy_env_and_no_proxy() {
    let Some(ip) = outward_ip() else {
        eprintln!("skipped: no non-loopback address on this machine");
        return;
    };
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start_at(&certs, &format!("{ip}:0"));
    let proxy = fwd_proxy::start_http("127.0.0.1:0");
    let kc = env.path("kc.yaml");
    let server = format!("https://{ip}:{}", api.addr.port());
    kubeconfig(&kc, &server, &certs, "    tls-server-name: localhost\n");
    let p = format!("http://{}", proxy.addr);

    // Lower-case variable: both go through it.
    let vars = [("https_proxy", p.clone())];
    let [go, ours] = both(&env, "env", &kc, &vars, &proxy, PATHS);
    assert_eq!(go.0, ours.0);
    assert!(go.0.iter().all(|(s, _)| *s == 200), "{:?}", go.0);
    let want = format!("CONNECT {ip}:{} auth=-", api.addr.port());
    assert_all_through("kubectl", &go.1, &want);
    assert_all_through("ours", &ours.1, &want);

    // NO_PROXY by CIDR, by IP:port, or `*`: both bypass it.
    let cidr = match ip {
        std::net::IpAddr::V4(v) => format!("{}.0.0.0/8", v.octets()[0]),
        std::net::IpAddr::V6(_) => "::/0".into(),
    };
    for no in [
        cidr,
        format!("example.com, {ip}:{}", api.addr.port()),
        "*".into(),
    ] {
        let vars = [("HTTPS_PROXY", p.clone()), ("NO_PROXY", no.clone())];
        let [go, ours] = both(&env, "noproxy", &kc, &vars, &proxy, PATHS);
        assert_eq!(go.0, ours.0, "{no}");
        assert!(go.0.iter().all(|(s, _)| *s == 200), "{no}: {:?}", go.0);
        assert!(go.1.is_empty(), "{no}: kubectl bypasses: {:?}", go.1);
        assert!(ours.1.is_empty(), "{no}: ours bypasses: {:?}", ours.1);
    }
    // A NO_PROXY on another port does not match.
    let vars = [("HTTPS_PROXY", p.clone()), ("NO_PROXY", format!("{ip}:1"))];
    let [go, ours] = both(&env, "noproxy-port", &kc, &vars, &proxy, PATHS);
    assert!(
        !go.1.is_empty() && !ours.1.is_empty(),
        "{:?} / {:?}",
        go.1,
        ours.1
    );
}

#[test]
fn env_proxy_never_for_loopback() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let proxy = fwd_proxy::start_http("127.0.0.1:0");
    let kc = env.path("kc.yaml");
    kubeconfig(
        &kc,
        &format!("https://127.0.0.1:{}", api.addr.port()),
        &certs,
        "",
    );
    let vars = [("HTTPS_PROXY", format!("http://{}", proxy.addr))];
    let [go, ours] = both(&env, "loopback", &kc, &vars, &proxy, PATHS);
    assert_eq!(go.0, ours.0);
    assert!(go.0.iter().all(|(s, _)| *s == 200), "{:?}", go.0);
    assert!(
        go.1.is_empty() && ours.1.is_empty(),
        "{:?} / {:?}",
        go.1,
        ours.1
    );
}

#[test]
fn bad_proxy_url_refused_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    for (name, url) in [("scheme", "ftp://p:1"), ("parse", "\"http://a b\"")] {
        let kc = env.path(&format!("{name}.yaml"));
        kubeconfig(
            &kc,
            "https://127.0.0.1:1",
            &certs,
            &format!("    proxy-url: {url}\n"),
        );
        let flags = vec!["--port=0".to_string()];
        let run = |c: Command| run_briefly(&env, name, c);
        let (gok, gerr) = run(kubectl_cmd(&kubectl, &kc, &flags));
        let (ook, oerr) = run(ours_cmd(&kc, &flags));
        assert!(!gok && !ook, "{name}: both refuse: {gerr} / {oerr}");
        let want = gerr
            .lines()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or_else(|| panic!("kubectl said {gerr}"));
        assert!(want.contains("invalid 'proxy-url'"), "{want}");
        assert!(oerr.contains(want), "{name}: want {want:?}, ours: {oerr}");
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Runs a proxy command with no proxy variables (see
/// [`proxy_proc::run_briefly`]).
fn run_briefly(env: &Env, name: &str, c: Command) -> (bool, String) {
    let log = env.path(&format!("{name}-{}.err", rand_suffix()));
    proxy_proc::run_briefly(log, with_env(c, &[]))
}

#[test]
fn match_server_version_asks_through_the_proxy() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let proxy = fwd_proxy::start_socks5("127.0.0.1:0", None);
    let kc = env.path("kc.yaml");
    kubeconfig(
        &kc,
        &format!("https://127.0.0.1:{}", api.addr.port()),
        &certs,
        &format!("    proxy-url: socks5://{}\n", proxy.addr),
    );
    let flags = vec!["--port=0".to_string(), "--match-server-version".to_string()];
    for (who, cmd) in [
        ("kubectl", kubectl_cmd(&kubectl, &kc, &flags)),
        ("ours", ours_cmd(&kc, &flags)),
    ] {
        proxy.clear();
        let (_, err) = run_briefly(&env, who, cmd);
        // Started or refused on the version: either way it was read.
        assert!(!err.contains("couldn't read version"), "{who}: {err}");
        let want = format!("SOCKS 127.0.0.1:{} user=-", api.addr.port());
        assert!(proxy.lines().contains(&want), "{who}: {:?}", proxy.lines());
    }
}

/// Upgraded streams (port-forward, exec) take the same way as plain
/// requests: through a `proxy-url` CONNECT or SOCKS5 proxy, and through
/// `HTTPS_PROXY` unless `NO_PROXY` matches. Both proxies must answer 101,
/// echo byte-exact, and leave the same record at the proxy.
#[test]
fn upgrades_take_the_proxy_as_kubectl_does() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let http = fwd_proxy::start_http("127.0.0.1:0");
    let socks = fwd_proxy::start_socks5("127.0.0.1:0", Some(("u", "p")));
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let upgrade = |ep: &Endpoint| upgrade_echo(ep, 256 << 10);
    let cases = [
        (
            "up-connect",
            format!("    proxy-url: http://u:p@{}\n", http.addr),
            &http,
        ),
        (
            "up-socks",
            format!("    proxy-url: socks5://u:p@{}\n", socks.addr),
            &socks,
        ),
    ];
    for (name, extra, proxy) in cases {
        let kc = env.path(&format!("{name}.yaml"));
        kubeconfig(&kc, &server, &certs, &extra);
        let [go, ours] = each(&env, name, &kc, &[], proxy, upgrade);
        assert_eq!(go.0, Ok(()), "{name}: kubectl");
        assert_eq!(ours.0, go.0, "{name}: ours");
        assert!(!go.1.is_empty(), "{name}: kubectl went direct");
        assert_eq!(ours.1, go.1, "{name}: the proxy's record");
    }

    // From the environment (a non-loopback API server address).
    let Some(ip) = outward_ip() else {
        eprintln!("environment cases skipped: no non-loopback address");
        return;
    };
    let api = apiserver::start_at(&certs, &format!("{ip}:0"));
    let kc = env.path("up-env.yaml");
    let server = format!("https://{ip}:{}", api.addr.port());
    kubeconfig(&kc, &server, &certs, "    tls-server-name: localhost\n");
    let p = format!("http://{}", http.addr);
    for (name, vars, proxied) in [
        ("up-env", vec![("HTTPS_PROXY", p.clone())], true),
        (
            "up-env-no-proxy",
            vec![("HTTPS_PROXY", p.clone()), ("NO_PROXY", ip.to_string())],
            false,
        ),
    ] {
        let [go, ours] = each(&env, name, &kc, &vars, &http, upgrade);
        assert_eq!(go.0, Ok(()), "{name}: kubectl");
        assert_eq!(!go.1.is_empty(), proxied, "{name}: kubectl {:?}", go.1);
        assert_eq!(ours.0, go.0, "{name}: ours");
        assert_eq!(ours.1, go.1, "{name}: the proxy's record");
    }
}
