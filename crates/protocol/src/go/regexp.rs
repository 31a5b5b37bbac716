//! Go's `regexp` (RE2 syntax, `regexp.Compile`'s Perl flags) on top of the
//! `regex` crate, for kubectl proxy's filter, which is a security boundary:
//! a pattern is accepted exactly when Go accepts it and matches exactly the
//! strings Go's `MatchString` matches.
//!
//! How: [`parse`] is a port of Go's `regexp/syntax` parser (`parse.go`:
//! the `parse` loop, `parsePerlFlags`, `parseRepeat`/`repeat`/
//! `repeatIsValid`, `parseEscape`, `parseClass`, `parseNamedClass`,
//! `parseUnicodeClass`, `appendGroup`, `appendFoldedRange`), producing a
//! small tree in which every flag is already resolved: a case-insensitive
//! literal is the class of its simple case folding orbit, `\d \s \w` and
//! the POSIX classes are Go's ASCII sets (folded as Go folds them: `(?i)\w`
//! also holds U+017F and U+212A), `.` is `[^\n]` or any character, `\b`
//! is an ASCII word boundary. [`to_rust`] writes that tree in `regex`
//! syntax using only character classes, groups, counted repetition and
//! assertions, so no `regex` flag or escape semantics can differ; the one
//! option set on the `regex` side is `(?-u:\b)` for the ASCII boundary.
//!
//! Input: Go matches a string byte by byte as runes, an invalid UTF-8 byte
//! being one U+FFFD; [`go_runes`] maps bytes to that string (one U+FFFD per
//! invalid byte, not Rust's lossy per-sequence replacement) so `.`, counts
//! and anchors see what Go sees.
//!
//! Cost: parsing is linear in the pattern (a class's items are made
//! canonical once; a failed `:]` search is not repeated; nesting past Go's
//! 1000 levels is refused at the step that makes it, so no walk over the
//! tree recurses deeper), and matching is the `regex` crate's, linear in
//! the subject; `tests::time_per_byte_stays_flat` checks both. Compiling
//! is linear too but a large Unicode class (`\pL`) costs the `regex` crate
//! about 1 ms and some 40 KB each, against one instruction in Go, so the
//! compiled size is what bounds a pattern: [`COMPILED_SIZE_LIMIT`] is Go's
//! own budget for a compiled program (`regexp/syntax`'s `maxSize` is
//! `128 << 20 / instSize` instructions, 128 MiB). A pattern past it is
//! refused at start with Go's "expression too large" wording after about
//! 3 s of compiling; `\pL{1000}` (40 MiB, about 1 s) and
//! `(?:\pL{1000}){3}` still compile. Matching costs the compiled size
//! times the path's length, as Go's NFA does.
//!
//! Differences left: Unicode tables are the `regex` crate's (Unicode 16)
//! where Go 1.23 (kubectl 1.32) has Unicode 15.0 (characters assigned
//! since then differ for `\p{..}` classes); Go's "expression too large"
//! limit (3.3M instructions) is not reproduced.

use std::borrow::Cow;

use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, HirKind};

/// Go's `*syntax.Error`: `error parsing regexp: CODE: `EXPR``.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("error parsing regexp: {code}: `{expr}`")]
pub struct GoRegexError {
    pub code: &'static str,
    pub expr: String,
}

fn err<T>(code: &'static str, expr: &str) -> Result<T, GoRegexError> {
    Err(GoRegexError {
        code,
        expr: expr.to_string(),
    })
}

const INVALID_CHAR_RANGE: &str = "invalid character class range";
const INVALID_ESCAPE: &str = "invalid escape sequence";
const INVALID_NAMED_CAPTURE: &str = "invalid named capture";
const INVALID_PERL_OP: &str = "invalid or unsupported Perl syntax";
const INVALID_REPEAT_OP: &str = "invalid nested repetition operator";
const INVALID_REPEAT_SIZE: &str = "invalid repeat count";
const MISSING_BRACKET: &str = "missing closing ]";
const MISSING_PAREN: &str = "missing closing )";
const MISSING_REPEAT_ARG: &str = "missing argument to repetition operator";
const TRAILING_BACKSLASH: &str = "trailing backslash at end of expression";
const UNEXPECTED_PAREN: &str = "unexpected )";
const NESTING_DEPTH: &str = "expression nests too deeply";

const LARGE: &str = "expression too large";

/// The most memory the `regex` crate may give one compiled pattern: Go's
/// budget for a compiled program (`maxSize` in `regexp/syntax/parse.go`
/// counts `128 << 20` bytes of instructions). Past it the pattern is
/// refused as [`LARGE`]; the `regex` crate's default, 10 MiB, would refuse
/// `\pL{1000}`, which Go accepts.
pub const COMPILED_SIZE_LIMIT: usize = 128 << 20;

const MAX_REPEAT: u32 = 1000;
/// Go's `maxSize` (128 MB of 40-byte instructions) and `maxRunes`.
const MAX_SIZE: u64 = (128 << 20) / 40;
const MAX_RUNES: u64 = (128 << 20) / 4;
const MAX_HEIGHT: usize = 1000;
const MAX_RUNE: u32 = 0x10FFFF;

