//! The CONNECT head parser on arbitrary bytes: no panics, a sane result, and
//! the same answer from the head alone (and "need more" from any shorter
//! prefix of it); the authority check on the bytes as text: an accepted
//! authority has a port of 1..=65535 and only host characters.
#![no_main]

use edgetunnel_protocol::anp::http_connect::{self, MAX_HEAD};
use edgetunnel_protocol::anp::routing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let res = http_connect::parse(data);
    match &res {
        Ok(Some(r)) => {
            assert!(r.head_len <= data.len() && r.head_len <= MAX_HEAD);
            assert!(r.address.contains(':'), "{:?}", r.address);
            assert_eq!(http_connect::check_authority(&r.address), Ok(()));
            let _ = routing::dest_host(&r.address);
            assert_eq!(http_connect::parse(&data[..r.head_len]), res);
            assert_eq!(http_connect::parse(&data[..r.head_len - 1]), Ok(None));
        }
        Ok(None) => assert!(data.len() < MAX_HEAD),
        Err(e) => {
            let _ = http_connect::error_response(e.status(), &e.to_string());
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if http_connect::check_authority(text).is_ok() {
            let (host, port) = text.rsplit_once(':').expect("a port");
            assert!(matches!(port.parse::<u16>(), Ok(1..)), "{text:?}");
            assert!(!host.is_empty() && host.len() <= 255, "{text:?}");
            assert!(
                host.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:[]".contains(&b)),
                "{text:?}"
            );
        }
    }
});
