//! Static policy behaviour, mirrored from upstream `policy_static_test.go` (`TestStaticPolicyAdd`,
//! `TestStaticPolicyReuseCPUs`, `TestStaticPolicyRemove`, `TestNewStaticPolicy`) and
//! `cpu_manager_test.go` (reserved CPUs), run through the real checkpoint file in a temp dir.

mod common;

use std::collections::BTreeMap;

use common::{
    dual_socket_ht, dual_socket_multi_numa_ht, gu_pod, pod, set, single_socket_ht, static_config,
    static_manager,
};
use devicelet_checkpoint::cpu;
use devicelet_cpumanager::{
    CpuManager, CpuManagerConfig, CpuManagerError, CpuTopology, QosClass, ReservedCpus,
};
use devicelet_topology::{NumaMask, TopologyHint};

/// Writes a kubelet checkpoint for the static policy before the manager starts.
fn seed_state(dir: &std::path::Path, default: &str, entries: &[(&str, &str, &str)]) {
    let mut map: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (p, c, s) in entries {
        map.entry(p.to_string())
            .or_default()
            .insert(c.to_string(), s.to_string());
    }
    std::fs::write(
        dir.join(cpu::CPU_CHECKPOINT_FILE),
        cpu::encode("static", default, &map),
    )
    .expect("write seed state");
}

fn alloc(
    m: &CpuManager,
    p: &devicelet_cpumanager::PodCpuInfo,
    hint: TopologyHint,
) -> Result<(), CpuManagerError> {
    m.register_pod(p);
    for c in p.spec.all_containers() {
        m.allocate_container(&p.spec, c, &hint)?;
    }
    Ok(())
}

fn no_hint() -> TopologyHint {
    TopologyHint::default()
}

#[test]
fn gu_pod_single_core_single_socket_ht_expect_alloc_one_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(single_socket_ht(), 1, dir.path());
    assert_eq!(m.reserved_cpus().to_string(), "0");
    alloc(&m, &gu_pod("pod1", 1000), no_hint()).expect("fits");
    assert_eq!(m.cpuset_for("pod1", "c").to_string(), "4");
    assert_eq!(m.default_cpu_set().to_string(), "0-3,5-7");
}

#[test]
fn gu_pod_single_core_single_socket_ht_expect_error_not_enough_cpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(single_socket_ht(), 1, dir.path());
    let err = alloc(&m, &gu_pod("pod1", 8000), no_hint()).expect_err("8 > 7 available");
    assert_eq!(
        err.to_string(),
        "not enough cpus available to satisfy request: requested=8, available=7"
    );
    assert_eq!(m.default_cpu_set().to_string(), "0-7", "nothing taken");
    assert!(m.state().assignments.is_empty());
}

#[test]
fn gu_pod_multiple_cores_single_socket_ht_expect_alloc_one_core() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_state(
        dir.path(),
        "0-1,4-5",
        &[("fakePod", "fakeContainer100", "2-3,6-7")],
    );
    let m = static_manager(single_socket_ht(), 1, dir.path());
    alloc(&m, &gu_pod("pod1", 2000), no_hint()).expect("fits");
    assert_eq!(m.cpuset_for("pod1", "c").to_string(), "1,5");
}

#[test]
fn gu_pod_multiple_cores_dual_socket_ht_expect_alloc_one_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_state(
        dir.path(),
        "0-1,3-11",
        &[("fakePod", "fakeContainer100", "2")],
    );
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    alloc(&m, &gu_pod("pod1", 6000), no_hint()).expect("fits");
    assert_eq!(m.cpuset_for("pod1", "c").to_string(), "1,3,5,7,9,11");
}

#[test]
fn gu_pod_multiple_cores_dual_socket_ht_expect_alloc_three_cores() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_state(
        dir.path(),
        "0,2-4,6-11",
        &[("fakePod", "fakeContainer100", "1,5")],
    );
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    alloc(&m, &gu_pod("pod1", 6000), no_hint()).expect("fits");
    assert_eq!(m.cpuset_for("pod1", "c").to_string(), "2-4,8-10");
}

