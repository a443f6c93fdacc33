//! Workload-aware preemption for a pod group that found no placement
//! (`pkg/scheduler/framework/preemption/podgrouppreemption.go`, spec W94-W98, A-L2, D-L2): the
//! whole cluster is one domain; every unit of lower priority than the group (a pod, or a
//! PodGroup with `disruptionMode: PodGroup`) is removed, the whole group search runs again
//! (no PostFilter inside it: nothing is evicted while simulating, A-L2 fixed), then units are
//! reprieved, most important first and PDB-protected ones before the rest, each kept only if
//! the group still fits beside it. Victims' claims free their devices as in pod-by-pod
//! preemption (W107). Groups with topology constraints get none (W95, C-L2), as upstream.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use devicelet_allocator::AllocatedIndex;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;

use super::inputs::{PreemptionInputs, has_disruption_target};
use super::victims::{self, Unit};
use super::{never_preempts, pdb};
use crate::cache::NodeEntry;
use crate::cycle::{CycleInputs, Engine};
use crate::gang::search::{
    GroupOutcome, GroupProblem, MemberInput, MemberResult, Verdict as Search, schedule_group,
};
use crate::gang::{GroupKey, group_of};

/// Upstream's text for a group with topology constraints (W95).
pub const CONSTRAINED: &str =
    "workload aware preemption is not supported for pod groups with scheduling constraints";

/// What workload-aware preemption decided for a group.
#[derive(Debug)]
pub enum GroupVerdict {
    /// Evict `victims`; each member in `placements` (index into the members, node, its
    /// devices) is nominated there (W24) and waits for the victims to go.
    Preempt {
        victims: Vec<Arc<Pod>>,
        placements: Vec<(usize, String, Vec<DeviceRequestAllocationResult>)>,
        pdb_violations: usize,
    },
    /// No preemption: the text appended to the group's message.
    Fail(String),
    /// Victims of a preemption are still terminating: the group keeps waiting for them (its
    /// members keep their nominations); the text for the message.
    StillWaiting(String),
}

/// The group's priority (W94): `spec.priority`; the members' own do not count. Without the
/// WorkloadAwarePreemption gate the API server keeps no group priority (the field is dropped):
/// then the highest of the members' own, as pod-by-pod preemption would have used.
pub fn group_priority<'a>(group: &PodGroup, members: impl IntoIterator<Item = &'a Pod>) -> i32 {
    group.spec.priority.unwrap_or_else(|| {
        members
            .into_iter()
            .map(crate::cache::priority_of)
            .max()
            .unwrap_or(0)
    })
}

/// Workload-aware preemption for the group `key` whose search (`problem`) placed too few
/// `members`.
pub fn preempt_group(
    engine: &mut Engine<'_>,
    key: &GroupKey,
    group: &PodGroup,
    members: &[MemberInput],
    problem: &GroupProblem,
    inputs: &PreemptionInputs,
) -> GroupVerdict {
    if problem.topology.is_some() {
        return GroupVerdict::Fail(CONSTRAINED.to_owned());
    }
    if let Some(why) = members.iter().find_map(|m| never_preempts(&m.pod)) {
        return GroupVerdict::Fail(format!("preemption: {why}"));
    }
    let priority = group_priority(group, members.iter().map(|m| &*m.pod));
    // As W79 for a pod: victims of an earlier preemption still terminating mean this group
    // (or another one) is already waiting for room; preempting again would take more.
    let terminating = inputs.pods_by_node.values().flatten().any(|p| {
        crate::cache::priority_of(&p.pod) < priority
            && p.pod.metadata.deletion_timestamp.is_some()
            && has_disruption_target(&p.pod)
    });
    if terminating {
        return GroupVerdict::StillWaiting(
            "preemption: not eligible while victims of a preemption are terminating.".to_owned(),
        );
    }
    let mut units = cluster_units(key, priority, inputs);
    if units.is_empty() {
        return GroupVerdict::Fail(
            "preemption: No preemption victims found for incoming preemptor".to_owned(),
        );
    }
    let base = engine.index_of(&inputs.base);
    let all: Vec<&Unit> = units.iter().collect();
    let mut fitting = group_without(engine, members, problem, &all, inputs, &base);
    if fitting.verdict != Search::Placed {
        return GroupVerdict::Fail(format!(
            "preemption: the pod group does not fit even with its {} lower-priority unit(s) evicted",
            units.len()
        ));
    }
    victims::sort_most_important_first(&mut units);
    let (violating, other) = pdb::split_by_violation(
        units,
        |u| u.pods.iter().map(|(_, p)| &*p.pod).collect(),
        &inputs.pdbs,
    );
    let violating_count = violating.len();
    let ordered: Vec<Unit> = violating.into_iter().chain(other).collect();
    // D-L4: the whole group search per unit, as upstream; the search memoises what nodes
    // answer, so a unit on a node no member uses costs little.
    let (evicted, last) = victims::reprieve(&ordered, |still| {
        let outcome = group_without(engine, members, problem, still, inputs, &base);
        (outcome.verdict == Search::Placed).then_some(outcome)
    });
    if let Some(outcome) = last {
        fitting = outcome;
    }
    let victims: Vec<Arc<Pod>> = ordered
        .iter()
        .zip(&evicted)
        .filter(|(_, e)| **e)
        .flat_map(|(u, _)| u.pods.iter().map(|(_, p)| p.pod.clone()))
        .collect();
    if victims.is_empty() {
        // Every unit reprieved: the group fits as the cluster is (it changed since its cycle).
        return GroupVerdict::Fail("preemption: the pod group fits without victims".to_owned());
    }
    let placements = fitting
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| match m {
            MemberResult::Placed(p) => Some((
                i,
                p.node.clone(),
                p.allocations
                    .iter()
                    .flat_map(|(_, a)| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                    .cloned()
                    .collect(),
            )),
            MemberResult::NotPlaced { .. } => None,
        })
        .collect();
    GroupVerdict::Preempt {
        victims,
        placements,
        pdb_violations: evicted[..violating_count].iter().filter(|e| **e).count(),
    }
}

