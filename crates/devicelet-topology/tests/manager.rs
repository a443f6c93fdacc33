//! Topology Manager construction (`TestNewManager`, `TestManagerScope`), admission through the
//! scopes (`TestAdmit`, `TestContainerCalculateAffinity`, `TestPodCalculateAffinity`,
//! `TestGetAffinity`) with mock providers, spec §4.2 and §4.6.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use devicelet_topology::{
    AdmissionError, ConfigError, ContainerSpec, HintProvider, MachineConfig, NumaMask,
    NumaTopology, PodSpec, PolicyName, ProviderError, ProviderHints, ResourceHints, ScopeName,
    TopologyHint, TopologyManager,
};

fn topo(nodes: usize) -> NumaTopology {
    MachineConfig::uniform(nodes, 2)
        .to_topology()
        .expect("valid machine")
}

fn no_opts() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint::new(
        NumaMask::from_nodes(nodes.iter().copied()).expect("in range"),
        preferred,
    )
}

#[test]
fn new_manager_policy_selection_and_errors() {
    let t = topo(2);
    for (policy, name) in [
        ("best-effort", PolicyName::BestEffort),
        ("restricted", PolicyName::Restricted),
        ("single-numa-node", PolicyName::SingleNumaNode),
        ("none", PolicyName::None),
    ] {
        let m = TopologyManager::new(&t, policy, "container", &no_opts()).expect("valid policy");
        assert_eq!(m.policy().name(), name);
    }
    let err =
        TopologyManager::new(&t, "unknown", "container", &no_opts()).expect_err("unknown policy");
    assert_eq!(err.to_string(), "unknown policy: \"unknown\"");
    let err = TopologyManager::new(&t, "restricted", "container", &opts(&[("bogus", "1")]))
        .expect_err("bad option");
    assert_eq!(err, ConfigError::UnknownOption("bogus".into()));
}

#[test]
fn new_manager_none_ignores_options_and_scope() {
    let t = topo(16);
    let m = TopologyManager::new(&t, "none", "nonsense", &opts(&[("bogus", "x")]))
        .expect("none never fails");
    assert_eq!(m.scope(), None);
}

#[test]
fn new_manager_refuses_more_than_8_numa_nodes_unless_allowed() {
    let t = topo(9);
    let err = TopologyManager::new(&t, "best-effort", "container", &no_opts()).expect_err("9 > 8");
    assert_eq!(
        err.to_string(),
        "unsupported on machines with more than 8 NUMA Nodes"
    );
    TopologyManager::new(&topo(8), "best-effort", "container", &no_opts()).expect("8 is fine");
    let t = topo(64);
    let m = TopologyManager::new(
        &t,
        "single-numa-node",
        "pod",
        &opts(&[("max-allowable-numa-nodes", "64")]),
    )
    .expect("raised limit");
    assert_eq!(m.policy().default_mask().count(), 64);
    let err = TopologyManager::new(
        &t,
        "restricted",
        "pod",
        &opts(&[("max-allowable-numa-nodes", "32")]),
    )
    .expect_err("64 > 32");
    assert_eq!(
        err.to_string(),
        "unsupported on machines with more than 32 NUMA Nodes"
    );
}

#[test]
fn new_manager_prefer_closest_needs_distances() {
    let mut t = topo(2);
    t.distances = None;
    let err = TopologyManager::new(
        &t,
        "best-effort",
        "container",
        &opts(&[("prefer-closest-numa-nodes", "true")]),
    )
    .expect_err("no distances");
    assert_eq!(
        err.to_string(),
        "cannot discover NUMA topology: error getting NUMA distances from cadvisor"
    );
    TopologyManager::new(&t, "best-effort", "container", &no_opts())
        .expect("distances only needed for closest");
}

#[test]
fn manager_scope_selection() {
    let t = topo(2);
    let m = TopologyManager::new(&t, "best-effort", "container", &no_opts()).expect("valid");
    assert_eq!(m.scope(), Some(ScopeName::Container));
    let m = TopologyManager::new(&t, "best-effort", "pod", &no_opts()).expect("valid");
    assert_eq!(m.scope(), Some(ScopeName::Pod));
    let err =
        TopologyManager::new(&t, "best-effort", "node", &no_opts()).expect_err("unknown scope");
    assert_eq!(err.to_string(), "unknown scope: \"node\"");
}

