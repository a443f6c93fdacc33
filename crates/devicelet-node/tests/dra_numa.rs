//! DRA claim devices as a Topology Manager hint provider (devicelet's addition, issue 41),
//! through the node core in cluster mode (claims from a fake API server, the device's NUMA
//! node from the slice its driver published): container scope aligns only the containers that
//! use the claim, pod scope the whole pod; the refusal names the claim.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use devicelet_devicemanager::test_utils::FakeDialer as FakePluginDialer;
use devicelet_devicemanager::{DeviceManager, DeviceManagerConfig, SystemClock};
use devicelet_dra::fake::{FakeDialer, FakeDraDriver, allocated_claim, pod_with_claims};
use devicelet_dra::{DraPluginRegistry, FixedBootId, InMemoryClaimSource};
use devicelet_node::dra::NUMA_NODE_ATTRIBUTE;
use devicelet_node::{Alignment, AlignmentConfig, ClaimOrigin, DraNode, PodAdmitter, PodError};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const GPU: &str = "gpu.example.com";

struct Env {
    _dir: tempfile::TempDir,
    gpu: FakeDraDriver,
    admitter: PodAdmitter,
}

/// Two NUMA nodes (CPUs 0-3, 4-7; CPU 0 reserved), single-numa-node, static CPUs; the claim
/// `c1`'s device `dev-c1` is on NUMA node `numa` (no attribute when `None`).
fn env(scope: &str, numa: Option<DeviceAttribute>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let config: AlignmentConfig = serde_json::from_value(serde_json::json!({
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": scope,
        "cpuManagerPolicy": "static",
        "reservedSystemCPUs": "0",
        "devicelet": {"machine": {"nodes": 2, "cpusPerNode": 4}},
    }))
    .unwrap();
    let alignment = Alignment::new(&config, dir.path()).unwrap();
    let manager = DeviceManager::new(
        DeviceManagerConfig::new(dir.path().join("dp")),
        Arc::new(FakePluginDialer::new()),
        Arc::new(SystemClock),
    );
    let dialer = FakeDialer::new();
    let gpu = FakeDraDriver::new(GPU);
    dialer.add(&gpu);
    let registry = DraPluginRegistry::with_call_timeout(Arc::new(dialer), Duration::from_secs(2));
    registry
        .register(
            GPU,
            Path::new("/plugins/gpu/dra.sock"),
            &["v1.DRAPlugin".to_owned()],
        )
        .unwrap();
    let api = InMemoryClaimSource::new();
    let node = DraNode::open(
        dir.path(),
        "node-a",
        registry,
        &FixedBootId("boot-1".to_owned()),
        Duration::from_secs(30),
        ClaimOrigin::Api(Arc::new(api.clone())),
    )
    .unwrap();
    let attributes = numa.map(|a| BTreeMap::from([(NUMA_NODE_ATTRIBUTE.to_owned(), a)]));
    node.publish(
        GPU,
        vec![ResourceSlice {
            metadata: Default::default(),
            spec: ResourceSliceSpec {
                driver: GPU.to_owned(),
                pool: ResourcePool {
                    name: "pool".to_owned(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(vec![Device {
                    name: "dev-c1".to_owned(),
                    attributes,
                    ..Device::default()
                }]),
                ..ResourceSliceSpec::default()
            },
        }],
    )
    .unwrap();
    api.insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-1"]));
    let admitter = PodAdmitter::with_alignment(manager, Arc::new(alignment)).with_dra(node);
    Env {
        _dir: dir,
        gpu,
        admitter,
    }
}

fn int(n: i64) -> Option<DeviceAttribute> {
    Some(DeviceAttribute {
        int: Some(n),
        ..DeviceAttribute::default()
    })
}

fn limits(cpus: u32) -> Option<ResourceRequirements> {
    let q = |s: &str| Quantity(s.to_owned());
    let l = BTreeMap::from([
        ("cpu".to_owned(), q(&cpus.to_string())),
        ("memory".to_owned(), q("1Gi")),
    ]);
    Some(ResourceRequirements {
        limits: Some(l),
        ..ResourceRequirements::default()
    })
}

/// Guaranteed: `ctr` (2 CPUs) uses claim `c1`, `side` (1 CPU) uses none.
fn pod() -> Pod {
    let mut pod = pod_with_claims("ns", "p1", "pod-1", &["c1"]);
    let spec = pod.spec.as_mut().unwrap();
    let claims = spec.containers[0].resources.take().unwrap().claims;
    let mut ctr = limits(2).unwrap();
    ctr.claims = claims;
    spec.containers[0].resources = Some(ctr);
    spec.containers.push(Container {
        name: "side".to_owned(),
        resources: limits(1),
        ..Container::default()
    });
    pod
}

fn cpus_of(list: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

fn on_node(cpus: &Option<String>, node: u32) -> bool {
    let list = cpus_of(cpus.as_deref().unwrap());
    !list.is_empty() && list.iter().all(|c| c / 4 == node)
}

#[tokio::test]
async fn container_scope_aligns_the_container_that_uses_the_claim() {
    let e = env("container", int(1));
    let got = e.admitter.admit(&pod()).await.unwrap();
    let ctr = &got.containers[0];
    assert_eq!(ctr.numa_affinity, Some(vec![1]), "{got:?}");
    assert!(on_node(&ctr.cpus, 1), "{got:?}");
    // `side` uses no claim: its CPUs come from node 0, as without DRA.
    let side = &got.containers[1];
    assert_eq!(side.numa_affinity, Some(vec![0]), "{got:?}");
    assert!(on_node(&side.cpus, 0), "{got:?}");
}

#[tokio::test]
async fn pod_scope_aligns_every_container_with_the_claim() {
    let e = env("pod", int(1));
    let got = e.admitter.admit(&pod()).await.unwrap();
    for c in &got.containers {
        assert_eq!(c.numa_affinity, Some(vec![1]), "{got:?}");
        assert!(on_node(&c.cpus, 1), "{got:?}");
    }
}

#[tokio::test]
async fn a_list_attribute_on_both_nodes_and_no_attribute_leave_the_cpus_free() {
    for numa in [
        Some(DeviceAttribute {
            ints: Some(vec![0, 1]),
            ..DeviceAttribute::default()
        }),
        None,
    ] {
        let e = env("container", numa.clone());
        let got = e.admitter.admit(&pod()).await.unwrap();
        // The device is close to node 0 too (or has no topology): the lowest node wins.
        assert!(on_node(&got.containers[0].cpus, 0), "{numa:?}: {got:?}");
    }
}

#[tokio::test]
async fn single_numa_node_refuses_when_the_claim_s_node_lacks_cpus_and_names_the_claim() {
    let e = env("container", int(1));
    // A claimless pod takes node 1's 4 CPUs (node 0 has only 3 free: CPU 0 is reserved).
    let mut filler = pod_with_claims("ns", "f", "pod-f", &[]);
    let spec = filler.spec.as_mut().unwrap();
    spec.resource_claims = None;
    spec.containers[0].resources = limits(4);
    let f = e.admitter.admit(&filler).await.unwrap();
    assert!(on_node(&f.containers[0].cpus, 1), "{f:?}");
    let err = e.admitter.admit(&pod()).await.unwrap_err();
    assert!(matches!(err, PodError::Alignment(_)), "{err}");
    assert_eq!(err.kubelet_rejection().0, "TopologyAffinityError");
    let text = err.to_string();
    assert!(
        text.contains("claim \"c1\" (ResourceClaim ns/c1) with devices on NUMA nodes [1]")
            && text.contains("gpu.example.com/pool/dev-c1 on [1]"),
        "{text}"
    );
    // Nothing is prepared for the refused pod.
    assert!(e.gpu.prepared().is_empty());
}
