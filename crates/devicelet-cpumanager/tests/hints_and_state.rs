//! CPU topology hints (upstream `topology_hints_test.go`: `TestGetTopologyHints`,
//! `TestGetPodTopologyHints`), admission through the real Topology Manager, and the
//! `cpu_manager_state` file: round trip, corrupt files, the kubelet's `validateState`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{dual_socket_ht, dual_socket_multi_numa_ht, gu_pod, pod, static_manager};
use devicelet_checkpoint::cpu;
use devicelet_cpumanager::{CpuManager, CpuManagerError, CpuTopology, QosClass};
use devicelet_topology::{
    AdmissionError, NumaMask, ProviderHints, ResourceHints, TopologyHint, TopologyManager,
};

fn listed(h: &ProviderHints) -> Vec<(u64, bool)> {
    match h.get("cpu") {
        Some(ResourceHints::Family(f)) => f
            .to_hints(16)
            .expect("small machine")
            .into_iter()
            .map(|h| (h.affinity.map_or(0, NumaMask::bits), h.preferred))
            .collect(),
        Some(ResourceHints::Hints(v)) => v
            .iter()
            .map(|h| (h.affinity.map_or(0, NumaMask::bits), h.preferred))
            .collect(),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn get_topology_hints_request_2_cpus_fit_on_either_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = gu_pod("p", 2000);
    m.register_pod(&p);
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    assert_eq!(listed(&h), vec![(0b01, true), (0b10, true), (0b11, false)]);
}

#[test]
fn get_topology_hints_request_6_cpus_only_socket_1_is_whole_preferred() {
    let dir = tempfile::tempdir().expect("tempdir");
    // CPU 0 reserved: socket 0 has 5 assignable CPUs, so only NUMA 1 alone can hold 6.
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = gu_pod("p", 6000);
    m.register_pod(&p);
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    assert_eq!(listed(&h), vec![(0b10, true), (0b11, false)]);
}

#[test]
fn get_topology_hints_request_more_than_a_socket_is_not_preferred_narrower() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = gu_pod("p", 8000);
    m.register_pod(&p);
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    assert_eq!(listed(&h), vec![(0b11, true)]);
    let p = gu_pod("q", 12_000);
    m.register_pod(&p);
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    assert_eq!(listed(&h), vec![], "11 assignable CPUs: no placement");
    assert!(matches!(h.get("cpu"), Some(ResourceHints::Family(f)) if f.is_empty()));
}

#[test]
fn get_topology_hints_non_guaranteed_pods_have_no_preference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    for p in [
        pod("b", QosClass::Burstable, &[], &[("c", 2000)]),
        gu_pod("frac", 1500),
    ] {
        m.register_pod(&p);
        assert!(m.container_hints(&p.spec, &p.spec.containers[0]).is_empty());
        assert!(m.pod_hints(&p.spec).is_empty());
    }
}

#[test]
fn get_topology_hints_regenerated_for_already_allocated_container() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = gu_pod("p", 2000);
    m.register_pod(&p);
    let hint = TopologyHint::new(NumaMask::from_bits(0b10), true);
    m.allocate_container(&p.spec, &p.spec.containers[0], &hint)
        .expect("fits");
    // Hints now come from the allocated CPUs (socket 1) only.
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    assert_eq!(listed(&h), vec![(0b10, true), (0b11, false)]);
    // A different request for the same container: no placement.
    let bigger = gu_pod("p", 4000);
    m.register_pod(&bigger);
    let h = m.container_hints(&bigger.spec, &bigger.spec.containers[0]);
    assert_eq!(listed(&h), vec![]);
}

#[test]
fn get_pod_topology_hints_use_the_pod_total() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = pod(
        "p",
        QosClass::Guaranteed,
        &[("init", 4000)],
        &[("a", 2000), ("b", 2000)],
    );
    m.register_pod(&p);
    // 4 CPUs for the pod (max of init 4, apps 2+2): either socket.
    assert_eq!(
        listed(&m.pod_hints(&p.spec)),
        vec![(0b01, true), (0b10, true), (0b11, false)]
    );
    let big = pod("q", QosClass::Guaranteed, &[], &[("a", 4000), ("b", 3000)]);
    m.register_pod(&big);
    assert_eq!(listed(&m.pod_hints(&big.spec)), vec![(0b11, true)]);
}

#[test]
fn init_container_cpus_constrain_hints_of_app_containers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = pod(
        "p",
        QosClass::Guaranteed,
        &[("init", 2000)],
        &[("app", 2000)],
    );
    m.register_pod(&p);
    let on_socket_1 = TopologyHint::new(NumaMask::from_bits(0b10), true);
    m.allocate_container(&p.spec, &p.spec.init_containers[0], &on_socket_1)
        .expect("fits");
    // The reusable init CPUs sit on NUMA 1, so every hint must include NUMA 1.
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    assert_eq!(listed(&h), vec![(0b10, true), (0b11, false)]);
}

