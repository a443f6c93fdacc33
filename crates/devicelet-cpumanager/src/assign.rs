//! Choosing CPUs, after the kubelet's `cpumanager/cpu_assignment.go` (`takeByTopology`, the
//! "NUMA packed" accumulator): take whole units from the largest level down so that a request
//! occupies as few sockets / NUMA nodes / cores as possible, then single threads.
//!
//! Order of steps, as upstream:
//! 1. whole units of the larger of {socket, NUMA node} (NUMA nodes when a node spans sockets,
//!    else sockets), while the request still needs at least a whole unit;
//! 2. whole units of the smaller of the two;
//! 3. whole physical cores;
//! 4. single CPUs.
//!
//! "Packed" ordering: among candidates, units inside the parent with the fewest free CPUs come
//! first (fill up what is already partly used), ties by id; this nests level by level.
//! The options that change the strategy (`distribute-cpus-across-numa`, uncore cache) are not
//! implemented.

use std::collections::BTreeMap;

use crate::bits::CpuBits;
use crate::error::TakeError;
use crate::topology::CpuTopology;

struct Accumulator<'a> {
    topo: &'a CpuTopology,
    free: CpuBits,
    result: CpuBits,
    needed: usize,
    numa_first: bool,
}

impl Accumulator<'_> {
    fn take(&mut self, cpus: &CpuBits) {
        self.result = self.result.union(cpus);
        self.free = self.free.difference(cpus);
        self.needed = self.needed.saturating_sub(cpus.len());
    }

    fn satisfied(&self) -> bool {
        self.needed == 0
    }

    /// Free CPUs per unit of a level.
    fn free_in<K: Ord + Copy>(&self, units: &BTreeMap<K, CpuBits>) -> BTreeMap<K, usize> {
        units
            .iter()
            .map(|(k, cpus)| (*k, cpus.count_common(&self.free)))
            .collect()
    }

    /// Sort key of a CPU: (free in top unit, top id, free in second unit, second id, free in
    /// core, core id, cpu id) — the nested "packed" sort.
    fn packed_key(
        &self,
        cpu: u32,
        free_socket: &BTreeMap<u32, usize>,
        free_numa: &BTreeMap<usize, usize>,
        free_core: &BTreeMap<u32, usize>,
    ) -> (usize, usize, usize, usize, usize, u32, u32) {
        let Some(info) = self.topo.info(cpu) else {
            return (usize::MAX, 0, 0, 0, 0, 0, cpu);
        };
        let s = (
            free_socket.get(&info.socket).copied().unwrap_or(0),
            info.socket as usize,
        );
        let n = (free_numa.get(&info.numa).copied().unwrap_or(0), info.numa);
        let (top, second) = if self.numa_first { (n, s) } else { (s, n) };
        (
            top.0,
            top.1,
            second.0,
            second.1,
            free_core.get(&info.core).copied().unwrap_or(0),
            info.core,
            cpu,
        )
    }

    /// Whole free units of one level, in packed order, taken while a whole unit is needed.
    fn take_full_units<K: Ord + Copy>(&mut self, units: &BTreeMap<K, CpuBits>) {
        let free_socket = self.free_in(self.topo.sockets());
        let free_numa = self.free_in(self.topo.numa_nodes());
        let free_core = self.free_in(self.topo.cores());
        let mut full: Vec<(_, CpuBits)> = units
            .values()
            .filter(|cpus| !cpus.is_empty() && cpus.is_subset_of(&self.free))
            .filter_map(|cpus| {
                let first = cpus.iter().next()?;
                Some((
                    self.packed_key(first, &free_socket, &free_numa, &free_core),
                    cpus.clone(),
                ))
            })
            .collect();
        full.sort_by_key(|u| u.0);
        for (_, cpus) in full {
            if self.needed >= cpus.len() {
                self.take(&cpus);
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        let free_socket = self.free_in(self.topo.sockets());
        let free_numa = self.free_in(self.topo.numa_nodes());
        let free_core = self.free_in(self.topo.cores());
        let mut cpus: Vec<_> = self
            .free
            .iter()
            .map(|c| (self.packed_key(c, &free_socket, &free_numa, &free_core), c))
            .collect();
        cpus.sort_unstable();
        for (_, c) in cpus {
            if self.satisfied() {
                return;
            }
            let one: CpuBits = [c].into_iter().collect();
            self.take(&one);
        }
    }
}

/// Picks `count` CPUs out of `available` (CPUs the topology does not know are ignored).
pub fn take_by_topology(
    topo: &CpuTopology,
    available: &CpuBits,
    count: usize,
) -> Result<CpuBits, TakeError> {
    let free = available.intersection(topo.all_cpus());
    if available.len() < count || free.len() < count {
        return Err(TakeError::NotEnough {
            requested: count,
            available: available.len(),
        });
    }
    if count == 0 {
        return Ok(CpuBits::new());
    }
    let mut acc = Accumulator {
        topo,
        free,
        result: CpuBits::new(),
        needed: count,
        // A NUMA node holding one or more whole sockets is the bigger unit: take it first.
        numa_first: topo.num_sockets() >= topo.num_numa_nodes(),
    };
    if acc.numa_first {
        acc.take_full_units(topo.numa_nodes());
        acc.take_full_units(topo.sockets());
    } else {
        acc.take_full_units(topo.sockets());
        acc.take_full_units(topo.numa_nodes());
    }
    if !acc.satisfied() {
        acc.take_full_units(topo.cores());
    }
    if !acc.satisfied() {
        acc.take_remaining_cpus();
    }
    Ok(acc.result)
}

/// CPUs of `available` that sit in cores whose every thread is in `available` (the kubelet's
/// count of free physical CPUs for `full-pcpus-only`).
pub fn cpus_in_free_cores(topo: &CpuTopology, available: &CpuBits) -> usize {
    topo.cores()
        .values()
        .filter(|c| c.is_subset_of(available))
        .map(CpuBits::len)
        .sum()
}
