//! The fake daemon's IPv6 side: the node's family, its `/80`, and the IPv6 addresses it hands out,
//! kept as strings so a test can make it answer a malformed or out-of-prefix address.

use std::collections::{HashMap, VecDeque};

/// What the fake daemon answers for IPv6 (`family` empty: an IPv4-only daemon, as before).
#[derive(Debug, Default)]
pub struct FakeV6 {
    /// `ip_family` of every AllocateReply ("", "ipv4", "ipv6", "dual" or anything a test wants).
    pub family: String,
    /// `ipv6_prefix` of every AllocateReply.
    pub prefix: String,
    /// IPv6 addresses not handed out yet, in order (the same one twice hands it to two attachments,
    /// as after a lost DEL).
    pub free: VecDeque<String>,
    /// (container_id, ifname) → IPv6.
    pub held: HashMap<(String, String), String>,
    /// IPv4 egress addresses not handed out yet (`egress_ipv4` of an IPv6-only AllocateReply;
    /// empty: none, as with `ipv4_egress` off), strings so a test can make it answer a bad one.
    pub egress_free: VecDeque<String>,
    /// (container_id, ifname) → egress address.
    pub egress_held: HashMap<(String, String), String>,
}

impl FakeV6 {
    /// Whether AllocateReply carries an IPv4.
    pub fn has_v4(&self) -> bool {
        self.family != "ipv6"
    }

    /// Whether AllocateReply carries an IPv6.
    pub fn has_v6(&self) -> bool {
        self.family == "ipv6" || self.family == "dual"
    }

    /// The attachment's IPv6, taken from `free` on its first allocation.
    pub fn allocate(&mut self, key: &(String, String)) -> Result<String, tonic::Status> {
        if let Some(ip) = self.held.get(key) {
            return Ok(ip.clone());
        }
        let ip = self
            .free
            .pop_front()
            .ok_or_else(|| tonic::Status::resource_exhausted("the /80 has no free addresses"))?;
        self.held.insert(key.clone(), ip.clone());
        Ok(ip)
    }

    /// The attachment's egress address (IPv6-only with addresses in `egress_free`), empty if none.
    pub fn egress(&mut self, key: &(String, String)) -> String {
        if let Some(ip) = self.egress_held.get(key) {
            return ip.clone();
        }
        match self.egress_free.pop_front() {
            Some(ip) => {
                self.egress_held.insert(key.clone(), ip.clone());
                ip
            }
            None => String::new(),
        }
    }

    /// Releases the attachment's IPv6: (released address, whether `cleaning` is held by another).
    pub fn release(&mut self, key: &(String, String), cleaning: &str) -> (String, bool) {
        let released = self.held.remove(key).unwrap_or_default();
        self.egress_held.remove(key);
        let held_by_other = !cleaning.is_empty() && self.held.values().any(|ip| ip == cleaning);
        (released, held_by_other)
    }
}
