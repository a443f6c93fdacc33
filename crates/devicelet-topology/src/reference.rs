//! Literal, exponential re-statement of the kubelet's merge (`tm/policy.go`:
//! `iterateAllProviderTopologyHints`, `mergePermutation`, `HintMerger.compare`) and device hint
//! generation (`dm/topology_hints.go`: `generateDeviceTopologyHints`), kept only as the oracle
//! the fast code is tested and benchmarked against. It walks every combination in the kubelet's
//! order and applies the kubelet's comparison branch by branch. Do not use it on large machines.

use crate::hint::{ProviderHints, ResourceHints, TopologyHint};
use crate::mask::{NumaMask, iterate_bit_masks};
use crate::merge::TieBreak;

/// Flattens like `filterProvidersHints`, spelling generated lists out.
pub fn flatten_explicit(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let mut lists = vec![];
    for p in providers {
        if p.is_empty() {
            lists.push(vec![TopologyHint::any(true)]);
            continue;
        }
        for h in p.values() {
            let spelled = match h {
                ResourceHints::NoPreference => None,
                ResourceHints::Hints(h) => Some(h.clone()),
                // Reference only runs on small machines; a refusal is treated as "no hints".
                ResourceHints::Family(f) => Some(f.to_hints(20).unwrap_or_default()),
            };
            lists.push(match spelled {
                None => vec![TopologyHint::any(true)],
                Some(h) if h.is_empty() => vec![TopologyHint::any(false)],
                Some(h) => h,
            });
        }
    }
    lists
}

/// `maxOfMinAffinityCounts`.
pub fn max_of_min_affinity_counts(lists: &[Vec<TopologyHint>]) -> usize {
    let mut max = 0;
    for l in lists {
        let mut min = None::<usize>;
        for h in l {
            if let Some(m) = h.affinity {
                min = Some(min.map_or(m.count(), |x| x.min(m.count())));
            }
        }
        if let Some(m) = min {
            max = max.max(m);
        }
    }
    max
}

fn avg_distance(d: &[Vec<u32>], m: NumaMask) -> f64 {
    let mut sum = 0f64;
    let n = m.count() as f64;
    for i in m.nodes() {
        for j in m.nodes() {
            sum += d.get(i).and_then(|r| r.get(j)).copied().unwrap_or(0) as f64;
        }
    }
    sum / (n * n)
}

/// `HintMerger.compare`'s inner `cmp`: the chosen of two masks.
fn pick(tie: &TieBreak<'_>, current: NumaMask, candidate: NumaMask) -> NumaMask {
    let narrowest = |a: NumaMask, b: NumaMask| if b.is_narrower_than(a) { b } else { a };
    match tie {
        TieBreak::Narrowest => narrowest(current, candidate),
        TieBreak::Closest(d) => {
            if current.count() != candidate.count() {
                return narrowest(current, candidate);
            }
            let (a, b) = (avg_distance(d, current), avg_distance(d, candidate));
            // Smaller average wins; equal averages fall back to the smaller integer.
            let candidate_wins = b < a || (b == a && candidate.bits() < current.bits());
            if candidate_wins { candidate } else { current }
        }
    }
}

/// `HintMerger.compare` branch by branch: the hint the kubelet keeps.
pub fn compare(
    tie: &TieBreak<'_>,
    best_np: usize,
    current: Option<TopologyHint>,
    cand: TopologyHint,
) -> Option<TopologyHint> {
    let cm = cand.affinity.unwrap_or_default();
    if cm.count() == 0 {
        return current;
    }
    let Some(cur) = current else {
        return Some(cand);
    };
    let curm = cur.affinity.unwrap_or_default();
    let better = |cur: TopologyHint, cand: TopologyHint| {
        if curm == cm {
            return cur;
        }
        if pick(tie, curm, cm) == curm {
            cur
        } else {
            cand
        }
    };
    if !cur.preferred && cand.preferred {
        return Some(cand);
    }
    if cur.preferred && !cand.preferred {
        return Some(cur);
    }
    if cur.preferred && cand.preferred {
        return Some(better(cur, cand));
    }
    let (c, d, b) = (curm.count(), cm.count(), best_np);
    Some(if c > b {
        better(cur, cand)
    } else if c == b {
        if d != b { cur } else { better(cur, cand) }
    } else if d > b {
        cur
    } else if d == b || d > c {
        cand
    } else if d < c {
        cur
    } else {
        better(cur, cand)
    })
}

