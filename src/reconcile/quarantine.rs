//! The reasons the startup rebuild ([`super::rebuild`]) quarantines an IP, which the running
//! reconcile ([`super::decide`]) reads to know which quarantines it may lift: here, beside both, so
//! neither imports the other for them.

/// Why an IP is quarantined at startup.
pub const QUARANTINE_NO_EVIDENCE: &str = "the state file was lost and the plugin's result cache is \
    not visible: no way to tell whether a pod holds this IP";

/// Why an IP is quarantined at startup when the file was lost but the plugin's cache is visible: the
/// IP is on an ENI of ours in EC2's describe and no live pod claims it, but EC2's describes lag its
/// changes (eventually consistent) and no journal says what the node changed last, so it may be one
/// given back moments before the restart, which EC2 may hand to another node. The running reconcile
/// lifts it once a describe sent a minute later still shows it.
pub const QUARANTINE_UNSETTLED: &str = "the state file was lost and EC2's describe may lag the \
    node's last changes: held until a describe a minute later still shows it on its ENI";
