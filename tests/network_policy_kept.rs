//! Issue 47, case 5, the engine's half: `Engine::check` against the real kernel, inside a "node"
//! network namespace the test makes (upstream's nine pods on their veths, as in
//! `tests/network_policy_nft.rs`). The table is put in force by `Engine::sync` with the daemon's
//! `Nft`, then changed behind the engine's back as another agent would: the base chain flushed, a
//! rule inserted before the jumps, the base chain deleted, and `nft flush ruleset`. Each is named by the check (the cheap one where it can see it, the deep
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

            // The jumps flushed: the table is the same one, only the deep check sees it.
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
                .expect("the jumps are gone");
            assert!(
                what.contains("lacks the jumps to 3 pod chain(s) (in_enixa, in_enixb, in_enixc)"),
                "{what}"
            );
            sync(&mut engine, SyncKind::Full).await;
            let base = nft(
                &["list", "chain", "inet", "eniipam_policy", "forward"],
                None,
            )
            .await;
            assert_eq!(base.matches(" jump ").count(), 3, "{base}");

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
            // Loaded: replies accepted, and per pod its hairpin accept and its jump.
            assert!(what.contains("holds 8 rule(s), loaded with 7"), "{what}");
            sync(&mut engine, SyncKind::Full).await;

            // The base chain deleted (after its rules): the frequent check names it.
            nft(&["-f", "-"], Some("flush chain inet eniipam_policy forward\ndelete chain inet eniipam_policy forward\n")).await;
            let what = engine.check(false).await.unwrap().expect("no base chain");
            assert_eq!(what, "table inet eniipam_policy: its base chain forward is missing");
            sync(&mut engine, SyncKind::Full).await;

            // Another agent's `nft flush ruleset`: the cheap check names it.
            nft(&["flush", "ruleset"], None).await;
            assert_eq!(
                engine.check(false).await.unwrap().as_deref(),
                Some("table inet eniipam_policy is missing (no chain of it in the kernel)")
            );
            sync(&mut engine, SyncKind::Full).await;
            let base = nft(
                &["list", "chain", "inet", "eniipam_policy", "forward"],
                None,
            )
            .await;
            assert_eq!(base.matches(" jump ").count(), 3, "{base}");
        });
    })
    .join()
    .expect("the test's thread in the node");
}
