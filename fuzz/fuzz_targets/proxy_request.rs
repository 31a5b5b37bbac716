//! The proxy's request path on arbitrary bytes: head parsing, body framing,
//! Go's URL rules, routing, the filter and the upstream head. No panics,
//! bounded heads, and routing results that respect Go's invariants.
#![no_main]

use edgetunnel_protocol::kubectl::filter::{
    Filter, DEFAULT_ACCEPT_HOSTS, DEFAULT_ACCEPT_PATHS, DEFAULT_REJECT_METHODS,
    DEFAULT_REJECT_PATHS,
};
use edgetunnel_protocol::kubectl::forward;
use edgetunnel_protocol::go::url::{clean_path, RequestUrl};
use edgetunnel_protocol::http1::{self, HeadLimit};

const LIMIT: HeadLimit = HeadLimit::GO_SERVER;
const MAX_HEAD: usize = LIMIT.bytes;
use edgetunnel_protocol::kubectl::mux::{redirect_location, Mux, Route};
use edgetunnel_protocol::kubectl::upstream::impersonation::Impersonation;
use edgetunnel_protocol::kubectl::forward::UpstreamHead;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Some((head, n))) = http1::parse_request(data, LIMIT) else {
        return;
    };
    assert!(n <= data.len() && n <= MAX_HEAD);
    let framing = http1::request_framing(&head);
    let Ok(url) = RequestUrl::parse(&head.target) else {
        return;
    };
    // EscapedPath decodes back to Path; cleaning is idempotent.
    let escaped = url.escaped_path();
    if url.path != "*" {
        assert_eq!(
            edgetunnel_protocol::go::url::unescape_path(&escaped).as_deref(),
            Ok(url.path.as_str())
        );
    }
    let c = clean_path(&escaped);
    assert_eq!(clean_path(&c), c);
    for (api, stat) in [("/", None), ("/custom/", Some("/static/")), ("/api/", None)] {
        let mux = Mux {
            api_prefix: api.to_string(),
            static_prefix: stat.map(str::to_string),
        };
        match mux.route(&head.method, &head.target, &url) {
            Route::Redirect(to) => {
                let loc = redirect_location(&to);
                assert!(loc.starts_with('/'), "{loc:?}");
            }
            Route::Proxy(u) => {
                let imp = Impersonation::default();
                let up = UpstreamHead {
                    host: "127.0.0.1:1",
                    authorization: Some("Bearer t".into()),
                    impersonation: &imp,
                    forward_proxy: None,
                };
                let target = forward::upstream_target(&u, "/base", true);
                assert!(target.starts_with('/') || target == "*", "{target:?}");
                if let Ok(f) = framing {
                    let out = forward::request_head(&head, &target, f, None, &up, false, true);
                    let (again, len) = http1::parse_request(&out, LIMIT)
                        .expect("our own head parses")
                        .expect("complete");
                    assert_eq!(len, out.len());
                    assert_eq!(again.method, head.method);
                }
            }
            _ => {}
        }
    }
    let filter = Filter::new(
        DEFAULT_ACCEPT_PATHS,
        DEFAULT_REJECT_PATHS,
        DEFAULT_ACCEPT_HOSTS,
        DEFAULT_REJECT_METHODS,
    )
    .unwrap();
    let host = http1::get(&head.headers, "host").unwrap_or("");
    let _ = filter.allows(&head.method, &url.path, host);
});
