//! The static policy against the real kubelet 1.36.3: `fixtures/kubelet_static_policy.json`
//! holds random allocation / removal sequences on described machines (SMT, 2 sockets × 2 NUMA,
//! AMD EPYC-like L3 per 4 or 8 cores, 8 NUMA nodes, more sockets than NUMA nodes) under every
//! static-policy option and several combinations, with the CPU sets, errors, shared pools and
//! (for `align-by-socket`) hints that `cpumanager.NewStaticPolicy` produced for them with
//! `CPUManagerPolicyAlphaOptions` on. The generator is a throwaway Go program driving
//! `NewStaticPolicy` + `state.NewMemoryState` + `topology.Discover` over a cadvisor
//! `MachineInfo` built with the same CPU numbering as [`CpuMachineConfig::to_topology`].

mod common;

use std::collections::BTreeMap;

use common::gu_pod;
use devicelet_cpumanager::{
    CpuMachineConfig, CpuManager, CpuManagerConfig, ReservedCpus, StaticPolicyOptions,
};
use devicelet_topology::{FeatureGates, NumaMask, ResourceHints, TopologyHint};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Machine {
    sockets: u32,
    cores: u32,
    threads: u32,
    numa: u32,
    cores_per_uncore: u32,
}

#[derive(Deserialize)]
struct Op {
    pod: String,
    cpus: i64,
    affinity: Option<Vec<usize>>,
    remove: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    name: String,
    machine: Machine,
    options: BTreeMap<String, String>,
    reserved: usize,
    ops: Vec<Op>,
    reserved_set: String,
    results: Option<Vec<String>>,
    hints: Option<Vec<Option<Vec<String>>>>,
    defaults: Option<Vec<String>>,
    error: Option<String>,
}

/// Go's `fmt.Sprintf("%v:%v", mask.GetBits(), preferred)`.
fn go_hint(h: &TopologyHint) -> String {
    let bits: Vec<String> = h
        .affinity
        .map(|m| m.nodes().map(|n| n.to_string()).collect())
        .unwrap_or_default();
    format!("[{}]:{}", bits.join(" "), h.preferred)
}

#[test]
fn static_policy_matches_kubelet_1_36_3() {
    let compared = replay(include_str!("fixtures/kubelet_static_policy.json"));
    assert!(compared > 2000, "{compared}");
}

/// Large requests spanning many NUMA nodes (`distribute-cpus-across-numa` choosing among 4-,
/// 6-, 8-node combinations, uncore caches filled across nodes) on 8- and 16-NUMA machines.
#[test]
fn multi_numa_requests_match_kubelet_1_36_3() {
    let compared = replay(include_str!("fixtures/kubelet_static_policy_large.json"));
    assert!(compared > 900, "{compared}");
}

fn replay(raw: &str) -> usize {
    let cases: Vec<Case> = serde_json::from_str(raw).expect("fixture parses");
    let mut gates = FeatureGates::default();
    gates.set("CPUManagerPolicyAlphaOptions", true);
    let mut compared_ops = 0;
    for case in cases {
        let name = &case.name;
        let m = &case.machine;
        let topo = CpuMachineConfig {
            sockets: m.sockets,
            cores_per_socket: m.cores,
            threads_per_core: m.threads,
            numa_nodes: m.numa,
            cores_per_uncore_cache: (m.cores_per_uncore > 0).then_some(m.cores_per_uncore),
        }
        .to_topology()
        .expect("valid machine");
        let cfg = CpuManagerConfig {
            policy: "static".into(),
            reserved: ReservedCpus::Count(case.reserved),
            policy_options: case.options.clone(),
            feature_gates: gates.clone(),
            topology_manager_policy: "none".into(),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let manager = CpuManager::new(topo, &cfg, dir.path());
        if let Some(want) = &case.error {
            let got = manager.expect_err(name).to_string();
            assert_eq!(&got, want, "{name}");
            continue;
        }
        let manager = manager.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            manager.reserved_cpus().to_string(),
            case.reserved_set,
            "{name}"
        );
        let results = case.results.unwrap_or_default();
        let defaults = case.defaults.unwrap_or_default();
        let hints = case.hints;
        let opts = StaticPolicyOptions::parse(&case.options, &gates).expect("valid options");
        for (i, op) in case.ops.iter().enumerate() {
            let at = format!("{name} op {i} ({} {} cpus)", op.pod, op.cpus);
            if op.remove {
                manager.remove_container(&op.pod, "c").expect("remove");
            } else {
                let pod = gu_pod(&op.pod, op.cpus * 1000);
                manager.register_pod(&pod);
                let container = &pod.spec.containers[0];
                if let Some(want) = hints.as_ref().and_then(|h| h[i].as_ref()) {
                    let got = match manager.container_hints(&pod.spec, container).remove("cpu") {
                        Some(ResourceHints::Hints(h)) => h,
                        Some(ResourceHints::Family(f)) => f.to_hints(16).expect("small"),
                        other => panic!("{at}: unexpected hints {other:?}"),
                    };
                    let got: Vec<String> = got.iter().map(go_hint).collect();
                    assert_eq!(&got, want, "{at}: hints");
                }
                let affinity = op
                    .affinity
                    .as_ref()
                    .map(|nodes| NumaMask::from_nodes(nodes.iter().copied()).expect("valid mask"));
                let hint = TopologyHint {
                    affinity,
                    preferred: true,
                };
                let got = match manager.allocate_container(&pod.spec, container, &hint) {
                    Ok(()) => manager.cpuset_for(&op.pod, "c").to_string(),
                    Err(e) => format!("error: {e}"),
                };
                assert_eq!(got, results[i], "{at}: allocation");
            }
            assert_eq!(
                manager.default_cpu_set().to_string(),
                defaults[i],
                "{at}: defaultCpuSet (options {opts:?})"
            );
            compared_ops += 1;
        }
    }
    compared_ops
}

