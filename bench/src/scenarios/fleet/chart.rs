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

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// A chart of both plots: simulated minutes against a count.
type Chart<'a> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One line; with `label` (when text can be drawn), its legend entry too.
fn line(
    chart: &mut Chart<'_>,
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

/// The legend box, top right.
fn legend(chart: &mut Chart<'_>) -> anyhow::Result<()> {
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
    let x_max = results
        .iter()
        .map(|r| minutes(r.free_series.len()))
        .fold(1.0 / 60.0, f64::max);
    let y_max = results
        .iter()
        .flat_map(|r| r.free_series.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.08;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(14);
    if text {
        builder
            .caption(
                format!("fleet, {pattern}: free VPC IPs held by the fleet"),
                ("sans-serif", 22),
            )
            .x_label_area_size(40)
            .y_label_area_size(64);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    if text {
        chart
            .configure_mesh()
            .x_desc("simulated minutes from the pattern's start")
            .y_desc("free IPs (all nodes)")
            .draw()
            .map_err(err)?;
    }
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
    let x_max = results
        .iter()
        .map(|r| minutes(r.node_series.len()))
        .fold(1.0 / 60.0, f64::max);
    let y_max = results
        .iter()
        .flat_map(|r| r.node_series.iter().map(|(f, p)| (*f).max(*p)))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let areas = root.split_evenly((results.len().max(1), 1));
    for (area, r) in areas.iter().zip(results) {
        let mut builder = ChartBuilder::on(area);
        builder.margin(10);
        if text {
            builder
                .caption(
                    format!("{pattern}, {}: node {TRACKED_NODE}", r.policy),
                    ("sans-serif", 18),
                )
                .x_label_area_size(32)
                .y_label_area_size(48);
        }
        let mut chart = builder
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(err)?;
        if text {
            chart
                .configure_mesh()
                .x_desc("simulated minutes")
                .draw()
                .map_err(err)?;
        }
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