/// A parsed Go expression with its flags resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Empty,
    /// A set of characters (literals, classes, `.`); may be empty.
    Class(ClassUnicode),
    BeginLine,
    EndLine,
    BeginText,
    EndText,
    WordBoundary,
    NoWordBoundary,
    Capture(Box<Node>),
    Repeat {
        sub: Box<Node>,
        min: u32,
        /// `None`: unbounded.
        max: Option<u32>,
    },
    Concat(Vec<Node>),
    Alternate(Vec<Node>),
}

#[derive(Debug, Clone, Copy)]
struct Flags {
    fold: bool,
    dot_nl: bool,
    one_line: bool,
}

enum Item {
    /// A parsed node and its height (Go's `calcHeight`).
    Node(Node, usize),
    LeftParen {
        flags: Flags,
        capture: bool,
    },
    VerticalBar,
}

struct Parser<'a> {
    stack: Vec<Item>,
    flags: Flags,
    whole: &'a str,
    /// A node deeper than `MAX_HEIGHT` was made (Go's `checkHeight` panics
    /// with `ErrNestingDepth` at that push). Checked after every step, so
    /// the tree never grows deeper than that: every walk over it
    /// (`height`, `size`, `to_rust`, drop) recurses at most that far.
    too_deep: bool,
}

/// Parses `s` as Go's `regexp.Compile` does (`syntax.Perl` flags).
pub fn parse(s: &str) -> Result<Node, GoRegexError> {
    let mut p = Parser {
        stack: Vec::new(),
        flags: Flags {
            fold: false,
            dot_nl: false,
            one_line: true,
        },
        whole: s,
        too_deep: false,
    };
    let mut t = s;
    let mut last_repeat = "";
    while !t.is_empty() {
        let mut repeat = "";
        let c = t.as_bytes()[0];
        match c {
            b'(' => {
                if t.as_bytes().get(1) == Some(&b'?') {
                    t = p.parse_perl_flags(t)?;
                } else {
                    p.stack.push(Item::LeftParen {
                        flags: p.flags,
                        capture: true,
                    });
                    t = &t[1..];
                }
            }
            b'|' => {
                p.concat();
                if !p.swap_vertical_bar() {
                    p.stack.push(Item::VerticalBar);
                }
                t = &t[1..];
            }
            b')' => {
                p.parse_right_paren()?;
                t = &t[1..];
            }
            b'^' => {
                p.push(if p.flags.one_line {
                    Node::BeginText
                } else {
                    Node::BeginLine
                });
                t = &t[1..];
            }
            b'$' => {
                p.push(if p.flags.one_line {
                    Node::EndText
                } else {
                    Node::EndLine
                });
                t = &t[1..];
            }
            b'.' => {
                let mut class = ClassUnicode::new([ClassUnicodeRange::new('\0', char::MAX)]);
                if !p.flags.dot_nl {
                    class.difference(&ClassUnicode::new([ClassUnicodeRange::new('\n', '\n')]));
                }
                p.push(Node::Class(class));
                t = &t[1..];
            }
            b'[' => t = p.parse_class(t)?,
            b'*' | b'+' | b'?' => {
                let before = t;
                let (min, max) = match c {
                    b'*' => (0, None),
                    b'+' => (1, None),
                    _ => (0, Some(1)),
                };
                t = p.repeat(min, max, before, &t[1..], last_repeat, false)?;
                repeat = before;
            }
            b'{' => {
                let before = t;
                match parse_repeat(t) {
                    None => {
                        p.literal('{');
                        t = &t[1..];
                    }
                    Some((min, max, after)) => {
                        let bad = min < 0
                            || min > MAX_REPEAT as i64
                            || max > MAX_REPEAT as i64
                            || (max >= 0 && min > max);
                        if bad {
                            return err(INVALID_REPEAT_SIZE, &before[..before.len() - after.len()]);
                        }
                        let max = (max >= 0).then_some(max as u32);
                        t = p.repeat(min as u32, max, before, after, last_repeat, true)?;
                        repeat = before;
                    }
                }
            }
            b'\\' => t = p.parse_backslash(t)?,
            _ => {
                let ch = t.chars().next().unwrap_or('\0');
                p.literal(ch);
                t = &t[ch.len_utf8()..];
            }
        }
        last_repeat = repeat;
        if p.too_deep {
            return err(NESTING_DEPTH, s);
        }
    }
    p.concat();
    if p.swap_vertical_bar() {
        p.stack.pop();
    }
    p.alternate();
    if p.too_deep {
        return err(NESTING_DEPTH, s);
    }
    if p.stack.len() != 1 {
        return err(MISSING_PAREN, s);
    }
    match p.stack.pop() {
        Some(Item::Node(n, h)) => {
            debug_assert_eq!(h, height(&n));
            if size(&n) > MAX_SIZE || runes(&n) > MAX_RUNES {
                return err(LARGE, s);
            }
            Ok(n)
        }
        _ => err(MISSING_PAREN, s),
    }
}

