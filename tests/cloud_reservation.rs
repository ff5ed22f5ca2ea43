//! `Cloud::create_subnet_prefix_reservation` on `Ec2Cloud` against mockcloud with the real SDK:
//! EC2's refusals come back typed (overlap, addresses in use, a missing permission, a throttle),
//! and a create whose reply was lost after it landed is its own success, not an overlap with itself.

mod cloud_support;

use std::time::Duration;

use eniipam::cloud::{
    Cloud, CloudError, PrefixReservation, ReserveError, tags, without_throttle_retries,
};
use ipnet::Ipv4Net;
use mockcloud::Fault;
use mockcloud::world::ReservationType;

use cloud_support::*;

const CREATE: &str = "CreateSubnetCidrReservation";

fn req(env: &Env, cidr: &str) -> PrefixReservation {
    PrefixReservation {
        subnet_id: env.instance.subnet_id.clone(),
        cidr: cidr.parse().unwrap(),
        description: "eniipam: test".into(),
        tags: tag_map(&[(tags::OWNER, tags::OWNER_VALUE), (tags::CLUSTER, CLUSTER)]),
    }
}

/// A /26 of the default /20 clear of the instance's primary address (mockcloud picks it at random).
fn clear_block(env: &Env) -> String {
    ["10.0.15.0/26", "10.0.13.0/26"]
        .into_iter()
        .find(|b| {
            !b.parse::<Ipv4Net>()
                .unwrap()
                .contains(&env.instance.private_ip)
        })
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_reservation_is_made_tagged_and_refusals_are_typed() {
    let env = Env::start().await;
    let block = clear_block(&env);
    let made = env
        .cloud
        .create_subnet_prefix_reservation(&req(&env, &block))
        .await
        .unwrap();
    assert_eq!(made.to_string(), block);
    let seen = env
        .cloud
        .subnet_prefix_reservations(&env.instance.subnet_id)
        .await
        .unwrap();
    assert_eq!(seen, [made]);
    let views = env.mock.with_world(|w, _| {
        w.get_subnet_cidr_reservations(&env.instance.subnet_id, &[])
            .unwrap()
    });
    assert_eq!(views[0].reservation_type, ReservationType::Prefix);
    assert_eq!(views[0].tags[tags::CLUSTER], CLUSTER);
    assert_eq!(views[0].description, "eniipam: test");

    let inside = Ipv4Net::new(made.network(), 28).unwrap();
    let e = env
        .cloud
        .create_subnet_prefix_reservation(&req(&env, &inside.to_string()))
        .await
        .unwrap_err();
    assert!(matches!(e, ReserveError::Overlaps { .. }), "{e}");
    let primary = Ipv4Net::new(env.instance.private_ip, 28).unwrap().trunc();
    let e = env
        .cloud
        .create_subnet_prefix_reservation(&req(&env, &primary.to_string()))
        .await
        .unwrap_err();
    assert!(matches!(e, ReserveError::AddressesInUse { .. }), "{e}");

    env.mock
        .inject_fault(Fault::error(CREATE, "RequestLimitExceeded", 1));
    let e = without_throttle_retries(
        env.cloud
            .create_subnet_prefix_reservation(&req(&env, "10.0.14.0/26")),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, ReserveError::Cloud(c) if c.is_throttle()),
        "{e}"
    );

    env.mock.deny(CREATE, true);
    let e = env
        .cloud
        .create_subnet_prefix_reservation(&req(&env, "10.0.14.0/26"))
        .await
        .unwrap_err();
    match e {
        ReserveError::Cloud(CloudError::Unauthorized { permission, .. }) => {
            assert_eq!(permission, "ec2:CreateSubnetCidrReservation")
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn a_lost_reply_of_a_create_that_landed_is_its_success() {
    let env = Env::start().await;
    let block = clear_block(&env);
    // The create is performed, its reply held past the client's 500 ms timeout.
    env.mock
        .inject_fault(Fault::slow_reply(CREATE, Duration::from_secs(2), 1));
    let made = env
        .cloud
        .create_subnet_prefix_reservation(&req(&env, &block))
        .await
        .unwrap();
    assert_eq!(made.to_string(), block);
    let seen = env
        .cloud
        .subnet_prefix_reservations(&env.instance.subnet_id)
        .await
        .unwrap();
    assert_eq!(seen, [made], "one reservation, not two");
}
