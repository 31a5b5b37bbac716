//! Report of the comparison harness: aggregates the [`Sample`]s of all
//! repetitions and writes `compare.json` (every sample), `compare.md`
//! (tables of medians and edgetunnel ratios) and SVG plots.
//!
//! Everything is drawn by hand (only `std` and `serde_json`) and the output
//! is deterministic: the only time stamp is [`Meta::date`].

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::model::{Sample, SystemKind};

/// Facts about the run, printed at the top of the report and kept in the JSON.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// When the run happened: the only time stamp in the output.
    pub date: String,
    /// Free text: cores, RAM, kernel, CPU model.
    pub machine: String,
    /// "quick" or "full".
    pub mode: String,
    /// Repetitions per case.
    pub reps: u32,
    /// The command line that produced the samples.
    pub command: String,
    /// What a reader must know, e.g. skipped systems and why.
    pub notes: Vec<String>,
}

/// Name of the scenario whose plot is a CDF instead of bars.
const LATENCY: &str = "latency";

/// Writes into out_dir: compare.json (meta + every sample, including cdf
/// points), compare.md (the Markdown report), and SVG plots; returns the
/// paths written.
pub fn write_all(samples: &[Sample], meta: &Meta, out_dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir)?;
    let json =
        serde_json::to_string_pretty(&report_json(samples, meta)).map_err(io::Error::other)?;
    let mut files = vec![
        ("compare.json".to_string(), json + "\n"),
        ("compare.md".to_string(), markdown(samples, meta)),
    ];
    files.extend(render_plots(samples));
    let mut written = Vec::with_capacity(files.len());
    for (name, contents) in files {
        let path = out_dir.join(name);
        std::fs::write(&path, contents)?;
        written.push(path);
    }
    Ok(written)
}

/// The Markdown report: meta header, then per scenario its plot and one
/// table per metric (cases × systems) followed by edgetunnel ratios.
pub fn markdown(samples: &[Sample], meta: &Meta) -> String {
    let aggs = aggregate(samples);
    let order = unique(samples.iter().map(|s| s.system.as_str()));
    let plots = plan_plots(samples);
    let mut md = md_header(meta);
    if samples.is_empty() {
        md.push_str("No samples were collected.\n");
    }
    for scenario in unique(samples.iter().map(|s| s.scenario.as_str())) {
        md_scenario(&mut md, scenario, &aggs, &order, &plots);
    }
    md
}

/// One-line progress summary of a group of reps (median, min, max, unit)
/// for the terminal.
pub fn summary_line(samples: &[Sample]) -> String {
    let aggs = aggregate(samples);
    if aggs.is_empty() {
        return "no samples".to_string();
    }
    aggs.iter().map(summary_of).collect::<Vec<_>>().join("; ")
}

/// The terminal summary of one aggregate.
fn summary_of(a: &Agg) -> String {
    let mut reps = format!("{} rep{}", a.reps, if a.reps == 1 { "" } else { "s" });
    if a.finite < a.reps {
        reps.push_str(&format!(", {} not finite", a.reps - a.finite));
    }
    format!(
        "{} · {} · {}: median {} {} (min {}, max {}, {reps})",
        a.scenario,
        a.case,
        a.system,
        fmt3(a.median),
        a.metric,
        fmt3(a.min),
        fmt3(a.max),
    )
}

// ---------------------------------------------------------------- aggregation

/// Median, min and max over the repetitions of one
/// (scenario, case, metric, system) group.
#[derive(Clone, Debug)]
struct Agg<'a> {
    scenario: &'a str,
    case: &'a str,
    metric: &'a str,
    system: &'a str,
    higher_is_better: bool,
    /// Samples in the group.
    reps: usize,
    /// Samples with a finite value; only those enter median, min and max.
    finite: usize,
    median: f64,
    min: f64,
    max: f64,
}

impl<'a> Agg<'a> {
    /// Aggregates a non-empty group of samples sharing their key.
    fn of(group: &[&'a Sample]) -> Agg<'a> {
        let first = group[0];
        let mut values: Vec<f64> = group
            .iter()
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .collect();
        values.sort_by(f64::total_cmp);
        Agg {
            scenario: &first.scenario,
            case: &first.case,
            metric: &first.metric,
            system: &first.system,
            higher_is_better: first.higher_is_better,
            reps: group.len(),
            finite: values.len(),
            median: median(&values),
            min: values.first().copied().unwrap_or(f64::NAN),
            max: values.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Median of sorted values (mean of the two middle ones for an even
/// count); NaN when there are none.
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Groups samples by (scenario, case, metric, system), groups in order of
/// first appearance.
fn group_samples(samples: &[Sample]) -> Vec<Vec<&Sample>> {
    let mut index: HashMap<(&str, &str, &str, &str), usize> = HashMap::new();
    let mut groups: Vec<Vec<&Sample>> = Vec::new();
    for s in samples {
        let key = (
            s.scenario.as_str(),
            s.case.as_str(),
            s.metric.as_str(),
            s.system.as_str(),
        );
        let i = *index.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(s);
    }
    groups
}

/// One aggregate per (scenario, case, metric, system), in order of first
/// appearance.
fn aggregate(samples: &[Sample]) -> Vec<Agg<'_>> {
    group_samples(samples).iter().map(|g| Agg::of(g)).collect()
}

/// Distinct strings in order of first appearance.
fn unique<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    items.into_iter().filter(|s| seen.insert(*s)).collect()
}

/// Whether a system label is an edgetunnel system (e.g. "edgetunnel-grpc",
/// "edgetunnel-connect --workers 1").
fn is_edgetunnel(system: &str) -> bool {
    system.starts_with("edgetunnel")
}

/// Whether a system label is the direct connection, the limit.
fn is_direct(system: &str) -> bool {
    system == SystemKind::Direct.name()
}

/// The label of a system in headers and legends: direct is marked as the limit.
fn system_label(system: &str) -> String {
    if is_direct(system) {
        format!("{system} (limit)")
    } else {
        system.to_string()
    }
}

/// "higher is better" or "lower is better".
fn direction(higher_is_better: bool) -> &'static str {
    if higher_is_better {
        "higher is better"
    } else {
        "lower is better"
    }
}

/// The aggregates of one (scenario, metric): rows = cases, columns = systems.
struct Table<'a> {
    metric: &'a str,
    higher_is_better: bool,
    cases: Vec<&'a str>,
    systems: Vec<&'a str>,
    cells: HashMap<(&'a str, &'a str), &'a Agg<'a>>,
}

impl<'a> Table<'a> {
    /// The table of `metric` in `scenario`; systems follow `order`.
    fn new(aggs: &'a [Agg<'a>], scenario: &str, metric: &'a str, order: &[&'a str]) -> Self {
        let rows: Vec<&'a Agg<'a>> = aggs
            .iter()
            .filter(|a| a.scenario == scenario && a.metric == metric)
            .collect();
        let present: HashSet<&str> = rows.iter().map(|a| a.system).collect();
        Table {
            metric,
            higher_is_better: rows.first().is_none_or(|a| a.higher_is_better),
            cases: unique(rows.iter().map(|a| a.case)),
            systems: order
                .iter()
                .copied()
                .filter(|s| present.contains(s))
                .collect(),
            cells: rows.iter().map(|a| ((a.case, a.system), *a)).collect(),
        }
    }