/// Go's `calcSize` (compiled instructions), on the resolved tree.
fn size(n: &Node) -> u64 {
    let s = match n {
        Node::Capture(s) => 2 + size(s),
        Node::Repeat { sub, min, max } => {
            let sub = size(sub);
            let (min, max) = (*min as u64, max.map(|m| m as u64));
            match max {
                None if min == 0 => 2 + sub,
                None => 1 + min.saturating_mul(sub),
                Some(m) => m.saturating_mul(sub) + (m - min),
            }
        }
        Node::Concat(v) => v.iter().map(size).fold(0u64, u64::saturating_add),
        Node::Alternate(v) => {
            v.iter().map(size).fold(0u64, u64::saturating_add) + v.len() as u64 - 1
        }
        _ => 1,
    };
    s.max(1)
}

/// Go's `numRunes`: two per range of every class (repetitions share).
fn runes(n: &Node) -> u64 {
    match n {
        Node::Class(c) => 2 * c.ranges().len() as u64,
        Node::Capture(s) | Node::Repeat { sub: s, .. } => runes(s),
        Node::Concat(v) | Node::Alternate(v) => v.iter().map(runes).sum(),
        _ => 0,
    }
}

fn height(n: &Node) -> usize {
    match n {
        Node::Capture(s) | Node::Repeat { sub: s, .. } => 1 + height(s),
        Node::Concat(v) | Node::Alternate(v) => 1 + v.iter().map(height).max().unwrap_or(0),
        _ => 1,
    }
}

/// Go's `parseRepeat`: `{min}`, `{min,}`, `{min,max}`; `None` when `s`
/// is not of that form (the `{` is then a literal). A number too large
/// gives `min == -1`.
fn parse_repeat(s: &str) -> Option<(i64, i64, &str)> {
    let s = s.strip_prefix('{')?;
    let (mut min, s) = parse_int(s)?;
    let max;
    let s = if let Some(s) = s.strip_prefix(',') {
        if s.is_empty() {
            return None;
        }
        if s.starts_with('}') {
            max = -1;
            s
        } else {
            let (m, s) = parse_int(s)?;
            max = m;
            if m < 0 {
                min = -1;
            }
            s
        }
    } else {
        if s.is_empty() {
            return None;
        }
        max = min;
        s
    };
    let rest = s.strip_prefix('}')?;
    Some((min, max, rest))
}

/// Go's `parseInt`: decimal, no leading zeros, -1 when too large.
fn parse_int(s: &str) -> Option<(i64, &str)> {
    let b = s.as_bytes();
    if b.is_empty() || !b[0].is_ascii_digit() {
        return None;
    }
    if b.len() >= 2 && b[0] == b'0' && b[1].is_ascii_digit() {
        return None;
    }
    let end = b
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(b.len());
    let mut n: i64 = 0;
    for &d in &b[..end] {
        if n >= 100_000_000 {
            n = -1;
            break;
        }
        n = n * 10 + (d - b'0') as i64;
    }
    Some((n, &s[end..]))
}

/// Go's `repeatIsValid`: nested counted repetitions multiply up to `n`.
fn repeat_is_valid(node: &Node, mut n: u32) -> bool {
    if let Node::Repeat { min, max, .. } = node {
        let m = match max {
            Some(0) => return true,
            Some(m) => *m,
            None => *min,
        };
        if m > n {
            return false;
        }
        n = n.checked_div(m).unwrap_or(n);
    }
    match node {
        Node::Capture(s) | Node::Repeat { sub: s, .. } => repeat_is_valid(s, n),
        Node::Concat(v) | Node::Alternate(v) => v.iter().all(|s| repeat_is_valid(s, n)),
        _ => true,
    }
}

fn single(c: u32) -> ClassUnicode {
    range(c, c)
}

/// A class of `lo..=hi` without surrogates (Go strings never decode to
/// one, so they match nothing either way).
fn range(lo: u32, hi: u32) -> ClassUnicode {
    let mut out = ClassUnicode::empty();
    let parts = [(lo, hi.min(0xD7FF)), (lo.max(0xE000), hi)];
    for (a, b) in parts {
        if a <= b {
            if let (Some(a), Some(b)) = (char::from_u32(a), char::from_u32(b)) {
                out.push(ClassUnicodeRange::new(a, b));
            }
        }
    }
    out
}

fn ascii(ranges: &[(u8, u8)]) -> ClassUnicode {
    let mut c = ClassUnicode::empty();
    for &(a, b) in ranges {
        c.push(ClassUnicodeRange::new(a as char, b as char));
    }
    c
}

/// Go's `perlGroup` (ASCII).
fn perl_group(c: u8) -> Option<(bool, ClassUnicode)> {
    let class = match c.to_ascii_lowercase() {
        b'd' => ascii(&[(b'0', b'9')]),
        b's' => ascii(&[(b'\t', b'\n'), (0x0C, b'\r'), (b' ', b' ')]),
        b'w' => ascii(&[(b'0', b'9'), (b'A', b'Z'), (b'_', b'_'), (b'a', b'z')]),
        _ => return None,
    };
    Some((c.is_ascii_uppercase(), class))
}