/// `mergeFilteredHints` over explicit lists, in the kubelet's iteration order.
pub fn merge_lists(
    lists: &[Vec<TopologyHint>],
    default: NumaMask,
    tie: TieBreak<'_>,
) -> TopologyHint {
    let best_np = max_of_min_affinity_counts(lists);
    let mut best: Option<TopologyHint> = None;
    let mut combo: Vec<TopologyHint> = Vec::with_capacity(lists.len());
    fn walk(
        lists: &[Vec<TopologyHint>],
        i: usize,
        combo: &mut Vec<TopologyHint>,
        f: &mut dyn FnMut(&[TopologyHint]),
    ) {
        if i == lists.len() {
            f(combo);
            return;
        }
        for h in &lists[i] {
            combo.push(*h);
            walk(lists, i + 1, combo, f);
            combo.pop();
        }
    }
    walk(lists, 0, &mut combo, &mut |perm| {
        let mut mask = default;
        let mut preferred = true;
        let mut first: Option<NumaMask> = None;
        for h in perm {
            if let Some(m) = h.affinity {
                mask = mask.and(m);
                match first {
                    None => first = Some(m),
                    Some(f) if f != m => preferred = false,
                    _ => {}
                }
            }
            if !h.preferred {
                preferred = false;
            }
        }
        best = compare(&tie, best_np, best, TopologyHint::new(mask, preferred));
    });
    best.unwrap_or(TopologyHint::new(default, false))
}

/// Best-effort / restricted merge, literally.
pub fn merge_providers(
    providers: &[ProviderHints],
    default: NumaMask,
    tie: TieBreak<'_>,
) -> TopologyHint {
    merge_lists(&flatten_explicit(providers), default, tie)
}

/// single-numa-node merge, literally.
pub fn merge_single_numa_node(providers: &[ProviderHints], default: NumaMask) -> TopologyHint {
    let lists: Vec<Vec<TopologyHint>> = flatten_explicit(providers)
        .into_iter()
        .map(|l| {
            l.into_iter()
                .filter(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1))
                .collect()
        })
        .collect();
    let mut h = merge_lists(&lists, default, TieBreak::Narrowest);
    if h.affinity == Some(default) {
        h.affinity = None;
    }
    h
}

/// A device as the reference generator sees it: its NUMA ids (`None` = no topology).
pub type RefDevice = Option<Vec<usize>>;

/// `generateDeviceTopologyHints` literally: `nodes` are the NUMA ids to iterate, `all` every
/// device of the resource, `available` / `reusable` indexes into `all`.
pub fn generate_device_hints(
    nodes: &[usize],
    all: &[RefDevice],
    available: &[usize],
    reusable: &[usize],
    request: usize,
) -> Vec<TopologyHint> {
    let ids = |d: &RefDevice| d.clone().unwrap_or_default();
    let mut min_affinity = nodes.len();
    let mut hints = vec![];
    iterate_bit_masks(nodes, |mask| {
        let in_mask = all.iter().filter(|d| mask.any_set(&ids(d))).count();
        if in_mask >= request && mask.count() < min_affinity {
            min_affinity = mask.count();
        }
        let mut matching = 0;
        for &r in reusable {
            match &all[r] {
                None => continue,
                Some(n) => {
                    if !mask.any_set(n) {
                        return;
                    }
                    matching += 1;
                }
            }
        }
        for &a in available {
            if mask.any_set(&ids(&all[a])) {
                matching += 1;
            }
        }
        if matching >= request {
            hints.push(TopologyHint::new(mask, false));
        }
    });
    for h in &mut hints {
        if h.affinity.map(|m| m.count()) == Some(min_affinity) {
            h.preferred = true;
        }
    }
    hints
}
