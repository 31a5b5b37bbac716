//! Conditional requests as Go's `http.ServeContent` decides them
//! (`checkPreconditions`): If-Match, If-Unmodified-Since, If-None-Match,
//! If-Modified-Since and If-Range, for content without an ETag (Go's
//! FileServer sets none, so no entity tag ever matches). Sans-I/O.

use super::httpdate::{self, Instant};
use super::ranges::trim;

/// The request headers the decision reads (first value of each).
#[derive(Debug, Default, Clone, Copy)]
pub struct Conditions<'a> {
    pub method: &'a str,
    pub if_match: Option<&'a str>,
    pub if_unmodified_since: Option<&'a str>,
    pub if_none_match: Option<&'a str>,
    pub if_modified_since: Option<&'a str>,
    pub if_range: Option<&'a str>,
    pub range: Option<&'a str>,
}

/// What to answer before looking at the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a> {
    /// 412 Precondition Failed.
    PreconditionFailed,
    /// 304 Not Modified.
    NotModified,
    /// Serve, honouring this Range header (empty: whole content).
    Serve(&'a str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cond {
    None,
    True,
    False,
}

fn nonempty(v: Option<&str>) -> Option<&str> {
    v.filter(|s| !s.is_empty())
}

/// Go's `scanETag`: the leading `"..."` or `W/"..."` and the rest.
pub fn scan_etag(s: &str) -> Option<(&str, &str)> {
    let s = trim(s);
    let b = s.as_bytes();
    let start = if s.starts_with("W/") { 2 } else { 0 };
    if b.len() - start < 2 || b[start] != b'"' {
        return None;
    }
    for (i, &c) in b.iter().enumerate().skip(start + 1) {
        match c {
            0x21 | 0x23..=0x7e | 0x80..=0xff => {}
            b'"' => return Some((&s[..i + 1], &s[i + 1..])),
            _ => return None,
        }
    }
    None
}

/// If-Match / If-None-Match list walk with no ETag on our side: `*`
/// decides `star`; a list of well-formed tags (which never match) or a
/// malformed one decides `other`.
fn etag_list(v: &str, star: Cond, other: Cond) -> Cond {
    let mut rest = v;
    loop {
        rest = trim(rest);
        if rest.is_empty() {
            break;
        }
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
            continue;
        }
        if rest.starts_with('*') {
            return star;
        }
        match scan_etag(rest) {
            Some((_, r)) => rest = r,
            None => break,
        }
    }
    other
}

fn get_or_head(m: &str) -> bool {
    m == "GET" || m == "HEAD"
}

/// Go's `checkIfModifiedSince` (also used alone for directories).
pub fn if_modified_since(method: &str, ims: Option<&str>, mtime: Option<Instant>) -> bool {
    let (Some(ims), Some(mt)) = (nonempty(ims), mtime) else {
        return false;
    };
    if !get_or_head(method) {
        return false;
    }
    // true: not modified since.
    httpdate::parse(ims).is_some_and(|t| mt <= t)
}

/// Go's `checkPreconditions`; `mtime` is `None` for a zero/epoch time.
pub fn decide<'a>(c: &Conditions<'a>, mtime: Option<Instant>) -> Decision<'a> {
    let mut ch = match nonempty(c.if_match) {
        Some(v) => etag_list(v, Cond::True, Cond::False),
        None => Cond::None,
    };
    if ch == Cond::None {
        if let (Some(v), Some(mt)) = (nonempty(c.if_unmodified_since), mtime) {
            if let Some(t) = httpdate::parse(v) {
                ch = if mt <= t { Cond::True } else { Cond::False };
            }
        }
    }
    if ch == Cond::False {
        return Decision::PreconditionFailed;
    }
    match nonempty(c.if_none_match).map(|v| etag_list(v, Cond::False, Cond::True)) {
        Some(Cond::False) => {
            return if get_or_head(c.method) {
                Decision::NotModified
            } else {
                Decision::PreconditionFailed
            };
        }
        None if if_modified_since(c.method, c.if_modified_since, mtime) => {
            return Decision::NotModified;
        }
        _ => {}
    }
    let range = c.range.unwrap_or("");
    if !range.is_empty() && if_range(c, mtime) == Cond::False {
        return Decision::Serve("");
    }
    Decision::Serve(range)
}

