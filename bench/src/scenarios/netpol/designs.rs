//! The least an nftables design of NetworkPolicy can cost a new connection (issue 47: bound every
//! design, not only eniipam's). Each design is a table cut to what it needs for the two bench
//! pods alone: one-element peer sets, no counters, no logs, no other pod. What a packet meets in
//! it is the floor for that shape of table, whatever its rules' generator:
//!
//! - `raw source check`: eniipam's shape. A pod's source is checked at prerouting, priority raw
//!   (before conntrack, so a spoofed packet neither makes nor touches a connection entry); the
//!   forward chain accepts established flows, then dispatches new ones by verdict map to the
//!   pods' chains;
//! - `source check in forward`: the same check moved after conntrack, into the forward chain ahead
//!   of the established accept: one hook fewer, but a spoofed packet can refresh or close another
//!   pod's connection entry before it is dropped (Calico and Cilium check before conntrack too);
//! - `no source check`: forward judging alone, which issue 47's case 2 showed a pod can bypass by
//!   sending as an allowed peer.

/// One design: its name, and its table for the two bench pods.
pub struct Design {
    pub name: &'static str,
    pub script: String,
}

/// The designs, for the client and server pods' veths and addresses.
pub fn designs(
    client: (&str, std::net::Ipv4Addr),
    server: (&str, std::net::Ipv4Addr),
) -> Vec<Design> {
    let ((cv, ci), (sv, si)) = (client, server);
    let sets = format!(
        r#"  set pod_sources {{ type ifname . ipv4_addr; elements = {{ "{cv}" . {ci}, "{sv}" . {si} }}; }}
  set pod_veths {{ type ifname; elements = {{ "{cv}", "{sv}" }}; }}
  set hairpin {{ type ifname . ifname; elements = {{ "{cv}" . "{cv}", "{sv}" . "{sv}" }}; }}
  set peers {{ type ipv4_addr; elements = {{ {ci}, {si} }}; }}
  map egress_dispatch {{ type ifname : verdict; }}
  map ingress_dispatch {{ type ifname : verdict; }}
  chain eg_client {{
    ip daddr @peers return
    drop
  }}
  chain in_server {{
    ip saddr @peers return
    drop
  }}
"#
    );
    let judge = "    ct state established,related accept
    iifname . oifname @hairpin accept
    iifname vmap @egress_dispatch
    oifname vmap @ingress_dispatch
";
    let forward = "    type filter hook forward priority 0; policy accept;\n";
    let elements = format!(
        r#"add element inet bench_design egress_dispatch {{ "{cv}" : jump eg_client }}
add element inet bench_design ingress_dispatch {{ "{sv}" : jump in_server }}
"#
    );
    let table =
        |chains: String| format!("table inet bench_design {{\n{sets}{chains}}}\n{elements}");
    vec![
        Design {
            name: "raw source check",
            script: table(format!(
                "  chain prerouting {{
    type filter hook prerouting priority -300; policy accept;
    iifname . ip saddr @pod_sources accept
    iifname != @pod_veths accept
    drop
  }}
  chain forward {{
{forward}{judge}  }}
"
            )),
        },
        Design {
            name: "source check in forward",
            script: table(format!(
                "  chain forward {{
{forward}    iifname . ip saddr @pod_sources goto judge
    iifname @pod_veths drop
    goto judge
  }}
  chain judge {{
{judge}  }}
"
            )),
        },
        Design {
            name: "no source check",
            script: table(format!("  chain forward {{\n{forward}{judge}  }}\n")),
        },
    ]
}

// Not measured here: a source check outside netfilter, at each pod veth's tc ingress (before the
// IP stack, so before conntrack). The lab kernel has no `gact` action (`CONFIG_NET_ACT_GACT` is not
// set), so a `u32` match cannot drop, and a direct-action eBPF program needs a BPF toolchain the
// project does not carry.
