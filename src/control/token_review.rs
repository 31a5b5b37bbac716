//! Agent authentication by ServiceAccount token, as ANP's server does it
//! (`validateAuthToken` in pkg/server/server.go): the agent presents
//! `authorization: Bearer <token>` on its Connect stream; the server sends
//! a TokenReview with the audience from `--authentication-audience`, and
//! accepts only an authenticated `system:serviceaccount:<ns>:<name>` user
//! whose namespace and name are `--agent-namespace` and
//! `--agent-service-account`.
//!
//! The data plane never talks to Kubernetes: it sends a [`ReviewRequest`]
//! to the control thread and awaits the answer on a oneshot channel. The
//! control thread remembers verdicts, asks once for a token that several
//! Connects present at the same time, and paces what it sends
//! ([`super::review_cache`]). What is paced is bounded: reviews wait for
//! their turn in a queue of at most what the pacer sends while the data
//! plane waits for an answer ([`REVIEW_WAIT`]), past which a review is
//! refused at once; a turn goes to the oldest review somebody still waits
//! for, and one whose Connects all gave up (the agent left, or was shed) is
//! dropped without being sent: ANP ends a review with the Connect stream's
//! context (issue 39, finding 7). So a flood of Connects that end costs no
//! turns, and an agent's review waits only behind reviews that are wanted,
//! which the handshake caps bound.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::{mpsc, oneshot};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};

use crate::metrics::ReviewCounters;

use super::review_cache::{key_of, CacheConfig, Pacer, ReviewCache, TokenKey, Verdict};

/// How long the data plane waits for a verdict; no review waits longer
/// than this for its turn.
pub const REVIEW_WAIT: Duration = Duration::from_secs(15);

/// Who may connect as an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAuthSpec {
    pub audience: String,
    pub namespace: String,
    pub service_account: String,
    pub limits: ReviewLimits,
}

/// How verdicts are remembered and reviews paced ([`super::review_cache`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewLimits {
    /// How long an acceptance is believed (0: review every Connect).
    pub accepted_ttl: Duration,
    /// Reviews per second at most (0: no limit), bursts of `burst`.
    pub qps: u32,
    pub burst: u32,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        ReviewLimits {
            accepted_ttl: super::review_cache::DEFAULT_ACCEPTED_TTL,
            qps: 500,
            burst: 1000,
        }
    }
}

/// One token to review, with where the verdict goes.
pub struct ReviewRequest {
    pub token: String,
    pub reply: oneshot::Sender<Result<String, String>>,
}

/// The data plane's end: send requests here.
pub type Reviewer = mpsc::UnboundedSender<ReviewRequest>;

/// The control thread's end, handed over once through the control spec.
#[derive(Clone)]
pub struct ReviewQueue {
    pub spec: AgentAuthSpec,
    /// Where the answers are counted (the server's metrics).
    pub counters: ReviewCounters,
    rx: Arc<Mutex<Option<mpsc::UnboundedReceiver<ReviewRequest>>>>,
}

impl std::fmt::Debug for ReviewQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewQueue")
            .field("spec", &self.spec)
            .finish()
    }
}

/// A reviewer for the data plane and the queue for the control thread.
pub fn channel(spec: AgentAuthSpec) -> (Reviewer, ReviewQueue) {
    let (tx, rx) = mpsc::unbounded();
    let queue = ReviewQueue {
        spec,
        counters: ReviewCounters::default(),
        rx: Arc::new(Mutex::new(Some(rx))),
    };
    (tx, queue)
}

/// The Connect request's token, as ANP reads it: exactly one
/// `authorization` value, with the `Bearer ` prefix.
pub fn bearer_token<'a>(values: &[&'a str]) -> Result<&'a str, String> {
    match values {
        [] => Err("Authentication context was not found in metadata".to_string()),
        [one] => one
            .strip_prefix("Bearer ")
            .ok_or_else(|| "received token does not have \"Bearer \" prefix".to_string()),
        more => Err(format!("too many ({}) tokens are received", more.len())),
    }
}

/// The TokenReview the server sends for `token`.
pub fn review_for(token: &str, spec: &AgentAuthSpec) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: Some(vec![spec.audience.clone()]),
        },
        ..Default::default()
    }
}

