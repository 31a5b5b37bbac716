//! Several connections ("links") of one edgetunnel agent to one server, one
//! per server worker (sans-I/O): the metadata that negotiates them and the
//! rule deciding which links a server accepts.
//!
//! An edgetunnel agent names itself on every connection with a random
//! *instance* token ([`LINK_HEADER`]). A server that knows links answers
//! with its worker count and the worker that accepted this connection
//! ([`WORKERS_HEADER`], [`WORKER_HEADER`]); ANP's Go agents send no token
//! and get neither header (they ignore unknown metadata anyway), and ANP's
//! Go server ignores the token: with Go on either side nothing changes.
//!
//! Knowing the worker count, the agent opens secondary links marked with
//! the server ID they are meant for ([`LINK_OF_HEADER`]). The kernel's
//! `SO_REUSEPORT` hash places each on a worker; one that lands on a worker
//! already linked to this instance is refused with `ALREADY_EXISTS` and the
//! agent tries again (a new source port, a new hash), a bounded number of
//! times ([`STEER_ATTEMPTS`]). Secondary links pass the same checks as the
//! first (token, token review, `--bind-agent-identity`).

use thiserror::Error;

/// Request metadata: the agent's instance token (every link).
pub const LINK_HEADER: &str = "x-edgetunnel-link";
/// Request metadata: this is a secondary link for the server with this ID.
pub const LINK_OF_HEADER: &str = "x-edgetunnel-link-of";
/// Response metadata: the server's worker count.
pub const WORKERS_HEADER: &str = "x-edgetunnel-workers";
/// Response metadata: the worker that holds this link.
pub const WORKER_HEADER: &str = "x-edgetunnel-worker";

/// Longest instance token accepted.
pub const MAX_INSTANCE_LEN: usize = 64;
/// Most links an agent keeps to one server.
pub const MAX_LINKS: usize = 64;
/// Connection attempts one secondary link may spend landing on a worker
/// not yet linked (with 2 workers each attempt succeeds with p = 1/2).
pub const STEER_ATTEMPTS: u32 = 16;

/// What a connection said about its place among its agent's links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRequest {
    /// The agent process's instance token.
    pub instance: String,
    /// For a secondary link: the server ID it is meant for.
    pub secondary_of: Option<String>,
}

/// Why a link is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LinkError {
    #[error("bad {LINK_HEADER} token (1 to {MAX_INSTANCE_LEN} of [A-Za-z0-9_-])")]
    BadInstance,
    #[error("{LINK_OF_HEADER} without {LINK_HEADER}")]
    SecondaryWithoutInstance,
    #[error("secondary link for server {0:?} reached another server")]
    WrongServer(String),
    #[error("secondary link before any link of this agent instance")]
    NoPrimary,
    #[error("worker {0} already holds a link of this agent instance")]
    WorkerTaken(usize),
}

impl LinkError {
    /// The gRPC status the refusal is sent with: `ALREADY_EXISTS` tells the
    /// agent to try again for another worker; anything else ends the link.
    pub fn grpc_code(&self) -> u32 {
        match self {
            LinkError::WorkerTaken(_) => 6, // ALREADY_EXISTS
            LinkError::WrongServer(_) | LinkError::NoPrimary => 9, // FAILED_PRECONDITION
            _ => 3,                         // INVALID_ARGUMENT
        }
    }
}

/// Reads the link metadata of a Connect request (`None`: a peer that does
/// not speak links, e.g. ANP's Go agent).
pub fn parse_request(
    instance: Option<&str>,
    secondary_of: Option<&str>,
) -> Result<Option<LinkRequest>, LinkError> {
    let Some(instance) = instance else {
        return match secondary_of {
            Some(_) => Err(LinkError::SecondaryWithoutInstance),
            None => Ok(None),
        };
    };
    let ok = !instance.is_empty()
        && instance.len() <= MAX_INSTANCE_LEN
        && instance
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        return Err(LinkError::BadInstance);
    }
    Ok(Some(LinkRequest {
        instance: instance.to_string(),
        secondary_of: secondary_of.map(str::to_string),
    }))
}

