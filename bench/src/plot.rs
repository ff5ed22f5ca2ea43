//! The latency-distribution plot: one panel per scenario, the empirical CDF of each series, drawn
//! with plotters' bitmap backend. Text needs a TrueType font (DejaVu or Liberation, looked up in the
//! usual places and registered with plotters' `ab_glyph` renderer); without one the panels are drawn
//! without text.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::report::ScenarioReport;
use crate::stats::percentile;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// Registers a system font as plotters' "sans-serif"; whether text can be drawn.
pub fn fonts() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        for path in FONT_CANDIDATES {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Up to `max_points` points of the empirical CDF of `samples`.
pub fn ecdf(samples: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points.max(1));
    let mut points: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (sorted[i], (i + 1) as f64 / n as f64))
        .collect();
    if points.last().is_some_and(|p| p.1 < 1.0) {
        points.push((sorted[n - 1], 1.0));
    }
    points
}

/// Draws every scenario that has distributions into one PNG; returns whether text was drawn.
pub fn draw(reports: &[ScenarioReport], path: &Path) -> anyhow::Result<Option<bool>> {
    let panels: Vec<&ScenarioReport> = reports.iter().filter(|r| !r.series.is_empty()).collect();
    if panels.is_empty() {
        return Ok(None);
    }
    let text = fonts();
    let (w, h) = (1000u32, 360u32);
    let root = BitMapBackend::new(path, (w, h * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE).context("plot")?;
    let areas = root.split_evenly((panels.len(), 1));
    for (area, rep) in areas.iter().zip(&panels) {
        let all: Vec<f64> = rep
            .series
            .iter()
            .flat_map(|s| s.samples.iter().copied())
            .collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min).min(0.0);
        let hi = percentile(&all, 99.9).unwrap_or(1.0).max(lo + 1e-9) * 1.05;
        let mut builder = ChartBuilder::on(area);
        builder.margin(12);
        if text {
            builder
                .caption(
                    format!("{}: CDF of {} (x clipped at p99.9)", rep.id, rep.plot_unit),
                    ("sans-serif", 20),
                )
                .x_label_area_size(36)
                .y_label_area_size(48);
        }
        let mut chart = builder
            .build_cartesian_2d(lo..hi, 0.0..1.0)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        if text {
            chart
                .configure_mesh()
                .x_desc(rep.plot_unit)
                .y_desc("fraction ≤ x")
                .draw()
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        }
        for (i, s) in rep.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = ecdf(&s.samples, 2000)
                .into_iter()
                .filter(|p| p.0 <= hi)
                .collect();
            let series = chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            if text {
                series
                    .label(format!("{} (n = {})", s.label, s.samples.len()))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        }
    }
    root.present().context("writing the plot")?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecdf_is_monotone_and_ends_at_one() {
        let xs: Vec<f64> = (0..10_000).rev().map(f64::from).collect();
        let pts = ecdf(&xs, 100);
        assert!(pts.len() <= 101);
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(pts.last(), Some(&(9999.0, 1.0)));
        assert_eq!(ecdf(&[], 10), vec![]);
        assert_eq!(ecdf(&[2.0], 10), vec![(2.0, 1.0)]);
    }
}