/// `prefer-align-cpus-by-uncorecache` on the resource-manager oracle's AMD EPYC machines
/// (`interop/resourcemanagers`), answers from the kubelet 1.36.3 static policy over the
/// `MachineInfo` that cadvisor parses from the same sysfs tree. A Zen 2-like 1 socket × 4 NUMA
/// with an L3 per 4 cores (two per node: real uncore caches), and a Zen 3-like 2 sockets × 4
/// NUMA whose L3 spans exactly a node (a node cache for cadvisor, so the kubelet groups by
/// socket). The oracle once gave the kubelet uncore caches its sysfs tree did not have and
/// reported mismatches such as 2 CPUs with `0,31` reserved on the 2-socket machine (devicelet
/// "16,48", which is the kubelet's answer on the machine the tree describes).
#[test]
fn uncore_alignment_on_oracle_epyc_shapes_matches_kubelet_1_36_3() {
    struct Check {
        name: &'static str,
        machine: CpuMachineConfig,
        reserved: ReservedCpus,
        /// (CPUs asked, CPU set the kubelet gave)
        allocations: &'static [(i64, &'static str)],
        default_set: &'static str,
    }
    let zen2 = CpuMachineConfig {
        sockets: 1,
        cores_per_socket: 32,
        threads_per_core: 2,
        numa_nodes: 4,
        cores_per_uncore_cache: Some(4),
    };
    let zen3 = CpuMachineConfig {
        sockets: 2,
        cores_per_socket: 16,
        threads_per_core: 2,
        numa_nodes: 8,
        cores_per_uncore_cache: Some(4),
    };
    let checks = [
        Check {
            name: "epyc-1s-4numa, 1 reserved",
            machine: zen2.clone(),
            reserved: ReservedCpus::Count(1),
            allocations: &[(18, "4,8-15,36,40-47"), (2, "5,37"), (6, "16-18,48-50")],
            default_set: "0-3,6-7,19-35,38-39,51-63",
        },
        Check {
            name: "epyc-1s-4numa, reserved 0,31",
            machine: zen2,
            reserved: ReservedCpus::List("0,31".into()),
            allocations: &[
                (2, "4,36"),
                (4, "5-6,37-38"),
                (8, "24-27,56-59"),
                (3, "28-29,60"),
                (16, "8-15,40-47"),
            ],
            default_set: "0-3,7,16-23,30-35,39,48-55,61-63",
        },
        Check {
            name: "epyc-2s-4numa, reserved 0,31",
            machine: zen3,
            reserved: ReservedCpus::List("0,31".into()),
            allocations: &[(2, "16,48"), (4, "17-18,49-50"), (6, "19-21,51-53")],
            default_set: "0-15,22-47,54-63",
        },
    ];
    for check in checks {
        let name = check.name;
        let topo = check.machine.to_topology().expect("valid machine");
        let cfg = CpuManagerConfig {
            policy: "static".into(),
            reserved: check.reserved,
            policy_options: BTreeMap::from([(
                "prefer-align-cpus-by-uncorecache".to_string(),
                "true".to_string(),
            )]),
            feature_gates: FeatureGates::default(),
            topology_manager_policy: "none".into(),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let manager =
            CpuManager::new(topo, &cfg, dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, &(cpus, want)) in check.allocations.iter().enumerate() {
            let pod_name = format!("p{i}");
            let pod = gu_pod(&pod_name, cpus * 1000);
            manager.register_pod(&pod);
            let hint = TopologyHint {
                affinity: None,
                preferred: true,
            };
            manager
                .allocate_container(&pod.spec, &pod.spec.containers[0], &hint)
                .unwrap_or_else(|e| panic!("{name}: {cpus} CPUs: {e}"));
            assert_eq!(
                manager.cpuset_for(&pod_name, "c").to_string(),
                want,
                "{name}: {cpus} CPUs"
            );
        }
        assert_eq!(
            manager.default_cpu_set().to_string(),
            check.default_set,
            "{name}: defaultCpuSet"
        );
    }
}
