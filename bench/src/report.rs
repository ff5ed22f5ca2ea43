//! What a scenario reports: rows of figures against targets and anchors, rendered as markdown.

use std::fmt::Write as _;

use crate::stats::AcrossRuns;

/// The unit of a figure (values are stored in this unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Ms,
    Secs,
    Count,
    PerSec,
    MiB,
    /// A plain number with two decimals (a ratio, calls per pod, a percentage).
    Ratio,
}

impl Unit {
    pub fn format(self, v: f64) -> String {
        match self {
            Unit::Ms if v < 10.0 => format!("{v:.2} ms"),
            Unit::Ms if v < 100.0 => format!("{v:.1} ms"),
            Unit::Ms => format!("{v:.0} ms"),
            Unit::Secs => format!("{v:.2} s"),
            Unit::Count => format!("{v:.0}"),
            Unit::PerSec => format!("{v:.0}/s"),
            Unit::MiB => format!("{v:.1} MiB"),
            Unit::Ratio => format!("{v:.2}"),
        }
    }
}

/// What a figure is compared with.
#[derive(Clone, Debug, PartialEq)]
pub enum Anchor {
    /// Measured in the same run, by the same harness.
    Measured { name: String, value: f64 },
    /// A published or computed figure (a bound, a threshold), not run here.
    Reference { name: String, value: f64 },
    /// A figure of each run (measured in the same runs, or computed from each run's own start),
    /// compared by its median run and printed with its range.
    Across {
        name: String,
        across: AcrossRuns,
        measured: bool,
    },
    /// Nothing comparable can run here; why.
    None(String),
}

/// What a figure must reach.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
    /// ours / anchor ≤ r (both zero counts as met).
    RatioAtMost(f64),
    /// ours ≤ anchor + d.
    AtMostAnchorPlus(f64),
    /// Reported for information.
    Info,
}

/// One line of a scenario's table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub metric: String,
    pub unit: Unit,
    pub ours: AcrossRuns,
    pub anchor: Anchor,
    pub target: Target,
}

/// Whether a row meets its target, and by how much it misses.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Met(String),
    Missed(String),
    NotApplicable,
}

impl Row {
    pub fn new(metric: impl Into<String>, unit: Unit, ours: AcrossRuns) -> Self {
        Self {
            metric: metric.into(),
            unit,
            ours,
            anchor: Anchor::None(String::new()),
            target: Target::Info,
        }
    }

    pub fn single(metric: impl Into<String>, unit: Unit, value: f64) -> Self {
        Self::new(metric, unit, AcrossRuns::of(&[value]).expect("one value"))
    }

    pub fn anchor(mut self, anchor: Anchor) -> Self {
        self.anchor = anchor;
        self
    }

    pub fn target(mut self, target: Target) -> Self {
        self.target = target;
        self
    }

    fn anchor_value(&self) -> Option<f64> {
        match &self.anchor {
            Anchor::Measured { value, .. } | Anchor::Reference { value, .. } => Some(*value),
            Anchor::Across { across, .. } => Some(across.median),
            Anchor::None(_) => None,
        }
    }

    /// ours / anchor.
    pub fn ratio(&self) -> Option<f64> {
        self.anchor_value()
            .filter(|a| *a != 0.0)
            .map(|a| self.ours.median / a)
    }

    pub fn verdict(&self) -> Verdict {
        let v = self.ours.median;
        let u = self.unit;
        match self.target {
            Target::Info => Verdict::NotApplicable,
            Target::AtMost(t) if v <= t && t <= 0.0 => Verdict::Met("yes".into()),
            Target::AtMost(t) if v <= t => {
                Verdict::Met(format!("yes ({:.0} % of the limit)", 100.0 * v / t))
            }
            Target::AtMost(t) if t <= 0.0 => {
                Verdict::Missed(format!("NO: {} over the limit", u.format(v - t)))
            }
            Target::AtMost(t) => Verdict::Missed(format!(
                "NO: ×{:.2} the limit (+{})",
                v / t,
                u.format(v - t)
            )),
            Target::AtLeast(t) if v >= t => Verdict::Met(format!("yes (×{:.2} the floor)", v / t)),
            Target::AtLeast(t) => Verdict::Missed(format!(
                "NO: {:.0} % of the floor (−{})",
                100.0 * v / t,
                u.format(t - v)
            )),
            Target::RatioAtMost(_) if self.anchor_value() == Some(0.0) => {
                if v <= 0.0 {
                    Verdict::Met("yes (both 0)".into())
                } else {
                    Verdict::Missed("NO: the anchor is 0".into())
                }
            }
            Target::AtMostAnchorPlus(d) => match self.anchor_value() {
                None => Verdict::NotApplicable,
                Some(a) if v <= a + d => {
                    Verdict::Met(format!("yes ({} to spare)", u.format(a + d - v)))
                }
                Some(a) => Verdict::Missed(format!("NO: +{} over the limit", u.format(v - a - d))),
            },
            Target::RatioAtMost(r) => match self.ratio() {
                None => Verdict::NotApplicable,
                Some(x) if x <= r => Verdict::Met(format!("yes (ratio {x:.2})")),
                Some(x) => Verdict::Missed(format!("NO: ratio {x:.2}, ×{:.2} the limit", x / r)),
            },
        }
    }

