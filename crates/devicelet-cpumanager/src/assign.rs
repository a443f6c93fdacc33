//! Choosing CPUs, after the kubelet's `cpumanager/cpu_assignment.go` (1.36.3): the accumulator
//! behind `takeByTopologyNUMAPacked` and `takeByTopologyNUMADistributed`, and the static
//! policy's choice between them (`staticPolicy.takeByTopology` in `policy_static.go`).
//!
//! Packed order of steps, as upstream:
//! 1. whole units of the larger of {socket, NUMA node} (NUMA nodes when a node holds one or
//!    more sockets, else sockets), while the request still needs a whole unit;
//! 2. whole units of the smaller of the two;
//! 3. with `prefer-align-cpus-by-uncorecache`: whole, then partial uncore (L3) caches;
//! 4. whole physical cores (not with the "spread" order of `distribute-cpus-across-cores`);
//! 5. single CPUs, in "packed" order (core by core) or "spread" order (socket by socket).
//!
//! Units are sorted by how many of their CPUs are still available (fewest first, so partly
//! used units fill up), then by id, nested level by level exactly as upstream nests its sorts;
//! a core's id is its lowest CPU id, as the kubelet names cores. What counts as a free unit is
//! upstream's test too: a socket is free when it has `NumCPUs / NumSockets` available CPUs, a
//! core when it has `NumCPUs / NumCores`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use crate::bits::CpuBits;
use crate::error::TakeError;
use crate::options::StaticPolicyOptions;
use crate::topology::{CpuInfo, CpuTopology};

/// Order in which single CPUs are handed out (`CPUSortingStrategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortingStrategy {
    /// Sibling threads together, core by core (the default).
    Packed,
    /// CPU ids in order socket by socket, so siblings come last (`distribute-cpus-across-cores`).
    Spread,
}

struct Accumulator<'a> {
    topo: &'a CpuTopology,
    /// Available CPUs not yet taken (upstream's `details`).
    free: CpuBits,
    result: CpuBits,
    needed: isize,
    numa_first: bool,
    strategy: SortingStrategy,
}

impl<'a> Accumulator<'a> {
    fn new(
        topo: &'a CpuTopology,
        available: &CpuBits,
        count: usize,
        strategy: SortingStrategy,
    ) -> Self {
        Accumulator {
            topo,
            free: available.intersection(topo.all_cpus()),
            result: CpuBits::new(),
            needed: isize::try_from(count).unwrap_or(isize::MAX),
            // A NUMA node holding one or more whole sockets is the bigger unit: take it first.
            numa_first: topo.num_sockets() >= topo.num_numa_nodes(),
            strategy,
        }
    }

    fn take(&mut self, cpus: &CpuBits) {
        self.result = self.result.union(cpus);
        self.free = self.free.difference(&self.result);
        self.needed -= cpus.len() as isize;
    }

    fn satisfied(&self) -> bool {
        self.needed < 1
    }

    fn failed(&self) -> bool {
        self.needed > self.free.len() as isize
    }

    fn needs_at_least(&self, n: usize) -> bool {
        self.needed >= n as isize
    }

    fn free_of<K: Ord>(&self, units: &BTreeMap<K, CpuBits>, id: &K) -> usize {
        units.get(id).map_or(0, |c| c.count_common(&self.free))
    }