/// Whether a link may join on `worker` of the server `server_id`, given the
/// workers already holding links of the same agent ID and instance. A first
/// (primary) link is always accepted, as any agent connection is.
pub fn admit(
    req: &LinkRequest,
    server_id: &str,
    worker: usize,
    linked_workers: &[usize],
) -> Result<(), LinkError> {
    let Some(of) = &req.secondary_of else {
        return Ok(());
    };
    if of != server_id {
        return Err(LinkError::WrongServer(of.clone()));
    }
    if linked_workers.is_empty() {
        return Err(LinkError::NoPrimary);
    }
    if linked_workers.contains(&worker) {
        return Err(LinkError::WorkerTaken(worker));
    }
    Ok(())
}

/// The worker count and this link's worker from a server's answer, when it
/// speaks links and the values make sense.
pub fn parse_answer(workers: Option<&str>, worker: Option<&str>) -> Option<(usize, usize)> {
    let n: usize = workers?.trim().parse().ok()?;
    let i: usize = worker?.trim().parse().ok()?;
    ((1..=4096).contains(&n) && i < n).then_some((n, i))
}

/// How many secondary links to keep to a server with `workers` workers,
/// within the agent's `max_links` (1 turns links off).
pub fn secondaries_wanted(workers: usize, max_links: usize) -> usize {
    workers.min(max_links).min(MAX_LINKS).saturating_sub(1)
}

/// A fresh instance token: 16 hex digits from `seed` bits.
pub fn instance_token(seed: u64) -> String {
    format!("{seed:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secondary(of: &str) -> LinkRequest {
        LinkRequest {
            instance: "abc".into(),
            secondary_of: Some(of.into()),
        }
    }

    #[test]
    fn go_peers_send_nothing() {
        assert_eq!(parse_request(None, None), Ok(None));
        assert_eq!(
            parse_request(None, Some("s1")),
            Err(LinkError::SecondaryWithoutInstance)
        );
    }

    #[test]
    fn instance_tokens_are_checked() {
        assert!(parse_request(Some("0123abcd-_"), None).unwrap().is_some());
        for bad in ["", "a b", "é", &"a".repeat(65)] {
            assert_eq!(parse_request(Some(bad), None), Err(LinkError::BadInstance));
        }
        let t = instance_token(0xdead_beef);
        assert_eq!(t.len(), 16);
        assert!(parse_request(Some(&t), None).is_ok());
    }

    #[test]
    fn primary_always_admitted() {
        let p = parse_request(Some("abc"), None).unwrap().unwrap();
        assert_eq!(admit(&p, "s1", 0, &[0, 1]), Ok(()));
    }

    #[test]
    fn secondary_needs_same_server_a_primary_and_a_free_worker() {
        assert_eq!(
            admit(&secondary("s2"), "s1", 1, &[0]),
            Err(LinkError::WrongServer("s2".into()))
        );
        assert_eq!(
            admit(&secondary("s1"), "s1", 1, &[]),
            Err(LinkError::NoPrimary)
        );
        let taken = admit(&secondary("s1"), "s1", 0, &[0]);
        assert_eq!(taken, Err(LinkError::WorkerTaken(0)));
        assert_eq!(taken.unwrap_err().grpc_code(), 6);
        assert_eq!(admit(&secondary("s1"), "s1", 1, &[0]), Ok(()));
    }

    #[test]
    fn answers() {
        assert_eq!(parse_answer(Some("2"), Some("1")), Some((2, 1)));
        assert_eq!(parse_answer(Some("2"), Some("2")), None);
        assert_eq!(parse_answer(Some("0"), Some("0")), None);
        assert_eq!(parse_answer(None, Some("0")), None);
        assert_eq!(parse_answer(Some("x"), Some("0")), None);
        assert_eq!(secondaries_wanted(4, 16), 3);
        assert_eq!(secondaries_wanted(4, 1), 0);
        assert_eq!(secondaries_wanted(1, 16), 0);
    }
}
