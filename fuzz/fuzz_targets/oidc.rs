//! The `oidc` auth-provider's parsers (protocol::kubectl::upstream::oidc): no panic on any
//! input, and deterministic answers. The id-token check, the discovery
//! document and the token endpoint's answer each get the input, and so
//! does the redirect logic as a `Location` (protocol::kubectl::upstream::oidc::redirect).
//!
//! Input: 1 byte choosing the status (even: 200, odd: 400) and whether a
//! form Content-Type is claimed (bit 1), then the bytes.
#![no_main]

use edgetunnel_protocol::kubectl::upstream::oidc::redirect::{resolve, Chain, Step};
use edgetunnel_protocol::kubectl::upstream::oidc::{
    id_token_exp, id_token_valid, parse_discovery, parse_token_response,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let (code, status) = if sel % 2 == 0 {
        (200, "200 OK")
    } else {
        (400, "400 Bad Request")
    };
    let ct = (sel & 2 != 0).then_some("application/x-www-form-urlencoded");
    let text = String::from_utf8_lossy(body);
    let v = id_token_valid(&text, 1_700_000_000.0);
    assert_eq!(v, id_token_valid(&text, 1_700_000_000.0));
    // A readable exp decides validity the same way.
    if let (Ok(valid), Some(exp)) = (&v, id_token_exp(&text)) {
        assert_eq!(*valid, 1_700_000_010.0 < exp as f64);
    }
    let d = parse_discovery(code, status, body);
    if let Ok(url) = &d {
        assert!(!url.is_empty());
    }
    assert_eq!(d, parse_discovery(code, status, body));
    let t = parse_token_response(code, status, ct, body, "sent");
    if let Ok(r) = &t {
        assert_eq!(code, 200);
        assert!(!r.refresh_token.is_empty());
    }
    assert_eq!(t, parse_token_response(code, status, ct, body, "sent"));
    // The input as a Location: resolved onto an absolute URL it stays
    // absolute; a chain follows it or says why not, deterministically.
    let base = "https://idp.example:8443/a/b?x=1";
    if let Ok(u) = resolve(base, &text) {
        assert!(u.contains("://"), "{u}");
    }
    let step = |status| Chain::new("POST", base).next("POST", base, status, Some(&text));
    let s = step(302);
    assert_eq!(s, step(302));
    if let Step::Follow(h) = &s {
        assert_eq!(h.method, "GET");
        assert!(!h.body);
    }
    if let Step::Follow(h) = step(307) {
        assert_eq!(h.method, "POST");
        assert!(h.body);
    }
});
