//! Static-policy scenarios: hints with and without earlier allocations, multi-NUMA groups,
//! init-container reuse, restore from the checkpoint and the machine-changed refusal.

use std::collections::BTreeMap;

use devicelet_cpumanager::{PodCpuInfo, QosClass};
use devicelet_memorymanager::{
    MemoryBlock, MemoryManager, MemoryManagerConfig, MemoryManagerError, MemoryTopology,
    ReservedMemory,
};
use devicelet_topology::{ContainerSpec, NumaMask, PodSpec, ResourceHints, TopologyHint};

const GI: u64 = 1 << 30;

fn config(reserved_per_node: &[(i64, &str)]) -> MemoryManagerConfig {
    let total: i64 = reserved_per_node.len() as i64 * (GI as i64);
    MemoryManagerConfig {
        policy: "Static".into(),
        reserved_memory: reserved_per_node
            .iter()
            .map(|(n, q)| ReservedMemory {
                numa_node: *n,
                limits: BTreeMap::from([("memory".to_string(), q.to_string())]),
            })
            .collect(),
        node_allocatable_reservation: BTreeMap::from([("memory".to_string(), total)]),
    }
}

/// Two nodes of 11 GiB with 1 GiB reserved each: 10 GiB allocatable per node.
fn two_nodes(dir: &std::path::Path) -> MemoryManager {
    let t = MemoryTopology::uniform(2, 11 * GI, &[]).expect("topology");
    MemoryManager::new(t, &config(&[(0, "1Gi"), (1, "1Gi")]), dir).expect("manager")
}

fn container(name: &str, mem: u64) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        limits: BTreeMap::from([("memory".to_string(), mem as i64), ("cpu".into(), 1000)]),
        restartable: false,
    }
}

fn pod(uid: &str, init: Vec<ContainerSpec>, apps: Vec<ContainerSpec>) -> PodSpec {
    PodSpec {
        uid: uid.into(),
        namespace: "ns".into(),
        name: uid.into(),
        init_containers: init,
        containers: apps,
    }
}

fn register(m: &MemoryManager, p: &PodSpec, qos: QosClass) {
    m.register_pod(&PodCpuInfo {
        spec: p.clone(),
        qos,
        cpu_requests_millis: BTreeMap::new(),
        pod_level: None,
        equivalent_guaranteed: Default::default(),
    });
}

fn mask(nodes: &[usize]) -> NumaMask {
    NumaMask::from_nodes(nodes.iter().copied()).expect("mask")
}

