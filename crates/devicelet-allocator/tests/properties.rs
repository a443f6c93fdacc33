//! Property tests: on random clusters and claims, every allocation the allocator returns
//! (fixed semantics) never hands out an exclusive device twice, never exceeds shared counters or
//! consumable capacity, and satisfies the selectors, taints and claim constraints.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use devicelet_allocator::CelFeatures;
use devicelet_allocator::workloads::{class, node};
use devicelet_allocator::{
    AllocateOptions, AllocatedState, Allocator, DeviceId, Features, Quantity, SelectorCache,
    Semantics,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, Counter, CounterSet, Device, DeviceAttribute,
    DeviceCapacity, DeviceClaim, DeviceConstraint, DeviceCounterConsumption, DeviceRequest,
    DeviceSelector, DeviceTaint, DeviceToleration, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

const COLORS: [&str; 3] = ["red", "blue", "green"];

#[derive(Clone, Debug)]
struct GenDevice {
    color: usize,
    units: u8,
    multi: bool,
    memory_gi: u8,
    tainted: bool,
    allocated: bool,
}

#[derive(Clone, Debug)]
struct GenPool {
    counter_units: Option<u8>,
    devices: Vec<GenDevice>,
}

#[derive(Clone, Debug)]
struct GenRequest {
    count: i64,
    color: Option<usize>,
    tolerate: bool,
    memory_gi: Option<u8>,
}

#[derive(Clone, Debug)]
struct GenClaim {
    requests: Vec<GenRequest>,
    constraint: u8, // 0 none, 1 match color, 2 distinct color
}

fn device_strategy() -> impl Strategy<Value = GenDevice> {
    (
        0..3usize,
        0..3u8,
        prop::bool::weighted(0.3),
        1..5u8,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(color, units, multi, memory_gi, tainted, allocated)| GenDevice {
                color,
                units,
                multi,
                memory_gi,
                tainted,
                allocated,
            },
        )
}

fn pool_strategy() -> impl Strategy<Value = GenPool> {
    (
        prop::option::of(1..7u8),
        prop::collection::vec(device_strategy(), 1..6),
    )
        .prop_map(|(counter_units, devices)| GenPool {
            counter_units,
            devices,
        })
}

fn claim_strategy() -> impl Strategy<Value = GenClaim> {
    let req = (
        1..3i64,
        prop::option::of(0..3usize),
        any::<bool>(),
        prop::option::of(1..3u8),
    )
        .prop_map(|(count, color, tolerate, memory_gi)| GenRequest {
            count,
            color,
            tolerate,
            memory_gi,
        });
    (prop::collection::vec(req, 1..3), 0..3u8).prop_map(|(requests, constraint)| GenClaim {
        requests,
        constraint,
    })
}

fn q(s: String) -> K8sQuantity {
    K8sQuantity(s)
}

fn build(
    pools: &[GenPool],
    claims: &[GenClaim],
) -> (Vec<ResourceSlice>, AllocatedState, Vec<ResourceClaim>) {
    let mut slices = Vec::new();
    let mut state = AllocatedState::default();
    for (pi, p) in pools.iter().enumerate() {
        let pool = format!("pool-{pi}");
        let count = if p.counter_units.is_some() { 2 } else { 1 };
        if let Some(u) = p.counter_units {
            let mut counters = BTreeMap::new();
            counters.insert(
                "units".to_string(),
                Counter {
                    value: q(u.to_string()),
                },
            );
            slices.push(ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(format!("{pool}-counters")),
                    ..Default::default()
                },
                spec: ResourceSliceSpec {
                    driver: "driver-a".into(),
                    node_name: Some("node-1".into()),
                    pool: ResourcePool {
                        name: pool.clone(),
                        generation: 1,
                        resource_slice_count: count,
                    },
                    shared_counters: Some(vec![CounterSet {
                        name: "set".into(),
                        counters,
                    }]),
                    ..Default::default()
                },
            });
        }
        let devices = p
            .devices
            .iter()
            .enumerate()
            .map(|(di, d)| {
                let mut attrs = BTreeMap::new();
                attrs.insert(
                    "color".to_string(),
                    DeviceAttribute {
                        string: Some(COLORS[d.color].into()),
                        ..Default::default()
                    },
                );
                let mut dev = Device {
                    name: format!("d{di}"),
                    attributes: Some(attrs),
                    ..Default::default()
                };
                if p.counter_units.is_some() && d.units > 0 {
                    let mut c = BTreeMap::new();
                    c.insert(
                        "units".to_string(),
                        Counter {
                            value: q(d.units.to_string()),
                        },
                    );
                    dev.consumes_counters = Some(vec![DeviceCounterConsumption {
                        counter_set: "set".into(),
                        counters: c,
                    }]);
                }
                if d.multi {
                    dev.allow_multiple_allocations = Some(true);
                    let mut cap = BTreeMap::new();
                    cap.insert(
                        "memory".to_string(),
                        DeviceCapacity {
                            value: q(format!("{}Gi", d.memory_gi)),
                            request_policy: None,
                        },
                    );
                    dev.capacity = Some(cap);
                }
                if d.tainted {
                    dev.taints = Some(vec![DeviceTaint {
                        key: "k".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]);
                }
                if d.allocated && !d.multi {
                    state.devices.insert(DeviceId {
                        driver: "driver-a".into(),
                        pool: pool.clone(),
                        device: format!("d{di}"),
                    });
                }
                dev
            })
            .collect();
        slices.push(ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{pool}-devices")),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "driver-a".into(),
                node_name: Some("node-1".into()),
                pool: ResourcePool {
                    name: pool.clone(),
                    generation: 1,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..Default::default()
            },
        });
    }
    let claims = claims
        .iter()
        .enumerate()
        .map(|(ci, c)| ResourceClaim {
            metadata: ObjectMeta { name: Some(format!("claim-{ci}")), ..Default::default() },
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(
                        c.requests
                            .iter()
                            .enumerate()
                            .map(|(ri, r)| DeviceRequest {
                                name: format!("r{ri}"),
                                exactly: Some(ExactDeviceRequest {
                                    device_class_name: "class-a".into(),
                                    allocation_mode: Some("ExactCount".into()),
                                    count: Some(r.count),
                                    selectors: r.color.map(|col| {
                                        vec![DeviceSelector {
                                            cel: Some(CELDeviceSelector {
                                                expression: format!("device.attributes[\"driver-a\"].color == \"{}\"", COLORS[col]),
                                            }),
                                        }]
                                    }),
                                    tolerations: r.tolerate.then(|| {
                                        vec![DeviceToleration { key: Some("k".into()), operator: Some("Exists".into()), ..Default::default() }]
                                    }),
                                    capacity: r.memory_gi.map(|m| CapacityRequirements {
                                        requests: Some([("memory".to_string(), q(format!("{m}Gi")))].into_iter().collect()),
                                    }),
                                    ..Default::default()
                                }),
                                first_available: None,
                            })
                            .collect(),
                    ),
                    constraints: match c.constraint {
                        1 => Some(vec![DeviceConstraint { match_attribute: Some("driver-a/color".into()), ..Default::default() }]),
                        2 => Some(vec![DeviceConstraint { distinct_attribute: Some("driver-a/color".into()), ..Default::default() }]),
                        _ => None,
                    },
                    config: None,
                }),
            },
            status: None,
        })
        .collect();
    (slices, state, claims)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn allocations_respect_exclusivity_counters_capacity_selectors_and_constraints(
        pools in prop::collection::vec(pool_strategy(), 1..4),
        claims in prop::collection::vec(claim_strategy(), 1..3),
    ) {
        let (slices, state, claims) = build(&pools, &claims);
        let classes = vec![class("class-a", &["device.driver == \"driver-a\""])];
        let cache = Arc::new(SelectorCache::new(CelFeatures { enable_consumable_capacity: true, enable_list_type_attributes: false }));
        let allocator = Allocator::new(Features::kubernetes_1_36_defaults(), Semantics::Fixed, &state, &classes, &slices, cache);
        let refs: Vec<&ResourceClaim> = claims.iter().collect();
        let n = node("node-1");
        let result = allocator.allocate(&n, &refs, &AllocateOptions::default());
        let results = match result {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
        };
        // Determinism: a second call gives the same devices.
        let again = allocator.allocate(&n, &refs, &AllocateOptions::default()).unwrap().unwrap();
        let names = |r: &Vec<k8s_openapi::api::resource::v1::AllocationResult>| -> Vec<String> {
            r.iter().flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten())).map(|d| format!("{}/{}", d.pool, d.device)).collect()
        };
        prop_assert_eq!(names(&results), names(&again));

        let gen_dev = |pool: &str, dev: &str| -> (usize, GenDevice) {
            let pi: usize = pool.trim_start_matches("pool-").parse().unwrap();
            let di: usize = dev.trim_start_matches('d').parse().unwrap();
            (pi, pools[pi].devices[di].clone())
        };
        let mut exclusive = HashSet::new();
        let mut used_multi: HashSet<(usize, String)> = HashSet::new();
        let mut memory: HashMap<(usize, String), i128> = HashMap::new();
        for (ci, r) in results.iter().enumerate() {
            let devs = r.devices.as_ref().unwrap().results.as_ref().unwrap();
            let want: i64 = claims[ci].spec.devices.as_ref().unwrap().requests.as_ref().unwrap().iter().map(|q| q.exactly.as_ref().unwrap().count.unwrap()).sum();
            prop_assert_eq!(devs.len() as i64, want);
            let mut colors = Vec::new();
            for d in devs {
                let (pi, g) = gen_dev(&d.pool, &d.device);
                let ri: usize = d.request.trim_start_matches('r').parse().unwrap();
                let req = &claims[ci].spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[ri];
                let tolerate = req.exactly.as_ref().unwrap().tolerations.is_some();
                if g.multi {
                    prop_assert!(d.share_id.is_some());
                    used_multi.insert((pi, d.device.clone()));
                    let m = d.consumed_capacity.as_ref().unwrap()["memory"].0.clone();
                    *memory.entry((pi, d.device.clone())).or_insert(0) += Quantity::parse(&m).unwrap().nanos();
                } else {
                    prop_assert!(exclusive.insert((pi, d.device.clone())), "exclusive device {}/{} given twice", d.pool, d.device);
                    prop_assert!(!g.allocated, "device {}/{} is already allocated", d.pool, d.device);
                }
                if let Some(sel) = req.exactly.as_ref().unwrap().selectors.as_ref() {
                    let expr = &sel[0].cel.as_ref().unwrap().expression;
                    prop_assert!(expr.contains(&format!("\"{}\"", COLORS[g.color])), "selector {expr} violated");
                }
                prop_assert!(!g.tainted || tolerate, "untolerated taint on {}/{}", d.pool, d.device);
                colors.push(g.color);
            }
            match claims[ci].spec.devices.as_ref().unwrap().constraints.as_ref().map(|c| c[0].match_attribute.is_some()) {
                Some(true) => prop_assert!(colors.windows(2).all(|w| w[0] == w[1]), "matchAttribute violated: {colors:?}"),
                Some(false) => {
                    let set: HashSet<_> = colors.iter().collect();
                    prop_assert_eq!(set.len(), colors.len(), "distinctAttribute violated: {:?}", colors);
                }
                None => {}
            }
        }
        for ((pi, dev), used) in &memory {
            let di: usize = dev.trim_start_matches('d').parse().unwrap();
            let cap = i128::from(pools[*pi].devices[di].memory_gi) << 30;
            prop_assert!(*used <= cap * 1_000_000_000, "capacity of {dev} exceeded");
        }
        for (pi, p) in pools.iter().enumerate() {
            let Some(units) = p.counter_units else { continue };
            let (mut committed, mut new) = (0u32, 0u32);
            for (di, d) in p.devices.iter().enumerate() {
                let name = format!("d{di}");
                if d.allocated && !d.multi {
                    committed += u32::from(d.units);
                } else if exclusive.contains(&(pi, name.clone())) || used_multi.contains(&(pi, name)) {
                    new += u32::from(d.units);
                }
            }
            if new > 0 {
                prop_assert!(committed + new <= u32::from(units), "pool-{} counters exceeded: {} + {} > {}", pi, committed, new, units);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// The §7 fixes only change outcomes where a bug can trigger: without shared counters and
    /// without distinctAttribute constraints, fixed and Go-compatible semantics agree exactly.
    #[test]
    fn fixed_and_go_compat_agree_when_no_bug_can_trigger(
        pools in prop::collection::vec(pool_strategy(), 1..4),
        claims in prop::collection::vec(claim_strategy(), 1..3),
    ) {
        let pools: Vec<GenPool> = pools.into_iter().map(|p| GenPool { counter_units: None, ..p }).collect();
        let claims: Vec<GenClaim> = claims
            .into_iter()
            .map(|c| GenClaim { constraint: if c.constraint == 2 { 0 } else { c.constraint }, ..c })
            .collect();
        let (slices, state, claims) = build(&pools, &claims);
        let classes = vec![class("class-a", &["device.driver == \"driver-a\""])];
        let refs: Vec<&ResourceClaim> = claims.iter().collect();
        let n = node("node-1");
        let run = |semantics| {
            let cache = Arc::new(SelectorCache::new(CelFeatures { enable_consumable_capacity: true, enable_list_type_attributes: false }));
            let allocator = Allocator::new(Features::kubernetes_1_36_defaults(), semantics, &state, &classes, &slices, cache);
            let r = allocator.allocate(&n, &refs, &AllocateOptions::default());
            let steps = allocator.stats().allocate_one_invocations;
            (r.map(|o| o.map(|v| v.iter().flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten())).map(|d| format!("{}/{}/{}", d.request, d.pool, d.device)).collect::<Vec<_>>())), steps)
        };
        prop_assert_eq!(run(Semantics::Fixed), run(Semantics::GoCompat));
    }
}
