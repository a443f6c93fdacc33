//! The allocated state of the other claims, indexed against a snapshot (Go: the
//! `allocatedState` passed to `NewAllocator` in
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`;
//! built like the scheduler's `dynamicresources/allocateddevices.go`).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;

use super::snapshot::ClusterSnapshot;
use crate::fasthash::FastMap;
use crate::quantity::Quantity;
use crate::types::AllocatedState;

/// The allocated state of the other claims, with device IDs interned against one
/// [`ClusterSnapshot`] (devices the snapshot does not know cannot be candidates and are
/// dropped). Build it once with [`AllocatedIndex::new`] and keep it current with
/// [`AllocatedIndex::add_result`], so that a new allocator per pod costs O(1) instead of
/// re-hashing every allocated device ID.
#[derive(Clone, Debug, Default)]
pub struct AllocatedIndex {
    /// Exclusively allocated devices.
    pub(super) exclusive: GidSet,
    /// Devices with any allocation (exclusive, share or consumed capacity).
    pub(super) any: GidSet,
    /// Summed consumed capacity of the shares of each device, in nano-units.
    pub(super) capacity: FastMap<u32, BTreeMap<String, i128>>,
}

/// A set of interned device IDs as a bitset (IDs are dense; the in-use test runs for every
/// candidate device).
#[derive(Clone, Debug, Default)]
pub(super) struct GidSet {
    pub(super) words: Vec<u64>,
}

impl GidSet {
    fn remove(&mut self, gid: u32) {
        if let Some(w) = self.words.get_mut((gid / 64) as usize) {
            *w &= !(1 << (gid % 64));
        }
    }

    fn insert(&mut self, gid: u32) {
        let w = (gid / 64) as usize;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (gid % 64);
    }

    #[inline]
    pub(super) fn contains(&self, gid: u32) -> bool {
        self.words
            .get((gid / 64) as usize)
            .is_some_and(|w| w & (1 << (gid % 64)) != 0)
    }
}

impl AllocatedIndex {
    /// Indexes `state` against `snap` (O(allocated devices)).
    pub fn new(snap: &ClusterSnapshot<'_>, state: &AllocatedState) -> Self {
        let mut index = AllocatedIndex::default();
        for id in &state.devices {
            if let Some(g) = snap.gid(&id.driver, &id.pool, &id.device) {
                index.exclusive.insert(g);
                index.any.insert(g);
            }
        }
        for (id, _) in &state.shared_devices {
            if let Some(g) = snap.gid(&id.driver, &id.pool, &id.device) {
                index.any.insert(g);
            }
        }
        for (id, caps) in &state.consumed_capacity {
            if let Some(g) = snap.gid(&id.driver, &id.pool, &id.device) {
                index.any.insert(g);
                let m: BTreeMap<String, i128> =
                    caps.iter().map(|(k, v)| (k.clone(), v.nanos())).collect();
                index.capacity.insert(g, m);
            }
        }
        index
    }

    /// Takes back one exclusive allocation result (a preemption victim's claim): the device is
    /// free again. `false`, and nothing changed, for a result this cannot take back exactly (a
    /// share of a device: other shares may remain); the caller then rebuilds the index from a
    /// state without it. Admin-access results and unknown devices count nothing, so there is
    /// nothing to take back.
    pub fn remove_exclusive(
        &mut self,
        snap: &ClusterSnapshot<'_>,
        result: &DeviceRequestAllocationResult,
        consumable_capacity: bool,
    ) -> bool {
        if result.admin_access == Some(true) {
            return true;
        }
        if result.share_id.is_some() && consumable_capacity {
            return false;
        }
        if let Some(g) = snap.gid(&result.driver, &result.pool, &result.device) {
            self.exclusive.remove(g);
            if !self.capacity.contains_key(&g) {
                self.any.remove(g);
            }
        }
        true
    }

    /// Adds one allocation result exactly like [`AllocatedState::add_result`] does.
    pub fn add_result(
        &mut self,
        snap: &ClusterSnapshot<'_>,
        result: &DeviceRequestAllocationResult,
        consumable_capacity: bool,
    ) -> std::result::Result<(), crate::quantity::QuantityError> {
        if result.admin_access == Some(true) {
            return Ok(());
        }
        let Some(g) = snap.gid(&result.driver, &result.pool, &result.device) else {
            return Ok(());
        };
        match (&result.share_id, consumable_capacity) {
            (Some(_), true) => {
                if let Some(cc) = &result.consumed_capacity {
                    let mut parsed = Vec::with_capacity(cc.len());
                    for (name, q) in cc {
                        parsed.push((name, Quantity::parse(&q.0)?.nanos()));
                    }
                    let entry = self.capacity.entry(g).or_default();
                    for (name, v) in parsed {
                        *entry.entry(name.clone()).or_insert(0) += v;
                    }
                }
                self.any.insert(g);
            }
            _ => {
                self.exclusive.insert(g);
                self.any.insert(g);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::selector::{CelFeatures, SelectorCache};
    use crate::workloads::Workload;

    fn result(device: &str, share: Option<&str>) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            request: "req-0".into(),
            driver: "test-driver.cdi.k8s.io".into(),
            pool: "node-0".into(),
            device: device.into(),
            share_id: share.map(str::to_owned),
            ..DeviceRequestAllocationResult::default()
        }
    }

    #[test]
    fn an_exclusive_result_is_taken_back_and_a_share_is_refused() {
        let w = Workload::steady_state(1, 2, 0);
        let snap = ClusterSnapshot::new(
            &w.classes,
            &w.slices,
            Arc::new(SelectorCache::new(CelFeatures {
                enable_consumable_capacity: true,
                enable_list_type_attributes: false,
            })),
        );
        let mut index = AllocatedIndex::default();
        for d in ["instance-0", "instance-1"] {
            index.add_result(&snap, &result(d, None), true).unwrap();
        }
        let g0 = snap
            .gid("test-driver.cdi.k8s.io", "node-0", "instance-0")
            .unwrap();
        let g1 = snap
            .gid("test-driver.cdi.k8s.io", "node-0", "instance-1")
            .unwrap();
        assert!(index.remove_exclusive(&snap, &result("instance-0", None), true));
        assert!(!index.any.contains(g0) && !index.exclusive.contains(g0));
        assert!(index.any.contains(g1) && index.exclusive.contains(g1));
        // A share: other shares may remain, so the caller rebuilds instead.
        assert!(!index.remove_exclusive(&snap, &result("instance-1", Some("s")), true));
        assert!(index.any.contains(g1));
    }
}
