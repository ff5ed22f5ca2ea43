//! What the invariant checks share: a broken invariant as found ([`Found`]), the options of one
//! evaluation ([`Rules`]) and how an attachment is told ([`describe_att`]). Used by the checker
//! ([`super::checker`]) and by the IPv6 and network-profiles checks it calls ([`super::checker6`],
//! [`super::checker_profiles`]), so it lives beside them all rather than in the checker.

use std::time::Duration;

/// One broken invariant, as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub kind: &'static str,
    /// What it is about (an IP, an attachment, an ENI): with the kind, what makes it distinct.
    pub subject: String,
    pub text: String,
    /// Could be a moment between two writes of one change (pool, then store): only reported when it
    /// persists over several observations.
    pub settle: bool,
}

/// Options of one evaluation.
pub struct Rules {
    /// How long the daemon gets to notice an out-of-band change.
    pub grace: Duration,
    /// Which attachments an out-of-band change hit: those it took the IP of, and those handed an
    /// IP it took up to this long after it (the daemon cannot have known yet). The grace period,
    /// also when the end's probe ([`super::caught_up`]) judges with no grace at all.
    pub oob_window: Duration,
    pub network_names: Vec<String>,
    pub family: super::IpFamily,
    /// The network-profiles mode's subnets and groups (`None`: not that mode).
    pub profiles: Option<super::profiles::ProfileWorld>,
}

/// "live on soak-a (ADD step 12, 10.0.3.4)" and the like.
pub fn describe_att(a: &super::model::Attachment, networks: &[String]) -> String {
    let net = networks.get(a.network).map(String::as_str).unwrap_or("?");
    let mut s = format!("{} on {net}", a.state.name());
    let given: Vec<String> =
        a.ip.map(|ip| ip.to_string())
            .into_iter()
            .chain(a.ip6.map(|ip| ip.to_string()))
            .collect();
    if !given.is_empty() {
        s.push_str(&format!(
            ", ADD step {} gave {}",
            a.added_step,
            given.join(" + ")
        ));
    }
    if let Some(e) = a.ended_step {
        s.push_str(&format!(", ended step {e}"));
    }
    if let Some(m) = &a.oob {
        s.push_str(&format!(", IP taken out of band at step {}", m.step));
    }
    s
}
