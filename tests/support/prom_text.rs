//! A small parser of the Prometheus text format (0.0.4), enough to check a
//! live scrape: families with their HELP, TYPE and samples (labels kept as
//! a sorted map). Written for the tests; strict about what it reads (an
//! unparsable line fails the test).

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Family {
    pub help: Option<String>,
    pub kind: Option<String>,
    pub samples: Vec<Sample>,
}

impl Family {
    /// The label names of the samples (without histogram's `le`).
    pub(crate) fn label_names(&self) -> std::collections::BTreeSet<String> {
        self.samples
            .iter()
            .flat_map(|s| s.labels.keys().cloned())
            .filter(|k| k != "le")
            .collect()
    }
}

/// Families by name (the name in `# TYPE`).
pub(crate) type Families = BTreeMap<String, Family>;

fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next().map(|c| c.1) != Some('"') {
            return Err(format!("label {key} value not quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => (value.push('\n'), escaped = false).1,
                (true, c) => (value.push(c), escaped = false).1,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        let end = end.ok_or("unterminated label value")?;
        labels.insert(key, value);
        rest = &rest[end..];
    }
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        v => v.parse().map_err(|e| format!("value {v:?}: {e}")),
    }
}

/// The family a sample belongs to: its own name, or for a histogram's
/// (summary's) `_bucket`, `_sum`, `_count` the name without the suffix.
fn family_of(families: &Families, name: &str) -> Option<String> {
    if families.contains_key(name) {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        let f = families.get(base)?;
        matches!(f.kind.as_deref(), Some("histogram" | "summary")).then(|| base.to_string())
    })
}

/// Parses a whole exposition; an error names the offending line.
pub(crate) fn parse(text: &str) -> Result<Families, String> {
    let mut families = Families::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().help = Some(help.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or(format!("bad TYPE: {line}"))?;
            families.entry(name.to_string()).or_default().kind = Some(kind.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or(format!("no value: {line}"))?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end + 1..]).map_err(|e| format!("{e}: {line}"))?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let value = rest
            .split_whitespace()
            .next()
            .ok_or(format!("no value: {line}"))?;
        let value = parse_value(value).map_err(|e| format!("{e}: {line}"))?;
        let family = family_of(&families, name)
            .ok_or(format!("sample {name} outside any TYPEd family: {line}"))?;
        families.get_mut(&family).unwrap().samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(families)
}

/// The value of the sample `name` whose labels include `labels`.
pub(crate) fn value(f: &Families, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let fam = family_of(f, name)?;
    f[&fam]
        .samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

/// Problems of form in a scrape: a family without HELP or TYPE, a counter
/// family with a sample not named as the family (`_total` lost or
/// doubled).
pub(crate) fn form_problems(f: &Families) -> Vec<String> {
    let mut out = Vec::new();
    for (name, fam) in f {
        if fam.help.is_none() {
            out.push(format!("{name}: no HELP"));
        }
        if fam.kind.is_none() {
            out.push(format!("{name}: no TYPE"));
        }
        if fam.kind.as_deref() == Some("counter") {
            for s in &fam.samples {
                if s.name != *name {
                    out.push(format!("{name}: counter sample named {}", s.name));
                }
            }
        }
        if fam.kind.as_deref() == Some("untyped") {
            out.push(format!("{name}: untyped"));
        }
    }
    out
}

/// GET `/metrics` at `addr` over HTTP/1.0 (so that Go's server answers
/// without chunked encoding) and parse it.
pub(crate) fn scrape(addr: std::net::SocketAddr) -> Families {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect /metrics");
    s.set_read_timeout(Some(super::WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    parse(body).unwrap_or_else(|e| panic!("{e}\n{body}"))
}

/// Whether `name` is a family of `f` or a sample of one (a histogram's
/// `_bucket`, `_sum`, `_count`).
pub(crate) fn knows(f: &Families, name: &str) -> bool {
    family_of(f, name).is_some()
}
