//! Agent identifiers and routing on arbitrary text: parse/encode round trip,
//! dest_host and Registry::pick never panic, and an agent is found by each of
//! its own identifiers.
#![no_main]

use edgetunnel_protocol::anp::agent_identifiers::Identifiers;
use edgetunnel_protocol::anp::routing::{dest_host, Registry, Strategy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let host = dest_host(&s);
    assert!(s.contains(host));
    let all = [
        Strategy::DestHost,
        Strategy::DefaultRoute,
        Strategy::Default,
    ];

    let Ok(ids) = Identifiers::parse(&s) else {
        let mut r: Registry<u8> = Registry::default();
        r.insert(1, "x".into(), Identifiers::default(), 1);
        assert_eq!(r.pick(&s, &all), Some(1));
        return;
    };
    let enc = ids.encode();
    let again = Identifiers::parse(&enc).expect("encode() output must parse");
    assert_eq!(again, ids, "round trip via {enc:?}");
    assert_eq!(again.encode(), enc);

    let mut r: Registry<u8> = Registry::default();
    r.insert(1, "agent".into(), ids.clone(), 1);
    r.insert(
        2,
        "other".into(),
        Identifiers::parse("host=zz-other&cidr=10.0.0.0/8").unwrap(),
        2,
    );
    let _ = r.pick(&s, &all);
    let dest = [Strategy::DestHost];
    for h in &ids.hosts {
        let addr = format!("{h}:80");
        if dest_host(&addr) == h.as_str() {
            assert!(r.pick(&addr, &dest).is_some(), "host {h:?} not routed");
        }
    }
    for a in &ids.ipv4 {
        assert!(r.pick(&format!("{a}:80"), &dest).is_some());
    }
    for a in &ids.ipv6 {
        assert!(r.pick(&format!("[{a}]:80"), &dest).is_some());
    }
    for c in &ids.cidrs {
        let addr = match c.addr {
            std::net::IpAddr::V4(a) => format!("{a}:80"),
            std::net::IpAddr::V6(a) => format!("[{a}]:80"),
        };
        assert!(r.pick(&addr, &dest).is_some(), "cidr {c} not routed");
    }
    if ids.default_route {
        assert_eq!(r.pick("nowhere:1", &[Strategy::DefaultRoute]), Some(1));
    }
    r.set_draining(1);
    let _ = r.pick(&s, &all);
});
