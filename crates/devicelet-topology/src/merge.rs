//! Hint merging of the kubelet's `pkg/kubelet/cm/topologymanager/policy.go`
//! (`filterProvidersHints`, `mergePermutation`, `HintMerger.compare`, `maxOfMinAffinityCounts`)
//! and `policy_single_numa_node.go` (`filterSingleNumaHints`), computed without walking the
//! cross product of all hint lists.
//!
//! Why this gives the kubelet's answer without enumerating: the kubelet keeps the better of
//! (best so far, next merged combination) with a comparison that is a *total order* on
//! (preferred, mask) pairs, and two combinations that tie produce identical hints. So the result
//! is simply the best merged hint that any combination can produce, whatever the iteration order.
//! The order, best first, is:
//!
//! * preferred before non-preferred (a preferred merge needs every hint preferred and all
//!   non-nil masks equal);
//! * among preferred: fewer nodes, then (prefer-closest) smaller distance sum, then smaller
//!   integer;
//! * among non-preferred, with `B` = max over lists of the list's narrowest mask size: a mask
//!   of exactly `B` nodes, then sizes below `B` from large to small, then sizes above `B` from
//!   small to large; equal sizes as above.
//!
//! Preferred: the candidates are the masks some list prefers (checked against every list), plus,
//! for generated lists ([`HintFamily`]), the subsets of the preferred size.
//! Non-preferred: explicit lists are intersected with de-duplication (distinct masks, not
//! combinations). Generated lists are upward-closed (a superset of a fitting mask fits), so the
//! masks they can still produce from a partial intersection `s` are upward-closed inside
//! `W = s ∩ universes`: every size from the smallest reachable one up to `|W|` occurs. The
//! target size follows from the order above, and the smallest integer of that size is built bit
//! by bit from the top, each step asking "can the generated lists cut all these nodes away?" —
//! a small search that assigns each removed node to a list that can afford losing it.
//! The property tests compare this with [`crate::reference`], the literal kubelet algorithm.
//!
//! Cost. Explicit lists cost (distinct partial intersections) x (list length). Generated lists
//! cost a branch-and-bound search over nodes: subsets are visited in the order that makes the
//! first accepted one the answer, and branches are cut with exact answers (the removal search)
//! or optimistic coverage bounds (units per node, or units touching a node when units span
//! nodes; the slack each list has for dropping nodes). On the benchmark machines (up to 64
//! nodes, 8 devices per node, 3 providers) an admission takes 0.05-0.10 ms at 16 nodes and
//! 0.3-1.5 ms at 64 (docs/topology.md). The problems underneath are covering problems, so an adversarial input
//! can still make the search slow; results stay exact either way, there is no cut-off that
//! would change an answer.

use std::cell::Cell;
use std::collections::HashSet;

use crate::hint::{HintFamily, ProviderHints, ResourceHints, TopologyHint};
use crate::mask::{NumaMask, for_each_k_subset};

