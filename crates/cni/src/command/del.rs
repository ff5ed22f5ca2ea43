//! DEL: releases the IP and tears the attachment down, from the cache when the daemon cannot answer;
//! the pod end of the veth pair goes on a thread of its own ([`PodEnd`]). DEL must succeed.

use std::net::{Ipv4Addr, Ipv6Addr};

use eniipam_api::AttachmentKey;
use eniipam_api::cache::ResultCache;
use eniipam_netlink::{Netlink, NetnsFile};

use super::daemon::{connect, release};
use super::pod::{cached_addresses, netns_to_cni};
use crate::env::RuntimeEnv;
use crate::netconf::{NetConf, Role};
use crate::spec::CniError;
use crate::wiring::{self, NetnsError, Teardown};

pub(super) async fn del(conf: &NetConf, rt: &RuntimeEnv) -> Result<(), CniError> {
    let key = rt.attachment();
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let cached = cache.read(&key).unwrap_or_else(|e| {
        tracing::warn!("DEL {key}: ignoring unreadable cache entry: {e}");
        None
    });
    let sticky = conf.sticky_key(rt.args.pod.as_ref(), &rt.args).is_some()
        || cached.as_ref().is_some_and(|c| c.sticky_key.is_some());

    // The addresses this attachment was wired with, as far as the host knows.
    let (cached_ip, cached_ipv6) = cached.as_ref().map(cached_addresses).unwrap_or_default();
    let known_ip = cached_ip.or_else(|| conf.prev_result.as_ref()?.ipv4_for(&rt.ifname));
    let known_ipv6 = cached_ipv6.or_else(|| conf.prev_result.as_ref()?.ipv6_for(&rt.ifname));

    // The pod end of the veth pair goes at once, on a thread of its own: deleting it blocks in the
    // kernel for most of a DEL (RCU grace periods while the pair unregisters), and it needs nothing
    // from the daemon. Meanwhile this thread asks the daemon to release the IP. Only the policy rules
    // wait for the daemon's answer: an IP's rules are removed only when the daemon confirms no other
    // live attachment holds it now, because a late DEL (a retried one, or one for a stale cache entry)
    // must not take away the rules of the pod the IP went to since. Without the daemon's word the
    // rules stay; the next ADD of that IP replaces them. A missing or failing daemon never stops the
    // teardown: DEL must succeed. (The daemon keeps a released IP cooling, so the order of the two
    // does not matter to the next owner.)
    let pod_end = match conf.role {
        Role::Main => Some(PodEnd::start(&key, rt.netns.clone(), rt.ifname.clone())),
        Role::Ipam => None,
    };
    // The IPv6 follows the same rule with its own flag: its stray `/128` host routes go only when
    // the daemon says no live attachment holds it.
    let (rules_ip, ip_free, ipv6, ipv6_free) = match connect(conf).await {
        Ok(mut client) => {
            match release(&mut client, conf, rt, sticky, known_ip, known_ipv6).await {
                Ok(reply) => {
                    if reply.ip_held_by_other || reply.ipv6_held_by_other {
                        tracing::info!(
                            "DEL {key}: {known_ip:?} / {known_ipv6:?} belong to another pod now \
                             (ipv4 {}, ipv6 {}); only this pod's own wiring goes",
                            reply.ip_held_by_other,
                            reply.ipv6_held_by_other
                        );
                    }
                    (
                        known_ip.or_else(|| reply.ip.parse::<Ipv4Addr>().ok()),
                        !reply.ip_held_by_other,
                        known_ipv6.or_else(|| reply.ipv6.parse::<Ipv6Addr>().ok()),
                        !reply.ipv6_held_by_other,
                    )
                }
                Err(e) => {
                    tracing::warn!("DEL {key}: release failed, tearing down from the cache: {e}");
                    (known_ip, false, known_ipv6, false)
                }
            }
        }
        Err(e) => {
            tracing::warn!("DEL {key}: tearing down from the cache: {e}");
            (known_ip, false, known_ipv6, false)
        }
    };

    if let Some(pod_end) = pod_end {
        let mut errors = pod_end.join();
        // Without the daemon's word, only this attachment's own rule (by its host veth) goes.
        match Netlink::current() {
            Ok(host) => {
                let teardown = Teardown {
                    ifname: rt.ifname.clone(),
                    ip: rules_ip,
                    ip_free,
                    ipv6,
                    ipv6_free,
                    host_veth: cached.as_ref().and_then(|c| c.host_veth.clone()),
                    created_host_veth: None,
                };
                errors.extend(wiring::unwire_host(&host, &teardown).await);
            }
            Err(e) => errors.push(e.into()),
        }
        if let Some(first) = errors.into_iter().next() {
            // Keep the cache entry so a retried DEL still knows what to remove.
            return Err(netns_to_cni(first));
        }
    }
    if let Err(e) = cache.remove(&key) {
        tracing::warn!("DEL {key}: {e}");
    }
    Ok(())
}

/// A DEL's removal of the pod end of the veth pair, running on its own thread (with its own
/// single-threaded runtime for the netlink connection inside the pod's namespace).
enum PodEnd {
    /// No namespace, or it is gone: it took the pod end, and so the whole pair, with it.
    Gone,
    Running(std::thread::JoinHandle<Vec<NetnsError>>),
    /// The thread could not be started.
    Failed(NetnsError),
}

impl PodEnd {
    /// Starts deleting `ifname` inside the namespace at `netns`.
    fn start(key: &AttachmentKey, netns: Option<String>, ifname: String) -> Self {
        let Some(path) = netns else {
            return Self::Gone;
        };
        let ns = match NetnsFile::open(&path) {
            Ok(ns) => ns,
            Err(e) => {
                tracing::info!("DEL {key}: {e}; nothing to remove inside the pod");
                return Self::Gone;
            }
        };
        let socket_error = move |reason: String| -> NetnsError {
            eniipam_netlink::Error::Socket { path, reason }.into()
        };
        let work = {
            let socket_error = socket_error.clone();
            move || -> Vec<NetnsError> {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return vec![socket_error(format!("starting a runtime: {e}"))],
                };
                runtime.block_on(async {
                    match Netlink::in_netns(&ns) {
                        Ok(pod) => wiring::unwire_pod(&pod, &ifname).await,
                        Err(e) => vec![e.into()],
                    }
                })
            }
        };
        match std::thread::Builder::new()
            .name("eniipam-pod-end".into())
            .spawn(work)
        {
            Ok(handle) => Self::Running(handle),
            Err(e) => Self::Failed(socket_error(format!("starting a thread: {e}"))),
        }
    }

    /// Waits for the deletion; its errors.
    fn join(self) -> Vec<NetnsError> {
        match self {
            Self::Gone => Vec::new(),
            Self::Failed(e) => vec![e],
            Self::Running(handle) => handle.join().unwrap_or_else(|_| {
                vec![NetnsError::Conflict(
                    "the thread removing the pod end panicked".into(),
                )]
            }),
        }
    }
}
