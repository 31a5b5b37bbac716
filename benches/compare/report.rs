//! Report of the comparison harness: aggregates the [`Sample`]s of all
//! repetitions and writes `compare.json` (every sample), `compare.md`
//! (tables of medians and edgetunnel ratios) and SVG plots.
//!
//! The plots are drawn by [`plot`] (plotters, SVG backend). The output is
//! deterministic: the only time stamp is [`Meta::date`].

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::model::{Sample, SystemKind};
use super::plot;

// A path, because tests/bench_report.rs includes this file by path too.
#[path = "report/anchors.rs"]
mod anchors;

/// Facts about the run, printed at the top of the report and kept in the JSON.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meta {
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
pub(super) const LATENCY: &str = "latency";

/// Writes into out_dir: compare.json (meta + every sample, including cdf
/// points), compare.md (the Markdown report), and SVG plots; returns the
/// paths written.
pub(crate) fn write_all(
    samples: &[Sample],
    meta: &Meta,
    out_dir: &Path,
) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir)?;
    let json =
        serde_json::to_string_pretty(&report_json(samples, meta)).map_err(io::Error::other)?;
    let mut files = vec![
        ("compare.json".to_string(), json + "\n"),
        ("compare.md".to_string(), markdown(samples, meta)),
    ];
    files.extend(render_plots(samples)?);
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
pub(crate) fn markdown(samples: &[Sample], meta: &Meta) -> String {
    let aggs = aggregate(samples);
    let order = unique(samples.iter().map(|s| s.system.as_str()));
    let plots = plan_plots(samples);
    let mut md = md_header(meta);
    if samples.is_empty() {
        md.push_str("No samples were collected.\n");
    }
    md.push_str(&anchors::section(samples));
    for scenario in unique(samples.iter().map(|s| s.scenario.as_str())) {
        // The soak's figures are points of one run, not cases to compare
        // by ratio: its own tables only.
        if scenario == crate::soak_table::SCENARIO {
            md_plots(&mut md, scenario, &plots);
            md.push_str(&crate::soak_table::table(samples));
            continue;
        }
        // Counts per replacement, not cases to compare by ratio.
        if scenario == crate::upgrade_table::SCENARIO {
            md_plots(&mut md, scenario, &plots);
            md.push_str(&crate::upgrade_table::table(samples));
            continue;
        }
        md_scenario(&mut md, scenario, &aggs, &order, &plots);
        if scenario == "fleet" {
            md.push_str(&crate::fleet_table::table(samples));
        }
    }
    md
}

/// One-line progress summary of a group of reps (median, min, max, unit)
/// for the terminal.
pub(crate) fn summary_line(samples: &[Sample]) -> String {
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

/// Terminal ratio lines of one case: per edgetunnel system, per peer, the
/// ratio of each of `metrics` (> 1 = edgetunnel better; "-" when the peer
/// has no such figure, e.g. CPU of direct), e.g.
/// "edgetunnel-connect vs haproxy: Gbit/s 0.82x, CPU s/GB 1.10x".
pub(crate) fn ratio_lines(samples: &[Sample], metrics: &[&str]) -> Vec<String> {
    let aggs = aggregate(samples);
    let order = unique(samples.iter().map(|s| s.system.as_str()));
    let ets: Vec<&str> = order.iter().copied().filter(|s| is_edgetunnel(s)).collect();
    let find =
        |sys: &str, metric: &str| aggs.iter().find(|a| a.system == sys && a.metric == metric);
    let mut lines = Vec::new();
    for &et in &ets {
        for &other in order.iter().filter(|&&o| o != et) {
            let parts: Vec<String> = metrics
                .iter()
                .filter_map(|&m| {
                    let mine = find(et, m)?;
                    let r = find(other, m).map_or_else(
                        || "-".to_string(),
                        |theirs| format!("{}x", fmt_ratio(ratio(mine, theirs))),
                    );
                    Some(format!("{m} {r}"))
                })
                .collect();
            if !parts.is_empty() {
                lines.push(format!("{et} vs {other}: {}", parts.join(", ")));
            }
        }
    }
    lines
}

// ---------------------------------------------------------------- aggregation

/// Median, min and max over the repetitions of one
/// (scenario, case, metric, system) group.
#[derive(Clone, Debug)]
pub(super) struct Agg<'a> {
    scenario: &'a str,
    case: &'a str,
    pub(super) metric: &'a str,
    pub(super) system: &'a str,
    pub(super) higher_is_better: bool,
    /// Samples in the group.
    reps: usize,
    /// Samples with a finite value; only those enter median, min and max.
    pub(super) finite: usize,
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
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
pub(super) fn unique<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    items.into_iter().filter(|s| seen.insert(*s)).collect()
}