/// ANP's verdict on a TokenReview's status: the username, or why not.
///
/// One check more than ANP's (issue 39, finding 10): an authenticator that
/// names the audiences it found the token valid for
/// (`status.audiences`, the intersection of the token's and the review's)
/// must name ours. Kubernetes asks this of a client that sets
/// `spec.audiences` (the TokenReviewStatus documentation); an empty list
/// (an authenticator that is not audience-aware) is taken as ANP takes it.
pub fn judge(status: Option<&TokenReviewStatus>, spec: &AgentAuthSpec) -> Result<String, String> {
    let empty = TokenReviewStatus::default();
    let status = status.unwrap_or(&empty);
    if let Some(e) = status.error.as_deref().filter(|e| !e.is_empty()) {
        return Err(format!("lookup failed: {e}"));
    }
    if status.authenticated != Some(true) {
        return Err("lookup failed: service account jwt not valid".to_string());
    }
    if let Some(found) = status.audiences.as_deref().filter(|a| !a.is_empty()) {
        if !found.contains(&spec.audience) {
            return Err(format!(
                "lookup failed: token valid for audiences {found:?}, not {:?}",
                spec.audience
            ));
        }
    }
    let username = status
        .user
        .as_ref()
        .and_then(|u| u.username.clone())
        .unwrap_or_default();
    let parts: Vec<&str> = username.split(':').collect();
    let [system, kind, ns, sa] = parts.as_slice() else {
        return Err("lookup failed: unexpected username format".to_string());
    };
    if *system != "system" || *kind != "serviceaccount" {
        return Err("lookup failed: username returned is not a service account".to_string());
    }
    if *ns != spec.namespace {
        return Err(format!(
            "lookup failed: incoming request from {ns:?} namespace. Expected {:?}",
            spec.namespace
        ));
    }
    if *sa != spec.service_account {
        return Err(format!(
            "lookup failed: incoming request from {sa:?} service account. Expected {:?}",
            spec.service_account
        ));
    }
    Ok(username)
}

type Reply = oneshot::Sender<Result<String, String>>;

/// Runs on the control thread: answers every review request, from memory
/// when it can, with one TokenReview per token otherwise.
pub async fn serve(client: kube::Client, queue: ReviewQueue) {
    let Some(mut rx) = queue.rx.lock().ok().and_then(|mut r| r.take()) else {
        return;
    };
    let api: kube::Api<TokenReview> = kube::Api::all(client);
    let limits = &queue.spec.limits;
    let mut cache = ReviewCache::new(CacheConfig {
        accepted_ttl: limits.accepted_ttl,
        ..Default::default()
    });
    let mut pacer = Pacer::new(f64::from(limits.qps), limits.burst);
    // Tokens under review: the token (until its review is sent) and
    // everyone waiting for the verdict.
    let mut waiting: HashMap<TokenKey, (String, Vec<Reply>)> = HashMap::new();
    // Tokens waiting for their turn, oldest first. A turn goes to the next
    // one somebody still waits for: reviews of Connects that ended cost no
    // turn, so a flood of them does not delay the others.
    let mut turns: VecDeque<TokenKey> = VecDeque::new();
    // The most reviews that wait for a turn: what the pacer sends within
    // the time a Connect waits for its verdict.
    let max_queued = if limits.qps == 0 {
        usize::MAX
    } else {
        (f64::from(limits.qps) * REVIEW_WAIT.as_secs_f64()) as usize
    };
    let (done_tx, mut done_rx) = mpsc::unbounded::<(TokenKey, String, Verdict)>();
    let live = |w: &(String, Vec<Reply>)| w.1.iter().any(|r| !r.is_canceled());
    loop {
        let turn = (!turns.is_empty()).then(|| pacer.ready_at(Instant::now()));
        tokio::select! {
            req = rx.next() => {
                let Some(req) = req else { break };
                let key = key_of(&req.token);
                if let Some(v) = cache.get(&key, Instant::now()) {
                    queue.counters.remembered.inc();
                    let _ = req.reply.send(v.into_result());
                    continue;
                }
                if let Some(w) = waiting.get_mut(&key) {
                    queue.counters.joined.inc();
                    w.1.retain(|r| !r.is_canceled());
                    w.1.push(req.reply);
                    continue;
                }
                if turns.len() >= max_queued {
                    // Those nobody waits for any more do not count.
                    let before = turns.len();
                    turns.retain(|k| {
                        let keep = waiting.get(k).is_some_and(live);
                        if !keep {
                            waiting.remove(k);
                        }
                        keep
                    });
                    queue.counters.abandoned.inc_by((before - turns.len()) as u64);
                }
                if turns.len() >= max_queued {
                    queue.counters.shed.inc();
                    let why = format!(
                        "too many token reviews waiting (--token-review-qps {}): try again later",
                        limits.qps
                    );
                    let _ = req.reply.send(Err(why));
                    continue;
                }
                waiting.insert(key, (req.token, vec![req.reply]));
                turns.push_back(key);
            }
            _ = sleep_until(turn) => {
                // The turn goes to the oldest review somebody waits for.
                while let Some(key) = turns.pop_front() {
                    let Some(w) = waiting.get_mut(&key).filter(|w| live(w)) else {
                        queue.counters.abandoned.inc();
                        waiting.remove(&key);
                        continue;
                    };
                    pacer.take(Instant::now());
                    let token = std::mem::take(&mut w.0);
                    let (api, spec, done) = (api.clone(), queue.spec.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let review = review_for(&token, &spec);
                        let verdict = match api.create(&Default::default(), &review).await {
                            Ok(r) => match judge(r.status.as_ref(), &spec) {
                                Ok(user) => Verdict::Accepted(user),
                                Err(e) => Verdict::Denied(e),
                            },
                            Err(e) => Verdict::Failed(format!("Failed to authenticate request. err:{e}")),
                        };
                        let _ = done.unbounded_send((key, token, verdict));
                    });
                    break;
                }
            }
            Some((key, token, verdict)) = done_rx.next() => {
                let c = &queue.counters;
                match &verdict {
                    Verdict::Accepted(_) => c.accepted.inc(),
                    Verdict::Denied(_) => c.denied.inc(),
                    Verdict::Failed(_) => c.failed.inc(),
                };
                cache.put(key, &token, &verdict, Instant::now());
                for reply in waiting.remove(&key).map(|w| w.1).unwrap_or_default() {
                    let _ = reply.send(verdict.clone().into_result());
                }
            }
        }
    }
}