/// Mock provider: fixed hints per container name (and for the pod), records allocations.
#[derive(Default)]
struct Mock {
    container_hints: BTreeMap<String, ProviderHints>,
    pod_hints: ProviderHints,
    fail_allocate_for: Option<String>,
    allocations: Mutex<Vec<(String, TopologyHint)>>,
    label: &'static str,
    log: Option<Arc<Mutex<Vec<String>>>>,
}

impl HintProvider for Mock {
    fn get_topology_hints(&self, _pod: &PodSpec, container: &ContainerSpec) -> ProviderHints {
        self.container_hints
            .get(&container.name)
            .cloned()
            .unwrap_or_default()
    }
    fn get_pod_topology_hints(&self, _pod: &PodSpec) -> ProviderHints {
        self.pod_hints.clone()
    }
    fn allocate(
        &self,
        _pod: &PodSpec,
        container: &ContainerSpec,
        affinity: &TopologyHint,
    ) -> Result<(), ProviderError> {
        if let Some(log) = &self.log {
            log.lock()
                .expect("log lock")
                .push(format!("{}:{}", self.label, container.name));
        }
        if self.fail_allocate_for.as_deref() == Some(container.name.as_str()) {
            return Err("device plugin went away".into());
        }
        self.allocations
            .lock()
            .expect("lock")
            .push((container.name.clone(), *affinity));
        Ok(())
    }
}

fn hints(list: Vec<TopologyHint>) -> ProviderHints {
    ProviderHints::from([("example.com/gpu".to_string(), ResourceHints::Hints(list))])
}

fn pod(init: &[&str], app: &[&str]) -> PodSpec {
    let c = |n: &&str| ContainerSpec {
        name: n.to_string(),
        ..Default::default()
    };
    PodSpec {
        uid: "uid-1".into(),
        namespace: "default".into(),
        name: "p".into(),
        init_containers: init.iter().map(c).collect(),
        containers: app.iter().map(c).collect(),
    }
}

#[test]
fn admit_container_scope_stores_each_containers_hint_and_allocates_in_order() {
    let log = Arc::new(Mutex::new(vec![]));
    let dev = Arc::new(Mock {
        container_hints: BTreeMap::from([
            (
                "init".to_string(),
                hints(vec![h(&[1], true), h(&[0, 1], false)]),
            ),
            ("app".to_string(), hints(vec![h(&[0], true), h(&[1], true)])),
        ]),
        label: "dev",
        log: Some(log.clone()),
        ..Default::default()
    });
    let cpu = Arc::new(Mock {
        container_hints: BTreeMap::from([("app".to_string(), hints(vec![h(&[1], true)]))]),
        label: "cpu",
        log: Some(log.clone()),
        ..Default::default()
    });
    let mut m =
        TopologyManager::new(&topo(2), "restricted", "container", &no_opts()).expect("valid");
    m.add_hint_provider(dev.clone());
    m.add_hint_provider(cpu.clone());
    m.admit(&pod(&["init"], &["app"])).expect("admitted");
    assert_eq!(m.get_affinity("uid-1", "init"), h(&[1], true));
    assert_eq!(m.get_affinity("uid-1", "app"), h(&[1], true));
    assert_eq!(
        m.get_affinity("uid-1", "other"),
        TopologyHint::default(),
        "unknown container: {{nil,false}}"
    );
    assert_eq!(
        *log.lock().expect("lock"),
        vec!["dev:init", "cpu:init", "dev:app", "cpu:app"]
    );
    assert_eq!(
        dev.allocations.lock().expect("lock")[1],
        ("app".to_string(), h(&[1], true))
    );
    m.remove_pod("uid-1");
    assert_eq!(m.get_affinity("uid-1", "app"), TopologyHint::default());
}

