//! The node filters of the default profile this scheduler implements, one file per plugin as in
//! `pkg/scheduler/framework/plugins/<name>/` (spec scheduler.md §4), plus devicelet's own
//! refusal of pods that ask for what it does not implement (`unsupported`).
//!
//! Everything here is pure: a [`PodFacts`] is computed once per scheduling attempt, and each
//! filter judges one node from the node object and its [`NodeUsage`] (pods bound or assumed).

pub mod image_locality;
pub mod inter_pod_affinity;
pub mod labels;
pub mod node_affinity;
pub mod node_name;
pub mod node_pods;
pub mod node_ports;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod pod_info;
pub mod pod_topology_spread;
pub mod taint_toleration;
pub mod unsupported;
pub mod volumes;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Toleration};

use crate::framework::Rejection;
pub use node_affinity::{AddedAffinity, PreferredNodeAffinity, RequiredNodeAffinity};
pub use node_ports::HostPort;
pub use node_resources_fit::{NodeUsage, ResourceList, pod_requests};

/// What the filters need of a pod, computed once per attempt.
#[derive(Clone, Debug)]
pub struct PodFacts {
    /// `spec.nodeName` when set.
    pub node_name: Option<String>,
    pub tolerations: Vec<Toleration>,
    pub affinity: RequiredNodeAffinity,
    /// The profile's NodeAffinityArgs `addedAffinity` (its preferred terms are in `preferred`).
    pub added_affinity: Option<Arc<AddedAffinity>>,
    pub preferred: PreferredNodeAffinity,
    /// The pod's effective requests (S106).
    pub requests: ResourceList,
    /// cpu and memory as the scores count them (containers without a request at 100m and
    /// 200 MiB).
    pub non_zero: (i128, i128),
    /// Host ports the pod wants.
    pub host_ports: Vec<HostPort>,
    /// Extended resources a DeviceClass backs (KEP-5004): left to DRA on nodes that do not
    /// advertise them (S112).
    pub dra_extended: BTreeSet<String>,
}

impl PodFacts {
    /// Reads the pod, with what `profile` adds to every pod (NodeAffinityArgs `addedAffinity`).
    pub fn for_profile(pod: &Pod, profile: &crate::config::Profile) -> Self {
        let mut facts = Self::of(pod);
        if let Some(added) = &profile.added_affinity {
            facts.preferred.extend(&added.preferred);
            facts.added_affinity = Some(added.clone());
        }
        facts
    }

    /// Reads the pod.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        PodFacts {
            node_name: spec
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            affinity: RequiredNodeAffinity::of(pod),
            added_affinity: None,
            preferred: PreferredNodeAffinity::of(pod),
            requests: pod_requests(pod),
            non_zero: node_resources_fit::non_zero_requests(pod),
            host_ports: node_ports::host_ports(pod),
            dra_extended: BTreeSet::new(),
        }
    }
}

/// Runs every filter but DRA on one node, in the default profile's order; the first rejection
/// is the node's status (as upstream, where a node's status is that of the first failing
/// plugin).
pub fn filter_node(
    facts: &PodFacts,
    node: &Node,
    allocatable: &ResourceList,
    usage: &NodeUsage,
) -> Option<Rejection> {
    node_unschedulable::filter(&facts.tolerations, node)
        .or_else(|| node_name::filter(facts.node_name.as_deref(), node))
        .or_else(|| taint_toleration::filter(&facts.tolerations, node))
        .or_else(|| node_affinity::filter(&facts.affinity, facts.added_affinity.as_deref(), node))
        .or_else(|| node_ports::filter(&facts.host_ports, &usage.host_ports))
        .or_else(|| {
            node_resources_fit::filter(&facts.requests, &facts.dra_extended, allocatable, usage)
        })
}
