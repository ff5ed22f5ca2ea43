use std::net::Ipv6Addr;

use super::book::{SPAN, seed_offset};
use super::*;
use eniipam_api::model::{AttachmentKey, PodRef};

const PREFIX: &str = "2600:1f18:6d00:100:a1b2::/80";

fn key(c: &str) -> AttachmentKey {
    AttachmentKey::new(c.to_owned(), "eth0".to_owned())
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn meta() -> Meta {
    Meta {
        network: "eniipam".into(),
        netns: "/run/netns/x".into(),
    }
}

fn book() -> Book {
    Book::new(PREFIX.parse().unwrap(), 1)
}

fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn addresses_come_in_order_from_offset_one_and_a_released_one_is_never_handed_out_again() {
    let mut b = book();
    let g1 = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 1)
        .unwrap();
    let g2 = b
        .acquire(&key("c2"), &pod("b"), None, &meta(), None, 1)
        .unwrap();
    assert_eq!(g1.ip, ip("2600:1f18:6d00:100:a1b2::1"));
    assert_eq!(g2.ip, ip("2600:1f18:6d00:100:a1b2::2"));
    assert_eq!((g1.new, g2.next_offset), (true, 3));
    // A repeated ADD gets the same address, and moves nothing.
    let again = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 2)
        .unwrap();
    assert_eq!((again.ip, again.new, again.next_offset), (g1.ip, false, 3));
    let r = b.release(&key("c1"), false, 300_000, 3).unwrap();
    assert_eq!((r.ip, r.reservation), (g1.ip, None));
    assert!(
        b.release(&key("c1"), false, 300_000, 3).is_none(),
        "unknown: None"
    );
    for n in 0..100 {
        let g = b
            .acquire(&key(&format!("n{n}")), &pod("x"), None, &meta(), None, 4)
            .unwrap();
        assert_ne!(g.ip, g1.ip, "a released address is not handed out again");
    }
    assert_eq!(b.assigned(), 101);
}

#[test]
fn a_statefulset_pod_gets_its_address_back_within_the_stick_time_and_no_one_else_does() {
    let mut b = book();
    let sk = Some("ns/web-0");
    let g = b
        .acquire(&key("c1"), &pod("web-0"), sk, &meta(), None, 0)
        .unwrap();
    let r = b.release(&key("c1"), true, 1_000, 10).unwrap();
    assert_eq!(r.reservation, Some(("ns/web-0".to_owned(), 1_010)));
    // Another pod asking for it by preference is refused; a fresh one never lands on it.
    let e = b
        .acquire(&key("c2"), &pod("other"), None, &meta(), Some(g.ip), 20)
        .unwrap_err();
    assert!(
        matches!(e, Ipv6Error::PreferredUnavailable { ref why, .. } if why.contains("ns/web-0")),
        "{e}"
    );
    let back = b
        .acquire(&key("c3"), &pod("web-0"), sk, &meta(), None, 500)
        .unwrap();
    assert_eq!((back.ip, b.reserved()), (g.ip, 0));
    // After the stick time the reservation is gone, and the address with it (cursor is past it).
    b.release(&key("c3"), true, 1_000, 600).unwrap();
    let late = b
        .acquire(&key("c4"), &pod("web-0"), sk, &meta(), None, 5_000)
        .unwrap();
    assert_ne!(late.ip, g.ip);
    assert_eq!(b.reserved(), 0);
}

#[test]
fn a_preferred_address_must_be_a_free_pod_address_of_the_prefix() {
    let mut b = book();
    let mine = ip("2600:1f18:6d00:100:a1b2::ff");
    let g = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), Some(mine), 0)
        .unwrap();
    assert_eq!(g.ip, mine);
    assert_eq!(
        g.next_offset, 0x100,
        "the cursor moves past a preferred address"
    );
    for (bad, why) in [
        (mine, "held by"),
        (ip("2600:1f18:6d00:100:a1b3::1"), "not a pod address"),
        (ip("2600:1f18:6d00:100:a1b2::"), "not a pod address"),
    ] {
        let e = b
            .acquire(&key("c2"), &pod("b"), None, &meta(), Some(bad), 0)
            .unwrap_err();
        assert!(e.to_string().contains(why), "{bad}: {e}");
    }
    assert_eq!(b.assigned(), 1, "refusals change nothing");
}

