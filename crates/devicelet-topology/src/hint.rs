//! Topology hints, after the kubelet's `pkg/kubelet/cm/topologymanager/topology_manager.go`
//! (`TopologyHint`, `HintProvider` output) and the hint generators of
//! `pkg/kubelet/cm/devicemanager/topology_hints.go` / `cpumanager/policy_static.go`.
//!
//! A provider answers with a map resource -> hints. The kubelet always spells the hints out as a
//! list, which for generated hints is every NUMA subset that can hold the request: 2^n entries.
//! Here a list may also be given as a [`HintFamily`]: the same set of masks described by the
//! rule that generated it (an upward-closed family: any superset of a fitting mask fits too),
//! so a 64-node machine never has to write down 2^64 hints. [`HintFamily::to_hints`] spells
//! the family out exactly as the kubelet would, for small machines and for tests.

use std::collections::BTreeMap;

use crate::error::TopologyError;
use crate::mask::{NumaMask, iterate_bit_masks};

/// The kubelet's `TopologyHint`: `affinity == None` means "any NUMA node / no preference".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TopologyHint {
    /// NUMA nodes the resource should come from; `None` = don't care.
    pub affinity: Option<NumaMask>,
    /// Whether this placement is as good as the machine allows.
    pub preferred: bool,
}

impl TopologyHint {
    /// A hint with an affinity.
    pub fn new(affinity: NumaMask, preferred: bool) -> Self {
        TopologyHint {
            affinity: Some(affinity),
            preferred,
        }
    }

    /// A hint without affinity.
    pub fn any(preferred: bool) -> Self {
        TopologyHint {
            affinity: None,
            preferred,
        }
    }
}

/// What a provider says about one resource (the three meanings of the kubelet's map value).
#[derive(Clone, Debug, PartialEq)]
pub enum ResourceHints {
    /// `res -> nil`: no preference for this resource.
    NoPreference,
    /// An explicit list; an empty list means **no possible placement** (`res -> []`).
    Hints(Vec<TopologyHint>),
    /// A generated list in compact form (the kubelet would enumerate it).
    Family(HintFamily),
}

/// A provider's answer: resource name -> hints. An empty map = no preference at all.
/// (Go iterates its map in random order; the merge result does not depend on it, see `merge`.)
pub type ProviderHints = BTreeMap<String, ResourceHints>;

/// The set of hints a kubelet generator (device manager, CPU manager) would list for one
/// request, described by its rule instead of by enumeration.
///
/// A mask `M` (non-empty, inside `universe`) is a hint iff every `required` unit touches `M` and
/// `required.len()` + (number of `items` touching `M`) >= `request`. It is preferred iff
/// `M.count() == min_affinity`. This is exactly `generateDeviceTopologyHints` with
/// items = available devices and required = reusable devices with topology; for CPUs, items are
/// the free CPUs (one node each).
#[derive(Clone, Debug, PartialEq)]
pub struct HintFamily {
    universe: NumaMask,
    items: Vec<NumaMask>,
    required: Vec<NumaMask>,
    request: usize,
    min_affinity: usize,
    /// Items per node when every item sits on at most one node (fast additive counting).
    per_node: Option<Box<[u32; 64]>>,
    /// Items touching each node: an additive upper bound on coverage even when items span
    /// several nodes (an item is counted once per node it touches).
    degree: Box<[u32; 64]>,
}

impl HintFamily {
    /// Builds a family. `min_affinity` is the size a hint must have to be preferred (the
    /// kubelet computes it from *all* units of the resource, not only free ones).
    pub fn new(
        universe: NumaMask,
        items: Vec<NumaMask>,
        required: Vec<NumaMask>,
        request: usize,
        min_affinity: usize,
    ) -> Self {
        let per_node = if items.iter().all(|i| i.and(universe).count() <= 1) {
            let mut counts = [0u32; 64];
            for item in &items {
                if let Some(n) = item.and(universe).highest() {
                    counts[n] += 1;
                }
            }
            Some(Box::new(counts))
        } else {
            None
        };
        let mut degree = Box::new([0u32; 64]);
        for item in &items {
            for n in item.and(universe).nodes() {
                degree[n] += 1;
            }
        }
        HintFamily {
            universe,
            items,
            required,
            request,
            min_affinity,
            per_node,
            degree,
        }
    }

