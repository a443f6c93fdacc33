//! The pod-group cycle (`pkg/scheduler/schedule_one_podgroup.go` → `podGroupCycle`,
//! `podGroupSchedulingDefaultAlgorithm`, `podGroupSchedulingPlacementAlgorithm`; spec
//! workloads.md W16-W25, W62-W76). Pure: the caller reads every member's inputs under one cache
//! lock (W16), and commits or fails the members with the outcome.
//!
//! Upstream runs one greedy pass: each member, in order, takes the best node for it, and a later
//! member that finds no room fails the group although another choice for an earlier member
//! would have left room (kubernetes#138765, A-L1, B-L5). Here the pass is a depth-first search:
//! - the first choice of every member is the node the single-pod cycle would choose, so a
//!   group that fits greedily is placed exactly as upstream would;
//! - when a member finds no node, the members already placed on a node where it would fit are
//!   first re-packed together with it: one allocator search over all their claims on that node
//!   revisits every device choice there (the first pod took a whole GPU where two halves would
//!   serve both, or the first subrequest of a prioritized list);
//! - then earlier members' node choices are revisited, the next best first;
//! - a member that fits nowhere even with no member placed ends the search at once (no choice
//!   of the others can help), states reached twice (members of the same shape swapped) are not
//!   searched again, and the whole search has a deadline (the DRA filter timeout bounds it).
//!
//! Everything is simulated on copies: the node usage, the devices in use (an
//! [`AllocatedIndex`] per state) and the allocations of claims members share (a later member
//! reuses the earlier one's pending allocation, which fixes B-L1 and, as the allocation's node
//! selector restricts the later member, B-L2).
//!
//! With a topology key (W62-W76) the search runs once per domain, in the order of the domain
//! values (C-L1 fixed), each on the domain's nodes only; among the domains that fit, the
//! placement scores decide (W70 PodGroupPodsCount, W71 NodeResourcesFit MostAllocated).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use devicelet_allocator::AllocatedIndex;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimStatus};

use crate::cache::NodeEntry;
use crate::cycle::{CycleInputs, Decision, Engine, NodeMemo, Outcome, Placement, PodLevelFilters};
use crate::filters::node_resources_fit::PodUsage;
use crate::filters::volumes::VolumeCheck;
use crate::filters::{self, PodFacts};
use crate::framework::{FitError, Plugin};
use crate::gang::Policy;
use crate::gang::memo::Memos;

/// Alternatives kept per member (the next best nodes) for backtracking.
const ALTERNATIVES: usize = 8;

/// One member of the group, as read from the cache.
pub struct MemberInput {
    pub pod: Arc<Pod>,
    pub inputs: CycleInputs,
}

impl MemberInput {
    /// Members with the same signature are interchangeable: same spec, same claim specs.
    fn signature(&self) -> u64 {
        let mut h = DefaultHasher::new();
        if let Some(spec) = &self.pod.spec {
            let mut spec = spec.clone();
            spec.hostname = None;
            spec.subdomain = None;
            serde_json::to_string(&spec)
                .unwrap_or_default()
                .hash(&mut h);
        }
        if let Ok(Some(state)) = &self.inputs.dra {
            for c in &state.claims {
                serde_json::to_string(&c.claim.spec)
                    .unwrap_or_default()
                    .hash(&mut h);
                c.claim
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_some()
                    .hash(&mut h);
            }
        }
        h.finish()
    }

    fn name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or(""),
            self.pod.metadata.name.as_deref().unwrap_or("")
        )
    }
}

/// A topology constraint (W62) with what the members already placed pin (W65).
#[derive(Clone, Debug)]
pub struct Topology {
    pub key: String,
    /// The nodes of the group's members already assumed or bound.
    pub scheduled_nodes: Vec<String>,
}

/// What the group must achieve.
#[derive(Clone, Debug)]
pub struct GroupProblem {
    pub policy: Policy,
    /// Members already assumed or bound (they count toward the quorum, W26, W31).
    pub scheduled: usize,
    pub topology: Option<Topology>,
    /// When the search gives up.
    pub deadline: Instant,
}

