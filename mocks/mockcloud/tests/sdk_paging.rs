//! DescribeNetworkInterfaces pages as EC2 does, through the real `aws-sdk-ec2` client: the ids or the
//! indexed filters (`vpc-id`, `subnet-id`, `mac-address`, `private-ip-address`) select what is paged
//! over, the other filters are applied to each page after, so a describe filtered by
//! `attachment.instance-id` alone walks every ENI of the region, 1,000 a page, most pages empty.

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::Filter;
use mockcloud::MockCloud;

mod support;
use support::{code, ec2, empty, filter};

/// Walks every page of a describe by `filters`, `max` a page: (pages, the ids found, empty pages;
/// every page but the last carries a `NextToken`, empty or not).
async fn walk(c: &Client, filters: &[Filter], max: i32) -> (u32, Vec<String>, u32) {
    let (mut pages, mut found, mut empty) = (0, Vec::new(), 0);
    let mut token: Option<String> = None;
    loop {
        let r = c
            .describe_network_interfaces()
            .set_filters(Some(filters.to_vec()))
            .max_results(max)
            .set_next_token(token.clone())
            .send()
            .await
            .unwrap();
        pages += 1;
        assert!(r.network_interfaces().len() <= max as usize);
        found.extend(
            r.network_interfaces()
                .iter()
                .filter_map(|e| e.network_interface_id().map(str::to_owned)),
        );
        if r.network_interfaces().is_empty() {
            empty += 1;
        }
        match r.next_token() {
            Some(t) if !t.is_empty() => {
                token = Some(t.to_owned());
            }
            _ => return (pages, found, empty),
        }
    }
}

/// A region of 3,501 ENIs: the node's eth0 alone in its own subnet of VPC A, 1,500 other ENIs in
/// another subnet of VPC A, 2,000 in VPC B.
async fn region() -> (MockCloud, String, String, String, String) {
    let mock = empty(7).await;
    let (vpc_a, _) = mock.create_vpc("10.50.0.0/16".parse().unwrap()).unwrap();
    let (vpc_b, _) = mock.create_vpc("10.60.0.0/16".parse().unwrap()).unwrap();
    let node_subnet = mock
        .create_subnet(&vpc_a, "10.50.0.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let others_a = mock
        .create_subnet(&vpc_a, "10.50.16.0/20".parse().unwrap(), "us-east-1a")
        .unwrap();
    let others_b = mock
        .create_subnet(&vpc_b, "10.60.16.0/20".parse().unwrap(), "us-east-1a")
        .unwrap();
    let node = mock
        .launch_instance("m5.large", &node_subnet)
        .await
        .unwrap();
    assert_eq!(
        mock.create_enis_directly(&others_a, 1500).unwrap().len(),
        1500
    );
    assert_eq!(
        mock.create_enis_directly(&others_b, 2000).unwrap().len(),
        2000
    );
    (mock, vpc_a, node_subnet, node.instance_id, node.primary_eni)
}

#[tokio::test]
async fn an_instance_filter_alone_walks_the_region_and_vpc_or_ids_narrow_it() {
    let (mock, vpc_a, node_subnet, instance, eth0) = region().await;
    let c = ec2(&mock);
    let calls = || mock.counters().calls("DescribeNetworkInterfaces");
    let by_instance = filter("attachment.instance-id", &instance);

    // attachment.instance-id alone: every ENI of the region is paged over (4 pages of 1,000 for
    // 3,501), the filter applied within each: the one match on one page, the others empty.
    let before = calls();
    let (pages, found, empty_pages) = walk(&c, std::slice::from_ref(&by_instance), 1000).await;
    assert_eq!((pages, found.clone()), (4, vec![eth0.clone()]));
    assert_eq!(
        empty_pages, 3,
        "three pages hold none of the instance's ENIs"
    );
    assert_eq!(calls() - before, 4, "each page is a call");

    // With vpc-id: VPC A's 1,501 ENIs only, 2 pages.
    let (pages, found, _) = walk(&c, &[by_instance.clone(), filter("vpc-id", &vpc_a)], 1000).await;
    assert_eq!((pages, found), (2, vec![eth0.clone()]));
    // With the node's subnet: one page.
    let (pages, found, _) = walk(
        &c,
        &[by_instance.clone(), filter("subnet-id", &node_subnet)],
        1000,
    )
    .await;
    assert_eq!((pages, found), (1, vec![eth0.clone()]));
    // A smaller page walks more of them: 1,501 at 100 a page is 16 pages.
    let (pages, _, _) = walk(&c, &[by_instance.clone(), filter("vpc-id", &vpc_a)], 100).await;
    assert_eq!(pages, 16);

    // network-interface-id as a filter is not one EC2 documents as narrowing: applied per page.
    let (pages, found, _) = walk(&c, &[filter("network-interface-id", &eth0)], 1000).await;
    assert_eq!((pages, found), (4, vec![eth0.clone()]));

    // By ids (NetworkInterfaceId.N), with the instance filter: one unpaginated call.
    let before = calls();
    let r = c
        .describe_network_interfaces()
        .network_interface_ids(&eth0)
        .filters(by_instance.clone())
        .filters(filter("vpc-id", &vpc_a))
        .send()
        .await
        .unwrap();
    assert_eq!(r.network_interfaces().len(), 1);
    assert_eq!(r.next_token(), None);
    assert_eq!(calls() - before, 1);
    // The ids with a filter they do not match: none, no error.
    let r = c
        .describe_network_interfaces()
        .network_interface_ids(&eth0)
        .filters(filter("attachment.instance-id", "i-0123456789abcdef0"))
        .send()
        .await
        .unwrap();
    assert!(r.network_interfaces().is_empty());
}

#[tokio::test]
async fn max_results_bounds_and_combinations_are_ec2s() {
    let (mock, vpc_a, _, _, eth0) = region().await;
    let c = ec2(&mock);
    for bad in [0, 4, 1001] {
        let e = c
            .describe_network_interfaces()
            .filters(filter("vpc-id", &vpc_a))
            .max_results(bad)
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(e), "InvalidParameterValue", "MaxResults {bad}");
    }
    let e = c
        .describe_network_interfaces()
        .network_interface_ids(&eth0)
        .max_results(5)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterCombination");
    let e = c
        .describe_network_interfaces()
        .max_results(5)
        .next_token("not-a-token")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    // The private-ip-address filter narrows too (the node's eth0 by its address): one page.
    let ip = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eth0)
        .unwrap()
        .primary_ip
        .to_string();
    let (pages, found, _) = walk(&c, &[filter("private-ip-address", &ip)], 5).await;
    assert_eq!((pages, found), (1, vec![eth0]));
    // The SDK's own paginator takes the short pages in its stride.
    let all: Vec<_> = c
        .describe_network_interfaces()
        .filters(filter("description", "another node's ENI"))
        .max_results(1000)
        .into_paginator()
        .items()
        .send()
        .collect::<Vec<_>>()
        .await;
    assert_eq!(all.len(), 3500);
}