/// Go's `posixGroup`.
fn posix_group(name: &str) -> Option<(bool, ClassUnicode)> {
    let (neg, name) = match name.strip_prefix("[:^") {
        Some(n) => (true, n),
        None => (false, name.strip_prefix("[:")?),
    };
    let class = match name.strip_suffix(":]")? {
        "alnum" => ascii(&[(b'0', b'9'), (b'A', b'Z'), (b'a', b'z')]),
        "alpha" => ascii(&[(b'A', b'Z'), (b'a', b'z')]),
        "ascii" => ascii(&[(0, 0x7F)]),
        "blank" => ascii(&[(b'\t', b'\t'), (b' ', b' ')]),
        "cntrl" => ascii(&[(0, 0x1F), (0x7F, 0x7F)]),
        "digit" => ascii(&[(b'0', b'9')]),
        "graph" => ascii(&[(b'!', b'~')]),
        "lower" => ascii(&[(b'a', b'z')]),
        "print" => ascii(&[(b' ', b'~')]),
        "punct" => ascii(&[(b'!', b'/'), (b':', b'@'), (b'[', b'`'), (b'{', b'~')]),
        "space" => ascii(&[(b'\t', b'\r'), (b' ', b' ')]),
        "upper" => ascii(&[(b'A', b'Z')]),
        "word" => ascii(&[(b'0', b'9'), (b'A', b'Z'), (b'_', b'_'), (b'a', b'z')]),
        "xdigit" => ascii(&[(b'0', b'9'), (b'A', b'F'), (b'a', b'f')]),
        _ => return None,
    };
    Some((neg, class))
}

/// Go 1.23's `unicode.Categories` keys.
const CATEGORIES: &[&str] = &[
    "C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn", "N",
    "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So",
    "Z", "Zl", "Zp", "Zs",
];

/// Go 1.23's `unicode.Scripts` keys (Unicode 15.0.0).
const SCRIPTS: &[&str] = &[
    "Adlam",
    "Ahom",
    "Anatolian_Hieroglyphs",
    "Arabic",
    "Armenian",
    "Avestan",
    "Balinese",
    "Bamum",
    "Bassa_Vah",
    "Batak",
    "Bengali",
    "Bhaiksuki",
    "Bopomofo",
    "Brahmi",
    "Braille",
    "Buginese",
    "Buhid",
    "Canadian_Aboriginal",
    "Carian",
    "Caucasian_Albanian",
    "Chakma",
    "Cham",
    "Cherokee",
    "Chorasmian",
    "Common",
    "Coptic",
    "Cuneiform",
    "Cypriot",
    "Cypro_Minoan",
    "Cyrillic",
    "Deseret",
    "Devanagari",
    "Dives_Akuru",
    "Dogra",
    "Duployan",
    "Egyptian_Hieroglyphs",
    "Elbasan",
    "Elymaic",
    "Ethiopic",
    "Georgian",
    "Glagolitic",
    "Gothic",
    "Grantha",
    "Greek",
    "Gujarati",
    "Gunjala_Gondi",
    "Gurmukhi",
    "Han",
    "Hangul",
    "Hanifi_Rohingya",
    "Hanunoo",
    "Hatran",
    "Hebrew",
    "Hiragana",
    "Imperial_Aramaic",
    "Inherited",
    "Inscriptional_Pahlavi",
    "Inscriptional_Parthian",
    "Javanese",
    "Kaithi",
    "Kannada",
    "Katakana",
    "Kawi",
    "Kayah_Li",
    "Kharoshthi",
    "Khitan_Small_Script",
    "Khmer",
    "Khojki",
    "Khudawadi",
    "Lao",
    "Latin",
    "Lepcha",
    "Limbu",
    "Linear_A",
    "Linear_B",
    "Lisu",
    "Lycian",
    "Lydian",
    "Mahajani",
    "Makasar",
    "Malayalam",
    "Mandaic",
    "Manichaean",
    "Marchen",
    "Masaram_Gondi",
    "Medefaidrin",
    "Meetei_Mayek",
    "Mende_Kikakui",
    "Meroitic_Cursive",
    "Meroitic_Hieroglyphs",
    "Miao",
    "Modi",
    "Mongolian",
    "Mro",
    "Multani",
    "Myanmar",
    "Nabataean",
    "Nag_Mundari",
    "Nandinagari",
    "New_Tai_Lue",
    "Newa",
    "Nko",
    "Nushu",
    "Nyiakeng_Puachue_Hmong",
    "Ogham",
    "Ol_Chiki",
    "Old_Hungarian",
    "Old_Italic",
    "Old_North_Arabian",
    "Old_Permic",
    "Old_Persian",
    "Old_Sogdian",
    "Old_South_Arabian",
    "Old_Turkic",
    "Old_Uyghur",
    "Oriya",
    "Osage",
    "Osmanya",
    "Pahawh_Hmong",
    "Palmyrene",
    "Pau_Cin_Hau",
    "Phags_Pa",
    "Phoenician",
    "Psalter_Pahlavi",
    "Rejang",
    "Runic",
    "Samaritan",
    "Saurashtra",
    "Sharada",
    "Shavian",
    "Siddham",
    "SignWriting",
    "Sinhala",
    "Sogdian",
    "Sora_Sompeng",
    "Soyombo",
    "Sundanese",
    "Syloti_Nagri",
    "Syriac",
    "Tagalog",
    "Tagbanwa",
    "Tai_Le",
    "Tai_Tham",
    "Tai_Viet",
    "Takri",
    "Tamil",
    "Tangsa",
    "Tangut",
    "Telugu",
    "Thaana",
    "Thai",
    "Tibetan",
    "Tifinagh",
    "Tirhuta",
    "Toto",
    "Ugaritic",
    "Vai",
    "Vithkuqi",
    "Wancho",
    "Warang_Citi",
    "Yezidi",
    "Yi",
    "Zanabazar_Square",
];

