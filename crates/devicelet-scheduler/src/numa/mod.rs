//! NUMA-aware device choice, devicelet's own (issue 41; kube-scheduler 1.36 knows nothing of
//! NUMA, and DRA devices take no part in the kubelet's Topology Manager upstream).
//!
//! A devicelet node under a Topology Manager policy that refuses misaligned pods
//! (`single-numa-node`, `restricted`) aligns a pod's DRA devices with its exclusive CPUs and
//! pinned memory, and refuses the pod when they cannot share a NUMA node. The node publishes
//! what each NUMA node can still give on its Node ([`devicelet_kube::numa_resources`]). For a
//! pod that needs exclusive CPUs (Guaranteed, integer CPUs: the static CPU policy's rule,
//! [`devicelet_cpumanager::pod::pod_from_k8s`]) the DynamicResources Filter then allocates the
//! pod's claims on one NUMA node at a time that still has those CPUs (and memory), best fit
//! first; devices without a NUMA node fit any. A node where no NUMA node works is rejected, so
//! the pod goes where the node will admit it instead of where spreading by device count alone
//! would send it to be refused.
//!
//! The node's figures are as of its last report (at most one status patch per 2 s). Pods this
//! scheduler placed since, which the report's `pods` does not list yet, are taken off the NUMA
//! node their devices are on (else the lowest one they fit, as the kubelet would pick).
//! Decisions stay the node's: a stale view costs a refusal, never a wrong allocation.

use devicelet_allocator::{AllocateOptions, Allocator};
use devicelet_kube::numa_resources::{ANNOTATION, NumaResources};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::HashMap;

use crate::cache::{ClusterCache, NodeEntry};
use crate::dra::{self, DraState, NodeOutcome};
use crate::framework::{Code, Plugin, Rejection};

pub mod pod_use;

pub use pod_use::PodNumaUse;

/// One NUMA node as this cycle sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumaFree {
    pub id: u8,
    /// Free exclusive CPUs; `None`: the node's CPU policy pins none.
    pub cpus: Option<u64>,
    /// Free pinnable memory; `None`: the node's memory policy pins none.
    pub memory: Option<u64>,
}

impl NumaFree {
    fn fits(&self, cpus: u64, memory: u64) -> bool {
        self.cpus.is_none_or(|c| c >= cpus) && self.memory.is_none_or(|m| m >= memory)
    }

    fn take(&mut self, cpus: u64, memory: u64) {
        self.cpus = self.cpus.map(|c| c.saturating_sub(cpus));
        self.memory = self.memory.map(|m| m.saturating_sub(memory));
    }
}

/// One node's NUMA nodes and what the pod needs from one of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNuma {
    pub numa_nodes: Vec<NumaFree>,
    /// Exclusive CPUs the pod needs on the devices' NUMA node (by the node's scope).
    pub cpus: u64,
    /// Memory the pod needs there.
    pub memory: u64,
}

impl NodeNuma {
    /// The NUMA nodes that fit, best fit first (fewest CPUs left, then least memory, then the
    /// lowest id), so that large NUMA nodes stay free for large pods.
    pub fn candidates(&self) -> Vec<u8> {
        let mut fit: Vec<&NumaFree> = self
            .numa_nodes
            .iter()
            .filter(|n| n.fits(self.cpus, self.memory))
            .collect();
        fit.sort_by_key(|n| {
            (
                n.cpus.unwrap_or(u64::MAX),
                n.memory.unwrap_or(u64::MAX),
                n.id,
            )
        });
        fit.into_iter().map(|n| n.id).collect()
    }
}

/// The pod's view of every node that publishes its NUMA nodes under a refusing policy; empty
/// for a pod that needs no exclusive CPUs or has no claim to allocate.
#[derive(Clone, Debug, Default)]
pub struct NumaInputs {
    pub nodes: HashMap<String, NodeNuma>,
}

