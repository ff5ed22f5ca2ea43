//! `eniipamctl policy <namespace>/<pod>`: what NetworkPolicy says of a pod of this node, and why
//! (which policy isolates each direction, which rule allows what), with the connections the
//! kernel's rules counted.

use std::path::Path;

use eniipam_api::pb;
use serde_json::json;

use crate::introspect::{introspect, status_err};

/// `namespace/name` (or `name`, in `default`).
pub fn parse_pod(arg: &str) -> Result<(String, String), String> {
    let (ns, name) = arg.split_once('/').unwrap_or(("default", arg));
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !ok(ns) || !ok(name) || name.contains('/') {
        return Err(format!(
            "{arg:?} is not <namespace>/<pod> (lower-case DNS names, e.g. default/web-0)"
        ));
    }
    Ok((ns.to_owned(), name.to_owned()))
}

fn direction_json(d: Option<&pb::PolicyDirection>) -> serde_json::Value {
    let Some(d) = d else {
        return json!(null);
    };
    json!({
        "isolated": d.isolated,
        "policies": d.policies,
        "rules": d.rules.iter().map(|r| json!({
            "source": r.source, "peers": r.peers, "ports": r.ports,
        })).collect::<Vec<_>>(),
        "allowed": d.allowed,
        "denied": d.denied,
    })
}

fn print_direction(word: &str, d: Option<&pb::PolicyDirection>) {
    let Some(d) = d else { return };
    if !d.isolated {
        println!("{word}: open (no NetworkPolicy isolates it: every connection is allowed)");
        return;
    }
    println!(
        "{word}: isolated by {} ({} new connections allowed, {} denied)",
        d.policies.join(", "),
        d.allowed,
        d.denied
    );
    if d.rules.is_empty() {
        println!("  no rule allows anything: every new connection is denied");
    }
    for r in &d.rules {
        println!(
            "  {}: peers {} ports {}",
            r.source,
            r.peers.join(", "),
            r.ports.join(", ")
        );
    }
}

pub async fn run(socket: &Path, pod: &str, as_json: bool) -> Result<(), String> {
    let (namespace, name) = parse_pod(pod)?;
    let mut c = introspect(socket).await?;
    let r = c
        .policy(pb::PolicyRequest {
            namespace: namespace.clone(),
            name: name.clone(),
        })
        .await
        .map_err(status_err)?
        .into_inner();
    if as_json {
        println!(
            "{}",
            json!({
                "pod": format!("{namespace}/{name}"),
                "enforcing": r.enforcing,
                "local": r.local,
                "veth": r.veth,
                "ingress": direction_json(r.ingress.as_ref()),
                "egress": direction_json(r.egress.as_ref()),
                "problems": r.problems,
                "not_enforced": r.not_enforced,
                "warnings": r.warnings,
                "last_error": r.last_error,
            })
        );
        return Ok(());
    }
    if !r.enforcing {
        println!(
            "NetworkPolicy is not enforced by eniipamd on this node (network_policy = false, or no API server)"
        );
        return Ok(());
    }
    if !r.local {
        return Err(format!(
            "pod {namespace}/{name} has no address from eniipamd on this node (run it on the pod's node)"
        ));
    }
    println!("pod {namespace}/{name} (host veth {})", r.veth);
    print_direction("ingress", r.ingress.as_ref());
    print_direction("egress", r.egress.as_ref());
    for p in &r.problems {
        println!("problem: {p}");
    }
    for n in &r.not_enforced {
        println!("not enforced: {n}");
    }
    for w in &r.warnings {
        println!("warning: {w}");
    }
    if !r.last_error.is_empty() {
        println!(
            "the last sync failed (the kernel holds the rules before it): {}",
            r.last_error
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_named_namespace_slash_name() {
        assert_eq!(
            parse_pod("x/web-0").unwrap(),
            ("x".to_owned(), "web-0".to_owned())
        );
        assert_eq!(parse_pod("web-0").unwrap().0, "default");
        for bad in ["", "x/", "/a", "x/a/b", "X/a", "x/a b"] {
            let e = parse_pod(bad).unwrap_err();
            assert!(e.contains("<namespace>/<pod>"), "{bad:?}: {e}");
        }
    }
}
