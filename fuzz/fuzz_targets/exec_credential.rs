//! An exec credential plugin's stdout, checked as client-go checks it:
//! no panic on any input; an accepted credential has a token or a
//! certificate/key pair (both halves), and parsing is deterministic.
//!
//! Input: 1 byte choosing the configured version (even: v1, odd: v1beta1),
//! then the plugin's stdout.
#![no_main]

use edgetunnel_protocol::kubectl::upstream::exec_credential::{parse, V1, V1BETA1};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&v, out)) = data.split_first() else {
        return;
    };
    let version = if v % 2 == 0 { V1 } else { V1BETA1 };
    let r = parse(version, out);
    if let Ok(c) = &r {
        assert!(c.token.is_some() || c.client_cert.is_some());
        if let Some((cert, key)) = &c.client_cert {
            assert!(!cert.is_empty() && !key.is_empty());
        }
    }
    assert_eq!(r, parse(version, out));
});
