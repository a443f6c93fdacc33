//! CPU topology for the CPU manager, after the kubelet's `cpumanager/topology/topology.go`
//! (`CPUTopology`, `CPUDetails`, `Discover`): for every online CPU its socket, physical core and
//! NUMA node. No IO here: built from what sysfs says of each CPU ([`CpuPlacement`], read by
//! `devicelet-machine` from `devices/system/cpu/cpuN/topology/{physical_package_id,core_id}`),
//! from a machine description ([`CpuMachineConfig`]: sockets × cores × threads, NUMA nodes), or
//! from an explicit list (tests that mirror upstream's fixed topologies).
//!
//! Core ids in sysfs repeat across sockets, so cadvisor groups threads into a core by (NUMA
//! node, socket, core_id), and the kubelet names the core by its lowest thread id
//! (`getUniqueCoreID`); the same is done here, so ties in the allocator's sorts break alike.
//!
//! Each CPU also carries its uncore (L3) cache id: cadvisor's first cache above L2 that is not
//! shared by the whole NUMA node (`UncoreCaches[0].Id`), or, without one, the socket id, as the
//! kubelet's `getUncoreCacheID` falls back.

use std::collections::{BTreeMap, BTreeSet};

use devicelet_topology::{MachineConfig, NumaMask, NumaTopology};
use serde::{Deserialize, Serialize};

use crate::bits::CpuBits;
use crate::error::CpuTopologyError;

/// Where one logical CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    /// Logical CPU id.
    pub id: u32,
    /// Socket (physical package) id.
    pub socket: u32,
    /// Core id, unique machine-wide (dense renumbering of (socket, core_id)).
    pub core: u32,
    /// NUMA node id.
    pub numa: usize,
    /// Uncore (L3) cache id, or the socket id where the machine reports none.
    pub uncore_cache: u32,
}

/// Where sysfs places one logical CPU (`Discover`'s view): `core_id` is per socket, so it
/// repeats across sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPlacement {
    /// Logical CPU id.
    pub id: u32,
    /// `physical_package_id`.
    pub socket: u32,
    /// `core_id`, unique within its socket only.
    pub core_id: u32,
    /// NUMA node id.
    pub numa: usize,
    /// Uncore (L3) cache id (`UncoreCaches[0].Id`), or the socket id when cadvisor found none.
    pub uncore_cache: u32,
}

/// The machine's CPUs grouped by socket, NUMA node and core.
#[derive(Clone, Debug)]
pub struct CpuTopology {
    cpus: Vec<CpuInfo>,
    all: CpuBits,
    by_socket: BTreeMap<u32, CpuBits>,
    by_numa: BTreeMap<usize, CpuBits>,
    by_core: BTreeMap<u32, CpuBits>,
    by_uncore: BTreeMap<u32, CpuBits>,
    info: BTreeMap<u32, CpuInfo>,
    numa_mask: NumaMask,
}

/// A machine described by shape (camelCase keys for `--config`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuMachineConfig {
    /// Sockets.
    pub sockets: u32,
    /// Physical cores per socket.
    pub cores_per_socket: u32,
    /// Hardware threads per core.
    pub threads_per_core: u32,
    /// NUMA nodes in total: a multiple of `sockets` (split each socket) or a divisor of it
    /// (several sockets per node).
    pub numa_nodes: u32,
    /// Physical cores sharing one L3 (uncore) cache, e.g. 8 on AMD EPYC (a CCX). Must divide
    /// `coresPerSocket`. Absent, or a cache as large as a NUMA node (cadvisor then files it as
    /// a node cache): the uncore id is the socket id, as the kubelet falls back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_per_uncore_cache: Option<u32>,
}

