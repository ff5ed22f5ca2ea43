//! The node's /80 gone from EC2's describe: assigned back; "in use" while the describe lags is
//! eth0's own until a describe had a minute to show it; what is remembered is forgotten once the
//! describe shows the /80 again.

use std::time::Duration;

use ipnet::Ipv6Net;
use tokio::time::Instant;

use super::super::{AssignBackAnswer, Prefix6Memory, Prefix6Step};
use crate::cloud::DESCRIBE_SETTLES;

fn prefix() -> Ipv6Net {
    "2600:1f14:abc:1200:1::/80".parse().unwrap()
}

#[test]
fn in_use_while_the_describe_lags_is_not_remembered_as_refused_and_a_later_loss_is_taken_back() {
    let (p, t0) = (prefix(), Instant::now());
    let mut m = Prefix6Memory::default();
    // The startup assigned the /80 back moments ago; the describe does not show it yet.
    assert_eq!(m.step(p, false, true, t0), Prefix6Step::AssignBack);
    assert!(
        !m.answered(p, AssignBackAnswer::InUse, t0),
        "not refused on one answer"
    );
    // Nothing asked while the describe settles.
    let t1 = t0 + Duration::from_secs(5);
    assert_eq!(m.step(p, false, true, t1), Prefix6Step::Settling);
    // The describe shows it: in place, and nothing remembered.
    assert_eq!(m.step(p, true, false, t1), Prefix6Step::InPlace);
    assert_eq!(m, Prefix6Memory::default());
    // A real loss later is assigned back.
    let t2 = t1 + Duration::from_secs(120);
    assert_eq!(m.step(p, false, true, t2), Prefix6Step::AssignBack);
    assert!(!m.answered(p, AssignBackAnswer::Assigned, t2));
    assert_eq!(m, Prefix6Memory::default());
}

#[test]
fn in_use_once_the_describe_had_a_minute_is_refused_for_good_until_the_describe_shows_it() {
    let (p, t0) = (prefix(), Instant::now());
    let mut m = Prefix6Memory::default();
    assert_eq!(m.step(p, false, true, t0), Prefix6Step::AssignBack);
    assert!(!m.answered(p, AssignBackAnswer::InUse, t0));
    let almost = t0 + DESCRIBE_SETTLES - Duration::from_millis(1);
    assert_eq!(m.step(p, false, true, almost), Prefix6Step::Settling);
    // A minute on, still not on eth0: asked once more, and in use again is another ENI's.
    let later = t0 + DESCRIBE_SETTLES;
    assert_eq!(m.step(p, false, true, later), Prefix6Step::AssignBack);
    assert!(m.answered(p, AssignBackAnswer::InUse, later));
    assert_eq!(m.step(p, false, true, later), Prefix6Step::Missing);
    assert_eq!(
        m.step(p, false, true, later + Duration::from_secs(3600)),
        Prefix6Step::Missing,
        "asked no more"
    );
    // Back on eth0 (an operator assigned it): forgotten, and a later loss is taken back.
    assert_eq!(m.step(p, true, false, later), Prefix6Step::InPlace);
    assert_eq!(m.step(p, false, true, later), Prefix6Step::AssignBack);
}

#[test]
fn other_refusals_are_final_failures_are_asked_again_and_another_80_on_eth0_is_only_reported() {
    let (p, t0) = (prefix(), Instant::now());
    let mut m = Prefix6Memory::default();
    assert!(!m.answered(p, AssignBackAnswer::Failed, t0));
    assert_eq!(m.step(p, false, true, t0), Prefix6Step::AssignBack);
    assert!(m.answered(p, AssignBackAnswer::Refused, t0));
    assert_eq!(m.step(p, false, true, t0), Prefix6Step::Missing);
    let mut m = Prefix6Memory::default();
    assert_eq!(m.step(p, false, false, t0), Prefix6Step::Missing);
}