/// One member's result.
#[derive(Debug)]
pub enum MemberResult {
    Placed(Placement),
    /// Not placed; its own rejection when it had one (a member that fits but whose group does
    /// not has none).
    NotPlaced {
        fit: Option<FitError>,
        claim_names: BTreeSet<(String, String)>,
        /// W56: an allocated claim, reserved by nobody else, that kept it off every node.
        deallocate: Option<Arc<ResourceClaim>>,
    },
}

/// The group's verdict (W20, W23, W25).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Enough members are placed: bind them; the others fail on their own.
    Placed,
    /// Nothing is placed; the message says why (A-L4 fixed).
    Unschedulable(String),
    /// An internal error; nothing is placed.
    Error(String),
}

/// The outcome of a group cycle.
#[derive(Debug)]
pub struct GroupOutcome {
    pub verdict: Verdict,
    /// One per member, in the order given.
    pub members: Vec<MemberResult>,
    /// The topology domain chosen, if any.
    pub domain: Option<String>,
    /// Search states visited (for logs and the benchmark).
    pub states: usize,
    /// With a topology key: how the group fared in each domain, in value order.
    pub domains: Vec<DomainSummary>,
}

/// How the group fared in one topology domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSummary {
    /// The label's value.
    pub value: String,
    pub nodes: usize,
    /// The most members placed at once there.
    pub placed: usize,
    /// Whether the whole group fits there.
    pub fits: bool,
    /// Why not, when it does not.
    pub message: Option<String>,
}

impl GroupOutcome {
    /// The plugins that rejected some member (the whole group waits for their events), plus
    /// GangScheduling (a new member or a PodGroup change retries it).
    pub fn plugins(&self) -> BTreeSet<Plugin> {
        let mut out = BTreeSet::from([Plugin::GangScheduling]);
        for m in &self.members {
            if let MemberResult::NotPlaced { fit: Some(f), .. } = m {
                out.extend(f.plugins());
            }
        }
        out
    }

    /// Every member's claims (any of their changes may help the group).
    pub fn claim_names(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for m in &self.members {
            match m {
                MemberResult::NotPlaced { claim_names, .. } => out.extend(claim_names.clone()),
                MemberResult::Placed(p) => out.extend(p.claims.iter().map(|c| {
                    (
                        c.metadata.namespace.clone().unwrap_or_default(),
                        c.metadata.name.clone().unwrap_or_default(),
                    )
                })),
            }
        }
        out
    }

    /// Members placed.
    pub fn placed(&self) -> usize {
        self.members
            .iter()
            .filter(|m| matches!(m, MemberResult::Placed(_)))
            .count()
    }
}

/// A claim with its (simulated) allocation.
type ClaimAllocation = (Arc<ResourceClaim>, AllocationResult);
/// A member's rejection, its claims, and the claim its PostFilter would deallocate (S43).
type MemberFailure = (
    FitError,
    BTreeSet<(String, String)>,
    Option<Arc<ResourceClaim>>,
);

/// A candidate for one member: its placement, and when it came from re-packing a node, the
/// new allocations of the members already there and the devices in use with them.
#[derive(Clone)]
struct Candidate {
    placement: Placement,
    repacked: Vec<(usize, Vec<ClaimAllocation>)>,
    index: Option<AllocatedIndex>,
}

/// A state of the search: what the members placed so far use.
#[derive(Clone)]
struct Sim {
    nodes: Vec<NodeEntry>,
    index: AllocatedIndex,
    /// Claim UID → its simulated allocation (claims shared by members).
    overlay: HashMap<String, AllocationResult>,
    /// Claims a member reuses from another one's simulated allocation (never re-packed).
    shared: HashSet<String>,
    placed: Vec<Option<Placement>>,
    skipped: usize,
}

impl Sim {
    fn placed_count(&self) -> usize {
        self.placed.iter().filter(|p| p.is_some()).count()
    }
}

impl Candidate {
    /// Every allocation the candidate makes or changes: its own and the re-packed members'.
    fn allocations(&self) -> impl Iterator<Item = &AllocationResult> {
        self.placement.allocating().map(|(_, a)| a).chain(
            self.repacked
                .iter()
                .flat_map(|(_, v)| v.iter().map(|(_, a)| a)),
        )
    }
}

