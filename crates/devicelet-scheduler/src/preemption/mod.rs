//! DefaultPreemption, the PostFilter that evicts lower-priority pods when no node fits
//! (`pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go`,
//! `pkg/scheduler/framework/preemption/preemption.go`; spec workloads.md part D, W77-W92,
//! W102-W107), with what 1.36 cannot do:
//! - **devices are freed** (D-L1, KEP-5690's proposal): a node the DRA Filter rejected with
//!   `cannot allocate all claims` is a candidate too, and removing a victim returns the devices
//!   of every claim whose consumers (`reservedFor`) are all victims; claims reserved for a
//!   PodGroup or shared with a pod that stays are never freed;
//! - a member of a PodGroup with `disruptionMode: PodGroup` is evicted only with all of its
//!   group, as one unit (D-L3);
//! - the last tie between candidates goes to the smallest node name, not map order (D-L6).
//!
//! The dry run is pure: the cluster as read under the cache lock ([`PreemptionInputs`]) and the
//! scheduling [`Engine`] to run the filters and the allocator on one node. [`actuate`] writes
//! the outcome.

pub mod actuate;
pub mod pdb;
mod victims;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use devicelet_allocator::AllocatedState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::cache::{ClusterCache, PodOnNode, add_claim_results, priority_of};
use crate::config::PreemptionArgs;
use crate::cycle::{CycleInputs, Engine};
use crate::framework::{Code, FitError, Plugin};
use crate::gang::{GroupKey, group_of};

pub use victims::Unit;

