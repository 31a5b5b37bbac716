//! A sans-I/O parser for command lines of Go programs built on spf13/pflag
//! (cobra), which is what ANP's and yurt-tunnel's binaries use, with the
//! standard `flag` package's single-dash long names accepted as well.
//!
//! What it reproduces (pflag's `flag.go` `parseArgs`/`parseLongArg`/
//! `parseSingleShortArg`, its `errors.go` messages, and the value parsers
//! behind each flag type):
//!
//! - `--name=value`, `--name value`, `-name=value`, `-name value` (the last
//!   two are Go `flag` syntax; pflag would read them as shorthand clusters,
//!   so accepting them is a superset), a bool flag alone (`--flag`) means
//!   true and never takes the next argument, `--flag=false` etc.;
//! - shorthands as pflag has them (`-v 4`, `-v4`, `-v=4`), `-h`/`--help`;
//! - `--` ends the flags; arguments that are not flags are kept in order;
//! - a repeated flag: the last value wins, string slices accumulate (the
//!   first explicit value replaces the default);
//! - values: Go's `strconv.ParseBool`, `strconv.ParseInt(s, 0, 64)` (pflag's
//!   `int`: `0x1f`, `0o17`, `017`, `0b1`, `1_000`, sign), `ParseUint(s, 0,
//!   64)` (Go flag's `uint64`), `time.ParseDuration` (`1h30m`, `300ms`,
//!   `1.5s`, `-1s`, `0`), `encoding/csv` for string slices, and klog's
//!   `-v` (decimal int32), `-stderrthreshold`, `-vmodule` and
//!   `-log_backtrace_at` parsers;
//! - errors worded as pflag words them (`unknown flag: --foo`, `flag needs
//!   an argument: --mode`, `invalid argument "x" for "--server-port" flag:
//!   strconv.ParseInt: parsing "x": invalid syntax`).
//!
//! Not reproduced: Go's hexadecimal floating-point and underscore forms for
//! `float32` flags (Rust's `f32` parser decides), pflag's "did you mean"
//! hints, and the `-test.*` shorthand exception.

use std::collections::BTreeMap;
use std::fmt;

/// The Go type behind a flag, which decides how its value is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `BoolVar`: `strconv.ParseBool`; alone means true.
    Bool,
    /// `StringVar`: any text.
    String,
    /// pflag `IntVar`: `strconv.ParseInt(s, 0, 64)`.
    Int,
    /// Go flag `Uint64Var`: `strconv.ParseUint(s, 0, 64)`.
    Uint64,
    /// `Float32Var`: `strconv.ParseFloat(s, 32)`.
    Float32,
    /// `DurationVar`: `time.ParseDuration`.
    Duration,
    /// `StringSliceVar`: one CSV record per occurrence, accumulated.
    StringSlice,
    /// `StringArrayVar`: each occurrence one item, verbatim, accumulated.
    StringArray,
    /// klog's `-v`: `strconv.ParseInt(s, 10, 32)`.
    KlogLevel,
    /// klog's `-stderrthreshold`: INFO/WARNING/ERROR/FATAL or a number.
    KlogSeverity,
    /// klog's `-vmodule`: `pattern=N,...`.
    KlogModules,
    /// klog's `-log_backtrace_at`: empty or `file.go:N`.
    KlogTrace,
}

impl Kind {
    /// The type word pflag prints in usage lines.
    pub fn type_name(self) -> &'static str {
        match self {
            Kind::Bool => "",
            Kind::String => "string",
            Kind::Int => "int",
            Kind::Uint64 => "uint",
            Kind::Float32 => "float32",
            Kind::Duration => "duration",
            Kind::StringSlice => "strings",
            Kind::StringArray => "stringArray",
            Kind::KlogLevel | Kind::KlogSeverity | Kind::KlogModules | Kind::KlogTrace => "value",
        }
    }
}

/// A parsed flag value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    Str(String),
    Int(i64),
    Uint(u64),
    Float(f64),
    /// Nanoseconds, as Go's `time.Duration`.
    Duration(i64),
    List(Vec<String>),
}

/// One flag as a Go binary declares it.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    /// Another accepted spelling (klog's underscore names: yurt-tunnel
    /// registers `log_file`, ANP normalizes it to `log-file`).
    pub alias: Option<&'static str>,
    pub shorthand: Option<char>,
    pub kind: Kind,
    /// The Go default, in the flag's own syntax (`"1h"`, `"8090"`, `""`).
    pub default: &'static str,
    /// pflag's deprecation message, printed when the flag is used.
    pub deprecated: Option<&'static str>,
}

impl Spec {
    pub const fn new(name: &'static str, kind: Kind, default: &'static str) -> Spec {
        Spec {
            name,
            alias: None,
            shorthand: None,
            kind,
            default,
            deprecated: None,
        }
    }

