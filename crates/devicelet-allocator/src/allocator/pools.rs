//! Pool gathering for one node (spec `structured-allocator.md` §2.2), following
//! `structured/internal/incubating/pools_incubating.go` (`GatherPools`) as called from
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::data::{GatherKey, Pool, Result};
use super::state::Allocator;
use crate::fasthash::FastMap;
use crate::types::{AllocError, ErrorClass};

impl<'a> Allocator<'a> {
    pub(crate) fn gather_pools(&self, node: &Node) -> Result<Arc<Vec<Pool<'a>>>> {
        let node_name = node.metadata.name.as_deref().unwrap_or("");
        let pd = self.features.partitionable_devices;
        let pdi = usize::from(pd);
        let on_node = self
            .snap
            .on_node
            .get(node_name)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // Only the relevance of node-local slices and of shared slices with a node selector or
        // per-device selection depends on the node; the other shared slices are relevant on
        // every node or on none (`ClusterSnapshot::shared_static`). These are evaluated in Go's
        // candidate order, so the first node-selector parse error is Go's.
        let mut first: Option<u32> = None;
        let mut more: Vec<u32> = Vec::new();
        let mut local = 0;
        for (i, &si) in on_node
            .iter()
            .chain(self.snap.shared_dynamic[pdi].iter())
            .enumerate()
        {
            if self.slice_relevant(si, node, pd)? {
                if first.is_none() {
                    first = Some(si);
                } else {
                    more.push(si);
                }
                if i < on_node.len() {
                    local += 1;
                }
            }
        }
        // The result depends only on the relevant slices; the static ones are fixed per gate,
        // so the node-dependent ones are the cache key.
        let Some(first) = first else {
            let cell = &self.snap.gathered_static[pdi];
            if let Some(p) = cell.get() {
                return Ok(Arc::clone(p));
            }
            let pools = self.build_gathered(&[], 0);
            return Ok(Arc::clone(cell.get_or_init(|| pools)));
        };
        if more.is_empty() {
            let cell = &self.snap.gathered_single[first as usize][pdi];
            if let Some(p) = cell.get() {
                return Ok(Arc::clone(p));
            }
            let pools = self.build_gathered(&[first], local);
            return Ok(Arc::clone(cell.get_or_init(|| pools)));
        }
        more.insert(0, first);
        let key: GatherKey = (pd, more);
        if let Some(p) = self
            .snap
            .gathered
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(p);
        }
        let pools = self.build_gathered(&key.1, local);
        if let Ok(mut m) = self.snap.gathered.lock() {
            m.insert(key, Arc::clone(&pools));
        }
        Ok(pools)
    }

    /// Whether slice `si` is relevant for `node` (`pools_incubating.go:63-101`).
    fn slice_relevant(&self, si: u32, node: &Node, pd: bool) -> Result<bool> {
        let s = &self.snap.slices[si as usize];
        if !pd && (s.per_device.is_some() || s.has_shared_counters) {
            return Ok(false);
        }
        if s.has_shared_counters {
            return Ok(true);
        }
        if s.node.is_set() {
            return s.node.matches(node).map_err(|e| {
                AllocError::new(
                    ErrorClass::NodeSelectorParse,
                    format!(
                        "gather pool information: failed to perform node selection for slice {}: failed to parse node selector {e}",
                        s.name
                    ),
                )
            });
        }
        if s.per_device == Some(true) {
            for d in &s.devices {
                let m = d.node.matches(node).map_err(|e| {
                    AllocError::new(
                        ErrorClass::NodeSelectorParse,
                        format!(
                            "gather pool information: failed to perform node selection for device {} in slice {}: failed to parse node selector {e}",
                            d.raw.name, s.name
                        ),
                    )
                })?;
                if m {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Builds the pools of one node view (§2.2) from its node-dependent relevant slices
    /// (`dynamic`, in candidate order, the first `local` of them node-local) and the static
    /// relevant shared slices.
    fn build_gathered(&self, dynamic: &[u32], local: usize) -> Arc<Vec<Pool<'a>>> {
        let pd = self.features.partitionable_devices;
        let (on_node, dyn_shared) = dynamic.split_at(local.min(dynamic.len()));
        // Candidate order: node-local slices, then shared slices in input order (both lists of
        // shared slices are ascending subsequences of `shared`).
        let stat = &self.snap.shared_static[usize::from(pd)];
        let mut relevant = Vec::with_capacity(dynamic.len() + stat.len());
        relevant.extend_from_slice(on_node);
        let (mut a, mut b) = (0, 0);
        while a < stat.len() || b < dyn_shared.len() {
            if b >= dyn_shared.len() || (a < stat.len() && stat[a] < dyn_shared[b]) {
                relevant.push(stat[a]);
                a += 1;
            } else {
                relevant.push(dyn_shared[b]);
                b += 1;
            }
        }
        // Per pool, the slices of the highest generation seen, in candidate order (`addSlice`).
        let mut index: FastMap<u32, usize> = FastMap::default();
        let mut collected: Vec<(u32, Vec<u32>)> = Vec::new();
        for si in relevant {
            let key = self.snap.pool_rank[si as usize];
            let generation = self.snap.slices[si as usize].generation;
            match index.get(&key) {
                None => {
                    index.insert(key, collected.len());
                    collected.push((key, vec![si]));
                }
                Some(&pi) => {
                    let list = &mut collected[pi].1;
                    let current = self.snap.slices[list[0] as usize].generation;
                    if generation < current {
                        continue;
                    }
                    if generation > current {
                        list.clear();
                    }
                    list.push(si);
                }
            }
        }
        let mut pools = Vec::with_capacity(collected.len());
        for (_, visible) in &collected {
            let visible = visible.clone();
            let first = &self.snap.slices[visible[0] as usize];
            let (driver, pool_name) = (first.driver, first.pool);
            let generation = first.generation;
            let count = first.slice_count;
            let mut extra = Vec::new();
            if visible.len() as i64 != count {
                let all = self
                    .snap
                    .by_pool
                    .get(&(driver, pool_name))
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                if all
                    .iter()
                    .any(|&i| self.snap.slices[i as usize].generation > generation)
                {
                    // Obsolete: a newer generation exists elsewhere. Dropped silently.
                    continue;
                }
                let same: Vec<u32> = all
                    .iter()
                    .copied()
                    .filter(|&i| self.snap.slices[i as usize].generation == generation)
                    .collect();
                if same.len() as i64 != count {
                    pools.push(Pool {
                        driver,
                        name: pool_name,
                        key_fixed: self.snap.pool_rank[visible[0] as usize],
                        key_compat: self.snap.pool_name_rank[visible[0] as usize],
                        incomplete: true,
                        invalid: false,
                        invalid_reason: String::new(),
                        device_slices: Vec::new(),
                        not_visible: Vec::new(),
                        counter_sets: Vec::new(),
                        binding_last: false,
                    });
                    continue;
                }
                let seen: HashSet<&str> = visible
                    .iter()
                    .map(|&i| self.snap.slices[i as usize].name)
                    .collect();
                extra = same
                    .into_iter()
                    .filter(|&i| !seen.contains(self.snap.slices[i as usize].name))
                    .collect();
            }
            pools.push(self.build_pool(driver, pool_name, visible, extra));
        }
        pools.sort_by(|a, b| {
            (a.binding_last, a.driver, a.name).cmp(&(b.binding_last, b.driver, b.name))
        });
        Arc::new(pools)
    }

    fn build_pool(
        &self,
        driver: &'a str,
        name: &'a str,
        mut visible: Vec<u32>,
        extra: Vec<u32>,
    ) -> Pool<'a> {
        let pd = self.features.partitionable_devices;
        let first = visible[0];
        visible.sort_by(|&a, &b| {
            self.snap.slices[a as usize]
                .name
                .cmp(self.snap.slices[b as usize].name)
        });
        let mut device_slices = Vec::new();
        let mut counter_slices = Vec::new();
        for &si in &visible {
            if pd && self.snap.slices[si as usize].has_shared_counters {
                counter_slices.push(si);
            } else {
                device_slices.push(si);
            }
        }
        let mut invalid_reason = String::new();
        if device_slices.len() == 1 {
            // Duplicates inside one slice are known from the snapshot.
            if let Some(dup) = &self.snap.slices[device_slices[0] as usize].duplicate_device {
                invalid_reason = format!("duplicate device name {dup}");
            }
        } else {
            let mut names = HashSet::new();
            'dup: for &si in &device_slices {
                for d in &self.snap.slices[si as usize].devices {
                    if !names.insert(d.raw.name.as_str()) {
                        invalid_reason = format!("duplicate device name {}", d.raw.name);
                        break 'dup;
                    }
                }
            }
        }
        let mut counter_sets: Vec<(u32, u32)> = Vec::new();
        if pd {
            for &si in &counter_slices {
                for (k, (set, _)) in self.snap.slices[si as usize]
                    .shared_counters
                    .iter()
                    .enumerate()
                {
                    if counter_sets.iter().any(|&(s2, k2)| {
                        self.snap.slices[s2 as usize].shared_counters[k2 as usize].0 == *set
                    }) && invalid_reason.is_empty()
                    {
                        invalid_reason = format!("duplicate counter set name {set}");
                    }
                    counter_sets.push((si, k as u32));
                }
            }
        }
        let mut not_visible = Vec::new();
        for &si in &extra {
            if pd && self.snap.slices[si as usize].has_shared_counters {
                continue;
            }
            not_visible.push(si);
        }
        if pd && invalid_reason.is_empty() {
            'refs: for &si in device_slices.iter().chain(not_visible.iter()) {
                for d in &self.snap.slices[si as usize].devices {
                    for (set, counters) in &d.consumes {
                        let known = counter_sets
                            .iter()
                            .map(|&(s2, k2)| {
                                &self.snap.slices[s2 as usize].shared_counters[k2 as usize]
                            })
                            .find(|(n, _)| n == set)
                            .map(|(_, c)| c);
                        let Some(known) = known else {
                            invalid_reason = format!(
                                "device {} references unknown counter set {set}",
                                d.raw.name
                            );
                            break 'refs;
                        };
                        for (c, _) in counters {
                            if !known.iter().any(|(k, _)| k == c) {
                                invalid_reason = format!(
                                    "device {} references unknown counter {c} in counter set {set}",
                                    d.raw.name
                                );
                                break 'refs;
                            }
                        }
                    }
                }
            }
        }
        // An invalid pool is a placeholder without devices in Go, so binding conditions of its
        // devices cannot move it to the end: it keeps its (driver, pool) place, which decides
        // which pool an All-mode request reports first.
        let binding_last = invalid_reason.is_empty()
            && device_slices
                .iter()
                .any(|&si| self.snap.slices[si as usize].has_binding_conditions);
        Pool {
            driver,
            name,
            key_fixed: self.snap.pool_rank[first as usize],
            key_compat: self.snap.pool_name_rank[first as usize],
            incomplete: false,
            invalid: !invalid_reason.is_empty(),
            invalid_reason,
            device_slices,
            not_visible,
            counter_sets,
            binding_last,
        }
    }
}
