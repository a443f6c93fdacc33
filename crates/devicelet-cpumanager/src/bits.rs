//! A dense CPU bit set used inside the allocator (the role `k8s.io/utils/cpuset.CPUSet` plays in
//! `pkg/kubelet/cm/cpumanager`). Set algebra on words keeps `takeByTopology` cheap on large
//! machines; conversion to and from the checkpoint crate's [`CpuSet`] happens at the edges.

use devicelet_checkpoint::cpuset::CpuSet;

/// A set of CPU ids.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuBits {
    words: Vec<u64>,
}

impl CpuBits {
    /// The empty set.
    pub fn new() -> Self {
        CpuBits::default()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        let (w, b) = (cpu as usize / 64, cpu % 64);
        self.words.get(w).is_some_and(|x| x & (1u64 << b) != 0)
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: u32) {
        let (w, b) = (cpu as usize / 64, cpu % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1u64 << b;
    }

    /// Removes `cpu`.
    pub fn remove(&mut self, cpu: u32) {
        let (w, b) = (cpu as usize / 64, cpu % 64);
        if let Some(x) = self.words.get_mut(w) {
            *x &= !(1u64 << b);
        }
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &CpuBits) -> CpuBits {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| self.word(i) | other.word(i))
            .collect::<Vec<_>>();
        CpuBits { words }
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CpuBits) -> CpuBits {
        let n = self.words.len().min(other.words.len());
        CpuBits {
            words: (0..n).map(|i| self.word(i) & other.word(i)).collect(),
        }
    }

    /// `self \ other`.
    pub fn difference(&self, other: &CpuBits) -> CpuBits {
        CpuBits {
            words: (0..self.words.len())
                .map(|i| self.word(i) & !other.word(i))
                .collect(),
        }
    }

    /// Whether the sets share a CPU.
    pub fn intersects(&self, other: &CpuBits) -> bool {
        self.words
            .iter()
            .zip(other.words.iter())
            .any(|(a, b)| a & b != 0)
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset_of(&self, other: &CpuBits) -> bool {
        (0..self.words.len()).all(|i| self.word(i) & !other.word(i) == 0)
    }

    /// Number of CPUs shared with `other` (without building the intersection).
    pub fn count_common(&self, other: &CpuBits) -> usize {
        self.words
            .iter()
            .zip(other.words.iter())
            .map(|(a, b)| (a & b).count_ones() as usize)
            .sum()
    }

    /// CPU ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }

    /// Set equality independent of trailing zero words.
    pub fn same_as(&self, other: &CpuBits) -> bool {
        let n = self.words.len().max(other.words.len());
        (0..n).all(|i| self.word(i) == other.word(i))
    }

    fn word(&self, i: usize) -> u64 {
        self.words.get(i).copied().unwrap_or(0)
    }

    /// To the checkpoint crate's list type.
    pub fn to_cpuset(&self) -> CpuSet {
        self.iter().collect()
    }

    /// From the checkpoint crate's list type.
    pub fn from_cpuset(set: &CpuSet) -> CpuBits {
        set.iter().collect()
    }
}

impl FromIterator<u32> for CpuBits {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut b = CpuBits::new();
        for c in iter {
            b.insert(c);
        }
        b
    }
}

impl std::fmt::Display for CpuBits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_cpuset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_algebra_and_printing_follow_the_cpuset_list_format() {
        let a: CpuBits = [0, 1, 2, 3, 64, 65, 130].into_iter().collect();
        let b: CpuBits = [2, 3, 4, 65].into_iter().collect();
        assert_eq!(a.union(&b).to_string(), "0-4,64-65,130");
        assert_eq!(a.intersection(&b).to_string(), "2-3,65");
        assert_eq!(a.difference(&b).to_string(), "0-1,64,130");
        assert_eq!(a.count_common(&b), 3);
        assert!(a.intersects(&b));
        assert!(!a.is_subset_of(&b));
        assert!(a.intersection(&b).is_subset_of(&a));
        assert_eq!(a.len(), 7);
        let mut c = a.clone();
        c.remove(130);
        assert!(!c.same_as(&a));
        c.insert(130);
        assert!(c.same_as(&a));
    }
}
