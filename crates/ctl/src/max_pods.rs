//! `eniipamctl max-pods`: what kubelet's `maxPods` should be on an eniipam node of one instance type,
//! next to the AWS VPC CNI's figure, plus a nodeadm `maxPodsExpression` for a whole node group.

use clap::{Args, ValueEnum};
use eniipam_limits::{AddressMode, EniLimits};
use serde_json::json;

#[derive(Args, Debug)]
pub struct MaxPodsArgs {
    /// The EC2 instance type, e.g. m5.large.
    #[arg(long)]
    instance_type: String,
    /// Pods get addresses from /28 prefixes (16 addresses per slot) instead of secondary IPs.
    #[arg(long)]
    prefix_delegation: bool,
    /// For a type not in eniipam's table: MaximumNetworkInterfaces of its default network card.
    #[arg(long, requires = "ips_per_eni")]
    enis: Option<u32>,
    /// For a type not in eniipam's table: Ipv4AddressesPerInterface.
    #[arg(long, requires = "enis")]
    ips_per_eni: Option<u32>,
    /// For a type not in eniipam's table: its vCPUs (the prefix-delegation cap, and the IPv6
    /// answer, depend on them).
    #[arg(long)]
    vcpus: Option<u32>,
    /// The daemon's `ip_family`: with ipv6 pods take addresses from the node's /80, so addresses
    /// are no limit and the answer is Kubernetes' cap; dual is bound by its IPv4 like ipv4.
    #[arg(long, value_enum, default_value_t = Family::Ipv4)]
    ip_family: Family,
    /// The daemon's `custom_networking` (the node's ENIConfig names the pod subnet): eth0 serves no
    /// pods, so the node has one ENI fewer for them (the VPC CNI's custom-networking figure too).
    #[arg(long)]
    custom_networking: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Family {
    Ipv4,
    Ipv6,
    Dual,
}

impl Family {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Dual => "dual",
        }
    }
}

pub fn run(a: &MaxPodsArgs, as_json: bool) -> Result<(), String> {
    if a.ip_family == Family::Ipv6 {
        if a.custom_networking {
            return Err(
                "--custom-networking applies to IPv4 pods' ENIs: with --ip-family ipv6 pods \
                        take their addresses from eth0's /80 (use ipv4 or dual)"
                    .to_owned(),
            );
        }
        return run_ipv6(a, as_json);
    }
    let (mut limits, source) = resolve(a)?;
    let enis_total = limits.enis;
    if a.custom_networking {
        if limits.enis < 2 {
            return Err(format!(
                "{} has {} ENI: with custom networking eth0 serves no pods, so no ENI is left for them",
                a.instance_type, limits.enis
            ));
        }
        limits.enis -= 1;
    }
    let mode = if a.prefix_delegation {
        AddressMode::Prefixes
    } else {
        AddressMode::SecondaryIps
    };
    let pod_ips = eniipam_limits::eniipam_pod_ips(&limits, mode);
    let eniipam = eniipam_limits::eniipam_max_pods(&limits, mode);
    let vpc_cni = eniipam_limits::vpc_cni_max_pods(&limits, mode);
    let cap = eniipam_limits::prefix_delegation_cap(limits.vcpus);
    let mut expression = eniipam_limits::nodeadm_max_pods_expression(mode, cap);
    if a.custom_networking {
        expression = expression.replace("default_enis", "(default_enis - 1)");
    }
    if as_json {
        println!(
            "{}",
            json!({
                "instance_type": a.instance_type,
                "source": source,
                "ip_family": a.ip_family.as_str(),
                "mode": mode,
                "custom_networking": a.custom_networking,
                "enis": enis_total,
                "pod_enis": limits.enis,
                "ips_per_eni": limits.ipv4_per_eni,
                "vcpus": limits.vcpus,
                "pod_ips": pod_ips,
                "max_pods": eniipam,
                "vpc_cni_max_pods": vpc_cni,
                "nodeadm_max_pods_expression": expression,
            })
        );
        return Ok(());
    }
    let per_slot = match mode {
        AddressMode::SecondaryIps => "",
        AddressMode::Prefixes => " × 16",
    };
    println!("{eniipam}");
    eprintln!(
        "{} ({source}): {} ENIs × {} IPv4 addresses, {} vCPUs, {}",
        a.instance_type,
        limits.enis,
        limits.ipv4_per_eni,
        limits.vcpus,
        match mode {
            AddressMode::SecondaryIps => "secondary IPs",
            AddressMode::Prefixes => "prefix delegation",
        }
    );
    eprintln!(
        "  eniipam:     {} × ({} − 1){per_slot} = {pod_ips} pod IPs ({}) + 2 host-network pods{}",
        limits.enis,
        limits.ipv4_per_eni,
        if a.custom_networking {
            "custom networking: eth0 serves none"
        } else {
            "eth0's included"
        },
        if eniipam < pod_ips + eniipam_limits::HOST_NETWORK_PODS {
            format!(
                ", capped at {cap} (Kubernetes' limit EKS applies above 30 vCPUs: 250, else 110)"
            )
        } else {
            String::new()
        }
    );
    eprintln!("  AWS VPC CNI: {vpc_cni}");
    eprintln!("  nodeadm:     maxPodsExpression: \"{expression}\"");
    Ok(())
}