    /// The aggregate of a cell, if that system ran that case.
    fn get(&self, case: &str, system: &str) -> Option<&'a Agg<'a>> {
        self.cells.get(&(case, system)).copied()
    }

    /// Every aggregate of the table, row by row.
    fn all(&self) -> impl Iterator<Item = &'a Agg<'a>> + '_ {
        self.cases
            .iter()
            .flat_map(move |c| self.systems.iter().filter_map(move |s| self.get(c, s)))
    }
}

/// One table per metric of `scenario`, metrics in order of first appearance.
fn tables<'a>(aggs: &'a [Agg<'a>], scenario: &str, order: &[&'a str]) -> Vec<Table<'a>> {
    let metrics = unique(
        aggs.iter()
            .filter(|a| a.scenario == scenario)
            .map(|a| a.metric),
    );
    metrics
        .into_iter()
        .map(|m| Table::new(aggs, scenario, m, order))
        .collect()
}

/// How edgetunnel compares with another system so that > 1.0 always means
/// edgetunnel is better.
fn ratio(edgetunnel: &Agg, other: &Agg) -> f64 {
    if edgetunnel.higher_is_better {
        edgetunnel.median / other.median
    } else {
        other.median / edgetunnel.median
    }
}

// ---------------------------------------------------------- number formatting

/// Formats a value with 3 significant digits, thousands separators from
/// 1,000 up and trailing zeros trimmed: "8.58", "7.9", "31,046", "0.0123".
fn fmt3(v: f64) -> String {
    if v.is_nan() {
        return "n/a".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "∞" } else { "-∞" }.to_string();
    }
    let a = v.abs();
    if a == 0.0 {
        return "0".to_string();
    }
    if !(1e-4..1e15).contains(&a) {
        return format!("{v:.2e}");
    }
    if a >= 999.5 {
        return group_thousands(v.round());
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    trim_zeros(format!("{v:.decimals$}"))
}

/// An integral value below 1e15 with comma thousands separators.
fn group_thousands(v: f64) -> String {
    let digits = (v.abs() as u64).to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if v < 0.0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Drops trailing zeros after a decimal point, and the point if nothing is left.
fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A table cell: "median (min–max)", just the value for one finite rep,
/// "n/a" when no rep produced a finite value.
fn cell(a: &Agg) -> String {
    match a.finite {
        0 => "n/a".to_string(),
        1 => fmt3(a.median),
        _ => format!("{} ({}–{})", fmt3(a.median), fmt3(a.min), fmt3(a.max)),
    }
}

/// A ratio with 2 decimals from 0.1 to 10 ("1.07"), 3 significant digits
/// outside that range, "n/a" when undefined.
fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "n/a".to_string()
    } else if r.abs() < 0.1 {
        fmt3(r)
    } else if r.abs() < 10.0 {
        format!("{r:.2}")
    } else if r.abs() < 100.0 {
        format!("{r:.1}")
    } else {
        fmt3(r)
    }
}

// ------------------------------------------------------------------ markdown

