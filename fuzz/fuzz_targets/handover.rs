//! The listener handover's messages on arbitrary bytes: decoding never
//! panics and stays within its bounds, a decoded message encodes to bytes
//! that decode to the same message, and a successor's plan over any offer
//! takes each offered socket at most once, inside the offer.
#![no_main]

use edgetunnel_protocol::handover::{self, Endpoint, Message, Plan, Want};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Message::decode(data) else {
        return;
    };
    let enc = m.encode();
    assert!(enc.len() <= handover::MAX_MESSAGE, "{} bytes", enc.len());
    let again = Message::decode(&enc).expect("encode() output must decode");
    assert_eq!(again, m, "round trip via {:?}", String::from_utf8_lossy(&enc));
    let Message::Offer { listeners, .. } = &m else {
        return;
    };
    assert!(listeners.len() <= handover::MAX_LISTENERS);
    let total: usize = listeners.iter().map(|l| l.sockets as usize).sum();
    assert!(total <= handover::MAX_SOCKETS);
    // Want what was offered, in reverse, plus one that matches nothing.
    let nowhere = Endpoint::Unix("/nowhere".into());
    let mut wanted: Vec<Want<'_>> = listeners
        .iter()
        .rev()
        .map(|l| Want {
            name: &l.name,
            endpoint: &l.endpoint,
        })
        .collect();
    wanted.push(Want {
        name: "x",
        endpoint: &nowhere,
    });
    let plan = Plan::new(&wanted, listeners);
    let mut used = vec![false; total];
    for (w, o, range) in &plan.take {
        assert!(*w < wanted.len() && *o < listeners.len());
        assert_eq!(range.len(), listeners[*o].sockets as usize);
        for i in range.clone() {
            assert!(!used[i], "socket {i} taken twice");
            used[i] = true;
        }
    }
    assert!(plan.bind.contains(&(wanted.len() - 1)));
    assert_eq!(plan.take.len() + plan.unused.len(), listeners.len());
    assert_eq!(handover::socket_batches(total).sum::<usize>(), total);
});
