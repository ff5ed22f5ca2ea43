//! The Pareto view of a pattern: p99 pod wait (y) against free IPs held, time-weighted mean (x).
//! Both are costs: a policy buys a shorter wait with free IPs. Each VPC CNI policy is a point;
//! eniipam is a curve through its default and its knob variants (`Policy::on_eniipam_curve`).
//! A point dominates another when it is no worse on both axes and better on one; the report says
//! which VPC CNI points eniipam's default dominates, and whether any of them dominates it.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::chart::err;
use super::policy::Policy;
use super::runs::Runs;
use super::traffic::Pattern;

/// One policy's place: (free IPs, mean; p99 wait, s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub free: f64,
    pub p99_s: f64,
}

impl Point {
    /// A policy's point: its median run's free IPs and p99 wait (each axis's median on its own).
    pub fn of(g: &Runs<'_>) -> Self {
        Self {
            free: g.across(|r| r.free_mean).median,
            p99_s: g.across(|r| super::p(&r.waits_ms, 99.0)).median,
        }
    }

    /// ≤ on both axes and < on one.
    pub fn dominates(self, other: Point) -> bool {
        self.free <= other.free
            && self.p99_s <= other.p99_s
            && (self.free < other.free || self.p99_s < other.p99_s)
    }
}

/// Eniipam's default against the VPC CNI points of a pattern.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dominance {
    /// VPC CNI policies eniipam's default dominates.
    pub dominated_by_ours: Vec<Policy>,
    /// VPC CNI policies that dominate eniipam's default.
    pub dominating_ours: Vec<Policy>,
}

/// `None` when the pattern has no eniipam default in `results`.
pub fn dominance(results: &[&Runs<'_>]) -> Option<Dominance> {
    let ours = Point::of(results.iter().find(|r| r.policy == Policy::Eniipam)?);
    let mut d = Dominance::default();
    for r in results.iter().filter(|r| r.policy.is_vpc_cni()) {
        let theirs = Point::of(r);
        if ours.dominates(theirs) {
            d.dominated_by_ours.push(r.policy);
        }
        if theirs.dominates(ours) {
            d.dominating_ours.push(r.policy);
        }
    }
    Some(d)
}

/// The report's sentence for one pattern.
pub fn sentence(pattern: Pattern, d: &Dominance) -> String {
    let names = |v: &[Policy]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
        }
    };
    format!(
        "{pattern}, Pareto (p99 wait against free IPs held): eniipam's default dominates {}; dominated by {}",
        names(&d.dominated_by_ours),
        names(&d.dominating_ours)
    )
}

/// `fleet-pareto-<pattern>.png`.
pub fn plot(dir: &Path, pattern: Pattern, results: &[&Runs<'_>]) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("fleet-pareto-{}.png", pattern.name()));
    draw(&path, pattern, results)?;
    Ok(path)
}

fn draw(path: &Path, pattern: Pattern, results: &[&Runs<'_>]) -> anyhow::Result<()> {
    let text = crate::plot::fonts();
    let points: Vec<(Policy, Point)> = results.iter().map(|r| (r.policy, Point::of(r))).collect();
    let x_max = points.iter().map(|p| p.1.free).fold(1.0, f64::max) * 1.15;
    let y_max = points.iter().map(|p| p.1.p99_s).fold(1.0, f64::max) * 1.15;
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(16);
    if text {
        builder
            .caption(
                format!("fleet, {pattern}: p99 pod wait against free IPs held"),
                ("sans-serif", 22),
            )
            .x_label_area_size(40)
            .y_label_area_size(56);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    if text {
        chart
            .configure_mesh()
            .x_desc("free IPs held by the fleet, time-weighted mean")
            .y_desc("p99 pod wait, s")
            .draw()
            .map_err(err)?;
    }
    // eniipam's curve, by free IPs.
    let mut curve: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.0.on_eniipam_curve())
        .map(|p| (p.1.free, p.1.p99_s))
        .collect();
    curve.sort_by(|a, b| a.0.total_cmp(&b.0));
    let series = chart
        .draw_series(LineSeries::new(curve, BLUE.stroke_width(2)))
        .map_err(err)?;
    if text {
        series
            .label("eniipam (default and knob variants)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    }
    for (policy, pt) in &points {
        let (color, size) = match policy {
            Policy::Eniipam => (BLUE.to_rgba(), 8),
            p if p.is_vpc_cni() => (RED.to_rgba(), 7),
            _ => (BLUE.mix(0.6), 5),
        };
        chart
            .draw_series(std::iter::once(Circle::new(
                (pt.free, pt.p99_s),
                size,
                color.filled(),
            )))
            .map_err(err)?;
        if text {
            chart
                .draw_series(std::iter::once(Text::new(
                    policy.name().to_owned(),
                    (pt.free, pt.p99_s + y_max * 0.02),
                    ("sans-serif", 15),
                )))
                .map_err(err)?;
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(free: f64, p99_s: f64) -> Point {
        Point { free, p99_s }
    }

    #[test]
    fn dominance_is_no_worse_on_both_and_better_on_one() {
        assert!(pt(10.0, 1.0).dominates(pt(20.0, 1.0)));
        assert!(pt(10.0, 1.0).dominates(pt(10.0, 2.0)));
        assert!(pt(10.0, 1.0).dominates(pt(20.0, 2.0)));
        // Equal: neither dominates.
        assert!(!pt(10.0, 1.0).dominates(pt(10.0, 1.0)));
        // A trade (fewer IPs, longer wait): neither dominates.
        assert!(!pt(10.0, 5.0).dominates(pt(20.0, 1.0)));
        assert!(!pt(20.0, 1.0).dominates(pt(10.0, 5.0)));
    }

    #[test]
    fn the_sentence_names_both_sides() {
        let d = Dominance {
            dominated_by_ours: vec![Policy::WarmEni, Policy::WarmPrefix],
            dominating_ours: vec![],
        };
        assert_eq!(
            sentence(Pattern::Churn, &d),
            "churn, Pareto (p99 wait against free IPs held): eniipam's default dominates warm-eni, warm-prefix; dominated by none"
        );
    }
}
