//! The state file's repair: what the reconcile rewrites in it when it disagreed with the pool twice.

use super::*;
use crate::store::{StoredAssignment, StoredIdle, StoredState};

fn stored_assignment(last: u8, c: &str) -> StoredAssignment {
    StoredAssignment {
        ip: ip(last),
        eni_id: ETH1.into(),
        network: "net".into(),
        container_id: c.into(),
        ifname: "eth0".into(),
        netns: netns(c),
        pod_namespace: "default".into(),
        pod_name: c.into(),
        pod_uid: format!("uid-{c}"),
        sticky_key: None,
        assigned_at_ms: 1_000,
    }
}

fn stored_idle(last: u8) -> StoredIdle {
    StoredIdle {
        ip: ip(last),
        eni_id: ETH1.into(),
        idle_since_ms: 1_000,
        reservation: None,
    }
}

#[test]
fn the_state_file_is_repaired_where_it_disagreed_twice() {
    const NOW_MS: u64 = 100_000;
    let agreeing = StoredState {
        assignments: vec![stored_assignment(11, "c1")],
        idle: vec![stored_idle(12)],
        ..StoredState::default()
    };
    // The file lost c1's assignment (idle instead), and holds c9 on .13, which the pool does not.
    let drifted = StoredState {
        assignments: vec![stored_assignment(13, "c9")],
        idle: vec![stored_idle(11), stored_idle(12)],
        ..StoredState::default()
    };
    let pool = node().pool;
    let cases: Vec<(&str, Vec<&StoredState>, Vec<usize>)> = vec![
        ("nothing to do", vec![&agreeing, &agreeing], vec![0, 0]),
        ("one look is not enough", vec![&drifted], vec![0]),
        (
            "twice in a row: repaired",
            vec![&drifted, &drifted],
            vec![0, 2],
        ),
        (
            "a disagreement that went away starts over",
            vec![&drifted, &agreeing, &drifted],
            vec![0, 0, 0],
        ),
    ];
    for (name, looks, want) in cases {
        let mut memory = Memory::default();
        let got: Vec<usize> = looks
            .iter()
            .map(
                |stored| match decide_store(&pool, stored, NOW_MS, &mut memory) {
                    Some(Drift::RepairStore { rows }) => rows.len(),
                    None => 0,
                    Some(other) => panic!("{name}: {other:?}"),
                },
            )
            .collect();
        assert_eq!(got, want, "{name}");
    }
    // What the rows say: c1 holds .11 again (dated from the pool's clock), .13 has no row.
    let mut memory = Memory::default();
    decide_store(&pool, &drifted, NOW_MS, &mut memory);
    let Some(Drift::RepairStore { mut rows }) = decide_store(&pool, &drifted, NOW_MS, &mut memory)
    else {
        panic!("repaired");
    };
    rows.sort_by_key(|r| match r {
        RowRepair::Assigned(a) => a.ip,
        RowRepair::Idle(i) => i.ip,
        RowRepair::Quarantined(q) => q.ip,
        RowRepair::Absent(ip) => *ip,
    });
    assert_eq!(
        rows,
        vec![
            RowRepair::Assigned(StoredAssignment {
                assigned_at_ms: NOW_MS - 60_000,
                ..stored_assignment(11, "c1")
            }),
            RowRepair::Absent(ip(13)),
        ]
    );
}
