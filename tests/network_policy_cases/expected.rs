//! Each shared case's expected matrices, stage by stage, on the six (protocol, port) pairs.

use std::collections::BTreeMap;

use eniipam::network_policy::Protocol;

use super::{BAD, PODS, Reach, SCTP, TCP, UDP, egress_ns_denied, from_ns};

/// The six (protocol, port) pairs of upstream's full matrix.
pub(super) const PAIRS: [(Protocol, u16); 6] = [
    (TCP, 80),
    (TCP, 81),
    (UDP, 80),
    (UDP, 81),
    (SCTP, 80),
    (SCTP, 81),
];

/// One stage's expected matrices, one per (protocol, port) pair.
pub(super) struct Matrices(pub(super) BTreeMap<(Protocol, u16), Reach>);

/// `want` on every pair.
fn each(want: Reach) -> Matrices {
    Matrices(PAIRS.iter().map(|pair| (*pair, want.clone())).collect())
}

impl Matrices {
    /// `want` on `protocol`/`port`.
    fn on(mut self, protocol: Protocol, port: u16, want: Reach) -> Self {
        self.0.insert((protocol, port), want);
        self
    }
    /// `want` on both ports of `protocol`.
    fn on_protocol(self, protocol: Protocol, want: Reach) -> Self {
        self.on(protocol, 80, want.clone()).on(protocol, 81, want)
    }
}

