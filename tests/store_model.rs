//! Random call sequences against a plain in-memory model: the store must answer every call as
//! the model does (success, conflict, released IP), hold exactly what the model holds, and never
//! hold an IP twice or give an attachment two IPs.

mod store_support;

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;

use eniipam::store::{Store, StoreError, StoredAssignment, StoredEni, StoredIdle, StoredState};
use proptest::prelude::*;
use store_support::{eni, eni_id, ip};

/// A small world, so that calls collide often.
const IPS: u32 = 8;
const CONTAINERS: u32 = 5;
const ENIS: u32 = 3;
const IFNAMES: [&str; 2] = ["eth0", "net1"];

#[derive(Clone, Debug)]
enum Call {
    SetInstanceId(String),
    UpsertEni(StoredEni),
    RemoveEni(u32),
    Assign(StoredAssignment),
    Release {
        container: u32,
        ifname: usize,
        since: u64,
        reservation: Option<(String, u64)>,
    },
    Idle(Vec<StoredIdle>),
    RemoveIps(Vec<Ipv4Addr>),
    ReplaceAll(StoredState),
}

fn container_id(n: u32) -> String {
    format!("c{n}")
}

fn reservation() -> impl Strategy<Value = Option<(String, u64)>> {
    proptest::option::of((0..3u32, 0..1_000u64).prop_map(|(k, t)| (format!("ns/p-{k}"), t)))
}

fn stored_eni() -> impl Strategy<Value = StoredEni> {
    (0..ENIS, "10\\.[0-9]\\.0\\.0/16").prop_map(|(n, cidr)| StoredEni {
        subnet_cidr: cidr,
        ..eni(n)
    })
}

fn assignment() -> impl Strategy<Value = StoredAssignment> {
    (
        0..IPS,
        0..ENIS,
        0..CONTAINERS,
        0..IFNAMES.len(),
        proptest::option::of("[a-z]{1,3}/[a-z]{1,3}-[0-9]"),
        0..1_000u64,
    )
        .prop_map(|(i, e, c, f, sticky_key, at)| StoredAssignment {
            ip: ip(i),
            eni_id: eni_id(e),
            network: format!("net-{}", c % 2),
            container_id: container_id(c),
            ifname: IFNAMES[f].to_owned(),
            netns: format!("/proc/{c}/ns/net"),
            pod_namespace: "ns".to_owned(),
            pod_name: format!("p-{c}"),
            pod_uid: format!("uid-{c}-{at}"),
            sticky_key,
            assigned_at_ms: at,
        })
}

fn stored_idle() -> impl Strategy<Value = StoredIdle> {
    (0..IPS, 0..ENIS, 0..1_000u64, reservation()).prop_map(|(i, e, since, reservation)| {
        StoredIdle {
            ip: ip(i),
            eni_id: eni_id(e),
            idle_since_ms: since,
            reservation,
        }
    })
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        1 => "i-[0-9a-f]{4}".prop_map(Call::SetInstanceId),
        2 => stored_eni().prop_map(Call::UpsertEni),
        1 => (0..ENIS).prop_map(Call::RemoveEni),
        6 => assignment().prop_map(Call::Assign),
        4 => (0..CONTAINERS, 0..IFNAMES.len(), 0..1_000u64, reservation()).prop_map(
            |(container, ifname, since, reservation)| Call::Release {
                container,
                ifname,
                since,
                reservation,
            }
        ),
        3 => proptest::collection::vec(stored_idle(), 0..4).prop_map(Call::Idle),
        2 => proptest::collection::vec((0..IPS).prop_map(ip), 0..3).prop_map(Call::RemoveIps),
        1 => (
            proptest::option::of("i-[0-9a-f]{4}"),
            proptest::collection::vec(stored_eni(), 0..3),
            proptest::collection::vec(assignment(), 0..4),
            proptest::collection::vec(stored_idle(), 0..4),
        )
            .prop_map(|(instance_id, enis, assignments, idle)| {
                Call::ReplaceAll(StoredState {
                    instance_id,
                    enis,
                    assignments,
                    idle,
                    quarantined: Vec::new(),
                })
            }),
    ]
}

/// One IP's row in the model.
#[derive(Clone, Debug)]
enum Row {
    Assigned(StoredAssignment),
    Idle(StoredIdle),
}

impl Row {
    fn eni_id(&self) -> &str {
        match self {
            Row::Assigned(a) => &a.eni_id,
            Row::Idle(i) => &i.eni_id,
        }
    }
}

/// What the store should hold.
#[derive(Clone, Debug, Default)]
struct Model {
    instance_id: Option<String>,
    enis: BTreeMap<String, StoredEni>,
    ips: BTreeMap<Ipv4Addr, Row>,
}

/// What a call should answer: `Err(())` for a conflict.
type Outcome = Result<Option<Ipv4Addr>, ()>;

impl Model {
    fn ip_of(&self, container_id: &str, ifname: &str) -> Option<Ipv4Addr> {
        self.ips.iter().find_map(|(ip, row)| match row {
            Row::Assigned(a) if a.container_id == container_id && a.ifname == ifname => Some(*ip),
            _ => None,
        })
    }

