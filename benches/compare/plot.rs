//! The report's plots, drawn with `plotters` on its SVG backend (no font
//! library: plotters' built-in estimate sizes text, the viewer's fonts set
//! it). Three kinds: grouped horizontal bars (median bar, min–max whisker,
//! median printed; one panel per metric, e.g. Gbit/s and CPU s/GB),
//! latency CDF small multiples with a stretched tail axis, and stacked
//! line charts of series (the soak's memory against tunnels served).
//!
//! The colours are the same in every plot: edgetunnel systems strong and
//! drawn on top, peers muted, direct (the limit) dashed grey. Output is
//! deterministic.

use std::collections::HashMap;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::model::{Sample, SystemKind};
use super::report::{direction, fmt3, is_edgetunnel, system_label, unique, Agg, Table, LATENCY};

/// Errors of a drawing, as text (plotters' error types borrow the backend).
pub(crate) type DrawResult<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing a plot: {e}")
}

// ------------------------------------------------------------------- colours

/// How one system is drawn, the same in every plot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Style {
    color: RGBColor,
    /// edgetunnel systems: strong colour, thicker lines, drawn on top.
    strong: bool,
    /// The direct limit: dashed line.
    dashed: bool,
}

/// Strong colours for edgetunnel variants beyond connect and gRPC.
const STRONG_EXTRA: [u32; 5] = [0xff7f00, 0x1b9e77, 0x7b2cbf, 0xe6007e, 0x8c510a];
/// Muted colours for peers the model does not name.
const MUTED_EXTRA: [u32; 4] = [0xa3a3a3, 0x93c4bf, 0xc9b77d, 0xb7a6cf];

/// A colour from 0xRRGGBB.
fn rgb(hex: u32) -> RGBColor {
    RGBColor((hex >> 16) as u8, (hex >> 8) as u8, hex as u8)
}

fn strong(hex: u32) -> Style {
    Style {
        color: rgb(hex),
        strong: true,
        dashed: false,
    }
}

fn muted(hex: u32) -> Style {
    Style {
        color: rgb(hex),
        strong: false,
        dashed: false,
    }
}

/// The style of every system: fixed colours for the systems the model
/// names, then the extra palettes in order of first appearance.
pub(crate) fn palette<'a>(systems: &[&'a str]) -> HashMap<&'a str, Style> {
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
                    color: rgb(0x4d4d4d),
                    strong: false,
                    dashed: true,
                },
                Some(SystemKind::Socat) => muted(0x7fa7c9),
                Some(SystemKind::Haproxy) => muted(0x94b98a),
                Some(SystemKind::Rathole) => muted(0xd1a56c),
                Some(SystemKind::SshR) => muted(0xc28fb0),
                Some(SystemKind::HaproxyTlsPair) => muted(0x1a7a3a),
                Some(SystemKind::StunnelPair) => muted(0x6a51a3),
                Some(SystemKind::AnpUds) => muted(0xe66101),
                Some(SystemKind::AnpTcp) => muted(0x8c510a),
                Some(SystemKind::AnpGrpc) => muted(0xb35806),
                Some(SystemKind::EdgetunnelConnect) => strong(0xd7191c),
                Some(SystemKind::EdgetunnelGrpc) => strong(0x2155d9),
                None => next(is_edgetunnel(name)),
            };
            (name, style)
        })
        .collect()
}

/// The style of a system, grey if it is unknown to the palette.
fn style_of(styles: &HashMap<&str, Style>, system: &str) -> Style {
    styles.get(system).copied().unwrap_or(muted(0x999999))
}

// -------------------------------------------------------------------- text

/// Plot width in pixels.
const WIDTH: u32 = 800;
/// Outer margin in pixels.
const MARGIN: i32 = 16;
/// Font stack: DejaVu Sans first so widths match the estimate below.
const FONT: &str = "DejaVu Sans, Verdana, Arial, sans-serif";
const DARK: RGBColor = RGBColor(0x22, 0x22, 0x22);
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);
const GRID: RGBColor = RGBColor(0xe3, 0xe3, 0xe3);
const AXIS: RGBColor = RGBColor(0x88, 0x88, 0x88);
const BAND: RGBColor = RGBColor(0xf5, 0xf5, 0xf5);

