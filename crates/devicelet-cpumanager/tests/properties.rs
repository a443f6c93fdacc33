//! Property tests over random allocate / remove sequences on a 2-socket, 4-NUMA, SMT-2 machine:
//! exclusive sets of different pods never overlap and never include reserved CPUs; the default
//! set and the assignments partition the machine; the checkpoint reloads to the same state.

mod common;

use common::gu_pod;
use devicelet_cpumanager::{CpuBits, CpuMachineConfig, CpuManager, ReservedCpus};
use devicelet_topology::{NumaMask, TopologyHint};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Allocate { cpus: u8, node: Option<u8> },
    Remove { pick: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..=10, proptest::option::of(0u8..4)).prop_map(|(cpus, node)| Op::Allocate { cpus, node }),
        1 => any::<u8>().prop_map(|pick| Op::Remove { pick }),
    ]
}

fn topo() -> devicelet_cpumanager::CpuTopology {
    CpuMachineConfig {
        sockets: 2,
        cores_per_socket: 8,
        threads_per_core: 2,
        numa_nodes: 4,
        cores_per_uncore_cache: None,
    }
    .to_topology()
    .expect("valid")
}

fn check_invariants(m: &CpuManager) -> Result<(), TestCaseError> {
    let st = m.state();
    let reserved = CpuBits::from_cpuset(&m.reserved_cpus());
    let mut union = st.default_cpu_set.clone();
    let mut seen_by_pod: Vec<(String, CpuBits)> = vec![];
    for (pod, containers) in &st.assignments {
        let pod_set = containers.values().fold(CpuBits::new(), |a, s| a.union(s));
        prop_assert!(
            !pod_set.intersects(&reserved),
            "pod {pod} holds reserved CPUs"
        );
        prop_assert!(
            !pod_set.intersects(&st.default_cpu_set),
            "pod {pod} overlaps default"
        );
        for (other, set) in &seen_by_pod {
            prop_assert!(!pod_set.intersects(set), "pods {pod} and {other} overlap");
        }
        seen_by_pod.push((pod.clone(), pod_set.clone()));
        union = union.union(&pod_set);
    }
    prop_assert!(
        union.same_as(m.topology().all_cpus()),
        "union {union} != all"
    );
    prop_assert!(reserved.is_subset_of(&st.default_cpu_set));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn exclusive_sets_never_overlap_and_default_plus_assignments_is_all_cpus(
        ops in proptest::collection::vec(op(), 1..25)
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = common::static_config(ReservedCpus::Count(2));
        let m = CpuManager::new(topo(), &cfg, dir.path()).expect("starts");
        let mut live: Vec<String> = vec![];
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Allocate { cpus, node } => {
                    let uid = format!("pod{i}");
                    let p = gu_pod(&uid, i64::from(cpus) * 1000);
                    m.register_pod(&p);
                    let hint = node.map_or(TopologyHint::default(), |n| {
                        TopologyHint::new(NumaMask::from_bits(1 << n), true)
                    });
                    let free_before = m.available_cpus().len();
                    match m.allocate_container(&p.spec, &p.spec.containers[0], &hint) {
                        Ok(()) => {
                            prop_assert_eq!(m.cpuset_for(&uid, "c").len(), usize::from(cpus));
                            live.push(uid);
                        }
                        Err(e) => {
                            prop_assert!(free_before < usize::from(cpus), "refused with {} free: {}", free_before, e);
                            prop_assert_eq!(m.available_cpus().len(), free_before);
                        }
                    }
                }
                Op::Remove { pick } => {
                    if !live.is_empty() {
                        let uid = live.remove(usize::from(pick) % live.len());
                        m.remove_pod(&uid).expect("remove");
                    }
                }
            }
            check_invariants(&m)?;
        }
        let reloaded = CpuManager::new(topo(), &cfg, dir.path()).expect("restarts");
        prop_assert_eq!(reloaded.state(), m.state());
    }
}