#[test]
fn non_guaranteed_or_fractional_cpu_containers_use_the_shared_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    alloc(&m, &gu_pod("frac", 1500), no_hint()).expect("no exclusive CPUs needed");
    alloc(
        &m,
        &pod("burst", QosClass::Burstable, &[], &[("c", 2000)]),
        no_hint(),
    )
    .expect("no exclusive CPUs needed");
    alloc(
        &m,
        &pod("be", QosClass::BestEffort, &[], &[("c", 0)]),
        no_hint(),
    )
    .expect("ok");
    assert!(m.state().assignments.is_empty());
    for uid in ["frac", "burst", "be", "never-registered"] {
        assert_eq!(m.cpuset_for(uid, "c").to_string(), "0-11", "{uid}");
    }
    alloc(&m, &gu_pod("gu", 2000), no_hint()).expect("fits");
    assert_eq!(
        m.cpuset_for("burst", "c").to_string(),
        m.default_cpu_set().to_string(),
        "shared pool shrinks with exclusive allocations"
    );
    assert!(
        !m.default_cpu_set()
            .contains(m.cpuset_for("gu", "c").iter().next().unwrap_or(99))
    );
}

#[test]
fn reserved_system_cpus_are_never_handed_out_exclusively() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = CpuManager::new(
        dual_socket_ht(),
        &static_config(ReservedCpus::List("0,6".into())),
        dir.path(),
    )
    .expect("starts");
    alloc(&m, &gu_pod("big", 10_000), no_hint()).expect("10 of 12, reserved excluded");
    assert_eq!(m.cpuset_for("big", "c").to_string(), "1-5,7-11");
    assert_eq!(
        m.default_cpu_set().to_string(),
        "0,6",
        "reserved stay in the shared pool"
    );
    let err = alloc(&m, &gu_pod("one-more", 1000), no_hint()).expect_err("only reserved left");
    assert_eq!(
        err.to_string(),
        "not enough cpus available to satisfy request: requested=1, available=0"
    );
}

#[test]
fn reserved_count_is_taken_by_topology_whole_core_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(single_socket_ht(), 2, dir.path());
    assert_eq!(m.reserved_cpus().to_string(), "0,4");
}

#[test]
fn bad_static_configuration_gives_the_kubelet_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mk = |cfg: CpuManagerConfig| CpuManager::new(single_socket_ht(), &cfg, dir.path());
    let err = mk(static_config(ReservedCpus::Count(0))).expect_err("zero reserved");
    assert_eq!(
        err.to_string(),
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    let err = mk(static_config(ReservedCpus::List("9".into()))).expect_err("not on machine");
    assert!(
        matches!(err, CpuManagerError::ReservedNotOnMachine { .. }),
        "{err}"
    );
    let err = mk(static_config(ReservedCpus::List("a-b".into()))).expect_err("bad list");
    assert!(matches!(err, CpuManagerError::BadReservedList(..)), "{err}");
    let err = mk(static_config(ReservedCpus::Count(9))).expect_err("more than the machine");
    assert!(
        matches!(err, CpuManagerError::ReserveFailed { want: 9, .. }),
        "{err}"
    );
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy = "dynamic".into();
    assert_eq!(
        mk(cfg).expect_err("unknown").to_string(),
        "unknown policy: \"dynamic\""
    );
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy_options
        .insert("align-by-socket".into(), "true".into());
    assert_eq!(
        mk(cfg).expect_err("alpha gate off").to_string(),
        "CPU Manager Policy Alpha-level Options not enabled, but option \"align-by-socket\" provided"
    );
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy_options
        .insert("no-such-option".into(), "true".into());
    assert!(matches!(
        mk(cfg).expect_err("unknown"),
        CpuManagerError::UnknownOption(_)
    ));
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy = "none".into();
    cfg.policy_options
        .insert("full-pcpus-only".into(), "true".into());
    assert_eq!(
        mk(cfg).expect_err("none takes no options").to_string(),
        "None policy: received unsupported options=map[full-pcpus-only:true]"
    );
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy_options
        .insert("full-pcpus-only".into(), "yes".into());
    assert!(matches!(
        mk(cfg).expect_err("bad bool"),
        CpuManagerError::BadOptionValue { .. }
    ));
}