/// Whether member `j`'s DRA answers in `sim` may be kept for its shape: every claim of it still
/// to allocate (an allocated claim's node differs from member to member, which the shape does
/// not say), none shared with another member in this cycle, no DRA-backed extended resources.
fn memo_usable(member: &MemberInput, sim: &Sim) -> bool {
    if member.inputs.extended.is_some() {
        return false;
    }
    let Ok(Some(state)) = &member.inputs.dra else {
        return true;
    };
    state.allocated_selectors.is_empty()
        && state.unusable.is_empty()
        && state.to_allocate.len() == state.claims.len()
        && !state.claims.iter().any(|c| {
            sim.overlay
                .contains_key(c.claim.metadata.uid.as_deref().unwrap_or(""))
        })
}

enum Failure {
    Unschedulable(Box<MemberFailure>),
    Error(String),
}

/// The result of the search in one domain.
struct DomainResult {
    sim: Option<Sim>,
    /// The most members placed at once, and the first member's rejection that stopped a pass.
    best_placed: usize,
    first_failure: Option<(usize, FitError)>,
    failures: Vec<Option<MemberFailure>>,
    timed_out: bool,
    error: Option<String>,
    states: usize,
}

/// Runs the group cycle for `members` (in the order they are to be tried, W12).
pub fn schedule_group(
    engine: &mut Engine<'_>,
    members: &[MemberInput],
    problem: &GroupProblem,
) -> GroupOutcome {
    let base_index = engine.index().clone();
    let all_nodes: Vec<NodeEntry> = members
        .first()
        .map(|m| m.inputs.nodes.clone())
        .unwrap_or_default();
    let signatures: Vec<u64> = members.iter().map(MemberInput::signature).collect();
    let needed = match problem.policy {
        Policy::Basic => 1.min(members.len()),
        Policy::Gang { min_count } => min_count.saturating_sub(problem.scheduled),
    };
    let outcome = match &problem.topology {
        None => {
            let result = search(
                engine,
                members,
                &signatures,
                all_nodes,
                &base_index,
                needed,
                problem.deadline,
            );
            finish(members, problem, needed, result, None)
        }
        Some(topology) => by_domain(
            engine,
            members,
            &signatures,
            &all_nodes,
            &base_index,
            needed,
            problem,
            topology,
        ),
    };
    // Everything simulated is undone (W21): the caller reserves the chosen placements for real.
    engine.set_index(base_index);
    outcome
}