impl CpuMachineConfig {
    /// CPU numbering as Linux does on common x86 machines: first threads of every core
    /// (socket by socket), then the second threads, and so on:
    /// `id = thread * sockets * cores + socket * cores + core`.
    pub fn to_topology(&self) -> Result<CpuTopology, CpuTopologyError> {
        let (s, c, t, n) = (
            self.sockets,
            self.cores_per_socket,
            self.threads_per_core,
            self.numa_nodes,
        );
        if s == 0 || c == 0 || t == 0 || n == 0 {
            return Err(CpuTopologyError::BadMachine(format!(
                "sockets ({s}), coresPerSocket ({c}), threadsPerCore ({t}) and numaNodes ({n}) must all be at least 1"
            )));
        }
        if n as usize > devicelet_topology::MAX_NUMA_NODES {
            return Err(CpuTopologyError::BadMachine(format!(
                "{n} NUMA nodes; at most 64 are supported"
            )));
        }
        let total = (s as u64) * (c as u64) * (t as u64);
        if total > (1 << 20) {
            return Err(CpuTopologyError::BadMachine(format!(
                "{total} CPUs is implausibly many"
            )));
        }
        let node_of = |socket: u32, core: u32| -> Result<usize, CpuTopologyError> {
            if n >= s {
                if n % s != 0 {
                    return Err(CpuTopologyError::BadMachine(format!(
                        "{n} NUMA nodes cannot be split evenly over {s} sockets"
                    )));
                }
                let per_socket = n / s;
                if c % per_socket != 0 {
                    return Err(CpuTopologyError::BadMachine(format!(
                        "{c} cores per socket cannot be split evenly over {per_socket} NUMA nodes per socket"
                    )));
                }
                Ok((socket * per_socket + core / (c / per_socket)) as usize)
            } else {
                if s % n != 0 {
                    return Err(CpuTopologyError::BadMachine(format!(
                        "{s} sockets cannot be grouped evenly into {n} NUMA nodes"
                    )));
                }
                Ok((socket / (s / n)) as usize)
            }
        };
        // CPUs of one NUMA node, to tell an uncore cache from a node-wide one (cadvisor's
        // `addCacheInfo` compares the cache's CPU count with the node's).
        let cpus_per_node = (s as u64 * c as u64 * t as u64) / n as u64;
        let uncore_of = |socket: u32, core: u32| -> Result<u32, CpuTopologyError> {
            let Some(k) = self.cores_per_uncore_cache else {
                return Ok(socket);
            };
            if k == 0 || c % k != 0 {
                return Err(CpuTopologyError::BadMachine(format!(
                    "{c} cores per socket cannot be split evenly into uncore caches of {k} cores"
                )));
            }
            if k as u64 * t as u64 == cpus_per_node {
                return Ok(socket);
            }
            Ok(socket * (c / k) + core / k)
        };
        let mut cpus = vec![];
        for thread in 0..t {
            for socket in 0..s {
                for core in 0..c {
                    cpus.push(CpuInfo {
                        id: thread * s * c + socket * c + core,
                        socket,
                        core: socket * c + core,
                        numa: node_of(socket, core)?,
                        uncore_cache: uncore_of(socket, core)?,
                    });
                }
            }
        }
        CpuTopology::new(cpus)
    }
}

impl CpuTopology {
    /// Builds a topology from explicit CPU records.
    pub fn new(cpus: Vec<CpuInfo>) -> Result<Self, CpuTopologyError> {
        if cpus.is_empty() {
            return Err(CpuTopologyError::NoCpus);
        }
        let mut info = BTreeMap::new();
        let mut all = CpuBits::new();
        let mut by_socket: BTreeMap<u32, CpuBits> = BTreeMap::new();
        let mut by_numa: BTreeMap<usize, CpuBits> = BTreeMap::new();
        let mut by_core: BTreeMap<u32, CpuBits> = BTreeMap::new();
        let mut by_uncore: BTreeMap<u32, CpuBits> = BTreeMap::new();
        let mut numa_mask = NumaMask::EMPTY;
        let mut core_socket: BTreeMap<u32, u32> = BTreeMap::new();
        for c in &cpus {
            if info.insert(c.id, *c).is_some() {
                return Err(CpuTopologyError::DuplicateCpu(c.id));
            }
            if let Some(s) = core_socket.insert(c.core, c.socket)
                && s != c.socket
            {
                return Err(CpuTopologyError::BadMachine(format!(
                    "core {} is on sockets {} and {}",
                    c.core, s, c.socket
                )));
            }
            numa_mask = numa_mask
                .with(c.numa)
                .map_err(|e| CpuTopologyError::BadMachine(format!("CPU {}: {e}", c.id)))?;
            all.insert(c.id);
            by_socket.entry(c.socket).or_default().insert(c.id);
            by_numa.entry(c.numa).or_default().insert(c.id);
            by_core.entry(c.core).or_default().insert(c.id);
            by_uncore.entry(c.uncore_cache).or_default().insert(c.id);
        }
        let mut cpus = cpus;
        cpus.sort_by_key(|c| c.id);
        Ok(CpuTopology {
            cpus,
            all,
            by_socket,
            by_numa,
            by_core,
            by_uncore,
            info,
            numa_mask,
        })
    }