/// Every unit in the cluster below `priority` (W97), once each, never one of the group's own
/// members.
fn cluster_units(key: &GroupKey, priority: i32, inputs: &PreemptionInputs) -> Vec<Unit> {
    let mut nodes: Vec<&String> = inputs.pods_by_node.keys().collect();
    nodes.sort();
    let mut seen: HashSet<Vec<String>> = HashSet::new();
    let mut units = Vec::new();
    for node in nodes {
        for unit in victims::units_on(node, priority, inputs) {
            if unit
                .pods
                .iter()
                .any(|(_, p)| group_of(&p.pod).as_ref() == Some(key))
            {
                continue;
            }
            let mut uids: Vec<String> = unit.pods.iter().map(|(_, p)| p.uid.clone()).collect();
            uids.sort();
            if seen.insert(uids) {
                units.push(unit);
            }
        }
    }
    units
}

/// The group search on the cluster without `units`: their pods' usage off their nodes, the
/// devices of the claims only they hold freed. The engine's index is restored after.
fn group_without(
    engine: &mut Engine<'_>,
    members: &[MemberInput],
    problem: &GroupProblem,
    units: &[&Unit],
    inputs: &PreemptionInputs,
    base: &AllocatedIndex,
) -> GroupOutcome {
    let mut removed: HashSet<&str> = HashSet::new();
    let mut off: HashMap<&str, Vec<&crate::filters::node_resources_fit::PodUsage>> = HashMap::new();
    for unit in units {
        for (node, p) in &unit.pods {
            removed.insert(p.uid.as_str());
            off.entry(node.as_str()).or_default().push(&p.usage);
        }
    }
    let index = victims::index_without(engine, &removed, inputs, base);
    let without = |nodes: &[NodeEntry]| -> Vec<NodeEntry> {
        nodes
            .iter()
            .map(|e| match off.get(e.name()) {
                None => e.clone(),
                Some(usages) => {
                    let mut usage = (*e.usage).clone();
                    for u in usages {
                        usage.remove(u);
                    }
                    NodeEntry {
                        usage: Arc::new(usage),
                        ..e.clone()
                    }
                }
            })
            .collect()
    };
    let trial: Vec<MemberInput> = members
        .iter()
        .map(|m| MemberInput {
            pod: m.pod.clone(),
            inputs: CycleInputs {
                nodes: without(&m.inputs.nodes),
                ..m.inputs.clone()
            },
        })
        .collect();
    let saved = engine.index().clone();
    engine.set_index(index);
    let outcome = schedule_group(engine, &trial, problem);
    engine.set_index(saved);
    outcome
}