#[allow(clippy::too_many_arguments)]
fn by_domain(
    engine: &mut Engine<'_>,
    members: &[MemberInput],
    signatures: &[u64],
    all_nodes: &[NodeEntry],
    base_index: &AllocatedIndex,
    needed: usize,
    problem: &GroupProblem,
    topology: &Topology,
) -> GroupOutcome {
    let key = topology.key.as_str();
    let label = |e: &NodeEntry| -> Option<String> {
        e.node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .cloned()
    };
    let unlabelled = all_nodes.iter().filter(|e| label(e).is_none()).count();
    let mut domains: BTreeMap<String, Vec<NodeEntry>> = BTreeMap::new();
    for e in all_nodes {
        if let Some(v) = label(e) {
            domains.entry(v).or_default().push(e.clone());
        }
    }
    // W65: members already placed pin the domain; C-L4: members spread over several domains
    // are Unschedulable (with upstream's text), not a SchedulerError.
    if !topology.scheduled_nodes.is_empty() {
        let mut pinned = BTreeSet::new();
        for n in &topology.scheduled_nodes {
            match all_nodes.iter().find(|e| e.name() == n).and_then(label) {
                Some(v) => {
                    pinned.insert(v);
                }
                None => {
                    return unschedulable_all(
                        members,
                        format!(
                            "cannot determine domain for already scheduled pods: no topology domain found for pod on node {n}"
                        ),
                    );
                }
            }
        }
        if pinned.len() > 1 {
            let values: Vec<&str> = pinned.iter().map(String::as_str).collect();
            return unschedulable_all(
                members,
                format!(
                    "cannot determine domain for already scheduled pods: more than 1 domain found for pod group: {}",
                    values.join(", ")
                ),
            );
        }
        domains.retain(|v, _| pinned.contains(v));
    }
    if domains.is_empty() {
        return unschedulable_all(
            members,
            format!(
                "no feasible placements found: no node has the label {key} ({unlabelled} node(s) without it are in no domain)"
            ),
        );
    }
    let total = domains.len();
    let mut results: Vec<(String, DomainResult)> = Vec::new();
    let mut summaries = Vec::new();
    let mut states = 0;
    for (value, nodes) in domains {
        let node_count = nodes.len();
        let r = search(
            engine,
            members,
            signatures,
            nodes,
            base_index,
            needed,
            problem.deadline,
        );
        states += r.states;
        if let Some(e) = &r.error {
            let mut out = unschedulable_all(members, String::new());
            out.verdict = Verdict::Error(e.clone());
            out.states = states;
            return out;
        }
        summaries.push(DomainSummary {
            value: value.clone(),
            nodes: node_count,
            placed: r.best_placed,
            fits: r.sim.is_some(),
            message: r
                .sim
                .is_none()
                .then(|| failure_message(members, problem, needed, &r)),
        });
        results.push((value, r));
    }
    let successes: Vec<usize> = (0..results.len())
        .filter(|&i| results[i].1.sim.is_some())
        .collect();
    if successes.is_empty() {
        // C-L1 fixed: report the domain where most members fitted, first in value order on ties.
        let mut report = 0;
        for (i, (_, r)) in results.iter().enumerate() {
            if r.best_placed > results[report].1.best_placed {
                report = i;
            }
        }
        let (value, r) = results.swap_remove(report);
        let status = failure_message(members, problem, needed, &r);
        let mut message = format!(
            "0/{total} placements are available, first placement status: {key}={value}: {status}"
        );
        // Each other domain's count too: why each one failed, in short (`devicelet explain
        // podgroup/NAME` has the members' reasons per domain).
        let others: Vec<String> = summaries
            .iter()
            .filter(|d| d.value != value)
            .filter_map(|d| {
                let short = d.message.as_deref()?.split(": pod ").next()?;
                Some(format!("{key}={}: {short}", d.value))
            })
            .collect();
        if !others.is_empty() {
            const SHOWN: usize = 8;
            message.push_str(&format!(
                "; other placements: {}",
                others[..others.len().min(SHOWN)].join(", ")
            ));
            if others.len() > SHOWN {
                message.push_str(&format!(" and {} more", others.len() - SHOWN));
            }
        }
        if unlabelled > 0 {
            message.push_str(&format!(
                " ({unlabelled} node(s) without the label {key} are in no domain)"
            ));
        }
        let mut out = finish(members, problem, needed, r, Some(value));
        out.verdict = Verdict::Unschedulable(message);
        out.domain = None;
        out.states = states;
        out.domains = summaries;
        return out;
    }
    let chosen = if successes.len() == 1 {
        successes[0]
    } else {
        let resources = &engine.profile_of(&members[0].pod).scoring.resources;
        choose_domain(problem, &results, &successes, resources)
    };
    let (value, r) = results.swap_remove(chosen);
    let mut out = finish(members, problem, needed, r, Some(value.clone()));
    out.domain = Some(value);
    out.states = states;
    out.domains = summaries;
    out
}

/// Among the domains that fit, the one with the highest placement score: PodGroupPodsCount
/// normalised to 0-100 (W70) plus NodeResourcesFit's MostAllocated over the profile's
/// `scoringStrategy.resources` on the domain's nodes with the proposed pods, their weighted
/// mean not normalised (W71). Ties go to the first domain in value order.
fn choose_domain(
    problem: &GroupProblem,
    results: &[(String, DomainResult)],
    successes: &[usize],
    resources: &[(String, i64)],
) -> usize {
    let pods: Vec<i64> = successes
        .iter()
        .map(|&i| {
            let sim = results[i].1.sim.as_ref();
            let placed = sim.map_or(0, Sim::placed_count);
            let scheduled_here = problem.topology.as_ref().map_or(0, |t| {
                t.scheduled_nodes
                    .iter()
                    .filter(|n| sim.is_some_and(|s| s.nodes.iter().any(|e| e.name() == *n)))
                    .count()
            });
            (placed + scheduled_here) as i64
        })
        .collect();
    let max_pods = pods.iter().copied().max().unwrap_or(0).max(1);
    let mut best: Option<(i64, usize)> = None;
    for (k, &i) in successes.iter().enumerate() {
        let Some(sim) = &results[i].1.sim else {
            continue;
        };
        let pods_score = pods[k] * 100 / max_pods;
        let total = pods_score + most_allocated(&sim.nodes, resources);
        if best.is_none_or(|(b, _)| total > b) {
            best = Some((total, i));
        }
    }
    best.map_or(successes[0], |(_, i)| i)
}