    /// NUMA nodes the hints are drawn from.
    pub fn universe(&self) -> NumaMask {
        self.universe
    }

    /// Size of a preferred hint.
    pub fn min_affinity(&self) -> usize {
        self.min_affinity
    }

    /// Number of units requested.
    pub fn request(&self) -> usize {
        self.request
    }

    /// Whether `mask` (taken inside the universe) would be listed by the kubelet's generator.
    /// Monotone: if it holds for `M` it holds for every superset of `M` inside the universe.
    pub fn fits(&self, mask: NumaMask) -> bool {
        let mask = mask.and(self.universe);
        if self.required.iter().any(|r| !r.intersects(mask)) {
            return false;
        }
        let need = self.request.saturating_sub(self.required.len());
        if need == 0 {
            return true;
        }
        self.covered(mask) >= need
    }

    /// For families whose units sit on one node each and with nothing required: units per node
    /// and the number needed, so callers can update coverage in O(1) per node.
    pub(crate) fn additive(&self) -> Option<(&[u32; 64], usize)> {
        match &self.per_node {
            Some(counts) if self.required.is_empty() => Some((counts, self.request)),
            _ => None,
        }
    }

    /// Units per node (when every unit sits on one node) and how many must be covered besides
    /// the required units. Ignoring the required units makes this a relaxation, fit for bounds.
    pub(crate) fn per_node_counts(&self) -> Option<(&[u32; 64], usize)> {
        self.per_node
            .as_deref()
            .map(|counts| (counts, self.request.saturating_sub(self.required.len())))
    }

    /// Could a hint `M` with `included ⊆ M ⊆ included ∪ undecided` and at most `slots` more
    /// nodes than `included` fit? Never false when one does (an optimistic bound for pruning).
    pub(crate) fn may_fit(&self, included: NumaMask, undecided: NumaMask, slots: usize) -> bool {
        if self.additive().is_none() && !self.fits(included.or(undecided)) {
            return false;
        }
        // Coverage of the included nodes plus the best `slots` degrees among the rest.
        let need = self.request.saturating_sub(self.required.len());
        let mut gains: Vec<u32> = undecided
            .minus(included)
            .and(self.universe)
            .nodes()
            .map(|n| self.degree[n])
            .collect();
        gains.sort_unstable_by(|a, b| b.cmp(a));
        let best: usize = gains.iter().take(slots).map(|&g| g as usize).sum();
        self.covered(included.and(self.universe)) + best >= need
    }

    /// Items touching `mask`.
    pub(crate) fn covered(&self, mask: NumaMask) -> usize {
        match &self.per_node {
            Some(counts) => mask.nodes().map(|n| counts[n] as usize).sum(),
            None => self.items.iter().filter(|i| i.intersects(mask)).count(),
        }
    }

    /// Whether `mask` is a hint: non-empty, inside the universe, and fits.
    pub fn contains(&self, mask: NumaMask) -> bool {
        !mask.is_empty() && mask.is_subset_of(self.universe) && self.fits(mask)
    }

    /// Whether the kubelet's list would be empty (then the resource has no possible placement).
    pub fn is_empty(&self) -> bool {
        !self.contains(self.universe)
    }

    /// Whether `mask` is a preferred hint.
    pub fn contains_preferred(&self, mask: NumaMask) -> bool {
        mask.count() == self.min_affinity && self.contains(mask)
    }

    /// Size of the narrowest hint when no unit is required (then it is a plain covering
    /// problem); `None` when required units make the caller search.
    pub(crate) fn narrowest_size_without_required(&self) -> Option<usize> {
        if !self.required.is_empty() {
            return None;
        }
        HintFamily::min_nodes_to_cover(self.universe, &self.items, self.request).map(|k| k.max(1))
    }

    /// The hints exactly as the kubelet lists them (IterateBitMasks order). Refuses universes of
    /// more than `max_nodes` nodes instead of running for ever.
    pub fn to_hints(&self, max_nodes: usize) -> Result<Vec<TopologyHint>, TopologyError> {
        let nodes: Vec<usize> = self.universe.nodes().collect();
        if nodes.len() > max_nodes {
            return Err(TopologyError::TooManyNodesToEnumerate {
                nodes: nodes.len(),
                max: max_nodes,
            });
        }
        let mut out = vec![];
        iterate_bit_masks(&nodes, |m| {
            if self.fits(m) {
                out.push(TopologyHint::new(m, m.count() == self.min_affinity));
            }
        });
        Ok(out)
    }

