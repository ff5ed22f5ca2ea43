"""boto3's view of mockcloud: prefixes, subnet CIDR reservations, subnet filters, network cards,
instance types, IPv6 (the subnet's /64, Assign/UnassignIpv6Addresses, the ENI's IPv6 fields) and
AssociateVpcCidrBlock (a secondary IPv4 block and EC2's refusals), with the field names and error codes as botocore parses them.

Run by mocks/tests/boto3.rs, which starts mockcloud, prepares the world and passes it in the
environment (MOCK_EC2, VPC_ID, SUBNET_ID, SUBNET_CIDR, TAGGED_SUBNET, TINY_SUBNET, XEN_ENI,
MULTI_INSTANCE, IAM_ACCESS_KEY, IAM_ENI). Exits non-zero if any check fails.
"""

import ipaddress
import os
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENV = os.environ
ec2 = boto3.client(
    "ec2",
    endpoint_url=ENV["MOCK_EC2"],
    region_name="us-east-1",
    aws_access_key_id="AKIDMOCKCLOUD",
    aws_secret_access_key="secret",
    config=Config(retries={"max_attempts": 1}),
)

passed = 0
failed = []


def check(what, condition):
    global passed
    if condition:
        passed += 1
    else:
        failed.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def error_of(call, **kwargs):
    """The (code, message) EC2 answered, or None if the call succeeded."""
    try:
        call(**kwargs)
    except ClientError as e:
        return e.response["Error"]["Code"], e.response["Error"]["Message"]
    return None


def code_of(call, **kwargs):
    err = error_of(call, **kwargs)
    return err and err[0]


def is_aligned_28(cidr):
    net = ipaddress.ip_network(cidr, strict=False)
    return net.prefixlen == 28 and str(net) == cidr


# --- instance types -------------------------------------------------------------------------------
types = {
    t["InstanceType"]: t
    for t in ec2.describe_instance_types(
        InstanceTypes=["m5.large", "t2.medium", "p5.48xlarge", "m5.metal"]
    )["InstanceTypes"]
}
check("four types", len(types) == 4)
m5 = types["m5.large"]
check("m5.large Hypervisor", m5.get("Hypervisor") == "nitro")
check("m5.large BareMetal", m5.get("BareMetal") is False)
check("m5.large VCpuInfo", m5["VCpuInfo"]["DefaultVCpus"] == 2)
net = m5["NetworkInfo"]
check("m5.large MaximumNetworkInterfaces", net["MaximumNetworkInterfaces"] == 3)
check("m5.large Ipv4AddressesPerInterface", net["Ipv4AddressesPerInterface"] == 10)
check("m5.large MaximumNetworkCards", net["MaximumNetworkCards"] == 1)
check("m5.large DefaultNetworkCardIndex", net["DefaultNetworkCardIndex"] == 0)
check(
    "m5.large NetworkCards",
    net["NetworkCards"] == [{"NetworkCardIndex": 0, "MaximumNetworkInterfaces": 3}],
)
check("t2.medium Hypervisor", types["t2.medium"].get("Hypervisor") == "xen")
check("m5.metal has no Hypervisor", "Hypervisor" not in types["m5.metal"])
check("m5.metal BareMetal", types["m5.metal"]["BareMetal"] is True)
p5 = types["p5.48xlarge"]["NetworkInfo"]
check("p5 cards", p5["MaximumNetworkCards"] == 32 and len(p5["NetworkCards"]) == 32)
default_card = next(
    c for c in p5["NetworkCards"] if c["NetworkCardIndex"] == p5["DefaultNetworkCardIndex"]
)
check(
    "p5 max-pods from the default card",
    default_card["MaximumNetworkInterfaces"] * (p5["Ipv4AddressesPerInterface"] - 1) + 2 == 100,
)
check(
    "unknown type",
    code_of(ec2.describe_instance_types, InstanceTypes=["x9.mega"]) == "InvalidInstanceType",
)

