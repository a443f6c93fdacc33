//! Write faults on `memory_manager_state` (ecosystem A2 row 12 for the memory manager's file):
//! EIO and ENOSPC injected through `devicelet_checkpoint::fault`. An allocation that cannot be
//! written is refused with the file named, and leaves memory and the file as they were; once the
//! fault is gone, the allocation works and the file reloads to the same state.

use std::collections::BTreeMap;
use std::fs;

use devicelet_checkpoint::fault::{EIO, ENOSPC, Fault, Op};
use devicelet_cpumanager::{PodCpuInfo, QosClass};
use devicelet_memorymanager::{
    MemoryManager, MemoryManagerConfig, MemoryManagerError, MemoryTopology, ReservedMemory,
};
use devicelet_topology::{ContainerSpec, PodSpec, TopologyHint};

const GI: u64 = 1 << 30;

/// Two nodes of 4 GiB with 1 GiB reserved on node 0.
fn manager(dir: &std::path::Path) -> MemoryManager {
    let topology = MemoryTopology::uniform(2, 4 * GI, &[]).expect("topology");
    let config = MemoryManagerConfig {
        policy: "Static".into(),
        reserved_memory: vec![ReservedMemory {
            numa_node: 0,
            limits: BTreeMap::from([("memory".to_owned(), "1Gi".to_owned())]),
        }],
        node_allocatable_reservation: BTreeMap::from([("memory".to_owned(), GI as i64)]),
    };
    MemoryManager::new(topology, &config, dir).expect("manager")
}

/// A Guaranteed pod with one container of `gib` GiB, allocated without a Topology Manager hint.
fn allocate(m: &MemoryManager, uid: &str, gib: u64) -> Result<(), MemoryManagerError> {
    let container = ContainerSpec {
        name: "c".into(),
        limits: BTreeMap::from([
            ("memory".to_owned(), (gib * GI) as i64),
            ("cpu".into(), 1000),
        ]),
        restartable: false,
    };
    let spec = PodSpec {
        uid: uid.into(),
        namespace: "ns".into(),
        name: uid.into(),
        init_containers: vec![],
        containers: vec![container],
    };
    m.register_pod(&PodCpuInfo {
        spec: spec.clone(),
        qos: QosClass::Guaranteed,
        cpu_requests_millis: BTreeMap::new(),
        pod_level: None,
        equivalent_guaranteed: Default::default(),
    });
    m.allocate_container(&spec, &spec.containers[0], &TopologyHint::default())
}

#[test]
fn a2_12_eio_and_enospc_on_memory_manager_state_refuse_the_allocation_and_keep_the_file() {
    for (op, errno) in [
        (Op::Write, ENOSPC),
        (Op::Write, EIO),
        (Op::Fsync, EIO),
        (Op::Rename, EIO),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = manager(dir.path());
        allocate(&m, "a", 1).expect("fits");
        let file = dir.path().join("memory_manager_state");
        let file_before = fs::read(&file).expect("state file");
        let state_before = m.state();

        let fault = Fault::arm(dir.path(), op, errno);
        let err = allocate(&m, "b", 2).expect_err("the write fails");
        assert_eq!(fault.hits(), 1, "{op:?}");
        assert!(
            matches!(err, MemoryManagerError::Write { .. }),
            "{op:?}: {err}"
        );
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{op:?}: the error names the file: {err}"
        );
        assert_eq!(m.state(), state_before, "{op:?}: nothing only in memory");
        assert_eq!(fs::read(&file).expect("state file"), file_before, "{op:?}");
        drop(fault);

        allocate(&m, "b", 2).expect("allocation works once the fault is gone");
        let reloaded = manager(dir.path());
        assert_eq!(reloaded.state(), m.state(), "{op:?}");
        assert!(m.state().assignments.contains_key("b"), "{op:?}");
    }
}