fn memory_hints(h: &devicelet_topology::ProviderHints) -> Vec<(Vec<usize>, bool)> {
    match h.get("memory") {
        Some(ResourceHints::Hints(v)) => v
            .iter()
            .map(|h| {
                (
                    h.affinity.map(|a| a.nodes().collect()).unwrap_or_default(),
                    h.preferred,
                )
            })
            .collect(),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn hints_prefer_the_fewest_nodes_and_exclude_what_does_not_fit() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = two_nodes(dir.path());
    let p = pod("p1", vec![], vec![container("c", 4 * GI)]);
    register(&m, &p, QosClass::Guaranteed);
    let h = m.container_hints(&p, &p.containers[0]);
    assert_eq!(
        memory_hints(&h),
        vec![(vec![0], true), (vec![1], true), (vec![0, 1], false)]
    );
    // 15 GiB only fits both nodes: one hint, preferred.
    let big = pod("p2", vec![], vec![container("c", 15 * GI)]);
    register(&m, &big, QosClass::Guaranteed);
    assert_eq!(
        memory_hints(&m.container_hints(&big, &big.containers[0])),
        vec![(vec![0, 1], true)]
    );
    // Beyond the machine: no hint at all (the kubelet returns an empty map).
    let huge = pod("p3", vec![], vec![container("c", 25 * GI)]);
    register(&m, &huge, QosClass::Guaranteed);
    assert!(m.container_hints(&huge, &huge.containers[0]).is_empty());
    // Not Guaranteed: no hints.
    let burst = pod("p4", vec![], vec![container("c", GI)]);
    register(&m, &burst, QosClass::Burstable);
    assert!(m.container_hints(&burst, &burst.containers[0]).is_empty());
}

#[test]
fn single_and_multi_numa_allocations_do_not_mix() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = two_nodes(dir.path());
    let a = pod("a", vec![], vec![container("c", 4 * GI)]);
    register(&m, &a, QosClass::Guaranteed);
    m.allocate_container(&a, &a.containers[0], &TopologyHint::new(mask(&[0]), true))
        .expect("fits node 0");
    assert_eq!(
        m.memory_blocks("a", "c"),
        vec![MemoryBlock {
            numa_affinity: vec![0],
            resource: "memory".into(),
            size: 4 * GI
        }]
    );
    // Node 0 now serves a single-NUMA allocation: the pair is no longer a hint.
    let b = pod("b", vec![], vec![container("c", 4 * GI)]);
    register(&m, &b, QosClass::Guaranteed);
    assert_eq!(
        memory_hints(&m.container_hints(&b, &b.containers[0])),
        vec![(vec![0], true), (vec![1], true)]
    );
    let err = m
        .allocate_container(
            &b,
            &b.containers[0],
            &TopologyHint::new(mask(&[0, 1]), false),
        )
        .expect_err("mixes single and multi NUMA");
    assert_eq!(err, MemoryManagerError::ViolatesNumaAllocation);
    assert_eq!(
        err.to_string(),
        "[memorymanager] preferred hint violates NUMA node allocation"
    );

    // A 14 GiB container on a fresh machine spans both nodes; afterwards single nodes are
    // refused and the group is the only hint.
    let dir2 = tempfile::tempdir().expect("tmp");
    let m2 = two_nodes(dir2.path());
    let wide = pod("w", vec![], vec![container("c", 14 * GI)]);
    register(&m2, &wide, QosClass::Guaranteed);
    m2.allocate_container(&wide, &wide.containers[0], &TopologyHint::any(true))
        .expect("default hint is the pair");
    let machine = m2.machine_state();
    assert_eq!(machine[&0].cells, vec![0, 1]);
    assert_eq!(machine[&0].memory_map["memory"].free, 0);
    assert_eq!(machine[&1].memory_map["memory"].free, 6 * GI);
    let small = pod("s", vec![], vec![container("c", GI)]);
    register(&m2, &small, QosClass::Guaranteed);
    assert_eq!(
        memory_hints(&m2.container_hints(&small, &small.containers[0])),
        vec![(vec![0, 1], false)]
    );
    // The Topology Manager's narrower hint (node 0 has nothing free) is widened to the group.
    m2.allocate_container(
        &small,
        &small.containers[0],
        &TopologyHint::new(mask(&[0]), false),
    )
    .expect("extended to the group");
    assert_eq!(m2.memory_numa_nodes("s", "c"), vec![0, 1]);
    // Releasing both gives the nodes back their own groups.
    m2.remove_container("w", "c").expect("remove");
    m2.remove_pod("s").expect("remove");
    let machine = m2.machine_state();
    assert_eq!(machine[&0].cells, vec![0]);
    assert_eq!(machine[&1].memory_map["memory"].free, 10 * GI);
    assert_eq!(machine[&0].number_of_assignments, 0);
}