    fn apply(&mut self, call: &Call) -> Outcome {
        match call {
            Call::SetInstanceId(id) => self.instance_id = Some(id.clone()),
            Call::UpsertEni(e) => {
                self.enis.insert(e.eni_id.clone(), e.clone());
            }
            Call::RemoveEni(n) => {
                let id = eni_id(*n);
                self.enis.remove(&id);
                self.ips.retain(|_, row| row.eni_id() != id);
            }
            Call::Assign(a) => {
                if self
                    .ip_of(&a.container_id, &a.ifname)
                    .is_some_and(|held| held != a.ip)
                {
                    return Err(());
                }
                if let Some(Row::Assigned(other)) = self.ips.get(&a.ip)
                    && (other.container_id != a.container_id || other.ifname != a.ifname)
                {
                    return Err(());
                }
                self.ips.insert(a.ip, Row::Assigned(a.clone()));
            }
            Call::Release {
                container,
                ifname,
                since,
                reservation,
            } => {
                let Some(ip) = self.ip_of(&container_id(*container), IFNAMES[*ifname]) else {
                    return Ok(None);
                };
                let eni_id = self.ips[&ip].eni_id().to_owned();
                self.ips.insert(
                    ip,
                    Row::Idle(StoredIdle {
                        ip,
                        eni_id,
                        idle_since_ms: *since,
                        reservation: reservation.clone(),
                    }),
                );
                return Ok(Some(ip));
            }
            Call::Idle(batch) => {
                let mut seen = HashSet::new();
                for i in batch {
                    if !seen.insert(i.ip) || matches!(self.ips.get(&i.ip), Some(Row::Assigned(_))) {
                        return Err(());
                    }
                }
                for i in batch {
                    self.ips.insert(i.ip, Row::Idle(i.clone()));
                }
            }
            Call::RemoveIps(ips) => {
                for ip in ips {
                    self.ips.remove(ip);
                }
            }
            Call::ReplaceAll(state) => {
                let mut next = Model {
                    instance_id: state.instance_id.clone(),
                    ..Model::default()
                };
                let mut attachments = HashSet::new();
                for e in &state.enis {
                    if next.enis.insert(e.eni_id.clone(), e.clone()).is_some() {
                        return Err(());
                    }
                }
                for a in &state.assignments {
                    if !attachments.insert((a.container_id.clone(), a.ifname.clone()))
                        || next.ips.insert(a.ip, Row::Assigned(a.clone())).is_some()
                    {
                        return Err(());
                    }
                }
                for i in &state.idle {
                    if next.ips.insert(i.ip, Row::Idle(i.clone())).is_some() {
                        return Err(());
                    }
                }
                *self = next;
            }
        }
        Ok(None)
    }

    fn state(&self) -> StoredState {
        let mut enis: Vec<StoredEni> = self.enis.values().cloned().collect();
        enis.sort_by(|a, b| (a.device_index, &a.eni_id).cmp(&(b.device_index, &b.eni_id)));
        let mut state = StoredState {
            instance_id: self.instance_id.clone(),
            enis,
            ..StoredState::default()
        };
        for row in self.ips.values() {
            match row {
                Row::Assigned(a) => state.assignments.push(a.clone()),
                Row::Idle(i) => state.idle.push(i.clone()),
            }
        }
        state
    }
}

async fn run(store: &Store, call: &Call) -> Result<Option<Ipv4Addr>, StoreError> {
    match call.clone() {
        Call::SetInstanceId(id) => store.set_instance_id(&id).await.map(|()| None),
        Call::UpsertEni(e) => store.upsert_eni(e).await.map(|()| None),
        Call::RemoveEni(n) => store.remove_eni(&eni_id(n)).await.map(|()| None),
        Call::Assign(a) => store.record_assigned(a).await.map(|()| None),
        Call::Release {
            container,
            ifname,
            since,
            reservation,
        } => {
            store
                .record_released(
                    &container_id(container),
                    IFNAMES[ifname],
                    since,
                    reservation,
                )
                .await
        }
        Call::Idle(batch) => store.record_idle(batch).await.map(|()| None),
        Call::RemoveIps(ips) => store.remove_ips(ips).await.map(|()| None),
        Call::ReplaceAll(state) => store.replace_all(state).await.map(|()| None),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_store_behaves_like_the_model(calls in proptest::collection::vec(call(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = Store::open_in_memory().await.unwrap();
            let mut model = Model::default();
            for (n, call) in calls.iter().enumerate() {
                let expected = model.apply(call);
                let got = run(&store, call).await;
                match (&expected, &got) {
                    (Ok(want), Ok(have)) => prop_assert_eq!(want, have, "call {} {:?}", n, call),
                    (Err(()), Err(StoreError::Conflict(_))) => {}
                    _ => prop_assert!(false, "call {} {:?}: model {:?}, store {:?}", n, call, expected, got),
                }
                let loaded = store.load().await.unwrap();
                prop_assert_eq!(&loaded, &model.state(), "after call {} {:?}", n, call);

                let mut ips = HashSet::new();
                let mut attachments = HashSet::new();
                for a in &loaded.assignments {
                    prop_assert!(ips.insert(a.ip), "{} held twice", a.ip);
                    prop_assert!(attachments.insert((a.container_id.clone(), a.ifname.clone())));
                }
                for i in &loaded.idle {
                    prop_assert!(ips.insert(i.ip), "{} held twice", i.ip);
                }
            }
            store.close().await;
            Ok(())
        })?;
    }
}