/// A font of `px` pixels (plotters' SVG backend writes size / 1.24).
fn font(px: f64) -> TextStyle<'static> {
    (FONT, px * 1.24).into_font().color(&DARK)
}

fn bold(px: f64) -> TextStyle<'static> {
    (FONT, px * 1.24, FontStyle::Bold).into_font().color(&DARK)
}

/// Estimated rendered width of `s` at `px` (DejaVu Sans averages ~0.6 em).
fn text_width(s: &str, px: f64) -> f64 {
    s.chars().count() as f64 * px * 0.6
}

/// `s`, cut with an ellipsis so it fits `max_width` at `px`.
fn fit(s: &str, px: f64, max_width: f64) -> String {
    if text_width(s, px) <= max_width {
        return s.to_string();
    }
    let keep = ((max_width / (px * 0.6)) as usize).saturating_sub(1);
    let mut out: String = s.chars().take(keep).collect();
    out.push('…');
    out
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Draws `s` with its top-left (or anchor) at pixel (x, y) of `area`.
fn text(area: &Area, s: &str, (x, y): (i32, i32), style: &TextStyle) -> DrawResult<()> {
    area.draw(&Text::new(s.to_string(), (x, y), style.clone()))
        .map_err(err)
}

/// Draws the title and subtitle; returns the y below them.
fn heading(area: &Area, title: &str, subtitle: &str) -> DrawResult<i32> {
    let width = WIDTH as f64 - 2.0 * MARGIN as f64;
    text(area, &fit(title, 17.0, width), (MARGIN, 12), &bold(17.0))?;
    let sub = font(11.5).color(&GREY);
    text(area, &fit(subtitle, 11.5, width), (MARGIN, 36), &sub)?;
    Ok(58)
}

/// Legend rows of swatch + label from y: line swatches for line plots,
/// boxes for bar plots. Returns the y below it.
fn legend(area: &Area, items: &[(String, Style)], y: i32, lines: bool) -> DrawResult<i32> {
    let px = 11.5;
    let right = WIDTH as i32 - MARGIN;
    let (mut x, mut row) = (MARGIN, y + 8);
    for (label, style) in items {
        let label = fit(label, px, (right - MARGIN - 24) as f64);
        let w = 22 + text_width(&label, px) as i32 + 18;
        if x > MARGIN && x + w > right {
            x = MARGIN;
            row += 18;
        }
        if lines {
            draw_line(area, &[(x, row), (x + 18, row)], *style)?;
            area.draw(&Circle::new((x + 9, row), 2.6, style.color.filled()))
                .map_err(err)?;
        } else {
            area.draw(&Rectangle::new(
                [(x, row - 6), (x + 16, row + 5)],
                style.color.filled(),
            ))
            .map_err(err)?;
        }
        let anchor = Pos::new(HPos::Left, VPos::Center);
        text(area, &label, (x + 22, row), &font(px).pos(anchor))?;
        x += w;
    }
    Ok(row + 16)
}

/// Height of the legend that `legend` draws.
fn legend_height(items: &[(String, Style)]) -> i32 {
    let right = WIDTH as i32 - MARGIN;
    let (mut x, mut rows) = (MARGIN, 1);
    for (label, _) in items {
        let label = fit(label, 11.5, (right - MARGIN - 24) as f64);
        let w = 22 + text_width(&label, 11.5) as i32 + 18;
        if x > MARGIN && x + w > right {
            x = MARGIN;
            rows += 1;
        }
        x += w;
    }
    8 + (rows - 1) * 18 + 16
}

/// A line in pixels of `area` in a system's style (dashed for direct).
fn draw_line(area: &Area, pts: &[(i32, i32)], style: Style) -> DrawResult<()> {
    let width = if style.strong { 3 } else { 2 };
    let shape = style.color.stroke_width(width);
    if style.dashed {
        area.draw(&DashedPathElement::new(pts.to_vec(), 6, 3, shape))
            .map_err(err)
    } else {
        area.draw(&PathElement::new(pts.to_vec(), shape))
            .map_err(err)
    }
}

/// Legend entries for the systems, in the order given.
fn legend_items(systems: &[&str], styles: &HashMap<&str, Style>) -> Vec<(String, Style)> {
    systems
        .iter()
        .map(|s| (system_label(s), style_of(styles, s)))
        .collect()
}

/// An SVG document of `height` drawn by `draw`, with a `<title>`.
fn svg_document(
    height: u32,
    title: &str,
    draw: impl FnOnce(&Area) -> DrawResult<()>,
) -> DrawResult<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    // plotters writes no title; put one after the opening tag.
    if let Some(end) = out.find('>').filter(|_| out.starts_with("<svg")) {
        out.insert_str(end + 1, &format!("\n<title>{}</title>", esc(title)));
    }
    Ok(out)
}

