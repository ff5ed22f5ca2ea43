//! What a fresh judgement hands to the pool and to the per-profile gauge, through a recording sink.

use std::sync::Mutex;

use eniipam_cloud::Subnet;

use super::*;

/// The pool's profiles and the gauge, recorded.
#[derive(Default)]
struct Recorded {
    handed: Mutex<Vec<Vec<String>>>,
    gauge: Mutex<BTreeMap<String, bool>>,
}

impl ProfileSink for Recorded {
    fn set_profiles(&self, usable: BTreeMap<String, CheckedProfile>) {
        self.handed
            .lock()
            .unwrap()
            .push(usable.into_keys().collect());
    }
    fn totals(&self) -> BTreeMap<String, u32> {
        BTreeMap::new()
    }
    fn set_usable(&self, profile: &str, usable: Option<bool>) {
        let mut gauge = self.gauge.lock().unwrap();
        match usable {
            Some(u) => gauge.insert(profile.to_owned(), u),
            None => gauge.remove(profile),
        };
    }
}

fn usable(subnet: &str) -> Result<CheckedProfile, String> {
    Ok(CheckedProfile {
        subnet: Subnet {
            id: subnet.into(),
            vpc_id: "vpc-0a1b2c3d".into(),
            cidr: "10.0.2.0/24".parse().expect("a CIDR"),
            availability_zone: "us-east-1a".into(),
            available_ips: 250,
            tags: BTreeMap::new(),
            ipv6_cidrs: Vec::new(),
        },
        security_groups: vec!["sg-000000db".into()],
        max_enis: None,
    })
}

#[test]
fn a_changed_judgement_reaches_the_pool_and_the_gauge_and_an_unchanged_one_nothing() {
    let sink = Recorded::default();
    let judged = RwLock::new(Judged::default());
    let first = Judged {
        known: true,
        profiles: BTreeMap::from([
            ("db".to_owned(), usable("subnet-0000000a")),
            ("bad".to_owned(), Err("why".to_owned())),
        ]),
    };
    apply(&sink, &judged, &Judged::default(), first.clone());
    assert_eq!(*judged.read().unwrap(), first);
    assert_eq!(*sink.handed.lock().unwrap(), [vec!["db".to_owned()]]);
    let gauge = sink.gauge.lock().unwrap().clone();
    assert_eq!(
        gauge,
        BTreeMap::from([("bad".to_owned(), false), ("db".to_owned(), true)])
    );

    apply(&sink, &judged, &first, first.clone());
    assert_eq!(
        sink.handed.lock().unwrap().len(),
        1,
        "unchanged: nothing handed"
    );

    // `bad` deleted, `db` moved: the gauge forgets `bad`, the pool gets the new `db`.
    let second = Judged {
        known: true,
        profiles: BTreeMap::from([("db".to_owned(), usable("subnet-0000000b"))]),
    };
    apply(&sink, &judged, &first, second.clone());
    assert_eq!(sink.handed.lock().unwrap().len(), 2);
    let gauge = sink.gauge.lock().unwrap().clone();
    assert_eq!(gauge, BTreeMap::from([("db".to_owned(), true)]));
    assert_eq!(*judged.read().unwrap(), second);
}
