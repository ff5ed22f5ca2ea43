//! boto3's view stays EC2's: starts mockcloud, prepares a world (a tagged subnet in another AZ, a
//! /28 with no free /28 block, a Xen instance, a multi-card instance) and runs `boto3_view.py`,
//! which checks prefixes, reservations, subnet filters, network cards, instance types, IPv6 (the
//! subnet's /64, Assign/UnassignIpv6Addresses, the ENI's IPv6 fields and filter), AssociateVpcCidrBlock
//! (a secondary block, a restricted range, an overlap), an `UnauthorizedOperation` from IAM, and
//! security groups (create, authorize/revoke ingress and egress in both parameter forms, describe
//! with pagination, EC2's error codes) as botocore parses them. Skipped, saying so, when `python3`
//! cannot import boto3
//! (`pip install boto3==1.43.11`).

use std::collections::BTreeMap;
use std::process::Stdio;

use mockcloud::MockCloud;

mod support;

#[tokio::test]
async fn boto3_sees_ec2_s_field_names_and_error_codes() {
    let probe = tokio::process::Command::new("python3")
        .args(["-c", "import boto3"])
        .output()
        .await;
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            mockcloud::ci::skip(
                "boto3_sees_ec2_s_field_names_and_error_codes",
                &format!(
                    "python3 cannot import boto3 ({}); install it with `pip install boto3==1.43.11`",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            return;
        }
        Err(e) => {
            mockcloud::ci::skip(
                "boto3_sees_ec2_s_field_names_and_error_codes",
                &format!("no python3 ({e})"),
            );
            return;
        }
    }
    let mock: MockCloud = support::fast().await;
    let d = mock.default_world().unwrap();
    let cni: BTreeMap<String, String> =
        [("kubernetes.io/role/cni".to_owned(), "1".to_owned())].into();
    let tagged = mock
        .create_subnet_with_tags(
            &d.vpc_id,
            "10.0.16.0/24".parse().unwrap(),
            "us-east-1b",
            &cni,
        )
        .unwrap();
    let tiny = mock
        .create_subnet(&d.vpc_id, "10.0.17.0/28".parse().unwrap(), "us-east-1a")
        .unwrap();
    let xen = mock
        .launch_instance("t2.medium", &d.subnet_id)
        .await
        .unwrap();
    let multi = mock
        .launch_instance("c6in.32xlarge", &d.subnet_id)
        .await
        .unwrap();
    // One caller under the shipped policy, to read an UnauthorizedOperation as boto3 parses it.
    mock.set_iam_policy_for(
        "AKIDIAMNODE",
        Some(mockcloud::iam::shipped_policy("c1", &d.vpc_id)),
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/boto3_view.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .env("MOCK_EC2", mock.ec2_url())
        .env("VPC_ID", &d.vpc_id)
        .env("SUBNET_ID", &d.subnet_id)
        .env("SUBNET_CIDR", d.subnet_cidr.to_string())
        .env("TAGGED_SUBNET", &tagged)
        .env("TINY_SUBNET", &tiny)
        .env("XEN_ENI", &xen.primary_eni)
        .env("MULTI_INSTANCE", &multi.instance_id)
        .env("IAM_ACCESS_KEY", "AKIDIAMNODE")
        .env("IAM_ENI", &d.instance.primary_eni)
        // No proxies, credentials or config files from the machine.
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "boto3_view.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}