impl NumaInputs {
    /// Reads the nodes' reports for `pod` from `entries`, less what pods placed since the
    /// reports take.
    pub fn read(need: Option<&PodNumaUse>, entries: &[NodeEntry], cache: &ClusterCache) -> Self {
        let Some(need) = need.filter(|n| !n.claims.is_empty()) else {
            return NumaInputs::default();
        };
        let mut nodes = HashMap::new();
        for entry in entries {
            let Some(report) = report_of(&entry.node) else {
                continue;
            };
            if !report.refuses_misaligned() {
                continue;
            }
            let mut numa_nodes: Vec<NumaFree> = report
                .numa_nodes
                .iter()
                .filter_map(|n| {
                    Some(NumaFree {
                        id: u8::try_from(n.id).ok().filter(|&i| i < 64)?,
                        cpus: n.cpus,
                        memory: n.memory,
                    })
                })
                .collect();
            for placed in entry.usage.pod_infos.iter() {
                let Some(used) = placed.numa_use.as_deref() else {
                    continue;
                };
                if report.pods.iter().any(|u| *u == placed.uid) {
                    continue;
                }
                let (cpus, memory) = used.under(&report.topology_manager_scope);
                let on = devices_numa(cache, &used.claims).or_else(|| {
                    numa_nodes
                        .iter()
                        .find(|n| n.fits(cpus, memory))
                        .map(|n| n.id)
                });
                if let Some(n) = on.and_then(|id| numa_nodes.iter_mut().find(|n| n.id == id)) {
                    n.take(cpus, memory);
                }
            }
            let (cpus, memory) = need.under(&report.topology_manager_scope);
            if cpus == 0 {
                continue;
            }
            nodes.insert(
                entry.name().to_owned(),
                NodeNuma {
                    numa_nodes,
                    cpus,
                    memory,
                },
            );
        }
        NumaInputs { nodes }
    }
}

/// The node's published report, if any.
pub fn report_of(node: &Node) -> Option<NumaResources> {
    node.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION)
        .and_then(|v| NumaResources::from_annotation(v))
}

/// The one NUMA node the allocated devices of `claims` are on, when they name exactly one.
fn devices_numa(cache: &ClusterCache, claims: &[(String, String)]) -> Option<u8> {
    let mut mask = 0u64;
    for (ns, name) in claims {
        let claim = cache.claim(ns, name)?;
        for r in claim
            .status
            .iter()
            .flat_map(|s| s.allocation.iter())
            .flat_map(|a| a.devices.iter())
            .flat_map(|d| d.results.iter().flatten())
        {
            mask |= cache.device_numa_mask(&r.driver, &r.pool, &r.device);
        }
    }
    (mask.count_ones() == 1).then(|| mask.trailing_zeros() as u8)
}