#[test]
fn app_containers_reuse_init_container_memory() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = two_nodes(dir.path());
    let p = pod(
        "p",
        vec![container("init", 6 * GI)],
        vec![container("app", 4 * GI)],
    );
    register(&m, &p, QosClass::Guaranteed);
    let on0 = TopologyHint::new(mask(&[0]), true);
    m.allocate_container(&p, &p.init_containers[0], &on0)
        .expect("init");
    m.allocate_container(&p, &p.containers[0], &on0)
        .expect("app");
    // The app took its 4 GiB from the init container's 6 GiB: 6 GiB reserved in all, and the
    // init block shrank so the pod's blocks add up to it.
    let machine = m.machine_state();
    assert_eq!(machine[&0].memory_map["memory"].reserved, 6 * GI);
    assert_eq!(m.memory_blocks("p", "init")[0].size, 2 * GI);
    assert_eq!(m.memory_blocks("p", "app")[0].size, 4 * GI);
    // Pod-scope hints: max(init 6, apps 4) = 6 GiB, regenerated from the existing blocks only
    // if they match that request; here the first container's block (2 GiB) does not, so no
    // preference.
    assert!(m.pod_hints(&p).is_empty());
}

#[test]
fn state_survives_a_restart_and_a_changed_machine_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = two_nodes(dir.path());
    let p = pod("p", vec![], vec![container("c", 3 * GI)]);
    register(&m, &p, QosClass::Guaranteed);
    m.allocate_container(&p, &p.containers[0], &TopologyHint::new(mask(&[1]), true))
        .expect("alloc");
    let before = m.state();
    drop(m);
    let again = two_nodes(dir.path());
    assert_eq!(again.state(), before);
    // Hints of an allocated container are regenerated from its blocks.
    register(&again, &p, QosClass::Guaranteed);
    assert_eq!(
        memory_hints(&again.container_hints(&p, &p.containers[0])),
        vec![(vec![1], true)]
    );
    drop(again);

    // More memory on the machine: the restored state no longer matches.
    let t = MemoryTopology::uniform(2, 12 * GI, &[]).expect("topology");
    let err = MemoryManager::new(t, &config(&[(0, "1Gi"), (1, "1Gi")]), dir.path())
        .expect_err("machine changed");
    assert_eq!(
        err.to_string(),
        "[memorymanager] the expected machine state is different from the real one"
    );
    // Another policy: the kubelet's restore error.
    let none = MemoryManagerConfig {
        policy: "None".into(),
        ..Default::default()
    };
    let t = MemoryTopology::uniform(2, 11 * GI, &[]).expect("topology");
    let err = MemoryManager::new(t, &none, dir.path()).expect_err("policy differs");
    assert!(
        err.to_string().contains(
            "[memorymanager] configured policy \"None\" differs from state checkpoint policy \"Static\""
        ),
        "{err}"
    );
}

#[test]
fn hugepages_are_their_own_resource() {
    let dir = tempfile::tempdir().expect("tmp");
    let t = MemoryTopology::uniform(2, 11 * GI, &[(GI, 2)]).expect("topology");
    let m = MemoryManager::new(t, &config(&[(0, "1Gi"), (1, "1Gi")]), dir.path()).expect("mm");
    let alloc = m.allocatable_memory();
    assert_eq!(alloc.len(), 4);
    assert_eq!(
        alloc[0],
        MemoryBlock {
            numa_affinity: vec![0],
            resource: "hugepages-1Gi".into(),
            size: 2 * GI
        }
    );
    // 11 GiB - 1 GiB reserved - 2 GiB of hugepages.
    assert_eq!(alloc[1].size, 8 * GI);
    let mut c = container("c", GI);
    c.limits.insert("hugepages-1Gi".into(), 3 * GI as i64);
    let p = pod("p", vec![], vec![c]);
    register(&m, &p, QosClass::Guaranteed);
    let h = m.container_hints(&p, &p.containers[0]);
    assert_eq!(h.len(), 2);
    assert_eq!(memory_hints(&h), vec![(vec![0, 1], true)]);
    m.allocate_container(&p, &p.containers[0], &TopologyHint::any(true))
        .expect("alloc");
    let machine = m.machine_state();
    assert_eq!(machine[&0].number_of_assignments, 2);
    assert_eq!(machine[&0].memory_map["hugepages-1Gi"].free, 0);
    assert_eq!(machine[&1].memory_map["hugepages-1Gi"].free, GI);
}