/// Whether a system label is an edgetunnel system (e.g. "edgetunnel-grpc",
/// "edgetunnel-connect --workers 1").
pub(super) fn is_edgetunnel(system: &str) -> bool {
    system.starts_with("edgetunnel")
}

/// Whether a system label is the direct connection, the limit.
fn is_direct(system: &str) -> bool {
    system == SystemKind::Direct.name()
}

/// The label of a system in headers and legends: direct is marked as the limit.
pub(super) fn system_label(system: &str) -> String {
    if is_direct(system) {
        format!("{system} (limit)")
    } else {
        system.to_string()
    }
}

/// Context metric: the busiest thread of a system over a run, in cores
/// (1.0 = one core busy all the time).
pub(crate) const BUSIEST_THREAD: &str = "busiest thread, cores";
/// Context metric: the share of all CPUs' time the machine was idle over a
/// run, percent.
pub(crate) const MACHINE_IDLE: &str = "machine idle %";
/// Metrics that tell where the CPU went rather than how good a system is:
/// their values are reported without ratio tables.
pub(crate) const CONTEXT_METRICS: [&str; 2] = [BUSIEST_THREAD, MACHINE_IDLE];

/// "higher is better" or "lower is better".
pub(super) fn direction(higher_is_better: bool) -> &'static str {
    if higher_is_better {
        "higher is better"
    } else {
        "lower is better"
    }
}

/// The aggregates of one (scenario, metric): rows = cases, columns = systems.
pub(super) struct Table<'a> {
    pub(super) metric: &'a str,
    pub(super) higher_is_better: bool,
    pub(super) cases: Vec<&'a str>,
    pub(super) systems: Vec<&'a str>,
    cells: HashMap<(&'a str, &'a str), &'a Agg<'a>>,
    /// (case, system) pairs that ran in the scenario under any metric: a
    /// missing cell of such a pair is a figure that does not apply (CPU
    /// of direct, which has no process), shown as "-".
    ran: HashSet<(&'a str, &'a str)>,
}

impl<'a> Table<'a> {
    /// The table of `metric` in `scenario`; systems follow `order`.
    fn new(aggs: &'a [Agg<'a>], scenario: &str, metric: &'a str, order: &[&'a str]) -> Self {
        let rows: Vec<&'a Agg<'a>> = aggs
            .iter()
            .filter(|a| a.scenario == scenario && a.metric == metric)
            .collect();
        let in_scenario = || aggs.iter().filter(|a| a.scenario == scenario);
        let present: HashSet<&str> = in_scenario().map(|a| a.system).collect();
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
            ran: in_scenario().map(|a| (a.case, a.system)).collect(),
        }
    }

    /// Whether `system` has a value in any case of the table.
    fn has_values(&self, system: &str) -> bool {
        self.cases.iter().any(|c| self.get(c, system).is_some())
    }

    /// The Markdown cell of (case, system): median (min–max), "-" when the
    /// figure does not apply to a system that ran the case, "—" when the
    /// system did not run it.
    fn md_cell(&self, case: &str, system: &str) -> String {
        match self.get(case, system) {
            Some(a) => cell(a),
            None if self.ran.contains(&(case, system)) => "-".to_string(),
            None => "—".to_string(),
        }
    }

    /// The aggregate of a cell, if that system ran that case.
    pub(super) fn get(&self, case: &str, system: &str) -> Option<&'a Agg<'a>> {
        self.cells.get(&(case, system)).copied()
    }

    /// Every aggregate of the table, row by row.
    pub(super) fn all(&self) -> impl Iterator<Item = &'a Agg<'a>> + '_ {
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
pub(super) fn fmt3(v: f64) -> String {
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
         ran without a finite result, \"-\" that the figure does not apply (direct has \
         no relay process, so no CPU figure). **CPU s/GB** is the CPU time (user + system) \
         of all the system's processes (server and agent, or the relay processes and \
         their children), read from /proc right before and after the transfer, per 10^9 \
         payload bytes moved. **direct (limit)** connects the client straight \
         to the target: no relay or tunnel can beat it. The ratio tables compare every \
         edgetunnel system with every other system so that a ratio > 1.0 always means \
         edgetunnel is better.\n\n",
    );
    md
}