thread_local! {
    /// Whether the removal search may try its quick pass first (tests turn it off to check the
    /// full pass on its own).
    static QUICK_PASS: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` with the removal search's quick pass disabled on this thread, so the full
/// (capacity-bounded) search answers every question. For tests: results must not change.
#[doc(hidden)]
pub fn with_full_search_only<R>(f: impl FnOnce() -> R) -> R {
    let before = QUICK_PASS.with(|q| q.replace(false));
    let out = f();
    QUICK_PASS.with(|q| q.set(before));
    out
}

/// How ties between masks of equal size are broken (`prefer-closest-numa-nodes`).
#[derive(Clone, Copy, Debug)]
pub enum TieBreak<'a> {
    /// Smaller integer value wins (the kubelet's Narrowest).
    Narrowest,
    /// Smaller sum of `distances[i][j]` over ordered pairs (self pairs included) wins, then
    /// the smaller integer (the kubelet's Closest). Rows are indexed by node id.
    Closest(&'a [Vec<u32>]),
}

impl TieBreak<'_> {
    fn distance_sum(&self, mask: NumaMask) -> u64 {
        match self {
            TieBreak::Narrowest => 0,
            TieBreak::Closest(d) => {
                let mut sum = 0u64;
                for i in mask.nodes() {
                    for j in mask.nodes() {
                        // A complete matrix is checked at construction; a hole counts as 0.
                        sum += d.get(i).and_then(|row| row.get(j)).copied().unwrap_or(0) as u64;
                    }
                }
                sum
            }
        }
    }
}

/// One flattened hint list (one per provider resource, or one per silent provider).
#[derive(Clone, Debug)]
pub enum HintList<'a> {
    /// Hints spelled out.
    Explicit(Vec<TopologyHint>),
    /// Generated hints in compact form (never empty: an empty family becomes `[{nil,false}]`).
    Family(&'a HintFamily),
}

/// The kubelet's `filterProvidersHints`: silent provider -> `[{nil,true}]`, `res -> nil` ->
/// `[{nil,true}]`, `res -> []` -> `[{nil,false}]`, otherwise the list.
pub fn flatten(providers: &[ProviderHints]) -> Vec<HintList<'_>> {
    let mut lists = vec![];
    for provider in providers {
        if provider.is_empty() {
            lists.push(HintList::Explicit(vec![TopologyHint::any(true)]));
            continue;
        }
        for hints in provider.values() {
            lists.push(match hints {
                ResourceHints::NoPreference => HintList::Explicit(vec![TopologyHint::any(true)]),
                ResourceHints::Hints(h) if h.is_empty() => {
                    HintList::Explicit(vec![TopologyHint::any(false)])
                }
                ResourceHints::Hints(h) => HintList::Explicit(h.clone()),
                ResourceHints::Family(f) if f.is_empty() => {
                    HintList::Explicit(vec![TopologyHint::any(false)])
                }
                ResourceHints::Family(f) => HintList::Family(f),
            });
        }
    }
    lists
}

/// The kubelet's `filterSingleNumaHints`: keep preferred hints that are nil or one node.
/// A generated list keeps its preferred single nodes (none unless its preferred size is 1).
pub fn filter_single_numa(lists: Vec<HintList<'_>>) -> Vec<HintList<'static>> {
    lists
        .into_iter()
        .map(|l| match l {
            HintList::Explicit(h) => HintList::Explicit(
                h.into_iter()
                    .filter(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1))
                    .collect(),
            ),
            HintList::Family(f) => HintList::Explicit(
                f.universe()
                    .nodes()
                    .filter_map(NumaMask::single)
                    .filter(|m| f.contains_preferred(*m))
                    .map(|m| TopologyHint::new(m, true))
                    .collect(),
            ),
        })
        .collect()
}

/// The kubelet's `maxOfMinAffinityCounts` (`BestNonPreferredAffinityCount`).
pub fn max_of_min_affinity_counts(lists: &[HintList<'_>]) -> usize {
    lists
        .iter()
        .filter_map(|l| match l {
            HintList::Explicit(h) => h.iter().filter_map(|h| h.affinity).map(|m| m.count()).min(),
            HintList::Family(f) => Some(family_min_size(f)),
        })
        .max()
        .unwrap_or(0)
}

/// Size of the narrowest hint a family lists.
fn family_min_size(f: &HintFamily) -> usize {
    if let Some(k) = f.narrowest_size_without_required() {
        return k;
    }
    let solver = Removal::new(vec![f], f.universe());
    solver.min_kept().max(1)
}

/// Ranking key: smaller is better. Equal keys mean equal (mask, preferred).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Key {
    not_preferred: bool,
    tier: u8,
    size_rank: usize,
    distance: u64,
    bits: u64,
}

fn key(mask: NumaMask, preferred: bool, best_non_preferred: usize, tie: &TieBreak<'_>) -> Key {
    let c = mask.count();
    let b = best_non_preferred;
    let (tier, size_rank) = if preferred {
        (0, c)
    } else if c == b {
        (0, 0)
    } else if c < b {
        (1, b - c)
    } else {
        (2, c)
    };
    Key {
        not_preferred: !preferred,
        tier,
        size_rank,
        distance: tie.distance_sum(mask),
        bits: mask.bits(),
    }
}

/// Merge flattened lists the way `mergeFilteredHints` does, returning the merged hint
/// (`{default, false}` when every combination has an empty intersection or there is none).
pub fn merge_lists(lists: &[HintList<'_>], default: NumaMask, tie: TieBreak<'_>) -> TopologyHint {
    let b = max_of_min_affinity_counts(lists);
    if let Some(m) = best_preferred(lists, default, &tie) {
        return TopologyHint::new(m, true);
    }
    match best_non_preferred(lists, default, b, &tie) {
        Some(m) => TopologyHint::new(m, false),
        None => TopologyHint::new(default, false),
    }
}

/// Best-effort / restricted merge of provider answers (policy.go `mergeFilteredHints` after
/// `filterProvidersHints`).
pub fn merge_providers(
    providers: &[ProviderHints],
    default: NumaMask,
    tie: TieBreak<'_>,
) -> TopologyHint {
    merge_lists(&flatten(providers), default, tie)
}

/// single-numa-node merge: filter, merge (never Closest), default mask -> nil.
pub fn merge_single_numa_node(providers: &[ProviderHints], default: NumaMask) -> TopologyHint {
    let lists = filter_single_numa(flatten(providers));
    let mut hint = merge_lists(&lists, default, TieBreak::Narrowest);
    if hint.affinity == Some(default) {
        hint.affinity = None;
    }
    hint
}

struct ListView<'a> {
    preferred_nil: bool,
    preferred_masks: HashSet<NumaMask>,
    family: Option<&'a HintFamily>,
}

/// Best mask of a combination whose hints are all preferred with one common non-nil mask
/// (or all nil); `None` if no such combination has a non-empty intersection with `default`.
fn best_preferred(
    lists: &[HintList<'_>],
    default: NumaMask,
    tie: &TieBreak<'_>,
) -> Option<NumaMask> {
    let mut views = Vec::with_capacity(lists.len());
    for l in lists {
        match l {
            HintList::Explicit(h) => {
                let preferred_nil = h.iter().any(|h| h.preferred && h.affinity.is_none());
                let preferred_masks: HashSet<NumaMask> = h
                    .iter()
                    .filter(|h| h.preferred)
                    .filter_map(|h| h.affinity)
                    .collect();
                if !preferred_nil && preferred_masks.is_empty() {
                    return None;
                }
                views.push(ListView {
                    preferred_nil,
                    preferred_masks,
                    family: None,
                });
            }
            HintList::Family(f) => views.push(ListView {
                preferred_nil: false,
                preferred_masks: HashSet::new(),
                family: Some(f),
            }),
        }
    }
    let accepts = |m: NumaMask| {
        views.iter().all(|v| match v.family {
            Some(f) => f.contains_preferred(m),
            None => v.preferred_nil || v.preferred_masks.contains(&m),
        })
    };
    let mut best: Option<(Key, NumaMask)> = None;
    let mut offer = |merged: NumaMask| {
        if merged.is_empty() {
            return;
        }
        let k = key(merged, true, 0, tie);
        if best.is_none_or(|(bk, _)| k < bk) {
            best = Some((k, merged));
        }
    };
    let families: Vec<&HintFamily> = views.iter().filter_map(|v| v.family).collect();
    let all_nil_ok = views.iter().all(|v| v.family.is_none() && v.preferred_nil);
    if all_nil_ok {
        offer(default);
    }
    // Candidates named by an explicit list. If some list cannot say nil, it alone names them.
    let narrowest_list = views
        .iter()
        .filter(|v| v.family.is_none() && !v.preferred_nil)
        .min_by_key(|v| v.preferred_masks.len());
    let named: Vec<NumaMask> = match narrowest_list {
        Some(v) => v.preferred_masks.iter().copied().collect(),
        None => views
            .iter()
            .flat_map(|v| v.preferred_masks.iter().copied())
            .collect(),
    };
    for m in named {
        if accepts(m) {
            offer(default.and(m));
        }
    }
    // Candidates generated by families, when no explicit list pins the mask down.
    if narrowest_list.is_none() && !families.is_empty() {
        let k = families[0].min_affinity();
        if k > 0 && families.iter().all(|f| f.min_affinity() == k) {
            let within = families
                .iter()
                .fold(families[0].universe(), |w, f| w.and(f.universe()));
            if within.is_subset_of(default) {
                // Merged mask = the member itself: search members directly, best first.
                let mut can_complete = |included: NumaMask, undecided: NumaMask| {
                    let slots = k - included.count();
                    families
                        .iter()
                        .all(|f| f.may_fit(included, undecided, slots))
                };
                let mut valid = |m: NumaMask| accepts(m);
                if let Some(m) = best_subset(within, k, tie, &mut can_complete, &mut valid) {
                    offer(m);
                }
            } else {
                // Generic families reaching beyond the machine: rank by the cut mask.
                for_each_k_subset(within, k, |m| {
                    if accepts(m) {
                        offer(default.and(m));
                    }
                    true
                });
            }
        }
    }
    best.map(|(_, m)| m)
}

/// Best merged mask over all combinations, ranked as non-preferred hints.
fn best_non_preferred(
    lists: &[HintList<'_>],
    default: NumaMask,
    b: usize,
    tie: &TieBreak<'_>,
) -> Option<NumaMask> {
    // Distinct intersections of the explicit lists (nil = default), empty ones dropped.
    let mut partial: HashSet<NumaMask> = HashSet::from([default]);
    let mut families = vec![];
    for l in lists {
        match l {
            HintList::Explicit(h) => {
                let mut next = HashSet::with_capacity(partial.len());
                for s in &partial {
                    for hint in h {
                        let m = s.and(hint.affinity.unwrap_or(default));
                        if !m.is_empty() {
                            next.insert(m);
                        }
                    }
                }
                partial = next;
            }
            HintList::Family(f) => families.push(*f),
        }
    }
    let mut best: Option<(Key, NumaMask)> = None;
    let mut offer = |m: NumaMask| {
        let k = key(m, false, b, tie);
        if best.is_none_or(|(bk, _)| k < bk) {
            best = Some((k, m));
        }
    };
    for s in partial {
        if families.is_empty() {
            offer(s);
            continue;
        }
        let w = families.iter().fold(s, |w, f| w.and(f.universe()));
        if w.is_empty() {
            continue;
        }
        let solver = Removal::new(families.clone(), w);
        // Every size from the smallest producible one up to |w| occurs, and the smallest is at
        // most B: cutting `s` with one family's narrowest hint (and the others' whole universe)
        // leaves at most that hint's size, which is <= B by definition of B. So the best size
        // is B when |w| >= B, else |w| (the largest below B).
        let target = b.min(w.count());
        if let Some(m) = solver.best_of_size(target, tie) {
            offer(m);
        }
    }
    best.map(|(_, m)| m)
}

/// Per-family state during the search: the family's current mask and how many of its units
/// it still touches.
#[derive(Clone, Copy)]
struct FamilyState {
    mask: NumaMask,
    covered: usize,
}

/// "Which masks can the generated lists still produce inside `w`?" A produced mask `Y` keeps
/// some nodes of `w`; every other node of `w` must be dropped by at least one family, and a
/// family can drop a set of nodes only if what remains of its universe still fits. Dropping
/// more never helps a family fit, so each dropped node is given to exactly one family.
struct Removal<'a> {
    families: Vec<&'a HintFamily>,
    w: NumaMask,
}

impl<'a> Removal<'a> {
    fn new(families: Vec<&'a HintFamily>, w: NumaMask) -> Self {
        Removal { families, w }
    }

    /// Is there a producible `Y` with `required ⊆ Y ⊆ allowed` and `|Y| <= limit`?
    fn decide(&self, allowed: NumaMask, required: NumaMask, limit: usize) -> bool {
        if required.count() > limit || !required.is_subset_of(allowed) {
            return false;
        }
        // Forced drops first (fail early), then optional ones from the top node down.
        let mut order: Vec<usize> = self.w.minus(allowed).nodes().collect();
        let mut optional: Vec<usize> = allowed.and(self.w).minus(required).nodes().collect();
        optional.reverse();
        order.extend(optional);
        let mut states: Vec<FamilyState> = self
            .families
            .iter()
            .map(|f| FamilyState {
                mask: f.universe(),
                covered: f.covered(f.universe()),
            })
            .collect();
        // Quick pass first: most questions are settled in about one step per node. Only when
        // it runs out of steps, search again with the capacity bound (both passes are exact).
        if QUICK_PASS.with(Cell::get) {
            let fresh = states.clone();
            let mut quick = Some(4 * order.len() + 16);
            let kept = required.count();
            if let Some(answer) =
                self.search(&order, 0, &mut states, kept, limit, allowed, &mut quick)
            {
                return answer;
            }
            states = fresh;
        }
        self.search(
            &order,
            0,
            &mut states,
            required.count(),
            limit,
            allowed,
            &mut None,
        )
        .unwrap_or(false)
    }

    fn can_drop(&self, i: usize, state: FamilyState, node: usize) -> Option<FamilyState> {
        let next = state.mask.minus(NumaMask::from_bits(1u64 << node));
        let family = self.families[i];
        match family.additive() {
            Some((counts, need)) => {
                let covered = state.covered.checked_sub(counts[node] as usize)?;
                (!next.is_empty() && covered >= need).then_some(FamilyState {
                    mask: next,
                    covered,
                })
            }
            None => family.contains(next).then_some(FamilyState {
                mask: next,
                covered: 0,
            }),
        }
    }

    /// How many of the `rest` nodes family `i` could still drop on its own (upper bound).
    fn drop_capacity(&self, i: usize, state: FamilyState, rest: NumaMask) -> usize {
        let family = self.families[i];
        let candidates = rest.and(state.mask);
        // The family's mask may not become empty.
        let structural = candidates.count().min(state.mask.count().saturating_sub(1));
        match family.per_node_counts() {
            Some((counts, need)) => {
                let mut slack = family.covered(state.mask).saturating_sub(need);
                let mut costs: Vec<u32> = candidates.nodes().map(|n| counts[n]).collect();
                costs.sort_unstable();
                let mut capacity = 0;
                for c in costs {
                    let c = c as usize;
                    if c > slack {
                        break;
                    }
                    slack -= c;
                    capacity += 1;
                }
                capacity.min(structural)
            }
            None => structural,
        }
    }

    /// Depth-first assignment of each node in `order` (drop it via some family, or keep it).
    /// `budget` is `Some(n)` for the quick pass (only the cheap bound, at most `n` steps; `None`
    /// returned when it runs out) and `None` for the full pass with the capacity bound.
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        order: &[usize],
        at: usize,
        states: &mut [FamilyState],
        kept: usize,
        limit: usize,
        allowed: NumaMask,
        budget: &mut Option<usize>,
    ) -> Option<bool> {
        if at == order.len() {
            return Some(true);
        }
        if let Some(left) = budget {
            if *left == 0 {
                return None;
            }
            *left -= 1;
        }
        // Bounds (drops only get harder as the search goes on):
        // * a node no family can drop now must be kept (and must not be a forced drop);
        // * (full pass) a family can drop at most the number of its cheapest remaining nodes
        //   that fit in its slack, so all families together drop at most the sum of those.
        let remaining = &order[at..];
        let mut undroppable = 0;
        let mut forced = 0;
        for &node in remaining {
            let is_forced = !allowed.is_set(node);
            forced += usize::from(is_forced);
            let droppable = (0..states.len()).any(|i| self.can_drop(i, states[i], node).is_some());
            if !droppable {
                if is_forced {
                    return Some(false);
                }
                undroppable += 1;
            }
        }
        let mut max_drops = remaining.len() - undroppable;
        if budget.is_none() {
            let rest = remaining.iter().fold(NumaMask::EMPTY, |m, &n| {
                m.or(NumaMask::from_bits(1u64 << n))
            });
            let capacity: usize = (0..states.len())
                .map(|i| self.drop_capacity(i, states[i], rest))
                .sum();
            max_drops = max_drops.min(capacity);
        }
        if forced > max_drops || kept + remaining.len() - max_drops > limit {
            return Some(false);
        }
        let node = order[at];
        for i in 0..states.len() {
            if let Some(next) = self.can_drop(i, states[i], node) {
                let saved = states[i];
                states[i] = next;
                let found = self.search(order, at + 1, states, kept, limit, allowed, budget);
                states[i] = saved;
                if found != Some(false) {
                    return found;
                }
            }
        }
        if allowed.is_set(node) && kept < limit {
            return self.search(order, at + 1, states, kept + 1, limit, allowed, budget);
        }
        Some(false)
    }

    /// Smallest producible size (0 if the families can cut everything away).
    fn min_kept(&self) -> usize {
        let (mut lo, mut hi) = (0, self.w.count());
        // decide(w, ∅, |w|) holds: every family keeps its whole universe.
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.decide(self.w, NumaMask::EMPTY, mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// The best producible mask with exactly `size` nodes (sizes between the smallest
    /// producible one and `|w|` all occur).
    fn best_of_size(&self, size: usize, tie: &TieBreak<'_>) -> Option<NumaMask> {
        // `decide` is exact, so the search below never enters a dead branch.
        let mut can_complete = |included: NumaMask, undecided: NumaMask| {
            self.decide(included.or(undecided), included, size)
        };
        let mut valid = |y: NumaMask| self.decide(y, y, size);
        best_subset(self.w, size, tie, &mut can_complete, &mut valid)
    }
}

/// The best `k`-node subset of `within` accepted by `valid`: smallest integer (Narrowest), or
/// smallest distance sum then smallest integer (Closest).
///
/// Depth-first from the highest node, trying "leave it out" before "take it", so complete
/// subsets come in increasing integer order: under Narrowest the first accepted one is the
/// answer. `can_complete(included, undecided)` must be true whenever some accepted subset lies
/// between `included` and `included ∪ undecided` (it may be optimistic); under Closest a lower
/// bound on the distance sum prunes branches that cannot beat the best so far.
fn best_subset(
    within: NumaMask,
    k: usize,
    tie: &TieBreak<'_>,
    can_complete: &mut dyn FnMut(NumaMask, NumaMask) -> bool,
    valid: &mut dyn FnMut(NumaMask) -> bool,
) -> Option<NumaMask> {
    struct Search<'s, 't> {
        order: Vec<usize>,
        k: usize,
        tie: &'s TieBreak<'t>,
        can_complete: &'s mut dyn FnMut(NumaMask, NumaMask) -> bool,
        valid: &'s mut dyn FnMut(NumaMask) -> bool,
        best: Option<(u64, NumaMask)>,
        min_pair: u64,
    }
    impl Search<'_, '_> {
        fn done(&self) -> bool {
            matches!(self.tie, TieBreak::Narrowest) && self.best.is_some()
        }

        /// Lower bound on the distance sum of any k-subset between `inc` and `inc ∪ und`.
        fn distance_bound(&self, inc: NumaMask, und: NumaMask, need: usize) -> u64 {
            let TieBreak::Closest(d) = self.tie else {
                return 0;
            };
            let dist =
                |i: usize, j: usize| d.get(i).and_then(|r| r.get(j)).copied().unwrap_or(0) as u64;
            let mut costs: Vec<u64> = und
                .nodes()
                .map(|x| dist(x, x) + inc.nodes().map(|p| dist(p, x) + dist(x, p)).sum::<u64>())
                .collect();
            costs.sort_unstable();
            let need64 = need as u64;
            self.tie.distance_sum(inc)
                + costs.iter().take(need).sum::<u64>()
                + need64 * need64.saturating_sub(1) * self.min_pair
        }

        fn visit(&mut self, at: usize, inc: NumaMask, und: NumaMask) {
            if self.done() {
                return;
            }
            let need = self.k - inc.count();
            if need == 0 {
                if (self.valid)(inc) {
                    let d = self.tie.distance_sum(inc);
                    // Leaves come in increasing integer order: only a strictly smaller
                    // distance replaces the best.
                    if self.best.is_none_or(|(bd, _)| d < bd) {
                        self.best = Some((d, inc));
                    }
                }
                return;
            }
            if need > und.count() || !(self.can_complete)(inc, und) {
                return;
            }
            if let Some((bd, _)) = self.best
                && self.distance_bound(inc, und, need) >= bd
            {
                return;
            }
            let node = NumaMask::from_bits(1u64 << self.order[at]);
            let rest = und.minus(node);
            self.visit(at + 1, inc, rest);
            self.visit(at + 1, inc.or(node), rest);
        }
    }
    if k == 0 || k > within.count() {
        return None;
    }
    let order: Vec<usize> = {
        let mut v: Vec<usize> = within.nodes().collect();
        v.reverse();
        v
    };
    let min_pair = match tie {
        TieBreak::Narrowest => 0,
        TieBreak::Closest(d) => {
            let mut m = u64::MAX;
            for i in within.nodes() {
                for j in within.nodes() {
                    if i != j {
                        m = m.min(d.get(i).and_then(|r| r.get(j)).copied().unwrap_or(0) as u64);
                    }
                }
            }
            if m == u64::MAX { 0 } else { m }
        }
    };
    let mut search = Search {
        order,
        k,
        tie,
        can_complete,
        valid,
        best: None,
        min_pair,
    };
    search.visit(0, NumaMask::EMPTY, within);
    search.best.map(|(_, m)| m)
}

/// Which of two hints [`compare`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The best hint so far stays.
    Current,
    /// The new candidate replaces it.
    Candidate,
}

/// The kubelet's `HintMerger.compare` as this merge ranks hints: would the kubelet, holding
/// `current` (`None` before the first candidate) and looking at the merged `candidate`, keep
/// it or switch? `best_non_preferred` is `BestNonPreferredAffinityCount`. Answered with the
/// same ranking key the merge searches by, so tests of this function test the merge's order.
pub fn compare(
    current: Option<TopologyHint>,
    candidate: TopologyHint,
    best_non_preferred: usize,
    tie: TieBreak<'_>,
) -> Pick {
    let candidate_mask = candidate.affinity.unwrap_or_default();
    // An empty intersection never wins.
    if candidate_mask.is_empty() {
        return Pick::Current;
    }
    let Some(current) = current else {
        return Pick::Candidate;
    };
    let rank = |h: TopologyHint| {
        key(
            h.affinity.unwrap_or_default(),
            h.preferred,
            best_non_preferred,
            &tie,
        )
    };
    // Ties keep the current hint, as the kubelet does.
    if rank(candidate) < rank(current) {
        Pick::Candidate
    } else {
        Pick::Current
    }
}