#[test]
fn admit_restricted_rejects_non_preferred_with_topology_affinity_error() {
    let dev = Arc::new(Mock {
        container_hints: BTreeMap::from([
            ("a".to_string(), hints(vec![h(&[0], true)])),
            ("b".to_string(), hints(vec![h(&[0, 1], false)])),
        ]),
        ..Default::default()
    });
    let mut m =
        TopologyManager::new(&topo(2), "restricted", "container", &no_opts()).expect("valid");
    m.add_hint_provider(dev.clone());
    let err = m
        .admit(&pod(&[], &["a", "b"]))
        .expect_err("b is not preferred");
    assert!(matches!(err, AdmissionError::TopologyAffinity));
    assert_eq!(err.reason(), "TopologyAffinityError");
    assert_eq!(
        err.message(),
        "Resources cannot be allocated with Topology locality"
    );
    // Container a was allocated before b was rejected and is not rolled back (as upstream).
    assert_eq!(dev.allocations.lock().expect("lock").len(), 1);
    assert_eq!(
        m.get_affinity("uid-1", "b"),
        TopologyHint::default(),
        "rejected hint is not stored"
    );
}

#[test]
fn admit_best_effort_admits_what_restricted_rejects() {
    let dev = Arc::new(Mock {
        container_hints: BTreeMap::from([("b".to_string(), hints(vec![h(&[0, 1], false)]))]),
        ..Default::default()
    });
    let mut m =
        TopologyManager::new(&topo(2), "best-effort", "container", &no_opts()).expect("valid");
    m.add_hint_provider(dev);
    m.admit(&pod(&[], &["b"])).expect("best-effort admits");
    assert_eq!(m.get_affinity("uid-1", "b"), h(&[0, 1], false));
}

#[test]
fn admit_single_numa_node_rejects_cross_numa_and_admits_single() {
    let cross = Arc::new(Mock {
        container_hints: BTreeMap::from([("c".to_string(), hints(vec![h(&[0, 1], true)]))]),
        ..Default::default()
    });
    let mut m =
        TopologyManager::new(&topo(2), "single-numa-node", "container", &no_opts()).expect("valid");
    m.add_hint_provider(cross);
    assert!(matches!(
        m.admit(&pod(&[], &["c"])),
        Err(AdmissionError::TopologyAffinity)
    ));

    let single = Arc::new(Mock {
        container_hints: BTreeMap::from([(
            "c".to_string(),
            hints(vec![h(&[1], true), h(&[0, 1], false)]),
        )]),
        ..Default::default()
    });
    let mut m =
        TopologyManager::new(&topo(2), "single-numa-node", "container", &no_opts()).expect("valid");
    m.add_hint_provider(single);
    m.admit(&pod(&[], &["c"])).expect("single node fits");
    assert_eq!(m.get_affinity("uid-1", "c"), h(&[1], true));
}

#[test]
fn admit_single_numa_node_admits_pods_without_topology_requests() {
    // A BestEffort pod: providers have no opinion (ecosystem A6 row 39 must not reject it).
    let quiet = Arc::new(Mock::default());
    let mut m =
        TopologyManager::new(&topo(2), "single-numa-node", "pod", &no_opts()).expect("valid");
    m.add_hint_provider(quiet);
    m.admit(&pod(&[], &["c"])).expect("no opinions: admitted");
    assert_eq!(m.get_affinity("uid-1", "c"), TopologyHint::any(true));
}

#[test]
fn admit_pod_scope_merges_once_and_stores_the_same_hint_for_every_container() {
    let dev = Arc::new(Mock {
        pod_hints: hints(vec![h(&[0], true), h(&[1], true)]),
        // Container hints would pick differently; pod scope must not ask for them.
        container_hints: BTreeMap::from([("x".to_string(), hints(vec![]))]),
        ..Default::default()
    });
    let cpu = Arc::new(Mock {
        pod_hints: hints(vec![h(&[1], true)]),
        ..Default::default()
    });
    let mut m = TopologyManager::new(&topo(2), "restricted", "pod", &no_opts()).expect("valid");
    m.add_hint_provider(dev.clone());
    m.add_hint_provider(cpu);
    m.admit(&pod(&["i"], &["x", "y"])).expect("admitted");
    for c in ["i", "x", "y"] {
        assert_eq!(m.get_affinity("uid-1", c), h(&[1], true), "{c}");
    }
    let names: Vec<String> = dev
        .allocations
        .lock()
        .expect("lock")
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(names, vec!["i", "x", "y"]);
}

