//! NUMA node bitmask, after the kubelet's `pkg/kubelet/cm/topologymanager/bitmask/bitmask.go`.
//!
//! A [`NumaMask`] is a set of NUMA node ids held in one `u64`, exactly like the kubelet's
//! `BitMask` (valid ids 0..=63). The cap of 64 nodes is the kubelet's own; machines with more
//! nodes are refused when the topology is built (see [`crate::numa`]). Besides the primitives
//! the kubelet has (count, and/or, narrower-than, subset iteration in the kubelet's order) this
//! module has the helpers the fast merge needs: iterating the k-subsets of a mask in increasing
//! integer order, without visiting any other subset.

use std::fmt;

use crate::error::TopologyError;

/// Largest number of NUMA nodes a mask can hold (ids `0..MAX_NUMA_NODES`).
pub const MAX_NUMA_NODES: usize = 64;

/// A set of NUMA node ids (bit `i` set = node `i` is in the set).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NumaMask(u64);

impl NumaMask {
    /// The empty mask.
    pub const EMPTY: NumaMask = NumaMask(0);

    /// Builds a mask from raw bits.
    pub const fn from_bits(bits: u64) -> Self {
        NumaMask(bits)
    }

    /// The raw bits; the integer the kubelet compares with `IsLessThan`.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Builds a mask from node ids; ids of 64 and above are an error, as in the kubelet's `NewBitMask`.
    pub fn from_nodes<I: IntoIterator<Item = usize>>(nodes: I) -> Result<Self, TopologyError> {
        let mut m = NumaMask::EMPTY;
        for n in nodes {
            m = m.with(n)?;
        }
        Ok(m)
    }

    /// The mask with node `node` added.
    pub fn with(self, node: usize) -> Result<Self, TopologyError> {
        if node >= MAX_NUMA_NODES {
            return Err(TopologyError::NodeOutOfRange { node: node as i64 });
        }
        Ok(NumaMask(self.0 | (1u64 << node)))
    }

    /// A mask with the single node `node`; `None` when out of range.
    pub fn single(node: usize) -> Option<Self> {
        (node < MAX_NUMA_NODES).then(|| NumaMask(1u64 << node))
    }

    /// Whether `node` is in the mask (false for ids outside 0..64, as in the kubelet).
    pub fn is_set(self, node: usize) -> bool {
        node < MAX_NUMA_NODES && self.0 & (1u64 << node) != 0
    }

    /// Whether any of `nodes` is in the mask.
    pub fn any_set(self, nodes: &[usize]) -> bool {
        nodes.iter().any(|&n| self.is_set(n))
    }

    /// Number of nodes in the mask.
    pub fn count(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the mask is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Intersection.
    pub fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }

    /// Union.
    pub fn or(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 | other.0)
    }

    /// Set difference `self \ other`.
    pub fn minus(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & !other.0)
    }

    /// Whether every node of `self` is in `other`.
    pub fn is_subset_of(self, other: NumaMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// Whether the two masks share a node.
    pub fn intersects(self, other: NumaMask) -> bool {
        self.0 & other.0 != 0
    }

    /// The kubelet's `IsNarrowerThan`: fewer nodes wins; equal counts compare as integers.
    pub fn is_narrower_than(self, other: NumaMask) -> bool {
        let (a, b) = (self.count(), other.count());
        if a == b { self.0 < other.0 } else { a < b }
    }

    /// Node ids in increasing order.
    pub fn nodes(self) -> impl Iterator<Item = usize> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let n = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            Some(n)
        })
    }

    /// The highest node id in the mask.
    pub fn highest(self) -> Option<usize> {
        (self.0 != 0).then(|| 63 - self.0.leading_zeros() as usize)
    }
}

impl fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.nodes()).finish()
    }
}

impl fmt::Display for NumaMask {
    /// Printed like the kubelet's `BitMask.String()`: the bits as a binary number, 64 wide.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:064b}", self.0)
    }
}

/// The kubelet's `IterateBitMasks`: every non-empty subset of `nodes`, by size (1, 2, ...) and,
/// within a size, in lexicographic order of positions in `nodes`. Exponential by nature; the
/// reference implementation and `HintFamily::to_hints` use it, the fast paths never do.
pub fn iterate_bit_masks(nodes: &[usize], mut f: impl FnMut(NumaMask)) {
    fn rec(nodes: &[usize], start: usize, left: usize, acc: NumaMask, f: &mut dyn FnMut(NumaMask)) {
        if left == 0 {
            f(acc);
            return;
        }
        for i in start..nodes.len() {
            if nodes.len() - i < left {
                break;
            }
            // Out-of-range ids cannot be set, exactly as the kubelet's NewBitMask drops them.
            let next = acc.with(nodes[i]).unwrap_or(acc);
            rec(nodes, i + 1, left - 1, next, f);
        }
    }
    for size in 1..=nodes.len() {
        rec(nodes, 0, size, NumaMask::EMPTY, &mut f);
    }
}