/// What each stage of each shared case ([`netpol_cases::cases`]) must give, in order: the full
/// matrix (9 × 9 pods) on each of the six (protocol, port) pairs.
pub(super) fn expected(name: &str) -> Vec<Matrices> {
    let all = Reach::allowed;
    // x/a takes nothing, or only namespace y, or only x/b.
    let nobody = || all().ingress("x/a", false);
    let only_y = || from_ns(nobody(), "y", "x/a");
    let only_xb = || nobody().set("x/b", "x/a", true);
    // x/a sends nothing; x's pods take nothing; x's pods send nothing.
    let mute = || all().egress("x/a", false);
    let x_closed = || all().ingress_ns("x", false);
    let x_mute = || egress_ns_denied(all(), "x");
    let deny_all = || egress_ns_denied(x_closed(), "x");
    let around_xb = || all().set("x/a", "x/b", false);
    match name {
        "should support a 'default-deny-ingress' policy" => vec![each(x_closed())],
        "should support a 'default-deny-all' policy" => vec![each(deny_all())],
        "should enforce policy to allow traffic from pods within server namespace based on PodSelector"
        | "should enforce policy based on PodSelector with MatchExpressions" => {
            vec![each(only_xb())]
        }
        // x is closed, but x/a takes every pod of every namespace.
        "should enforce policy to allow ingress traffic for a target" => {
            vec![each(all().ingress("x/b", false).ingress("x/c", false))]
        }
        "should enforce policy to allow ingress traffic from pods in all namespaces"
        | "should support allow-all policy" => vec![each(all())],
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector"
        | "should enforce policy based on NamespaceSelector with MatchExpressions"
        | "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label" =>
        {
            vec![each(only_y())]
        }
        // Any pod outside x, or x/b.
        "should enforce policy based on PodSelector or NamespaceSelector" => {
            vec![each(from_ns(from_ns(only_xb(), "y", "x/a"), "z", "x/a"))]
        }
        // Pod b of the namespaces other than x (one peer, both selectors).
        "should enforce policy based on PodSelector and NamespaceSelector" => vec![each(
            nobody().set("y/b", "x/a", true).set("z/b", "x/a", true),
        )],
        "should enforce policy based on Multiple PodSelectors and NamespaceSelectors" => {
            let mut want = nobody();
            for client in ["y/b", "z/b", "y/c", "z/c"] {
                want = want.set(client, "x/a", true);
            }
            vec![each(want)]
        }
        "should enforce policy based on any PodSelectors" => {
            vec![each(only_xb().set("x/c", "x/a", true))]
        }
        "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector" =>
        {
            vec![each(nobody().set("y/a", "x/a", true))]
        }
        "should enforce policy based on Ports" => vec![each(nobody()).on(TCP, 81, only_y())],
        "using UDP: should enforce policy based on Ports" => {
            vec![each(nobody()).on(UDP, 81, only_y())]
        }
        "using SCTP: should enforce policy based on Ports" => {
            vec![each(nobody()).on(SCTP, 81, only_y())]
        }
        // 81 from y, then 80 from y too.
        "should enforce multiple, stacked policies with overlapping podSelectors" => vec![
            each(nobody()).on(TCP, 81, only_y()),
            each(nobody()).on(TCP, 81, only_y()).on(TCP, 80, only_y()),
        ],
        // Every pod of x takes TCP 81 (by name), from everyone.
        "should allow ingress access on one named port" => {
            vec![each(x_closed()).on(TCP, 81, all())]
        }
        "should allow ingress access from namespace on one named port" => {
            vec![each(nobody()).on(TCP, 80, only_y())]
        }
        // Every pod of x sends TCP 80 (by name, on each peer) only.
        "should allow egress access on one named port" => vec![each(x_mute()).on(TCP, 80, all())],
        "should enforce updated policy" => vec![each(all()), each(x_closed())],
        "should allow ingress access from updated namespace" => {
            vec![each(nobody()), each(only_y())]
        }
        "should allow ingress access from updated pod" => vec![each(nobody()), each(only_xb())],
        // x's pods take only x's pods.
        "should deny ingress from pods on other namespaces" => {
            let mut want = x_closed();
            for server in PODS {
                want = from_ns(want, "x", &format!("x/{server}"));
            }
            vec![each(want)]
        }
        "should deny ingress access to updated pod" => vec![each(all()), each(nobody())],
        "should deny egress from pods based on PodSelector" => vec![each(mute())],
        "should deny egress from all pods in a namespace" => vec![each(x_mute())],
        // x/a takes x/b only, and sends TCP 80 only.
        "should work with Ingress, Egress specified together" => {
            vec![each(only_xb().egress("x/a", false)).on(TCP, 80, only_xb())]
        }
        // x/a sends to y/a only; y/a and y/b take x/a only.
        "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)" =>
        {
            vec![each(
                mute()
                    .ingress("y/a", false)
                    .ingress("y/b", false)
                    .set("x/a", "y/a", true),
            )]
        }
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector" =>
        {
            vec![each(mute().set("x/a", "y/a", true))]
        }
        "should enforce ingress policy allowing any port traffic to a server on a specific protocol" =>
        {
            vec![each(nobody()).on_protocol(TCP, all())]
        }
        // TCP 80 to x's pods, then everything.
        "should enforce multiple ingress policies with ingress allow-all policy taking precedence" =>
        {
            vec![each(x_closed()).on(TCP, 80, all()), each(all())]
        }
        "should enforce multiple egress policies with egress allow-all policy taking precedence" => {
            vec![each(x_mute()).on(TCP, 80, all()), each(all())]
        }
        "should stop enforcing policies after they are deleted" => {
            vec![each(deny_all()), each(all())]
        }
        // To y/b's address by an ipBlock /32.
        "should allow egress access to server in CIDR block" => {
            vec![each(mute().set("x/a", "y/b", true))]
        }
        // To the /4 holding every pod, x/b cut out.
        "should enforce except clause while egress access to server in CIDR block" => {
            vec![each(around_xb())]
        }
        // Then the policy updated in place to x/b's /32 alone.
        "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed" => {
            vec![each(around_xb()), each(mute().set("x/a", "x/b", true))]
        }
        // x/a's egress allows all; then its ingress is denied, its egress still allowed.
        "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector" =>
        {
            vec![each(all()), each(nobody())]
        }
        // x is closed; x/a takes SCTP 81 from everyone.
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP" =>
        {
            vec![each(x_closed()).on(SCTP, 81, x_closed().ingress("x/a", true))]
        }
        "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP" =>
        {
            vec![each(nobody()).on(SCTP, 80, all())]
        }
        "should not allow access by TCP when a policy specifies only UDP" => {
            vec![each(nobody()).on(UDP, 81, all())]
        }
        // x/a sends to every namespace but y.
        "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label" =>
        {
            let mut want = all();
            for p in PODS {
                want = want.set("x/a", &format!("y/{p}"), false);
            }
            vec![each(want)]
        }
        "ours: ingress on a port range (endPort) from namespace y" => {
            vec![each(nobody()).on(TCP, 80, only_y()).on(TCP, 81, only_y())]
        }
        // x/a is isolated, and the broken rules allow nobody.
        BAD => vec![each(nobody())],
        _ => panic!("no expected matrices for the shared case {name:?}"),
    }
}