    /// Builds a topology from sysfs placements: threads with the same (NUMA node, socket,
    /// core_id) form a core (cadvisor's grouping), named by its lowest CPU id (the kubelet's
    /// `getUniqueCoreID`).
    pub fn from_placements(placements: Vec<CpuPlacement>) -> Result<Self, CpuTopologyError> {
        let mut lowest: BTreeMap<(usize, u32, u32), u32> = BTreeMap::new();
        for p in &placements {
            let slot = lowest.entry((p.numa, p.socket, p.core_id)).or_insert(p.id);
            *slot = (*slot).min(p.id);
        }
        let cpus = placements
            .into_iter()
            .map(|p| CpuInfo {
                id: p.id,
                socket: p.socket,
                core: lowest
                    .get(&(p.numa, p.socket, p.core_id))
                    .copied()
                    .unwrap_or(p.id),
                numa: p.numa,
                uncore_cache: p.uncore_cache,
            })
            .collect();
        CpuTopology::new(cpus)
    }

    /// Without socket/core information: every CPU its own core, one socket per NUMA node.
    pub fn from_numa(numa: &NumaTopology) -> Result<Self, CpuTopologyError> {
        let cpus = numa
            .nodes
            .iter()
            .flat_map(|n| {
                n.cpus.iter().map(move |&c| CpuInfo {
                    id: c,
                    socket: n.id as u32,
                    core: c,
                    numa: n.id,
                    uncore_cache: n.id as u32,
                })
            })
            .collect();
        CpuTopology::new(cpus)
    }

    /// From a NUMA-only machine description (see [`CpuTopology::from_numa`]).
    pub fn from_machine_config(cfg: &MachineConfig) -> Result<Self, CpuTopologyError> {
        CpuTopology::from_numa(&cfg.to_topology()?)
    }

    /// A [`NumaTopology`] with this machine's nodes and CPUs (uniform distances 10/20).
    pub fn numa_topology(&self) -> NumaTopology {
        let n = self.by_numa.keys().max().map_or(0, |m| m + 1);
        NumaTopology {
            nodes: (0..n)
                .map(|id| devicelet_topology::NumaNode {
                    id,
                    cpus: self.by_numa.get(&id).map_or(vec![], |b| b.iter().collect()),
                })
                .collect(),
            distances: Some(
                (0..n)
                    .map(|i| (0..n).map(|j| if i == j { 10 } else { 20 }).collect())
                    .collect(),
            ),
        }
    }

    /// Every CPU, by id.
    pub fn cpus(&self) -> &[CpuInfo] {
        &self.cpus
    }

    /// All CPUs.
    pub fn all_cpus(&self) -> &CpuBits {
        &self.all
    }

    /// Record of one CPU.
    pub fn info(&self, cpu: u32) -> Option<&CpuInfo> {
        self.info.get(&cpu)
    }

    /// Number of logical CPUs.
    pub fn num_cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Number of sockets.
    pub fn num_sockets(&self) -> usize {
        self.by_socket.len()
    }

    /// Number of physical cores.
    pub fn num_cores(&self) -> usize {
        self.by_core.len()
    }