# --- prefixes -------------------------------------------------------------------------------------
subnet = ENV["SUBNET_ID"]
subnet_cidr = ipaddress.ip_network(ENV["SUBNET_CIDR"])
created = ec2.create_network_interface(SubnetId=subnet, Ipv4PrefixCount=2)["NetworkInterface"]
eni = created["NetworkInterfaceId"]
first = [p["Ipv4Prefix"] for p in created["Ipv4Prefixes"]]
check("create: two prefixes", len(first) == 2)
check("create: aligned /28s", all(is_aligned_28(p) for p in first))
check(
    "create: inside the subnet",
    all(ipaddress.ip_network(p).subnet_of(subnet_cidr) for p in first),
)
assigned = ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=1)
new = [p["Ipv4Prefix"] for p in assigned["AssignedIpv4Prefixes"]]
check("assign: AssignedIpv4Prefixes", len(new) == 1 and is_aligned_28(new[0]))
described = ec2.describe_network_interfaces(NetworkInterfaceIds=[eni])["NetworkInterfaces"][0]
check(
    "describe: Ipv4Prefixes",
    [p["Ipv4Prefix"] for p in described["Ipv4Prefixes"]] == first + new,
)
ec2.unassign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4Prefixes=[first[0]])
described = ec2.describe_network_interfaces(NetworkInterfaceIds=[eni])["NetworkInterfaces"][0]
check("unassign: one fewer", len(described["Ipv4Prefixes"]) == 2)
check(
    "count and list",
    code_of(
        ec2.assign_private_ip_addresses,
        NetworkInterfaceId=eni,
        Ipv4PrefixCount=1,
        Ipv4Prefixes=[first[0]],
    )
    == "InvalidParameterCombination",
)
check(
    "prefix and private IP",
    code_of(
        ec2.assign_private_ip_addresses,
        NetworkInterfaceId=eni,
        Ipv4PrefixCount=1,
        SecondaryPrivateIpAddressCount=1,
    )
    == "InvalidParameterCombination",
)
misaligned = str(ipaddress.ip_network(first[0]).network_address + 3) + "/28"
check(
    "misaligned",
    code_of(
        ec2.assign_private_ip_addresses, NetworkInterfaceId=eni, Ipv4Prefixes=[misaligned]
    )
    == "InvalidParameterValue",
)
check(
    "its own prefix again",
    code_of(ec2.assign_private_ip_addresses, NetworkInterfaceId=eni, Ipv4Prefixes=[new[0]])
    == "InvalidParameterValue",
)
other = ec2.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"]
check(
    "someone else's prefix",
    code_of(ec2.assign_private_ip_addresses, NetworkInterfaceId=other, Ipv4Prefixes=[new[0]])
    == "InvalidIPAddress.InUse",
)
check(
    "non-Nitro",
    code_of(
        ec2.assign_private_ip_addresses, NetworkInterfaceId=ENV["XEN_ENI"], Ipv4PrefixCount=1
    )
    == "UnsupportedOperation",
)
tiny_eni = ec2.create_network_interface(SubnetId=ENV["TINY_SUBNET"])["NetworkInterface"][
    "NetworkInterfaceId"
]
err = error_of(ec2.assign_private_ip_addresses, NetworkInterfaceId=tiny_eni, Ipv4PrefixCount=1)
check(
    "InsufficientCidrBlocks",
    err
    == (
        "InsufficientCidrBlocks",
        "The specified subnet does not have enough free cidr blocks to satisfy the request.",
    ),
)

# --- subnet CIDR reservations ---------------------------------------------------------------------
free_block = next(
    b
    for b in list(subnet_cidr.subnets(new_prefix=24))[8:]
    if not any(
        ipaddress.ip_network(p["Ipv4Prefix"]).overlaps(b)
        for e in ec2.describe_network_interfaces()["NetworkInterfaces"]
        for p in e.get("Ipv4Prefixes", [])
    )
    and not any(
        ipaddress.ip_address(a["PrivateIpAddress"]) in b
        for e in ec2.describe_network_interfaces()["NetworkInterfaces"]
        for a in e["PrivateIpAddresses"]
    )
)
res = ec2.create_subnet_cidr_reservation(
    SubnetId=subnet, Cidr=str(free_block), ReservationType="prefix", Description="pods"
)["SubnetCidrReservation"]
check("reservation id", res["SubnetCidrReservationId"].startswith("scr-"))
check("reservation fields", (res["Cidr"], res["ReservationType"]) == (str(free_block), "prefix"))
check("reservation description", res.get("Description") == "pods")
got = ec2.get_subnet_cidr_reservations(
    SubnetId=subnet, Filters=[{"Name": "reservationType", "Values": ["prefix"]}]
)
check(
    "get reservations",
    [r["Cidr"] for r in got["SubnetIpv4CidrReservations"]] == [str(free_block)],
)
auto = ec2.assign_private_ip_addresses(NetworkInterfaceId=eni, Ipv4PrefixCount=1)
check(
    "automatic prefix from the prefix reservation",
    ipaddress.ip_network(auto["AssignedIpv4Prefixes"][0]["Ipv4Prefix"]).subnet_of(free_block),
)
check(
    "reservation overlapping another",
    code_of(
        ec2.create_subnet_cidr_reservation,
        SubnetId=subnet,
        Cidr=str(next(free_block.subnets(new_prefix=28))),
        ReservationType="explicit",
    )
    == "InvalidParameterValue",
)
deleted = ec2.delete_subnet_cidr_reservation(
    SubnetCidrReservationId=res["SubnetCidrReservationId"]
)
check("deleted", deleted["DeletedSubnetCidrReservation"]["Cidr"] == str(free_block))
check(
    "delete again",
    code_of(
        ec2.delete_subnet_cidr_reservation, SubnetCidrReservationId=res["SubnetCidrReservationId"]
    )
    == "InvalidSubnetCidrReservationID.NotFound",
)

