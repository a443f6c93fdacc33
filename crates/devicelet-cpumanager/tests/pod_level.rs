//! Pod-level resource management (KEP-5526, `PodLevelResourceManagers`): the static policy's
//! `AllocatePod`, pod hints with the empty-shared-pool check, release with the last container,
//! and the kubelet's `cpu_manager_state` layout v3 (a file written by the kubelet v1.36.3 with
//! the gate on, from the resource-manager oracle in `interop/resourcemanagers`).

mod common;

use std::collections::BTreeMap;

use common::{set, single_socket_ht, static_config};
use devicelet_checkpoint::cpu::{self, CpuChecksumStatus};
use devicelet_cpumanager::pod::{PodLevelGates, PodLevelResources};
use devicelet_cpumanager::{
    CheckpointFile, CpuManager, CpuManagerError, PodCpuInfo, QosClass, ReservedCpus,
};
use devicelet_topology::{ContainerSpec, PodSpec, ResourceHints, TopologyHint};

const KUBELET_FILE: &[u8] = include_bytes!("fixtures/kubelet_pod_level_cpu_manager_state");

#[test]
fn kubelet_pod_level_state_file_loads_and_is_written_back_byte_for_byte() {
    let cp = cpu::decode_v3(KUBELET_FILE).expect("the kubelet's v3 file verifies");
    assert_eq!(cp.checksum_status, CpuChecksumStatus::Verified);
    let pods = cp.pod_entries.expect("pod entries");
    assert_eq!(pods.len(), 3);
    assert_eq!(pods["0000000b-0000-4000-8000-000000000006"], "8-11,40-43");
    // With the gate off the kubelet reads v2, whose checksum does not cover podEntries.
    assert!(cpu::decode(KUBELET_FILE).is_err());

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("cpu_manager_state"), KUBELET_FILE).expect("write");
    let file = CheckpointFile::new(dir.path(), "static").with_pod_level(true);
    let state = file.load().expect("loads").expect("present");
    assert_eq!(
        state.pod_entries["0000000b-0000-4000-8000-00000000000e"],
        set("3,34-35")
    );
    file.store(&state).expect("store");
    assert_eq!(
        std::fs::read(dir.path().join("cpu_manager_state")).expect("read"),
        KUBELET_FILE
    );
    // devicelet with the gate off refuses it, as the kubelet does (checksum mismatch).
    assert!(CheckpointFile::new(dir.path(), "static").load().is_err());
}

#[test]
fn a_v3_file_without_pod_entries_differs_from_v2_only_in_its_checksum() {
    let entries = BTreeMap::from([(
        "pod".to_string(),
        BTreeMap::from([("c".to_string(), "1".to_string())]),
    )]);
    let v2 = String::from_utf8(cpu::encode("static", "0,2-7", &entries)).expect("utf8");
    let v3 = String::from_utf8(
        cpu::encode_v3("static", "0,2-7", &entries, &BTreeMap::new()).expect("encodes"),
    )
    .expect("utf8");
    let body = |s: &str| s.split(",\"checksum\"").next().map(str::to_owned);
    assert_eq!(body(&v2), body(&v3));
    assert_ne!(v2, v3);
    assert!(
        cpu::spew_text_v3("static", "0,2-7", None, &BTreeMap::from([("p".into(), "1-2".into())]))
            .expect("spew")
            .contains("PodEntries:(state.PodCPUAssignments)map[p:{CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})map[1:{} 2:{}]}}]")
    );
}

fn gates_on() -> devicelet_topology::FeatureGates {
    let mut g = devicelet_topology::FeatureGates::default();
    g.set("PodLevelResources", true);
    g.set("PodLevelResourceManagers", true);
    g
}

fn manager(dir: &std::path::Path, on: bool) -> CpuManager {
    let mut config = static_config(ReservedCpus::Count(1));
    if on {
        config.feature_gates = gates_on();
    }
    CpuManager::new(single_socket_ht(), &config, dir).expect("manager starts")
}

fn spec(name: &str, restartable: bool) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        limits: BTreeMap::new(),
        restartable,
    }
}

/// A Guaranteed pod-level pod with `cpus` whole CPUs; `exclusive` names the containers that are
/// Guaranteed on their own with the given CPU requests (millis), the others share.
fn pod_level_pod(
    uid: &str,
    cpus: i64,
    init: &[(&str, bool)],
    apps: &[&str],
    exclusive: &[(&str, i64)],
) -> PodCpuInfo {
    PodCpuInfo {
        spec: PodSpec {
            uid: uid.into(),
            namespace: "default".into(),
            name: uid.into(),
            init_containers: init.iter().map(|(n, r)| spec(n, *r)).collect(),
            containers: apps.iter().map(|n| spec(n, false)).collect(),
        },
        qos: QosClass::Burstable,
        cpu_requests_millis: exclusive.iter().map(|(n, m)| (n.to_string(), *m)).collect(),
        pod_level: Some(PodLevelResources {
            set: true,
            qos: QosClass::Guaranteed,
            cpu_request_millis: Some(cpus * 1000),
            memory_requests: Some(BTreeMap::new()),
        }),
        equivalent_guaranteed: exclusive.iter().map(|(n, _)| n.to_string()).collect(),
    }
}

