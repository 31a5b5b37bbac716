//! Go's decisions, from Go's `regexp/syntax` tests (`parse_test.go`:
//! `invalidRegexps`, `onlyPerl`), the `regexp/syntax` package
//! documentation (ASCII `\d \s \w \b`, escapes) and the parser's source.

use super::*;

fn ok(p: &str) -> GoRegex {
    GoRegex::new(p).unwrap_or_else(|e| panic!("{p:?} must compile as in Go: {e}"))
}

fn m(p: &str, s: &str) -> bool {
    ok(p).is_match(s)
}

#[test]
fn go_invalid_regexps() {
    let mut invalid: Vec<String> = [
        "(",
        ")",
        "(a",
        "a)",
        "(a))",
        "(a|b|",
        "a|b|)",
        "(a|b|))",
        "(a|b",
        "a|b)",
        "(a|b))",
        "[a-z",
        "([a-z)",
        "[a-z)",
        "([a-z]))",
        "x{1001}",
        "x{9876543210}",
        "x{2,1}",
        "x{1,9876543210}",
        "(?P<name>a",
        "(?P<name>",
        "(?P<name",
        "(?P<x y>a)",
        "(?P<>a)",
        "(?<name>a",
        "(?<name>",
        "(?<name",
        "(?<x y>a)",
        "(?<>a)",
        "[a-Z]",
        "(?i)[a-Z]",
        r"\Q\E*",
        "a{100000}",
        "a{100000,}",
        "((((((((((x{2}){2}){2}){2}){2}){2}){2}){2}){2}){2})",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    invalid.push("(".repeat(1000) + &")".repeat(1000));
    invalid.push("(?:".repeat(1000) + &")*".repeat(1000));
    invalid.push("(".to_string() + &"(xx?)".repeat(1000) + "){1000}");
    invalid.push("(xx?){1000}".repeat(1000));
    for p in &invalid {
        assert!(GoRegex::new(p).is_err(), "Go rejects {p:?}");
    }
    // Rust's regex accepts these; Go does not.
    for p in [
        r"\8",
        r"\q",
        r"\e",
        r"\Z",
        r"\C",
        "(?x)a",
        "(?u)a",
        "(?R)a",
        "(?i-)a",
        "(?-)a",
        "a**",
        "a*+",
        "a+*",
        "a??*",
        "x{2}{3}",
        r"\p{greek}",
        r"\p{Grek}",
        r"\p{Letter}",
        r"\p{LC}",
        r"\pX",
        "[[:foo:]]",
        "[[:alpha:]",
        r"\p",
        r"\x{110000}",
        r"\x",
        r"\xg0",
        r"\1",
        "(?P=n)",
    ] {
        assert!(GoRegex::new(p).is_err(), "Go rejects {p:?}");
    }
}

#[test]
fn go_only_perl_and_other_valid() {
    for p in [
        "[a-b-c]",
        r"\Qabc\E",
        r"\Q*+?{[\E",
        r"\Q\\E",
        r"\Q\\\E",
        r"\Q\\\\E",
        r"\Q\\\\\E",
        "(?:a)",
        "(?P<name>a)",
        "(?<name>a)",
        "(?P<n>a)(?P<n>b)",
        "(?)",
        "(?i)",
        "(?i-s:a)",
        "a(?i)*",
        "^*",
        r"\_",
        r"\<",
        r"\ ",
        "a{,3}",
        "v{1",
        "3}",
        "{",
        "a{",
        "a{1",
        "a{1,",
        "a{01}",
        "x{1000}",
        "(?:(?:a{10}){10}){10}",
        r"\x{D800}",
        r"\p{Greek}",
        r"\p{^Greek}",
        r"\PL",
        r"\pN",
        r"\p{Any}",
        "[]a]",
        "[^]a]",
        "[a-]",
        "[-a]",
        r"[\d\W[:^alpha:]\p{Han}]",
        "()",
        "|",
        "a|",
        "(|a)",
        r"\Qab",
        r"\x41\x{42}\101\0\a\f\t\n\v\r",
    ] {
        ok(p);
    }
}

#[test]
fn perl_classes_and_boundaries_are_ascii() {
    assert!(m(r"^\w+$", "abc_09"));
    assert!(!m(r"^\w$", "é"));
    assert!(!m(r"^\d$", "\u{0661}"));
    assert!(m(r"^\D$", "\u{0661}"));
    assert!(!m(r"^\s$", "\u{0b}"));
    assert!(!m(r"^\s$", "\u{a0}"));
    assert!(m(r"^[[:space:]]$", "\u{0b}"));
    assert!(m(r"^\s$", "\u{0c}"));
    // é is no word character to Go: no boundary beside it.
    assert!(!m(r"\bé\b", "é"));
    assert!(m(r"\Bé\B", "é"));
    assert!(m(r"\ba\b", "éaé"));
    // No non-boundary anywhere in "aéa" for Go (not even inside é).
    assert!(!m(r"\B", "aéa"));
    assert!(m(r"\B", "é"));
}

#[test]
fn case_folding_as_go() {
    assert!(m("(?i)k", "\u{212A}"));
    assert!(m("(?i)K", "k"));
    assert!(m(r"(?i)^\w$", "\u{212A}"));
    assert!(m(r"(?i)^\w$", "\u{17F}"));
    assert!(!m(r"^\w$", "\u{212A}"));
    assert!(!m(r"(?i)^\W$", "\u{212A}"));
    assert!(m(r"^\W$", "\u{212A}"));
    assert!(m("(?i)^[[:upper:]]$", "q"));
    assert!(!m("^[[:upper:]]$", "q"));
    assert!(m("(?i)^[^k]$", "x"));
    assert!(!m("(?i)^[^k]$", "\u{212A}"));
    assert!(m(r"(?i)^\p{Lu}$", "a"));
    assert!(!m(r"^\p{Lu}$", "a"));
    // Flags end with their group.
    assert!(!m("^(?:(?i)a)A$", "aa"));
    assert!(m("^(?:(?i)a)A$", "AA"));
    assert!(m("^(?i:a)A$", "aA"));
}

#[test]
fn syntax_rust_reads_differently() {
    // `\<` and `\>` are literals in Go, word assertions in Rust.
    assert!(m(r"^\<a\>$", "<a>"));
    assert!(!m(r"\<a", "a"));
    // No class set operations or nested classes in Go.
    assert!(m("^[a&&b]$", "&"));
    assert!(GoRegex::new("^[a--b]$").is_err());
    assert!(m("^[--/]$", "."));
    assert!(m("^[a[b]]$", "[]"));
    assert!(m("^[a[b]]$", "a]"));
    assert!(!m("^[a[b]]$", "a"));
    // `{` that is no repetition is a literal.
    assert!(m("^a{,3}$", "a{,3}"));
    assert!(!m("^a{,3}$", "aa"));
    assert!(m("^a{01}$", "a{01}"));
    // `\b{start}` is `\b` then the literal `{start}` in Go.
    assert!(m(r"^x\b{start}$", "x{start}"));
    assert!(!m(r"^\b{start}$", "{start}"));
    // `(?)` sets no flag and is valid; `a(?i)*` repeats `a`.
    assert!(m("^(?)a$", "a"));
    assert!(m("^a(?i)*$", "aaa"));
    assert!(m("^a(?i)*$", ""));
    // Octal and hex escapes; `\Q...\E`.
    assert!(m(r"^\101\x42\x{43}$", "ABC"));
    assert!(m(r"^\12$", "\n"));
    assert!(m(r"^\Qa.b\E$", "a.b"));
    assert!(!m(r"^\Qa.b\E$", "axb"));
    assert!(m(r"^\Qa.b", "a.b"));
    // Surrogates never match.
    assert!(!m(r"\x{D800}", "\u{FFFD}"));
    // `.` and lines.
    assert!(!m("^.$", "\n"));
    assert!(m("(?s)^.$", "\n"));
    assert!(!m("^b", "a\nb"));
    assert!(m("(?m)^b$", "a\nb\nc"));
    assert!(m("(?m:^b$)", "a\nb\nc"));
    assert!(!m("a$", "a\n"));
    assert!(m("^$", ""));
    assert!(!m("[^\\x00-\\x{10FFFF}]", "a"));
}

#[test]
fn invalid_utf8_counts_byte_by_byte() {
    let r = ok("^a.c$");
    assert!(r.is_match_bytes(b"a\xffc"));
    // A truncated 4-byte sequence is three runes to Go.
    assert!(!r.is_match_bytes(b"a\xf0\x9f\x98c"));
    assert!(ok("^a.{3}c$").is_match_bytes(b"a\xf0\x9f\x98c"));
    // An encoded surrogate too.
    assert!(ok("^.{3}$").is_match_bytes(b"\xed\xa0\x80"));
    assert!(ok(r"^\x{FFFD}$").is_match_bytes(b"\xff"));
    assert!(ok(r"^\x{FFFD}$").is_match_bytes("\u{FFFD}".as_bytes()));
    assert_eq!(go_runes(b"a\xf0\x9f\x98c"), "a\u{FFFD}\u{FFFD}\u{FFFD}c");
    assert_eq!(go_runes("é".as_bytes()), "é");
}

#[test]
fn errors_worded_as_go() {
    assert_eq!(
        GoRegex::new("(").unwrap_err().to_string(),
        "error parsing regexp: missing closing ): `(`"
    );
    assert_eq!(
        GoRegex::new("a**").unwrap_err().to_string(),
        "error parsing regexp: invalid nested repetition operator: `**`"
    );
    assert_eq!(
        GoRegex::new(r"\8").unwrap_err().to_string(),
        "error parsing regexp: invalid escape sequence: `\\8`"
    );
    assert_eq!(
        GoRegex::new("x{1001}").unwrap_err().to_string(),
        "error parsing regexp: invalid repeat count: `{1001}`"
    );
    assert_eq!(
        GoRegex::new("[a").unwrap_err().to_string(),
        "error parsing regexp: missing closing ]: `[a`"
    );
}

/// How much longer `f(large)` takes than `f(small)`, where `large` is 8
/// times `small`: the least time of several tries of each, alternated, each
/// try running `f(small)` 8 times so that both take about as long (and are
/// as likely to lose the processor to another process on a shared machine).
fn growth<T: ?Sized>(small: &T, large: &T, f: &dyn Fn(&T)) -> f64 {
    // A ratio over the bound is measured again, twice at most: a busy
    // machine can slow the large input's tries (a larger working set) in
    // one round; a quadratic path is over in every round (x73 and x93 were
    // seen for the two fixed here).
    let mut least = f64::MAX;
    for _ in 0..3 {
        least = least.min(growth_once(small, large, f));
        if least < 30.0 {
            break;
        }
    }
    least
}

fn growth_once<T: ?Sized>(small: &T, large: &T, f: &dyn Fn(&T)) -> f64 {
    let (mut a, mut b) = (std::time::Duration::MAX, std::time::Duration::MAX);
    for _ in 0..7 {
        let t = std::time::Instant::now();
        for _ in 0..8 {
            f(std::hint::black_box(small));
        }
        a = a.min(t.elapsed());
        let t = std::time::Instant::now();
        f(std::hint::black_box(large));
        b = b.min(t.elapsed());
    }
    8.0 * b.as_secs_f64() / a.as_secs_f64().max(1e-9)
}

/// Parsing (and, where the `regex` crate is linear too, compiling) and
/// matching stay linear, as RE2 promises: 8 times the input costs less than
/// 30 times the time, measured here against each other in one run (a
/// quadratic path costs 64 times). Families that were quadratic: a class of
/// n items (each union re-sorted the set: 16,000 items took 3.8 s) and
/// `[` followed by `[:` with no `:]` (Go's `parseNamedClass` search at
/// every `[:`: 0.45 s for 16 KB); nesting deeper than Go's 1000 levels was
/// only refused after the whole tree was built, and walking (and dropping)
/// it overflowed the stack at 256,000 levels.
#[test]
fn time_per_byte_stays_flat() {
    type Family = (&'static str, fn(usize) -> String, bool);
    let families: [Family; 9] = [
        (
            "class",
            |n| {
                format!(
                    "[{}]",
                    (0..n)
                        .map(|i| char::from_u32(0x4e00 + 2 * i as u32).unwrap())
                        .collect::<String>()
                )
            },
            false,
        ),
        ("posix", |n| format!("[{}]", "[:a".repeat(n / 3)), true),
        (
            "nest",
            |n| format!("{}{}", "(".repeat(n / 2), ")".repeat(n / 2)),
            true,
        ),
        ("nest-ok", |n| "((a)b)".repeat(n / 6), true),
        ("fold", |n| format!("(?i){}", "k".repeat(n)), false),
        ("alt", |n| "ab|".repeat(n / 3), false),
        ("quote", |n| format!("\\Q{}", "a".repeat(n)), false),
        ("named", |n| "(?P<a>x)".repeat(n / 8), true),
        ("repeat", |n| "x{2}(y)*".repeat(n / 8), true),
    ];
    let n = 2000;
    let mut report = Vec::new();
    let mut bad = false;
    for (name, make, compile_too) in families {
        let (small, large) = (make(n), make(8 * n));
        let p = growth(small.as_str(), large.as_str(), &|s| drop(parse(s)));
        report.push(format!(
            "{name}: parsing 8x the pattern took x{p:.1} the time"
        ));
        bad |= p >= 30.0;
        if compile_too {
            let c = growth(small.as_str(), large.as_str(), &|s| drop(GoRegex::new(s)));
            report.push(format!(
                "{name}: compiling 8x the pattern took x{c:.1} the time"
            ));
            bad |= c >= 30.0;
        }
    }
    // Matching: the subject grows, the pattern stays.
    type Subject = (&'static str, fn(usize) -> Vec<u8>);
    let subjects: [Subject; 3] = [
        ("ascii", |n| b"ab".repeat(n / 2)),
        ("invalid", |n| b"a\xffb\xc3".repeat(n / 4)),
        ("nested", |n| b"/api/v1/".repeat(n / 8)),
    ];
    let patterns = [
        r"(a|b)*c",
        r"^(?i)(/api/v\d+)*x$",
        r".*.*.*=",
        r"\b(\w+\s*)+z$",
    ];
    for pat in patterns {
        let re = ok(pat);
        for (name, make) in subjects {
            let (small, large) = (make(16 * n), make(128 * n));
            let r = growth(&small[..], &large[..], &|s| {
                std::hint::black_box(re.is_match_bytes(s));
            });
            report.push(format!(
                "{pat:?} on {name}: 8x the subject took x{r:.1} the time"
            ));
            bad |= r >= 30.0;
        }
    }
    let report = report.join("\n");
    println!("{report}");
    assert!(!bad, "a cost grew faster than linearly:\n{report}");
}

#[test]
fn nesting_too_deep_is_refused_early() {
    // Go: ErrNestingDepth past 1000 levels; here refused at level 1001,
    // so neither the tree nor any walk over it goes deeper (a test thread
    // has 2 MB of stack; 256,000 levels overflowed it before).
    let deep = format!("{}{}", "(".repeat(256_000), ")".repeat(256_000));
    let e = GoRegex::new(&deep).unwrap_err();
    assert_eq!(e.code, "expression nests too deeply");
    let ok_depth = format!("{}a{}", "(".repeat(999), ")".repeat(999));
    ok(&ok_depth);
    let too = format!("{}a{}", "(".repeat(1000), ")".repeat(1000));
    assert_eq!(
        GoRegex::new(&too).unwrap_err().code,
        "expression nests too deeply"
    );
}

#[test]
fn compiled_size_is_bounded_by_gos_budget() {
    // Four `\pL{1000}` need about 160 MiB in the `regex` crate: refused with
    // Go's wording instead of growing without bound (the limit was 1 GiB).
    let big = r"\pL{1000}\pL{1000}\pL{1000}\pL{1000}";
    let e = GoRegex::new(big).unwrap_err();
    assert_eq!(e.code, "expression too large", "{e}");
    // One of them (about 40 MiB) is what Go accepts and so do we.
    let one = ok(r"^/api/\pL{1000}$");
    assert!(one.is_match(&format!("/api/{}", "ж".repeat(1000))));
    assert!(!one.is_match(&format!("/api/{}", "ж".repeat(999))));
}