/// Go 1.23's `unicodeTable`: `Any`, a category or a script, by exact name;
/// the ranges come from the `regex` crate's tables.
fn unicode_table(name: &str) -> Option<ClassUnicode> {
    let query = if name == "Any" {
        return Some(range(0, MAX_RUNE));
    } else if CATEGORIES.contains(&name) {
        format!(r"\p{{gc={name}}}")
    } else if SCRIPTS.contains(&name) {
        format!(r"\p{{sc={name}}}")
    } else {
        return None;
    };
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(&query)
        .ok()?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => Some(c.clone()),
        _ => None,
    }
}

fn fold(mut c: ClassUnicode) -> ClassUnicode {
    c.case_fold_simple();
    c
}

fn negate(mut c: ClassUnicode) -> ClassUnicode {
    c.negate();
    c
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

fn unhex(c: char) -> Option<u32> {
    c.to_digit(16)
}

impl Parser<'_> {
    /// Pushes a leaf.
    fn push(&mut self, n: Node) {
        self.push_h(n, 1);
    }

    /// Pushes a node of height `h`; one too deep is replaced by an empty
    /// node and noted in `too_deep`.
    fn push_h(&mut self, n: Node, h: usize) {
        if h > MAX_HEIGHT {
            self.too_deep = true;
            self.stack.push(Item::Node(Node::Empty, 1));
        } else {
            self.stack.push(Item::Node(n, h));
        }
    }

    /// Go's `literal`: a rune, folded when `(?i)` is on.
    fn literal(&mut self, c: char) {
        let class = if self.flags.fold {
            fold(single(c as u32))
        } else {
            single(c as u32)
        };
        self.push(Node::Class(class));
    }

    fn literal_rune(&mut self, r: u32) {
        let class = if self.flags.fold {
            fold(single(r))
        } else {
            single(r)
        };
        self.push(Node::Class(class));
    }

    /// Go's `appendGroup`: fold, then negate.
    fn group(&self, neg: bool, class: ClassUnicode) -> ClassUnicode {
        let c = if self.flags.fold { fold(class) } else { class };
        if neg {
            negate(c)
        } else {
            c
        }
    }

    /// Nodes above the topmost pseudo-item, removed from the stack.
    /// Nodes above the topmost pseudo-item, removed from the stack, and the
    /// greatest of their heights.
    fn take_nodes(&mut self) -> (Vec<Node>, usize) {
        let mut i = self.stack.len();
        while i > 0 && matches!(self.stack[i - 1], Item::Node(..)) {
            i -= 1;
        }
        let mut max = 0;
        let nodes = self
            .stack
            .drain(i..)
            .filter_map(|it| match it {
                Item::Node(n, h) => {
                    max = max.max(h);
                    Some(n)
                }
                _ => None,
            })
            .collect();
        (nodes, max)
    }

    fn concat(&mut self) {
        let (mut subs, h) = self.take_nodes();
        match subs.len() {
            0 => self.push(Node::Empty),
            1 => self.push_h(subs.remove(0), h),
            _ => self.push_h(Node::Concat(subs), 1 + h),
        }
    }

    fn alternate(&mut self) {
        let (mut subs, h) = self.take_nodes();
        match subs.len() {
            0 => self.push(Node::Class(ClassUnicode::empty())),
            1 => self.push_h(subs.remove(0), h),
            _ => self.push_h(Node::Alternate(subs), 1 + h),
        }
    }

    /// Go's `swapVerticalBar` (without its class merging, which only
    /// optimizes).
    fn swap_vertical_bar(&mut self) -> bool {
        let n = self.stack.len();
        if n >= 2 && matches!(self.stack[n - 2], Item::VerticalBar) {
            self.stack.swap(n - 1, n - 2);
            return true;
        }
        false
    }

    fn parse_right_paren(&mut self) -> Result<(), GoRegexError> {
        self.concat();
        if self.swap_vertical_bar() {
            self.stack.pop();
        }
        self.alternate();
        if self.stack.len() < 2 {
            return err(UNEXPECTED_PAREN, self.whole);
        }
        let re1 = self.stack.pop();
        let re2 = self.stack.pop();
        match (re1, re2) {
            (Some(Item::Node(n, h)), Some(Item::LeftParen { flags, capture })) => {
                self.flags = flags;
                if capture {
                    self.push_h(Node::Capture(Box::new(n)), 1 + h);
                } else {
                    self.push_h(n, h);
                }
                Ok(())
            }
            _ => err(UNEXPECTED_PAREN, self.whole),
        }
    }

    /// Go's `repeat`.
    fn repeat<'s>(
        &mut self,
        min: u32,
        max: Option<u32>,
        before: &'s str,
        mut after: &'s str,
        last_repeat: &'s str,
        counted: bool,
    ) -> Result<&'s str, GoRegexError> {
        if let Some(a) = after.strip_prefix('?') {
            after = a;
        }
        if !last_repeat.is_empty() {
            return err(
                INVALID_REPEAT_OP,
                &last_repeat[..last_repeat.len() - after.len()],
            );
        }
        let (sub, h) = match self.stack.pop() {
            Some(Item::Node(n, h)) => (n, h),
            other => {
                if let Some(o) = other {
                    self.stack.push(o);
                }
                return err(MISSING_REPEAT_ARG, &before[..before.len() - after.len()]);
            }
        };
        let node = Node::Repeat {
            sub: Box::new(sub),
            min,
            max,
        };
        if counted
            && (min >= 2 || max.is_some_and(|m| m >= 2))
            && !repeat_is_valid(&node, MAX_REPEAT)
        {
            return err(INVALID_REPEAT_SIZE, &before[..before.len() - after.len()]);
        }
        self.push_h(node, 1 + h);
        Ok(after)
    }

    /// Go's `parsePerlFlags`; `s` starts with `(?`.
    fn parse_perl_flags<'s>(&mut self, s: &'s str) -> Result<&'s str, GoRegexError> {
        let b = s.as_bytes();
        let starts_with_p = b.len() > 4 && b[2] == b'P' && b[3] == b'<';
        let starts_with_name = b.len() > 3 && b[2] == b'<';
        if starts_with_p || starts_with_name {
            let begin = if starts_with_name { 3 } else { 4 };
            let Some(end) = s.find('>') else {
                return err(INVALID_NAMED_CAPTURE, s);
            };
            let capture = &s[..end + 1];
            let name = &s[begin..end];
            if name.is_empty() || !name.chars().all(|c| c == '_' || is_alnum(c)) {
                return err(INVALID_NAMED_CAPTURE, capture);
            }
            self.stack.push(Item::LeftParen {
                flags: self.flags,
                capture: true,
            });
            return Ok(&s[end + 1..]);
        }
        let mut t = &s[2..];
        let mut flags = self.flags;
        let mut negated = false;
        let mut saw_flag = false;
        while let Some(c) = t.chars().next() {
            t = &t[c.len_utf8()..];
            match c {
                'i' => {
                    flags.fold = !negated;
                    saw_flag = true;
                }
                'm' => {
                    flags.one_line = negated;
                    saw_flag = true;
                }
                's' => {
                    flags.dot_nl = !negated;
                    saw_flag = true;
                }
                'U' => saw_flag = true,
                '-' => {
                    if negated {
                        break;
                    }
                    negated = true;
                    saw_flag = false;
                }
                ':' | ')' => {
                    if negated && !saw_flag {
                        break;
                    }
                    if c == ':' {
                        self.stack.push(Item::LeftParen {
                            flags: self.flags,
                            capture: false,
                        });
                    }
                    self.flags = flags;
                    return Ok(t);
                }
                _ => break,
            }
        }
        err(INVALID_PERL_OP, &s[..s.len() - t.len()])
    }

    /// A `\` outside a class.
    fn parse_backslash<'s>(&mut self, t: &'s str) -> Result<&'s str, GoRegexError> {
        let b = t.as_bytes();
        if b.len() >= 2 {
            match b[1] {
                b'A' => {
                    self.push(Node::BeginText);
                    return Ok(&t[2..]);
                }
                b'b' => {
                    self.push(Node::WordBoundary);
                    return Ok(&t[2..]);
                }
                b'B' => {
                    self.push(Node::NoWordBoundary);
                    return Ok(&t[2..]);
                }
                b'C' => return err(INVALID_ESCAPE, &t[..2]),
                b'Q' => {
                    let (lit, rest) = match t[2..].split_once(r"\E") {
                        Some((l, r)) => (l, r),
                        None => (&t[2..], ""),
                    };
                    for c in lit.chars() {
                        self.literal(c);
                    }
                    return Ok(rest);
                }
                b'z' => {
                    self.push(Node::EndText);
                    return Ok(&t[2..]);
                }
                _ => {}
            }
        }
        if b.len() >= 2 && (b[1] == b'p' || b[1] == b'P') {
            if let Some((class, rest)) = self.parse_unicode_class(t)? {
                self.push(Node::Class(class));
                return Ok(rest);
            }
        }
        if let Some((class, rest)) = self.parse_perl_class_escape(t) {
            self.push(Node::Class(class));
            return Ok(rest);
        }
        let (r, rest) = parse_escape(t)?;
        self.literal_rune(r);
        Ok(rest)
    }

    fn parse_perl_class_escape<'s>(&self, s: &'s str) -> Option<(ClassUnicode, &'s str)> {
        let b = s.as_bytes();
        if b.len() < 2 || b[0] != b'\\' {
            return None;
        }
        let (neg, class) = perl_group(b[1])?;
        Some((self.group(neg, class), &s[2..]))
    }

    /// Go's `parseUnicodeClass`: `None` when `s` is no `\p`/`\P`.
    fn parse_unicode_class<'s>(
        &self,
        s: &'s str,
    ) -> Result<Option<(ClassUnicode, &'s str)>, GoRegexError> {
        let b = s.as_bytes();
        if b.len() < 2 || b[0] != b'\\' || (b[1] != b'p' && b[1] != b'P') {
            return Ok(None);
        }
        let mut neg = b[1] == b'P';
        let t = &s[2..];
        let Some(c) = t.chars().next() else {
            // Go: an empty name, not a table.
            return err(INVALID_CHAR_RANGE, s);
        };
        let (seq, mut name, rest) = if c != '{' {
            let end = 2 + c.len_utf8();
            (&s[..end], &s[2..end], &s[end..])
        } else {
            let Some(end) = s.find('}') else {
                return err(INVALID_CHAR_RANGE, s);
            };
            (&s[..end + 1], &s[3..end], &s[end + 1..])
        };
        if let Some(n) = name.strip_prefix('^') {
            neg = !neg;
            name = n;
        }
        let Some(table) = unicode_table(name) else {
            return err(INVALID_CHAR_RANGE, seq);
        };
        Ok(Some((self.group(neg, table), rest)))
    }

    /// Go's `parseClass`; `s` starts with `[`.
    fn parse_class<'s>(&mut self, s: &'s str) -> Result<&'s str, GoRegexError> {
        let mut t = &s[1..];
        let mut neg = false;
        if let Some(r) = t.strip_prefix('^') {
            neg = true;
            t = r;
        }
        // The ranges of every item, made canonical once at the end: a
        // union per item re-sorted the whole set each time, which made a
        // class of n items cost O(n^2) (3.8 s for 16,000 items).
        let mut items: Vec<ClassUnicodeRange> = Vec::new();
        let mut first = true;
        // Whether a `:]` may still follow. Go's `parseNamedClass` searches
        // the rest of the pattern for it at every `[:`, so `[[:a[:a[:a...`
        // cost O(n^2) (0.45 s for 16 KB); once a search fails, no later
        // one (on a suffix) can succeed.
        let mut close_ahead = true;
        while t.is_empty() || !t.starts_with(']') || first {
            first = false;
            if close_ahead && t.len() > 2 && t.starts_with("[:") {
                let found = t[2..].find(":]");
                close_ahead = found.is_some();
                if let Some(i) = found {
                    let name = &t[..i + 4];
                    let Some((gneg, g)) = posix_group(name) else {
                        return err(INVALID_CHAR_RANGE, name);
                    };
                    items.extend_from_slice(self.group(gneg, g).ranges());
                    t = &t[i + 4..];
                    continue;
                }
            }
            if let Some((c, rest)) = self.parse_unicode_class(t)? {
                items.extend_from_slice(c.ranges());
                t = rest;
                continue;
            }
            if let Some((c, rest)) = self.parse_perl_class_escape(t) {
                items.extend_from_slice(c.ranges());
                t = rest;
                continue;
            }
            let rng = t;
            let (lo, rest) = parse_class_char(t, s)?;
            t = rest;
            let mut hi = lo;
            if t.len() >= 2 && t.starts_with('-') && !t[1..].starts_with(']') {
                let (h, rest) = parse_class_char(&t[1..], s)?;
                t = rest;
                hi = h;
                if hi < lo {
                    return err(INVALID_CHAR_RANGE, &rng[..rng.len() - t.len()]);
                }
            }
            let r = range(lo, hi);
            items.extend_from_slice(if self.flags.fold { fold(r) } else { r }.ranges());
        }
        t = &t[1..];
        let mut class = ClassUnicode::new(items);
        if neg {
            class.negate();
        }
        self.push(Node::Class(class));
        Ok(t)
    }
}

