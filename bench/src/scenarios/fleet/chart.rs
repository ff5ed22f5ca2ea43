//! The fleet's plots, per pattern: the fleet's free IPs over time (one line per policy), and one
//! node's free IPs and pods over time (one panel per policy). Drawn with plotters' bitmap backend;
//! without a TrueType font (see `crate::plot`) they are drawn without text.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::harness::{PairResult, SAMPLE_EVERY, TRACKED_NODE};
use super::traffic::Pattern;

/// Sample `i`'s time, in simulated minutes from the pattern's start.
fn minutes(i: usize) -> f64 {
    i as f64 * SAMPLE_EVERY.as_secs_f64() / 60.0
}

/// A plotting error, named as one.
pub(super) fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// A chart of both plots: simulated minutes against a count.
/// `'a`: the drawing area's borrow; `'b`: the backend's (its path).
type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One line; with `label` (when text can be drawn), its legend entry too.
fn line<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    points: impl IntoIterator<Item = (f64, f64)>,
    color: RGBAColor,
    label: Option<String>,
) -> anyhow::Result<()> {
    let series = chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))
        .map_err(err)?;
    if let Some(label) = label {
        series.label(label).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
    }
    Ok(())
}

/// The axes' ends: the longest series (at least one sample), in minutes, and the largest value (at
/// least 1) with `headroom` above it.
fn extent(
    lens: impl Iterator<Item = usize>,
    values: impl Iterator<Item = u64>,
    headroom: f64,
) -> (f64, f64) {
    let x_max = lens.map(minutes).fold(1.0 / 60.0, f64::max);
    let y_max = values.max().unwrap_or(1).max(1) as f64 * headroom;
    (x_max, y_max)
}

/// How a panel is dressed when text can be drawn.
struct Dress<'t> {
    margin: u32,
    caption: String,
    font: u32,
    /// Heights of the x and y label areas.
    label_areas: (u32, u32),
    x_desc: &'t str,
    y_desc: Option<&'t str>,
}

/// A panel on `area` from 0 to the axes' ends; with `text`, its caption and axis labels.
fn panel<'a, 'b: 'a>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    text: bool,
    dress: Dress<'_>,
    (x_max, y_max): (f64, f64),
) -> anyhow::Result<Chart<'a, 'b>> {
    let mut builder = ChartBuilder::on(area);
    builder.margin(dress.margin);
    if text {
        builder
            .caption(dress.caption, ("sans-serif", dress.font))
            .x_label_area_size(dress.label_areas.0)
            .y_label_area_size(dress.label_areas.1);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    if text {
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(dress.x_desc);
        if let Some(y) = dress.y_desc {
            mesh.y_desc(y);
        }
        mesh.draw().map_err(err)?;
    }
    Ok(chart)
}

/// The legend box, top right.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// `fleet-free-<pattern>.png`: the fleet's free IPs, one line per policy.
pub fn fleet_free(
    dir: &Path,
    pattern: Pattern,
    results: &[&PairResult],
) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("fleet-free-{}.png", pattern.name()));
    draw_fleet_free(&path, pattern, results)?;
    Ok(path)
}

fn draw_fleet_free(path: &Path, pattern: Pattern, results: &[&PairResult]) -> anyhow::Result<()> {
    let text = crate::plot::fonts();
    let root = BitMapBackend::new(path, (1100, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ends = extent(
        results.iter().map(|r| r.free_series.len()),
        results.iter().flat_map(|r| r.free_series.iter().copied()),
        1.08,
    );
    let dress = Dress {
        margin: 14,
        caption: format!("fleet, {pattern}: free VPC IPs held by the fleet"),
        font: 22,
        label_areas: (40, 64),
        x_desc: "simulated minutes from the pattern's start",
        y_desc: Some("free IPs (all nodes)"),
    };
    let mut chart = panel(&root, text, dress, ends)?;
    for (i, r) in results.iter().enumerate() {
        let points = r
            .free_series
            .iter()
            .enumerate()
            .map(|(t, v)| (minutes(t), *v as f64));
        let label = text.then(|| format!("{} (mean {:.0})", r.policy, r.free_mean));
        line(&mut chart, points, Palette99::pick(i).to_rgba(), label)?;
    }
    if text {
        legend(&mut chart)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// `fleet-node-<pattern>.png`: `TRACKED_NODE`'s free IPs and pods, one panel per policy.
pub fn one_node(dir: &Path, pattern: Pattern, results: &[&PairResult]) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("fleet-node-{}.png", pattern.name()));
    draw_one_node(&path, pattern, results)?;
    Ok(path)
}

fn draw_one_node(path: &Path, pattern: Pattern, results: &[&PairResult]) -> anyhow::Result<()> {
    let text = crate::plot::fonts();
    let panel_h = 260u32;
    let root =
        BitMapBackend::new(path, (1100, panel_h * results.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ends = extent(
        results.iter().map(|r| r.node_series.len()),
        results
            .iter()
            .flat_map(|r| r.node_series.iter().map(|(f, p)| u64::from((*f).max(*p)))),
        1.1,
    );
    let areas = root.split_evenly((results.len().max(1), 1));
    for (area, r) in areas.iter().zip(results) {
        let dress = Dress {
            margin: 10,
            caption: format!("{pattern}, {}: node {TRACKED_NODE}", r.policy),
            font: 18,
            label_areas: (32, 48),
            x_desc: "simulated minutes",
            y_desc: None,
        };
        let mut chart = panel(area, text, dress, ends)?;
        let free: Vec<u32> = r.node_series.iter().map(|s| s.0).collect();
        let pods: Vec<u32> = r.node_series.iter().map(|s| s.1).collect();
        for (label, color, values) in [
            ("free IPs", BLUE.to_rgba(), &free),
            ("pods", RED.to_rgba(), &pods),
        ] {
            let points = values
                .iter()
                .enumerate()
                .map(|(t, v)| (minutes(t), f64::from(*v)));
            line(&mut chart, points, color, text.then(|| label.to_owned()))?;
        }
        if text {
            legend(&mut chart)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}
