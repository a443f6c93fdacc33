//! Generators for the scheduler_perf-shaped allocator workloads of spec
//! `structured-allocator.md` §4.4-§4.5 (`test/integration/scheduler_perf/dra/*`), reusable by
//! the `workloads` benchmark, by tests and by a Go comparison harness (through
//! [`Workload::to_scenario`], which yields an `AllocationScenario` the Go driver can read).
//!
//! Shapes follow `scheduler_perf/dra.go`: one slice per node (name = pool = node name, count 1,
//! generation 0) of devices `instance-<i>` with attributes `model="A100"`, `family="GPU"`,
//! `driverVersion=1.2.3`, `dra.example.com/numa=<i>` and capacity `memory=1Gi`; class
//! `test-class` selects `device.driver == "test-driver.cdi.k8s.io"`; the claim has one request
//! `req-0`, ExactCount 1.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements,
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceClaim, DeviceClass,
    DeviceClassSpec, DeviceConstraint, DeviceCounterConsumption, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::allocator::{AllocatedIndex, Allocator, ClusterSnapshot};
use crate::scenario::{AllocationScenario, CelSpec, Mode, SemanticsSpec, StateDevice};
use crate::selector::{CelFeatures, SelectorCache};
use crate::types::{AllocateOptions, AllocatedState, DeviceId, Features, Semantics};

/// The driver name used by scheduler_perf.
pub const DRIVER: &str = "test-driver.cdi.k8s.io";

/// A workload's prepared inputs: the shared snapshot and the indexed allocated state.
pub struct Prepared<'w> {
    pub snap: Arc<ClusterSnapshot<'w>>,
    pub index: Arc<AllocatedIndex>,
}

/// One benchmark workload: the cluster and the claims of one pod.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub features: Features,
    pub cel: CelFeatures,
    pub nodes: Vec<Node>,
    pub classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub allocated: AllocatedState,
    /// The claims of one pod.
    pub claims: Vec<ResourceClaim>,
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    }
}

fn q(s: &str) -> K8sQuantity {
    K8sQuantity(s.to_string())
}

/// A node named `name`.
pub fn node(name: &str) -> Node {
    Node {
        metadata: meta(name),
        ..Default::default()
    }
}

/// A device class with CEL selectors.
pub fn class(name: &str, selectors: &[&str]) -> DeviceClass {
    DeviceClass {
        metadata: meta(name),
        spec: DeviceClassSpec {
            selectors: Some(
                selectors
                    .iter()
                    .map(|e| DeviceSelector {
                        cel: Some(CELDeviceSelector {
                            expression: e.to_string(),
                        }),
                    })
                    .collect(),
            ),
            ..Default::default()
        },
    }
}

/// A claim with one ExactCount request per (name, class, count) entry.
pub fn claim(
    name: &str,
    requests: &[(&str, &str, i64)],
    constraints: Vec<DeviceConstraint>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    requests
                        .iter()
                        .map(|(n, c, k)| DeviceRequest {
                            name: n.to_string(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: c.to_string(),
                                allocation_mode: Some("ExactCount".into()),
                                count: Some(*k),
                                ..Default::default()
                            }),
                            first_available: None,
                        })
                        .collect(),
                ),
                constraints: if constraints.is_empty() {
                    None
                } else {
                    Some(constraints)
                },
                config: None,
            }),
        },
        status: None,
    }
}

/// A scheduler_perf driver device.
pub fn perf_device(i: usize) -> Device {
    let mut attrs = BTreeMap::new();
    attrs.insert(
        "model".to_string(),
        DeviceAttribute {
            string: Some("A100".into()),
            ..Default::default()
        },
    );
    attrs.insert(
        "family".to_string(),
        DeviceAttribute {
            string: Some("GPU".into()),
            ..Default::default()
        },
    );
    attrs.insert(
        "driverVersion".to_string(),
        DeviceAttribute {
            version: Some("1.2.3".into()),
            ..Default::default()
        },
    );
    attrs.insert(
        "dra.example.com/numa".to_string(),
        DeviceAttribute {
            int: Some(i as i64),
            ..Default::default()
        },
    );
    let mut cap = BTreeMap::new();
    cap.insert(
        "memory".to_string(),
        DeviceCapacity {
            value: q("1Gi"),
            request_policy: None,
        },
    );
    Device {
        name: format!("instance-{i}"),
        attributes: Some(attrs),
        capacity: Some(cap),
        ..Default::default()
    }
}