fn parse_class_char<'s>(s: &'s str, whole: &str) -> Result<(u32, &'s str), GoRegexError> {
    let Some(c) = s.chars().next() else {
        return err(MISSING_BRACKET, whole);
    };
    if c == '\\' {
        return parse_escape(s);
    }
    Ok((c as u32, &s[c.len_utf8()..]))
}

/// Up to two more octal digits after `c`.
fn octal(c: char, mut t: &str) -> (u32, &str) {
    let mut r = c as u32 - '0' as u32;
    for _ in 1..3 {
        match t.as_bytes().first() {
            Some(d @ b'0'..=b'7') => {
                r = r * 8 + (d - b'0') as u32;
                t = &t[1..];
            }
            _ => break,
        }
    }
    (r, t)
}

/// Go's `parseEscape`: one escaped rune (octal, hex, C escapes, an escaped
/// punctuation character; a letter or digit escape Go does not define is
/// an error, so `\<` is `<` and `\8` fails).
fn parse_escape(s: &str) -> Result<(u32, &str), GoRegexError> {
    let mut t = &s[1..];
    let Some(c) = t.chars().next() else {
        return err(TRAILING_BACKSLASH, "");
    };
    t = &t[c.len_utf8()..];
    let bad = |t: &str| err(INVALID_ESCAPE, &s[..s.len() - t.len()]);
    match c {
        '1'..='7' => {
            if matches!(t.as_bytes().first(), Some(b'0'..=b'7')) {
                let (r, t) = octal(c, t);
                return Ok((r, t));
            }
            bad(t)
        }
        '0' => {
            let (r, t) = octal(c, t);
            Ok((r, t))
        }
        'x' => {
            let Some(c) = t.chars().next() else {
                return bad(t);
            };
            t = &t[c.len_utf8()..];
            if c == '{' {
                let mut nhex = 0;
                let mut r: u32 = 0;
                loop {
                    let Some(c) = t.chars().next() else {
                        return bad(t);
                    };
                    t = &t[c.len_utf8()..];
                    if c == '}' {
                        break;
                    }
                    let Some(v) = unhex(c) else {
                        return bad(t);
                    };
                    r = r * 16 + v;
                    if r > MAX_RUNE {
                        return bad(t);
                    }
                    nhex += 1;
                }
                if nhex == 0 {
                    return bad(t);
                }
                return Ok((r, t));
            }
            let x = unhex(c);
            let Some(c2) = t.chars().next() else {
                return bad(t);
            };
            t = &t[c2.len_utf8()..];
            match (x, unhex(c2)) {
                (Some(x), Some(y)) => Ok((x * 16 + y, t)),
                _ => bad(t),
            }
        }
        'a' => Ok((7, t)),
        'f' => Ok((12, t)),
        'n' => Ok((10, t)),
        'r' => Ok((13, t)),
        't' => Ok((9, t)),
        'v' => Ok((11, t)),
        c if c.is_ascii() && !is_alnum(c) => Ok((c as u32, t)),
        _ => bad(t),
    }
}

