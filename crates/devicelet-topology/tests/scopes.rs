//! Spec §4.6 scope tables, named after the upstream tests: `TestContainerAccumulateProvidersHints`
//! and `TestContainerCalculateAffinity` (`tm/scope_container_test.go`),
//! `TestPodAccumulateProvidersHints` and `TestPodCalculateAffinity` (`tm/scope_pod_test.go`),
//! and `TestAdmit` (`tm/topology_manager_test.go`), which runs every row under both scopes.
//!
//! They go through [`PodAdmission`], the scope logic devicelet's daemon admits with too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use devicelet_topology::{
    AdmissionError, ContainerSpec, HintMerger, HintProvider, MachineConfig, NumaMask, PodAdmission,
    PodSpec, ProviderError, ProviderHints, ResourceHints, ScopeName, TopologyHint, TopologyManager,
};

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint::new(
        NumaMask::from_nodes(nodes.iter().copied()).expect("in range"),
        preferred,
    )
}

/// A provider answering the same map for every container and for the pod, as upstream's
/// `mockHintProvider` does. Go's nil map and empty map both mean "no preference"; here both
/// are the empty map.
struct Fixed(ProviderHints);

impl HintProvider for Fixed {
    fn get_topology_hints(&self, _pod: &PodSpec, _c: &ContainerSpec) -> ProviderHints {
        self.0.clone()
    }
    fn get_pod_topology_hints(&self, _pod: &PodSpec) -> ProviderHints {
        self.0.clone()
    }
    fn allocate(
        &self,
        _pod: &PodSpec,
        _c: &ContainerSpec,
        _affinity: &TopologyHint,
    ) -> Result<(), ProviderError> {
        Ok(())
    }
}

/// A provider map from (resource, hints); `None` hints = `res -> nil`.
fn answer(entries: &[(&str, Option<Vec<TopologyHint>>)]) -> ProviderHints {
    entries
        .iter()
        .map(|(r, hints)| {
            let value = match hints {
                None => ResourceHints::NoPreference,
                Some(list) => ResourceHints::Hints(list.clone()),
            };
            (r.to_string(), value)
        })
        .collect()
}

fn zero() -> Vec<TopologyHint> {
    vec![TopologyHint::default()]
}

fn pod() -> PodSpec {
    PodSpec {
        uid: "pod-uid".into(),
        namespace: "default".into(),
        name: "pod".into(),
        init_containers: vec![],
        containers: vec![ContainerSpec {
            name: "c".into(),
            ..Default::default()
        }],
    }
}

fn manager(policy: &str, scope: &str, providers: &[ProviderHints]) -> TopologyManager {
    let numa = MachineConfig::uniform(2, 2)
        .to_topology()
        .expect("valid machine");
    let mut m = TopologyManager::new(&numa, policy, scope, &BTreeMap::new()).expect("valid");
    for p in providers {
        m.add_hint_provider(Arc::new(Fixed(p.clone())));
    }
    m
}

/// Shared rows of `Test{Container,Pod}AccumulateProvidersHints`: providers, expected list.
fn accumulate_rows() -> Vec<(&'static str, Vec<ProviderHints>, Vec<ProviderHints>)> {
    let one = |r: &str| answer(&[(r, Some(zero()))]);
    vec![
        ("TopologyHint not set", vec![], vec![]),
        (
            "HintProvider returns empty non-nil map[string][]TopologyHint",
            vec![ProviderHints::new()],
            vec![ProviderHints::new()],
        ),
        (
            "HintProvider returns - nil map[string][]TopologyHint from provider",
            vec![answer(&[("resource", None)])],
            vec![answer(&[("resource", None)])],
        ),
        (
            "2 HintProviders with 1 resource returns hints",
            vec![one("resource1"), one("resource2")],
            vec![one("resource1"), one("resource2")],
        ),
        (
            "2 HintProviders 1 with 1 resource 1 with nil hints",
            vec![one("resource1"), ProviderHints::new()],
            vec![one("resource1"), ProviderHints::new()],
        ),
        (
            "2 HintProviders 1 with 1 resource 1 empty hints",
            vec![one("resource1"), ProviderHints::new()],
            vec![one("resource1"), ProviderHints::new()],
        ),
        (
            "HintProvider with 2 resources returns hints",
            vec![answer(&[
                ("resource1", Some(zero())),
                ("resource2", Some(zero())),
            ])],
            vec![answer(&[
                ("resource1", Some(zero())),
                ("resource2", Some(zero())),
            ])],
        ),
    ]
}