/// W71: MostAllocated over `resources` (name, weight) of a domain's nodes, whose simulated
/// usage includes the proposed members: per resource requested (cpu and memory with the
/// non-zero defaults) × 100 / allocatable, capped, then the weighted integer mean.
pub(super) fn most_allocated(nodes: &[NodeEntry], resources: &[(String, i64)]) -> i64 {
    let (mut sum, mut weights) = (0i128, 0i128);
    for (name, weight) in resources {
        let (mut requested, mut capacity) = (0i128, 0i128);
        for e in nodes {
            capacity += e.allocatable.get(name).copied().unwrap_or(0);
            requested += match name.as_str() {
                "cpu" => e.usage.non_zero_cpu,
                "memory" => e.usage.non_zero_memory,
                other => e.usage.requested.get(other).copied().unwrap_or(0),
            };
        }
        let score = if capacity <= 0 {
            0
        } else {
            requested.min(capacity) * 100 / capacity
        };
        sum += score * i128::from(*weight);
        weights += i128::from(*weight);
    }
    if weights == 0 {
        0
    } else {
        i64::try_from(sum / weights).unwrap_or(0)
    }
}

fn not_placed(failure: Option<MemberFailure>) -> MemberResult {
    match failure {
        Some((fit, claim_names, deallocate)) => MemberResult::NotPlaced {
            fit: Some(fit),
            claim_names,
            deallocate,
        },
        None => MemberResult::NotPlaced {
            fit: None,
            claim_names: BTreeSet::new(),
            deallocate: None,
        },
    }
}

/// Every member fails with `message`, nothing searched.
fn unschedulable_all(members: &[MemberInput], message: String) -> GroupOutcome {
    GroupOutcome {
        verdict: Verdict::Unschedulable(message),
        members: members.iter().map(|_| not_placed(None)).collect(),
        domain: None,
        states: 0,
        domains: Vec::new(),
    }
}

/// The A-L4 message: `<n>/<minCount> pods schedulable: <first member rejection>`.
fn failure_message(
    members: &[MemberInput],
    problem: &GroupProblem,
    needed: usize,
    r: &DomainResult,
) -> String {
    let want = match problem.policy {
        Policy::Gang { min_count } => min_count,
        Policy::Basic => needed + problem.scheduled,
    };
    let mut message = format!(
        "{}/{} pods schedulable",
        (r.best_placed + problem.scheduled).min(want),
        want
    );
    if let Some((j, fit)) = &r.first_failure {
        message.push_str(&format!(": pod {}: {}", members[*j].name(), fit.message()));
    } else if members.len() + problem.scheduled < want {
        message.push_str(&format!(
            ": the group has {} pods",
            members.len() + problem.scheduled
        ));
    }
    if r.timed_out {
        message.push_str(&format!(
            " (search stopped at its time limit after {} states)",
            r.states
        ));
    }
    message
}

fn finish(
    members: &[MemberInput],
    problem: &GroupProblem,
    needed: usize,
    r: DomainResult,
    domain: Option<String>,
) -> GroupOutcome {
    if let Some(e) = r.error {
        let mut out = unschedulable_all(members, String::new());
        out.verdict = Verdict::Error(e);
        out.states = r.states;
        return out;
    }
    let states = r.states;
    match &r.sim {
        Some(sim) => {
            let mut failures = r.failures;
            let results = sim
                .placed
                .iter()
                .enumerate()
                .map(|(j, p)| match p {
                    Some(p) => MemberResult::Placed(p.clone()),
                    None => not_placed(failures[j].take()),
                })
                .collect();
            GroupOutcome {
                verdict: Verdict::Placed,
                members: results,
                domain,
                states,
                domains: Vec::new(),
            }
        }
        None => {
            let message = failure_message(members, problem, needed, &r);
            let mut failures = r.failures;
            GroupOutcome {
                verdict: Verdict::Unschedulable(message),
                members: (0..members.len())
                    .map(|j| not_placed(failures[j].take()))
                    .collect(),
                domain: None,
                states,
                domains: Vec::new(),
            }
        }
    }
}