# --- subnets --------------------------------------------------------------------------------------
tagged = ENV["TAGGED_SUBNET"]
ec2.create_tags(Resources=[tagged], Tags=[{"Key": "team", "Value": "net"}])
found = ec2.describe_subnets(
    Filters=[
        {"Name": "vpc-id", "Values": [ENV["VPC_ID"]]},
        {"Name": "availability-zone", "Values": ["us-east-1b"]},
        {"Name": "tag:kubernetes.io/role/cni", "Values": ["1"]},
    ]
)["Subnets"]
check("filters find the tagged subnet", [s["SubnetId"] for s in found] == [tagged])
tags = {t["Key"]: t["Value"] for t in found[0]["Tags"]}
check("subnet tags", tags == {"kubernetes.io/role/cni": "1", "team": "net"})
check("AvailableIpAddressCount", found[0]["AvailableIpAddressCount"] == 251)
mine = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]
held = sum(
    len(e["PrivateIpAddresses"]) + 16 * len(e.get("Ipv4Prefixes", []))
    for e in ec2.describe_network_interfaces(Filters=[{"Name": "subnet-id", "Values": [subnet]}])[
        "NetworkInterfaces"
    ]
)
check(
    "AvailableIpAddressCount is true",
    mine["AvailableIpAddressCount"] == subnet_cidr.num_addresses - 5 - held,
)
check(
    "unknown filter",
    code_of(ec2.describe_subnets, Filters=[{"Name": "moon", "Values": ["x"]}])
    == "InvalidParameterValue",
)

# --- network cards --------------------------------------------------------------------------------
card_eni = ec2.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"]
att = ec2.attach_network_interface(
    NetworkInterfaceId=card_eni,
    InstanceId=ENV["MULTI_INSTANCE"],
    DeviceIndex=0,
    NetworkCardIndex=1,
)
check("attach NetworkCardIndex", att.get("NetworkCardIndex") == 1)
shown = ec2.describe_network_interfaces(NetworkInterfaceIds=[card_eni])["NetworkInterfaces"][0]
check("attachment NetworkCardIndex", shown["Attachment"]["NetworkCardIndex"] == 1)
spare = ec2.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"]
check(
    "card out of range",
    code_of(
        ec2.attach_network_interface,
        NetworkInterfaceId=spare,
        InstanceId=ENV["MULTI_INSTANCE"],
        DeviceIndex=1,
        NetworkCardIndex=2,
    )
    == "InvalidParameterValue",
)

# --- IAM ------------------------------------------------------------------------------------------
# A caller (its own access key) under the shipped policy: deleting eth0 is not allowed.
denied = boto3.client(
    "ec2",
    endpoint_url=ENV["MOCK_EC2"],
    region_name="us-east-1",
    aws_access_key_id=ENV["IAM_ACCESS_KEY"],
    aws_secret_access_key="secret",
    config=Config(retries={"max_attempts": 1}),
)
try:
    denied.delete_network_interface(NetworkInterfaceId=ENV["IAM_ENI"])
    check("IAM: delete eth0 denied", False)
except ClientError as e:
    err = e.response["Error"]
    check("IAM: UnauthorizedOperation code", err["Code"] == "UnauthorizedOperation")
    check("IAM: HTTP 403", e.response["ResponseMetadata"]["HTTPStatusCode"] == 403)
    check(
        "IAM: EC2's message",
        err["Message"].startswith(
            "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/"
        )
        and f"ec2:DeleteNetworkInterface on resource: arn:aws:ec2:us-east-1:123456789012:network-interface/{ENV['IAM_ENI']}"
        in err["Message"]
        and "Encoded authorization failure message: " in err["Message"],
    )
check("IAM: the default caller is not restricted", denied is not ec2 and code_of(ec2.describe_subnets) is None)