    /// Distinct keys of the available CPUs inside `within`, sorted by (available CPUs in the
    /// unit, id) — upstream's `sort` over a `CPUDetails` query.
    fn sorted_units<K: Ord + Copy>(
        &self,
        within: &CpuBits,
        key: impl Fn(&CpuInfo) -> K,
        units: &BTreeMap<K, CpuBits>,
    ) -> Vec<K> {
        let ids: BTreeSet<K> = self
            .free
            .intersection(within)
            .iter()
            .filter_map(|c| self.topo.info(c).map(&key))
            .collect();
        let mut ids: Vec<(usize, K)> = ids
            .into_iter()
            .map(|k| (self.free_of(units, &k), k))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, k)| k).collect()
    }

    fn sort_numa_nodes(&self) -> Vec<usize> {
        let numa = self.topo.numa_nodes();
        if self.numa_first {
            return self.sorted_units(self.topo.all_cpus(), |i| i.numa, numa);
        }
        let mut out = vec![];
        for s in self.sort_sockets() {
            if let Some(cpus) = self.topo.sockets().get(&s) {
                out.extend(self.sorted_units(cpus, |i| i.numa, numa));
            }
        }
        out
    }

    fn sort_sockets(&self) -> Vec<u32> {
        let sockets = self.topo.sockets();
        if !self.numa_first {
            return self.sorted_units(self.topo.all_cpus(), |i| i.socket, sockets);
        }
        let mut out = vec![];
        for n in self.sort_numa_nodes() {
            if let Some(cpus) = self.topo.numa_nodes().get(&n) {
                out.extend(self.sorted_units(cpus, |i| i.socket, sockets));
            }
        }
        out
    }

    fn sort_cores(&self) -> Vec<u32> {
        let cores = self.topo.cores();
        let mut out = vec![];
        if self.numa_first {
            for s in self.sort_sockets() {
                if let Some(cpus) = self.topo.sockets().get(&s) {
                    out.extend(self.sorted_units(cpus, |i| i.core, cores));
                }
            }
        } else {
            for n in self.sort_numa_nodes() {
                if let Some(cpus) = self.topo.numa_nodes().get(&n) {
                    out.extend(self.sorted_units(cpus, |i| i.core, cores));
                }
            }
        }
        out
    }

    fn sort_uncore_caches(&self) -> Vec<u32> {
        let mut out = vec![];
        for n in self.sort_numa_nodes() {
            if let Some(cpus) = self.topo.numa_nodes().get(&n) {
                out.extend(self.sorted_units(cpus, |i| i.uncore_cache, self.topo.uncore_caches()));
            }
        }
        out
    }

    /// Single CPUs in the strategy's order (may repeat a CPU where upstream's nested queries
    /// repeat a unit; upstream then counts it twice, and so does [`Accumulator::take`]).
    fn sorted_cpus(&self) -> Vec<u32> {
        let mut out = vec![];
        let groups: Vec<CpuBits> = match self.strategy {
            SortingStrategy::Packed => self
                .sort_cores()
                .into_iter()
                .filter_map(|c| self.topo.cores().get(&c).cloned())
                .collect(),
            SortingStrategy::Spread => self
                .sort_sockets()
                .into_iter()
                .filter_map(|s| self.topo.sockets().get(&s).cloned())
                .collect(),
        };
        for g in groups {
            out.extend(g.intersection(&self.free).iter());
        }
        out
    }

    fn take_full_numa_nodes(&mut self) {
        let numa = self.topo.numa_nodes();
        let free: Vec<usize> = self
            .sort_numa_nodes()
            .into_iter()
            .filter(|n| self.free_of(numa, n) == numa.get(n).map_or(0, CpuBits::len))
            .collect();
        for n in free {
            let Some(cpus) = numa.get(&n) else { continue };
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_full_sockets(&mut self) {
        let sockets = self.topo.sockets();
        let per_socket = self.topo.cpus_per_socket();
        let free: Vec<u32> = self
            .sort_sockets()
            .into_iter()
            .filter(|s| self.free_of(sockets, s) == per_socket)
            .collect();
        for s in free {
            let Some(cpus) = sockets.get(&s) else {
                continue;
            };
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_full_uncore_caches(&mut self) {
        let uncore = self.topo.uncore_caches();
        let free: Vec<u32> = self
            .sort_uncore_caches()
            .into_iter()
            .filter(|u| self.free_of(uncore, u) == uncore.get(u).map_or(0, CpuBits::len))
            .collect();
        for u in free {
            let Some(cpus) = uncore.get(&u) else { continue };
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    /// `takePartialUncore`: the lowest-numbered cores with available CPUs in the cache, as many
    /// as the request needs; taken only when they give exactly the CPUs still needed.
    fn take_partial_uncore_cache(&mut self, uncore: u32) {
        let per_core = self.topo.cpus_per_core().max(1) as isize;
        let cores_needed = ((self.needed + per_core - 1) / per_core).max(0) as usize;
        let Some(in_cache) = self.topo.uncore_caches().get(&uncore) else {
            return;
        };
        let cores: BTreeSet<u32> = self
            .free
            .intersection(in_cache)
            .iter()
            .filter_map(|c| self.topo.info(c).map(|i| i.core))
            .collect();
        let mut cpus = CpuBits::new();
        for core in cores.into_iter().take(cores_needed) {
            if let Some(c) = self.topo.cores().get(&core) {
                cpus = cpus.union(&c.intersection(&self.free));
            }
        }
        // Upstream tests oddness with `% 2`, not with the SMT level, and drops the highest CPU.
        if self.needed % 2 != 0
            && per_core > 1
            && cpus.len() as isize > self.needed
            && let Some(last) = cpus.iter().last()
        {
            cpus.remove(last);
        }
        if self.needed == cpus.len() as isize {
            self.take(&cpus);
        }
    }

    fn take_uncore_caches(&mut self) {
        let per_cache = self.topo.cpus_per_uncore_cache();
        for uncore in self.sort_uncore_caches() {
            if self.needs_at_least(per_cache) {
                self.take_full_uncore_caches();
            }
            if self.satisfied() {
                return;
            }
            self.take_partial_uncore_cache(uncore);
            if self.satisfied() {
                return;
            }
        }
    }

    fn take_full_cores(&mut self) {
        let cores = self.topo.cores();
        let per_core = self.topo.cpus_per_core();
        let free: Vec<u32> = self
            .sort_cores()
            .into_iter()
            .filter(|c| self.free_of(cores, c) == per_core)
            .collect();
        for c in free {
            let Some(cpus) = cores.get(&c) else { continue };
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.sorted_cpus() {
            let one: CpuBits = [cpu].into_iter().collect();
            self.take(&one);
            if self.satisfied() {
                return;
            }
        }
    }

    fn take_first_level(&mut self) {
        if self.numa_first {
            self.take_full_numa_nodes();
        } else {
            self.take_full_sockets();
        }
    }

    fn take_second_level(&mut self) {
        if self.numa_first {
            self.take_full_sockets();
        } else {
            self.take_full_numa_nodes();
        }
    }

    /// `rangeNUMANodesNeededToSatisfy`.
    fn numa_nodes_needed(&self, group: usize) -> (usize, usize) {
        let nodes = self.topo.num_numa_nodes().max(1);
        let available_nodes: BTreeSet<usize> = self
            .free
            .iter()
            .filter_map(|c| self.topo.info(c).map(|i| i.numa))
            .collect();
        let cpus = self.topo.num_cpus();
        let groups = (cpus.saturating_sub(1)) / group + 1;
        let groups_per_node = (groups - 1) / nodes + 1;
        let groups_needed = (self.needed.max(1) as usize - 1) / group + 1;
        let min = (groups_needed - 1) / groups_per_node + 1;
        let max = groups_needed.min(available_nodes.len());
        (min, max)
    }
}

fn not_enough(count: usize, available: &CpuBits) -> TakeError {
    TakeError::NotEnough {
        requested: count,
        available: available.len(),
    }
}

/// `takeByTopologyNUMAPacked`.
pub fn take_packed(
    topo: &CpuTopology,
    available: &CpuBits,
    count: usize,
    strategy: SortingStrategy,
    prefer_uncore_cache: bool,
) -> Result<CpuBits, TakeError> {
    let mut acc = Accumulator::new(topo, available, count, strategy);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.failed() {
        return Err(not_enough(count, available));
    }
    acc.take_first_level();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    acc.take_second_level();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if prefer_uncore_cache {
        acc.take_uncore_caches();
        if acc.satisfied() {
            return Ok(acc.result);
        }
    }
    if strategy != SortingStrategy::Spread {
        acc.take_full_cores();
        if acc.satisfied() {
            return Ok(acc.result);
        }
    }
    acc.take_remaining_cpus();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    Err(TakeError::Failed)
}

/// Picks `count` CPUs out of `available` NUMA-packed, without uncore-cache preference
/// (CPUs the topology does not know are ignored).
pub fn take_by_topology(
    topo: &CpuTopology,
    available: &CpuBits,
    count: usize,
) -> Result<CpuBits, TakeError> {
    take_packed(topo, available, count, SortingStrategy::Packed, false)
}

/// The static policy's `takeByTopology`: the options pick the algorithm and the order.
pub fn take_by_topology_with(
    topo: &CpuTopology,
    available: &CpuBits,
    count: usize,
    options: &StaticPolicyOptions,
) -> Result<CpuBits, TakeError> {
    let strategy = if options.distribute_cpus_across_cores {
        SortingStrategy::Spread
    } else {
        SortingStrategy::Packed
    };
    if options.distribute_cpus_across_numa {
        let group = if options.full_pcpus_only {
            topo.cpus_per_core().max(1)
        } else {
            1
        };
        return take_distributed(topo, available, count, group, strategy);
    }
    take_packed(
        topo,
        available,
        count,
        strategy,
        options.prefer_align_by_uncore_cache,
    )
}

/// A Go slice of ints: a shared backing array and a length. Upstream keeps the slices its
/// combination iterator hands out (`bestCombo = combo`), and Go's `append` writes into the
/// parent's array while capacity lasts, so a kept combination of 4, 6, 7, 10... NUMA nodes is
/// overwritten by the ones iterated after it. The result depends on that, so it is reproduced
/// here (upstream bug, kept for identical allocations).
#[derive(Clone)]
struct GoSlice {
    array: Rc<RefCell<Vec<usize>>>,
    len: usize,
}

impl GoSlice {
    fn empty() -> Self {
        GoSlice {
            array: Rc::new(RefCell::new(vec![])),
            len: 0,
        }
    }

    /// `append(s, x)` for `[]int`: in place while capacity lasts, else a new array of twice
    /// the capacity (at least 1; powers of two are exact Go size classes for 8-byte ints).
    fn append(&self, x: usize) -> GoSlice {
        let cap = self.array.borrow().len();
        if self.len < cap {
            self.array.borrow_mut()[self.len] = x;
            return GoSlice {
                array: Rc::clone(&self.array),
                len: self.len + 1,
            };
        }
        let mut grown = vec![0; (2 * cap).max(1)];
        grown[..self.len].copy_from_slice(&self.array.borrow()[..self.len]);
        grown[self.len] = x;
        GoSlice {
            array: Rc::new(RefCell::new(grown)),
            len: self.len + 1,
        }
    }

    fn to_vec(&self) -> Vec<usize> {
        self.array.borrow()[..self.len].to_vec()
    }
}

/// `iterateCombinations`: every `k`-subset of `n` in lexicographic index order; `f` returns
/// `true` to stop.
fn iterate_combinations(n: &[usize], k: usize, f: &mut dyn FnMut(&GoSlice) -> bool) {
    fn helper(
        n: &[usize],
        k: usize,
        start: usize,
        accum: GoSlice,
        f: &mut dyn FnMut(&GoSlice) -> bool,
    ) -> bool {
        if k == 0 {
            return f(&accum);
        }
        if n.len() < k {
            return false;
        }
        for i in start..=n.len() - k {
            if helper(n, k - 1, i + 1, accum.append(n[i]), f) {
                return true;
            }
        }
        false
    }
    if k >= 1 {
        helper(n, k, 0, GoSlice::empty(), f);
    }
}

/// Upstream's `mean`, rounded to 3 decimals.
fn mean(xs: &[usize]) -> f64 {
    let sum: f64 = xs.iter().map(|&x| x as f64).sum();
    let m = sum / xs.len() as f64;
    (m * 1000.0).round() / 1000.0
}

/// Upstream's `standardDeviation`, rounded to 3 decimals.
fn standard_deviation(xs: &[usize]) -> f64 {
    let m = mean(xs);
    let sum: f64 = xs.iter().map(|&x| (x as f64 - m) * (x as f64 - m)).sum();
    ((sum / xs.len() as f64).sqrt() * 1000.0).round() / 1000.0
}

/// `takeByTopologyNUMADistributed`: spread a request that needs several NUMA nodes evenly
/// over them (in groups of `group` CPUs: whole cores with `full-pcpus-only`), choosing the
/// node combination that leaves the most balanced free CPUs.
pub fn take_distributed(
    topo: &CpuTopology,
    available: &CpuBits,
    count: usize,
    group: usize,
    strategy: SortingStrategy,
) -> Result<CpuBits, TakeError> {
    let group = group.max(1);
    if !count.is_multiple_of(group) {
        return take_packed(topo, available, count, strategy, false);
    }
    let mut acc = Accumulator::new(topo, available, count, strategy);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.failed() {
        return Err(not_enough(count, available));
    }
    let numa_cpus = topo.numa_nodes();
    let numas = acc.sort_numa_nodes();
    let free_in = |acc: &Accumulator, n: usize| acc.free_of(numa_cpus, &n);
    // The search below does not take anything: count each node's available CPUs once. NUMA
    // ids are below 64 (`NumaMask`), so plain arrays indexed by id hold the counts.
    let mut free_count = [0usize; 64];
    for &n in &numas {
        if n < 64 {
            free_count[n] = free_in(&acc, n);
        }
    }
    let count_of = |n: usize| free_count.get(n).copied().unwrap_or(0);
    // Upstream's `availableAfterAllocation` map has one key per available node; the balance
    // is computed over them (in id order here; Go's map order only changes float rounding).
    let keys: Vec<usize> = numas
        .iter()
        .copied()
        .collect::<BTreeSet<usize>>()
        .into_iter()
        .filter(|&n| n < 64)
        .collect();
    let balance_of = |after: &[usize; 64]| -> f64 {
        let values: Vec<usize> = keys.iter().map(|&n| after[n]).collect();
        standard_deviation(&values)
    };
    let (min_nodes, max_nodes) = acc.numa_nodes_needed(group);
    for k in min_nodes..=max_nodes {
        let mut best_balance = f64::MAX;
        let mut best_remainder: Option<GoSlice> = None;
        let mut best_combo: Option<GoSlice> = None;
        iterate_combinations(&numas, k, &mut |combo_slice| {
            if best_balance == 0.0 {
                return true;
            }
            let combo = combo_slice.to_vec();
            let in_combo: usize = combo.iter().map(|&n| count_of(n)).sum();
            if in_combo < count {
                return false;
            }
            let groups: usize = combo.iter().map(|&n| count_of(n) / group).sum();
            if groups * group < count {
                return false;
            }
            let distribution = (count / combo.len() / group) * group;
            if combo.iter().any(|&n| count_of(n) < distribution) {
                return false;
            }
            // Free CPUs per node after the even share.
            let mut after = free_count;
            for &n in &combo {
                if let Some(v) = after.get_mut(n) {
                    *v -= distribution;
                }
            }
            let remainder = count - distribution * combo.len();
            let remainder_nodes: Vec<usize> = combo
                .iter()
                .copied()
                .filter(|&n| after.get(n).copied().unwrap_or(0) >= group)
                .collect();
            let mut best_local = f64::MAX;
            let mut best_local_remainder: Option<GoSlice> = None;
            if remainder == 0 {
                best_local = balance_of(&after);
            }
            let mut size = remainder_nodes.len();
            while remainder > 0 && size >= 1 {
                iterate_combinations(&remainder_nodes, size, &mut |subset_slice| {
                    let subset = subset_slice.to_vec();
                    let mut left = remainder;
                    let mut after = after;
                    let room: usize = subset
                        .iter()
                        .map(|&n| after.get(n).copied().unwrap_or(0))
                        .sum();
                    if room < left {
                        return false;
                    }
                    while left > 0 {
                        let before = left;
                        for &n in &subset {
                            if left == 0 {
                                break;
                            }
                            let Some(v) = after.get_mut(n) else { continue };
                            if *v < group {
                                continue;
                            }
                            *v -= group;
                            left -= group;
                        }
                        // Upstream loops for ever here; skip the subset instead.
                        if left == before {
                            return false;
                        }
                    }
                    let balance = balance_of(&after);
                    if balance < best_local {
                        best_local = balance;
                        best_local_remainder = Some(subset_slice.clone());
                    }
                    false
                });
                size -= 1;
            }
            if best_local < best_balance {
                best_balance = best_local;
                best_remainder = best_local_remainder;
                best_combo = Some(combo_slice.clone());
            }
            false
        });
        let Some(best_combo) = best_combo else {
            continue;
        };
        let best_combo = best_combo.to_vec();
        let best_remainder = best_remainder.map(|s| s.to_vec()).unwrap_or_default();
        let distribution = (count / best_combo.len() / group) * group;
        for &n in &best_combo {
            let in_node = numa_cpus
                .get(&n)
                .map_or_else(CpuBits::new, |c| c.intersection(&acc.free));
            // Upstream ignores a failure here and takes nothing.
            let cpus =
                take_packed(topo, &in_node, distribution, strategy, false).unwrap_or_default();
            acc.take(&cpus);
        }
        let mut remainder = count - distribution * best_combo.len();
        while remainder > 0 {
            let before = remainder;
            for &n in &best_remainder {
                if remainder == 0 {
                    break;
                }
                if free_in(&acc, n) < group {
                    continue;
                }
                let in_node = numa_cpus
                    .get(&n)
                    .map_or_else(CpuBits::new, |c| c.intersection(&acc.free));
                let cpus = take_packed(topo, &in_node, group, strategy, false).unwrap_or_default();
                acc.take(&cpus);
                remainder -= group;
            }
            // Upstream would spin for ever; report the shortfall instead.
            if remainder == before {
                break;
            }
        }
        if acc.needed != 0 {
            return Err(TakeError::Accounting(acc.needed.unsigned_abs()));
        }
        return Ok(acc.result);
    }
    take_packed(topo, available, count, strategy, false)
}

/// CPUs of `available` that sit in cores whose every thread is in `available`.
pub fn cpus_in_free_cores(topo: &CpuTopology, available: &CpuBits) -> usize {
    topo.cores()
        .values()
        .filter(|c| c.is_subset_of(available))
        .map(CpuBits::len)
        .sum()
}