    /// How pflag names the flag in an "invalid argument" error.
    fn display(&self) -> String {
        match self.shorthand {
            Some(c) => format!("-{c}, --{}", self.name),
            None => format!("--{}", self.name),
        }
    }
}

/// A command line that did not parse, worded as pflag words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("unknown flag: --{0}")]
    Unknown(String),
    #[error("unknown shorthand flag: {0:?} in -{1}")]
    UnknownShorthand(char, String),
    #[error("flag needs an argument: --{0}")]
    NeedsArgument(String),
    #[error("flag needs an argument: {0:?} in -{1}")]
    NeedsArgumentShort(char, String),
    #[error("invalid argument {value:?} for {flag:?} flag: {cause}")]
    Invalid {
        value: String,
        flag: String,
        cause: String,
    },
    #[error("bad flag syntax: {0}")]
    BadSyntax(String),
    /// `-h`, `-help`, `--help`: not an error for the caller, a request.
    #[error("help requested")]
    Help,
}

/// The outcome of [`parse`]: what was given, with the Go defaults behind it.
#[derive(Debug, Clone)]
pub struct Parsed {
    specs: Vec<Spec>,
    set: BTreeMap<&'static str, Value>,
    raw: BTreeMap<&'static str, String>,
    defaults: BTreeMap<&'static str, Value>,
    /// Arguments that are not flags, in order (after `--` too).
    pub positional: Vec<String>,
    /// pflag's "Flag --x has been deprecated, ..." lines, one per use.
    pub deprecations: Vec<String>,
}

impl Parsed {
    fn spec(&self, name: &str) -> &Spec {
        self.specs
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("flag {name:?} is not declared"))
    }

    /// Whether the command line gave the flag.
    pub fn is_set(&self, name: &str) -> bool {
        let _ = self.spec(name);
        self.set.contains_key(name)
    }

    /// The value given, else the Go default.
    pub fn value(&self, name: &str) -> &Value {
        let spec = self.spec(name);
        self.set
            .get(spec.name)
            .or_else(|| self.defaults.get(spec.name))
            .expect("defaults cover every flag")
    }

    /// The text last given for the flag (a slice's items joined by commas).
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.raw.get(name).map(String::as_str)
    }

    /// The value's text as a user would write it, given or default.
    pub fn text(&self, name: &str) -> String {
        match self.raw(name) {
            Some(r) => r.to_string(),
            None => self.spec(name).default.to_string(),
        }
    }

    pub fn str(&self, name: &str) -> &str {
        match self.value(name) {
            Value::Str(s) => s,
            other => panic!("{name} is not a string flag: {other:?}"),
        }
    }

    pub fn bool(&self, name: &str) -> bool {
        match self.value(name) {
            Value::Bool(b) => *b,
            other => panic!("{name} is not a bool flag: {other:?}"),
        }
    }

    pub fn int(&self, name: &str) -> i64 {
        match self.value(name) {
            Value::Int(i) => *i,
            other => panic!("{name} is not an int flag: {other:?}"),
        }
    }

    /// Nanoseconds.
    pub fn duration(&self, name: &str) -> i64 {
        match self.value(name) {
            Value::Duration(d) => *d,
            other => panic!("{name} is not a duration flag: {other:?}"),
        }
    }

    pub fn list(&self, name: &str) -> &[String] {
        match self.value(name) {
            Value::List(l) => l,
            other => panic!("{name} is not a slice flag: {other:?}"),
        }
    }
}