# --- IPv6 -----------------------------------------------------------------------------------------
v6 = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]
assoc = v6.get("Ipv6CidrBlockAssociationSet", [])
check("subnet: one IPv6 association", len(assoc) == 1)
block = ipaddress.ip_network(assoc[0]["Ipv6CidrBlock"])
check("subnet: a /64", block.prefixlen == 64)
check("subnet: associated", assoc[0]["Ipv6CidrBlockState"]["State"] == "associated")
check("subnet: AssignIpv6AddressOnCreation false", v6["AssignIpv6AddressOnCreation"] is False)
v6_eni = ec2.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"]
got = ec2.assign_ipv6_addresses(NetworkInterfaceId=v6_eni, Ipv6AddressCount=2)
addrs = got.get("AssignedIpv6Addresses", [])
check("assign: two addresses of the /64", len(addrs) == 2 and all(ipaddress.ip_address(a) in block for a in addrs))
check("assign: NetworkInterfaceId", got.get("NetworkInterfaceId") == v6_eni)
got = ec2.assign_ipv6_addresses(NetworkInterfaceId=v6_eni, Ipv6PrefixCount=1)
pfx = got.get("AssignedIpv6Prefixes", [])
check(
    "assign: one /80 of the /64",
    len(pfx) == 1 and ipaddress.ip_network(pfx[0]).prefixlen == 80 and ipaddress.ip_network(pfx[0]).subnet_of(block),
)
shown = ec2.describe_network_interfaces(NetworkInterfaceIds=[v6_eni])["NetworkInterfaces"][0]
check("describe: Ipv6Addresses", [a["Ipv6Address"] for a in shown.get("Ipv6Addresses", [])] == addrs)
check("describe: Ipv6Prefixes", [p["Ipv6Prefix"] for p in shown.get("Ipv6Prefixes", [])] == pfx)
found = ec2.describe_network_interfaces(
    Filters=[{"Name": "ipv6-addresses.ipv6-address", "Values": [addrs[1]]}]
)["NetworkInterfaces"]
check("describe: ipv6-addresses.ipv6-address filter", [e["NetworkInterfaceId"] for e in found] == [v6_eni])
gone = ec2.unassign_ipv6_addresses(NetworkInterfaceId=v6_eni, Ipv6Addresses=[addrs[0]], Ipv6Prefixes=pfx)
check("unassign: UnassignedIpv6Addresses", gone.get("UnassignedIpv6Addresses") == [addrs[0]])
check("unassign: UnassignedIpv6Prefixes", gone.get("UnassignedIpv6Prefixes") == pfx)
check(
    "unassign: not held",
    code_of(ec2.unassign_ipv6_addresses, NetworkInterfaceId=v6_eni, Ipv6Addresses=[addrs[0]])
    == "InvalidParameterValue",
)
check(
    "assign: in use",
    code_of(
        ec2.assign_ipv6_addresses,
        NetworkInterfaceId=ec2.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"],
        Ipv6Addresses=[addrs[1]],
    )
    == "InvalidIPAddress.InUse",
)
check(
    "assign: count with list",
    code_of(ec2.assign_ipv6_addresses, NetworkInterfaceId=v6_eni, Ipv6AddressCount=1, Ipv6Addresses=[addrs[0]])
    == "InvalidParameterCombination",
)

# --- secondary VPC CIDR blocks (AssociateVpcCidrBlock) ---------------------------------------------
assoc = ec2.associate_vpc_cidr_block(VpcId=ENV["VPC_ID"], CidrBlock="100.64.0.0/16")
block = assoc.get("CidrBlockAssociation", {})
check("associate: VpcId", assoc.get("VpcId") == ENV["VPC_ID"])
check("associate: CidrBlock", block.get("CidrBlock") == "100.64.0.0/16")
check("associate: AssociationId", block.get("AssociationId", "").startswith("vpc-cidr-assoc-"))
check("associate: CidrBlockState", block.get("CidrBlockState", {}).get("State") == "associated")
check(
    "associate: restricted range",
    code_of(ec2.associate_vpc_cidr_block, VpcId=ENV["VPC_ID"], CidrBlock="172.16.0.0/16")
    == "InvalidVpc.Range",
)
check(
    "associate: overlap",
    code_of(ec2.associate_vpc_cidr_block, VpcId=ENV["VPC_ID"], CidrBlock="100.64.4.0/24")
    == "InvalidVpc.Range",
)
check(
    "associate: unknown VPC",
    code_of(ec2.associate_vpc_cidr_block, VpcId="vpc-0123456789abcdef0", CidrBlock="100.65.0.0/16")
    == "InvalidVpcID.NotFound",
)

