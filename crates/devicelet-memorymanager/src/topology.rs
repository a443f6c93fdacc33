//! The machine's memory per NUMA node, as the kubelet's memory manager sees it through
//! cadvisor's `MachineInfo.Topology` (`Node.Memory`, `Node.HugePages`); read from sysfs by
//! `devicelet-machine` (`memory.rs`) or described directly (tests, benches).

use std::collections::BTreeMap;

use devicelet_topology::{MAX_NUMA_NODES, NumaMask};

use crate::error::MemoryManagerError;

/// The resource name of regular memory.
pub const MEMORY_RESOURCE: &str = "memory";

/// Prefix of hugepage resource names (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

pub use devicelet_quantity::hugepage_resource_name;

/// Whether a resource is one the memory manager handles (`memory`, `hugepages-*`).
pub fn is_memory_resource(name: &str) -> bool {
    name == MEMORY_RESOURCE || name.starts_with(HUGEPAGES_PREFIX)
}

/// Memory of one NUMA node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaMemory {
    /// `MemTotal` of the node, bytes.
    pub memory_bytes: u64,
    /// Page size in bytes → number of pages (`nr_hugepages`).
    pub hugepages: BTreeMap<u64, u64>,
}

/// The NUMA nodes of the machine and their memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryTopology {
    nodes: BTreeMap<usize, NumaMemory>,
}

impl MemoryTopology {
    /// Builds a topology; node ids must be below 64 (the kubelet's bitmask limit) and unique,
    /// and there must be at least one node.
    pub fn new(
        nodes: impl IntoIterator<Item = (usize, NumaMemory)>,
    ) -> Result<Self, MemoryManagerError> {
        let mut out = BTreeMap::new();
        for (id, mem) in nodes {
            if id >= MAX_NUMA_NODES {
                return Err(MemoryManagerError::BadMachine(format!(
                    "NUMA node {id} is beyond the {MAX_NUMA_NODES} nodes a topology mask holds"
                )));
            }
            if out.insert(id, mem).is_some() {
                return Err(MemoryManagerError::BadMachine(format!(
                    "NUMA node {id} is listed twice"
                )));
            }
        }
        if out.is_empty() {
            return Err(MemoryManagerError::BadMachine("no NUMA nodes".into()));
        }
        Ok(MemoryTopology { nodes: out })
    }

    /// `n` identical nodes (0..n) with `memory_bytes` each and the given hugepages.
    pub fn uniform(
        n: usize,
        memory_bytes: u64,
        hugepages: &[(u64, u64)],
    ) -> Result<Self, MemoryManagerError> {
        Self::new((0..n).map(|id| {
            (
                id,
                NumaMemory {
                    memory_bytes,
                    hugepages: hugepages.iter().copied().collect(),
                },
            )
        }))
    }

    /// The nodes.
    pub fn nodes(&self) -> &BTreeMap<usize, NumaMemory> {
        &self.nodes
    }

    /// Every node as a mask.
    pub fn numa_mask(&self) -> NumaMask {
        NumaMask::from_bits(self.nodes.keys().fold(0u64, |m, &id| m | (1u64 << id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugepage_names_are_binary_si() {
        assert_eq!(hugepage_resource_name(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepage_resource_name(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepage_resource_name(64 << 10), "hugepages-64Ki");
        assert_eq!(hugepage_resource_name(1536 << 10), "hugepages-1536Ki");
    }

    #[test]
    fn topologies_refuse_impossible_machines() {
        assert!(MemoryTopology::new([]).is_err());
        assert!(MemoryTopology::new([(64, NumaMemory::default())]).is_err());
        assert!(
            MemoryTopology::new([(1, NumaMemory::default()), (1, NumaMemory::default())]).is_err()
        );
        let t = MemoryTopology::uniform(3, 1 << 30, &[]).expect("valid");
        assert_eq!(t.numa_mask().count(), 3);
    }
}