/// The tree in `regex` syntax (see the module documentation).
pub fn to_rust(n: &Node) -> String {
    let mut out = String::new();
    write(n, &mut out);
    out
}

fn write(n: &Node, out: &mut String) {
    use std::fmt::Write as _;
    match n {
        Node::Empty => out.push_str("(?:)"),
        Node::Class(c) => {
            if c.ranges().is_empty() {
                // No character: `[a&&b]` is the `regex` crate's empty class.
                out.push_str("[a&&b]");
                return;
            }
            out.push('[');
            for r in c.ranges() {
                let _ = write!(out, "\\x{{{:X}}}", r.start() as u32);
                if r.end() != r.start() {
                    let _ = write!(out, "-\\x{{{:X}}}", r.end() as u32);
                }
            }
            out.push(']');
        }
        Node::BeginLine => out.push_str("(?m:^)"),
        Node::EndLine => out.push_str("(?m:$)"),
        Node::BeginText => out.push_str(r"\A"),
        Node::EndText => out.push_str(r"\z"),
        Node::WordBoundary => out.push_str(r"(?-u:\b)"),
        Node::NoWordBoundary => out.push_str(r"(?-u:\B)"),
        Node::Capture(s) => {
            out.push_str("(?:");
            write(s, out);
            out.push(')');
        }
        Node::Repeat { sub, min, max } => {
            out.push_str("(?:");
            write(sub, out);
            out.push(')');
            let _ = match max {
                None => write!(out, "{{{min},}}"),
                Some(m) => write!(out, "{{{min},{m}}}"),
            };
        }
        Node::Concat(v) => {
            out.push_str("(?:");
            for s in v {
                write(s, out);
            }
            out.push(')');
        }
        Node::Alternate(v) => {
            out.push_str("(?:");
            for (i, s) in v.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                write(s, out);
            }
            out.push(')');
        }
    }
}