/// Go's `checkIfRange`.
fn if_range(c: &Conditions, mtime: Option<Instant>) -> Cond {
    if !get_or_head(c.method) {
        return Cond::None;
    }
    let Some(ir) = nonempty(c.if_range) else {
        return Cond::None;
    };
    if scan_etag(ir).is_some() {
        // An entity tag never matches content without one.
        return Cond::False;
    }
    match (mtime, httpdate::parse(ir)) {
        (Some(mt), Some(t)) if t.secs == mt.secs => Cond::True,
        _ => Cond::False,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &str = "Mon, 02 Jan 2006 15:04:05 GMT";
    const MT: Option<Instant> = Some(Instant {
        secs: 1_136_214_245,
        nanos: 0,
    });

    fn get() -> Conditions<'static> {
        Conditions {
            method: "GET",
            range: Some("bytes=0-1"),
            ..Default::default()
        }
    }

    #[test]
    fn etags() {
        assert_eq!(scan_etag(r#" "a" , "b""#), Some((r#""a""#, r#" , "b""#)));
        assert_eq!(scan_etag(r#"W/"a""#), Some((r#"W/"a""#, "")));
        assert_eq!(scan_etag(r#""a b""#), None);
        assert_eq!(scan_etag(r#"""#), None);
        assert_eq!(scan_etag("x"), None);
    }

    #[test]
    fn if_match() {
        let d = |v| {
            decide(
                &Conditions {
                    if_match: Some(v),
                    ..get()
                },
                MT,
            )
        };
        assert_eq!(d("*"), Decision::Serve("bytes=0-1"));
        assert_eq!(d(r#""x""#), Decision::PreconditionFailed);
        assert_eq!(d(r#""x", *"#), Decision::Serve("bytes=0-1"));
        assert_eq!(d("garbage"), Decision::PreconditionFailed);
        assert_eq!(d(" , "), Decision::PreconditionFailed);
    }

    #[test]
    fn if_unmodified_since() {
        let d = |v| {
            decide(
                &Conditions {
                    if_unmodified_since: Some(v),
                    ..get()
                },
                MT,
            )
        };
        assert_eq!(d(DATE), Decision::Serve("bytes=0-1"));
        assert_eq!(
            d("Mon, 02 Jan 2006 15:04:04 GMT"),
            Decision::PreconditionFailed
        );
        assert_eq!(d("not a date"), Decision::Serve("bytes=0-1"));
        // If-Match, when present, wins.
        let c = Conditions {
            if_match: Some("*"),
            if_unmodified_since: Some("Mon, 02 Jan 2000 15:04:04 GMT"),
            ..get()
        };
        assert_eq!(decide(&c, MT), Decision::Serve("bytes=0-1"));
    }

    #[test]
    fn if_none_match_and_modified_since() {
        let inm = |v, m| {
            decide(
                &Conditions {
                    if_none_match: Some(v),
                    method: m,
                    ..get()
                },
                MT,
            )
        };
        assert_eq!(inm("*", "GET"), Decision::NotModified);
        assert_eq!(inm("*", "POST"), Decision::PreconditionFailed);
        assert_eq!(inm(r#""x""#, "GET"), Decision::Serve("bytes=0-1"));
        // A present If-None-Match makes If-Modified-Since irrelevant.
        let both = Conditions {
            if_none_match: Some(r#""x""#),
            if_modified_since: Some(DATE),
            ..get()
        };
        assert_eq!(decide(&both, MT), Decision::Serve("bytes=0-1"));
        let ims = |v, m| {
            decide(
                &Conditions {
                    if_modified_since: Some(v),
                    method: m,
                    ..get()
                },
                MT,
            )
        };
        assert_eq!(ims(DATE, "GET"), Decision::NotModified);
        assert_eq!(
            ims("Mon Jan  2 15:04:05 2006", "HEAD"),
            Decision::NotModified
        );
        assert_eq!(ims(DATE, "POST"), Decision::Serve("bytes=0-1"));
        assert_eq!(
            ims("Mon, 02 Jan 2006 15:04:04 GMT", "GET"),
            Decision::Serve("bytes=0-1")
        );
        // Unknown modification time: no 304.
        let c = Conditions {
            if_modified_since: Some(DATE),
            ..get()
        };
        assert_eq!(decide(&c, None), Decision::Serve("bytes=0-1"));
    }

    #[test]
    fn if_range() {
        let ir = |v| {
            decide(
                &Conditions {
                    if_range: Some(v),
                    ..get()
                },
                MT,
            )
        };
        assert_eq!(ir(DATE), Decision::Serve("bytes=0-1"));
        assert_eq!(
            ir("Monday, 02-Jan-06 15:04:05 GMT"),
            Decision::Serve("bytes=0-1")
        );
        assert_eq!(ir("Mon, 02 Jan 2006 15:04:06 GMT"), Decision::Serve(""));
        assert_eq!(ir(r#""etag""#), Decision::Serve(""));
        assert_eq!(ir("junk"), Decision::Serve(""));
        let post = Conditions {
            if_range: Some("junk"),
            method: "POST",
            ..get()
        };
        assert_eq!(decide(&post, MT), Decision::Serve("bytes=0-1"));
    }
}
