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