/// Parses `args` (without the program name) against `specs`.
///
/// Panics if a default in `specs` does not parse: the tables are ours and
/// their unit tests parse every default.
pub fn parse(specs: &[Spec], args: &[String]) -> Result<Parsed, FlagError> {
    let mut p = Parsed {
        specs: specs.to_vec(),
        set: BTreeMap::new(),
        raw: BTreeMap::new(),
        defaults: BTreeMap::new(),
        positional: Vec::new(),
        deprecations: Vec::new(),
    };
    for s in specs {
        let v = if s.kind == Kind::StringArray && s.default.is_empty() {
            // pflag's `[]`; `--flag=` given is one empty item.
            Value::List(Vec::new())
        } else {
            parse_value(s.kind, s.default)
                .unwrap_or_else(|e| panic!("default of --{} ({:?}): {e}", s.name, s.default))
        };
        p.defaults.insert(s.name, v);
    }
    let long = |name: &str| {
        specs
            .iter()
            .find(|s| s.name == name || s.alias == Some(name))
    };
    let short = |c: char| specs.iter().find(|s| s.shorthand == Some(c));
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg.len() < 2 || !arg.starts_with('-') {
            p.positional.push(arg.clone());
            continue;
        }
        if arg == "--" {
            p.positional.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            if body.starts_with('-') || body.starts_with('=') {
                return Err(FlagError::BadSyntax(arg.clone()));
            }
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            let Some(spec) = long(name) else {
                if name == "help" {
                    return Err(FlagError::Help);
                }
                return Err(FlagError::Unknown(name.to_string()));
            };
            let value = long_value(spec, inline, args, &mut i)
                .ok_or_else(|| FlagError::NeedsArgument(name.to_string()))?;
            p.assign(spec, &value)?;
            continue;
        }
        // One dash: a Go-style long name first, then pflag shorthands.
        let body = &arg[1..];
        let name = body.split('=').next().unwrap_or(body);
        if name.chars().count() > 1 {
            if let Some(spec) = long(name) {
                let inline = body.split_once('=').map(|(_, v)| v);
                let value = long_value(spec, inline, args, &mut i)
                    .ok_or_else(|| FlagError::NeedsArgument(name.to_string()))?;
                p.assign(spec, &value)?;
                continue;
            }
            if name == "help" {
                return Err(FlagError::Help);
            }
        }
        let mut shorts = body;
        while let Some(c) = shorts.chars().next() {
            let rest = &shorts[c.len_utf8()..];
            let Some(spec) = short(c) else {
                if c == 'h' {
                    return Err(FlagError::Help);
                }
                return Err(FlagError::UnknownShorthand(c, body.to_string()));
            };
            let value = if rest.len() >= 2 && rest.starts_with('=') {
                shorts = "";
                rest[1..].to_string()
            } else if spec.kind == Kind::Bool {
                shorts = rest;
                "true".to_string()
            } else if !rest.is_empty() {
                shorts = "";
                rest.to_string()
            } else if i < args.len() {
                shorts = "";
                i += 1;
                args[i - 1].clone()
            } else {
                return Err(FlagError::NeedsArgumentShort(c, body.to_string()));
            };
            p.assign(spec, &value)?;
        }
    }
    Ok(p)
}

/// The value of a long flag: inline, implied (bool), or the next argument.
fn long_value(spec: &Spec, inline: Option<&str>, args: &[String], i: &mut usize) -> Option<String> {
    if let Some(v) = inline {
        return Some(v.to_string());
    }
    if spec.kind == Kind::Bool {
        return Some("true".to_string());
    }
    let v = args.get(*i)?.clone();
    *i += 1;
    Some(v)
}

impl Parsed {
    fn assign(&mut self, spec: &Spec, text: &str) -> Result<(), FlagError> {
        let v = parse_value(spec.kind, text).map_err(|cause| FlagError::Invalid {
            value: text.to_string(),
            flag: spec.display(),
            cause,
        })?;
        match (v, self.set.get_mut(spec.name)) {
            (Value::List(more), Some(Value::List(have))) => {
                have.extend(more);
                let joined = have.join(",");
                self.raw.insert(spec.name, joined);
            }
            (v, _) => {
                self.set.insert(spec.name, v);
                self.raw.insert(spec.name, text.to_string());
            }
        }
        if let Some(msg) = spec.deprecated {
            self.deprecations
                .push(format!("Flag --{} has been deprecated, {msg}", spec.name));
        }
        Ok(())
    }
}

/// Parses `text` as a flag of `kind`; the error is Go's wording of the cause.
pub fn parse_value(kind: Kind, text: &str) -> Result<Value, String> {
    Ok(match kind {
        Kind::Bool => Value::Bool(parse_bool(text)?),
        Kind::String => Value::Str(text.to_string()),
        Kind::Int => Value::Int(parse_int(text, 0, 64)?),
        Kind::Uint64 => Value::Uint(
            // Go's flag package turns strconv errors into these two words.
            parse_uint(text, 0, 64).map_err(|e| match e {
                NumError::Syntax => "parse error".to_string(),
                NumError::Range => "value out of range".to_string(),
            })?,
        ),
        Kind::Float32 => Value::Float(parse_float32(text)?),
        Kind::Duration => Value::Duration(parse_duration(text)?),
        Kind::StringSlice => Value::List(parse_csv(text)?),
        Kind::StringArray => Value::List(vec![text.to_string()]),
        Kind::KlogLevel => Value::Int(parse_int(text, 10, 32)?),
        Kind::KlogSeverity => Value::Int(parse_severity(text)?),
        Kind::KlogModules => {
            parse_vmodule(text)?;
            Value::Str(text.to_string())
        }
        Kind::KlogTrace => {
            parse_trace_location(text)?;
            Value::Str(text.to_string())
        }
    })
}

/// `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("strconv.ParseBool: parsing {s:?}: invalid syntax")),
    }
}

