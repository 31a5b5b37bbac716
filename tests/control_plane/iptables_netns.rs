//! The iptables manager and the interception listener for real, inside
//! network namespaces this test creates (needs root, iproute2, iptables and
//! python3): rules checked with iptables-save, kept idempotent, repaired
//! after tampering and removed on exit; a connection from the "cloud"
//! namespace to an edge node's kubelet port is redirected to the interception
//! listener and reaches a real target in the "edge" namespace through a real
//! agent, while the direct path to it is dropped.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::netns::{check, save, sh, Netns};
use support::{Proc, BIN};

fn et(ns: &Netns, args: &[&str]) -> String {
    let out = ns.cmd(BIN).args(args).output().expect("run edgetunnel");
    check(out, &format!("edgetunnel {args:?}"))
}

fn tag() -> String {
    format!("{}", std::process::id() % 100_000)
}

#[test]
fn iptables_rules_are_idempotent_repaired_and_removed() {
    let ns = Netns::new(&format!("etipt{}", tag()));
    let sync = |extra: &[&str]| {
        let mut args = vec![
            "iptables",
            "sync",
            "--dnat-ip",
            "10.0.0.2",
            "--dnat-port",
            "10264",
        ];
        args.extend_from_slice(extra);
        et(&ns, &args)
    };
    sync(&["--edge-ip", "10.0.0.5", "--edge-ip", "10.0.0.6"]);
    let first = save(&ns);
    sync(&["--edge-ip", "10.0.0.5", "--edge-ip", "10.0.0.6"]);
    assert_eq!(save(&ns), first, "a second sync changed the rules");
    for want in [
        "-A OUTPUT -p tcp -m comment --comment \"edgetunnel: kubelet ports\" -j TUNNEL-PORT",
        "-A TUNNEL-PORT -p tcp -m tcp --dport 10250 -j TUNNEL-PORT-10250",
        "-A TUNNEL-PORT-10255 -d 10.0.0.6/32 -p tcp -j DNAT --to-destination 10.0.0.2:10264",
    ] {
        assert!(first.contains(want), "missing {want:?} in\n{first}");
    }
    assert_eq!(
        first.matches("-j TUNNEL-PORT\n").count() + first.ends_with("-j TUNNEL-PORT") as usize,
        1
    );

    // A port no longer wanted loses its chain.
    sync(&["--ports", "10250,10255,9999", "--edge-ip", "10.0.0.5"]);
    assert!(save(&ns).contains(":TUNNEL-PORT-9999"));
    sync(&["--edge-ip", "10.0.0.5"]);
    let s = save(&ns);
    assert!(!s.contains("9999") && !s.contains("10.0.0.6"), "{s}");

    // yurt-tunnel's layout: RETURN for cloud nodes and loopback, DNAT the rest.
    sync(&["--cloud-node-ip", "10.0.0.7"]);
    let s = save(&ns);
    for want in [
        "-A TUNNEL-PORT-10250 -d 127.0.0.0/8 -j RETURN",
        "-A TUNNEL-PORT-10250 -d 10.0.0.7/32 -j RETURN",
        "-A TUNNEL-PORT-10250 -p tcp -j DNAT --to-destination 10.0.0.2:10264",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }

    // Someone deletes the jump and a chain by hand; a sync restores them.
    sh(
        &ns.0,
        "iptables -t nat -D OUTPUT -p tcp -m comment --comment 'edgetunnel: kubelet ports' -j TUNNEL-PORT \
         && iptables -t nat -F TUNNEL-PORT && iptables -t nat -F TUNNEL-PORT-10255 && iptables -t nat -X TUNNEL-PORT-10255",
    );
    sync(&["--cloud-node-ip", "10.0.0.7"]);
    assert_eq!(save(&ns), s, "not repaired");

    // Both families at once: each gets its own rules, by the DNAT address.
    et(
        &ns,
        &[
            "iptables",
            "sync",
            "--dnat-ip",
            "10.0.0.2",
            "--dnat-ip",
            "fd00::2",
            "--edge-ip",
            "10.0.0.5",
            "--edge-ip",
            "fd00::5",
        ],
    );
    let v6 = sh(&ns.0, "ip6tables-save -t nat");
    assert!(
        v6.contains(
            "-A TUNNEL-PORT-10250 -d fd00::5/128 -p tcp -j DNAT --to-destination [fd00::2]:10264"
        ),
        "{v6}"
    );
    assert!(!v6.contains("10.0.0.5") && !save(&ns).contains("fd00::5"));

    et(&ns, &["iptables", "cleanup"]);
    let s = save(&ns);
    assert!(!s.contains("TUNNEL-PORT"), "left behind:\n{s}");
    assert!(!sh(&ns.0, "ip6tables-save -t nat").contains("TUNNEL-PORT"));
}