/// Sleeps until `at`; never wakes without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Answers review requests when no Kubernetes client could be made.
pub async fn refuse_all(queue: ReviewQueue, why: String) {
    let Some(mut rx) = queue.rx.lock().ok().and_then(|mut r| r.take()) else {
        return;
    };
    while let Some(req) = rx.next().await {
        let _ = req.reply.send(Err(why.clone()));
    }
}

/// Asks the control thread to review `token` (data-plane side).
pub async fn review(reviewer: &Reviewer, token: &str) -> Result<String, String> {
    let (reply, verdict) = oneshot::channel();
    let req = ReviewRequest {
        token: token.to_string(),
        reply,
    };
    if reviewer.unbounded_send(req).is_err() {
        return Err("token review unavailable".to_string());
    }
    verdict
        .await
        .unwrap_or_else(|_| Err("token review unavailable".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn spec() -> AgentAuthSpec {
        AgentAuthSpec {
            limits: ReviewLimits::default(),
            audience: "system:konnectivity-server".into(),
            namespace: "kube-system".into(),
            service_account: "konnectivity-agent".into(),
        }
    }

    fn status(auth: bool, user: &str, error: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(auth),
            error: error.map(str::to_string),
            user: Some(UserInfo {
                username: Some(user.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn accepts_only_the_expected_service_account() {
        let ok = "system:serviceaccount:kube-system:konnectivity-agent";
        assert_eq!(judge(Some(&status(true, ok, None)), &spec()), Ok(ok.into()));
        let cases = [
            (status(false, ok, None), "jwt not valid"),
            (status(true, ok, Some("expired")), "lookup failed: expired"),
            (status(true, "alice", None), "unexpected username format"),
            (
                status(true, "system:node:n1:x", None),
                "is not a service account",
            ),
            (
                status(
                    true,
                    "system:serviceaccount:default:konnectivity-agent",
                    None,
                ),
                "from \"default\" namespace. Expected \"kube-system\"",
            ),
            (
                status(true, "system:serviceaccount:kube-system:other", None),
                "from \"other\" service account",
            ),
        ];
        for (st, want) in cases {
            let got = judge(Some(&st), &spec()).unwrap_err();
            assert!(got.contains(want), "{got} lacks {want}");
        }
        assert!(judge(None, &spec()).is_err());
    }

    /// Issue 39, finding 10: the audiences an answer names must hold ours.
    #[test]
    fn an_answer_for_another_audience_is_refused() {
        let ok = "system:serviceaccount:kube-system:konnectivity-agent";
        let with = |auds: Option<Vec<&str>>| TokenReviewStatus {
            audiences: auds.map(|a| a.into_iter().map(String::from).collect()),
            ..status(true, ok, None)
        };
        let got = judge(
            Some(&with(Some(vec!["https://kubernetes.default.svc"]))),
            &spec(),
        );
        assert!(got
            .unwrap_err()
            .contains("not \"system:konnectivity-server\""));
        let both = with(Some(vec!["api", "system:konnectivity-server"]));
        assert_eq!(judge(Some(&both), &spec()), Ok(ok.into()));
        // Not audience-aware: as ANP.
        assert_eq!(judge(Some(&with(Some(vec![]))), &spec()), Ok(ok.into()));
        assert_eq!(judge(Some(&with(None)), &spec()), Ok(ok.into()));
    }

    #[test]
    fn bearer_token_as_anp_reads_it() {
        assert_eq!(bearer_token(&["Bearer abc"]), Ok("abc"));
        assert!(bearer_token(&[]).unwrap_err().contains("not found"));
        assert!(bearer_token(&["abc"]).unwrap_err().contains("prefix"));
        assert!(bearer_token(&["Bearer a", "Bearer b"])
            .unwrap_err()
            .contains("too many (2)"));
    }

    #[test]
    fn review_body_carries_token_and_audience() {
        let r = review_for("tok", &spec());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["spec"]["token"], "tok");
        assert_eq!(v["spec"]["audiences"][0], "system:konnectivity-server");
    }
}