/// Why a Go integer did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumError {
    Syntax,
    Range,
}

impl fmt::Display for NumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NumError::Syntax => "invalid syntax",
            NumError::Range => "value out of range",
        })
    }
}

/// `strconv.ParseUint(s, base, bits)` for base 0 (prefixes `0x`, `0o`,
/// `0b`, a leading `0` for octal, underscores between digits) or 2..=36.
pub fn parse_uint(s: &str, base: u32, bits: u32) -> Result<u64, NumError> {
    if s.is_empty() {
        return Err(NumError::Syntax);
    }
    let base0 = base == 0;
    let s0 = s;
    let b = s.as_bytes();
    let (base, digits) = if base0 {
        if b[0] == b'0' {
            match b.get(1).map(u8::to_ascii_lowercase) {
                Some(b'b') if b.len() >= 3 => (2, &s[2..]),
                Some(b'o') if b.len() >= 3 => (8, &s[2..]),
                Some(b'x') if b.len() >= 3 => (16, &s[2..]),
                _ => (8, &s[1..]),
            }
        } else {
            (10, s)
        }
    } else {
        (base, s)
    };
    let max: u64 = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let mut n: u64 = 0;
    let mut underscores = false;
    for c in digits.bytes() {
        let d = match c {
            b'_' if base0 => {
                underscores = true;
                continue;
            }
            b'0'..=b'9' => u32::from(c - b'0'),
            _ if c.is_ascii_alphabetic() => u32::from(c.to_ascii_lowercase() - b'a') + 10,
            _ => return Err(NumError::Syntax),
        };
        if d >= base {
            return Err(NumError::Syntax);
        }
        n = n
            .checked_mul(u64::from(base))
            .and_then(|n| n.checked_add(u64::from(d)))
            .filter(|n| *n <= max)
            .ok_or(NumError::Range)?;
    }
    if underscores && !underscore_ok(s0) {
        return Err(NumError::Syntax);
    }
    Ok(n)
}

/// Go's `underscoreOK`: underscores only between digits, or between a base
/// prefix and a digit.
fn underscore_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i = 1;
    }
    // '^' start, '0' digit or prefix, '_' underscore, '!' other.
    let mut saw = b'^';
    let mut hex = false;
    if b.len() >= i + 2
        && b[i] == b'0'
        && matches!(b[i + 1].to_ascii_lowercase(), b'b' | b'o' | b'x')
    {
        hex = b[i + 1].eq_ignore_ascii_case(&b'x');
        saw = b'0';
        i += 2;
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
            continue;
        }
        if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
            continue;
        }
        if saw == b'_' {
            return false;
        }
        saw = b'!';
    }
    saw != b'_'
}

/// `strconv.ParseInt(s, base, bits)`, with Go's error text.
pub fn parse_int(s: &str, base: u32, bits: u32) -> Result<i64, String> {
    parse_int_raw(s, base, bits).map_err(|e| format!("strconv.ParseInt: parsing {s:?}: {e}"))
}