#[test]
fn hints_stay_compact_on_a_64_numa_machine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let topo = CpuTopology::from_machine_config(&devicelet_topology::MachineConfig::uniform(64, 4))
        .expect("valid");
    let m = static_manager(topo, 1, dir.path());
    let p = pod("p", QosClass::Guaranteed, &[], &[("c", 8000)]);
    m.register_pod(&p);
    let h = m.container_hints(&p.spec, &p.spec.containers[0]);
    let Some(ResourceHints::Family(f)) = h.get("cpu") else {
        panic!("expected a family, got {h:?}");
    };
    assert_eq!(f.min_affinity(), 2);
    assert!(f.contains_preferred(NumaMask::from_bits(0b1100)));
    assert!(!f.contains(NumaMask::from_bits(0b1)), "4 CPUs < 8");
}

fn numa_of(m: &CpuManager, uid: &str, c: &str) -> NumaMask {
    m.cpuset_for(uid, c)
        .iter()
        .fold(NumaMask::EMPTY, |a, cpu| a.or(m.topology().numa_of(cpu)))
}

#[test]
fn single_numa_node_admission_aligns_cpus_through_the_topology_manager() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(static_manager(dual_socket_multi_numa_ht(), 1, dir.path()));
    let numa = m.topology().numa_topology();
    let mut tm = TopologyManager::new(&numa, "single-numa-node", "container", &BTreeMap::new())
        .expect("valid policy");
    tm.add_hint_provider(m.clone());
    for i in 0..4 {
        let p = gu_pod(&format!("p{i}"), 16_000);
        m.register_pod(&p);
        tm.admit(&p.spec).expect("one NUMA node each");
        assert_eq!(numa_of(&m, &p.spec.uid, "c").count(), 1, "pod {i}");
        assert_eq!(
            tm.get_affinity(&p.spec.uid, "c").affinity,
            Some(numa_of(&m, &p.spec.uid, "c"))
        );
    }
    // Every node now has at most 4 free CPUs: 8 cannot be NUMA-aligned.
    let p = gu_pod("late", 8000);
    m.register_pod(&p);
    let err = tm.admit(&p.spec).expect_err("no single node can hold 8");
    assert!(matches!(err, AdmissionError::TopologyAffinity));
    assert_eq!(err.reason(), "TopologyAffinityError");
}

#[test]
fn best_effort_admission_reports_cpu_shortage_as_unexpected_admission_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(static_manager(dual_socket_ht(), 1, dir.path()));
    let mut tm = TopologyManager::new(
        &m.topology().numa_topology(),
        "best-effort",
        "pod",
        &BTreeMap::new(),
    )
    .expect("valid");
    tm.add_hint_provider(m.clone());
    let p = gu_pod("huge", 12_000);
    m.register_pod(&p);
    let err = tm.admit(&p.spec).expect_err("11 assignable");
    assert_eq!(err.reason(), "UnexpectedAdmissionError");
    // As in the kubelet: the merged hint is the default mask (every node), so the aligned
    // step takes all 11 assignable CPUs and the remainder step reports the 1 still missing.
    assert_eq!(
        err.message(),
        "Allocate failed due to not enough cpus available to satisfy request: requested=1, available=0, which is unexpected"
    );
    assert!(
        m.state().assignments.is_empty(),
        "nothing kept after the failure"
    );
    // Without a hint (none policy / scope) the whole request is reported.
    let err = m
        .allocate_container(&p.spec, &p.spec.containers[0], &TopologyHint::default())
        .expect_err("11 assignable");
    assert_eq!(
        err.to_string(),
        "not enough cpus available to satisfy request: requested=12, available=11"
    );
}

#[test]
fn state_round_trips_through_the_real_checkpoint_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = {
        let m = static_manager(dual_socket_ht(), 1, dir.path());
        for (uid, n) in [("a", 2000), ("b", 3000)] {
            let p = gu_pod(uid, n);
            m.register_pod(&p);
            m.allocate_container(&p.spec, &p.spec.containers[0], &TopologyHint::default())
                .expect("fits");
        }
        m.state()
    };
    let bytes = std::fs::read(dir.path().join("cpu_manager_state")).expect("file exists");
    let cp = cpu::decode(&bytes).expect("kubelet-valid checkpoint with checksum");
    assert_eq!(cp.policy_name, "static");
    assert_eq!(cp.default_cpu_set, before.default_cpu_set.to_string());
    let text = String::from_utf8(bytes).expect("utf8");
    assert!(
        text.starts_with("{\"policyName\":\"static\",\"defaultCpuSet\":"),
        "{text}"
    );
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    assert_eq!(m.state(), before);
    assert_eq!(
        m.cpuset_for("a", "c").to_string(),
        before.assignments["a"]["c"].to_string()
    );
    assert_eq!(m.cpuset_for("a", "c").len(), 2);
}