    fn target_text(&self) -> String {
        match self.target {
            Target::Info => "—".into(),
            Target::AtMost(t) => format!("≤ {}", self.unit.format(t)),
            Target::AtLeast(t) => format!("≥ {}", self.unit.format(t)),
            Target::RatioAtMost(r) => format!("≤ {r} × anchor"),
            Target::AtMostAnchorPlus(d) => format!("≤ anchor + {}", self.unit.format(d)),
        }
    }
}

/// A figure over runs: the median run, and `[min – max]` when the runs differ.
fn spread(a: &AcrossRuns, unit: Unit) -> String {
    a.shown(|v| unit.format(v))
}

/// A distribution to plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    /// In `ScenarioReport::plot_unit`.
    pub samples: Vec<f64>,
}

/// Everything a scenario hands back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScenarioReport {
    pub id: &'static str,
    pub title: String,
    pub reproduce: String,
    pub setup: Vec<String>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub plot_unit: &'static str,
    pub series: Vec<Series>,
}

impl ScenarioReport {
    /// The markdown section: title, setup, table, notes, how to reproduce.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "### `{}`: {}\n", self.id, self.title);
        for line in &self.setup {
            let _ = writeln!(s, "- {line}");
        }
        if !self.setup.is_empty() {
            s.push('\n');
        }
        s.push_str(&self.table());
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        let _ = writeln!(s, "\nReproduce: `{}`", self.reproduce);
        s
    }

    /// The figures table alone.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| metric | eniipam: median run [min – max] | anchor | ratio | target | met |\n\
             | --- | --- | --- | --- | --- | --- |\n",
        );
        for r in &self.rows {
            let ours = spread(&r.ours, r.unit);
            let anchor = match &r.anchor {
                Anchor::Measured { name, value } => {
                    format!("{}: {} (measured)", name, r.unit.format(*value))
                }
                Anchor::Reference { name, value } => format!("{}: {}", name, r.unit.format(*value)),
                Anchor::Across {
                    name,
                    across,
                    measured,
                } => format!(
                    "{name}: {}{}",
                    spread(across, r.unit),
                    if *measured { " (measured)" } else { "" }
                ),
                Anchor::None(why) if why.is_empty() => "—".into(),
                Anchor::None(why) => why.clone(),
            };
            let ratio = r.ratio().map_or("—".into(), |x| format!("{x:.2}"));
            let met = match r.verdict() {
                Verdict::Met(t) | Verdict::Missed(t) => t,
                Verdict::NotApplicable => "—".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                r.metric,
                ours,
                anchor,
                ratio,
                r.target_text(),
                met
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(v: f64) -> Row {
        Row::single("x", Unit::Ms, v)
    }

    #[test]
    fn verdicts() {
        assert!(matches!(
            row(4.0).target(Target::AtMost(5.0)).verdict(),
            Verdict::Met(_)
        ));
        assert_eq!(
            row(10.0).target(Target::AtMost(5.0)).verdict(),
            Verdict::Missed("NO: ×2.00 the limit (+5.00 ms)".into())
        );
        assert_eq!(
            row(2.0).target(Target::AtMost(0.0)).verdict(),
            Verdict::Missed("NO: 2.00 ms over the limit".into())
        );
        assert!(matches!(
            row(6.0).target(Target::AtLeast(5.0)).verdict(),
            Verdict::Met(_)
        ));
        assert!(matches!(
            row(4.0).target(Target::AtLeast(5.0)).verdict(),
            Verdict::Missed(_)
        ));
        let r = row(3.0)
            .anchor(Anchor::Measured {
                name: "a".into(),
                value: 4.0,
            })
            .target(Target::RatioAtMost(0.5));
        assert_eq!(r.ratio(), Some(0.75));
        assert_eq!(
            r.verdict(),
            Verdict::Missed("NO: ratio 0.75, ×1.50 the limit".into())
        );
        assert_eq!(row(1.0).verdict(), Verdict::NotApplicable);
        let anchored = |v: f64, a: f64, t: Target| {
            row(v)
                .anchor(Anchor::Measured {
                    name: "a".into(),
                    value: a,
                })
                .target(t)
                .verdict()
        };
        assert!(matches!(
            anchored(0.0, 0.0, Target::RatioAtMost(0.1)),
            Verdict::Met(_)
        ));
        assert!(matches!(
            anchored(1.0, 0.0, Target::RatioAtMost(0.1)),
            Verdict::Missed(_)
        ));
        assert!(matches!(
            anchored(2.9, 2.0, Target::AtMostAnchorPlus(1.0)),
            Verdict::Met(_)
        ));
        assert!(matches!(
            anchored(3.1, 2.0, Target::AtMostAnchorPlus(1.0)),
            Verdict::Missed(_)
        ));
    }
}
