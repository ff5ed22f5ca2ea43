//! Issue 47, case 5, the engine's half: `Engine::check` against the real kernel, inside a "node"
//! network namespace the test makes (upstream's nine pods on their veths, as in
//! `tests/network_policy_nft.rs`). The table is put in force by `Engine::sync` with the daemon's
//! `Nft`, then changed behind the engine's back as another agent would: the base chain flushed, a
//! dispatch map flushed, a rule inserted before the dispatch, the base chains `forward` and
//! `prerouting` deleted, and `nft flush ruleset`. Each is named by the check (the cheap one where it can see it, the deep
//! one otherwise), and the next sync loads the table whole again, which a check then finds intact.
//! The daemon's loop around it (checked every 3 s, restored, logged, counted) is proved on the data
//! path by `tests/datapath_policy.rs` (`a_flushed_table_is_restored_within_seconds`).
//!
//! Needs root, `ip` and `nft`; skipped with a notice otherwise, a failure under `CI=true`. Every
//! `nft` runs inside the node's namespace only.

#[path = "network_policy_support/mod.rs"]
mod support;

use std::time::Duration;

use eniipam::host::Nft;
use eniipam::network_policy::enforce::{Engine, LocalAttachment, SyncKind};
use serde_json::json;
use support::{Lab, NAMESPACES, PODS, enter, ip_of, policy, veth, world};

/// `nft <args>` in the current thread's namespace (the node's); stdout.
async fn nft(args: &[&str], stdin: Option<&str>) -> String {
    Nft::default()
        .run(args, stdin)
        .await
        .unwrap_or_else(|e| panic!("nft {}: {e}", args.join(" ")))
}

#[test]
fn a_table_changed_behind_the_engine_is_named_and_loaded_whole() {
    let Some(lab) = Lab::new("a_table_changed_behind_the_engine_is_named_and_loaded_whole") else {
        return;
    };
    let node = lab.node.clone();
    // x's three pods isolated for ingress: three pod chains, three jumps (each after its pod's
    // hairpin accept).
    let cluster = world(&[policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    )]);
    let local: Vec<LocalAttachment> = NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| (*ns, *p)))
        .map(|(ns, p)| LocalAttachment {
            namespace: ns.into(),
            name: p.into(),
            veth: veth(ns, p),
            ips: vec![ip_of(ns, p).into()],
            container_id: format!("c-{ns}{p}"),
            held_for: Duration::from_secs(60),
        })
        .collect();
    std::thread::spawn(move || {
        enter(&node);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut engine = Engine::new(Nft::default());
            assert_eq!(
                engine.check(true).await.unwrap(),
                None,
                "nothing loaded yet"
            );
            let sync = async |engine: &mut Engine, want: SyncKind| {
                let report = engine.sync(&cluster, &local).await.expect("sync");
                assert_eq!(report.kind, want);
                assert_eq!(engine.check(true).await.unwrap(), None, "just loaded");
            };
            sync(&mut engine, SyncKind::Full).await;
            sync(&mut engine, SyncKind::Unchanged).await;

            // The base chain flushed: the table is the same one, only the deep check sees it.
            nft(
                &["flush", "chain", "inet", "eniipam_policy", "forward"],
                None,
            )
            .await;
            assert_eq!(engine.check(false).await.unwrap(), None);
            let what = engine
                .check(true)
                .await
                .unwrap()
                .expect("the base chain's rules are gone");
            assert!(what.contains("forward holds 0 rule(s), loaded with 4"), "{what}");
            sync(&mut engine, SyncKind::Full).await;

            // The dispatch map flushed (the jumps to the pods' chains): the deep check names it.
            nft(
                &["flush", "map", "inet", "eniipam_policy", "ingress_dispatch"],
                None,
            )
            .await;
            assert_eq!(engine.check(false).await.unwrap(), None);
            let what = engine
                .check(true)
                .await
                .unwrap()
                .expect("the jumps are gone");
            assert!(
                what.contains("map ingress_dispatch holds 0 element(s), loaded with 3"),
                "{what}"
            );
            sync(&mut engine, SyncKind::Full).await;
            let map = nft(
                &["list", "map", "inet", "eniipam_policy", "ingress_dispatch"],
                None,
            )
            .await;
            assert_eq!(map.matches(" jump ").count(), 3, "{map}");

            // A rule slipped in before the jumps (an accept there would bypass them).
            nft(
                &[
                    "insert",
                    "rule",
                    "inet",
                    "eniipam_policy",
                    "forward",
                    "accept",
                ],
                None,
            )
            .await;
            let what = engine.check(true).await.unwrap().expect("an extra rule");
            // Loaded: replies accepted, the hairpin accept, the two dispatches.
            assert!(what.contains("holds 5 rule(s), loaded with 4"), "{what}");
            sync(&mut engine, SyncKind::Full).await;

            // The base chain deleted (after its rules): the frequent check names it.
            nft(&["-f", "-"], Some("flush chain inet eniipam_policy forward\ndelete chain inet eniipam_policy forward\n")).await;
            let what = engine.check(false).await.unwrap().expect("no base chain");
            assert_eq!(what, "table inet eniipam_policy: its base chain forward is missing");
            sync(&mut engine, SyncKind::Full).await;

            // The anti-spoofing chain deleted: the frequent check names it too.
            nft(&["-f", "-"], Some("flush chain inet eniipam_policy prerouting\ndelete chain inet eniipam_policy prerouting\n")).await;
            let what = engine.check(false).await.unwrap().expect("no prerouting chain");
            assert_eq!(what, "table inet eniipam_policy: its base chain prerouting is missing");
            sync(&mut engine, SyncKind::Full).await;

            // Another agent's `nft flush ruleset`: the cheap check names it.
            nft(&["flush", "ruleset"], None).await;
            assert_eq!(
                engine.check(false).await.unwrap().as_deref(),
                Some("table inet eniipam_policy is missing (no chain of it in the kernel)")
            );
            sync(&mut engine, SyncKind::Full).await;
            let map = nft(
                &["list", "map", "inet", "eniipam_policy", "ingress_dispatch"],
                None,
            )
            .await;
            assert_eq!(map.matches(" jump ").count(), 3, "{map}");
        });
    })
    .join()
    .expect("the test's thread in the node");
}