/// The section of one scenario: its plot, then value and ratio tables per metric.
fn md_scenario(md: &mut String, scenario: &str, aggs: &[Agg], order: &[&str], plots: &[Plot]) {
    md_plots(md, scenario, plots);
    for table in tables(aggs, scenario, order) {
        let context = CONTEXT_METRICS.contains(&table.metric);
        md.push_str(&format!(
            "### {} ({})\n\n",
            md_text(table.metric),
            if context {
                "where the CPU went: context, not a score"
            } else {
                direction(table.higher_is_better)
            }
        ));
        md_values(md, &table);
        if !context {
            md_ratios(md, &table);
        }
    }
}

/// The heading of a scenario's section and its plots.
fn md_plots(md: &mut String, scenario: &str, plots: &[Plot]) {
    md.push_str(&format!("## {}\n\n", md_text(scenario)));
    for plot in plots.iter().filter(|p| p.scenario == scenario) {
        md.push_str(&format!("![{}]({})\n\n", md_text(&plot.title), plot.file));
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
        row.extend(t.systems.iter().map(|s| t.md_cell(case, s)));
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
        .filter(|s| (!is_edgetunnel(s) || ets.len() > 1) && t.has_values(s))
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

/// Reads back what [`write_all`] wrote to `compare.json`: the samples and
/// the meta (to write the report again with a newer harness:
/// `--rereport DIR`).
pub(crate) fn read_json(path: &Path) -> io::Result<(Vec<Sample>, Meta)> {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(path)?).map_err(io::Error::other)?;
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let m = &v["meta"];
    let meta = Meta {
        date: text(m, "date"),
        machine: text(m, "machine"),
        mode: text(m, "mode"),
        reps: m["reps"].as_u64().unwrap_or(0) as u32,
        command: text(m, "command"),
        notes: m["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect(),
    };
    let samples = v["samples"]
        .as_array()
        .ok_or_else(|| io::Error::other("compare.json has no samples"))?
        .iter()
        .map(|s| Sample {
            scenario: text(s, "scenario"),
            case: text(s, "case"),
            system: text(s, "system"),
            metric: text(s, "metric"),
            value: s["value"].as_f64().unwrap_or(f64::NAN),
            rep: s["rep"].as_u64().unwrap_or(0) as u32,
            higher_is_better: s["higher_is_better"].as_bool().unwrap_or(false),
            cdf: points(&s["cdf"]),
            series: points(&s["series"]),
        })
        .collect();
    Ok((samples, meta))
}

/// [x, y] pairs of a JSON array (none when absent).
fn points(v: &Value) -> Vec<(f64, f64)> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
        .collect()
}

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

/// One sample as JSON; non-finite numbers become null. `series` only
/// when it has points (the soak's curves).
fn sample_json(s: &Sample) -> Value {
    let mut v = json!({
        "scenario": s.scenario,
        "case": s.case,
        "system": s.system,
        "metric": s.metric,
        "value": s.value,
        "rep": s.rep,
        "higher_is_better": s.higher_is_better,
        "cdf": s.cdf.iter().map(|&(p, ms)| json!([p, ms])).collect::<Vec<_>>(),
    });
    if !s.series.is_empty() {
        v["series"] = s.series.iter().map(|&(x, y)| json!([x, y])).collect();
    }
    v
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
    /// Line charts of the samples' series, one panel per metric listed.
    Series(Vec<String>),
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
        let series = unique(
            of.iter()
                .filter(|s| !s.series.is_empty())
                .map(|s| s.metric.as_str()),
        );
        let kind = if cdf {
            PlotKind::Cdf
        } else if !series.is_empty() {
            PlotKind::Series(series.into_iter().map(str::to_string).collect())
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
    let preferred: &[&str] = match scenario {
        "bulk" => &["Gbit/s", "CPU s/GB"],
        "memory" => &["bytes/conn"],
        "upgrade" => &["failed dials", "tunnels cut"],
        _ => &[],
    };
    let metrics = unique(samples.iter().map(|s| s.metric.as_str()));
    let picked: Vec<String> = preferred
        .iter()
        .filter(|p| metrics.contains(p))
        .map(|p| p.to_string())
        .collect();
    if picked.is_empty() {
        metrics.into_iter().map(str::to_string).collect()
    } else {
        picked
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
        "soak" => "memory against tunnels served",
        "upgrade" => "failures while the server is replaced",
        _ => "results per case",
    };
    format!("{scenario}: {what}")
}

/// Renders every planned plot: (file name, SVG text).
fn render_plots(samples: &[Sample]) -> io::Result<Vec<(String, String)>> {
    let aggs = aggregate(samples);
    let order = unique(samples.iter().map(|s| s.system.as_str()));
    let styles = plot::palette(&order);
    plan_plots(samples)
        .into_iter()
        .map(|p| {
            let svg = match &p.kind {
                PlotKind::Cdf => {
                    plot::cdf_svg(&p.title, &plot::cdf_panels(samples, &order), &styles)
                }
                PlotKind::Bars(metrics) => {
                    let panels: Vec<Table> = metrics
                        .iter()
                        .map(|m| Table::new(&aggs, &p.scenario, m, &order))
                        .collect();
                    plot::bars_svg(&p.title, &panels, &styles)
                }
                PlotKind::Series(metrics) => {
                    let panels = plot::series_panels(samples, &p.scenario, metrics, &order);
                    plot::series_svg(&p.title, "tunnels served", &panels, &styles)
                }
            };
            svg.map(|svg| (p.file, svg)).map_err(io::Error::other)
        })
        .collect()
}

// --------------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample with no cdf points.
    #[allow(dead_code)] // only #[test]s use it, and bench builds drop those
    fn sample(scenario: &str, case: &str, system: &str, value: f64, rep: u32) -> Sample {
        Sample {
            rep,
            higher_is_better: true,
            ..Sample::of(scenario, case, system, "Gbit/s", value)
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
        for (_, svg) in render_plots(&s).unwrap() {
            assert!(!svg.contains("NaN") && !svg.contains("<&>"));
        }
    }

    /// Bulk samples of one case: Gbit/s for all, CPU s/GB for all but direct.
    #[allow(dead_code)]
    fn bulk_with_cpu() -> Vec<Sample> {
        let mut s = Vec::new();
        for (sys, gbps, cpu) in [
            ("direct", 20.0, None),
            ("haproxy", 10.0, Some(2.0)),
            ("edgetunnel-connect", 8.0, Some(1.0)),
        ] {
            s.push(sample("bulk", "1 stream upload", sys, gbps, 0));
            if let Some(c) = cpu {
                let mut x = sample("bulk", "1 stream upload", sys, c, 0);
                x.metric = "CPU s/GB".into();
                x.higher_is_better = false;
                s.push(x);
            }
        }
        s
    }

    #[test]
    fn cpu_per_gb_next_to_throughput() {
        let s = bulk_with_cpu();
        let md = markdown(&s, &Meta::default());
        // The CPU table shows direct as "-" (no process), not "—" (not run).
        let cpu = &md[md.find("### CPU s/GB").expect("CPU table")..];
        assert!(cpu.contains("| 1 stream upload | - | 2 | 1 |"), "{cpu}");
        // Its ratio table has no direct column; less CPU = better.
        assert!(
            cpu.contains("| 1 stream upload | edgetunnel-connect | 2.00 |"),
            "{cpu}"
        );
        assert_eq!(
            ratio_lines(&s, &["Gbit/s", "CPU s/GB"]),
            vec![
                "edgetunnel-connect vs direct: Gbit/s 0.40x, CPU s/GB -",
                "edgetunnel-connect vs haproxy: Gbit/s 0.80x, CPU s/GB 2.00x",
            ]
        );
        // The bulk plot has both panels, drawn by plotters.
        let plots = render_plots(&s).unwrap();
        assert_eq!(plots.len(), 1);
        let svg = &plots[0].1;
        assert!(svg.starts_with("<svg") && svg.contains("<title>bulk: "));
        assert!(svg.contains("CPU s/GB (lower is better)"));
        assert!(svg.contains("Gbit/s (higher is better)"));
        assert!(svg.contains("edgetunnel-connect") && svg.contains("direct (limit)"));
    }

    #[test]
    fn context_metrics_have_values_but_no_ratios() {
        let mut s = Vec::new();
        for (sys, gbps, busiest) in [
            ("edgetunnel-connect --workers 1", 6.0, 0.6),
            ("edgetunnel-connect --workers 2", 6.5, 0.35),
        ] {
            s.push(sample("scaling", "64 streams download", sys, gbps, 0));
            let mut x = sample("scaling", "64 streams download", sys, busiest, 0);
            x.metric = BUSIEST_THREAD.into();
            x.higher_is_better = false;
            s.push(x);
        }
        let md = markdown(&s, &Meta::default());
        let ctx = &md[md.find("### busiest thread").expect("context table")..];
        assert!(
            ctx.starts_with("### busiest thread, cores (where the CPU went"),
            "{ctx}"
        );
        assert!(
            ctx.contains("| 64 streams download | 0.6 | 0.35 |"),
            "{ctx}"
        );
        assert!(!ctx.contains("vs edgetunnel"), "{ctx}");
        // Gbit/s keeps its ratio table.
        let gbps = &md[md.find("### Gbit/s").unwrap()..md.find("### busiest").unwrap()];
        assert!(gbps.contains("vs edgetunnel-connect --workers 1"), "{gbps}");
    }

    #[test]
    fn a_series_is_a_line_plot_and_kept_in_the_json() {
        let mut s = Vec::new();
        for (sys, role, peak) in [
            ("edgetunnel-connect", "server", 21.0),
            ("edgetunnel-connect", "agent", 19.0),
            ("anp-uds", "server", 60.0),
        ] {
            let mut x = sample("run", &format!("{role}: peak"), sys, peak, 0);
            x.metric = "RSS MB".into();
            x.series = vec![(0.0, peak - 1.0), (10_000.0, peak), (20_000.0, peak)];
            s.push(x);
        }
        let plots = render_plots(&s).unwrap();
        assert_eq!(plots.len(), 1);
        let (file, svg) = &plots[0];
        assert_eq!(file, "run.svg");
        for word in [
            "RSS MB",
            "tunnels served",
            "anp-uds",
            "edgetunnel-connect",
            "agent",
        ] {
            assert!(svg.contains(word), "{word} missing");
        }
        // compare.json keeps the series, and only where there is one.
        assert_eq!(points(&sample_json(&s[0])["series"]), s[0].series);
        let plain = sample("bulk", "a", "direct", 1.0, 0);
        assert!(sample_json(&plain).get("series").is_none());
    }

    #[test]
    fn the_soak_has_its_own_tables_and_no_ratios() {
        let mut anp = sample("soak", "server: peak", "anp-uds", 60.0, 0);
        anp.metric = "RSS MB".into();
        anp.higher_is_better = false;
        anp.series = vec![(0.0, 59.0), (10_000.0, 60.0)];
        let ours = Sample {
            system: "edgetunnel-connect".into(),
            value: 21.0,
            ..anp.clone()
        };
        let md = markdown(&[anp, ours], &Meta::default());
        assert!(
            md.contains("![soak: memory against tunnels served](soak.svg)"),
            "{md}"
        );
        assert!(md.contains("### soak: RSS, MB"), "{md}");
        assert!(!md.contains("vs anp-uds"), "{md}");
        // No figure of the anchors' section: no empty section either.
        assert!(!md.contains("Against the anchors"), "{md}");
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