#[test]
fn container_accumulate_providers_hints() {
    let rows = accumulate_rows();
    assert_eq!(rows.len(), 7);
    let p = pod();
    for (name, providers, expected) in rows {
        let m = manager("best-effort", "container", &providers);
        assert_eq!(
            m.accumulate_container_hints(&p, &p.containers[0]),
            expected,
            "{name}"
        );
    }
}

#[test]
fn pod_accumulate_providers_hints() {
    let rows = accumulate_rows();
    assert_eq!(rows.len(), 7);
    for (name, providers, expected) in rows {
        let m = manager("best-effort", "pod", &providers);
        assert_eq!(m.accumulate_pod_hints(&pod()), expected, "{name}");
    }
}

/// Upstream's `mockPolicy`: remembers what the scope handed to `Merge`, admits with `{nil,false}`.
#[derive(Default, Debug)]
struct RecordingPolicy(Mutex<Option<Vec<ProviderHints>>>);

impl HintMerger for RecordingPolicy {
    fn merge(&self, providers: &[ProviderHints]) -> (TopologyHint, bool) {
        *self.0.lock().expect("lock") = Some(providers.to_vec());
        (TopologyHint::default(), true)
    }
}

/// Shared rows of `Test{Container,Pod}CalculateAffinity`: what the policy is handed.
fn calculate_rows() -> Vec<(&'static str, Vec<ProviderHints>)> {
    vec![
        ("No hint providers", vec![]),
        (
            "HintProvider returns empty non-nil map[string][]TopologyHint",
            vec![ProviderHints::new()],
        ),
        (
            "HintProvider returns -nil map[string][]TopologyHint from provider",
            vec![answer(&[("resource", None)])],
        ),
        (
            "Assorted HintProviders",
            vec![
                answer(&[
                    ("resource-1/A", Some(vec![h(&[0], true), h(&[0, 1], false)])),
                    ("resource-1/B", Some(vec![h(&[1], true), h(&[1, 2], false)])),
                ]),
                answer(&[
                    ("resource-2/A", Some(vec![h(&[2], true), h(&[3, 4], false)])),
                    ("resource-2/B", Some(vec![h(&[2], true), h(&[3, 4], false)])),
                ]),
                answer(&[("resource-3", None)]),
            ],
        ),
    ]
}

#[test]
fn container_calculate_affinity() {
    let rows = calculate_rows();
    assert_eq!(rows.len(), 4);
    let p = pod();
    for (name, providers) in rows {
        let m = manager("best-effort", "container", &providers);
        let policy = RecordingPolicy::default();
        let admission = PodAdmission::begin(&policy, Some(ScopeName::Container), || {
            panic!("{name}: the container scope never asks for pod hints")
        })
        .expect("container scope starts without merging");
        admission
            .container_hint(|| m.accumulate_container_hints(&p, &p.containers[0]))
            .expect("mock policy admits");
        assert_eq!(
            policy.0.lock().expect("lock").clone(),
            Some(providers),
            "{name}"
        );
    }
}

#[test]
fn pod_calculate_affinity() {
    let rows = calculate_rows();
    assert_eq!(rows.len(), 4);
    let p = pod();
    for (name, providers) in rows {
        let m = manager("best-effort", "pod", &providers);
        let policy = RecordingPolicy::default();
        let admission =
            PodAdmission::begin(&policy, Some(ScopeName::Pod), || m.accumulate_pod_hints(&p))
                .expect("mock policy admits");
        assert_eq!(
            policy.0.lock().expect("lock").clone(),
            Some(providers.clone()),
            "{name}"
        );
        // Containers then get the pod's hint without another merge.
        *policy.0.lock().expect("lock") = None;
        let hint = admission
            .container_hint(|| panic!("{name}: the pod scope never asks for container hints"))
            .expect("pod hint");
        assert_eq!(hint, TopologyHint::default());
        assert_eq!(*policy.0.lock().expect("lock"), None, "{name}");
    }
}

