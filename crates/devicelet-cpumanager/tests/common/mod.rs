//! Machines of upstream's `cpumanager/policy_test.go` fixtures, described in our own types.
#![allow(dead_code)]

use std::collections::BTreeMap;

use devicelet_checkpoint::cpuset::CpuSet;
use devicelet_cpumanager::{
    CpuBits, CpuInfo, CpuMachineConfig, CpuManager, CpuManagerConfig, CpuTopology, PodCpuInfo,
    QosClass, ReservedCpus,
};
use devicelet_topology::{ContainerSpec, PodSpec};

/// 1 socket, 4 cores, 2 threads: cores {0,4} {1,5} {2,6} {3,7}.
pub fn single_socket_ht() -> CpuTopology {
    CpuTopology::new(
        (0..8)
            .map(|id| CpuInfo {
                id,
                socket: 0,
                core: id % 4,
                numa: 0,
                uncore_cache: 0,
            })
            .collect(),
    )
    .expect("valid fixture")
}

/// 2 sockets (= NUMA nodes), 6 cores, 2 threads; even CPUs on socket 0, cores {i, i+6}.
pub fn dual_socket_ht() -> CpuTopology {
    CpuTopology::new(
        (0..12)
            .map(|id| CpuInfo {
                id,
                socket: id % 2,
                core: id % 6,
                numa: (id % 2) as usize,
                uncore_cache: id % 2,
            })
            .collect(),
    )
    .expect("valid fixture")
}

/// 2 sockets, 2 NUMA nodes per socket, 40 cores, 80 CPUs: node n = {10n..10n+9, 40+10n..}.
pub fn dual_socket_multi_numa_ht() -> CpuTopology {
    CpuMachineConfig {
        sockets: 2,
        cores_per_socket: 20,
        threads_per_core: 2,
        numa_nodes: 4,
        cores_per_uncore_cache: None,
    }
    .to_topology()
    .expect("valid fixture")
}

pub fn set(s: &str) -> CpuBits {
    CpuBits::from_cpuset(&CpuSet::parse(s).expect("test cpuset"))
}

pub fn static_config(reserved: ReservedCpus) -> CpuManagerConfig {
    CpuManagerConfig {
        policy: "static".into(),
        reserved,
        policy_options: BTreeMap::new(),
        feature_gates: devicelet_topology::FeatureGates::default(),
        topology_manager_policy: "none".into(),
    }
}

pub fn static_manager(topo: CpuTopology, reserved: usize, dir: &std::path::Path) -> CpuManager {
    CpuManager::new(topo, &static_config(ReservedCpus::Count(reserved)), dir)
        .expect("manager starts")
}

fn container(name: &str, millis: i64) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        limits: [("cpu".to_string(), millis)].into_iter().collect(),
        restartable: false,
    }
}

/// A pod with (name, cpu millis) init and app containers and the given QoS class.
pub fn pod(uid: &str, qos: QosClass, init: &[(&str, i64)], apps: &[(&str, i64)]) -> PodCpuInfo {
    PodCpuInfo {
        spec: PodSpec {
            uid: uid.into(),
            namespace: "default".into(),
            name: uid.into(),
            init_containers: init.iter().map(|(n, m)| container(n, *m)).collect(),
            containers: apps.iter().map(|(n, m)| container(n, *m)).collect(),
        },
        qos,
        cpu_requests_millis: init
            .iter()
            .chain(apps)
            .map(|(n, m)| (n.to_string(), *m))
            .collect(),
        pod_level: None,
        equivalent_guaranteed: Default::default(),
    }
}

/// One Guaranteed container.
pub fn gu_pod(uid: &str, millis: i64) -> PodCpuInfo {
    pod(uid, QosClass::Guaranteed, &[], &[("c", millis)])
}