#[test]
fn single_socket_ht_init_container_cpus_are_reused_by_app_containers() {
    // Upstream "SingleSocketHT, DeAllocOneInitContainer" with the reserved CPU on the last core.
    let dir = tempfile::tempdir().expect("tempdir");
    let m = CpuManager::new(
        single_socket_ht(),
        &static_config(ReservedCpus::List("3".into())),
        dir.path(),
    )
    .expect("starts");
    let p = pod(
        "pod1",
        QosClass::Guaranteed,
        &[("initContainer-0", 4000)],
        &[("appContainer-0", 2000)],
    );
    alloc(&m, &p, no_hint()).expect("fits");
    assert_eq!(
        m.cpuset_for("pod1", "initContainer-0").to_string(),
        "0-1,4-5"
    );
    assert_eq!(m.cpuset_for("pod1", "appContainer-0").to_string(), "0,4");
    assert_eq!(m.default_cpu_set().to_string(), "2-3,6-7");
    m.remove_container("pod1", "initContainer-0")
        .expect("remove");
    assert_eq!(
        m.default_cpu_set().to_string(),
        "1-3,5-7",
        "CPUs still used by the app container stay out of the pool"
    );
    m.remove_pod("pod1").expect("remove pod");
    assert_eq!(m.default_cpu_set().to_string(), "0-7");
}

#[test]
fn sidecar_cpus_are_not_reused_by_app_containers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let mut p = pod(
        "pod1",
        QosClass::Guaranteed,
        &[("sidecar", 2000)],
        &[("app", 2000)],
    );
    p.spec.init_containers[0].restartable = true;
    alloc(&m, &p, no_hint()).expect("fits");
    let a = m.cpuset_for("pod1", "sidecar");
    let b = m.cpuset_for("pod1", "app");
    assert!(a.iter().all(|c| !b.contains(c)), "{a} vs {b}");
}

#[test]
fn allocation_follows_the_numa_hint_of_the_topology_manager() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_multi_numa_ht(), 1, dir.path());
    let node2 = TopologyHint::new(NumaMask::from_bits(0b0100), true);
    alloc(&m, &gu_pod("a", 4000), node2).expect("fits");
    assert_eq!(m.cpuset_for("a", "c").to_string(), "20-21,60-61");
    // Node 0 has 19 free CPUs (cpu 0 is reserved): 19 aligned, the rest from elsewhere.
    let node0 = TopologyHint::new(NumaMask::from_bits(0b0001), false);
    alloc(&m, &gu_pod("b", 22_000), node0).expect("fits");
    let got = set(&m.cpuset_for("b", "c").to_string());
    let node0_cpus = set("1-9,40-49");
    assert!(node0_cpus.is_subset_of(&got), "all of node 0 first: {got}");
    assert_eq!(got.len(), 22);
}

#[test]
fn removing_a_container_returns_its_cpus_to_the_default_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    alloc(&m, &gu_pod("a", 4000), no_hint()).expect("fits");
    assert_eq!(m.default_cpu_set().len(), 8);
    m.remove_container("a", "c").expect("remove");
    assert_eq!(m.default_cpu_set().to_string(), "0-11");
    m.remove_container("a", "c")
        .expect("removing twice is a no-op");
}

#[test]
fn full_pcpus_only_rejects_requests_that_are_not_whole_cores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy_options
        .insert("full-pcpus-only".into(), "true".into());
    let m = CpuManager::new(single_socket_ht(), &cfg, dir.path()).expect("starts");
    let err = alloc(&m, &gu_pod("odd", 3000), no_hint()).expect_err("3 on SMT-2");
    assert_eq!(
        err.to_string(),
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"
    );
    alloc(&m, &gu_pod("even", 4000), no_hint()).expect("two whole cores");
    assert_eq!(m.cpuset_for("even", "c").to_string(), "1-2,5-6");
    alloc(&m, &gu_pod("last-core", 2000), no_hint()).expect("core 3 is whole");
    assert_eq!(m.cpuset_for("last-core", "c").to_string(), "3,7");
    // Only CPU 4 (sibling of the reserved CPU 0) is left: no whole core.
    let err = alloc(&m, &gu_pod("more", 2000), no_hint()).expect_err("no whole core left");
    assert_eq!(
        err.to_string(),
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 0, requested CPUs = 2, CPUs per core = 2"
    );
}

