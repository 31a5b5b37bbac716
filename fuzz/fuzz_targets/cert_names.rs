//! Agent identity binding on arbitrary certificates and claims: the input is
//! a 2-byte little-endian length, that many bytes of DER certificate, then
//! `agent-id\nidentifiers` text. `CertNames::from_der` and `check` never
//! panic; what `check` admits is named by the certificate; `Holders` keeps
//! one key per agent ID.
#![no_main]

use edgetunnel_protocol::anp::agent_identity::{check, CertNames, Holders};
use edgetunnel_protocol::anp::agent_identifiers::Identifiers;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (der, claim) = rest.split_at(len);
    let text = String::from_utf8_lossy(claim);
    let (agent_id, query) = text.split_once('\n').unwrap_or((&text, ""));

    let Ok(names) = CertNames::from_der(der) else {
        return;
    };
    let named: Vec<String> = names.names().map(str::to_ascii_lowercase).collect();
    assert!(named.iter().all(|n| !n.is_empty() && !n.starts_with("*.")));
    let Ok(ids) = Identifiers::parse(query) else {
        return;
    };
    let bare = |n: &str| n.trim_end_matches('.').to_ascii_lowercase();
    let is_named = |n: &str| named.iter().any(|m| bare(m) == bare(n));
    if let Err(e) = check(&names, agent_id, &ids) {
        assert!(!e.to_string().is_empty());
        assert!(!e.reason().is_empty());
    } else {
        assert!(names.client_auth);
        assert!(is_named(agent_id), "{agent_id:?} admitted, names {named:?}");
        for h in &ids.hosts {
            assert!(is_named(h), "host {h:?} admitted, names {named:?}");
        }
        let ips: Vec<std::net::IpAddr> = names
            .ips
            .iter()
            .map(|a| match a {
                std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(*a, Into::into),
                v4 => *v4,
            })
            .collect();
        for a in ids.ipv4.iter().map(|a| (*a).into()).chain(ids.ipv6.iter().map(|a| (*a).into())) {
            let a: std::net::IpAddr = a;
            let a = match a {
                std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, Into::into),
                v4 => v4,
            };
            assert!(ips.contains(&a), "{a} admitted, SANs {ips:?}");
        }
        for c in &ids.cidrs {
            assert!(ips.iter().any(|a| c.contains(*a)), "cidr {c} admitted, SANs {ips:?}");
        }
        assert!(!ids.default_route);
    }

    let mut h = Holders::default();
    h.claim(agent_id, &names.spki).expect("first claim");
    h.claim(agent_id, &names.spki).expect("same key");
    let mut other = names.spki.clone();
    other.push(0);
    assert!(h.claim(agent_id, &other).is_err());
    h.release(agent_id, &other);
    h.release(agent_id, &names.spki);
    assert!(h.claim(agent_id, &other).is_err());
    h.release(agent_id, &names.spki);
    assert!(h.is_empty());
});
