//! HTTP dates as Go's `net/http` reads and writes them: `http.TimeFormat`
//! (IMF-fixdate) out, and `http.ParseTime` in, which tries IMF-fixdate,
//! RFC 850 and asctime with `time.Parse` rules (a layout space matches any
//! run of spaces, day and month names are case-insensitive, the hour may be
//! one digit, fractional seconds are accepted after the seconds, the
//! weekday is not checked against the date). Sans-I/O.

use std::time::{SystemTime, UNIX_EPOCH};

/// An instant as whole seconds since the epoch plus nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant {
    pub secs: i64,
    pub nanos: u32,
}

impl Instant {
    /// The file time truncated to seconds (what Last-Modified shows), or
    /// `None` for Go's "zero" times (unknown or exactly the epoch).
    pub fn of_mtime(t: SystemTime) -> Option<Instant> {
        let secs = match t.duration_since(UNIX_EPOCH) {
            Ok(d) if d.is_zero() => return None,
            Ok(d) => d.as_secs() as i64,
            Err(e) => {
                let d = e.duration();
                -(d.as_secs() as i64) - i64::from(d.subsec_nanos() > 0)
            }
        };
        Some(Instant { secs, nanos: 0 })
    }
}

const SHORT_DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const LONG_DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Days since 1970-01-01 to (year, month 1-12, day).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in(m: u32, y: i64) -> u32 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `Mon, 02 Jan 2006 15:04:05 GMT` (Go's `http.TimeFormat`, UTC).
pub fn format(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        SHORT_DAYS[(days + 4).rem_euclid(7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Clone, Copy)]
enum Tok {
    Lit(&'static str),
    ShortDay,
    LongDay,
    ZeroDay,
    UnderDay,
    Month,
    Year4,
    Year2,
    Hour,
    ZeroMin,
    ZeroSec,
    Zone,
}

use Tok::*;

const IMF: &[Tok] = &[
    ShortDay,
    Lit(", "),
    ZeroDay,
    Lit(" "),
    Month,
    Lit(" "),
    Year4,
    Lit(" "),
    Hour,
    Lit(":"),
    ZeroMin,
    Lit(":"),
    ZeroSec,
    Lit(" GMT"),
];
const RFC850: &[Tok] = &[
    LongDay,
    Lit(", "),
    ZeroDay,
    Lit("-"),
    Month,
    Lit("-"),
    Year2,
    Lit(" "),
    Hour,
    Lit(":"),
    ZeroMin,
    Lit(":"),
    ZeroSec,
    Lit(" "),
    Zone,
];
const ANSIC: &[Tok] = &[
    ShortDay,
    Lit(" "),
    Month,
    Lit(" "),
    UnderDay,
    Lit(" "),
    Hour,
    Lit(":"),
    ZeroMin,
    Lit(":"),
    ZeroSec,
    Lit(" "),
    Year4,
];

/// Go's `http.ParseTime`. Zone names in RFC 850 dates are taken as UTC, as
/// Go does for an abbreviation its local zone does not define.
pub fn parse(s: &str) -> Option<Instant> {
    [IMF, RFC850, ANSIC]
        .iter()
        .find_map(|layout| parse_layout(layout, s.as_bytes()))
}

fn digit(v: &[u8], i: usize) -> bool {
    v.get(i).is_some_and(u8::is_ascii_digit)
}

/// Go's `getnum`: one or two digits (exactly two when `fixed`).
fn getnum(v: &[u8], fixed: bool) -> Option<(u32, &[u8])> {
    if !digit(v, 0) {
        return None;
    }
    if !digit(v, 1) {
        if fixed {
            return None;
        }
        return Some((u32::from(v[0] - b'0'), &v[1..]));
    }
    Some((
        u32::from(v[0] - b'0') * 10 + u32::from(v[1] - b'0'),
        &v[2..],
    ))
}

/// Go's `lookup`: a case-insensitive ASCII prefix match against a table.
fn lookup<'a>(tab: &[&str], v: &'a [u8]) -> Option<(usize, &'a [u8])> {
    tab.iter().enumerate().find_map(|(i, name)| {
        let n = name.len();
        (v.len() >= n && v[..n].eq_ignore_ascii_case(name.as_bytes())).then(|| (i, &v[n..]))
    })
}

/// Go's `skip`: literal bytes, where a space matches any run of spaces.
fn skip<'a>(mut v: &'a [u8], lit: &str) -> Option<&'a [u8]> {
    let mut p = lit.as_bytes();
    while let Some(&c) = p.first() {
        if c == b' ' {
            if v.first().is_some_and(|&b| b != b' ') {
                return None;
            }
            while p.first() == Some(&b' ') {
                p = &p[1..];
            }
            while v.first() == Some(&b' ') {
                v = &v[1..];
            }
            continue;
        }
        if v.first() != Some(&c) {
            return None;
        }
        p = &p[1..];
        v = &v[1..];
    }
    Some(v)
}