#[test]
fn none_policy_gives_every_cpu_and_no_hints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = CpuManagerConfig {
        policy: "none".into(),
        reserved: ReservedCpus::Count(0),
        policy_options: BTreeMap::new(),
        feature_gates: devicelet_topology::FeatureGates::default(),
        topology_manager_policy: "none".into(),
    };
    let m = CpuManager::new(dual_socket_ht(), &cfg, dir.path()).expect("starts");
    alloc(&m, &gu_pod("a", 2000), no_hint()).expect("none allocates nothing");
    assert_eq!(m.cpuset_for("a", "c").to_string(), "0-11");
    assert!(
        m.container_hints(
            &gu_pod("a", 2000).spec,
            &gu_pod("a", 2000).spec.containers[0]
        )
        .is_empty()
    );
    let file = std::fs::read(dir.path().join(cpu::CPU_CHECKPOINT_FILE)).expect("state written");
    let cp = cpu::decode(&file).expect("valid checkpoint");
    assert_eq!(
        (cp.policy_name.as_str(), cp.default_cpu_set.as_str()),
        ("none", "")
    );
}

#[test]
fn topology_from_machine_config_feeds_the_manager() {
    let dir = tempfile::tempdir().expect("tempdir");
    let topo = CpuTopology::from_machine_config(&devicelet_topology::MachineConfig::uniform(2, 4))
        .expect("valid");
    let m = static_manager(topo, 1, dir.path());
    alloc(&m, &gu_pod("a", 4000), no_hint()).expect("fits");
    assert_eq!(
        m.cpuset_for("a", "c").to_string(),
        "4-7",
        "a whole free NUMA node"
    );
}

#[test]
fn reserved_cpus_follow_kubelet_configuration_fields() {
    assert_eq!(
        ReservedCpus::from_kubelet_config(Some("0,64"), Some("500m"), None).expect("valid"),
        ReservedCpus::List("0,64".into())
    );
    assert_eq!(
        ReservedCpus::from_kubelet_config(Some(""), Some("500m"), Some("1")).expect("valid"),
        ReservedCpus::Count(2),
        "1.5 CPUs round up to 2"
    );
    assert_eq!(
        ReservedCpus::from_kubelet_config(None, None, None).expect("valid"),
        ReservedCpus::Count(0)
    );
    assert!(ReservedCpus::from_kubelet_config(None, Some("lots"), None).is_err());
}

#[test]
fn pod_scope_admission_places_init_and_app_containers_on_one_numa_node() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(static_manager(dual_socket_multi_numa_ht(), 1, dir.path()));
    let mut tm = devicelet_topology::TopologyManager::new(
        &m.topology().numa_topology(),
        "single-numa-node",
        "pod",
        &BTreeMap::new(),
    )
    .expect("valid");
    tm.add_hint_provider(m.clone());
    let p = pod(
        "p",
        QosClass::Guaranteed,
        &[("init", 8000)],
        &[("a", 4000), ("b", 4000)],
    );
    m.register_pod(&p);
    tm.admit(&p.spec).expect("8 CPUs fit on one node");
    let hint = tm.get_affinity("p", "a");
    let node_cpus = m
        .topology()
        .cpus_in_numa_mask(hint.affinity.expect("single node"));
    for c in ["init", "a", "b"] {
        let got = set(&m.cpuset_for("p", c).to_string());
        assert!(
            got.is_subset_of(&node_cpus),
            "{c}: {got} not on {node_cpus}"
        );
    }
    let a = m.cpuset_for("p", "a");
    let b = m.cpuset_for("p", "b");
    assert!(
        a.iter().all(|c| !b.contains(c)),
        "apps split the init CPUs: {a} / {b}"
    );
    assert_eq!(
        set(&m.cpuset_for("p", "init").to_string()),
        set(&a.to_string()).union(&set(&b.to_string()))
    );
}