/// One Go `*regexp.Regexp` for `MatchString`.
#[derive(Debug, Clone)]
pub struct GoRegex {
    go: String,
    re: regex::Regex,
}

impl GoRegex {
    pub fn new(pattern: &str) -> Result<GoRegex, GoRegexError> {
        let node = parse(pattern)?;
        let re = regex::RegexBuilder::new(&to_rust(&node))
            .nest_limit(8 * MAX_HEIGHT as u32)
            .size_limit(COMPILED_SIZE_LIMIT)
            .build()
            .map_err(|e| GoRegexError {
                code: LARGE,
                expr: format!("{pattern} ({e})"),
            })?;
        Ok(GoRegex {
            go: pattern.to_string(),
            re,
        })
    }

    /// The Go pattern.
    pub fn as_str(&self) -> &str {
        &self.go
    }

    /// Go's `MatchString` on a string as [`go_runes`] gives it.
    pub fn is_match(&self, s: &str) -> bool {
        self.re.is_match(s)
    }

    /// Go's `MatchString` on raw bytes (a Go string).
    pub fn is_match_bytes(&self, s: &[u8]) -> bool {
        self.re.is_match(&go_runes(s))
    }
}

/// The runes Go sees in a byte string: valid UTF-8 as is, each byte of an
/// invalid sequence one U+FFFD (Go's `utf8.DecodeRune` yields
/// `(RuneError, 1)` for it).
pub fn go_runes(mut b: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(b) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(b.len() + 8);
    while !b.is_empty() {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(s);
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                // The prefix is valid UTF-8 by construction.
                out.push_str(std::str::from_utf8(&b[..good]).unwrap_or_default());
                out.push('\u{FFFD}');
                b = &b[good + 1..];
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests;