#[test]
fn none_policy_asks_for_no_hints() {
    let policy = RecordingPolicy::default();
    let admission =
        PodAdmission::begin(&policy, None, || panic!("no pod hints")).expect("none admits");
    assert!(!admission.stores_affinity());
    let hint = admission
        .container_hint(|| panic!("no container hints"))
        .expect("none admits");
    assert_eq!(hint, TopologyHint::default());
    assert_eq!(*policy.0.lock().expect("lock"), None);
}

/// `TestAdmit`: 14 rows, each admitted under the container scope and the pod scope on a
/// 2-node machine. The QoS class is part of the row names only: the Topology Manager does
/// not look at it (providers decide what to ask for), which is why BestEffort pods are not
/// rejected by single-numa-node any more (ecosystem A6 row 39).
#[test]
fn admit() {
    let mixed = || answer(&[("resource", Some(vec![h(&[0], true), h(&[0, 1], false)]))]);
    let two_preferred = || {
        answer(&[(
            "resource",
            Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
        )])
    };
    let wide_only = || answer(&[("resource", Some(vec![h(&[0, 1], false)]))]);
    let rows: Vec<(&str, &str, Vec<ProviderHints>, bool)> = vec![
        (
            "QOSClass set as BestEffort. None Policy. No Hints.",
            "none",
            vec![],
            true,
        ),
        (
            "QOSClass set as Guaranteed. None Policy. No Hints.",
            "none",
            vec![],
            true,
        ),
        (
            "QOSClass set as BestEffort. single-numa-node Policy. No Hints.",
            "single-numa-node",
            vec![ProviderHints::new()],
            true,
        ),
        (
            "QOSClass set as BestEffort. Restricted Policy. No Hints.",
            "restricted",
            vec![ProviderHints::new()],
            true,
        ),
        (
            "QOSClass set as Guaranteed. BestEffort Policy. Preferred Affinity.",
            "best-effort",
            vec![mixed()],
            true,
        ),
        (
            "QOSClass set as Guaranteed. BestEffort Policy. More than one Preferred Affinity.",
            "best-effort",
            vec![two_preferred()],
            true,
        ),
        (
            "QOSClass set as Burstable. BestEffort Policy. More than one Preferred Affinity.",
            "best-effort",
            vec![two_preferred()],
            true,
        ),
        (
            "QOSClass set as Guaranteed. BestEffort Policy. No Preferred Affinity.",
            "best-effort",
            vec![wide_only()],
            true,
        ),
        (
            "QOSClass set as Guaranteed. Restricted Policy. Preferred Affinity.",
            "restricted",
            vec![mixed()],
            true,
        ),
        (
            "QOSClass set as Burstable. Restricted Policy. Preferred Affinity.",
            "restricted",
            vec![mixed()],
            true,
        ),
        (
            "QOSClass set as Guaranteed. Restricted Policy. More than one Preferred affinity.",
            "restricted",
            vec![two_preferred()],
            true,
        ),
        (
            "QOSClass set as Burstable. Restricted Policy. More than one Preferred affinity.",
            "restricted",
            vec![two_preferred()],
            true,
        ),
        (
            "QOSClass set as Guaranteed. Restricted Policy. No Preferred affinity.",
            "restricted",
            vec![wide_only()],
            false,
        ),
        (
            "QOSClass set as Burstable. Restricted Policy. No Preferred affinity.",
            "restricted",
            vec![wide_only()],
            false,
        ),
    ];
    assert_eq!(rows.len(), 14);
    for (name, policy, providers, expected) in rows {
        for scope in ["container", "pod"] {
            let mut m = manager(policy, scope, &providers);
            match m.admit(&pod()) {
                Ok(()) => assert!(expected, "{name} ({scope}): admitted, expected rejection"),
                Err(err) => {
                    assert!(!expected, "{name} ({scope}): rejected: {err}");
                    assert!(
                        matches!(err, AdmissionError::TopologyAffinity),
                        "{name} ({scope})"
                    );
                    assert_eq!(err.reason(), "TopologyAffinityError", "{name} ({scope})");
                }
            }
        }
    }
}