    /// Smallest number of nodes of `within` holding at least `request` of `units` (each unit
    /// counts when it touches a chosen node); `None` if even all of `within` is not enough.
    /// Exact: iterative deepening with an additive upper bound, which is tight for units that
    /// sit on one node (the common case) and only prunes for units that span nodes.
    pub fn min_nodes_to_cover(
        within: NumaMask,
        units: &[NumaMask],
        request: usize,
    ) -> Option<usize> {
        if request == 0 {
            return Some(1.min(within.count()));
        }
        let units: Vec<NumaMask> = units
            .iter()
            .map(|u| u.and(within))
            .filter(|u| !u.is_empty())
            .collect();
        if units.len() < request {
            return None;
        }
        // Per-node degrees in one pass.
        let mut degree = [0usize; 64];
        for u in &units {
            for n in u.nodes() {
                degree[n] += 1;
            }
        }
        let mut nodes: Vec<(usize, usize)> = within
            .nodes()
            .map(|n| (n, degree[n]))
            .filter(|&(_, d)| d > 0)
            .collect();
        nodes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let degrees: Vec<usize> = nodes.iter().map(|&(_, d)| d).collect();
        if units.iter().all(|u| u.count() == 1) {
            // Additive coverage: the largest nodes first is optimal.
            let mut have = 0;
            for (k, d) in degrees.iter().enumerate() {
                have += d;
                if have >= request {
                    return Some(k + 1);
                }
            }
            return None;
        }
        let order: Vec<usize> = nodes.iter().map(|&(n, _)| n).collect();

        fn search(
            order: &[usize],
            degrees: &[usize],
            units: &[NumaMask],
            start: usize,
            left: usize,
            chosen: NumaMask,
            request: usize,
        ) -> bool {
            let have = units.iter().filter(|u| u.intersects(chosen)).count();
            if have >= request {
                return true;
            }
            if left == 0 {
                return false;
            }
            for i in start..order.len() {
                // Degrees are sorted, so the best `left` remaining ones start at i.
                let bound: usize = degrees[i..].iter().take(left).sum();
                if have + bound < request {
                    return false;
                }
                let next = chosen.or(NumaMask::from_bits(1u64 << order[i]));
                if search(order, degrees, units, i + 1, left - 1, next, request) {
                    return true;
                }
            }
            false
        }
        (1..=order.len())
            .find(|&k| search(&order, &degrees, &units, 0, k, NumaMask::EMPTY, request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(nodes: &[usize]) -> NumaMask {
        NumaMask::from_nodes(nodes.iter().copied()).expect("test ids are in range")
    }

    #[test]
    fn family_fits_is_monotone_and_counts_required_units() {
        // Two free devices on node 0, one on node 1, a reusable one on node 2.
        let fam = HintFamily::new(
            m(&[0, 1, 2]),
            vec![m(&[0]), m(&[0]), m(&[1])],
            vec![m(&[2])],
            2,
            1,
        );
        assert!(
            !fam.contains(m(&[0])),
            "reusable device on node 2 must be inside the mask"
        );
        assert!(fam.contains(m(&[0, 2])));
        assert!(fam.contains(m(&[1, 2])));
        assert!(fam.contains(m(&[0, 1, 2])));
        assert!(!fam.contains(m(&[2])), "one reusable alone is less than 2");
    }

    #[test]
    fn min_nodes_to_cover_handles_multi_node_units() {
        let units = vec![m(&[0, 1]), m(&[1]), m(&[2]), m(&[2]), m(&[2])];
        assert_eq!(
            HintFamily::min_nodes_to_cover(m(&[0, 1, 2]), &units, 2),
            Some(1)
        );
        assert_eq!(
            HintFamily::min_nodes_to_cover(m(&[0, 1, 2]), &units, 4),
            Some(2)
        );
        assert_eq!(
            HintFamily::min_nodes_to_cover(m(&[0, 1, 2]), &units, 5),
            Some(2)
        );
        assert_eq!(
            HintFamily::min_nodes_to_cover(m(&[0, 1, 2]), &units, 6),
            None
        );
        assert_eq!(HintFamily::min_nodes_to_cover(m(&[0]), &units, 1), Some(1));
    }
}
