//! How many devices of a class a node offers and how many of them are in use: the figures
//! NodeResourcesFit scores a DRA-backed extended resource with
//! (`pkg/scheduler/framework/plugins/noderesources/resource_allocation.go` →
//! `calculateDRAResourceTotals`; spec workloads.md W117). devicelet's scheduler also scores the
//! devices of claims with them (device bin-packing).

use k8s_openapi::api::core::v1::Node;

use super::data::Result;
use super::state::Allocator;

/// A class's devices as one node sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassTotals {
    /// Devices visible from the node that match every selector of the class.
    pub capacity: u64,
    /// Of those, the ones with an allocation (exclusive, a share, or consumed capacity).
    pub allocated: u64,
}

impl Allocator<'_> {
    /// The devices of class `class` visible from `node` (node-local slices, `allNodes`, node
    /// selectors, per-device selection) and how many of them are in use. An unknown class, or
    /// a selector that fails on a device, counts nothing for that device.
    pub fn class_totals(&self, node: &Node, class: &str) -> Result<ClassTotals> {
        let mut totals = ClassTotals::default();
        let Some(c) = self.snap.classes.get(class) else {
            return Ok(totals);
        };
        let exprs: Vec<_> = c
            .spec
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref())
            .map(|cel| self.snap.expr(&cel.expression))
            .collect();
        let pools = self.gather_pools(node)?;
        for pool in pools.iter() {
            for &si in &pool.device_slices {
                let slice = &self.snap.slices[si as usize];
                for dev in &slice.devices {
                    if slice.per_device == Some(true) && !dev.node.matches(node).unwrap_or(false) {
                        continue;
                    }
                    let matches = exprs
                        .iter()
                        .all(|e| matches!(e.eval(dev.instance, slice.driver, dev.raw), Ok(true)));
                    if matches {
                        totals.capacity += 1;
                        if self.allocated.any.contains(dev.gid) {
                            totals.allocated += 1;
                        }
                    }
                }
            }
        }
        Ok(totals)
    }
}