/// GET `url` from inside `ns` (python3), optionally with a Host header.
fn get_in(ns: &Netns, url: &str, host: Option<&str>) -> Result<String, String> {
    let script = "import sys, urllib.request\n\
                  h = {'Host': sys.argv[2]} if len(sys.argv) > 2 else {}\n\
                  print(urllib.request.urlopen(urllib.request.Request(sys.argv[1], headers=h), timeout=5).read().decode(), end='')";
    let mut c = ns.cmd("python3");
    c.args(["-c", script, url]);
    if let Some(h) = host {
        c.arg(h);
    }
    let out = c.output().expect("python3");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// GET `url` over HTTPS from inside `ns`, verifying the server with `ca`.
fn get_tls_in(ns: &Netns, url: &str, ca: &std::path::Path) -> Result<String, String> {
    let script = "import sys, ssl, urllib.request\n\
                  ctx = ssl.create_default_context(cafile=sys.argv[2])\n\
                  print(urllib.request.urlopen(sys.argv[1], timeout=5, context=ctx).read().decode(), end='')";
    let out = ns
        .cmd("python3")
        .args(["-c", script, url])
        .arg(ca)
        .output()
        .expect("python3");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// An HTTPS "kubelet": serves `dir`, requires a client certificate from `ca`.
const KUBELET: &str = "import functools, http.server, ssl, sys\n\
d, bind, port, cert, key, ca = sys.argv[1:7]\n\
srv = http.server.ThreadingHTTPServer((bind, int(port)), functools.partial(http.server.SimpleHTTPRequestHandler, directory=d))\n\
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
ctx.load_cert_chain(cert, key)\n\
ctx.load_verify_locations(ca)\n\
ctx.verify_mode = ssl.CERT_REQUIRED\n\
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)\n\
srv.serve_forever()\n";

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn intercepted_kubelet_traffic_reaches_the_edge_through_the_agent() {
    let t = tag();
    let cloud = Netns::new(&format!("etcloud{t}"));
    let edge = Netns::new(&format!("etedge{t}"));
    let (vc, ve) = (format!("etc{t}"), format!("ete{t}"));
    let (cloud_ip, edge_ip) = ("10.231.7.1", "10.231.7.5");
    sh(
        &cloud.0,
        &format!(
            "ip link add {vc} type veth peer name {ve} && ip link set {ve} netns {}",
            edge.0
        ),
    );
    sh(
        &cloud.0,
        &format!("ip addr add {cloud_ip}/24 dev {vc} && ip link set {vc} up"),
    );
    sh(
        &edge.0,
        &format!("ip addr add {edge_ip}/24 dev {ve} && ip link set {ve} up"),
    );

    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    check(
        Command::new(BIN)
            .args(["certs", "init"])
            .arg(&certs)
            .args(["--server-name", cloud_ip, "--server-name", edge_ip])
            .output()
            .unwrap(),
        "certs init",
    );
    // The edge node's "kubelet": a web server on the node's address, which
    // the cloud side cannot reach directly (its traffic from the link is
    // dropped); only the agent, local to the node, can.
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello.txt"), "hello from the edge\n").unwrap();
    let mut target = edge.cmd("python3");
    target
        .args([
            "-m",
            "http.server",
            "10255",
            "--bind",
            edge_ip,
            "--directory",
        ])
        .arg(&www);
    let _target = Proc::spawn(target, dir.path().join("target.log"));
    // Its HTTPS port, with its own CA, asking for the proxy-client certificate.
    let kubelet_certs = dir.path().join("kubelet-certs");
    check(
        Command::new(BIN)
            .args(["certs", "init"])
            .arg(&kubelet_certs)
            .args(["--server-name", edge_ip])
            .output()
            .unwrap(),
        "certs init (kubelet)",
    );
    let mut kubelet = edge.cmd("python3");
    kubelet
        .args(["-c", KUBELET])
        .arg(&www)
        .args([edge_ip, "10250"])
        .arg(kubelet_certs.join("server.crt"))
        .arg(kubelet_certs.join("server.key"))
        .arg(certs.join("ca.crt"));
    let _kubelet = Proc::spawn(kubelet, dir.path().join("kubelet.log"));
    sh(
        &edge.0,
        &format!("iptables -A INPUT -i {ve} -p tcp -m multiport --dports 10250,10255 -j DROP"),
    );
    wait_for("the targets to listen", Duration::from_secs(10), || {
        let ss = sh(&edge.0, "ss -ltn");
        ss.contains(&format!("{edge_ip}:10255")) && ss.contains(&format!("{edge_ip}:10250"))
    });
    assert!(
        get_in(&cloud, &format!("http://{edge_ip}:10255/hello.txt"), None).is_err(),
        "direct path open"
    );

    let certs_s = certs.display().to_string();
    let mut server = cloud.cmd(BIN);
    server.args([
        "server",
        "--certs-dir",
        &certs_s,
        "--agent-bind",
        &format!("{cloud_ip}:10262"),
        "--interception-bind",
        &format!("{cloud_ip}:10264"),
        "--interception-tls-bind",
        &format!("{cloud_ip}:10263"),
        "--kubelet-ca",
        &kubelet_certs.join("ca.crt").display().to_string(),
        "--admin-bind",
        "127.0.0.1:10265",
        "--iptables",
        "--workers",
        "2",
        // Its agents' certificate does not name their IDs.
        "--bind-agent-identity=false",
    ]);
    let mut server = Proc::spawn(server, dir.path().join("server.log"));
    server.wait_line("READY");
    let mut agent = edge.cmd(BIN);
    agent.args([
        "agent",
        "--certs-dir",
        &certs_s,
        "--server-addr",
        &format!("{cloud_ip}:10262"),
        "--agent-id",
        "edge-1",
        "--agent-identifiers",
        &format!("host=edge-1&ipv4={edge_ip}"),
    ]);
    let agent = Proc::spawn(agent, dir.path().join("agent.log"));
    agent.wait_line("CONNECTED");

    let dnat = format!(
        "-A TUNNEL-PORT-10255 -d {edge_ip}/32 -p tcp -j DNAT --to-destination {cloud_ip}:10264"
    );
    wait_for(
        "the DNAT rule for the agent's address",
        Duration::from_secs(10),
        || save(&cloud).contains(&dnat),
    );

    // The kubelet port of the edge node's IP, from the cloud side.
    let body =
        get_in(&cloud, &format!("http://{edge_ip}:10255/hello.txt"), None).unwrap_or_else(|e| {
            panic!(
                "intercepted GET failed: {e}\nserver log:\n{}",
                server.log_text()
            )
        });
    assert_eq!(body, "hello from the edge\n");
    // The kubelet's HTTPS port: our TLS terminated, the kubelet's spoken
    // through the tunnel with the proxy-client certificate.
    let https = format!(
        "-A TUNNEL-PORT-10250 -d {edge_ip}/32 -p tcp -j DNAT --to-destination {cloud_ip}:10263"
    );
    assert!(save(&cloud).contains(&https), "{}", save(&cloud));
    let body = get_tls_in(
        &cloud,
        &format!("https://{edge_ip}:10250/hello.txt"),
        &certs.join("ca.crt"),
    )
    .unwrap_or_else(|e| {
        panic!(
            "intercepted HTTPS GET failed: {e}\nserver log:\n{}",
            server.log_text()
        )
    });
    assert_eq!(body, "hello from the edge\n");
    wait_for("the traced request in the log", support::WAIT, || {
        let log = server.log_text();
        log.contains("kubelet request") && log.contains("/hello.txt") && log.contains("status=200")
    });
    // Straight at the interception listener, the node named by Host.
    let body = get_in(
        &cloud,
        &format!("http://{cloud_ip}:10264/hello.txt"),
        Some("edge-1:10255"),
    )
    .unwrap();
    assert_eq!(body, "hello from the edge\n");

    // Tampering is repaired by the next full sync (at most 15 s).
    sh(&cloud.0, "iptables -t nat -F TUNNEL-PORT-10255");
    wait_for("the rules to be repaired", Duration::from_secs(20), || {
        save(&cloud).contains(&dnat)
    });

    // On exit the server removes its rules; the edge is unreachable again.
    server.signal(libc::SIGTERM);
    assert!(
        server.wait_exit(Duration::from_secs(20)).is_some(),
        "server did not exit"
    );
    let s = save(&cloud);
    assert!(!s.contains("TUNNEL-PORT"), "rules left after exit:\n{s}");
    assert!(get_in(&cloud, &format!("http://{edge_ip}:10255/hello.txt"), None).is_err());
    drop(agent);
}