    /// Number of NUMA nodes.
    pub fn num_numa_nodes(&self) -> usize {
        self.by_numa.len()
    }

    /// Hardware threads per core (the kubelet's `CPUsPerCore`, `NumCPUs / NumCores`).
    pub fn cpus_per_core(&self) -> usize {
        self.num_cpus() / self.num_cores().max(1)
    }

    /// The kubelet's `CPUsPerSocket` (`NumCPUs / NumSockets`), the size a free socket has.
    pub fn cpus_per_socket(&self) -> usize {
        self.num_cpus() / self.num_sockets().max(1)
    }

    /// Number of distinct uncore cache ids.
    pub fn num_uncore_caches(&self) -> usize {
        self.by_uncore.len()
    }

    /// The kubelet's `CPUsPerUncore` (`NumCPUs / NumUncoreCache`).
    pub fn cpus_per_uncore_cache(&self) -> usize {
        self.num_cpus() / self.num_uncore_caches().max(1)
    }

    /// CPUs per uncore cache.
    pub fn uncore_caches(&self) -> &BTreeMap<u32, CpuBits> {
        &self.by_uncore
    }

    /// CPUs of the sockets that hold any CPU of the NUMA nodes in `mask` (`align-by-socket`).
    pub fn cpus_in_sockets_of_numa_mask(&self, mask: NumaMask) -> CpuBits {
        let mut out = CpuBits::new();
        for s in self.sockets_in_numa_mask(mask) {
            if let Some(b) = self.by_socket.get(&s) {
                out = out.union(b);
            }
        }
        out
    }

    /// Sockets holding any CPU of the NUMA nodes in `mask` (`SocketsInNUMANodes`).
    pub fn sockets_in_numa_mask(&self, mask: NumaMask) -> BTreeSet<u32> {
        self.cpus
            .iter()
            .filter(|c| mask.nodes().any(|n| n == c.numa))
            .map(|c| c.socket)
            .collect()
    }

    /// NUMA nodes with CPUs, as a mask.
    pub fn numa_mask(&self) -> NumaMask {
        self.numa_mask
    }

    /// CPUs per socket.
    pub fn sockets(&self) -> &BTreeMap<u32, CpuBits> {
        &self.by_socket
    }

    /// CPUs per NUMA node.
    pub fn numa_nodes(&self) -> &BTreeMap<usize, CpuBits> {
        &self.by_numa
    }

    /// CPUs per core.
    pub fn cores(&self) -> &BTreeMap<u32, CpuBits> {
        &self.by_core
    }

    /// CPUs on the NUMA nodes of `mask`.
    pub fn cpus_in_numa_mask(&self, mask: NumaMask) -> CpuBits {
        let mut out = CpuBits::new();
        for n in mask.nodes() {
            if let Some(b) = self.by_numa.get(&n) {
                out = out.union(b);
            }
        }
        out
    }