# --- security groups ------------------------------------------------------------------------------
vpc = ENV["VPC_ID"]
default = ec2.describe_security_groups(
    Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}]
)["SecurityGroups"]
check("sg: the VPC's default group", len(default) == 1 and default[0]["GroupName"] == "default")
check(
    "sg: default lets its members in",
    default[0]["IpPermissions"][0]["IpProtocol"] == "-1"
    and default[0]["IpPermissions"][0]["UserIdGroupPairs"][0]["GroupId"] == default[0]["GroupId"],
)
made = ec2.create_security_group(
    VpcId=vpc,
    GroupName="boto3-db",
    Description="db tier",
    TagSpecifications=[{"ResourceType": "security-group", "Tags": [{"Key": "team", "Value": "db"}]}],
)
db = made["GroupId"]
check("sg: create answers GroupId and tags", db.startswith("sg-") and made.get("Tags") == [{"Key": "team", "Value": "db"}])
app = ec2.create_security_group(VpcId=vpc, GroupName="boto3-app", Description="app tier")["GroupId"]
ec2.authorize_security_group_ingress(
    GroupId=db,
    IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 5432, "ToPort": 5432, "UserIdGroupPairs": [{"GroupId": app}]},
        {"IpProtocol": "tcp", "FromPort": 5432, "ToPort": 5432, "IpRanges": [{"CidrIp": "10.0.9.0/24"}]},
    ],
)
ec2.authorize_security_group_ingress(GroupId=db, IpProtocol="udp", FromPort=53, ToPort=53, CidrIp="10.0.0.0/16")
shown = ec2.describe_security_groups(GroupIds=[db])["SecurityGroups"][0]
tcp = [p for p in shown["IpPermissions"] if p["IpProtocol"] == "tcp"][0]
check("sg: rules grouped by protocol and ports", tcp["FromPort"] == 5432 and tcp["ToPort"] == 5432)
check("sg: group pair", [g["GroupId"] for g in tcp["UserIdGroupPairs"]] == [app])
check("sg: ip range", [r["CidrIp"] for r in tcp["IpRanges"]] == ["10.0.9.0/24"])
check("sg: the flat CidrIp form", any(p["IpProtocol"] == "udp" and p["FromPort"] == 53 for p in shown["IpPermissions"]))
check("sg: new group egress all", shown["IpPermissionsEgress"][0]["IpRanges"][0]["CidrIp"] == "0.0.0.0/0")
check(
    "sg: duplicate rule",
    code_of(ec2.authorize_security_group_ingress, GroupId=db, IpProtocol="udp", FromPort=53, ToPort=53, CidrIp="10.0.0.0/16")
    == "InvalidPermission.Duplicate",
)
ec2.revoke_security_group_ingress(GroupId=db, IpProtocol="udp", FromPort=53, ToPort=53, CidrIp="10.0.0.0/16")
check(
    "sg: revoke a missing rule",
    code_of(ec2.revoke_security_group_ingress, GroupId=db, IpProtocol="udp", FromPort=53, ToPort=53, CidrIp="10.0.0.0/16")
    == "InvalidPermission.NotFound",
)
ec2.revoke_security_group_egress(
    GroupId=app,
    IpPermissions=[{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}], "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}],
)
ec2.authorize_security_group_egress(
    GroupId=app, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 5432, "ToPort": 5432, "UserIdGroupPairs": [{"GroupId": db}]}]
)
out = ec2.describe_security_groups(GroupIds=[app])["SecurityGroups"][0]["IpPermissionsEgress"]
check("sg: egress replaced", [(p["IpProtocol"], p["FromPort"]) for p in out] == [("tcp", 5432)])
check("sg: duplicate name", code_of(ec2.create_security_group, VpcId=vpc, GroupName="boto3-db", Description="x") == "InvalidGroup.Duplicate")
check("sg: unknown id", code_of(ec2.describe_security_groups, GroupIds=["sg-0123456789abcdef0"]) == "InvalidGroup.NotFound")
check("sg: malformed id", code_of(ec2.describe_security_groups, GroupIds=["sg-zz"]) == "InvalidGroupId.Malformed")
check(
    "sg: ids with MaxResults",
    code_of(ec2.describe_security_groups, GroupIds=[db], MaxResults=5) == "InvalidParameterCombination",
)
page = ec2.describe_security_groups(MaxResults=5)
check("sg: a page of at most 5", len(page["SecurityGroups"]) <= 5)
pages = ec2.get_paginator("describe_security_groups").paginate(PaginationConfig={"PageSize": 5})
names = [g["GroupName"] for p in pages for g in p["SecurityGroups"]]
check("sg: the paginator sees every group", {"default", "boto3-db", "boto3-app"} <= set(names))

print(f"boto3 view: {passed} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