fn no_hint() -> TopologyHint {
    TopologyHint::default()
}

#[test]
fn assign_pod_takes_one_set_and_splits_it_among_the_containers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), true);
    let info = pod_level_pod(
        "p",
        4,
        &[("side", true), ("init", false)],
        &["a", "b"],
        &[("side", 1000), ("a", 2000)],
    );
    m.register_pod(&info);
    assert!(m.manages_at_pod_level("p"));
    m.assign_pod(&info.spec, &no_hint()).expect("allocates");
    let state = m.state();
    let pod_set = state.pod_entries["p"].clone();
    assert_eq!(pod_set.len(), 4);
    assert!(!pod_set.intersects(&state.default_cpu_set));
    let got = |c: &str| state.get("p", c).cloned().expect("assigned");
    // The sidecar (started first) keeps its CPU for good; the regular init container after it
    // runs on the rest of the pod's CPUs.
    assert_eq!(got("side").len(), 1);
    assert_eq!(got("init"), pod_set.difference(&got("side")));
    // The app container with its own CPUs takes two of the rest; b shares the remaining one.
    assert_eq!(got("a").len(), 2);
    assert_eq!(
        got("b"),
        pod_set.difference(&got("side")).difference(&got("a"))
    );
    assert_eq!(got("b").len(), 1);

    // The pod's CPUs come back with its last container only.
    let before = m.default_cpu_set();
    for c in ["init", "side", "a"] {
        m.remove_container("p", c).expect("remove");
        assert_eq!(m.default_cpu_set(), before);
    }
    m.remove_container("p", "b").expect("remove");
    assert!(m.state().pod_entries.is_empty());
    assert_eq!(m.default_cpu_set().len(), before.len() + 4);
}

#[test]
fn an_empty_shared_pool_is_refused_by_the_hints_and_by_the_allocation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), true);
    let info = pod_level_pod("p", 2, &[], &["a", "b"], &[("a", 2000)]);
    m.register_pod(&info);
    let hints = m.pod_hints(&info.spec);
    assert_eq!(hints.get("cpu"), Some(&ResourceHints::Hints(vec![])));
    match m.assign_pod(&info.spec, &no_hint()) {
        Err(CpuManagerError::EmptyPodSharedPool(text)) => assert_eq!(
            text,
            "pod rejected, sum of exclusive container cpu requests equals pod budget, leaving no cpus for shared containers"
        ),
        other => panic!("{other:?}"),
    }
    assert!(m.state().assignments.is_empty());
}

#[test]
fn with_the_gate_off_a_pod_with_pod_level_resources_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), false);
    let mut info = pod_level_pod("p", 2, &[], &["a"], &[("a", 2000)]);
    // Guaranteed on the containers' own amounts too: still skipped, as the kubelet does.
    info.qos = QosClass::Guaranteed;
    m.register_pod(&info);
    assert!(!m.manages_at_pod_level("p"));
    assert!(m.pod_hints(&info.spec).is_empty());
    assert!(
        m.container_hints(&info.spec, &info.spec.containers[0])
            .is_empty()
    );
    m.assign_container(&info.spec, &info.spec.containers[0], &no_hint())
        .expect("nothing to do");
    assert!(m.state().assignments.is_empty());
    // The pod-level amounts give the QoS class under PodLevelResources (on by default).
    assert_eq!(
        info.qos_with(PodLevelGates::default()),
        QosClass::Guaranteed
    );
    assert_eq!(
        info.pod_guaranteed_cpus(),
        2,
        "podGuaranteedCPUs without the manager gate"
    );
}

#[test]
fn under_the_container_scope_only_containers_guaranteed_on_their_own_get_cpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), true);
    let mut info = pod_level_pod("p", 4, &[], &["a", "b"], &[("a", 2000)]);
    info.cpu_requests_millis.insert("b".into(), 1000);
    m.register_pod(&info);
    m.assign_container(&info.spec, &info.spec.containers[0], &no_hint())
        .expect("a");
    m.assign_container(&info.spec, &info.spec.containers[1], &no_hint())
        .expect("b");
    let state = m.state();
    assert_eq!(state.get("p", "a").map(|s| s.len()), Some(2));
    assert_eq!(
        state.get("p", "b"),
        None,
        "b's requests differ from its limits"
    );
    assert!(state.pod_entries.is_empty());
}