#[test]
fn undo_puts_everything_back() {
    let mut b = book();
    let sk = Some("ns/db-0");
    b.acquire(&key("c1"), &pod("db-0"), sk, &meta(), None, 0)
        .unwrap();
    let r = b.release(&key("c1"), true, 1_000, 1).unwrap();
    let g = b
        .acquire(&key("c2"), &pod("db-0"), sk, &meta(), None, 2)
        .unwrap();
    b.undo_acquire(&key("c2"), &g);
    assert_eq!(
        (b.assigned(), b.reserved()),
        (0, 1),
        "the reservation is back"
    );
    b.undo_release(&r);
    assert_eq!((b.assigned(), b.reserved()), (1, 0));
    assert_eq!(b.get(&key("c1")).unwrap().ip, r.ip);
    // Undoing a repeated ADD's grant keeps the address with its attachment.
    let again = b
        .acquire(&key("c1"), &pod("db-0"), sk, &meta(), None, 3)
        .unwrap();
    b.undo_acquire(&key("c1"), &again);
    assert_eq!(b.holder_of(r.ip), Some(&key("c1")));
}

#[test]
fn the_cursor_wraps_past_the_end_and_skips_held_addresses() {
    let mut b = Book::new(PREFIX.parse().unwrap(), SPAN - 1);
    let last = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 0)
        .unwrap();
    assert_eq!(last.ip, ip("2600:1f18:6d00:100:a1b2:ffff:ffff:ffff"));
    b.acquire(
        &key("c0"),
        &pod("z"),
        None,
        &meta(),
        Some(ip("2600:1f18:6d00:100:a1b2::1")),
        0,
    )
    .unwrap();
    let wrapped = b
        .acquire(&key("c2"), &pod("b"), None, &meta(), None, 0)
        .unwrap();
    assert_eq!(
        wrapped.ip,
        ip("2600:1f18:6d00:100:a1b2::2"),
        "offset 0 and the held ::1 are skipped"
    );
}

#[test]
fn restore_keeps_the_good_rows_and_says_why_it_dropped_the_others() {
    use crate::stored::{StoredAssignment6, StoredPrefix6, StoredReservation6};
    let row = |ipv6: &str, c: &str| StoredAssignment6 {
        ip: ip(ipv6),
        network: "eniipam".into(),
        container_id: c.into(),
        ifname: "eth0".into(),
        netns: "/x".into(),
        pod_namespace: "ns".into(),
        pod_name: c.into(),
        pod_uid: "u".into(),
        sticky_key: None,
        assigned_at_ms: 1,
        egress_ipv4: None,
    };
    let stored = StoredIpv6 {
        prefix: None,
        assignments: vec![
            row("2600:1f18:6d00:100:a1b2::7", "c1"),
            row("2600:1f18:6d00:100:a1b2::7", "c2"),
            row("2600:1f18:6d00:100:ffff::7", "c3"),
        ],
        reservations: vec![
            StoredReservation6 {
                ip: ip("2600:1f18:6d00:100:a1b2::9"),
                sticky_key: "ns/old".into(),
                until_ms: 50,
                released_at_ms: 1,
            },
            StoredReservation6 {
                ip: ip("2600:1f18:6d00:100:a1b2::20"),
                sticky_key: "ns/web-1".into(),
                until_ms: 500,
                released_at_ms: 1,
            },
        ],
    };
    let prefix = StoredPrefix6 {
        prefix: PREFIX.parse().unwrap(),
        eni_id: "eni-0".into(),
        next_offset: 3,
        egress_next: 0,
        taken_at_ms: 1,
    };
    let (pool, restored) = Ipv6Pool::restore(prefix, stored, (vec![], false), 300_000, 100);
    assert_eq!(restored.dropped.len(), 3, "{:?}", restored.dropped);
    assert_eq!(restored.state.assignments.len(), 1);
    assert_eq!(restored.state.reservations.len(), 1);
    assert_eq!(
        restored.state.prefix.as_ref().unwrap().next_offset,
        0x21,
        "the cursor never falls behind an address on record"
    );
    pool.with(|b| {
        assert_eq!(
            b.holder_of(ip("2600:1f18:6d00:100:a1b2::7")),
            Some(&key("c1"))
        );
    });
}