/// The depth-first search over `nodes` (see the module documentation).
fn search(
    engine: &mut Engine<'_>,
    members: &[MemberInput],
    signatures: &[u64],
    nodes: Vec<NodeEntry>,
    base_index: &AllocatedIndex,
    needed: usize,
    deadline: Instant,
) -> DomainResult {
    let n = members.len();
    let mut result = DomainResult {
        sim: None,
        best_placed: 0,
        first_failure: None,
        failures: (0..n).map(|_| None).collect(),
        timed_out: false,
        error: None,
        states: 0,
    };
    if n < needed {
        return result;
    }
    let max_skips = n - needed;
    let initial = Sim {
        nodes,
        index: base_index.clone(),
        overlay: HashMap::new(),
        shared: HashSet::new(),
        placed: vec![None; n],
        skipped: 0,
    };
    struct Frame {
        j: usize,
        before: Sim,
        rest: VecDeque<Candidate>,
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut visited: HashSet<u64> = HashSet::new();
    let mut fits_alone: Vec<Option<bool>> = vec![None; n];
    let mut memos = Memos::new();
    let mut sim = initial.clone();
    let mut j = 0;
    'search: loop {
        if j == n {
            result.best_placed = result.best_placed.max(sim.placed_count());
            result.sim = Some(sim);
            return result;
        }
        if Instant::now() > deadline {
            result.timed_out = true;
            return result;
        }
        result.states += 1;
        let memo = if memo_usable(&members[j], &sim) {
            memos.for_shape(signatures[j])
        } else {
            None
        };
        let failed = match evaluate(engine, members, j, &sim, base_index, memo) {
            Ok(cands) if !cands.is_empty() => {
                let mut rest: VecDeque<Candidate> = cands.into();
                if let Some(first) = rest.pop_front() {
                    let before = sim.clone();
                    memos.placed(&first.placement.node, first.allocations());
                    sim = apply(engine, members, j, before.clone(), first);
                    stack.push(Frame { j, before, rest });
                    result.best_placed = result.best_placed.max(sim.placed_count());
                    j += 1;
                    if visited.insert(state_key(&sim, j, signatures)) {
                        continue 'search;
                    }
                }
                None
            }
            Ok(_) => None,
            Err(Failure::Error(e)) => {
                result.error = Some(e);
                return result;
            }
            Err(Failure::Unschedulable(f)) => Some(*f),
        };
        if let Some((fit, claim_names, deallocate)) = failed {
            if result.first_failure.is_none() {
                result.first_failure = Some((j, fit.clone()));
            }
            result.failures[j] = Some((fit, claim_names, deallocate));
            if sim.skipped < max_skips {
                // Members beyond the quorum may stay unplaced (W22: they fail on their own).
                let before = sim.clone();
                sim.skipped += 1;
                stack.push(Frame {
                    j,
                    before,
                    rest: VecDeque::new(),
                });
                j += 1;
                continue 'search;
            }
            // A member that fits nowhere with no member placed cannot be helped by moving the
            // others: the group fails now.
            let alone = *fits_alone[j].get_or_insert_with(|| {
                let empty = Sim {
                    placed: vec![None; n],
                    ..initial.clone()
                };
                matches!(evaluate(engine, members, j, &empty, base_index, None), Ok(c) if !c.is_empty())
            });
            if !alone {
                return result;
            }
        }
        // Backtrack: the deepest member with an alternative left takes it.
        loop {
            let Some(mut frame) = stack.pop() else {
                return result;
            };
            if Instant::now() > deadline {
                result.timed_out = true;
                return result;
            }
            memos.restored();
            while let Some(next) = frame.rest.pop_front() {
                memos.placed(&next.placement.node, next.allocations());
                let candidate = apply(engine, members, frame.j, frame.before.clone(), next);
                let key = state_key(&candidate, frame.j + 1, signatures);
                if visited.insert(key) {
                    j = frame.j + 1;
                    sim = candidate;
                    stack.push(frame);
                    continue 'search;
                }
            }
        }
    }
}