/// `--ip-family ipv6`: a pod's address comes from the node's /80 (2^48 addresses, one EC2 call in the
/// node's life), so neither ENIs nor secondary IPs bound the node: the answer is the Kubernetes cap EKS
/// applies to IPv6 nodes (110, or 250 above 30 vCPUs), as the VPC CNI's IPv6 mode uses too. Only the
/// vCPUs matter, so a type not in the table needs `--vcpus` alone.
fn run_ipv6(a: &MaxPodsArgs, as_json: bool) -> Result<(), String> {
    let (vcpus, source) = match (a.vcpus, eniipam_limits::lookup(&a.instance_type)) {
        (Some(v), _) => (v, "figures from the command line"),
        (None, Some(t)) => (t.vcpus, "eniipam's instance-type table"),
        (None, None) => {
            return Err(format!(
                "{:?} is not in eniipam's table of {} instance types: pass --vcpus (with --ip-family \
                 ipv6 only the vCPUs matter: aws ec2 describe-instance-types --instance-types {} \
                 --query 'InstanceTypes[].VCpuInfo.DefaultVCpus')",
                a.instance_type,
                eniipam_limits::CATALOG.len(),
                a.instance_type
            ));
        }
    };
    if vcpus == 0 {
        return Err("--vcpus must be at least 1".to_owned());
    }
    let cap = eniipam_limits::prefix_delegation_cap(vcpus);
    // The VPC CNI's IPv6 nodes get the AMI's prefix-delegation figure, which does count ENIs: known
    // when the limits are (the table or the flags).
    let vpc_cni = resolve(a)
        .ok()
        .map(|(l, _)| eniipam_limits::vpc_cni_max_pods(&l, AddressMode::Prefixes));
    if as_json {
        println!(
            "{}",
            json!({
                "instance_type": a.instance_type,
                "source": source,
                "ip_family": "ipv6",
                "vcpus": vcpus,
                "max_pods": cap,
                "vpc_cni_max_pods": vpc_cni,
                "nodeadm_max_pods_expression": cap.to_string(),
            })
        );
        return Ok(());
    }
    println!("{cap}");
    eprintln!(
        "{} ({source}): {vcpus} vCPUs, IPv6 pods from the node's /80",
        a.instance_type
    );
    eprintln!(
        "  eniipam:     addresses are no limit: Kubernetes' cap EKS applies ({}: 250 above 30 vCPUs, else 110)",
        cap
    );
    match vpc_cni {
        Some(n) => {
            eprintln!("  AWS VPC CNI: {n} (the prefix-delegation figure its IPv6 nodes get)")
        }
        None => eprintln!("  AWS VPC CNI: unknown (pass --enis and --ips-per-eni)"),
    }
    eprintln!("  nodeadm:     maxPodsExpression: \"{cap}\"");
    Ok(())
}

/// The limits from the table, or from the flags for a type it lacks (flags win when both are given).
fn resolve(a: &MaxPodsArgs) -> Result<(EniLimits, &'static str), String> {
    let known = eniipam_limits::lookup(&a.instance_type);
    match (a.enis, a.ips_per_eni, known) {
        (Some(enis), Some(ips), k) => {
            let vcpus = a.vcpus.or(k.map(|t| t.vcpus)).ok_or_else(|| {
                format!(
                    "{} is not in eniipam's table: pass --vcpus too",
                    a.instance_type
                )
            })?;
            EniLimits::new(enis, ips, vcpus)
                .map(|l| (l, "figures from the command line"))
                .map_err(|e| e.to_string())
        }
        (_, _, Some(t)) => Ok((t.eni_limits(), "eniipam's instance-type table")),
        (_, _, None) => Err(format!(
            "{:?} is not in eniipam's table of {} instance types: pass --enis, --ips-per-eni and --vcpus \
             (aws ec2 describe-instance-types --instance-types {} --query \
             'InstanceTypes[].[NetworkInfo.NetworkCards[?NetworkCardIndex==`0`].MaximumNetworkInterfaces|[0], \
             NetworkInfo.Ipv4AddressesPerInterface, VCpuInfo.DefaultVCpus]')",
            a.instance_type,
            eniipam_limits::CATALOG.len(),
            a.instance_type
        )),
    }
}