#[test]
fn families_parse_and_name_the_bad_value() {
    assert_eq!("dual".parse::<IpFamily>(), Ok(IpFamily::Dual));
    assert!(IpFamily::Dual.has_ipv4() && IpFamily::Dual.has_ipv6());
    assert!(!IpFamily::Ipv6.has_ipv4() && !IpFamily::Ipv4.has_ipv6());
    let e = "IPv6".parse::<IpFamily>().unwrap_err();
    assert!(e.contains("\"IPv6\""), "{e}");
}

#[test]
fn a_seeded_cursor_is_past_what_an_earlier_life_handed_out() {
    let taken_at = 1_790_000_000_000u64;
    let earlier = seed_offset(taken_at);
    // That life handed out 16 addresses a millisecond for a day, then lost its state file.
    let handed_out = earlier + 16 * 86_400_000;
    assert!(seed_offset(taken_at + 86_400_000 + 1) > handed_out);
    assert!(seed_offset(0) >= 1 && seed_offset(u64::MAX) < SPAN);
}

fn egress_book() -> Book {
    book().with_egress(0)
}

fn v4(s: &str) -> std::net::Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn each_pod_gets_its_own_egress_address_and_a_released_one_is_not_handed_out_at_once() {
    let mut b = egress_book();
    let g1 = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 1)
        .unwrap();
    let g2 = b
        .acquire(&key("c2"), &pod("b"), None, &meta(), None, 1)
        .unwrap();
    assert_eq!(g1.egress, Some(v4("169.254.172.1")));
    assert_eq!((g2.egress, g2.egress_next), (Some(v4("169.254.172.2")), 2));
    // A repeated ADD keeps it.
    let again = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 2)
        .unwrap();
    assert_eq!((again.egress, again.egress_next), (g1.egress, 2));
    let r = b.release(&key("c1"), false, 0, 3).unwrap();
    assert_eq!(r.egress, g1.egress);
    assert_eq!(b.egress().unwrap().held(), 1);
    let g3 = b
        .acquire(&key("c3"), &pod("c"), None, &meta(), None, 4)
        .unwrap();
    assert_eq!(
        g3.egress,
        Some(v4("169.254.172.3")),
        "forward, not the freed .1"
    );
    // A book without egress hands none out.
    let g = book()
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 1)
        .unwrap();
    assert_eq!(g.egress, None);
}

#[test]
fn the_undo_paths_undo_the_egress_address_too() {
    let mut b = egress_book();
    let g = b
        .acquire(&key("c1"), &pod("a"), None, &meta(), None, 1)
        .unwrap();
    b.undo_acquire(&key("c1"), &g);
    assert_eq!(b.egress().unwrap().held(), 0);
    let g = b
        .acquire(&key("c2"), &pod("b"), None, &meta(), None, 1)
        .unwrap();
    assert_eq!(g.egress, Some(v4("169.254.172.2")), "the cursor stays past");
    let r = b.release(&key("c2"), false, 0, 2).unwrap();
    assert_eq!(b.egress().unwrap().held(), 0);
    b.undo_release(&r);
    assert_eq!(b.get(&key("c2")).unwrap().egress, g.egress);
    assert_eq!(b.egress().unwrap().held(), 1);
    let e = b
        .egress()
        .cloned()
        .unwrap()
        .restore(g.egress.unwrap())
        .unwrap_err();
    assert!(e.contains("held twice"), "the undone release holds it: {e}");
}

