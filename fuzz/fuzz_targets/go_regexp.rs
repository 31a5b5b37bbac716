//! kubectl proxy's filter patterns (Go regular expressions, translated to
//! the `regex` crate) and its command line (pflag syntax) on arbitrary
//! input: no panics; a pattern that parses compiles; matching arbitrary
//! bytes never panics and agrees between the byte and string entry points.
#![no_main]

use edgetunnel_protocol::kubectl::go_args;
use edgetunnel_protocol::go::regexp::{go_runes, parse, to_rust, GoRegex};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (pat, subject) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let Ok(pat) = std::str::from_utf8(pat) else {
        return;
    };
    if let Ok(node) = parse(pat) {
        let rust = to_rust(&node);
        let re = GoRegex::new(pat).unwrap_or_else(|e| panic!("{pat:?} -> {rust:?}: {e}"));
        let a = re.is_match_bytes(subject);
        let b = re.is_match(&go_runes(subject));
        assert_eq!(a, b);
    }
    // The same text as a command line.
    let args: Vec<String> = pat.split(' ').map(str::to_string).collect();
    let _ = go_args::canonical(&args);
});