#[test]
fn strict_cpu_reservation_keeps_reserved_cpus_out_of_the_checkpointed_shared_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = static_config(ReservedCpus::List("0,4".into()));
    cfg.policy_options
        .insert("strict-cpu-reservation".into(), "true".into());
    let m = CpuManager::new(single_socket_ht(), &cfg, dir.path()).expect("starts");
    assert_eq!(m.default_cpu_set().to_string(), "1-3,5-7");
    let bytes = std::fs::read(m.state_file()).expect("state file");
    let text = String::from_utf8(bytes).expect("utf8");
    assert!(
        text.starts_with("{\"policyName\":\"static\",\"defaultCpuSet\":\"1-3,5-7\","),
        "{text}"
    );
    alloc(&m, &gu_pod("a", 2000), no_hint()).expect("fits");
    assert_eq!(m.cpuset_for("a", "c").to_string(), "1,5");
    // A best-effort container runs on the shared pool, without the reserved CPUs.
    assert_eq!(m.cpuset_for("be", "c").to_string(), "2-3,6-7");
    m.remove_container("a", "c").expect("remove");
    assert_eq!(m.default_cpu_set().to_string(), "1-3,5-7");
    drop(m);

    // The same file under the non-strict policy lacks the reserved CPUs: refused.
    let plain = static_config(ReservedCpus::List("0,4".into()));
    let err = CpuManager::new(single_socket_ht(), &plain, dir.path()).expect_err("invalid");
    assert_eq!(
        err.to_string(),
        "[cpumanager] invalid state: not all reserved cpus: \"0,4\" are present in defaultCpuSet: \"1-3,5-7\", please drain node and remove policy state file"
    );
    // And a non-strict file under the strict policy holds them: refused too.
    let dir = tempfile::tempdir().expect("tempdir");
    drop(CpuManager::new(single_socket_ht(), &plain, dir.path()).expect("starts"));
    let err = CpuManager::new(single_socket_ht(), &cfg, dir.path()).expect_err("invalid");
    assert_eq!(
        err.to_string(),
        "[cpumanager] invalid state: some of strictly reserved cpus: \"0,4\" are present in defaultCpuSet: \"0-7\", please drain node and remove policy state file"
    );
}

#[test]
fn align_by_socket_prefers_socket_aligned_hints_and_takes_from_the_socket() {
    // 2 sockets × 2 NUMA nodes, 10 cores per node, SMT-2 (nodes 0,1 on socket 0).
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = static_config(ReservedCpus::Count(1));
    cfg.policy_options
        .insert("align-by-socket".into(), "true".into());
    cfg.feature_gates.set("CPUManagerPolicyAlphaOptions", true);
    let m = CpuManager::new(dual_socket_multi_numa_ht(), &cfg, dir.path()).expect("starts");
    let pod = gu_pod("a", 4000);
    m.register_pod(&pod);
    let hints = match m
        .container_hints(&pod.spec, &pod.spec.containers[0])
        .remove("cpu")
    {
        Some(devicelet_topology::ResourceHints::Hints(h)) => h,
        other => panic!("explicit hints expected, got {other:?}"),
    };
    let preferred: Vec<Vec<usize>> = hints
        .iter()
        .filter(|h| h.preferred)
        .filter_map(|h| h.affinity.map(|a| a.nodes().collect()))
        .collect();
    // Single nodes, plus the two same-socket pairs.
    assert_eq!(
        preferred,
        vec![vec![0], vec![1], vec![2], vec![3], vec![0, 1], vec![2, 3]]
    );
    // Hint node 3 alone: the aligned CPUs are socket 1's (nodes 2 and 3), and the packed
    // order starts with node 2 (without the option they would be 30-31,70-71).
    let hint = TopologyHint {
        affinity: NumaMask::from_nodes([3]).ok(),
        preferred: true,
    };
    alloc(&m, &pod, hint).expect("fits");
    assert_eq!(m.cpuset_for("a", "c").to_string(), "20-21,60-61");
    // With single-numa-node the option is refused.
    let mut cfg2 = cfg.clone();
    cfg2.topology_manager_policy = "single-numa-node".into();
    let dir = tempfile::tempdir().expect("tempdir");
    let err = CpuManager::new(dual_socket_multi_numa_ht(), &cfg2, dir.path()).expect_err("refused");
    assert!(
        err.to_string()
            .starts_with("Topolgy manager single-numa-node"),
        "{err}"
    );
}