/// Go's `atoi` on a short field: optional sign, then only digits.
fn atoi(s: &[u8]) -> Option<i64> {
    let (neg, d) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if d.is_empty() || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: i64 = std::str::from_utf8(d).ok()?.parse().ok()?;
    Some(if neg { -n } else { n })
}

/// Go's `parseSignedOffset`: the length of `+hh`/`-hh...` or 0.
fn signed_offset_len(v: &[u8]) -> usize {
    if !matches!(v.first(), Some(b'+' | b'-')) {
        return 0;
    }
    let digits = v[1..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return 0;
    }
    // leadingInt overflows past 2^63; anything that long is > 24h anyway.
    match std::str::from_utf8(&v[1..1 + digits])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(x) if x <= 24 * 3600 => 1 + digits,
        _ => 0,
    }
}

/// Go's `parseTimeZone` (plus the `UTC` special case of `time.Parse`).
fn zone_len(v: &[u8]) -> Option<usize> {
    if v.starts_with(b"UTC") {
        return Some(3);
    }
    if v.len() < 3 {
        return None;
    }
    if v.starts_with(b"ChST") || v.starts_with(b"MeST") {
        return Some(4);
    }
    if v.starts_with(b"GMT") {
        return Some(3 + signed_offset_len(&v[3..]));
    }
    if matches!(v[0], b'+' | b'-') {
        let n = signed_offset_len(v);
        return (n > 0).then_some(n);
    }
    let upper = v
        .iter()
        .take(6)
        .take_while(|b| b.is_ascii_uppercase())
        .count();
    match upper {
        5 if v[4] == b'T' => Some(5),
        4 if v[3] == b'T' || v.starts_with(b"WITA") => Some(4),
        3 => Some(3),
        _ => None,
    }
}