/// Identifies a state up to swapping members of the same shape: the next member, and the
/// multiset of (shape, node) of the members placed or skipped so far.
fn state_key(sim: &Sim, j: usize, signatures: &[u64]) -> u64 {
    let mut parts: Vec<(u64, &str)> = (0..j)
        .map(|m| {
            (
                signatures[m],
                sim.placed[m].as_ref().map_or("", |p| p.node.as_str()),
            )
        })
        .collect();
    parts.sort_unstable();
    let mut h = DefaultHasher::new();
    j.hash(&mut h);
    parts.hash(&mut h);
    h.finish()
}

/// Member `j`'s inputs in state `sim`: the simulated node usage, and the claims an earlier
/// member allocated in the simulation shown as allocated.
fn inputs_in(member: &MemberInput, sim: &Sim) -> Result<CycleInputs, String> {
    let mut inputs = member.inputs.clone();
    inputs.nodes = sim.nodes.clone();
    if let Ok(Some(state)) = &mut inputs.dra {
        let mut still = Vec::with_capacity(state.to_allocate.len());
        for i in std::mem::take(&mut state.to_allocate) {
            let claim = &state.claims[i].claim;
            let uid = claim.metadata.uid.as_deref().unwrap_or("");
            let Some(allocation) = sim.overlay.get(uid) else {
                still.push(i);
                continue;
            };
            let mut c = (**claim).clone();
            c.status
                .get_or_insert_with(ResourceClaimStatus::default)
                .allocation = Some(allocation.clone());
            state
                .require_node_of(i, allocation)
                .map_err(|(_, e)| e.unwrap_or_default())?;
            state.claims[i].claim = Arc::new(c);
        }
        state.to_allocate = still;
    }
    Ok(inputs)
}

/// Member `j`'s candidates in state `sim`, the best first; a re-packed node when it fits
/// nowhere as things are.
fn evaluate(
    engine: &mut Engine<'_>,
    members: &[MemberInput],
    j: usize,
    sim: &Sim,
    base_index: &AllocatedIndex,
    memo: Option<&mut NodeMemo>,
) -> Result<Vec<Candidate>, Failure> {
    let member = &members[j];
    let inputs = inputs_in(member, sim).map_err(Failure::Error)?;
    engine.set_index(sim.index.clone());
    let outcome = engine.evaluate_with(&member.pod, inputs.clone(), ALTERNATIVES, memo);
    match outcome {
        Outcome::Feasible(placements) => Ok(placements
            .into_iter()
            .map(|placement| Candidate {
                placement,
                repacked: Vec::new(),
                index: None,
            })
            .collect()),
        Outcome::Decided(Decision::Error(e)) => Err(Failure::Error(e)),
        Outcome::Decided(Decision::Place(placement)) => Ok(vec![Candidate {
            placement,
            repacked: Vec::new(),
            index: None,
        }]),
        Outcome::Decided(Decision::Unschedulable {
            fit,
            claim_names,
            deallocate,
        }) => match repack(engine, members, j, sim, &inputs, base_index) {
            Ok(Some(c)) => Ok(vec![c]),
            Ok(None) => Err(Failure::Unschedulable(Box::new((
                fit,
                claim_names,
                deallocate,
            )))),
            Err(e) => Err(Failure::Error(e)),
        },
    }
}

