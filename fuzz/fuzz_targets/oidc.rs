//! The `oidc` auth-provider's parsers (protocol::oidc): no panic on any
//! input, and deterministic answers. The id-token check, the discovery
//! document and the token endpoint's answer each get the input.
//!
//! Input: 1 byte choosing the status (even: 200, odd: 400) and whether a
//! form Content-Type is claimed (bit 1), then the bytes.
#![no_main]

use edgetunnel_protocol::oidc::{
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
});