fn parse_layout(layout: &[Tok], mut v: &[u8]) -> Option<Instant> {
    let (mut year, mut month, mut day) = (0i64, 0u32, 0u32);
    let (mut hour, mut min, mut sec, mut nanos) = (0u32, 0u32, 0u32, 0u32);
    for tok in layout {
        match *tok {
            Lit(l) => v = skip(v, l)?,
            ShortDay => v = lookup(&SHORT_DAYS, v)?.1,
            LongDay => v = lookup(&LONG_DAYS, v)?.1,
            Month => {
                let (i, rest) = lookup(&MONTHS, v)?;
                month = i as u32 + 1;
                v = rest;
            }
            ZeroDay | UnderDay => {
                if matches!(tok, UnderDay) && v.first() == Some(&b' ') {
                    v = &v[1..];
                }
                let (d, rest) = getnum(v, matches!(tok, ZeroDay))?;
                day = d;
                v = rest;
            }
            Year4 => {
                if v.len() < 4 || !digit(v, 0) {
                    return None;
                }
                year = atoi(&v[..4])?;
                v = &v[4..];
            }
            Year2 => {
                if v.len() < 2 {
                    return None;
                }
                let y = atoi(&v[..2])?;
                year = if y >= 69 { y + 1900 } else { y + 2000 };
                v = &v[2..];
            }
            Hour => {
                let (h, rest) = getnum(v, false)?;
                if h >= 24 {
                    return None;
                }
                hour = h;
                v = rest;
            }
            ZeroMin => {
                let (m, rest) = getnum(v, true)?;
                if m >= 60 {
                    return None;
                }
                min = m;
                v = rest;
            }
            ZeroSec => {
                let (s, rest) = getnum(v, true)?;
                if s >= 60 {
                    return None;
                }
                sec = s;
                v = rest;
                if v.len() >= 2 && matches!(v[0], b'.' | b',') && digit(v, 1) {
                    let n = 1 + v[1..].iter().take_while(|b| b.is_ascii_digit()).count();
                    let mut ns: u64 = 0;
                    for i in 1..10 {
                        let d = if i < n {
                            v.get(i).map_or(0, |b| b - b'0')
                        } else {
                            0
                        };
                        ns = ns * 10 + u64::from(d);
                    }
                    nanos = ns as u32;
                    v = &v[n..];
                }
            }
            Zone => v = &v[zone_len(v)?..],
        }
    }
    if !v.is_empty() || day < 1 || day > days_in(month, year) {
        return None;
    }
    let secs = days_from_civil(year, month, day) * 86_400
        + i64::from(hour) * 3600
        + i64::from(min) * 60
        + i64::from(sec);
    Some(Instant { secs, nanos })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_136_214_245; // Mon, 02 Jan 2006 15:04:05 GMT

    fn at(s: &str) -> Option<i64> {
        parse(s).map(|i| i.secs)
    }

    #[test]
    fn formats_imf_fixdate() {
        assert_eq!(format(T), "Mon, 02 Jan 2006 15:04:05 GMT");
        assert_eq!(format(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(format(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    }

    #[test]
    fn parses_the_three_formats() {
        assert_eq!(at("Mon, 02 Jan 2006 15:04:05 GMT"), Some(T));
        assert_eq!(at("Monday, 02-Jan-06 15:04:05 GMT"), Some(T));
        assert_eq!(at("Monday, 02-Jan-06 15:04:05 PST"), Some(T));
        assert_eq!(at("Mon Jan  2 15:04:05 2006"), Some(T));
        assert_eq!(at("Mon Jan 2 15:04:05 2006"), Some(T));
    }

    #[test]
    fn go_leniency() {
        // Names are case-insensitive; the weekday is not checked.
        assert_eq!(at("fri, 02 JAN 2006 15:04:05 GMT"), Some(T));
        // A layout space matches a run of spaces; the hour may be one digit.
        assert_eq!(at("Mon,   02 Jan 2006 5:04:05 GMT"), Some(T - 10 * 3600));
        // Fractional seconds after the seconds.
        assert_eq!(
            parse("Mon, 02 Jan 2006 15:04:05.5 GMT"),
            Some(Instant {
                secs: T,
                nanos: 500_000_000
            })
        );
        assert_eq!(
            at("Monday, 02-Jan-69 15:04:05 GMT").map(|s| s < 0),
            Some(true)
        );
        assert_eq!(at("Monday, 02-Jan-06 15:04:05 GMT+3"), Some(T));
        assert_eq!(at("Monday, 02-Jan-06 15:04:05 UTC"), Some(T));
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "Mon, 2 Jan 2006 15:04:05 GMT",
            "Mon, 02 Jan 2006 15:04:05 UTC",
            "Mon, 02 Jan 2006 15:04:05 GMT ",
            "Mon, 30 Feb 2006 15:04:05 GMT",
            "Mon, 02 Jan 2006 24:04:05 GMT",
            "Mon, 02 Jan 2006 15:60:05 GMT",
            "Mon, 02 Jan 06 15:04:05 GMT",
            "Monday, 02-Jan-06 15:04:05 Pst",
            "Monday, 02-Jan-06 15:04:05 ABCDE",
            "Mon Jan  2 15:04:05 06",
            "Xyz, 02 Jan 2006 15:04:05 GMT",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn mtime_truncates_and_epoch_is_zero() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(5_500);
        assert_eq!(Instant::of_mtime(t), Some(Instant { secs: 5, nanos: 0 }));
        assert_eq!(Instant::of_mtime(UNIX_EPOCH), None);
    }
}