/// Text safe inside a Markdown table cell, heading or list item: one line,
/// HTML and Markdown punctuation escaped.
fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\r' | '\n' => out.push(' '),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '|' | '*' | '_' | '`' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// A Markdown code span that survives backticks in `s`.
fn code_span(s: &str) -> String {
    let s = s.replace(['\r', '\n'], " ");
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if longest > 0 { " " } else { "" };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// The title, meta list, notes and the how-to-read paragraph.
fn md_header(meta: &Meta) -> String {
    let mut md = String::from("# edgetunnel comparison\n\n");
    md.push_str(&format!("- **Date:** {}\n", md_text(&meta.date)));
    md.push_str(&format!("- **Machine:** {}\n", md_text(&meta.machine)));
    md.push_str(&format!("- **Mode:** {}\n", md_text(&meta.mode)));
    md.push_str(&format!("- **Repetitions:** {}\n", meta.reps));
    md.push_str(&format!("- **Command:** {}\n\n", code_span(&meta.command)));
    if !meta.notes.is_empty() {
        md.push_str("**Notes**\n\n");
        for note in &meta.notes {
            md.push_str(&format!("- {}\n", md_text(note)));
        }
        md.push('\n');
    }
    md.push_str(
        "How to read: each cell is the median over the repetitions with (min–max) \
         in brackets; \"—\" means the system did not run that case, \"n/a\" that it \
         ran without a finite result. **direct (limit)** connects the client straight \
         to the target: no relay or tunnel can beat it. The ratio tables compare every \
         edgetunnel system with every other system so that a ratio > 1.0 always means \
         edgetunnel is better.\n\n",
    );
    md
}

/// The section of one scenario: its plot, then value and ratio tables per metric.
fn md_scenario(md: &mut String, scenario: &str, aggs: &[Agg], order: &[&str], plots: &[Plot]) {
    md.push_str(&format!("## {}\n\n", md_text(scenario)));
    for plot in plots.iter().filter(|p| p.scenario == scenario) {
        md.push_str(&format!("![{}]({})\n\n", md_text(&plot.title), plot.file));
    }
    for table in tables(aggs, scenario, order) {
        md.push_str(&format!(
            "### {} ({})\n\n",
            md_text(table.metric),
            direction(table.higher_is_better)
        ));
        md_values(md, &table);
        md_ratios(md, &table);
    }
}

/// A Markdown table row from its cells.
fn md_row<S: AsRef<str>>(cells: &[S]) -> String {
    let inner: Vec<&str> = cells.iter().map(|c| c.as_ref()).collect();
    format!("| {} |\n", inner.join(" | "))
}

/// The header and alignment rows: first `left` columns left-aligned, the rest right.
fn md_table_head(md: &mut String, head: &[String], left: usize) {
    md.push_str(&md_row(head));
    let align: Vec<&str> = (0..head.len())
        .map(|i| if i < left { "---" } else { "---:" })
        .collect();
    md.push_str(&md_row(&align));
}

/// The values table: rows = cases, columns = systems, cells median (min–max).
fn md_values(md: &mut String, t: &Table) {
    let mut head = vec!["case".to_string()];
    head.extend(t.systems.iter().map(|s| md_text(&system_label(s))));
    md_table_head(md, &head, 1);
    for case in &t.cases {
        let mut row = vec![md_text(case)];
        row.extend(
            t.systems
                .iter()
                .map(|s| t.get(case, s).map_or_else(|| "—".to_string(), cell)),
        );
        md.push_str(&md_row(&row));
    }
    md.push('\n');
}

/// The ratio table: one row per (case, edgetunnel system), one column per
/// other system, and the sentence that explains it; nothing when there is
/// nothing to compare.
fn md_ratios(md: &mut String, t: &Table) {
    let ets: Vec<&str> = t
        .systems
        .iter()
        .copied()
        .filter(|s| is_edgetunnel(s))
        .collect();
    let others: Vec<&str> = t
        .systems
        .iter()
        .copied()
        .filter(|s| !is_edgetunnel(s) || ets.len() > 1)
        .collect();
    let rows: Vec<Vec<String>> = t
        .cases
        .iter()
        .flat_map(|case| ets.iter().map(move |et| (case, et)))
        .filter_map(|(case, et)| ratio_row(t, case, et, &others))
        .collect();
    if rows.is_empty() {
        return;
    }
    let mut head = vec!["case".to_string(), "edgetunnel".to_string()];
    head.extend(
        others
            .iter()
            .map(|s| format!("vs {}", md_text(&system_label(s)))),
    );
    md_table_head(md, &head, 2);
    for row in rows {
        md.push_str(&md_row(&row));
    }
    md.push_str(&ratio_sentence(t));
}

/// The ratios of edgetunnel system `et` in `case` against `others`, or
/// None when it did not run the case or none of the others did.
fn ratio_row(t: &Table, case: &str, et: &str, others: &[&str]) -> Option<Vec<String>> {
    let mine = t.get(case, et)?;
    let ratios: Vec<Option<String>> = others
        .iter()
        .map(|&o| match t.get(case, o) {
            Some(theirs) if o != et => Some(fmt_ratio(ratio(mine, theirs))),
            _ => None,
        })
        .collect();
    if ratios.iter().all(Option::is_none) {
        return None;
    }
    let mut row = vec![md_text(case), md_text(et)];
    row.extend(
        ratios
            .into_iter()
            .map(|r| r.unwrap_or_else(|| "—".to_string())),
    );
    Some(row)
}

/// The sentence under a ratio table saying how the ratio is formed.
fn ratio_sentence(t: &Table) -> String {
    let formula = if t.higher_is_better {
        "edgetunnel median ÷ other median"
    } else {
        "other median ÷ edgetunnel median"
    };
    format!(
        "\nRatio = {formula} ({}: {}), so > 1.0 means the edgetunnel system is better \
         and < 1.0 that it is worse.\n\n",
        md_text(t.metric),
        direction(t.higher_is_better)
    )
}

// --------------------------------------------------------------------- JSON

/// The whole JSON document: meta, every sample (with cdf points) and the
/// aggregates the tables show.
fn report_json(samples: &[Sample], meta: &Meta) -> Value {
    json!({
        "meta": {
            "date": meta.date,
            "machine": meta.machine,
            "mode": meta.mode,
            "reps": meta.reps,
            "command": meta.command,
            "notes": meta.notes,
        },
        "samples": samples.iter().map(sample_json).collect::<Vec<_>>(),
        "summary": aggregate(samples).iter().map(agg_json).collect::<Vec<_>>(),
    })
}

/// One sample as JSON; non-finite numbers become null.
fn sample_json(s: &Sample) -> Value {
    json!({
        "scenario": s.scenario,
        "case": s.case,
        "system": s.system,
        "metric": s.metric,
        "value": s.value,
        "rep": s.rep,
        "higher_is_better": s.higher_is_better,
        "cdf": s.cdf.iter().map(|&(p, ms)| json!([p, ms])).collect::<Vec<_>>(),
    })
}

/// One aggregate as JSON.
fn agg_json(a: &Agg) -> Value {
    json!({
        "scenario": a.scenario,
        "case": a.case,
        "system": a.system,
        "metric": a.metric,
        "higher_is_better": a.higher_is_better,
        "reps": a.reps,
        "finite_reps": a.finite,
        "median": a.median,
        "min": a.min,
        "max": a.max,
    })
}

// ------------------------------------------------------------ plot planning

/// One SVG file to write: its name, the scenario it shows and how.
#[derive(Clone, Debug)]
struct Plot {
    file: String,
    scenario: String,
    title: String,
    kind: PlotKind,
}

/// What a plot draws.
#[derive(Clone, Debug)]
enum PlotKind {
    /// Latency CDF small multiples, one panel per case.
    Cdf,
    /// Grouped bars per case, one panel per metric listed.
    Bars(Vec<String>),
}

/// The plots of the report: one per scenario that has samples, latency as a
/// CDF when it has cdf points.
fn plan_plots(samples: &[Sample]) -> Vec<Plot> {
    let mut used = HashSet::new();
    let mut plots = Vec::new();
    for scenario in unique(samples.iter().map(|s| s.scenario.as_str())) {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.scenario == scenario).collect();
        let cdf = scenario == LATENCY && of.iter().any(|s| !s.cdf.is_empty());
        let stem = if cdf {
            "latency_cdf".to_string()
        } else {
            file_stem(scenario)
        };
        let file = unused_name(&mut used, &stem);
        let kind = if cdf {
            PlotKind::Cdf
        } else {
            PlotKind::Bars(bar_metrics(scenario, &of))
        };
        plots.push(Plot {
            file,
            scenario: scenario.to_string(),
            title: plot_title(scenario, cdf),
            kind,
        });
    }
    plots
}

/// The metrics drawn as bar panels: the scenario's headline metric when it
/// has one and it is present, otherwise every metric.
fn bar_metrics(scenario: &str, samples: &[&Sample]) -> Vec<String> {
    let preferred = match scenario {
        "bulk" => Some("Gbit/s"),
        "memory" => Some("bytes/conn"),
        _ => None,
    };
    let metrics = unique(samples.iter().map(|s| s.metric.as_str()));
    match preferred {
        Some(p) if metrics.contains(&p) => vec![p.to_string()],
        _ => metrics.into_iter().map(str::to_string).collect(),
    }
}

/// A file-name stem from a scenario name: lowercase letters, digits, '-' and '_'.
fn file_stem(scenario: &str) -> String {
    let stem: String = scenario
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    if stem.is_empty() || stem == "compare" {
        format!("plot_{stem}")
    } else {
        stem
    }
}

/// `stem.svg`, or `stem_2.svg`, ... when that name is already taken.
fn unused_name(used: &mut HashSet<String>, stem: &str) -> String {
    let mut name = format!("{stem}.svg");
    let mut n = 2;
    while !used.insert(name.clone()) {
        name = format!("{stem}_{n}.svg");
        n += 1;
    }
    name
}

/// The title of a scenario's plot.
fn plot_title(scenario: &str, cdf: bool) -> String {
    let what = match scenario {
        "bulk" => "throughput per case",
        LATENCY if cdf => "latency distribution per case (median repetition)",
        "memory" => "memory per connection",
        "dial" => "connection setup",
        "scaling" => "scaling",
        "hol" => "head-of-line blocking",
        _ => "results per case",
    };
    format!("{scenario}: {what}")
}

/// Renders every planned plot: (file name, SVG text).
fn render_plots(samples: &[Sample]) -> Vec<(String, String)> {
    let aggs = aggregate(samples);
    let order = unique(samples.iter().map(|s| s.system.as_str()));
    let styles = palette(&order);
    plan_plots(samples)
        .into_iter()
        .map(|plot| {
            let svg = match &plot.kind {
                PlotKind::Cdf => cdf_svg(&plot.title, &cdf_panels(samples, &order), &styles),
                PlotKind::Bars(metrics) => {
                    let panels: Vec<Table> = metrics
                        .iter()
                        .map(|m| Table::new(&aggs, &plot.scenario, m, &order))
                        .collect();
                    bars_svg(&plot.title, &panels, &styles)
                }
            };
            (plot.file, svg)
        })
        .collect()
}

// ------------------------------------------------------------------- colours

/// How one system is drawn, the same in every plot.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Style {
    color: &'static str,
    /// edgetunnel systems: strong colour, thicker lines, drawn on top.
    strong: bool,
    /// The direct limit: dashed line.
    dashed: bool,
}

/// Strong colours for edgetunnel variants beyond connect and gRPC.
const STRONG_EXTRA: [&str; 5] = ["#ff7f00", "#1b9e77", "#7b2cbf", "#e6007e", "#8c510a"];
/// Muted colours for peers the model does not name.
const MUTED_EXTRA: [&str; 4] = ["#a3a3a3", "#93c4bf", "#c9b77d", "#b7a6cf"];

/// A strong (edgetunnel) style.
fn strong(color: &'static str) -> Style {
    Style {
        color,
        strong: true,
        dashed: false,
    }
}

/// A muted (peer) style.
fn muted(color: &'static str) -> Style {
    Style {
        color,
        strong: false,
        dashed: false,
    }
}

/// The style of every system: fixed colours for the systems the model
/// names, then the extra palettes in order of first appearance.
fn palette<'a>(systems: &[&'a str]) -> HashMap<&'a str, Style> {
    let (mut n_strong, mut n_muted) = (0, 0);
    let mut next = |strong_pick: bool| {
        if strong_pick {
            n_strong += 1;
            strong(STRONG_EXTRA[(n_strong - 1) % STRONG_EXTRA.len()])
        } else {
            n_muted += 1;
            muted(MUTED_EXTRA[(n_muted - 1) % MUTED_EXTRA.len()])
        }
    };
    systems
        .iter()
        .map(|&name| {
            let style = match SystemKind::from_name(name) {
                Some(SystemKind::Direct) => Style {
                    color: "#4d4d4d",
                    strong: false,
                    dashed: true,
                },
                Some(SystemKind::Socat) => muted("#7fa7c9"),
                Some(SystemKind::Haproxy) => muted("#94b98a"),
                Some(SystemKind::Rathole) => muted("#d1a56c"),
                Some(SystemKind::SshR) => muted("#c28fb0"),
                Some(SystemKind::EdgetunnelConnect) => strong("#d7191c"),
                Some(SystemKind::EdgetunnelGrpc) => strong("#2155d9"),
                None => next(is_edgetunnel(name)),
            };
            (name, style)
        })
        .collect()
}

/// The style of a system, grey if it is unknown to the palette.
fn style_of(styles: &HashMap<&str, Style>, system: &str) -> Style {
    styles.get(system).copied().unwrap_or(muted("#999999"))
}

// ------------------------------------------------------------- SVG primitives

/// Plot width in pixels.
const WIDTH: f64 = 800.0;
/// Outer margin in pixels.
const MARGIN: f64 = 16.0;
/// Font stack: DejaVu Sans first so widths match the estimate below.
const FONT: &str = "DejaVu Sans, Verdana, Arial, sans-serif";

/// Escapes text for XML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' && c != '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Estimated rendered width of `s` at font `size` (DejaVu Sans averages ~0.6 em).
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.6
}

/// `s`, cut with an ellipsis so it fits `max_width` at font `size`.
fn fit(s: &str, size: f64, max_width: f64) -> String {
    if text_width(s, size) <= max_width {
        return s.to_string();
    }
    let keep = ((max_width / (size * 0.6)) as usize).saturating_sub(1);
    let mut out: String = s.chars().take(keep).collect();
    out.push('…');
    out
}

/// How a piece of text is set.
#[derive(Clone, Copy, Debug)]
struct Font {
    size: f64,
    anchor: &'static str,
    bold: bool,
    fill: &'static str,
}

impl Font {
    /// Regular dark text, left-anchored.
    fn new(size: f64) -> Font {
        Font {
            size,
            anchor: "start",
            bold: false,
            fill: "#222222",
        }
    }

    /// Anchored at its middle.
    fn middle(self) -> Font {
        Font {
            anchor: "middle",
            ..self
        }
    }

    /// Anchored at its end.
    fn end(self) -> Font {
        Font {
            anchor: "end",
            ..self
        }
    }

    /// Bold.
    fn bold(self) -> Font {
        Font { bold: true, ..self }
    }

    /// In another colour.
    fn fill(self, fill: &'static str) -> Font {
        Font { fill, ..self }
    }

    /// The SVG attributes of this font.
    fn attrs(&self) -> String {
        let weight = if self.bold {
            " font-weight=\"bold\""
        } else {
            ""
        };
        format!(
            "font-size=\"{}\" text-anchor=\"{}\" fill=\"{}\"{weight}",
            self.size, self.anchor, self.fill
        )
    }
}

/// An SVG document being drawn, one element per line.
#[derive(Default)]
struct Svg {
    body: String,
}

impl Svg {
    /// Appends one element.
    fn push(&mut self, element: String) {
        self.body.push_str("  ");
        self.body.push_str(&element);
        self.body.push('\n');
    }

    /// Text with its baseline at y.
    fn text(&mut self, x: f64, y: f64, font: Font, s: &str) {
        self.push(format!(
            "<text x=\"{x:.1}\" y=\"{y:.1}\" {}>{}</text>",
            font.attrs(),
            esc(s)
        ));
    }

    /// Text turned 90° counter-clockwise around (x, y), for y-axis labels.
    fn text_up(&mut self, x: f64, y: f64, font: Font, s: &str) {
        self.push(format!(
            "<text x=\"{x:.1}\" y=\"{y:.1}\" transform=\"rotate(-90 {x:.1} {y:.1})\" {}>{}</text>",
            font.attrs(),
            esc(s)
        ));
    }

    /// A straight line; `extra` holds further attributes (e.g. a dash array).
    fn line(
        &mut self,
        (x1, y1): (f64, f64),
        (x2, y2): (f64, f64),
        stroke: &str,
        width: f64,
        extra: &str,
    ) {
        self.push(format!(
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{stroke}\" stroke-width=\"{width}\"{extra}/>"
        ));
    }

    /// A filled rectangle; negative sizes are flipped.
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str) {
        let (x, w) = if w < 0.0 { (x + w, -w) } else { (x, w) };
        let (y, h) = if h < 0.0 { (y + h, -h) } else { (y, h) };
        self.push(format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{fill}\"/>"
        ));
    }

    /// A filled circle.
    fn circle(&mut self, x: f64, y: f64, r: f64, fill: &str) {
        self.push(format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{r}\" fill=\"{fill}\"/>"
        ));
    }

    /// The complete document with a white background and a `<title>`.
    fn finish(self, height: f64, title: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"{FONT}\">\n  <title>{t}</title>\n  \
             <rect width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\n{body}</svg>\n",
            w = WIDTH,
            h = height.ceil(),
            t = esc(title),
            body = self.body,
        )
    }
}

/// The line attributes of a style: width and dash pattern.
fn line_attrs(style: Style) -> (f64, &'static str) {
    let width = if style.strong { 2.6 } else { 1.6 };
    let dash = if style.dashed {
        " stroke-dasharray=\"6 3\""
    } else {
        ""
    };
    (width, dash)
}

/// Draws the title and subtitle; returns the y below them.
fn heading(svg: &mut Svg, title: &str, subtitle: &str) -> f64 {
    let width = WIDTH - 2.0 * MARGIN;
    svg.text(
        MARGIN,
        26.0,
        Font::new(17.0).bold(),
        &fit(title, 17.0, width),
    );
    svg.text(
        MARGIN,
        44.0,
        Font::new(11.5).fill("#555555"),
        &fit(subtitle, 11.5, width),
    );
    58.0
}

/// Draws the legend as rows of swatch + label starting at y; line swatches
/// for line plots, boxes for bar plots. Returns the y below it.
fn legend(svg: &mut Svg, items: &[(String, Style)], y: f64, lines: bool) -> f64 {
    let size = 11.5;
    let right = WIDTH - MARGIN;
    let (mut x, mut row) = (MARGIN, y + 8.0);
    for (label, style) in items {
        let label = fit(label, size, right - MARGIN - 24.0);
        let w = 22.0 + text_width(&label, size) + 18.0;
        if x > MARGIN && x + w > right {
            x = MARGIN;
            row += 18.0;
        }
        if lines {
            let (width, dash) = line_attrs(*style);
            svg.line((x, row), (x + 18.0, row), style.color, width, dash);
            svg.circle(x + 9.0, row, 2.6, style.color);
        } else {
            svg.rect(x, row - 6.0, 16.0, 11.0, style.color);
        }
        svg.text(x + 22.0, row + 4.0, Font::new(size), &label);
        x += w;
    }
    row + 16.0
}

/// Legend entries for the systems, in the order given.
fn legend_items(systems: &[&str], styles: &HashMap<&str, Style>) -> Vec<(String, Style)> {
    systems
        .iter()
        .map(|s| (system_label(s), style_of(styles, s)))
        .collect()
}

// ------------------------------------------------------------------- scales

/// Maps data values to pixels along one axis, linearly or by log10.
#[derive(Clone, Copy, Debug)]
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    /// Linear tick step (unused on log scales).
    step: f64,
    px0: f64,
    px1: f64,
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

impl Scale {
    /// A linear scale over [lo, hi] widened to include 0 and rounded to
    /// nice ticks, at most about `max_ticks` of them.
    fn linear(lo: f64, hi: f64, px: (f64, f64), max_ticks: usize) -> Scale {
        let (mut lo, mut hi) = (lo.min(0.0), hi.max(0.0));
        if !(lo.is_finite() && hi.is_finite()) || hi - lo <= 0.0 {
            (lo, hi) = (0.0, 1.0);
        }
        let step = nice_step((hi - lo) / max_ticks.max(1) as f64);
        Scale {
            lo: (lo / step).floor() * step,
            hi: (hi / step).ceil() * step,
            log: false,
            step,
            px0: px.0,
            px1: px.1,
        }
    }

    /// A log10 scale over [lo, hi] (both > 0) widened to whole decades.
    fn log(lo: f64, hi: f64, px: (f64, f64)) -> Scale {
        let (lo, hi) = if lo > 0.0 && hi >= lo && hi.is_finite() {
            (lo, hi)
        } else {
            (1.0, 10.0)
        };
        let e0 = lo.log10().floor();
        let e1 = hi.log10().ceil().max(e0 + 1.0);
        Scale {
            lo: 10f64.powf(e0),
            hi: 10f64.powf(e1),
            log: true,
            step: 0.0,
            px0: px.0,
            px1: px.1,
        }
    }

    /// The value as a position in 0..=1 of the domain (before clamping).
    fn unit(&self, v: f64) -> f64 {
        if self.log {
            (v.max(f64::MIN_POSITIVE).log10() - self.lo.log10())
                / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    /// The pixel of a value, clamped to the axis; NaN maps to the start.
    fn map(&self, v: f64) -> f64 {
        let u = self.unit(v);
        let u = if u.is_nan() { 0.0 } else { u.clamp(0.0, 1.0) };
        self.px0 + u * (self.px1 - self.px0)
    }

    /// Where bars start: 0 on linear scales, the bottom of a log scale.
    fn base(&self) -> f64 {
        if self.log {
            self.lo
        } else {
            0.0
        }
    }

    /// Tick values, thinned so labels of `label_width` pixels do not touch.
    fn ticks(&self, label_width: f64) -> Vec<f64> {
        let room = ((self.px1 - self.px0).abs() / (label_width + 14.0)).floor() as usize + 1;
        if self.log {
            log_ticks(self.lo, self.hi, room.max(2))
        } else {
            let n = ((self.hi - self.lo) / self.step).round().clamp(1.0, 200.0) as usize;
            let every = n.div_ceil(room.max(2) - 1).max(1);
            (0..=n)
                .step_by(every)
                .map(|k| clean_zero(self.lo + k as f64 * self.step))
                .collect()
        }
    }
}

/// Turns -0.0 (and rounding dust around zero) into 0.0.
fn clean_zero(v: f64) -> f64 {
    if v.abs() < 1e-12 {
        0.0
    } else {
        v
    }
}

/// Log ticks between two decades: 1-2-5 when there is room, else every
/// k-th decade.
fn log_ticks(lo: f64, hi: f64, room: usize) -> Vec<f64> {
    let e0 = lo.log10().round() as i32;
    let e1 = hi.log10().round() as i32;
    let decades: Vec<i32> = (e0..=e1).collect();
    let with_25: Vec<f64> = decades
        .iter()
        .flat_map(|&e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e)))
        .filter(|&v| v <= hi * 1.0001)
        .collect();
    if with_25.len() <= room {
        return with_25;
    }
    let every = decades.len().div_ceil(room).max(1);
    decades
        .iter()
        .step_by(every)
        .map(|&e| 10f64.powi(e))
        .collect()
}

/// Widest tick label among the ends of a scale's domain.
fn tick_label_width(lo: f64, hi: f64, size: f64) -> f64 {
    text_width(&fmt3(lo), size).max(text_width(&fmt3(hi), size))
}

// ---------------------------------------------------------------- bar plots

/// Height of one bar row.
const BAR_ROW: f64 = 15.0;
/// Height of a case header line above its bars.
const CASE_HEAD: f64 = 20.0;
/// Space after each case group.
const GROUP_GAP: f64 = 8.0;

/// Horizontal grouped bars: per panel (metric), per case a header and one
/// bar per system with a min–max whisker and the median printed.
fn bars_svg(title: &str, panels: &[Table], styles: &HashMap<&str, Style>) -> String {
    let mut svg = Svg::default();
    let mut y = heading(
        &mut svg,
        title,
        "bar: median over repetitions · whisker: min–max · number: median",
    );
    let systems = unique(panels.iter().flat_map(|t| t.systems.iter().copied()));
    y = legend(&mut svg, &legend_items(&systems, styles), y, false);
    let label_w = systems
        .iter()
        .map(|s| text_width(&system_label(s), 11.0) * bold_factor(style_of(styles, s)))
        .fold(90.0, f64::max)
        .min(300.0);
    for table in panels {
        y = bar_panel(&mut svg, table, styles, y + 8.0, label_w, panels.len() > 1);
    }
    svg.finish(y + MARGIN, title)
}

/// The value scale of a bar panel: log when all values are positive and
/// span more than 100×, linear from 0 otherwise.
fn bar_scale(table: &Table, px: (f64, f64)) -> Scale {
    let values: Vec<f64> = table
        .all()
        .flat_map(|a| [a.min, a.median, a.max])
        .filter(|v| v.is_finite())
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        return Scale::linear(0.0, 1.0, px, 5);
    }
    if lo > 0.0 && hi / lo > 100.0 {
        // Start a bit below the smallest value so its bar stays visible.
        return Scale::log(lo / 3.0, hi, px);
    }
    let label = tick_label_width(lo, hi, 10.5);
    let room = ((px.1 - px.0) / (label + 20.0)).floor().clamp(2.0, 8.0) as usize;
    Scale::linear(lo, hi, px, room)
}

/// Height of a bar panel's groups (without its axis).
fn groups_height(table: &Table) -> f64 {
    table
        .cases
        .iter()
        .map(|c| {
            let rows = table
                .systems
                .iter()
                .filter(|s| table.get(c, s).is_some())
                .count();
            CASE_HEAD + rows as f64 * BAR_ROW + GROUP_GAP
        })
        .sum()
}

/// Draws one metric's panel from `top`; returns the y below it.
fn bar_panel(
    svg: &mut Svg,
    t: &Table,
    styles: &HashMap<&str, Style>,
    top: f64,
    label_w: f64,
    header: bool,
) -> f64 {
    let mut y = top;
    if header {
        let text = format!("{} ({})", t.metric, direction(t.higher_is_better));
        svg.text(MARGIN, y + 12.0, Font::new(13.0).bold(), &text);
        y += 20.0;
    }
    let value_w = t
        .all()
        .map(|a| text_width(&fmt3(a.median), 10.5))
        .fold(24.0, f64::max);
    let px = (MARGIN + label_w + 12.0, WIDTH - MARGIN - value_w - 10.0);
    let scale = bar_scale(t, px);
    let bottom = y + groups_height(t);
    bar_grid(svg, &scale, y, bottom);
    for (i, case) in t.cases.iter().enumerate() {
        y = bar_group(svg, t, case, i, &scale, styles, y);
    }
    bar_axis(svg, t, &scale, bottom)
}

/// Vertical grid lines at the ticks between two y positions.
fn bar_grid(svg: &mut Svg, scale: &Scale, top: f64, bottom: f64) {
    let label = tick_label_width(scale.lo, scale.hi, 10.5);
    for v in scale.ticks(label) {
        let x = scale.map(v);
        svg.line((x, top), (x, bottom), "#e3e3e3", 1.0, "");
    }
}

/// Draws the header and bars of one case from `top`; returns the y below it.
fn bar_group(
    svg: &mut Svg,
    t: &Table,
    case: &str,
    index: usize,
    scale: &Scale,
    styles: &HashMap<&str, Style>,
    top: f64,
) -> f64 {
    let rows: Vec<&Agg> = t.systems.iter().filter_map(|s| t.get(case, s)).collect();
    let height = CASE_HEAD + rows.len() as f64 * BAR_ROW + GROUP_GAP / 2.0;
    if index % 2 == 1 {
        svg.rect(MARGIN, top, WIDTH - 2.0 * MARGIN, height, "#f5f5f5");
    }
    let font = Font::new(12.0).bold();
    svg.text(
        MARGIN + 4.0,
        top + 14.0,
        font,
        &fit(case, 12.0, WIDTH - 2.0 * MARGIN - 8.0),
    );
    let mut y = top + CASE_HEAD;
    for a in rows {
        bar_row(svg, a, scale, style_of(styles, a.system), y);
        y += BAR_ROW;
    }
    y + GROUP_GAP
}

/// How much wider bold labels (edgetunnel systems) set than regular ones.
fn bold_factor(style: Style) -> f64 {
    if style.strong {
        1.15
    } else {
        1.0
    }
}

/// One bar: system label, median bar, min–max whisker and the median value.
fn bar_row(svg: &mut Svg, a: &Agg, scale: &Scale, style: Style, top: f64) {
    let mid = top + BAR_ROW / 2.0;
    let room = (scale.px0 - MARGIN - 8.0) / bold_factor(style);
    let label = fit(&system_label(a.system), 11.0, room);
    let font = if style.strong {
        Font::new(11.0).end().bold()
    } else {
        Font::new(11.0).end()
    };
    svg.text(scale.px0 - 8.0, mid + 4.0, font, &label);
    if a.finite == 0 {
        svg.text(
            scale.px0 + 4.0,
            mid + 4.0,
            Font::new(10.5).fill("#777777"),
            "n/a",
        );
        return;
    }
    let x0 = scale.map(scale.base());
    let x1 = scale.map(a.median);
    svg.rect(x0, top + 2.0, x1 - x0, BAR_ROW - 4.0, style.color);
    let (wmin, wmax) = (scale.map(a.min), scale.map(a.max));
    if a.finite > 1 {
        svg.line((wmin, mid), (wmax, mid), "#222222", 1.2, "");
        svg.line((wmin, mid - 3.5), (wmin, mid + 3.5), "#222222", 1.2, "");
        svg.line((wmax, mid - 3.5), (wmax, mid + 3.5), "#222222", 1.2, "");
    }
    let x = x1.max(wmax).max(x0) + 5.0;
    svg.text(x, mid + 4.0, Font::new(10.5), &fmt3(a.median));
}

/// The x axis under a bar panel: line, tick labels and metric label;
/// returns the y below it.
fn bar_axis(svg: &mut Svg, t: &Table, scale: &Scale, y: f64) -> f64 {
    svg.line((scale.px0, y), (scale.px1, y), "#888888", 1.0, "");
    let label = tick_label_width(scale.lo, scale.hi, 10.5);
    for v in scale.ticks(label) {
        let x = scale.map(v);
        svg.line((x, y), (x, y + 4.0), "#888888", 1.0, "");
        svg.text(
            x,
            y + 16.0,
            Font::new(10.5).middle().fill("#444444"),
            &fmt3(v),
        );
    }
    let log = if scale.log { ", log scale" } else { "" };
    let arrow = if t.higher_is_better { " →" } else { "" };
    let text = format!(
        "{} ({}{log}){arrow}",
        t.metric,
        direction(t.higher_is_better)
    );
    let x = (scale.px0 + scale.px1) / 2.0;
    svg.text(
        x,
        y + 34.0,
        Font::new(11.5).middle(),
        &fit(&text, 11.5, scale.px1 - scale.px0),
    );
    y + 42.0
}

// ---------------------------------------------------------------- latency CDF

/// One small-multiple panel of the latency plot: a case and, per system,
/// the (percentile, ms) points of its median repetition.
struct CdfPanel<'a> {
    case: &'a str,
    lines: Vec<(&'a str, Vec<(f64, f64)>)>,
}

/// The panels of the latency CDF plot, cases and systems in order of first
/// appearance.
fn cdf_panels<'a>(samples: &'a [Sample], order: &[&'a str]) -> Vec<CdfPanel<'a>> {
    let lat: Vec<&Sample> = samples.iter().filter(|s| s.scenario == LATENCY).collect();
    unique(lat.iter().map(|s| s.case.as_str()))
        .into_iter()
        .map(|case| CdfPanel {
            case,
            lines: order
                .iter()
                .filter_map(|&sys| {
                    let of: Vec<&Sample> = lat
                        .iter()
                        .copied()
                        .filter(|s| s.case == case && s.system == sys)
                        .collect();
                    let pts = clean_cdf(&median_rep(&of)?.cdf);
                    (!pts.is_empty()).then_some((sys, pts))
                })
                .collect(),
        })
        .collect()
}

/// The repetition with the median value (lower middle for an even count)
/// among those with cdf points of the first metric that has any.
fn median_rep<'a>(samples: &[&'a Sample]) -> Option<&'a Sample> {
    let metric = &samples.iter().find(|s| !s.cdf.is_empty())?.metric;
    let mut reps: Vec<&Sample> = samples
        .iter()
        .copied()
        .filter(|s| &s.metric == metric && !s.cdf.is_empty())
        .collect();
    reps.sort_by(|a, b| a.value.total_cmp(&b.value));
    reps.get((reps.len() - 1) / 2).copied()
}

/// Finite points with percentile clamped to 0..=100 and ms > 0 (the x
/// axis is logarithmic), sorted by percentile.
fn clean_cdf(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|(p, ms)| p.is_finite() && ms.is_finite() && *ms > 0.0)
        .map(|&(p, ms)| (p.clamp(0.0, 100.0), ms))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    pts
}

/// The percentile axis, -log10(1 - p/100), so that 90, 99, 99.9, ... are
/// evenly spaced; p = 100 is drawn on a "max" line above the last nine.
#[derive(Clone, Copy, Debug)]
struct TailAxis {
    /// Number of nines shown (2 = up to p99, 4 = up to p99.99).
    nines: u32,
    /// Whether any point is at p100.
    has_max: bool,
}

impl TailAxis {
    /// The axis that shows every point of every panel.
    fn of(panels: &[CdfPanel]) -> TailAxis {
        let points = panels
            .iter()
            .flat_map(|p| p.lines.iter().flat_map(|l| l.1.iter()));
        let mut deepest: f64 = 0.0;
        let mut has_max = false;
        for &(p, _) in points {
            if p >= 100.0 {
                has_max = true;
            } else {
                deepest = deepest.max(tail(p));
            }
        }
        let nines = (deepest - 1e-6).ceil().clamp(2.0, 6.0) as u32;
        TailAxis { nines, has_max }
    }

    /// Top of the axis in tail units.
    fn top(&self) -> f64 {
        self.nines as f64 + if self.has_max { 0.6 } else { 0.0 }
    }

    /// A percentile in tail units, clamped to the axis.
    fn value(&self, p: f64) -> f64 {
        if p >= 100.0 {
            self.top()
        } else {
            tail(p).clamp(0.0, self.top())
        }
    }

    /// (percentile, label) of the ticks: 50, 90, 99, 99.9, ... and "max".
    fn ticks(&self) -> Vec<(f64, String)> {
        let mut ticks = vec![(50.0, "50".to_string())];
        for k in 1..=self.nines {
            let p = 100.0 - 100.0 / 10f64.powi(k as i32);
            let decimals = k.saturating_sub(2) as usize;
            ticks.push((p, format!("{p:.decimals$}")));
        }
        if self.has_max {
            ticks.push((100.0, "max".to_string()));
        }
        ticks
    }
}

/// -log10(1 - p/100): 0 at p0, 1 at p90, 2 at p99, ...
fn tail(p: f64) -> f64 {
    -(1.0 - p / 100.0).max(1e-12).log10()
}

/// Height of one CDF panel cell.
const CDF_CELL_H: f64 = 250.0;

/// Small multiples of latency CDFs: a grid of panels (two columns), one line
/// per system, shared legend and percentile axis.
fn cdf_svg(title: &str, panels: &[CdfPanel], styles: &HashMap<&str, Style>) -> String {
    let mut svg = Svg::default();
    let mut y = heading(
        &mut svg,
        title,
        "x: latency in ms (log scale) · y: percentile, stretched so the tail is visible",
    );
    let systems = unique(panels.iter().flat_map(|p| p.lines.iter().map(|l| l.0)));
    y = legend(&mut svg, &legend_items(&systems, styles), y, true);
    let axis = TailAxis::of(panels);
    let cols = if panels.len() <= 1 { 1 } else { 2 };
    let cell_w = (WIDTH - 2.0 * MARGIN) / cols as f64;
    for (i, panel) in panels.iter().enumerate() {
        let x = MARGIN + (i % cols) as f64 * cell_w;
        let top = y + (i / cols) as f64 * CDF_CELL_H;
        cdf_panel(&mut svg, panel, (x, top, cell_w), &axis, styles);
    }
    let rows = panels.len().div_ceil(cols);
    svg.finish(y + rows as f64 * CDF_CELL_H + MARGIN, title)
}

/// Draws one CDF panel in the cell (x, y, width).
fn cdf_panel(
    svg: &mut Svg,
    panel: &CdfPanel,
    (x, y, w): (f64, f64, f64),
    axis: &TailAxis,
    styles: &HashMap<&str, Style>,
) {
    let (px0, px1) = (x + 58.0, x + w - 14.0);
    let (py0, py1) = (y + CDF_CELL_H - 44.0, y + 26.0);
    let title = fit(panel.case, 12.5, px1 - px0);
    svg.text(
        (px0 + px1) / 2.0,
        y + 16.0,
        Font::new(12.5).bold().middle(),
        &title,
    );
    let ms = panel.lines.iter().flat_map(|l| l.1.iter().map(|p| p.1));
    let lo = ms.clone().fold(f64::INFINITY, f64::min);
    let hi = ms.fold(f64::NEG_INFINITY, f64::max);
    let xs = Scale::log(lo, hi, (px0, px1));
    let ys = |p: f64| py0 + axis.value(p) / axis.top() * (py1 - py0);
    cdf_axes(svg, &xs, axis, &ys, (py0, py1));
    svg.text_up(
        x + 12.0,
        (py0 + py1) / 2.0,
        Font::new(11.0).middle(),
        "percentile",
    );
    if panel.lines.is_empty() {
        let font = Font::new(11.0).middle().fill("#777777");
        svg.text((px0 + px1) / 2.0, (py0 + py1) / 2.0, font, "no CDF data");
        return;
    }
    let mut lines: Vec<&(&str, Vec<(f64, f64)>)> = panel.lines.iter().collect();
    lines.sort_by_key(|l| style_of(styles, l.0).strong);
    for (system, pts) in lines {
        let mapped: Vec<(f64, f64)> = pts.iter().map(|&(p, ms)| (xs.map(ms), ys(p))).collect();
        cdf_line(svg, &mapped, style_of(styles, system));
    }
}

/// Grid, ticks and labels of a CDF panel.
fn cdf_axes(
    svg: &mut Svg,
    xs: &Scale,
    axis: &TailAxis,
    ys: &dyn Fn(f64) -> f64,
    (py0, py1): (f64, f64),
) {
    let tick_font = Font::new(10.0).fill("#444444");
    for (p, label) in axis.ticks() {
        let y = ys(p);
        svg.line((xs.px0, y), (xs.px1, y), "#e3e3e3", 1.0, "");
        svg.text(xs.px0 - 5.0, y + 3.5, tick_font.end(), &label);
    }
    let label_w = tick_label_width(xs.lo, xs.hi, 10.0);
    for v in xs.ticks(label_w) {
        let x = xs.map(v);
        svg.line((x, py1), (x, py0), "#e3e3e3", 1.0, "");
        svg.text(x, py0 + 14.0, tick_font.middle(), &fmt3(v));
    }
    svg.line((xs.px0, py0), (xs.px1, py0), "#888888", 1.0, "");
    svg.line((xs.px0, py0), (xs.px0, py1), "#888888", 1.0, "");
    let mid = (xs.px0 + xs.px1) / 2.0;
    svg.text(
        mid,
        py0 + 30.0,
        Font::new(11.0).middle(),
        "latency (ms, log scale)",
    );
}

/// A CDF line with a dot at each point.
fn cdf_line(svg: &mut Svg, pts: &[(f64, f64)], style: Style) {
    let (width, dash) = line_attrs(style);
    let coords: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    svg.push(format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{width}\" stroke-linejoin=\"round\"{dash}/>",
        coords.join(" "),
        style.color
    ));
    let r = if style.strong { 3.0 } else { 2.3 };
    for &(x, y) in pts {
        svg.circle(x, y, r, style.color);
    }
}

// --------------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample with no cdf points.
    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn sample(scenario: &str, case: &str, system: &str, value: f64, rep: u32) -> Sample {
        Sample {
            scenario: scenario.into(),
            case: case.into(),
            system: system.into(),
            metric: "Gbit/s".into(),
            value,
            rep,
            higher_is_better: true,
            cdf: Vec::new(),
        }
    }

    #[test]
    fn formats_three_significant_digits() {
        assert_eq!(fmt3(8.58), "8.58");
        assert_eq!(fmt3(7.9), "7.9");
        assert_eq!(fmt3(31046.0), "31,046");
        assert_eq!(fmt3(999.7), "1,000");
        assert_eq!(fmt3(0.01234), "0.0123");
        assert_eq!(fmt3(-1234567.0), "-1,234,567");
        assert_eq!(fmt3(f64::NAN), "n/a");
        assert_eq!(fmt3(0.0), "0");
    }

    #[test]
    fn median_min_max_in_first_appearance_order() {
        let s = vec![
            sample("bulk", "b", "direct", 3.0, 0),
            sample("bulk", "a", "direct", 1.0, 0),
            sample("bulk", "b", "direct", 1.0, 1),
            sample("bulk", "b", "direct", 2.0, 2),
        ];
        let aggs = aggregate(&s);
        assert_eq!(aggs[0].case, "b");
        assert_eq!((aggs[0].median, aggs[0].min, aggs[0].max), (2.0, 1.0, 3.0));
        assert_eq!(aggs[1].case, "a");
    }

    #[test]
    fn odd_input_does_not_panic() {
        let mut lat = sample(LATENCY, "idle", "edgetunnel-grpc", f64::NAN, 0);
        lat.cdf = vec![(50.0, f64::NAN), (100.0, 0.0)];
        let s = vec![
            sample("bulk", "a", "edgetunnel-connect", f64::NAN, 0),
            sample("bulk", "b", "socat", 0.0, 0),
            sample("x <&> \"y\"", "c|d", "direct", f64::INFINITY, 0),
            lat,
        ];
        let md = markdown(&s, &Meta::default());
        assert!(md.contains("c\\|d"));
        assert!(summary_line(&s).contains("not finite"));
        assert_eq!(summary_line(&[]), "no samples");
        for (_, svg) in render_plots(&s) {
            assert!(!svg.contains("NaN") && !svg.contains("<&>"));
        }
    }

    #[test]
    fn ratio_above_one_means_edgetunnel_better() {
        let mut s = vec![
            sample("dial", "c", "haproxy", 2.0, 0),
            sample("dial", "c", "edgetunnel-connect", 1.0, 0),
        ];
        for x in &mut s {
            x.higher_is_better = false;
        }
        let aggs = aggregate(&s);
        assert_eq!(ratio(&aggs[1], &aggs[0]), 2.0);
    }
}