/// Escapes text for XML content.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

// ------------------------------------------------------------------- scales

/// A value axis, linear or log10; plotters draws on the transformed
/// values (log10 of the value on a log axis) with these ticks.
#[derive(Clone, Debug)]
pub(crate) struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    /// Linear tick step (unused on log scales).
    step: f64,
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
    pub(crate) fn linear(lo: f64, hi: f64, max_ticks: usize) -> Scale {
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
        }
    }

    /// A log10 scale over [lo, hi] (both > 0) widened to whole decades.
    pub(crate) fn log(lo: f64, hi: f64) -> Scale {
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
        }
    }

    /// A value on the drawn (transformed) axis, clamped to the domain;
    /// NaN maps to the start.
    pub(crate) fn t(&self, v: f64) -> f64 {
        let v = if v.is_nan() {
            self.lo
        } else {
            v.clamp(self.lo, self.hi)
        };
        if self.log {
            v.max(f64::MIN_POSITIVE).log10()
        } else {
            v
        }
    }

    /// The inverse of [`Scale::t`].
    fn value(&self, t: f64) -> f64 {
        if self.log {
            10f64.powf(t)
        } else {
            t
        }
    }

    /// Where bars start: 0 on linear scales, the bottom of a log scale.
    fn base(&self) -> f64 {
        if self.log {
            self.lo
        } else {
            0.0
        }
    }

    /// Tick values, thinned so labels of `label_width` pixels fit `pixels`.
    pub(crate) fn ticks(&self, pixels: f64, label_width: f64) -> Vec<f64> {
        let room = (pixels.abs() / (label_width + 14.0)).floor() as usize + 1;
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

    /// The drawn range.
    fn range(&self) -> std::ops::Range<f64> {
        self.t(self.lo)..self.t(self.hi)
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
fn tick_label_width(lo: f64, hi: f64, px: f64) -> f64 {
    text_width(&fmt3(lo), px).max(text_width(&fmt3(hi), px))
}

/// A linear plotters axis over [lo, hi] whose ticks are exactly `ticks`
/// (on a log scale the values drawn are log10 of the data, see [`Scale`]).
#[derive(Clone, Debug)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    fn new(range: std::ops::Range<f64>, ticks: Vec<f64>) -> Axis {
        let (lo, hi) = if range.end > range.start {
            (range.start, range.end)
        } else {
            (range.start, range.start + 1.0)
        };
        Axis { lo, hi, ticks }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let u = (v - self.lo) / (self.hi - self.lo);
        let u = if u.is_finite() { u } else { 0.0 };
        limit.0 + (u * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

// ---------------------------------------------------------------- bar plots

/// Height of one bar row (and of a case's header row).
const ROW: i32 = 16;
/// Height of the x axis under a bar panel.
const BAR_AXIS: i32 = 44;
/// Height of a metric's header above its panel.
const PANEL_HEAD: i32 = 22;

/// One row of a bar panel, top to bottom.
enum BarRow<'a> {
    /// The case's name; `band` when its group is shaded.
    Case(&'a str, bool),
    /// One system's aggregate in the case.
    Bar(&'a Agg<'a>, bool),
}

/// The rows of a panel: per case a header row and one bar per system.
fn bar_rows<'a>(t: &'a Table<'a>) -> Vec<BarRow<'a>> {
    let mut rows = Vec::new();
    for (i, case) in t.cases.iter().enumerate() {
        let band = i % 2 == 1;
        rows.push(BarRow::Case(case, band));
        rows.extend(
            t.systems
                .iter()
                .filter_map(|s| t.get(case, s))
                .map(|a| BarRow::Bar(a, band)),
        );
    }
    rows
}

/// The value scale of a bar panel: log when all values are positive and
/// span more than 100×, linear from 0 otherwise.
fn bar_scale(table: &Table, pixels: f64) -> Scale {
    let values: Vec<f64> = table
        .all()
        .flat_map(|a| [a.min, a.median, a.max])
        .filter(|v| v.is_finite())
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        return Scale::linear(0.0, 1.0, 5);
    }
    if lo > 0.0 && hi / lo > 100.0 {
        // Start a bit below the smallest value so its bar stays visible.
        return Scale::log(lo / 3.0, hi);
    }
    let label = tick_label_width(lo, hi, 10.5);
    let room = (pixels / (label + 20.0)).floor().clamp(2.0, 8.0) as usize;
    Scale::linear(lo, hi, room)
}

/// Height of one metric's panel.
fn panel_height(t: &Table, header: bool) -> i32 {
    let head = if header { PANEL_HEAD } else { 0 };
    head + bar_rows(t).len() as i32 * ROW + BAR_AXIS + 8
}

/// Horizontal grouped bars: per panel (metric), per case a header and one
/// bar per system with a min–max whisker and the median printed.
pub(crate) fn bars_svg(
    title: &str,
    panels: &[Table],
    styles: &HashMap<&str, Style>,
) -> DrawResult<String> {
    let systems = unique(
        panels
            .iter()
            .flat_map(|t| t.all().map(|a| a.system).collect::<Vec<_>>()),
    );
    let items = legend_items(&systems, styles);
    let header = panels.len() > 1;
    let label_w = systems
        .iter()
        .map(|s| text_width(&system_label(s), 11.0))
        .fold(90.0, f64::max)
        .min(300.0) as i32;
    let top = 58 + legend_height(&items);
    let height = top + panels.iter().map(|t| panel_height(t, header)).sum::<i32>() + MARGIN;
    svg_document(height as u32, title, |root| {
        heading(
            root,
            title,
            "bar: median over repetitions · whisker: min–max · number: median",
        )?;
        legend(root, &items, 58, false)?;
        let mut y = top;
        for t in panels {
            let h = panel_height(t, header);
            let area = root.clone().shrink((0, y), (WIDTH, h as u32));
            bar_panel(&area, t, styles, label_w, header)?;
            y += h;
        }
        Ok(())
    })
}

/// Draws one metric's panel into `area`.
fn bar_panel(
    area: &Area,
    t: &Table,
    styles: &HashMap<&str, Style>,
    label_w: i32,
    header: bool,
) -> DrawResult<()> {
    let mut area = area.clone();
    if header {
        let head = format!("{} ({})", t.metric, direction(t.higher_is_better));
        text(&area, &head, (MARGIN, 4), &bold(13.0))?;
        let (_, h) = area.dim_in_pixel();
        area = area.shrink(
            (0, PANEL_HEAD),
            (WIDTH, h.saturating_sub(PANEL_HEAD as u32)),
        );
    }
    let rows = bar_rows(t);
    let n = rows.len().max(1);
    let value_w = t
        .all()
        .map(|a| text_width(&fmt3(a.median), 10.5) as i32)
        .fold(24, i32::max);
    let plot_w = WIDTH as i32 - 2 * MARGIN - label_w - 12 - value_w - 10;
    let scale = bar_scale(t, plot_w as f64);
    let ticks = scale.ticks(plot_w as f64, tick_label_width(scale.lo, scale.hi, 10.5));
    let xs = Axis::new(scale.range(), ticks.iter().map(|&v| scale.t(v)).collect());
    // Row i (from the top) spans [n - i - 1, n - i]; labels at the centres
    // of the bar rows.
    let centres: Vec<f64> = (0..n)
        .filter(|&i| matches!(rows.get(i), Some(BarRow::Bar(..))))
        .map(|i| n as f64 - i as f64 - 0.5)
        .collect();
    let ys = Axis::new(0.0..n as f64, centres);
    let mut chart = ChartBuilder::on(&area)
        .margin_left(MARGIN)
        .margin_right(MARGIN + value_w + 10)
        .x_label_area_size(BAR_AXIS)
        .y_label_area_size(label_w + 12)
        .build_cartesian_2d(xs, ys)
        .map_err(err)?;
    let row_label = |v: &f64| -> String {
        let i = n.saturating_sub(1 + v.floor().max(0.0) as usize);
        match rows.get(i) {
            Some(BarRow::Bar(a, _)) => system_label(a.system),
            _ => String::new(),
        }
    };
    let log = if scale.log { ", log scale" } else { "" };
    let arrow = if t.higher_is_better { " →" } else { "" };
    let desc = format!(
        "{} ({}{log}){arrow}",
        t.metric,
        direction(t.higher_is_better)
    );
    chart
        .configure_mesh()
        .disable_y_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .x_label_formatter(&|v| fmt3(scale.value(*v)))
        .y_label_formatter(&row_label)
        .x_label_style(font(10.5).color(&GREY))
        .y_label_style(font(11.0))
        .x_desc(fit(&desc, 11.5, plot_w as f64))
        .axis_desc_style(font(11.5))
        .draw()
        .map_err(err)?;
    let (x0, x1) = (scale.t(scale.base()), scale.t(scale.hi));
    let y_of = |i: usize| n as f64 - i as f64;
    for (i, row) in rows.iter().enumerate() {
        let (top, bottom) = (y_of(i), y_of(i) - 1.0);
        let mid = top - 0.5;
        let band = match row {
            BarRow::Case(_, b) | BarRow::Bar(_, b) => *b,
        };
        if band {
            chart
                .draw_series([Rectangle::new([(x0, top), (x1, bottom)], BAND.filled())])
                .map_err(err)?;
        }
        match row {
            BarRow::Case(case, _) => {
                let style = bold(12.0).pos(Pos::new(HPos::Left, VPos::Center));
                let room = plot_w as f64 - 8.0;
                chart
                    .draw_series([EmptyElement::at((x0, mid))
                        + Text::new(fit(case, 12.0, room), (4, 0), style)])
                    .map_err(err)?;
            }
            BarRow::Bar(a, _) => bar(&mut chart, a, &scale, style_of(styles, a.system), mid)?,
        }
    }
    Ok(())
}

/// A chart on two [`Axis`]es (bars, lines).
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Axis, Axis>>;

/// One bar at row centre `mid`: median bar, min–max whisker and the
/// median value; "n/a" when no repetition had a finite value.
fn bar(chart: &mut Chart, a: &Agg, scale: &Scale, style: Style, mid: f64) -> DrawResult<()> {
    let x0 = scale.t(scale.base());
    let value_font = font(10.5).pos(Pos::new(HPos::Left, VPos::Center));
    if a.finite == 0 {
        let na = value_font.color(&GREY);
        return chart
            .draw_series([EmptyElement::at((x0, mid)) + Text::new("n/a", (4, 0), na)])
            .map(|_| ())
            .map_err(err);
    }
    let x1 = scale.t(a.median);
    let mut rect = Rectangle::new([(x0, mid + 0.5), (x1, mid - 0.5)], style.color.filled());
    rect.set_margin(2, 2, 0, 0);
    chart.draw_series([rect]).map_err(err)?;
    let (wmin, wmax) = (scale.t(a.min), scale.t(a.max));
    if a.finite > 1 {
        let ink = DARK.stroke_width(1);
        let cap =
            |x: f64| EmptyElement::at((x, mid)) + PathElement::new(vec![(0, -4), (0, 4)], ink);
        chart
            .draw_series([PathElement::new(vec![(wmin, mid), (wmax, mid)], ink)])
            .map_err(err)?;
        chart.draw_series([cap(wmin), cap(wmax)]).map_err(err)?;
    }
    let x = x1.max(wmax).max(x0);
    chart
        .draw_series([EmptyElement::at((x, mid)) + Text::new(fmt3(a.median), (5, 0), value_font)])
        .map_err(err)?;
    Ok(())
}

// ---------------------------------------------------------------- latency CDF

/// One small-multiple panel of the latency plot: a case and, per system,
/// the (percentile, ms) points of its median repetition.
pub(crate) struct CdfPanel<'a> {
    case: &'a str,
    lines: Vec<(&'a str, Vec<(f64, f64)>)>,
}

/// The panels of the latency CDF plot, cases and systems in order of first
/// appearance.
pub(crate) fn cdf_panels<'a>(samples: &'a [Sample], order: &[&'a str]) -> Vec<CdfPanel<'a>> {
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

    /// The label of the tick nearest to `t` tail units.
    fn label_at(&self, t: f64) -> String {
        self.ticks()
            .into_iter()
            .min_by(|a, b| {
                (self.value(a.0) - t)
                    .abs()
                    .total_cmp(&(self.value(b.0) - t).abs())
            })
            .map(|(_, l)| l)
            .unwrap_or_default()
    }
}

/// -log10(1 - p/100): 0 at p0, 1 at p90, 2 at p99, ...
fn tail(p: f64) -> f64 {
    -(1.0 - p / 100.0).max(1e-12).log10()
}

/// Height of one CDF panel cell.
const CDF_CELL_H: i32 = 250;

/// Small multiples of latency CDFs: a grid of panels (two columns), one line
/// per system, shared legend and percentile axis.
pub(crate) fn cdf_svg(
    title: &str,
    panels: &[CdfPanel],
    styles: &HashMap<&str, Style>,
) -> DrawResult<String> {
    let systems = unique(panels.iter().flat_map(|p| p.lines.iter().map(|l| l.0)));
    let items = legend_items(&systems, styles);
    let axis = TailAxis::of(panels);
    let cols = if panels.len() <= 1 { 1 } else { 2 };
    let rows = panels.len().div_ceil(cols) as i32;
    let top = 58 + legend_height(&items);
    let height = top + rows * CDF_CELL_H + MARGIN;
    svg_document(height as u32, title, |root| {
        heading(
            root,
            title,
            "x: latency in ms (log scale) · y: percentile, stretched so the tail is visible",
        )?;
        legend(root, &items, 58, true)?;
        let cell_w = (WIDTH as i32 - 2 * MARGIN) / cols as i32;
        for (i, panel) in panels.iter().enumerate() {
            let x = MARGIN + (i % cols) as i32 * cell_w;
            let y = top + (i / cols) as i32 * CDF_CELL_H;
            let area = root
                .clone()
                .shrink((x, y), (cell_w as u32, CDF_CELL_H as u32));
            cdf_panel(&area, panel, cell_w, &axis, styles)?;
        }
        Ok(())
    })
}

/// Draws one CDF panel into its cell.
fn cdf_panel(
    area: &Area,
    panel: &CdfPanel,
    cell_w: i32,
    axis: &TailAxis,
    styles: &HashMap<&str, Style>,
) -> DrawResult<()> {
    let ms = panel.lines.iter().flat_map(|l| l.1.iter().map(|p| p.1));
    let lo = ms.clone().fold(f64::INFINITY, f64::min);
    let hi = ms.fold(f64::NEG_INFINITY, f64::max);
    let xs = Scale::log(lo, hi);
    let plot_w = (cell_w - 72) as f64;
    let ticks = xs.ticks(plot_w, tick_label_width(xs.lo, xs.hi, 10.0));
    let x_axis = Axis::new(xs.range(), ticks.iter().map(|&v| xs.t(v)).collect());
    let y_ticks: Vec<f64> = axis.ticks().iter().map(|t| axis.value(t.0)).collect();
    let y_axis = Axis::new(0.0..axis.top(), y_ticks);
    let title = fit(panel.case, 12.5, plot_w);
    let mut chart = ChartBuilder::on(area)
        .caption(title, bold(12.5))
        .margin_right(14)
        .x_label_area_size(36)
        .y_label_area_size(58)
        .build_cartesian_2d(x_axis, y_axis)
        .map_err(err)?;
    line_mesh(
        &mut chart,
        &|v| fmt3(xs.value(*v)),
        &|t| axis.label_at(*t),
        ("latency (ms, log scale)", "percentile"),
    )?;
    if panel.lines.is_empty() {
        let (x, y) = (xs.range(), axis.top() / 2.0);
        let style = font(11.0)
            .color(&GREY)
            .pos(Pos::new(HPos::Center, VPos::Center));
        chart
            .draw_series([Text::new(
                "no CDF data",
                ((x.start + x.end) / 2.0, y),
                style,
            )])
            .map_err(err)?;
        return Ok(());
    }
    let mut lines: Vec<&(&str, Vec<(f64, f64)>)> = panel.lines.iter().collect();
    lines.sort_by_key(|l| style_of(styles, l.0).strong);
    for (system, pts) in lines {
        let mapped = pts.iter().map(|&(p, ms)| (xs.t(ms), axis.value(p)));
        chart_line(&mut chart, mapped.collect(), style_of(styles, system))?;
    }
    Ok(())
}

/// The grid, the axes' tick labels and their descriptions (x, y) of a
/// line chart.
fn line_mesh(
    chart: &mut Chart,
    x_label: &dyn Fn(&f64) -> String,
    y_label: &dyn Fn(&f64) -> String,
    (x_desc, y_desc): (&str, &str),
) -> DrawResult<()> {
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .x_label_formatter(x_label)
        .y_label_formatter(y_label)
        .x_label_style(font(10.0).color(&GREY))
        .y_label_style(font(10.0).color(&GREY))
        .x_desc(x_desc)
        .y_desc(y_desc)
        .axis_desc_style(font(11.0))
        .draw()
        .map_err(err)
}

/// A line through `pts` (drawn coordinates) in `style`, dashed when it
/// says so, with a dot at each point.
fn chart_line(chart: &mut Chart, pts: Vec<(f64, f64)>, style: Style) -> DrawResult<()> {
    let width = if style.strong { 3 } else { 2 };
    let shape = style.color.stroke_width(width);
    if style.dashed {
        chart
            .draw_series([DashedPathElement::new(pts.clone(), 6, 3, shape)])
            .map_err(err)?;
    } else {
        chart
            .draw_series([PathElement::new(pts.clone(), shape)])
            .map_err(err)?;
    }
    let r = if style.strong { 3 } else { 2 };
    chart
        .draw_series(pts.iter().map(|&c| Circle::new(c, r, style.color.filled())))
        .map_err(err)?;
    Ok(())
}

// -------------------------------------------------------------- series plot

/// One panel of a series plot: a metric and its curves.
pub(crate) struct SeriesPanel<'a> {
    metric: &'a str,
    lines: Vec<SeriesLine<'a>>,
}

/// A curve of one process of a system: (x, y) points.
struct SeriesLine<'a> {
    system: &'a str,
    process: &'a str,
    points: &'a [(f64, f64)],
}

/// The panels of `scenario`'s series plot, one per metric of `metrics`: a
/// curve per sample with points (its process is the part of its case
/// before ": "), systems in `order`.
pub(crate) fn series_panels<'a>(
    samples: &'a [Sample],
    scenario: &str,
    metrics: &'a [String],
    order: &[&'a str],
) -> Vec<SeriesPanel<'a>> {
    metrics
        .iter()
        .map(|metric| {
            let of = |sys: &'a str| {
                samples.iter().filter(move |s| {
                    s.scenario == scenario
                        && s.metric == *metric
                        && s.system == sys
                        && !s.series.is_empty()
                })
            };
            SeriesPanel {
                metric,
                lines: order
                    .iter()
                    .flat_map(|&sys| of(sys))
                    .map(|s| SeriesLine {
                        system: &s.system,
                        process: s.case.split_once(": ").map_or("", |c| c.0),
                        points: &s.series,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Height of one series panel.
const SERIES_H: i32 = 300;

/// Line charts stacked, one per panel (metric), x shared in meaning: a
/// line per system and process, the system's colour, its first process
/// solid and the others dashed.
pub(crate) fn series_svg(
    title: &str,
    x_desc: &str,
    panels: &[SeriesPanel],
    styles: &HashMap<&str, Style>,
) -> DrawResult<String> {
    let lines = panels.iter().flat_map(|p| p.lines.iter());
    let systems = unique(lines.clone().map(|l| l.system));
    let processes = unique(lines.map(|l| l.process));
    let mut items = legend_items(&systems, styles);
    for (i, p) in processes.iter().enumerate() {
        let grey = Style {
            color: GREY,
            strong: false,
            dashed: i > 0,
        };
        items.push((p.to_string(), grey));
    }
    let top = 58 + legend_height(&items);
    let height = top + panels.len() as i32 * SERIES_H + MARGIN;
    let subtitle = format!("x: {x_desc} · a line per system and process, sampled at intervals");
    svg_document(height as u32, title, |root| {
        heading(root, title, &subtitle)?;
        legend(root, &items, 58, true)?;
        for (i, panel) in panels.iter().enumerate() {
            let y = top + i as i32 * SERIES_H;
            let area = root.clone().shrink(
                (MARGIN, y),
                ((WIDTH as i32 - 2 * MARGIN) as u32, SERIES_H as u32),
            );
            series_panel(&area, panel, x_desc, &processes, styles)?;
        }
        Ok(())
    })
}

/// Draws one series panel: linear axes from 0, the curves on top.
fn series_panel(
    area: &Area,
    panel: &SeriesPanel,
    x_desc: &str,
    processes: &[&str],
    styles: &HashMap<&str, Style>,
) -> DrawResult<()> {
    let pts = panel.lines.iter().flat_map(|l| l.points.iter());
    let finite = |v: f64| v.is_finite().then_some(v);
    let x_hi = pts.clone().filter_map(|p| finite(p.0)).fold(0.0, f64::max);
    let y_hi = pts.filter_map(|p| finite(p.1)).fold(0.0, f64::max);
    let (xs, ys) = (Scale::linear(0.0, x_hi, 6), Scale::linear(0.0, y_hi, 5));
    let plot_w = (WIDTH as i32 - 2 * MARGIN - 72) as f64;
    let x_ticks = xs.ticks(plot_w, tick_label_width(xs.lo, xs.hi, 10.0));
    let y_ticks = ys.ticks((SERIES_H - 80) as f64, 14.0);
    let mut chart = ChartBuilder::on(area)
        .caption(fit(panel.metric, 12.5, plot_w), bold(12.5))
        .margin_right(14)
        .x_label_area_size(36)
        .y_label_area_size(58)
        .build_cartesian_2d(
            Axis::new(xs.range(), x_ticks),
            Axis::new(ys.range(), y_ticks),
        )
        .map_err(err)?;
    line_mesh(
        &mut chart,
        &|v| fmt3(*v),
        &|v| fmt3(*v),
        (x_desc, panel.metric),
    )?;
    let mut lines: Vec<&SeriesLine> = panel.lines.iter().collect();
    lines.sort_by_key(|l| style_of(styles, l.system).strong);
    for line in lines {
        let mut style = style_of(styles, line.system);
        style.dashed = processes.first() != Some(&line.process);
        let drawn = line
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| (xs.t(x), ys.t(y)));
        chart_line(&mut chart, drawn.collect(), style)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[test]
    fn log_scale_ticks_and_transform() {
        let s = Scale::log(0.3, 40.0);
        assert_eq!((s.lo, s.hi), (0.1, 100.0));
        assert_eq!(s.t(10.0), 1.0);
        assert_eq!(s.value(2.0), 100.0);
        assert_eq!(s.ticks(600.0, 20.0)[0], 0.1);
        let l = Scale::linear(0.2, 9.3, 5);
        assert_eq!((l.lo, l.hi, l.step), (0.0, 10.0, 2.0));
        assert_eq!(l.t(f64::NAN), 0.0);
        assert_eq!(l.t(50.0), 10.0);
    }

    #[test]
    fn tail_axis_labels() {
        let a = TailAxis {
            nines: 3,
            has_max: true,
        };
        assert_eq!(a.label_at(a.value(99.0)), "99");
        assert_eq!(a.label_at(a.value(99.9)), "99.9");
        assert_eq!(a.label_at(a.top()), "max");
    }
}
