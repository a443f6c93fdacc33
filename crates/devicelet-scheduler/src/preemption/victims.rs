//! The victims on one node (`default_preemption.go` → `SelectVictimsOnNode`, W82-W84): remove
//! every lower-priority unit, check the pod fits, then add units back, most important first and
//! PDB-protected ones before the rest, keeping each one the pod still fits beside.

use std::collections::HashSet;
use std::sync::Arc;

use devicelet_allocator::AllocatedIndex;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::inputs::{Candidate, NO_VICTIMS, PreemptionInputs, unit_group};
use super::pdb;
use crate::cache::{NodeEntry, PodOnNode, priority_of};
use crate::cycle::{CycleInputs, Engine};
use crate::gang::group_of;

/// What is evicted together: one pod, or every pod of a PodGroup with `disruptionMode:
/// PodGroup` (on any node).
#[derive(Clone, Debug)]
pub struct Unit {
    /// (node, pod).
    pub pods: Vec<(String, PodOnNode)>,
    pub priority: i32,
    /// A PodGroup unit.
    pub group: bool,
}

impl Unit {
    /// The earliest start of its pods.
    fn start(&self) -> Timestamp {
        self.pods
            .iter()
            .map(|(_, p)| start_of(&p.pod))
            .min()
            .unwrap_or(Timestamp::MAX)
    }
}

/// A pod's `status.startTime`. A pod not started counts as started last (upstream takes the
/// time of the call, so two such pods compare by when they were looked at; here they tie).
pub fn start_of(pod: &Pod) -> Timestamp {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(Timestamp::MAX, |t| t.0)
}

/// The units with a pod on `node` and a priority below `priority`. Pods still binding are
/// never victims (their placement is not final), nor a group with such a member.
pub(super) fn units_on(node: &str, priority: i32, inputs: &PreemptionInputs) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut groups_seen = HashSet::new();
    for p in inputs.pods_by_node.get(node).into_iter().flatten() {
        if p.assumed {
            continue;
        }
        match unit_group(&p.pod, inputs) {
            None => {
                let pod_priority = priority_of(&p.pod);
                if pod_priority < priority {
                    units.push(Unit {
                        pods: vec![(node.to_owned(), p.clone())],
                        priority: pod_priority,
                        group: false,
                    });
                }
            }
            Some((key, group_priority)) => {
                if !groups_seen.insert(key.clone()) {
                    continue;
                }
                let members: Vec<(String, PodOnNode)> = inputs
                    .pods_by_node
                    .iter()
                    .flat_map(|(n, pods)| pods.iter().map(move |p| (n, p)))
                    .filter(|(_, m)| group_of(&m.pod).as_ref() == Some(&key))
                    .map(|(n, m)| (n.clone(), m.clone()))
                    .collect();
                if members.iter().any(|(_, m)| m.assumed) {
                    continue;
                }
                // The group's own priority, else its most important member's: a pod is never
                // evicted for a preemptor of lower priority than itself.
                let unit_priority = group_priority.unwrap_or_else(|| {
                    members
                        .iter()
                        .map(|(_, m)| priority_of(&m.pod))
                        .max()
                        .unwrap_or(0)
                });
                if unit_priority < priority {
                    units.push(Unit {
                        pods: members,
                        priority: unit_priority,
                        group: true,
                    });
                }
            }
        }
    }
    units
}

/// Whether `pod` fits on `entry` once `units` are gone (pods elsewhere count only through the
/// devices their claims free).
fn fits_without(
    engine: &mut Engine<'_>,
    pod: &Pod,
    cycle: &CycleInputs,
    entry: &NodeEntry,
    units: &[&Unit],
    inputs: &PreemptionInputs,
    base: &AllocatedIndex,
) -> Result<Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult>, Vec<String>> {
    let node = entry.name();
    let mut usage = (*entry.usage).clone();
    let mut removed: HashSet<&str> = HashSet::new();
    for unit in units {
        for (n, p) in &unit.pods {
            if n == node {
                usage.remove(&p.usage);
            }
            removed.insert(p.uid.as_str());
        }
    }
    let index = index_without(engine, &removed, inputs, base);
    let entry = NodeEntry {
        usage: Arc::new(usage),
        ..entry.clone()
    };
    engine.fits_on(pod, cycle, entry, index)
}