#[test]
fn admit_allocate_error_is_unexpected_admission_error() {
    let dev = Arc::new(Mock {
        fail_allocate_for: Some("c".into()),
        ..Default::default()
    });
    let mut m =
        TopologyManager::new(&topo(2), "best-effort", "container", &no_opts()).expect("valid");
    m.add_hint_provider(dev);
    let err = m.admit(&pod(&[], &["c"])).expect_err("allocate fails");
    assert_eq!(err.reason(), "UnexpectedAdmissionError");
    assert_eq!(
        err.message(),
        "Allocate failed due to device plugin went away, which is unexpected"
    );
}

#[test]
fn admit_none_policy_allocates_everything_with_no_affinity() {
    let log = Arc::new(Mutex::new(vec![]));
    let dev = Arc::new(Mock {
        container_hints: BTreeMap::from([("c".to_string(), hints(vec![]))]),
        label: "dev",
        log: Some(log.clone()),
        ..Default::default()
    });
    let mut m = TopologyManager::new(&topo(2), "none", "container", &no_opts()).expect("valid");
    m.add_hint_provider(dev.clone());
    m.admit(&pod(&["i"], &["c"])).expect("none admits");
    assert_eq!(*log.lock().expect("lock"), vec!["dev:i", "dev:c"]);
    assert!(
        dev.allocations
            .lock()
            .expect("lock")
            .iter()
            .all(|(_, h)| *h == TopologyHint::default())
    );
    assert_eq!(m.get_affinity("uid-1", "c"), TopologyHint::default());
}

fn container(name: &str, restartable: bool, limits: &[(&str, i64)]) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        restartable,
        limits: limits.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[test]
fn get_pod_device_request() {
    use devicelet_topology::pod_effective_limits;
    let g = "example.com/gpu";
    let n = "example.com/nic";
    type RequestCase = (
        &'static str,
        Vec<ContainerSpec>,
        Vec<ContainerSpec>,
        Vec<(&'static str, i64)>,
    );
    let cases: Vec<RequestCase> = vec![
        ("no containers", vec![], vec![], vec![]),
        (
            "app containers are summed",
            vec![],
            vec![
                container("a", false, &[(g, 1)]),
                container("b", false, &[(g, 2), (n, 1)]),
            ],
            vec![(g, 3), (n, 1)],
        ),
        (
            "init container larger than the app sum wins",
            vec![container("i", false, &[(g, 4)])],
            vec![
                container("a", false, &[(g, 1)]),
                container("b", false, &[(g, 2)]),
            ],
            vec![(g, 4)],
        ),
        (
            "init container smaller than the app sum loses",
            vec![container("i", false, &[(g, 2)])],
            vec![container("a", false, &[(g, 3)])],
            vec![(g, 3)],
        ),
        (
            "sidecar adds to the app sum",
            vec![container("s", true, &[(g, 1)])],
            vec![container("a", false, &[(g, 2)])],
            vec![(g, 3)],
        ),
        (
            "regular init after a sidecar counts the sidecar",
            vec![
                container("s", true, &[(g, 1)]),
                container("i", false, &[(g, 3)]),
            ],
            vec![container("a", false, &[(g, 1)])],
            vec![(g, 4)],
        ),
        (
            "regular init before a sidecar does not count it",
            vec![
                container("i", false, &[(g, 3)]),
                container("s", true, &[(g, 1)]),
            ],
            vec![container("a", false, &[(g, 1)])],
            vec![(g, 3)],
        ),
        (
            "zero limits are kept",
            vec![],
            vec![container("a", false, &[(g, 0)])],
            vec![(g, 0)],
        ),
    ];
    for (name, init, app, expected) in cases {
        let pod = PodSpec {
            init_containers: init,
            containers: app,
            ..Default::default()
        };
        let expected: BTreeMap<String, i64> = expected
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(pod_effective_limits(&pod), expected, "{name}");
    }
}
