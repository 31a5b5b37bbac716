//! Agent link metadata (protocol::anp::agent_links) on arbitrary text: request
//! and answer headers never panic; an accepted instance token is 1 to 64 of
//! [A-Za-z0-9_-]; a parsed answer has `worker < workers <= 4096`; and a
//! registry holding the links `admit` lets in keeps at most one link of an
//! instance per worker, counts the agent once, and says it is gone exactly
//! when its last link goes.
//!
//! Input: `instance\nlink-of\nworkers\nworker\n` (an empty field: no such
//! header) then one byte per link attempt (its worker, mod 8).
#![no_main]

use edgetunnel_protocol::anp::agent_links::{
    admit, parse_answer, parse_request, secondaries_wanted, LinkError, MAX_INSTANCE_LEN,
};
use edgetunnel_protocol::anp::agent_identifiers::Identifiers;
use edgetunnel_protocol::anp::routing::Registry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(5, |b| *b == b'\n');
    // An empty (or missing) field is a header not sent.
    let mut field = || {
        parts
            .next()
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
    };
    let (instance, of, workers, worker) = (field(), field(), field(), field());
    let rest = parts.next().unwrap_or(&[]);

    if let Some((n, i)) = parse_answer(workers.as_deref(), worker.as_deref()) {
        assert!((1..=4096).contains(&n) && i < n);
        assert!(secondaries_wanted(n, 64) < n);
    }

    let req = match parse_request(instance.as_deref(), of.as_deref()) {
        Ok(Some(r)) => r,
        Ok(None) => {
            assert!(instance.is_none() && of.is_none());
            return;
        }
        Err(e) => {
            assert!(matches!(
                e,
                LinkError::BadInstance | LinkError::SecondaryWithoutInstance
            ));
            return;
        }
    };
    assert!(!req.instance.is_empty() && req.instance.len() <= MAX_INSTANCE_LEN);
    assert!(req
        .instance
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    assert_eq!(req.secondary_of, of);

    // Links of this agent instance arrive on the workers `rest` names: the
    // registry admits them as the server does.
    let server_id = "s1";
    let mut primary = req.clone();
    primary.secondary_of = None;
    let mut secondary = req.clone();
    secondary.secondary_of = Some(server_id.to_string());
    let mut reg: Registry<u64> = Registry::default();
    let mut keys = Vec::new();
    for (key, b) in rest.iter().enumerate() {
        let key = key as u64;
        let core = usize::from(b % 8);
        let linked = reg.linked_cores("a", &req.instance);
        let link = if linked.is_empty() { &primary } else { &secondary };
        match admit(link, server_id, core, &linked) {
            Ok(()) => {
                let first = reg.insert_link(
                    key,
                    "a".into(),
                    Identifiers::default(),
                    key,
                    core,
                    Some(req.instance.clone()),
                );
                assert_eq!(first, linked.is_empty());
                keys.push(key);
            }
            Err(e) => {
                assert_eq!(e, LinkError::WorkerTaken(core));
                assert!(linked.contains(&core));
            }
        }
        let cores = reg.linked_cores("a", &req.instance);
        let mut dedup = cores.clone();
        dedup.dedup();
        assert_eq!(cores, dedup, "two links of one instance on one worker");
        assert_eq!(reg.len(), usize::from(!keys.is_empty()));
        // A request of `req` itself (maybe for another server) is judged
        // without panicking.
        let _ = admit(&req, server_id, core, &cores);
    }
    while let Some(key) = keys.pop() {
        let (_, last) = reg.remove_link(key).expect("registered");
        assert_eq!(last, keys.is_empty());
    }
    assert!(reg.is_empty());
});