/// Re-packs a node: member `j`'s claims allocated in one search together with those of the
/// members already placed there (their own claims; shared ones and special claims stay).
fn repack(
    engine: &mut Engine<'_>,
    members: &[MemberInput],
    j: usize,
    sim: &Sim,
    inputs: &CycleInputs,
    base_index: &AllocatedIndex,
) -> Result<Option<Candidate>, String> {
    let Ok(Some(state)) = &inputs.dra else {
        return Ok(None);
    };
    if state.to_allocate.is_empty() || inputs.extended.is_some() || !inputs.unsupported.is_empty() {
        return Ok(None);
    }
    let mut by_node: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (m, p) in sim.placed.iter().enumerate() {
        let Some(p) = p else { continue };
        let movable = !p.allocations.is_empty()
            && p.extended.is_none()
            && p.allocations
                .iter()
                .all(|(c, _)| !sim.shared.contains(c.metadata.uid.as_deref().unwrap_or("")));
        if movable {
            by_node.entry(p.node.as_str()).or_default().push(m);
        }
    }
    if matches!(inputs.volumes, Some(VolumeCheck::Rejected(_))) {
        return Ok(None);
    }
    let facts = PodFacts::for_profile(&members[j].pod, engine.profile_of(&members[j].pod));
    let pod_level = PodLevelFilters::new(
        &members[j].pod,
        &facts,
        inputs,
        engine.profile_of(&members[j].pod),
    );
    let own: Vec<Arc<ResourceClaim>> = state
        .to_allocate
        .iter()
        .map(|&i| state.claims[i].claim.clone())
        .collect();
    for (node_name, on_node) in by_node {
        let Some(entry) = sim.nodes.iter().find(|e| e.name() == node_name) else {
            continue;
        };
        // The member's usage is not on the node yet; the members there stay (re-packed).
        if filters::filter_node(&facts, &entry.node, &entry.allocatable, &entry.usage).is_some()
            || pod_level.filter(&entry.node).is_some()
        {
            continue;
        }
        if !state.unusable.is_empty()
            || state
                .allocated_selectors
                .iter()
                .any(|(_, sel)| !sel.matches(&entry.node))
        {
            continue;
        }
        // The devices in use without the members on this node.
        let mut index = base_index.clone();
        for (m, p) in sim.placed.iter().enumerate() {
            if let Some(p) = p
                && !on_node.contains(&m)
            {
                for (_, a) in p.allocating() {
                    engine.add_to(&mut index, a);
                }
            }
        }
        let mut claims: Vec<Arc<ResourceClaim>> = Vec::new();
        for &m in &on_node {
            if let Some(p) = &sim.placed[m] {
                claims.extend(p.allocations.iter().map(|(c, _)| c.clone()));
            }
        }
        claims.extend(own.iter().cloned());
        // Devices held for nominated pods that outrank the member stay out of reach (W92).
        let mut trial = index.clone();
        engine.hold(&mut trial, &members[j].inputs.held);
        let Some(mut results) = engine.allocate_together(&entry.node, &claims, trial)? else {
            continue;
        };
        for r in &results {
            engine.add_to(&mut index, r);
        }
        let mine = results.split_off(results.len() - own.len());
        let mut rest = results.into_iter();
        let mut repacked = Vec::new();
        for &m in &on_node {
            if let Some(p) = &sim.placed[m] {
                let allocations: Vec<ClaimAllocation> = p
                    .allocations
                    .iter()
                    .map(|(c, _)| (c.clone(), rest.next().unwrap_or_default()))
                    .collect();
                repacked.push((m, allocations));
            }
        }
        return Ok(Some(Candidate {
            placement: Placement {
                node: node_name.to_owned(),
                claims: state.claims.iter().map(|c| c.claim.clone()).collect(),
                allocations: own.iter().cloned().zip(mine).collect(),
                extended: None,
                feasible: 1,
            },
            repacked,
            index: Some(index),
        }));
    }
    Ok(None)
}

/// The state after member `j` takes `candidate`.
fn apply(
    engine: &Engine<'_>,
    members: &[MemberInput],
    j: usize,
    mut sim: Sim,
    candidate: Candidate,
) -> Sim {
    let placement = candidate.placement;
    if let Some(entry) = sim.nodes.iter_mut().find(|e| e.name() == placement.node) {
        Arc::make_mut(&mut entry.usage).add(&PodUsage::of(&members[j].pod));
    }
    for (m, allocations) in candidate.repacked {
        for (c, a) in &allocations {
            sim.overlay
                .insert(c.metadata.uid.clone().unwrap_or_default(), a.clone());
        }
        if let Some(p) = sim.placed[m].as_mut() {
            p.allocations = allocations;
        }
    }
    match candidate.index {
        Some(index) => sim.index = index,
        None => {
            for (_, a) in placement.allocating() {
                engine.add_to(&mut sim.index, a);
            }
        }
    }
    for (c, a) in &placement.allocations {
        sim.overlay
            .insert(c.metadata.uid.clone().unwrap_or_default(), a.clone());
    }
    for c in &placement.claims {
        let uid = c.metadata.uid.clone().unwrap_or_default();
        let allocated_here = placement
            .allocations
            .iter()
            .any(|(a, _)| a.metadata.uid.as_deref() == Some(uid.as_str()));
        if !allocated_here && sim.overlay.contains_key(&uid) {
            sim.shared.insert(uid);
        }
    }
    sim.placed[j] = Some(placement);
    sim
}