/// A node-local slice (name = pool = node name).
pub fn node_slice(node_name: &str, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: meta(node_name),
        spec: ResourceSliceSpec {
            driver: DRIVER.to_string(),
            node_name: Some(node_name.to_string()),
            pool: ResourcePool {
                name: node_name.to_string(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

impl Workload {
    /// §4.5.1 steady state: `nodes` × `devices` node-local devices, a fraction of them allocated
    /// (device index by device index across all nodes), and a pod with one single-device claim.
    pub fn steady_state(nodes: usize, devices: usize, allocated_permille: usize) -> Workload {
        Self::steady_state_with_class(
            nodes,
            devices,
            allocated_permille,
            &["device.driver == \"test-driver.cdi.k8s.io\""],
        )
    }

    /// Steady state with a custom class selector list (CEL-heavy variant).
    pub fn steady_state_with_class(
        nodes: usize,
        devices: usize,
        allocated_permille: usize,
        selectors: &[&str],
    ) -> Workload {
        let mut w = Workload {
            name: format!("steady_{nodes}x{devices}_{allocated_permille}permille"),
            features: Features::kubernetes_1_36_defaults(),
            cel: CelFeatures {
                enable_consumable_capacity: true,
                enable_list_type_attributes: false,
            },
            nodes: Vec::with_capacity(nodes),
            classes: vec![class("test-class", selectors)],
            slices: Vec::with_capacity(nodes),
            allocated: AllocatedState::default(),
            claims: vec![claim("claim-0", &[("req-0", "test-class", 1)], Vec::new())],
        };
        for n in 0..nodes {
            let name = format!("node-{n}");
            w.slices
                .push(node_slice(&name, (0..devices).map(perf_device).collect()));
            w.nodes.push(node(&name));
        }
        let to_allocate = nodes * devices * allocated_permille / 1000;
        'outer: for d in 0..devices {
            for n in 0..nodes {
                if w.allocated.devices.len() >= to_allocate {
                    break 'outer;
                }
                w.allocated.devices.insert(DeviceId {
                    driver: DRIVER.into(),
                    pool: format!("node-{n}"),
                    device: format!("instance-{d}"),
                });
            }
        }
        w
    }

    /// §4.5.6 CEL heavy: steady state (empty) with a 10-clause selector, an `exists_one` over the
    /// attributes and a regex match.
    pub fn cel_heavy(nodes: usize, devices: usize) -> Workload {
        let mut w = Self::steady_state_with_class(
            nodes,
            devices,
            0,
            &[
                "device.driver == \"test-driver.cdi.k8s.io\" && device.attributes[\"test-driver.cdi.k8s.io\"].model == \"A100\" && device.attributes[\"test-driver.cdi.k8s.io\"].family == \"GPU\" && device.attributes[\"dra.example.com\"].numa >= 0 && device.attributes[\"dra.example.com\"].numa < 1000 && device.capacity[\"test-driver.cdi.k8s.io\"].memory.compareTo(quantity(\"1Gi\")) >= 0 && \"model\" in device.attributes[\"test-driver.cdi.k8s.io\"] && device.driver.startsWith(\"test-\") && device.driver.endsWith(\".io\") && size(device.attributes) >= 1",
                "device.attributes[\"test-driver.cdi.k8s.io\"].exists_one(k, k == \"model\")",
                "device.attributes[\"test-driver.cdi.k8s.io\"].model.matches(\"^A[0-9]+$\")",
            ],
        );
        w.name = format!("cel_heavy_{nodes}x{devices}");
        w
    }

    /// §4.5.3 network-attached partitionable pools: `pools` pools visible from every node, each
    /// one counter slice (`counters` = 6 units) and one slice of 6 partitions consuming 1..=3
    /// units; the claim asks for 2 devices with a matchAttribute on `dra.example.com/slice`.
    pub fn partitionable(nodes: usize, pools: usize) -> Workload {
        let mut w = Workload {
            name: format!("partitionable_{pools}pools_{nodes}nodes"),
            features: Features::kubernetes_1_36_defaults(),
            cel: CelFeatures {
                enable_consumable_capacity: true,
                enable_list_type_attributes: false,
            },
            nodes: (0..nodes).map(|n| node(&format!("node-{n}"))).collect(),
            classes: vec![class(
                "test-class",
                &["device.driver == \"test-driver.cdi.k8s.io\""],
            )],
            slices: Vec::new(),
            allocated: AllocatedState::default(),
            claims: vec![claim(
                "claim-0",
                &[("req-0", "test-class", 2)],
                vec![DeviceConstraint {
                    match_attribute: Some("dra.example.com/slice".into()),
                    requests: None,
                    distinct_attribute: None,
                }],
            )],
        };
        for p in 0..pools {
            let pool = format!("pool-{p}");
            let mut counters = BTreeMap::new();
            counters.insert("units".to_string(), Counter { value: q("6") });
            w.slices.push(ResourceSlice {
                metadata: meta(&format!("{pool}-counters")),
                spec: ResourceSliceSpec {
                    driver: DRIVER.into(),
                    all_nodes: Some(true),
                    pool: ResourcePool {
                        name: pool.clone(),
                        generation: 0,
                        resource_slice_count: 2,
                    },
                    shared_counters: Some(vec![CounterSet {
                        name: "set".into(),
                        counters,
                    }]),
                    ..Default::default()
                },
            });
            let devices = (0..6)
                .map(|i| {
                    let mut d = perf_device(i);
                    if let Some(a) = d.attributes.as_mut() {
                        a.insert(
                            "dra.example.com/slice".into(),
                            DeviceAttribute {
                                int: Some((i / 3) as i64),
                                ..Default::default()
                            },
                        );
                    }
                    let mut c = BTreeMap::new();
                    c.insert(
                        "units".to_string(),
                        Counter {
                            value: q(&format!("{}", 1 + i % 3)),
                        },
                    );
                    d.consumes_counters = Some(vec![DeviceCounterConsumption {
                        counter_set: "set".into(),
                        counters: c,
                    }]);
                    d
                })
                .collect();
            w.slices.push(ResourceSlice {
                metadata: meta(&format!("{pool}-devices")),
                spec: ResourceSliceSpec {
                    driver: DRIVER.into(),
                    all_nodes: Some(true),
                    pool: ResourcePool {
                        name: pool.clone(),
                        generation: 0,
                        resource_slice_count: 2,
                    },
                    devices: Some(devices),
                    ..Default::default()
                },
            });
        }
        w
    }

    /// §4.5.4 PartitionableBacktracking: one pool of 8 devices, each with its own cpu counter and
    /// memory (20Gi for device-1, 10Gi for the rest) from 70Gi; the pod asks for `count` devices
    /// (7 needs a backtrack).
    pub fn backtracking(count: i64) -> Workload {
        let mut counters = BTreeMap::new();
        counters.insert("memory".to_string(), Counter { value: q("70Gi") });
        for i in 0..8 {
            counters.insert(format!("cpu-{i}"), Counter { value: q("1") });
        }
        let devices = (0..8)
            .map(|i| {
                let mut c = BTreeMap::new();
                c.insert(
                    "memory".to_string(),
                    Counter {
                        value: q(if i == 0 { "20Gi" } else { "10Gi" }),
                    },
                );
                c.insert(format!("cpu-{i}"), Counter { value: q("1") });
                Device {
                    name: format!("device-{}", i + 1),
                    consumes_counters: Some(vec![DeviceCounterConsumption {
                        counter_set: "set".into(),
                        counters: c,
                    }]),
                    ..Default::default()
                }
            })
            .collect();
        let slice = |name: &str, spec: ResourceSliceSpec| ResourceSlice {
            metadata: meta(name),
            spec,
        };
        Workload {
            name: format!("backtracking_count{count}"),
            features: Features::kubernetes_1_36_defaults(),
            cel: CelFeatures {
                enable_consumable_capacity: true,
                enable_list_type_attributes: false,
            },
            nodes: vec![node("node-0")],
            classes: vec![class(
                "test-class",
                &["device.driver == \"test-driver.cdi.k8s.io\""],
            )],
            slices: vec![
                slice(
                    "counters",
                    ResourceSliceSpec {
                        driver: DRIVER.into(),
                        node_name: Some("node-0".into()),
                        pool: ResourcePool {
                            name: "pool".into(),
                            generation: 0,
                            resource_slice_count: 2,
                        },
                        shared_counters: Some(vec![CounterSet {
                            name: "set".into(),
                            counters,
                        }]),
                        ..Default::default()
                    },
                ),
                slice(
                    "devices",
                    ResourceSliceSpec {
                        driver: DRIVER.into(),
                        node_name: Some("node-0".into()),
                        pool: ResourcePool {
                            name: "pool".into(),
                            generation: 0,
                            resource_slice_count: 2,
                        },
                        devices: Some(devices),
                        ..Default::default()
                    },
                ),
            ],
            allocated: AllocatedState::default(),
            claims: vec![claim(
                "claim-0",
                &[("req-0", "test-class", count)],
                Vec::new(),
            )],
        }
    }

    /// §4.5.5 consumable capacity (scheduler_perf ConsumableCapacity): `nodes` nodes with 20
    /// driver devices each (not selected by the class) plus `shareable` network devices
    /// (allNodes, memory 80Gi, policy default 1Gi, min 1Gi) in slices of at most 128; the pod
    /// asks for two requests of 40Gi each.
    pub fn consumable(nodes: usize, shareable: usize) -> Workload {
        const NET: &str = "network.example.com";
        let mut w = Workload {
            name: format!("consumable_{shareable}devices_{nodes}nodes"),
            features: Features::kubernetes_1_36_defaults(),
            cel: CelFeatures {
                enable_consumable_capacity: true,
                enable_list_type_attributes: false,
            },
            nodes: Vec::with_capacity(nodes),
            classes: vec![class(
                "network-class",
                &["device.driver == \"network.example.com\""],
            )],
            slices: Vec::new(),
            allocated: AllocatedState::default(),
            claims: Vec::new(),
        };
        for n in 0..nodes {
            let name = format!("node-{n}");
            w.slices
                .push(node_slice(&name, (0..20).map(perf_device).collect()));
            w.nodes.push(node(&name));
        }
        let nics: Vec<Device> = (0..shareable)
            .map(|i| {
                let mut cap = BTreeMap::new();
                cap.insert(
                    "memory".to_string(),
                    DeviceCapacity {
                        value: q("80Gi"),
                        request_policy: Some(CapacityRequestPolicy {
                            default: Some(q("1Gi")),
                            valid_range: Some(CapacityRequestPolicyRange {
                                min: q("1Gi"),
                                ..Default::default()
                            }),
                            valid_values: None,
                        }),
                    },
                );
                Device {
                    name: format!("nic-{i}"),
                    allow_multiple_allocations: Some(true),
                    capacity: Some(cap),
                    ..Default::default()
                }
            })
            .collect();
        let parts = nics.len().div_ceil(128);
        for (part, chunk) in nics.chunks(128).enumerate() {
            w.slices.push(ResourceSlice {
                metadata: meta(&format!("network-{part}")),
                spec: ResourceSliceSpec {
                    driver: NET.into(),
                    all_nodes: Some(true),
                    pool: ResourcePool {
                        name: "network".into(),
                        generation: 0,
                        resource_slice_count: parts as i64,
                    },
                    devices: Some(chunk.to_vec()),
                    ..Default::default()
                },
            });
        }
        let mut c = claim(
            "claim-0",
            &[("req-0", "network-class", 1), ("req-1", "network-class", 1)],
            Vec::new(),
        );
        for r in c
            .spec
            .devices
            .iter_mut()
            .flat_map(|d| d.requests.iter_mut().flatten())
        {
            if let Some(e) = r.exactly.as_mut() {
                let mut req = BTreeMap::new();
                req.insert("memory".to_string(), q("40Gi"));
                e.capacity = Some(CapacityRequirements {
                    requests: Some(req),
                });
            }
        }
        w.claims.push(c);
        w
    }

    /// A fresh selector cache for this workload's CEL environment.
    pub fn selector_cache(&self) -> Arc<SelectorCache> {
        Arc::new(SelectorCache::new(self.cel))
    }

    /// The prepared snapshot of this workload's classes and slices (built once, shared by the
    /// allocators of all pods, like the scheduler's informer caches).
    pub fn snapshot(&self) -> Arc<ClusterSnapshot<'_>> {
        Arc::new(ClusterSnapshot::new(
            &self.classes,
            &self.slices,
            self.selector_cache(),
        ))
    }

    /// The snapshot plus the indexed allocated state, built once per workload (the Go harness
    /// likewise prepares its lister, slices and state once).
    pub fn prepare(&self) -> Prepared<'_> {
        let snap = self.snapshot();
        let index = Arc::new(AllocatedIndex::new(&snap, &self.allocated));
        Prepared { snap, index }
    }

    /// One pod's scheduling work: a new allocator (PreFilter) and one allocation call per node
    /// (Filter). Returns the number of nodes that fit.
    pub fn schedule_pod_all_nodes<'w>(&'w self, prepared: &Prepared<'w>) -> usize {
        let allocator = Allocator::with_index(
            Arc::clone(&prepared.snap),
            self.features,
            Semantics::GoCompat,
            Arc::clone(&prepared.index),
        );
        let claims: Vec<&ResourceClaim> = self.claims.iter().collect();
        let opts = AllocateOptions::default();
        self.nodes
            .iter()
            .filter(|n| matches!(allocator.allocate(n, &claims, &opts), Ok(Some(_))))
            .count()
    }

    /// The claims of the fill-up pods: copies of the workload's claim named `claim-<p>`.
    pub fn fill_up_claims(&self, pods: usize) -> Vec<ResourceClaim> {
        (0..pods)
            .map(|p| {
                let mut c = self.claims[0].clone();
                c.metadata.name = Some(format!("claim-{p}"));
                c
            })
            .collect()
    }

    /// §4.5.2 fill-up: schedules one single-claim pod per claim, one after the other, each on
    /// the first node (in order) that fits, committing its results to a copy of the allocated
    /// state; returns how many pods were placed. Nodes found full are not tried again
    /// (allocations only grow, so they stay full). Same loop as the Go harness's `FillUp`.
    pub fn fill_up<'w>(&'w self, claims: &'w [ResourceClaim], prepared: &Prepared<'w>) -> usize {
        let opts = AllocateOptions::default();
        let mut index = Arc::clone(&prepared.index);
        let mut placed = 0;
        let mut start_node = 0;
        for c in claims {
            let allocator = Allocator::with_index(
                Arc::clone(&prepared.snap),
                self.features,
                Semantics::GoCompat,
                Arc::clone(&index),
            );
            let mut chosen = None;
            let mut ni = start_node;
            while ni < self.nodes.len() {
                if let Ok(Some(results)) = allocator.allocate(&self.nodes[ni], &[c], &opts) {
                    chosen = Some(results);
                    break;
                }
                ni += 1;
                start_node = ni;
            }
            drop(allocator);
            let Some(results) = chosen else { break };
            // The first commit copies the shared index; later ones update it in place.
            let index = Arc::make_mut(&mut index);
            for r in results
                .iter()
                .flat_map(|r| r.devices.iter().flat_map(|d| d.results.iter().flatten()))
            {
                let _ = index.add_result(&prepared.snap, r, self.features.consumable_capacity);
            }
            placed += 1;
        }
        placed
    }

    /// The workload as an `AllocationScenario` (mode `allocate`, Go-compatible semantics), for a
    /// side-by-side Go harness.
    pub fn to_scenario(&self) -> AllocationScenario {
        let mut s = AllocationScenario {
            name: self.name.clone(),
            semantics: SemanticsSpec {
                variant: "incubating".into(),
                compat: Some("k8s-v1.36.1".into()),
            },
            features: self.features,
            cel: Some(CelSpec {
                enable_consumable_capacity: self.cel.enable_consumable_capacity,
                enable_list_type_attributes: self.cel.enable_list_type_attributes,
            }),
            apply_api_defaults: true,
            nodes: self.nodes.clone(),
            device_classes: self.classes.clone(),
            resource_slices: self.slices.clone(),
            claims: self.claims.clone(),
            mode: Mode::Allocate,
            ..Default::default()
        };
        s.allocated.state.devices = self
            .allocated
            .devices
            .iter()
            .map(|d| StateDevice {
                driver: d.driver.clone(),
                pool: d.pool.clone(),
                device: d.device.clone(),
            })
            .collect();
        s
    }
}