/// Every subset of `within` with exactly `k` nodes, in increasing integer order (Gosper's
/// hack on the compressed positions of `within`, so only those subsets are visited).
/// Stops early when `f` returns `false`.
pub fn for_each_k_subset(within: NumaMask, k: usize, mut f: impl FnMut(NumaMask) -> bool) {
    let positions: Vec<usize> = within.nodes().collect();
    let n = positions.len();
    if k == 0 || k > n {
        return;
    }
    let expand = |compact: u128| {
        let mut m = 0u64;
        let mut c = compact;
        while c != 0 {
            let i = c.trailing_zeros() as usize;
            c &= c - 1;
            m |= 1u64 << positions[i];
        }
        NumaMask(m)
    };
    // u128 so that `1 << n` with n == 64 cannot overflow.
    let limit: u128 = 1u128 << n;
    let mut v: u128 = (1u128 << k) - 1;
    while v < limit {
        if !f(expand(v)) {
            return;
        }
        // Gosper: next larger integer with the same popcount.
        let c = v & v.wrapping_neg();
        let r = v + c;
        v = (((r ^ v) >> 2) / c) | r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(nodes: &[usize]) -> NumaMask {
        NumaMask::from_nodes(nodes.iter().copied()).expect("test ids are in range")
    }

    #[test]
    fn new_bitmask_rejects_node_64() {
        assert!(NumaMask::from_nodes([64]).is_err());
        assert!(NumaMask::from_nodes([63]).is_ok());
        assert!(!m(&[1]).is_set(64));
    }

    #[test]
    fn is_narrower_than_prefers_fewer_bits_then_smaller_integer() {
        assert!(m(&[0]).is_narrower_than(m(&[0, 1])));
        assert!(m(&[5]).is_narrower_than(m(&[0, 1])));
        assert!(m(&[0, 1]).is_narrower_than(m(&[0, 2])));
        assert!(!m(&[0, 2]).is_narrower_than(m(&[0, 1])));
        assert!(!m(&[0]).is_narrower_than(m(&[0])));
    }

    #[test]
    fn iterate_bit_masks_goes_by_size_then_lexicographic_positions() {
        let mut seen = vec![];
        iterate_bit_masks(&[0, 1, 2], |mask| seen.push(mask));
        let expected = vec![
            m(&[0]),
            m(&[1]),
            m(&[2]),
            m(&[0, 1]),
            m(&[0, 2]),
            m(&[1, 2]),
            m(&[0, 1, 2]),
        ];
        assert_eq!(seen, expected);
    }

    #[test]
    fn k_subsets_are_increasing_and_complete() {
        let within = m(&[1, 3, 4, 7, 9]);
        for k in 0..=6 {
            let mut seen = vec![];
            for_each_k_subset(within, k, |s| {
                seen.push(s);
                true
            });
            let mut brute = vec![];
            iterate_bit_masks(&[1, 3, 4, 7, 9], |s| {
                if s.count() == k {
                    brute.push(s)
                }
            });
            brute.sort();
            assert_eq!(seen, brute, "k = {k}");
        }
        // 64 nodes, k = 1: 64 singletons, no overflow.
        let mut n = 0;
        for_each_k_subset(NumaMask::from_bits(u64::MAX), 1, |_| {
            n += 1;
            true
        });
        assert_eq!(n, 64);
        let mut last = None;
        for_each_k_subset(NumaMask::from_bits(u64::MAX), 64, |s| {
            last = Some(s);
            true
        });
        assert_eq!(last, Some(NumaMask::from_bits(u64::MAX)));
    }

    #[test]
    fn and_or_count_subset() {
        let a = m(&[0, 1, 2]);
        let b = m(&[1, 2, 3]);
        assert_eq!(a.and(b), m(&[1, 2]));
        assert_eq!(a.or(b), m(&[0, 1, 2, 3]));
        assert_eq!(a.minus(b), m(&[0]));
        assert_eq!(a.count(), 3);
        assert!(m(&[1]).is_subset_of(a));
        assert!(!b.is_subset_of(a));
        assert_eq!(a.highest(), Some(2));
        assert_eq!(a.nodes().collect::<Vec<_>>(), vec![0, 1, 2]);
    }
}
