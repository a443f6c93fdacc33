//! Fixtures shared by the crate's unit tests: nodes, a GPU driver's slices and class, claims
//! (allocated or not), and a cache holding them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CounterSet, Device, DeviceAttribute, DeviceClaim, DeviceClass,
    DeviceClassSpec, DeviceRequest, DeviceSelector, DeviceSubRequest, ExactDeviceRequest,
    ResourceClaim, ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cache::ClusterCache;

pub(crate) const DRIVER: &str = "gpu.example.com";

pub(crate) fn node(name: &str, cpu: &str, labels: &[(&str, &str)]) -> Node {
    let mut n = Node {
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity("64Gi".to_owned())),
                ("pods".to_owned(), Quantity("110".to_owned())),
            ])),
            ..NodeStatus::default()
        }),
        ..Node::default()
    };
    n.metadata.name = Some(name.into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    n
}

pub(crate) fn device(name: &str, size: &str) -> Device {
    Device {
        name: name.into(),
        attributes: Some(BTreeMap::from([(
            "size".to_owned(),
            DeviceAttribute {
                string: Some(size.into()),
                ..DeviceAttribute::default()
            },
        )])),
        ..Device::default()
    }
}

pub(crate) fn slice(
    node: &str,
    devices: Vec<Device>,
    counters: Option<Vec<CounterSet>>,
) -> ResourceSlice {
    let mut s = ResourceSlice {
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            shared_counters: counters,
            ..ResourceSliceSpec::default()
        },
        ..ResourceSlice::default()
    };
    s.metadata.name = Some(format!("{node}-slice"));
    s
}

pub(crate) fn selector(expression: &str) -> Option<Vec<DeviceSelector>> {
    Some(vec![DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: expression.into(),
        }),
    }])
}

pub(crate) fn exact(count: i64, size: Option<&str>) -> DeviceRequest {
    DeviceRequest {
        name: "gpu".into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: "gpu".into(),
            count: Some(count),
            allocation_mode: Some("ExactCount".into()),
            selectors: size.and_then(|s| {
                selector(&format!("device.attributes[\"{DRIVER}\"].size == \"{s}\""))
            }),
            ..ExactDeviceRequest::default()
        }),
        ..DeviceRequest::default()
    }
}

pub(crate) fn first_available(sizes: &[&str]) -> DeviceRequest {
    DeviceRequest {
        name: "gpu".into(),
        first_available: Some(
            sizes
                .iter()
                .map(|s| DeviceSubRequest {
                    name: (*s).into(),
                    device_class_name: "gpu".into(),
                    allocation_mode: Some("ExactCount".into()),
                    count: Some(1),
                    selectors: selector(&format!(
                        "device.attributes[\"{DRIVER}\"].size == \"{s}\""
                    )),
                    ..DeviceSubRequest::default()
                })
                .collect(),
        ),
        ..DeviceRequest::default()
    }
}

pub(crate) fn claim(name: &str, request: DeviceRequest) -> ResourceClaim {
    let mut c = ResourceClaim {
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![request]),
                ..DeviceClaim::default()
            }),
        },
        ..ResourceClaim::default()
    };
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.resource_version = Some("1".into());
    c
}

/// `name` allocated device `device` of node `node`'s pool, reserved by nobody.
pub(crate) fn allocated_claim(name: &str, node: &str, device: &str) -> ResourceClaim {
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    let mut c = claim(name, exact(1, None));
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "gpu".into(),
                    driver: DRIVER.into(),
                    pool: node.into(),
                    device: device.into(),
                    ..DeviceRequestAllocationResult::default()
                }]),
                config: None,
            }),
            node_selector: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.into()]),
                    }]),
                    match_expressions: None,
                }],
            }),
            ..AllocationResult::default()
        }),
        ..ResourceClaimStatus::default()
    });
    c
}

/// A cache with the `gpu` class (every device of [`DRIVER`]), `nodes`, `slices` and `claims`.
pub(crate) fn cache_with(
    nodes: Vec<Node>,
    slices: Vec<ResourceSlice>,
    claims: Vec<ResourceClaim>,
) -> ClusterCache {
    let mut cache = ClusterCache::new();
    let mut class = DeviceClass {
        spec: DeviceClassSpec {
            selectors: selector(&format!("device.driver == \"{DRIVER}\"")),
            ..DeviceClassSpec::default()
        },
        ..DeviceClass::default()
    };
    class.metadata.name = Some("gpu".into());
    cache.upsert_class(class);
    for n in nodes {
        cache.upsert_node(n);
    }
    for s in slices {
        cache.upsert_slice(s);
    }
    for c in claims {
        cache.upsert_claim(c);
    }
    cache
}

/// A pod in `namespace` with `labels` and `spec`, UID `uid-<name>`.
pub(crate) fn labelled_pod(
    name: &str,
    namespace: &str,
    labels: &[(&str, &str)],
    spec: k8s_openapi::api::core::v1::PodSpec,
) -> k8s_openapi::api::core::v1::Pod {
    let mut p = k8s_openapi::api::core::v1::Pod {
        spec: Some(spec),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some(namespace.into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    p
}

/// `pod` bound to `node` (as the watch shows it) in `cache`.
pub(crate) fn bind_in(
    cache: &mut ClusterCache,
    mut pod: k8s_openapi::api::core::v1::Pod,
    node: &str,
) {
    pod.spec.get_or_insert_with(Default::default).node_name = Some(node.into());
    cache.upsert_pod(&pod);
}

/// `v` sorted (placements compared as sets).
pub(crate) fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// One cycle for `pod` under `profile`: the feasible nodes, the best first, or the
/// unschedulable message.
pub(crate) fn placements(
    cache: &mut ClusterCache,
    pod: &k8s_openapi::api::core::v1::Pod,
    profile: &crate::config::Profile,
) -> Result<Vec<String>, String> {
    use crate::cycle::{CycleInputs, Decision, Outcome, with_engine};
    let options = devicelet_allocator::AllocateOptions::unbounded();
    with_engine(cache, options, profile, |engine, cache| {
        let inputs = CycleInputs::read(pod, cache, std::time::Duration::from_secs(600));
        match engine.evaluate(pod, inputs, 100) {
            Outcome::Feasible(p) => Ok(p.into_iter().map(|p| p.node).collect()),
            Outcome::Decided(Decision::Unschedulable { fit, .. }) => Err(fit.message()),
            Outcome::Decided(d) => Err(format!("{d:?}")),
        }
    })
}
