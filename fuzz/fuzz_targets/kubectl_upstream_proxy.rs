//! The upstream-proxy parsers: proxy URLs (kubeconfig and environment),
//! `NO_PROXY` lists, a CONNECT answer and a SOCKS5 proxy's replies. No
//! panic on any input; results are deterministic; a SOCKS5 handshake that
//! completes consumed exactly its replies.
//!
//! Input: 1 selector byte (mod 3: 0 proxy URL + NO_PROXY, 1 CONNECT
//! answer, 2 SOCKS5 replies, the next byte choosing whether credentials
//! are offered), then the text/bytes.
#![no_main]

use edgetunnel_protocol::kubectl::upstream::proxy_handshake::{parse_connect_response, Socks5Client, SocksStep};
use edgetunnel_protocol::kubectl::upstream::proxy_url::{parse_env_proxy, parse_kubeconfig_proxy, EnvProxy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    match sel % 3 {
        0 => {
            let text = String::from_utf8_lossy(rest);
            let (url, no) = text.split_once('\n').unwrap_or((&text, ""));
            assert_eq!(parse_kubeconfig_proxy(url), parse_kubeconfig_proxy(url));
            let _ = parse_env_proxy(url);
            let (url, no) = (url.to_string(), no.to_string());
            let env = EnvProxy::from_lookup(|k| match k {
                "HTTPS_PROXY" => Some(url.clone()),
                "NO_PROXY" => Some(no.clone()),
                _ => None,
            });
            for host in ["example.com", "10.1.2.3", "::1", "a.b.c", "localhost", ""] {
                let _ = env.proxy_for(true, host, 443);
            }
        }
        1 => {
            let r = parse_connect_response(rest);
            assert_eq!(r, parse_connect_response(rest));
        }
        _ => {
            let Some((&auth, replies)) = rest.split_first() else {
                return;
            };
            let user = (auth % 2 == 1).then(|| ("u".to_string(), "p".to_string()));
            let Ok((mut c, _)) = Socks5Client::new("p:1080", "h.example", 443, user) else {
                return;
            };
            for chunk in replies.chunks(3) {
                match c.feed(chunk) {
                    Ok(SocksStep::Done) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    }
});