/// What the dry run reads from the cache, under its lock.
#[derive(Clone, Debug)]
pub struct PreemptionInputs {
    /// Assumed and bound pods by node.
    pub pods_by_node: HashMap<String, Vec<PodOnNode>>,
    /// Claims holding devices, each with the pod UIDs that may free it (`None`: a consumer that
    /// is not a pod, or no consumer: never freed by preemption).
    pub claims: Vec<(Arc<ResourceClaim>, Option<Vec<String>>)>,
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
        let claims = cache
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
        PreemptionInputs {
            pods_by_node: cache.pods_by_node(),
            claims,
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

    /// The devices in use when the pods in `removed` are gone: every claim but those all of
    /// whose consumers are in `removed`.
    fn state_without(&self, removed: &HashSet<&str>) -> AllocatedState {
        let mut state = AllocatedState::default();
        for (claim, consumers) in &self.claims {
            let freed = consumers
                .as_ref()
                .is_some_and(|c| c.iter().all(|uid| removed.contains(uid.as_str())));
            if !freed {
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
    /// The victims, most important first.
    pub victims: Vec<Arc<Pod>>,
    pub pdb_violations: usize,
}

/// The outcome of DefaultPreemption for one pod.
#[derive(Debug)]
pub enum Verdict {
    /// Evict these victims; the pod is nominated to the node (W87).
    Nominate(Candidate),
    /// Nothing to do: the message for the pod's condition (`preemption: …`), and whether the
    /// pod's nomination is to be cleared (W80).
    Fail {
        message: String,
        clear_nomination: bool,
    },
}

/// Whether preemption might make `node`'s rejection go away (W80): an `Unschedulable` filter,
/// or the DRA Filter's `cannot allocate all claims`, which victims' devices may resolve (W107).
fn might_help(fit: &FitError, node: &str) -> bool {
    fit.node_statuses.get(node).is_some_and(|r| {
        r.code == Code::Unschedulable
            || (r.plugin == Plugin::DynamicResources
                && r.reasons.iter().any(|m| m == "cannot allocate all claims"))
    })
}

/// W79: not eligible while it waits for victims that are already terminating on its node.
fn not_eligible(pod: &Pod, fit: &FitError, inputs: &PreemptionInputs) -> Option<&'static str> {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never") {
        return Some("not eligible due to preemptionPolicy=Never.");
    }
    let node = inputs.nominated_node.as_deref()?;
    if fit.node_statuses.contains_key(node) && !might_help(fit, node) {
        return None;
    }
    let priority = priority_of(pod);
    let terminating = inputs
        .pods_by_node
        .get(node)
        .into_iter()
        .flatten()
        .any(|p| {
            priority_of(&p.pod) < priority
                && p.pod.metadata.deletion_timestamp.is_some()
                && actuate::has_disruption_target(&p.pod)
        });
    terminating.then_some("not eligible due to a terminating pod on the nominated node.")
}

/// DefaultPreemption for `pod`, which `fit` says fits no node. `cycle` is what its cycle read;
/// `args` say how many candidates to look for (W81).
pub fn preempt(
    engine: &mut Engine<'_>,
    pod: &Pod,
    cycle: &CycleInputs,
    fit: &FitError,
    inputs: &PreemptionInputs,
    args: PreemptionArgs,
) -> Verdict {
    if let Some(why) = not_eligible(pod, fit, inputs) {
        return Verdict::Fail {
            message: format!("preemption: {why}"),
            clear_nomination: false,
        };
    }
    let n = cycle.nodes.len();
    if n == 0 {
        return Verdict::Fail {
            message: "preemption: no nodes available".to_owned(),
            clear_nomination: false,
        };
    }
    let potential: Vec<usize> = (0..n)
        .filter(|&i| might_help(fit, cycle.nodes[i].name()))
        .collect();
    let mut reasons = not_helpful(n, potential.len());
    let wanted = (potential.len() * args.min_candidate_nodes_percentage as usize / 100)
        .max(args.min_candidate_nodes_absolute as usize)
        .min(potential.len());
    let offset = if potential.is_empty() {
        0
    } else {
        fastrand::usize(0..potential.len())
    };
    let priority = priority_of(pod);
    let mut non_violating = Vec::new();
    let mut violating = Vec::new();
    for k in 0..potential.len() {
        if !non_violating.is_empty() && non_violating.len() + violating.len() >= wanted {
            break;
        }
        let entry = &cycle.nodes[potential[(offset + k) % potential.len()]];
        let units = victims::units_on(entry.name(), priority, inputs);
        match victims::select(engine, pod, cycle, entry, units, inputs) {
            Ok(c) if c.pdb_violations == 0 => non_violating.push(c),
            Ok(c) => violating.push(c),
            Err(reason) => *reasons.entry(reason).or_default() += 1,
        }
    }
    non_violating.extend(violating);
    match pick_one(non_violating) {
        Some(c) => Verdict::Nominate(c),
        None => failed(n, &reasons, potential.is_empty()),
    }
}

/// DefaultPreemption for `pod` when no assumed or bound pod has a lower priority (the cache
/// knows without a dry run): what [`preempt`] would answer, without reading the cluster.
pub fn without_victims(pod: &Pod, fit: &FitError) -> Verdict {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
    {
        return Verdict::Fail {
            message: "preemption: not eligible due to preemptionPolicy=Never.".to_owned(),
            clear_nomination: false,
        };
    }
    let n = fit.num_all_nodes;
    let potential = fit
        .node_statuses
        .keys()
        .filter(|node| might_help(fit, node))
        .count();
    let mut reasons = not_helpful(n, potential);
    if potential > 0 {
        reasons.insert(NO_VICTIMS.to_owned(), potential);
    }
    failed(n, &reasons, potential == 0)
}

const NO_VICTIMS: &str = "No preemption victims found for incoming pod";

/// The histogram of why preemption cannot help, started with the nodes it cannot help at all.
fn not_helpful(n: usize, potential: usize) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    if n > potential {
        reasons.insert(
            "Preemption is not helpful for scheduling".to_owned(),
            n - potential,
        );
    }
    reasons
}

/// No candidate (W80): `preemption: 0/N nodes are available: <count> <reason>, ….`
fn failed(n: usize, reasons: &BTreeMap<String, usize>, clear_nomination: bool) -> Verdict {
    let mut parts: Vec<String> = reasons
        .iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    parts.sort();
    Verdict::Fail {
        message: format!(
            "preemption: 0/{n} nodes are available: {}.",
            parts.join(", ")
        ),
        clear_nomination,
    }
}

/// The candidate to take (W86): fewest PDB violations, then the lowest highest-victim
/// priority, the smallest sum of priorities, the fewest victims, the latest start among the
/// highest-priority victims; the last tie goes to the smallest node name (D-L6).
fn pick_one(candidates: Vec<Candidate>) -> Option<Candidate> {
    let key = |c: &Candidate| {
        let highest = c
            .victims
            .iter()
            .map(|v| priority_of(v))
            .max()
            .unwrap_or(i32::MIN);
        let sum: i64 = c
            .victims
            .iter()
            .map(|v| i64::from(priority_of(v)) + (1i64 << 31))
            .sum();
        // The earliest start among the highest-priority victims; later is better.
        let earliest = c
            .victims
            .iter()
            .filter(|v| priority_of(v) == highest)
            .map(|v| victims::start_of(v))
            .min();
        (
            c.pdb_violations,
            highest,
            sum,
            c.victims.len(),
            std::cmp::Reverse(earliest),
            c.node.clone(),
        )
    };
    candidates.into_iter().min_by_key(key)
}

/// The group a pod is evicted with, when its PodGroup asks for that (D-L3).
fn unit_group(pod: &Pod, inputs: &PreemptionInputs) -> Option<(GroupKey, Option<i32>)> {
    let key = group_of(pod)?;
    let priority = *inputs.group_units.get(&key)?;
    Some((key, priority))
}

#[cfg(test)]
mod tests;