    /// The NUMA mask of one CPU (empty for unknown CPUs).
    pub fn numa_of(&self, cpu: u32) -> NumaMask {
        self.info
            .get(&cpu)
            .and_then(|i| NumaMask::single(i.numa))
            .unwrap_or(NumaMask::EMPTY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_config_numbers_cpus_like_linux_and_splits_numa_nodes() {
        let t = CpuMachineConfig {
            sockets: 2,
            cores_per_socket: 4,
            threads_per_core: 2,
            numa_nodes: 4,
            cores_per_uncore_cache: None,
        }
        .to_topology()
        .expect("valid machine");
        assert_eq!(t.num_cpus(), 16);
        assert_eq!(t.num_cores(), 8);
        assert_eq!(t.num_sockets(), 2);
        assert_eq!(t.num_numa_nodes(), 4);
        assert_eq!(t.cpus_per_core(), 2);
        // cpu 0 and cpu 8 are siblings on socket 0 core 0, NUMA 0.
        assert_eq!(t.cores()[&0].to_string(), "0,8");
        assert_eq!(t.numa_nodes()[&1].to_string(), "2-3,10-11");
        assert_eq!(t.sockets()[&1].to_string(), "4-7,12-15");
    }

    #[test]
    fn placements_number_cores_densely_by_socket_and_core_id() {
        // 2 sockets, 2 cores each, SMT-2; core_id 0 and 1 repeat on each socket.
        let placements = (0..8u32)
            .map(|id| CpuPlacement {
                id,
                socket: (id % 4) / 2,
                core_id: id % 2,
                numa: ((id % 4) / 2) as usize,
                uncore_cache: (id % 4) / 2,
            })
            .collect();
        let t = CpuTopology::from_placements(placements).expect("valid");
        assert_eq!(t.num_cpus(), 8);
        assert_eq!(t.num_sockets(), 2);
        assert_eq!(t.num_cores(), 4);
        assert_eq!(t.cpus_per_core(), 2);
        let cores: Vec<String> = t.cores().values().map(|c| c.to_string()).collect();
        assert_eq!(cores, vec!["0,4", "1,5", "2,6", "3,7"]);
        assert!(matches!(
            CpuTopology::from_placements(vec![]),
            Err(CpuTopologyError::NoCpus)
        ));
    }

    #[test]
    fn a_cpu_twice_a_core_split_across_sockets_or_no_cpu_is_refused() {
        let info = |id, socket, core| CpuInfo {
            id,
            socket,
            core,
            numa: 0,
            uncore_cache: socket,
        };
        assert!(matches!(
            CpuTopology::new(vec![info(0, 0, 0), info(0, 0, 1)]).expect_err("dup"),
            CpuTopologyError::DuplicateCpu(0)
        ));
        assert!(matches!(
            CpuTopology::new(vec![info(0, 0, 0), info(1, 1, 0)]).expect_err("split core"),
            CpuTopologyError::BadMachine(_)
        ));
        assert!(matches!(
            CpuTopology::new(vec![]).expect_err("empty"),
            CpuTopologyError::NoCpus
        ));
    }

    #[test]
    fn machine_config_numbers_uncore_caches_and_falls_back_to_the_socket() {
        let epyc = CpuMachineConfig {
            sockets: 2,
            cores_per_socket: 32,
            threads_per_core: 2,
            numa_nodes: 4,
            cores_per_uncore_cache: Some(8),
        }
        .to_topology()
        .expect("valid machine");
        assert_eq!(epyc.num_uncore_caches(), 8);
        assert_eq!(epyc.cpus_per_uncore_cache(), 16);
        assert_eq!(epyc.uncore_caches()[&5].to_string(), "40-47,104-111");
        // An L3 as large as a NUMA node is a node cache for cadvisor: socket ids.
        let node_wide = CpuMachineConfig {
            cores_per_uncore_cache: Some(16),
            ..epyc_config()
        }
        .to_topology()
        .expect("valid machine");
        let ids: Vec<u32> = node_wide.uncore_caches().keys().copied().collect();
        assert_eq!(ids, vec![0, 1]);
        let uneven = CpuMachineConfig {
            cores_per_uncore_cache: Some(5),
            ..epyc_config()
        }
        .to_topology();
        assert!(matches!(uneven, Err(CpuTopologyError::BadMachine(_))));
    }

    fn epyc_config() -> CpuMachineConfig {
        CpuMachineConfig {
            sockets: 2,
            cores_per_socket: 32,
            threads_per_core: 2,
            numa_nodes: 4,
            cores_per_uncore_cache: None,
        }
    }

    #[test]
    fn machine_config_rejects_impossible_shapes() {
        for (s, c, t, n) in [
            (0, 4, 2, 1),
            (2, 4, 2, 3),
            (3, 4, 1, 2),
            (2, 3, 1, 4),
            (1, 1, 1, 65),
        ] {
            let r = CpuMachineConfig {
                sockets: s,
                cores_per_socket: c,
                threads_per_core: t,
                numa_nodes: n,
                cores_per_uncore_cache: None,
            }
            .to_topology();
            assert!(
                matches!(r, Err(CpuTopologyError::BadMachine(_))),
                "{s}/{c}/{t}/{n} gave {r:?}"
            );
        }
    }
}
