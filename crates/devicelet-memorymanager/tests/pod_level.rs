//! Pod-level resource management (KEP-5526, `PodLevelResourceManagers`): the static policy's
//! `AllocatePod`, the empty-shared-pool check, release with the last container, and the
//! kubelet's `memory_manager_state` layout v2 with `podEntries` (files written by the kubelet
//! v1.36.3 with the gate on, from the resource-manager oracle in `interop/resourcemanagers`).

use std::collections::BTreeMap;

use devicelet_checkpoint::memory::{self as cp, MemoryLayout};
use devicelet_cpumanager::pod::{PodLevelGates, PodLevelResources};
use devicelet_cpumanager::{PodCpuInfo, QosClass};
use devicelet_memorymanager::{
    CheckpointFile, MemoryManager, MemoryManagerConfig, MemoryManagerError, MemoryTopology,
    ReservedMemory,
};
use devicelet_topology::{ContainerSpec, NumaMask, PodSpec, TopologyHint};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;
const KUBELET_FILE: &[u8] = include_bytes!("fixtures/kubelet_pod_level_memory_manager_state");
const KUBELET_FILE_HUGEPAGES: &[u8] =
    include_bytes!("fixtures/kubelet_pod_level_memory_manager_state_hugepages");

#[test]
fn kubelet_pod_level_state_file_loads_and_is_written_back_byte_for_byte() {
    let decoded = cp::decode(KUBELET_FILE).expect("the kubelet's v2 file verifies");
    assert_eq!(decoded.layout, MemoryLayout::V2);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memory_manager_state");
    std::fs::write(&path, KUBELET_FILE).expect("write");
    let file = CheckpointFile::new(dir.path(), "Static").with_pod_level(true);
    let state = file.load().expect("loads").expect("present");
    assert_eq!(state.pod_entries.len(), 3);
    let pod = &state.pod_entries["0000000b-0000-4000-8000-000000000006"];
    assert_eq!(
        (pod[0].numa_affinity.clone(), pod[0].size),
        (vec![2], 1536 * MI)
    );
    file.store(&state).expect("store");
    assert_eq!(std::fs::read(&path).expect("read"), KUBELET_FILE);
    // With the gate off such a file is refused.
    assert!(CheckpointFile::new(dir.path(), "Static").load().is_err());

    // Blocks of several resources: the kubelet writes them in Go map order, devicelet by
    // name; the content is the same.
    std::fs::write(&path, KUBELET_FILE_HUGEPAGES).expect("write");
    let state = file.load().expect("loads").expect("present");
    assert!(state.pod_entries.values().any(|b| b.len() > 1));
    file.store(&state).expect("store");
    let again = file.load().expect("reloads").expect("present");
    assert_eq!(again, state);
}

fn config() -> MemoryManagerConfig {
    MemoryManagerConfig {
        policy: "Static".into(),
        reserved_memory: (0..2)
            .map(|n| ReservedMemory {
                numa_node: n,
                limits: BTreeMap::from([("memory".to_string(), "1Gi".to_string())]),
            })
            .collect(),
        node_allocatable_reservation: BTreeMap::from([("memory".to_string(), 2 * GI as i64)]),
    }
}

fn manager(dir: &std::path::Path, on: bool) -> MemoryManager {
    let t = MemoryTopology::uniform(2, 11 * GI, &[]).expect("topology");
    let gates = PodLevelGates {
        resources: true,
        managers: on,
    };
    MemoryManager::new_with_gates(t, &config(), dir, gates).expect("manager")
}

fn spec(name: &str, mem: u64) -> ContainerSpec {
    let mut limits = BTreeMap::new();
    if mem > 0 {
        limits.insert("memory".to_string(), mem as i64);
        limits.insert("cpu".to_string(), 1000);
    }
    ContainerSpec {
        name: name.into(),
        limits,
        restartable: false,
    }
}

/// A Guaranteed pod-level pod of `mem` bytes: containers with memory are Guaranteed on their
/// own, the others share.
fn pod_level_pod(uid: &str, mem: u64, apps: &[(&str, u64)]) -> PodCpuInfo {
    PodCpuInfo {
        spec: PodSpec {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            init_containers: vec![],
            containers: apps.iter().map(|(n, m)| spec(n, *m)).collect(),
        },
        qos: QosClass::Burstable,
        cpu_requests_millis: BTreeMap::new(),
        pod_level: Some(PodLevelResources {
            set: true,
            qos: QosClass::Guaranteed,
            cpu_request_millis: Some(2000),
            memory_requests: Some(BTreeMap::from([("memory".to_string(), mem)])),
        }),
        equivalent_guaranteed: apps
            .iter()
            .filter(|(_, m)| *m > 0)
            .map(|(n, _)| n.to_string())
            .collect(),
    }
}

fn hint(nodes: &[usize]) -> TopologyHint {
    TopologyHint::new(
        NumaMask::from_nodes(nodes.iter().copied()).expect("mask"),
        true,
    )
}

#[test]
fn assign_pod_places_the_pod_once_and_splits_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), true);
    let info = pod_level_pod("p", 3 * GI, &[("a", GI), ("b", 0)]);
    m.register_pod(&info);
    m.assign_pod(&info.spec, &hint(&[1])).expect("allocates");
    let state = m.state();
    let pod = &state.pod_entries["p"];
    assert_eq!(
        (pod[0].numa_affinity.clone(), pod[0].size),
        (vec![1], 3 * GI)
    );
    assert_eq!(m.memory_blocks("p", "a")[0].size, GI);
    assert_eq!(
        m.memory_blocks("p", "b")[0].size,
        2 * GI,
        "b shares what a left"
    );
    // Only the pod's amount counts against the node.
    let node = &state.machine[&1];
    assert_eq!(node.memory_map["memory"].reserved, 3 * GI);
    assert_eq!(node.number_of_assignments, 1);

    m.remove_container("p", "a").expect("remove a");
    assert_eq!(m.state().machine[&1].memory_map["memory"].reserved, 3 * GI);
    m.remove_container("p", "b").expect("remove b");
    let state = m.state();
    assert_eq!(state.machine[&1].memory_map["memory"].reserved, 0);
    assert!(state.pod_entries.is_empty() && state.assignments.is_empty());
}

#[test]
fn an_empty_shared_pool_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), true);
    let info = pod_level_pod("p", GI, &[("a", GI), ("b", 0)]);
    m.register_pod(&info);
    assert!(
        m.pod_hints(&info.spec).get("memory").is_some_and(
            |h| matches!(h, devicelet_topology::ResourceHints::Hints(v) if v.is_empty())
        )
    );
    match m.assign_pod(&info.spec, &hint(&[0])) {
        Err(MemoryManagerError::EmptyPodSharedPool(text)) => assert_eq!(
            text,
            "pod rejected, sum of exclusive container memory requests equals pod budget, leaving no memory for shared containers"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn with_the_gate_off_a_pod_with_pod_level_resources_gets_no_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), false);
    let info = pod_level_pod("p", 2 * GI, &[("a", GI)]);
    m.register_pod(&info);
    assert!(m.pod_hints(&info.spec).is_empty());
    m.assign_container(&info.spec, &info.spec.containers[0], &hint(&[0]))
        .expect("nothing to do");
    assert!(m.state().assignments.is_empty());
}