/// The devices in use once the pods `removed` are gone: the claims only they hold taken back
/// from `base` (the index of everything in use), or, for a share of a device, the index
/// rebuilt without those claims.
pub(super) fn index_without(
    engine: &Engine<'_>,
    removed: &HashSet<&str>,
    inputs: &PreemptionInputs,
    base: &AllocatedIndex,
) -> AllocatedIndex {
    let freed = inputs.freed_by(removed);
    let mut index = base.clone();
    let exact = freed.iter().all(|&i| {
        inputs.claims[i]
            .0
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .into_iter()
            .flat_map(|d| d.results.iter().flatten())
            .all(|r| engine.remove_from(&mut index, r))
    });
    if exact {
        index
    } else {
        engine.index_of(&inputs.state_without(&freed))
    }
}

/// Most important first (W83, W98): higher priority, a group before a pod, earlier start,
/// more pods.
pub(super) fn sort_most_important_first(units: &mut [Unit]) {
    units.sort_by_cached_key(|u| {
        (
            std::cmp::Reverse(u.priority),
            !u.group,
            u.start(),
            std::cmp::Reverse(u.pods.len()),
        )
    });
}

/// W83, W98: every unit of `ordered` (most important first) starts evicted; each one is
/// reprieved in turn when `fits` still answers with the rest evicted. Returns which stay
/// evicted and the answer for exactly that set (`None` when no trial fitted).
pub(super) fn reprieve<T>(
    ordered: &[Unit],
    mut fits: impl FnMut(&[&Unit]) -> Option<T>,
) -> (Vec<bool>, Option<T>) {
    let mut evicted = vec![true; ordered.len()];
    let mut last = None;
    for k in 0..ordered.len() {
        evicted[k] = false;
        let still: Vec<&Unit> = ordered
            .iter()
            .zip(&evicted)
            .filter(|(_, e)| **e)
            .map(|(u, _)| u)
            .collect();
        match fits(&still) {
            Some(answer) => last = Some(answer),
            None => evicted[k] = true,
        }
    }
    (evicted, last)
}

/// The fewest and least important units to evict from `entry` for `pod` to fit (W82, W83):
/// the candidate, or the reason the node is none.
pub(super) fn select(
    engine: &mut Engine<'_>,
    pod: &Pod,
    cycle: &CycleInputs,
    entry: &NodeEntry,
    mut units: Vec<Unit>,
    inputs: &PreemptionInputs,
    base: &AllocatedIndex,
) -> Result<Candidate, String> {
    if units.is_empty() {
        return Err(NO_VICTIMS.to_owned());
    }
    let all: Vec<&Unit> = units.iter().collect();
    let mut devices =
        fits_without(engine, pod, cycle, entry, &all, inputs, base).map_err(|r| r.join(", "))?;
    sort_most_important_first(&mut units);
    let (violating, other) = pdb::split_by_violation(
        units,
        |u| u.pods.iter().map(|(_, p)| &*p.pod).collect(),
        &inputs.pdbs,
    );
    let violating_count = violating.len();
    // Every unit starts evicted; each one the pod still fits beside is reprieved.
    let ordered: Vec<Unit> = violating.into_iter().chain(other).collect();
    let (evicted, last) = reprieve(&ordered, |still| {
        fits_without(engine, pod, cycle, entry, still, inputs, base).ok()
    });
    if let Some(d) = last {
        devices = d;
    }
    let pdb_violations = evicted[..violating_count].iter().filter(|e| **e).count();
    let mut victims: Vec<Arc<Pod>> = ordered
        .iter()
        .zip(&evicted)
        .filter(|(_, e)| **e)
        .flat_map(|(u, _)| u.pods.iter().map(|(_, p)| p.pod.clone()))
        .collect();
    if victims.is_empty() {
        return Err(format!(
            "expected at least one victim pod on node {:?}",
            entry.name()
        ));
    }
    victims.sort_by_cached_key(|p| (std::cmp::Reverse(priority_of(p)), start_of(p)));
    Ok(Candidate {
        node: entry.name().to_owned(),
        devices,
        victims,
        pdb_violations,
    })
}
