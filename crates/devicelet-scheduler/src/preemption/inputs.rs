//! What preemption reads and decides, shared by the dry run ([`super::victims`]) and its
//! actuation ([`super::actuate`]): the cluster as read under the cache lock, the chosen
//! candidate, the units evicted together.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use devicelet_allocator::AllocatedState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::cache::{ClusterCache, PodOnNode, add_claim_results};
use crate::gang::{GroupKey, group_of};

/// The reason of a node without a pod of lower priority.
pub(super) const NO_VICTIMS: &str = "No preemption victims found for incoming pod";

/// The condition reason preemption writes on its victims.
pub const PREEMPTION_BY_SCHEDULER: &str = "PreemptionByScheduler";

/// Whether `pod` carries `DisruptionTarget=True` written by a scheduler's preemption.
pub fn has_disruption_target(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some(PREEMPTION_BY_SCHEDULER)
        })
}

/// What the dry run reads from the cache, under its lock.
#[derive(Clone, Debug)]
pub struct PreemptionInputs {
    /// Assumed and bound pods by node.
    pub pods_by_node: HashMap<String, Vec<PodOnNode>>,
    /// Claims holding devices, each with the pod UIDs that may free it (`None`: a consumer that
    /// is not a pod, or no consumer: never freed by preemption).
    pub claims: Vec<(Arc<ResourceClaim>, Option<Vec<String>>)>,
    /// Per pod UID, the indices in `claims` of the claims it may free.
    pub claims_of: HashMap<String, Vec<usize>>,
    /// Every device in use (all of `claims`).
    pub base: AllocatedState,
    pub pdbs: Vec<Arc<PodDisruptionBudget>>,
    /// Groups whose members are evicted only together (`disruptionMode: PodGroup`), with the
    /// group's priority when it names one.
    pub group_units: HashMap<GroupKey, Option<i32>>,
    /// The node the preemptor is already nominated to.
    pub nominated_node: Option<String>,
    pub consumable_capacity: bool,
}

impl PreemptionInputs {
    /// Reads what preemption for `pod` needs.
    pub fn read(cache: &ClusterCache, pod: &Pod, consumable_capacity: bool) -> Self {
        let claims: Vec<(Arc<ResourceClaim>, Option<Vec<String>>)> = cache
            .allocated_claims()
            .into_iter()
            .map(|c| {
                let consumers = c.status.as_ref().and_then(|s| s.reserved_for.as_ref());
                let pods: Option<Vec<String>> = consumers.filter(|r| !r.is_empty()).and_then(|r| {
                    r.iter()
                        .map(|r| {
                            (r.resource == "pods"
                                && r.api_group.as_deref().unwrap_or("").is_empty())
                            .then(|| r.uid.clone())
                        })
                        .collect()
                });
                (c, pods)
            })
            .collect();
        let group_units = cache
            .pod_groups()
            .into_iter()
            .filter_map(|g| {
                let spec = &g.spec;
                (spec.disruption_mode.as_deref() == Some("PodGroup")).then(|| {
                    (
                        (
                            g.metadata.namespace.clone().unwrap_or_default(),
                            g.metadata.name.clone().unwrap_or_default(),
                        ),
                        spec.priority,
                    )
                })
            })
            .collect();
        let mut claims_of: HashMap<String, Vec<usize>> = HashMap::new();
        let mut base = AllocatedState::default();
        for (i, (claim, consumers)) in claims.iter().enumerate() {
            add_claim_results(&mut base, claim, consumable_capacity);
            for uid in consumers.iter().flatten() {
                claims_of.entry(uid.clone()).or_default().push(i);
            }
        }
        PreemptionInputs {
            pods_by_node: cache.pods_by_node(),
            claims,
            claims_of,
            base,
            pdbs: cache.pdbs(),
            group_units,
            nominated_node: cache
                .nomination(pod.metadata.uid.as_deref().unwrap_or(""))
                .map(|n| n.node.clone())
                .or_else(|| {
                    pod.status
                        .as_ref()
                        .and_then(|s| s.nominated_node_name.clone())
                        .filter(|n| !n.is_empty())
                }),
            consumable_capacity,
        }
    }

    /// The claims whose consumers are all in `removed` (their devices are free once those
    /// pods are gone), as indices into `claims`.
    pub(super) fn freed_by(&self, removed: &HashSet<&str>) -> Vec<usize> {
        let mut freed: Vec<usize> = removed
            .iter()
            .flat_map(|uid| self.claims_of.get(*uid).into_iter().flatten().copied())
            .filter(|&i| {
                self.claims[i]
                    .1
                    .as_ref()
                    .is_some_and(|c| c.iter().all(|uid| removed.contains(uid.as_str())))
            })
            .collect();
        freed.sort_unstable();
        freed.dedup();
        freed
    }

    /// The devices in use without the claims `freed` (indices into `claims`).
    pub(super) fn state_without(&self, freed: &[usize]) -> AllocatedState {
        let mut state = AllocatedState::default();
        for (i, (claim, _)) in self.claims.iter().enumerate() {
            if freed.binary_search(&i).is_err() {
                add_claim_results(&mut state, claim, self.consumable_capacity);
            }
        }
        state
    }
}

/// The node chosen and the pods to evict there (and, for groups evicted as a unit, elsewhere).
#[derive(Clone, Debug)]
pub struct Candidate {
    pub node: String,
    /// The devices the preemptor would get there once the victims are gone (held for it).
    pub devices: Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult>,
    /// The victims, most important first.
    pub victims: Vec<Arc<Pod>>,
    pub pdb_violations: usize,
}

/// The group a pod is evicted with, when its PodGroup asks for that (D-L3).
pub(super) fn unit_group(pod: &Pod, inputs: &PreemptionInputs) -> Option<(GroupKey, Option<i32>)> {
    let key = group_of(pod)?;
    let priority = *inputs.group_units.get(&key)?;
    Some((key, priority))
}
