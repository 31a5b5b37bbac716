//! Throughput against RTT, one SVG per loss: a panel per tunnel count and
//! direction, a line per system, the ceiling (plain TCP) dashed, MB/s on
//! a log scale (at 1 % loss the rates span three decades). Drawn with
//! plotters' SVG backend; colours as the comparison bench's plots
//! (edgetunnel strong, peers muted).

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::bed::System;
use crate::flows::Direction;
use crate::report::Grid;

const PANEL_W: u32 = 460;
const PANEL_H: u32 = 330;
const HEAD: u32 = 92;
const FONT: &str = "DejaVu Sans, Verdana, Arial, sans-serif";

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing a plot: {e}")
}

/// A system's colour and line width.
fn style(s: System) -> (RGBColor, u32) {
    match s {
        System::Plain => (RGBColor(0x4d, 0x4d, 0x4d), 2),
        System::EtConnect => (RGBColor(0xd7, 0x19, 0x1c), 3),
        System::EtGrpc => (RGBColor(0x21, 0x55, 0xd9), 3),
        System::AnpConnect => (RGBColor(0xe6, 0x61, 0x01), 2),
        System::AnpGrpc => (RGBColor(0xb3, 0x58, 0x06), 2),
        System::HaproxyPair => (RGBColor(0x1a, 0x7a, 0x3a), 2),
    }
}

/// The SVG of loss `loss`.
pub(crate) fn throughput_svg(g: &Grid, loss: f64) -> Result<String, String> {
    let systems = g.systems_run();
    let (rows, cols) = (g.tunnels.len().max(1), g.directions.len().max(1));
    let width = PANEL_W * cols as u32;
    let height = HEAD + PANEL_H * rows as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(HEAD);
        let title = format!(
            "Throughput against RTT, loss {loss} % each way, {} Mbit/s link",
            g.rate_mbit
        );
        head.draw(&Text::new(title, (14, 10), (FONT, 20).into_font()))
            .map_err(err)?;
        legend(&head, &systems, width)?;
        let panels = body.split_evenly((rows, cols));
        for (i, area) in panels.iter().enumerate() {
            let (tunnels, dir) = (g.tunnels[i / cols], g.directions[i % cols]);
            panel(area, g, loss, tunnels, dir, &systems)?;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A line swatch and a label per system, wrapped to the width.
fn legend(area: &Area, systems: &[System], width: u32) -> Result<(), String> {
    let (mut x, mut y) = (14i32, 46i32);
    for &s in systems {
        let label = s.label();
        let w = 34 + label.chars().count() as i32 * 8 + 18;
        if x + w > width as i32 - 10 {
            x = 14;
            y += 22;
        }
        let (color, stroke) = style(s);
        let line = vec![(x, y), (x + 26, y)];
        if s == System::Plain {
            area.draw(&DashedPathElement::new(
                line,
                6,
                4,
                color.stroke_width(stroke),
            ))
            .map_err(err)?;
        } else {
            area.draw(&PathElement::new(line, color.stroke_width(stroke)))
                .map_err(err)?;
        }
        area.draw(&Text::new(
            label.to_string(),
            (x + 32, y - 7),
            (FONT, 14).into_font(),
        ))
        .map_err(err)?;
        x += w;
    }
    Ok(())
}

/// One panel: x the grid's RTTs evenly spaced, y log10 of MB/s.
fn panel(
    area: &Area,
    g: &Grid,
    loss: f64,
    tunnels: usize,
    dir: Direction,
    systems: &[System],
) -> Result<(), String> {
    let lines: Vec<(System, Vec<(i32, f64)>)> = systems
        .iter()
        .map(|&s| {
            let pts = g
                .rtts
                .iter()
                .enumerate()
                .filter_map(|(i, &rtt)| {
                    let v = g.value(s, rtt, loss, tunnels, dir)?;
                    (v > 0.0).then(|| (i as i32, v.log10()))
                })
                .collect();
            (s, pts)
        })
        .collect();
    let ys = lines.iter().flat_map(|l| l.1.iter().map(|p| p.1));
    let lo = ys.clone().fold(f64::INFINITY, f64::min).floor();
    let hi = ys.fold(f64::NEG_INFINITY, f64::max).ceil();
    let (lo, hi) = if lo.is_finite() && hi.is_finite() {
        (lo, hi.max(lo + 1.0))
    } else {
        (0.0, 2.0)
    };
    let n = g.rtts.len() as i32;
    let t = if tunnels == 1 { "tunnel" } else { "tunnels" };
    let rtts = g.rtts.clone();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{tunnels} {t}, {}", dir.name()),
            (FONT, 16).into_font(),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(58)
        .build_cartesian_2d(-1i32..n, lo..hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(0xe3, 0xe3, 0xe3))
        .x_labels(n as usize + 2)
        .y_labels((hi - lo) as usize + 1)
        .x_label_formatter(&|x| {
            usize::try_from(*x)
                .ok()
                .and_then(|i| rtts.get(i))
                .map(|r| format!("{r}"))
                .unwrap_or_default()
        })
        .y_label_formatter(&|v| {
            if (v - v.round()).abs() < 1e-6 {
                let p = 10f64.powf(v.round());
                if p >= 1.0 {
                    format!("{p:.0}")
                } else {
                    format!("{p}")
                }
            } else {
                String::new()
            }
        })
        .x_desc("RTT, ms")
        .y_desc("MB/s (log scale)")
        .label_style((FONT, 12).into_font())
        .draw()
        .map_err(err)?;
    // Peers first, edgetunnel on top.
    let mut order: Vec<&(System, Vec<(i32, f64)>)> = lines.iter().collect();
    order.sort_by_key(|l| matches!(l.0, System::EtConnect | System::EtGrpc));
    for (s, pts) in order {
        let (color, stroke) = style(*s);
        let shape = color.stroke_width(stroke);
        if *s == System::Plain {
            chart
                .draw_series([DashedPathElement::new(pts.clone(), 6, 4, shape)])
                .map_err(err)?;
        } else {
            chart
                .draw_series([PathElement::new(pts.clone(), shape)])
                .map_err(err)?;
        }
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    Ok(())
}
