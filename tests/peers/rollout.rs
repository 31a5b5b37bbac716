//! A cloud-side server or an edge node's agent replaced on a real node
//! ([`crate::real_node`]) while kube-apiserver dials through it, as
//! deploy/README.md "Upgrades" says an upgrade runs: `kubectl logs` in a
//! loop (each a new tunnel) and a held `kubectl logs -f`, while the caller
//! starts the replacement (a DaemonSet's new image) and the new pod takes
//! over. The layouts' tests share it: `deploy_path` (the native server and
//! agent) and `deploy_layouts` (the yurt-tunnel layout, the konnectivity
//! drop-in).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::tail;
use crate::real_node::{pod_json, pod_log, wait_running, wait_until, Cluster, RealNode, EDGE_NODE};

/// What a new server or agent with a handover socket logs once its
/// predecessor drains.
pub(crate) const TOOK_OVER: &str = "handover: the predecessor drains";

/// The load through a replacement, counted.
pub(crate) struct Rolled {
    /// `kubectl logs` that came back whole while it ran.
    pub logs_ok: usize,
    /// From the start of the replacement to the end of `finish`.
    pub took: Duration,
    /// Lines the held `logs -f` had streamed by the end.
    pub followed: usize,
    /// The pod that took over.
    pub new_pod: String,
}

/// The kube-system pods named `prefix...` whose log directory exists in
/// `dir` (`NS_POD_UID` under a node's logs/).
fn pod_dirs(dir: &Path, prefix: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| {
            let name = d.file_name().to_string_lossy().to_string();
            let pod = name.strip_prefix("kube-system_")?.rsplit_once('_')?.0;
            pod.starts_with(prefix).then(|| pod.to_string())
        })
        .collect()
}

/// Replaces the pods named `prefix...` on `node` under load: `start`
/// begins the replacement (a new image), the helper waits for a new pod to
/// log `took_over` and for the held stream to go on after it, then
/// `finish` waits for the replacement to end (a rollout's status). `p1` on
/// the edge node must print `lines` (each `kubectl logs` is checked
/// against it). Panics on a failed `kubectl logs`, a held stream cut at
/// the takeover, or no takeover.
pub(crate) fn replace_under_load(
    cluster: &Cluster,
    node: &RealNode,
    prefix: &str,
    took_over: &str,
    lines: &str,
    start: impl FnOnce(),
    finish: impl FnOnce(),
) -> Rolled {
    let kas = cluster.kas();
    let env = &cluster.env;
    let nodes = cluster.nodes();
    // A pod of its own per replacement (a deleted one takes its time).
    let ticker = format!("follow-{}", prefix.trim_end_matches('-'));
    let pod = pod_json(
        &ticker,
        EDGE_NODE,
        &cluster.images.workload.name,
        "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done",
    );
    kas.create(env, &format!("pod-{ticker}"), &pod);
    wait_running(kas, "default", &ticker, Duration::from_secs(60), &nodes);
    let follow_log = env.path(&format!("{ticker}.log"));
    let mut follow = kas.kubectl_cmd(&["logs", "-f", "-n", "default", &ticker]);
    follow
        .stdout(std::fs::File::create(&follow_log).unwrap())
        .stderr(std::process::Stdio::piped());
    let mut follow = follow.spawn().unwrap();
    let followed = || {
        std::fs::read_to_string(&follow_log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    wait_until(
        "kubectl logs -f streaming",
        Duration::from_secs(30),
        || followed() > 5,
        String::new,
    );
    let before = pod_dirs(&node.dir, prefix);
    let servers_log = || {
        pod_dirs(&node.dir, prefix)
            .iter()
            .map(|p| {
                let log = pod_log(node, p);
                let said: Vec<&str> = log
                    .lines()
                    .filter(|l| {
                        l.contains("andover")
                            || l.contains(took_over)
                            || l.contains("WARN")
                            || l.contains("ERROR")
                    })
                    .collect();
                format!("--- {p}:\n{}", tail(&said.join("\n"), 15))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let stop = AtomicBool::new(false);
    let (logs_ok, logs_failed) = (AtomicUsize::new(0), Mutex::new(Vec::new()));
    let t = Instant::now();
    let (new_pod, took) = thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let o = kas.kubectl(&["logs", "-n", "default", "p1", "--request-timeout=10s"]);
                if o.status.success() && o.stdout == lines.as_bytes() {
                    logs_ok.fetch_add(1, Ordering::SeqCst);
                } else {
                    logs_failed.lock().unwrap().push(format!(
                        "{:?}: {}",
                        o.status,
                        String::from_utf8_lossy(&o.stderr).trim()
                    ));
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        /// Stops the loop when the scope ends, a failed assertion included.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _stop = StopOnDrop(&stop);
        start();
        // The held `logs -f` goes on once the new pod took over, on the
        // old server while it drains.
        let mut new_pod = String::new();
        wait_until(
            &format!("a new {prefix} pod taking over"),
            Duration::from_secs(60),
            || {
                let now = pod_dirs(&node.dir, prefix);
                match now
                    .difference(&before)
                    .find(|p| pod_log(node, p).contains(took_over))
                {
                    Some(p) => {
                        new_pod = p.clone();
                        true
                    }
                    None => false,
                }
            },
            servers_log,
        );
        let at_takeover = followed();
        wait_until(
            "the held logs -f streaming after the takeover",
            Duration::from_secs(10),
            || followed() > at_takeover + 3,
            String::new,
        );
        let cut = follow.try_wait().unwrap();
        assert!(
            cut.is_none(),
            "the held logs -f ended ({cut:?}) at the takeover"
        );
        finish();
        (new_pod, t.elapsed())
    });
    let failed = logs_failed.into_inner().unwrap();
    let logs_ok = logs_ok.into_inner();
    assert!(
        failed.is_empty(),
        "{} of {} kubectl logs failed during the replacement: {:?}\n{}",
        failed.len(),
        failed.len() + logs_ok,
        &failed[..failed.len().min(5)],
        servers_log()
    );
    assert!(
        logs_ok >= 5,
        "only {logs_ok} kubectl logs during the replacement"
    );
    let followed = followed();
    let _ = follow.kill();
    let _ = follow.wait();
    kas.kubectl_ok(&["delete", "pod", "-n", "default", &ticker, "--wait=false"]);
    Rolled {
        logs_ok,
        took,
        followed,
        new_pod,
    }
}

/// DaemonSet `kube-system/ds` rolled to `image` (its container
/// `container`; pods named `ds-...` on `node`) through
/// [`replace_under_load`], until `kubectl rollout status` says it ended.
pub(crate) fn roll_daemonset(
    cluster: &Cluster,
    node: &RealNode,
    image: &str,
    (ds, container): (&str, &str),
    took_over: &str,
    lines: &str,
) -> Rolled {
    let kas = cluster.kas();
    replace_under_load(
        cluster,
        node,
        &format!("{ds}-"),
        took_over,
        lines,
        || {
            kas.kubectl_ok(&[
                "-n",
                "kube-system",
                "set",
                "image",
                &format!("daemonset/{ds}"),
                &format!("{container}={image}"),
            ]);
        },
        // `rollout status` may return only once the old pod is gone (its
        // drain).
        || crate::deploy_path::rollout_status(kas, ds),
    )
}
