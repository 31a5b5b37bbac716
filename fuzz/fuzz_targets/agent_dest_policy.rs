//! The agent's destination policy on arbitrary text: entries parse or fail
//! without panicking, a parsed entry prints as text that parses back to
//! itself, and the decision for any address never panics, refuses what a
//! deny entry matches and allows nothing outside a given allow list.
#![no_main]

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use edgetunnel_protocol::anp::agent_dest_policy::{canonical, parse_list, Entry, Policy, Refusal};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first 18 bytes are an address and port to decide on; the rest
    // is the text of the entries ("allow|deny").
    let (head, text) = data.split_at(data.len().min(18));
    let mut raw = [0u8; 18];
    raw[..head.len()].copy_from_slice(head);
    let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(&raw[..16]).unwrap());
    let port = u16::from_be_bytes([raw[16], raw[17]]);
    let text = String::from_utf8_lossy(text);
    let (allow, deny) = text.split_once('|').unwrap_or((&text, ""));

    for part in text.split([',', '|']) {
        if let Ok(e) = part.parse::<Entry>() {
            let shown = e.to_string();
            assert_eq!(shown.parse::<Entry>(), Ok(e), "round trip via {shown:?}");
        }
    }
    let (Ok(allow), Ok(deny)) = (parse_list(&[allow]), parse_list(&[deny])) else {
        return;
    };
    let policy = Policy::new(allow.clone(), deny.clone());
    for ip in [IpAddr::V6(v6), canonical(IpAddr::V6(v6))] {
        let addr = SocketAddr::new(ip, port);
        let got = policy.check(addr);
        if deny.iter().any(|e| e.matches(addr)) {
            assert!(matches!(got, Err(Refusal::Denied(_))), "{addr}: {got:?}");
        }
        if got.is_ok() && !allow.is_empty() {
            assert!(allow.iter().any(|e| e.matches(addr)), "{addr} allowed");
        }
        // The mapped form decides like the IPv4 one.
        assert_eq!(got, policy.check(SocketAddr::new(canonical(ip), port)));
    }
});