fn start(dir: &std::path::Path) -> Result<CpuManager, CpuManagerError> {
    CpuManager::new(
        dual_socket_ht(),
        &common::static_config(devicelet_cpumanager::ReservedCpus::Count(1)),
        dir,
    )
}

fn write_state(dir: &std::path::Path, policy: &str, default: &str, entries: &[(&str, &str, &str)]) {
    let mut map: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (p, c, s) in entries {
        map.entry(p.to_string())
            .or_default()
            .insert(c.to_string(), s.to_string());
    }
    std::fs::write(
        dir.join("cpu_manager_state"),
        cpu::encode(policy, default, &map),
    )
    .expect("write");
}

#[test]
fn corrupt_state_files_are_refused_with_the_kubelet_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cpu_manager_state");
    std::fs::write(&path, b"{\"policyName\":\"static\",\"defaultCpu").expect("write");
    let err = start(dir.path()).expect_err("truncated");
    let msg = err.to_string();
    assert!(
        msg.starts_with("could not restore state from checkpoint: "),
        "{msg}"
    );
    assert!(
        msg.contains("please drain this node and delete the CPU manager checkpoint file"),
        "{msg}"
    );

    write_state(dir.path(), "static", "0-11", &[]);
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, text.replace("0-11", "0-10")).expect("tamper");
    let err = start(dir.path()).expect_err("checksum mismatch");
    assert!(err.to_string().contains("checksum"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        text.replace("0-11", "0-10"),
        "a refused file is left alone"
    );
}

#[test]
fn state_with_another_policy_name_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_state(dir.path(), "none", "", &[]);
    let err = start(dir.path()).expect_err("policy mismatch");
    assert!(
        err.to_string()
            .contains("configured policy \"static\" differs from state checkpoint policy \"none\""),
        "{err}"
    );
}

#[test]
fn validate_state_requires_default_and_assignments_to_partition_the_cpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_state(dir.path(), "static", "0-5", &[("p", "c", "6-9")]);
    let err = start(dir.path()).expect_err("10,11 are missing");
    assert_eq!(
        err.to_string(),
        "[cpumanager] invalid state: current set of available CPUs \"0-11\" doesn't match with CPUs in state \"0-9\", please drain node and remove policy state file"
    );
    write_state(dir.path(), "static", "0-7", &[("p", "c", "6-11")]);
    let err = start(dir.path()).expect_err("overlap");
    assert!(
        err.to_string()
            .contains("pod: p, container: c cpuset: \"6-11\" overlaps with default cpuset \"0-7\""),
        "{err}"
    );
    write_state(dir.path(), "static", "1-11", &[("p", "c", "0")]);
    let err = start(dir.path()).expect_err("reserved CPU 0 assigned");
    assert!(
        err.to_string()
            .contains("not all reserved cpus: \"0\" are present in defaultCpuSet: \"1-11\""),
        "{err}"
    );
    write_state(dir.path(), "static", "", &[("p", "c", "0-11")]);
    let err = start(dir.path()).expect_err("empty default with assignments");
    assert!(
        err.to_string().contains("default cpuset cannot be empty"),
        "{err}"
    );
    write_state(dir.path(), "static", "", &[]);
    let m = start(dir.path()).expect("empty state is initialised");
    assert_eq!(m.default_cpu_set().to_string(), "0-11");
    let cp = cpu::decode(&std::fs::read(dir.path().join("cpu_manager_state")).expect("read"))
        .expect("valid");
    assert_eq!(cp.default_cpu_set, "0-11", "initialised state is stored");
}

#[test]
fn failed_checkpoint_write_leaves_memory_state_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let path = dir.path().join("cpu_manager_state");
    std::fs::remove_file(&path).expect("rm");
    std::fs::create_dir(&path).expect("a directory where the file should go");
    let p = gu_pod("a", 2000);
    m.register_pod(&p);
    let err = m
        .allocate_container(&p.spec, &p.spec.containers[0], &TopologyHint::default())
        .expect_err("cannot write");
    assert!(matches!(err, CpuManagerError::Write { .. }), "{err}");
    assert!(m.state().assignments.is_empty());
    assert_eq!(m.default_cpu_set().to_string(), "0-11");
}