/// The DynamicResources Filter on a node that publishes its NUMA nodes: the claims allocated
/// on one NUMA node at a time, best fit first ([`NodeNuma::candidates`]).
pub fn filter_node<'a>(
    state: &DraState,
    allocator: Option<&Allocator<'a>>,
    claims: &[&'a ResourceClaim],
    node: &Node,
    options: &AllocateOptions,
    numa: &NodeNuma,
) -> NodeOutcome {
    if claims.is_empty() {
        return dra::filter_node(state, allocator, claims, node, options);
    }
    let candidates = numa.candidates();
    for id in &candidates {
        let on_one = AllocateOptions {
            numa_node: Some(*id),
            ..options.clone()
        };
        match dra::filter_node(state, allocator, claims, node, &on_one) {
            NodeOutcome::Rejected { rejection, .. }
                if rejection.code == Code::UnschedulableAndUnresolvable
                    && rejection
                        .reasons
                        .iter()
                        .any(|r| r == "cannot allocate all claims") =>
            {
                continue;
            }
            other => return other,
        }
    }
    // Preemption may free CPUs or devices on some NUMA node: Unschedulable, not unresolvable.
    NodeOutcome::Rejected {
        rejection: Rejection::new(
            Plugin::DynamicResources,
            Code::Unschedulable,
            format!(
                "cannot allocate all claims on a NUMA node with {} exclusive CPUs free{}",
                numa.cpus,
                if numa.memory > 0 {
                    format!(" and {} bytes of memory", numa.memory)
                } else {
                    String::new()
                }
            ),
        ),
        unavailable: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, Pod, PodResourceClaim, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::config::Profile;
    use crate::cycle::{CycleInputs, Decision, Outcome, with_engine};
    use crate::testing::{
        allocated_claim, bind_in, cache_with, claim, exact, labelled_pod, node, slice,
    };

    fn gpu(name: &str, numa: i64) -> Device {
        Device {
            name: name.into(),
            attributes: Some(BTreeMap::from([(
                devicelet_allocator::NUMA_NODE_ATTRIBUTE.to_owned(),
                DeviceAttribute {
                    int: Some(numa),
                    ..DeviceAttribute::default()
                },
            )])),
            ..Device::default()
        }
    }

    /// A node whose report gives `cpus` free exclusive CPUs per NUMA node.
    fn numa_node(name: &str, cpus: &[u64], pods: &[&str]) -> Node {
        let mut n = node(name, "16", &[]);
        let report = NumaResources {
            topology_manager_policy: "single-numa-node".into(),
            topology_manager_scope: "container".into(),
            numa_nodes: cpus
                .iter()
                .enumerate()
                .map(
                    |(id, c)| devicelet_kube::numa_resources::NumaNodeResources {
                        id: id as i64,
                        cpus: Some(*c),
                        memory: None,
                    },
                )
                .collect(),
            pods: pods.iter().map(|p| (*p).to_owned()).collect(),
        };
        n.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION.to_owned(),
            report.to_annotation(),
        )]));
        n
    }

    /// A Guaranteed pod: one container with `cpus` CPUs and 1Gi that uses claim `claim`.
    fn gpu_pod(name: &str, cpus: u32, claim: &str) -> Pod {
        let amounts = BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpus.to_string())),
            ("memory".to_owned(), Quantity("1Gi".into())),
        ]);
        labelled_pod(
            name,
            "ns",
            &[],
            PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(amounts.clone()),
                        requests: Some(amounts),
                        claims: Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
                            name: "gpu".into(),
                            request: None,
                        }]),
                    }),
                    ..Container::default()
                }],
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_name: Some(claim.into()),
                    ..PodResourceClaim::default()
                }]),
                ..PodSpec::default()
            },
        )
    }

    /// The feasible nodes with the devices each would get, best first, or the message.
    fn feasible(
        cache: &mut ClusterCache,
        pod: &Pod,
        profile: &Profile,
    ) -> Result<Vec<(String, Vec<String>)>, String> {
        let options = AllocateOptions::unbounded();
        with_engine(cache, options, profile, |engine, cache| {
            let inputs = CycleInputs::read(pod, cache, std::time::Duration::from_secs(600));
            match engine.evaluate(pod, inputs, 100) {
                Outcome::Feasible(p) => Ok(p
                    .into_iter()
                    .map(|p| {
                        let devices = p
                            .allocating()
                            .flat_map(|(_, a)| {
                                a.devices.iter().flat_map(|d| d.results.iter().flatten())
                            })
                            .map(|r| r.device.clone())
                            .collect();
                        (p.node, devices)
                    })
                    .collect()),
                Outcome::Decided(Decision::Unschedulable { fit, .. }) => Err(fit.message()),
                Outcome::Decided(d) => Err(format!("{d:?}")),
            }
        })
    }

    fn sorted(mut v: Vec<(String, Vec<String>)>) -> Vec<(String, Vec<String>)> {
        v.sort();
        v
    }

    #[test]
    fn the_devices_go_to_a_numa_node_with_the_cpus_and_a_node_without_one_is_rejected() {
        // a: NUMA 0 has no CPU left, NUMA 1 four; b: one CPU on each, so no NUMA node has 2.
        let mut cache = cache_with(
            vec![numa_node("a", &[0, 4], &[]), numa_node("b", &[1, 1], &[])],
            vec![
                slice("a", vec![gpu("gpu-0", 0), gpu("gpu-1", 1)], None),
                slice(
                    "b",
                    vec![
                        gpu("gpu-0", 0),
                        gpu("gpu-1", 0),
                        gpu("gpu-2", 1),
                        gpu("gpu-3", 1),
                    ],
                    None,
                ),
            ],
            vec![claim("c1", exact(1, None))],
        );
        let pod = gpu_pod("p", 2, "c1");
        let aligned = Profile::named("s");
        assert_eq!(
            feasible(&mut cache, &pod, &aligned),
            Ok(vec![("a".to_owned(), vec!["gpu-1".to_owned()])])
        );
        // Without it, both nodes, each with its first GPU (where the node refuses the pod).
        let spread = Profile {
            numa_alignment: false,
            ..Profile::named("s")
        };
        assert_eq!(
            feasible(&mut cache, &pod, &spread).map(sorted),
            Ok(vec![
                ("a".to_owned(), vec!["gpu-0".to_owned()]),
                ("b".to_owned(), vec!["gpu-0".to_owned()]),
            ])
        );
        // A pod without exclusive CPUs (Burstable) is not steered: first fit, as upstream.
        let mut shared = gpu_pod("shared", 2, "c1");
        if let Some(r) = shared
            .spec
            .as_mut()
            .and_then(|s| s.containers[0].resources.as_mut())
        {
            r.limits = None;
        }
        assert_eq!(
            feasible(&mut cache, &shared, &aligned).map(sorted),
            Ok(vec![
                ("a".to_owned(), vec!["gpu-0".to_owned()]),
                ("b".to_owned(), vec!["gpu-0".to_owned()]),
            ])
        );
        // A pod that needs 5 CPUs fits no NUMA node anywhere; the message says why.
        let big = gpu_pod("big", 5, "c1");
        let err = feasible(&mut cache, &big, &aligned).expect_err("no NUMA node has 5");
        assert!(
            err.contains("cannot allocate all claims on a NUMA node with 5 exclusive CPUs free"),
            "{err}"
        );
    }

    #[test]
    fn pods_placed_since_the_report_are_taken_off_their_devices_numa_node() {
        let mut cache = cache_with(
            vec![numa_node("a", &[4, 4], &[])],
            vec![slice(
                "a",
                vec![gpu("gpu-0", 0), gpu("gpu-1", 1), gpu("gpu-2", 0)],
                None,
            )],
            vec![
                allocated_claim("held", "a", "gpu-0"),
                claim("c1", exact(1, None)),
            ],
        );
        // A 3-CPU pod on gpu-0 (NUMA 0) that the report does not count yet: NUMA 0 has 1 CPU
        // left, not the 4 the report says (which would pick gpu-2 there, best fit by id).
        bind_in(&mut cache, gpu_pod("earlier", 3, "held"), "a");
        let pod = gpu_pod("p", 2, "c1");
        let profile = Profile::named("s");
        assert_eq!(
            feasible(&mut cache, &pod, &profile),
            Ok(vec![("a".to_owned(), vec!["gpu-1".to_owned()])]),
        );
        // Once the report counts it (NUMA 0 shows 1 CPU and lists the pod), the same answer.
        cache.upsert_node(numa_node("a", &[1, 4], &["uid-earlier"]));
        assert_eq!(
            feasible(&mut cache, &pod, &profile),
            Ok(vec![("a".to_owned(), vec!["gpu-1".to_owned()])]),
        );
    }

    fn free(id: u8, cpus: u64) -> NumaFree {
        NumaFree {
            id,
            cpus: Some(cpus),
            memory: None,
        }
    }

    #[test]
    fn candidates_are_the_fitting_numa_nodes_best_fit_first() {
        let numa = NodeNuma {
            numa_nodes: vec![free(0, 6), free(1, 2), free(2, 3), free(3, 1)],
            cpus: 2,
            memory: 0,
        };
        assert_eq!(numa.candidates(), [1, 2, 0]);
        let none = NodeNuma { cpus: 7, ..numa };
        assert!(none.candidates().is_empty());
    }

    #[test]
    fn memory_counts_only_where_the_node_pins_it() {
        let numa = NodeNuma {
            numa_nodes: vec![
                NumaFree {
                    id: 0,
                    cpus: Some(4),
                    memory: Some(1 << 30),
                },
                NumaFree {
                    id: 1,
                    cpus: Some(4),
                    memory: Some(4 << 30),
                },
            ],
            cpus: 2,
            memory: 2 << 30,
        };
        assert_eq!(numa.candidates(), [1]);
    }
}