#[test]
fn running_out_of_egress_addresses_is_an_error_that_changes_nothing() {
    let mut b = egress_book();
    for n in 0..super::egress::EGRESS_SPAN {
        b.acquire(&key(&format!("c{n}")), &pod("p"), None, &meta(), None, 1)
            .unwrap();
    }
    let (offset, egress_next) = (b.next_offset(), b.egress().unwrap().next());
    let e = b
        .acquire(&key("one-more"), &pod("p"), Some("ns/p"), &meta(), None, 1)
        .unwrap_err();
    assert!(matches!(e, Ipv6Error::EgressExhausted(_)), "{e}");
    assert!(e.to_string().contains("169.254.172.0/22"), "{e}");
    assert_eq!(b.assigned() as u64, super::egress::EGRESS_SPAN);
    assert_eq!(
        (b.next_offset(), b.egress().unwrap().next()),
        (offset, egress_next)
    );
    assert!(b.get(&key("one-more")).is_none());
    // One pod going makes room for one.
    b.release(&key("c7"), false, 0, 2).unwrap();
    let g = b
        .acquire(&key("one-more"), &pod("p"), None, &meta(), None, 3)
        .unwrap();
    assert_eq!(g.egress, Some(v4("169.254.172.8")));
}

#[test]
fn restore_keeps_egress_addresses_with_egress_on_and_drops_them_with_it_off() {
    use crate::stored::{StoredAssignment6, StoredPrefix6};
    let row = |ipv6: &str, c: &str, egress: &str| StoredAssignment6 {
        ip: ip(ipv6),
        network: "eniipam".into(),
        container_id: c.into(),
        ifname: "eth0".into(),
        netns: "/x".into(),
        pod_namespace: "ns".into(),
        pod_name: c.into(),
        pod_uid: "u".into(),
        sticky_key: None,
        assigned_at_ms: 1,
        egress_ipv4: Some(v4(egress)),
    };
    let stored = StoredIpv6 {
        prefix: None,
        assignments: vec![
            row("2600:1f18:6d00:100:a1b2::1", "c1", "169.254.172.9"),
            row("2600:1f18:6d00:100:a1b2::2", "c2", "169.254.172.9"),
            row("2600:1f18:6d00:100:a1b2::3", "c3", "10.0.0.9"),
            row("2600:1f18:6d00:100:a1b2::4", "c4", "169.254.172.10"),
        ],
        reservations: vec![],
    };
    let prefix = StoredPrefix6 {
        prefix: PREFIX.parse().unwrap(),
        eni_id: "eni-0".into(),
        next_offset: 5,
        egress_next: 8,
        taken_at_ms: 1,
    };
    let (pool, restored) =
        Ipv6Pool::restore(prefix.clone(), stored.clone(), (vec![], true), 300_000, 100);
    let why: Vec<&str> = restored.dropped.iter().map(|(_, w)| w.as_str()).collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why.iter().any(|w| w.contains("held twice")), "{why:?}");
    assert!(
        why.iter().any(|w| w.contains("not a pod address")),
        "{why:?}"
    );
    let mut kept: Vec<_> = restored
        .state
        .assignments
        .iter()
        .map(|a| (a.container_id.as_str(), a.egress_ipv4))
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("c1", Some(v4("169.254.172.9"))),
            ("c4", Some(v4("169.254.172.10")))
        ]
    );
    assert_eq!(restored.state.prefix.as_ref().unwrap().egress_next, 8);
    // The cursor carries on from the record and skips what is held.
    let g = pool
        .with(|b| b.acquire(&key("c5"), &pod("e"), None, &meta(), None, 100))
        .unwrap();
    assert_eq!(g.egress, Some(v4("169.254.172.11")));
    // ipv4_egress off: every row stays, without its egress address.
    let (_, restored) = Ipv6Pool::restore(prefix, stored, (vec![], false), 300_000, 100);
    assert!(restored.dropped.is_empty(), "{:?}", restored.dropped);
    assert_eq!(restored.state.assignments.len(), 4);
    assert!(
        restored
            .state
            .assignments
            .iter()
            .all(|a| a.egress_ipv4.is_none())
    );
}
