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
//! - the last tie between candidates goes to the smallest node name, not map order (D-L6);
//! - the devices the dry run found for a nominated pod are held from pods of lower priority
//!   while its victims terminate, as its cpu and memory are (W92).
//!
//! The dry run is pure: the cluster as read under the cache lock ([`PreemptionInputs`]) and the
//! scheduling [`Engine`] to run the filters and the allocator on one node. [`actuate`] writes
//! the outcome.

pub mod actuate;
pub mod group;
mod inputs;
pub mod pdb;
mod victims;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::cache::priority_of;
use crate::config::PreemptionArgs;
use crate::cycle::{CycleInputs, Engine};
use crate::framework::{Code, FitError, Plugin};

pub use inputs::{Candidate, PreemptionInputs};
use inputs::{NO_VICTIMS, has_disruption_target};
pub use victims::Unit;

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

/// W79: a pod whose PriorityClass says `preemptionPolicy: Never` never preempts.
fn never_preempts(pod: &Pod) -> Option<&'static str> {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref());
    (policy == Some("Never")).then_some("not eligible due to preemptionPolicy=Never.")
}

/// W79: not eligible with `preemptionPolicy: Never`, or while it waits for victims that are
/// already terminating on its nominated node.
fn not_eligible(pod: &Pod, fit: &FitError, inputs: &PreemptionInputs) -> Option<&'static str> {
    if let Some(why) = never_preempts(pod) {
        return Some(why);
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
                && has_disruption_target(&p.pod)
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
    // Every device in use, indexed once; each dry run takes its victims' devices back from it.
    let base = engine.index_of(&inputs.base);
    let mut non_violating = Vec::new();
    let mut violating = Vec::new();
    for k in 0..potential.len() {
        if !non_violating.is_empty() && non_violating.len() + violating.len() >= wanted {
            break;
        }
        let entry = &cycle.nodes[potential[(offset + k) % potential.len()]];
        let units = victims::units_on(entry.name(), priority, inputs);
        match victims::select(engine, pod, cycle, entry, units, inputs, &base) {
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

/// The dry run on every node where preemption might help, none left out (`devicelet
/// schedule`, the kube-scheduler oracle): per node, its candidate or why there is none; and
/// the verdict [`preempt`] would reach had it looked at all of them.
pub fn dry_run_every_node(
    engine: &mut Engine<'_>,
    pod: &Pod,
    cycle: &CycleInputs,
    fit: &FitError,
    inputs: &PreemptionInputs,
) -> (BTreeMap<String, Result<Candidate, String>>, Verdict) {
    let mut per_node = BTreeMap::new();
    if let Some(why) = not_eligible(pod, fit, inputs) {
        let verdict = Verdict::Fail {
            message: format!("preemption: {why}"),
            clear_nomination: false,
        };
        return (per_node, verdict);
    }
    let n = cycle.nodes.len();
    let priority = priority_of(pod);
    let base = engine.index_of(&inputs.base);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut potential = 0;
    let (mut non_violating, mut violating) = (Vec::new(), Vec::new());
    for entry in &cycle.nodes {
        if !might_help(fit, entry.name()) {
            continue;
        }
        potential += 1;
        let units = victims::units_on(entry.name(), priority, inputs);
        let found = victims::select(engine, pod, cycle, entry, units, inputs, &base);
        match &found {
            Ok(c) if c.pdb_violations == 0 => non_violating.push(c.clone()),
            Ok(c) => violating.push(c.clone()),
            Err(reason) => *reasons.entry(reason.clone()).or_default() += 1,
        }
        per_node.insert(entry.name().to_owned(), found);
    }
    reasons.extend(not_helpful(n, potential));
    non_violating.extend(violating);
    let verdict = match pick_one(non_violating) {
        Some(c) => Verdict::Nominate(c),
        None => failed(n, &reasons, potential == 0),
    };
    (per_node, verdict)
}

/// DefaultPreemption for `pod` when no assumed or bound pod has a lower priority (the cache
/// knows without a dry run): what [`preempt`] would answer, without reading the cluster.
pub fn without_victims(pod: &Pod, fit: &FitError) -> Verdict {
    if let Some(why) = never_preempts(pod) {
        return Verdict::Fail {
            message: format!("preemption: {why}"),
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

#[cfg(test)]
mod tests;