fn parse_int_raw(s: &str, base: u32, bits: u32) -> Result<i64, NumError> {
    let (neg, rest) = match s.as_bytes().first() {
        None => return Err(NumError::Syntax),
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let un = parse_uint(rest, base, bits)?;
    let cutoff = 1u64 << (bits - 1);
    if !neg && un >= cutoff {
        return Err(NumError::Range);
    }
    if neg && un > cutoff {
        return Err(NumError::Range);
    }
    Ok(if neg {
        0i64.wrapping_sub_unsigned(un)
    } else {
        un as i64
    })
}

/// `strconv.ParseFloat(s, 32)` for the forms Rust's parser shares with Go.
fn parse_float32(s: &str) -> Result<f64, String> {
    s.parse::<f32>()
        .map(f64::from)
        .map_err(|_| format!("strconv.ParseFloat: parsing {s:?}: invalid syntax"))
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` or `0`,
/// units ns, us, µs, μs, ms, s, m, h; nanoseconds out.
pub fn parse_duration(orig: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {orig:?}");
    let mut s = orig;
    let mut neg = false;
    if let Some(c) = s.as_bytes().first() {
        if *c == b'-' || *c == b'+' {
            neg = *c == b'-';
            s = &s[1..];
        }
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        let c = s.as_bytes()[0];
        if !(c == b'.' || c.is_ascii_digit()) {
            return Err(invalid());
        }
        // Integer part.
        let mut v: u64 = 0;
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        for d in s[..int_len].bytes() {
            if v > LIMIT / 10 {
                return Err(invalid());
            }
            v = v * 10 + u64::from(d - b'0');
            if v > LIMIT {
                return Err(invalid());
            }
        }
        let pre = int_len > 0;
        s = &s[int_len..];
        // Fraction: digits past what fits are dropped, not an error.
        let (mut f, mut scale, mut post) = (0u64, 1f64, false);
        if let Some(rest) = s.strip_prefix('.') {
            let frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            post = frac_len > 0;
            let mut overflow = false;
            for d in rest[..frac_len].bytes() {
                if overflow {
                    continue;
                }
                if f > (LIMIT - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let y = f * 10 + u64::from(d - b'0');
                if y > LIMIT {
                    overflow = true;
                    continue;
                }
                f = y;
                scale *= 10.0;
            }
            s = &rest[frac_len..];
        }
        if !pre && !post {
            return Err(invalid());
        }
        // Unit: everything up to the next digit or dot.
        let unit_len = s
            .bytes()
            .take_while(|c| !(*c == b'.' || c.is_ascii_digit()))
            .count();
        if unit_len == 0 {
            return Err(format!("time: missing unit in duration {orig:?}"));
        }
        let u = &s[..unit_len];
        s = &s[unit_len..];
        let unit: u64 = match u {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(format!("time: unknown unit {u:?} in duration {orig:?}")),
        };
        if v > LIMIT / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        total += v;
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if neg {
        return Ok(0i64.wrapping_sub_unsigned(total));
    }
    if total > LIMIT - 1 {
        return Err(invalid());
    }
    Ok(total as i64)
}

/// One `encoding/csv` record, as pflag's string slices read their value.
fn parse_csv(s: &str) -> Result<Vec<String>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    // A newline ends the record; pflag reads only the first one.
    let line = s.split('\n').next().unwrap_or(s).trim_end_matches('\r');
    let b: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let mut field = String::new();
        if b.get(i) == Some(&'"') {
            i += 1;
            loop {
                match b.get(i) {
                    None => {
                        return Err(format!(
                            "parse error on line 1, column {}: extraneous or missing \" in quoted-field",
                            i + 1
                        ))
                    }
                    Some('"') if b.get(i + 1) == Some(&'"') => {
                        field.push('"');
                        i += 2;
                    }
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some(c) => {
                        field.push(*c);
                        i += 1;
                    }
                }
            }
            if !matches!(b.get(i), None | Some(',')) {
                return Err(format!(
                    "parse error on line 1, column {}: extraneous or missing \" in quoted-field",
                    i + 1
                ));
            }
        } else {
            while let Some(c) = b.get(i) {
                if *c == ',' {
                    break;
                }
                if *c == '"' {
                    return Err(format!(
                        "parse error on line 1, column {}: bare \" in non-quoted-field",
                        i + 1
                    ));
                }
                field.push(*c);
                i += 1;
            }
        }
        out.push(field);
        if b.get(i) == Some(&',') {
            i += 1;
            continue;
        }
        return Ok(out);
    }
}

/// klog's severity flag: a name (any case) or an int32.
fn parse_severity(s: &str) -> Result<i64, String> {
    match s.to_ascii_uppercase().as_str() {
        "INFO" => Ok(0),
        "WARNING" => Ok(1),
        "ERROR" => Ok(2),
        "FATAL" => Ok(3),
        _ => parse_int(s, 10, 32),
    }
}

/// klog's `-vmodule`: comma-separated `pattern=N`, N a non-negative int32.
fn parse_vmodule(s: &str) -> Result<(), String> {
    for pat in s.split(',').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = pat.split('=').collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() {
            return Err("syntax error: expect comma-separated list of filename=N".to_string());
        }
        let v = parse_int_raw(parts[1], 10, 32)
            .map_err(|_| "syntax error: expect comma-separated list of filename=N".to_string())?;
        if v < 0 {
            return Err("negative value for vmodule level".to_string());
        }
    }
    Ok(())
}

/// klog's `-log_backtrace_at`: empty, or `file.go:N` with N > 0.
fn parse_trace_location(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    let syntax = || "syntax error: expect file.go:234".to_string();
    let (file, line) = match s.split(':').collect::<Vec<_>>()[..] {
        [f, l] => (f, l),
        _ => return Err(syntax()),
    };
    if !file.contains('.') {
        return Err(syntax());
    }
    let v: i64 = line.parse().map_err(|_| syntax())?;
    if v <= 0 {
        return Err("negative or zero value for level".to_string());
    }
    Ok(())
}

/// Go's `Duration.String()` for messages that quote a duration (`1h0m0s`,
/// `1.5s`, `300ms`, `0s`).
pub fn format_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".to_string();
    }
    let neg = ns < 0;
    let u = ns.unsigned_abs();
    let sign = if neg { "-" } else { "" };
    if u < 1_000_000_000 {
        // Sub-second: the largest unit that keeps a non-zero integer part.
        let (unit, div) = if u < 1_000 {
            ("ns", 1u64)
        } else if u < 1_000_000 {
            ("\u{b5}s", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{sign}{}{unit}", frac(u, div));
    }
    let secs_ns = u % 60_000_000_000;
    let mins = u / 60_000_000_000;
    let s = format!("{}s", frac(secs_ns, 1_000_000_000));
    if mins == 0 {
        return format!("{sign}{s}");
    }
    let (h, m) = (mins / 60, mins % 60);
    if h == 0 {
        format!("{sign}{m}m{s}")
    } else {
        format!("{sign}{h}h{m}m{s}")
    }
}

/// `v / div` with the fraction's trailing zeros dropped.
fn frac(v: u64, div: u64) -> String {
    let (whole, rest) = (v / div, v % div);
    if rest == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[Spec] = &[
        Spec::new("mode", Kind::String, "grpc"),
        Spec::new("server-port", Kind::Int, "8090"),
        Spec::new("delete-existing-uds-file", Kind::Bool, "true"),
        Spec::new("enable-profiling", Kind::Bool, "false"),
        Spec::new("keepalive-time", Kind::Duration, "1h"),
        Spec::new("cipher-suites", Kind::StringSlice, ""),
        Spec::new("kubeconfig-qps", Kind::Float32, "0"),
        Spec {
            alias: Some("log_file_max_size"),
            ..Spec::new("log-file-max-size", Kind::Uint64, "1800")
        },
        Spec {
            shorthand: Some('v'),
            ..Spec::new("v", Kind::KlogLevel, "4")
        },
        Spec::new("stderrthreshold", Kind::KlogSeverity, "2"),
        Spec::new("vmodule", Kind::KlogModules, ""),
        Spec::new("log-backtrace-at", Kind::KlogTrace, ""),
        Spec {
            deprecated: Some("it is always on"),
            ..Spec::new("warn-on-channel-limit", Kind::Bool, "true")
        },
    ];

    fn p(args: &[&str]) -> Result<Parsed, FlagError> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(SPECS, &v)
    }

    #[test]
    fn long_forms_with_one_or_two_dashes() {
        for args in [
            &["--mode=http-connect"][..],
            &["--mode", "http-connect"],
            &["-mode=http-connect"],
            &["-mode", "http-connect"],
        ] {
            let got = p(args).unwrap();
            assert_eq!(got.str("mode"), "http-connect", "{args:?}");
            assert!(got.is_set("mode"));
            assert_eq!(got.raw("mode"), Some("http-connect"));
        }
        let none = p(&[]).unwrap();
        assert_eq!(none.str("mode"), "grpc");
        assert!(!none.is_set("mode"));
        assert_eq!(none.text("mode"), "grpc");
        // A value may start with a dash when it is a separate argument.
        assert_eq!(p(&["--mode", "-x"]).unwrap().str("mode"), "-x");
        // Empty values.
        assert_eq!(p(&["--mode="]).unwrap().str("mode"), "");
        assert_eq!(p(&["--mode", ""]).unwrap().str("mode"), "");
    }

    #[test]
    fn booleans() {
        assert!(!p(&[]).unwrap().bool("enable-profiling"));
        assert!(p(&["--enable-profiling"]).unwrap().bool("enable-profiling"));
        assert!(p(&["-enable-profiling"]).unwrap().bool("enable-profiling"));
        for t in ["true", "1", "t", "T", "TRUE", "True"] {
            assert!(p(&[&format!("--enable-profiling={t}")])
                .unwrap()
                .bool("enable-profiling"));
        }
        for f in ["false", "0", "f", "F", "FALSE", "False"] {
            assert!(!p(&[&format!("--delete-existing-uds-file={f}")])
                .unwrap()
                .bool("delete-existing-uds-file"));
        }
        // A bool never takes the next argument: "false" stays positional.
        let got = p(&["--delete-existing-uds-file", "false"]).unwrap();
        assert!(got.bool("delete-existing-uds-file"));
        assert_eq!(got.positional, vec!["false".to_string()]);
        assert_eq!(
            p(&["--enable-profiling=yes"]).unwrap_err().to_string(),
            "invalid argument \"yes\" for \"--enable-profiling\" flag: strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
    }

    #[test]
    fn shorthands_as_pflag_reads_them() {
        for args in [
            &["-v", "6"][..],
            &["-v6"],
            &["-v=6"],
            &["--v=6"],
            &["--v", "6"],
        ] {
            assert_eq!(p(args).unwrap().int("v"), 6, "{args:?}");
        }
        assert_eq!(p(&[]).unwrap().int("v"), 4);
        assert_eq!(
            p(&["-v=x"]).unwrap_err().to_string(),
            "invalid argument \"x\" for \"-v, --v\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
        );
        // klog's -v is decimal only.
        assert!(p(&["-v=0x4"]).is_err());
        assert_eq!(
            p(&["-v"]).unwrap_err().to_string(),
            "flag needs an argument: 'v' in -v"
        );
        assert_eq!(
            p(&["-x"]).unwrap_err().to_string(),
            "unknown shorthand flag: 'x' in -x"
        );
        assert_eq!(
            p(&["-foo=1"]).unwrap_err().to_string(),
            "unknown shorthand flag: 'f' in -foo=1"
        );
    }

    #[test]
    fn help_terminator_and_positionals() {
        assert_eq!(p(&["--help"]).unwrap_err(), FlagError::Help);
        assert_eq!(p(&["-h"]).unwrap_err(), FlagError::Help);
        assert_eq!(p(&["-help"]).unwrap_err(), FlagError::Help);
        let got = p(&["a", "--mode=x", "-", "--", "--mode=y", "-v"]).unwrap();
        assert_eq!(got.str("mode"), "x");
        assert_eq!(got.positional, vec!["a", "-", "--mode=y", "-v"]);
        assert_eq!(p(&[""]).unwrap().positional, vec![""]);
    }

    #[test]
    fn errors_read_like_pflag() {
        assert_eq!(
            p(&["--foo"]).unwrap_err().to_string(),
            "unknown flag: --foo"
        );
        assert_eq!(
            p(&["--foo=bar"]).unwrap_err().to_string(),
            "unknown flag: --foo"
        );
        assert_eq!(
            p(&["--mode"]).unwrap_err().to_string(),
            "flag needs an argument: --mode"
        );
        assert_eq!(
            p(&["-mode"]).unwrap_err().to_string(),
            "flag needs an argument: --mode"
        );
        assert_eq!(
            p(&["---mode=x"]).unwrap_err().to_string(),
            "bad flag syntax: ---mode=x"
        );
        assert_eq!(
            p(&["--=x"]).unwrap_err().to_string(),
            "bad flag syntax: --=x"
        );
        assert_eq!(
            p(&["--server-port=x"]).unwrap_err().to_string(),
            "invalid argument \"x\" for \"--server-port\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
        );
    }

    #[test]
    fn repeated_flags_last_wins_slices_accumulate() {
        let got = p(&["--mode=a", "--mode=b", "-mode", "c"]).unwrap();
        assert_eq!(got.str("mode"), "c");
        let got = p(&["--cipher-suites=A,B", "--cipher-suites", "C"]).unwrap();
        assert_eq!(got.list("cipher-suites"), ["A", "B", "C"]);
        assert_eq!(got.raw("cipher-suites"), Some("A,B,C"));
        assert!(p(&[]).unwrap().list("cipher-suites").is_empty());
        let got = p(&["--cipher-suites=\"a,b\",c"]).unwrap();
        assert_eq!(got.list("cipher-suites"), ["a,b", "c"]);
        assert!(p(&["--cipher-suites=a\"b"]).is_err());
        assert_eq!(
            p(&["--cipher-suites=a,,b"]).unwrap().list("cipher-suites"),
            ["a", "", "b"]
        );
    }

    #[test]
    fn aliases_and_deprecations() {
        let got = p(&["--log_file_max_size=0"]).unwrap();
        assert_eq!(got.value("log-file-max-size"), &Value::Uint(0));
        assert_eq!(
            p(&["--log-file-max-size=x"]).unwrap_err().to_string(),
            "invalid argument \"x\" for \"--log-file-max-size\" flag: parse error"
        );
        let got = p(&["--warn-on-channel-limit"]).unwrap();
        assert_eq!(
            got.deprecations,
            vec!["Flag --warn-on-channel-limit has been deprecated, it is always on"]
        );
    }

    #[test]
    fn go_integers() {
        let ok = |s: &str| parse_int(s, 0, 64).unwrap();
        assert_eq!(ok("8090"), 8090);
        assert_eq!(ok("+5"), 5);
        assert_eq!(ok("-5"), -5);
        assert_eq!(ok("0x1f"), 31);
        assert_eq!(ok("0X1F"), 31);
        assert_eq!(ok("0o17"), 15);
        assert_eq!(ok("017"), 15);
        assert_eq!(ok("0b101"), 5);
        assert_eq!(ok("1_000"), 1000);
        assert_eq!(ok("0x_1f"), 31);
        assert_eq!(ok("0_17"), 15);
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("-9223372036854775808"), i64::MIN);
        assert_eq!(ok("9223372036854775807"), i64::MAX);
        for bad in [
            "", "x", "08", "0x", "1__0", "_1", "1_", "0x_", "1.0", " 1", "1e3", "--1",
        ] {
            assert_eq!(
                parse_int(bad, 0, 64).unwrap_err(),
                format!("strconv.ParseInt: parsing {bad:?}: invalid syntax"),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_int("9223372036854775808", 0, 64).unwrap_err(),
            "strconv.ParseInt: parsing \"9223372036854775808\": value out of range"
        );
        // Base 10 (klog -v): no prefixes, no underscores, 32 bits.
        assert_eq!(parse_int("12", 10, 32).unwrap(), 12);
        assert!(parse_int("1_2", 10, 32).is_err());
        assert!(parse_int("2147483648", 10, 32).is_err());
        assert_eq!(parse_int("-2147483648", 10, 32).unwrap(), -2147483648);
        assert_eq!(parse_uint("18446744073709551615", 0, 64), Ok(u64::MAX));
        assert_eq!(
            parse_uint("18446744073709551616", 0, 64),
            Err(NumError::Range)
        );
        assert_eq!(parse_uint("-1", 0, 64), Err(NumError::Syntax));
    }

    #[test]
    fn go_durations() {
        let ok = |s: &str| parse_duration(s).unwrap();
        const S: i64 = 1_000_000_000;
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("-0"), 0);
        assert_eq!(ok("1h"), 3600 * S);
        assert_eq!(ok("1h30m"), 5400 * S);
        assert_eq!(ok("300ms"), 300_000_000);
        assert_eq!(ok("1.5s"), 1_500_000_000);
        assert_eq!(ok(".5s"), 500_000_000);
        assert_eq!(ok("1.s"), S);
        assert_eq!(ok("-1s"), -S);
        assert_eq!(ok("+2m"), 120 * S);
        assert_eq!(ok("1us"), 1_000);
        assert_eq!(ok("1\u{b5}s"), 1_000);
        assert_eq!(ok("1\u{3bc}s"), 1_000);
        assert_eq!(ok("7ns"), 7);
        assert_eq!(ok("1h1m1s1ms"), 3661 * S + 1_000_000);
        assert_eq!(ok("0.3333333333333333333h"), 1_200_000_000_000);
        assert_eq!(ok("2562047h47m16.854775807s"), i64::MAX);
        assert_eq!(ok("-2562047h47m16.854775808s"), i64::MIN);
        assert_eq!(
            parse_duration("1").unwrap_err(),
            "time: missing unit in duration \"1\""
        );
        assert_eq!(
            parse_duration("1x").unwrap_err(),
            "time: unknown unit \"x\" in duration \"1x\""
        );
        for bad in [
            "",
            "-",
            "s",
            ".s",
            "1h-1m",
            "1.2.3s",
            "2562047h47m16.854775808s",
            " 1s",
            "1 s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_duration("").unwrap_err(),
            "time: invalid duration \"\""
        );
    }

    #[test]
    fn go_duration_strings() {
        const S: i64 = 1_000_000_000;
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(3600 * S), "1h0m0s");
        assert_eq!(format_duration(90 * S), "1m30s");
        assert_eq!(format_duration(1_500_000_000), "1.5s");
        assert_eq!(format_duration(300_000_000), "300ms");
        assert_eq!(format_duration(1_500), "1.5\u{b5}s");
        assert_eq!(format_duration(-5 * S), "-5s");
    }

    #[test]
    fn klog_values() {
        assert_eq!(
            p(&["--stderrthreshold=warning"])
                .unwrap()
                .int("stderrthreshold"),
            1
        );
        assert_eq!(
            p(&["--stderrthreshold=3"]).unwrap().int("stderrthreshold"),
            3
        );
        assert!(p(&["--stderrthreshold=loud"]).is_err());
        assert!(p(&["--vmodule=server*=4,agent=2,"]).is_ok());
        assert!(p(&["--vmodule=server"]).is_err());
        assert!(p(&["--vmodule=server=-1"]).is_err());
        assert!(p(&["--log-backtrace-at=server.go:12"]).is_ok());
        assert!(p(&["--log-backtrace-at="]).is_ok());
        assert!(p(&["--log-backtrace-at=server:12"]).is_err());
        assert!(p(&["--log-backtrace-at=server.go:0"]).is_err());
        assert_eq!(
            p(&["--kubeconfig-qps=2.5"])
                .unwrap()
                .value("kubeconfig-qps"),
            &Value::Float(2.5)
        );
        assert!(p(&["--kubeconfig-qps=fast"]).is_err());
        assert_eq!(
            p(&["--keepalive-time=30s"])
                .unwrap()
                .duration("keepalive-time"),
            30_000_000_000
        );
        assert_eq!(
            p(&["--keepalive-time=30"]).unwrap_err().to_string(),
            "invalid argument \"30\" for \"--keepalive-time\" flag: time: missing unit in duration \"30\""
        );
    }
}
