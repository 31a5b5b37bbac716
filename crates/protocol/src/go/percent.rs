//! Percent-escapes as Go's `net/url` reads and writes them, on top of the
//! `percent-encoding` crate: decoding that refuses a bad escape (Go's
//! `url.unescape` answers `invalid URL escape`, where the crate would keep
//! the `%` as it is), with or without `+` for a space (query or userinfo),
//! and `url.QueryEscape`'s encoding.
//!
//! kubectl's request paths keep their own Go port ([`crate::go::url`]):
//! it tells Go's path and query rules apart and names the bad escape as Go
//! does.

use std::borrow::Cow;

use percent_encoding::{percent_decode, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Where a `+` stands for a space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plus {
    /// A query (`application/x-www-form-urlencoded`, Go's
    /// `url.QueryUnescape`).
    Space,
    /// Anywhere else (userinfo, a MIME parameter): `+` is itself.
    Literal,
}

/// Whether every `%` starts an escape of two hex digits (Go's
/// `url.unescape` check; `%+1` or `%1` are refused: `u8::from_str_radix`
/// alone would take `+1`).
fn escapes_are_valid(b: &[u8]) -> bool {
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3);
            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

/// The bytes `s` escapes, `None` on a bad escape.
pub fn decode(s: &str, plus: Plus) -> Option<Cow<'_, [u8]>> {
    if !escapes_are_valid(s.as_bytes()) {
        return None;
    }
    if plus == Plus::Space && s.contains('+') {
        // `+` is replaced before decoding, so `%2B` still gives a `+`.
        let spaced = s.replace('+', " ");
        return Some(Cow::Owned(percent_decode(spaced.as_bytes()).collect()));
    }
    Some(percent_decode(s.as_bytes()).into())
}

/// As [`decode`], and the bytes must be UTF-8.
pub fn decode_utf8(s: &str, plus: Plus) -> Option<String> {
    String::from_utf8(decode(s, plus)?.into_owned()).ok()
}

/// What Go's `url.QueryEscape` leaves as it is: letters, digits and
/// `-_.~` (a space becomes `+`).
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Go's `url.QueryEscape`: upper-case hex escapes, a space as `+`.
pub fn query_escape(s: &str) -> String {
    // A space is escaped as `%20` by the set; `%` itself always is, so
    // every `%20` in the output stands for a space.
    utf8_percent_encode(s, QUERY)
        .to_string()
        .replace("%20", "+")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_escapes_are_refused() {
        for s in ["%", "%1", "a%zz", "%+1", "%-1", "%1g", "%%41", "x%"] {
            assert_eq!(decode(s, Plus::Literal), None, "{s:?}");
            assert_eq!(decode(s, Plus::Space), None, "{s:?}");
        }
    }

    #[test]
    fn plus_is_a_space_only_in_queries() {
        assert_eq!(decode_utf8("a+b%2Bc", Plus::Space).unwrap(), "a b+c");
        assert_eq!(decode_utf8("a+b%2Bc", Plus::Literal).unwrap(), "a+b+c");
        assert_eq!(
            decode_utf8("%41%62%e2%82%ac", Plus::Literal).unwrap(),
            "Ab€"
        );
        assert_eq!(decode_utf8("", Plus::Space).unwrap(), "");
        // Bytes that are not UTF-8 decode, but not to a string.
        assert_eq!(decode("%ff", Plus::Literal).unwrap().as_ref(), [0xff]);
        assert_eq!(decode_utf8("%ff", Plus::Literal), None);
        // Nothing to decode: borrowed as is.
        assert!(matches!(
            decode("plain", Plus::Space),
            Some(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn query_escape_as_go() {
        // Go: url.QueryEscape("a b/c~d*e-f_g.h:%+é") ==
        // "a+b%2Fc~d%2Ae-f_g.h%3A%25%2B%C3%A9".
        assert_eq!(
            query_escape("a b/c~d*e-f_g.h:%+é"),
            "a+b%2Fc~d%2Ae-f_g.h%3A%25%2B%C3%A9"
        );
        assert_eq!(query_escape("fd00::1"), "fd00%3A%3A1");
        assert_eq!(query_escape("%20"), "%2520");
        for s in ["a b+c", "10.1.0.0/16", "~x y%z", "é€"] {
            assert_eq!(decode_utf8(&query_escape(s), Plus::Space).unwrap(), s);
        }
    }
}
