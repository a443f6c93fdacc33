//! The device set of one resource, rebuilt from each `ListAndWatch` snapshot
//! (`genericDeviceUpdateCallback` in `dm/manager.go`).
//!
//! Every message is a full snapshot, not a delta. Defined behaviour for odd input:
//! * duplicate IDs: the later entry wins (as upstream's `allDevices`), but the ID is counted
//!   once. Upstream bug: an ID sent twice with different health lands in both the healthy and
//!   the unhealthy set and is counted twice in capacity; we keep one entry per ID.
//! * empty IDs: dropped (no container could ever be given such a device).
//! * an empty list: allowed; the resource stays registered with capacity 0.
//!
//! Applying a snapshot is O(n) in the number of devices: one pass builds the new list and its
//! ID index, one pass compares against the previous index.

use std::collections::HashMap;

use crate::types::{Device, Health};

/// Counts describing one applied `ListAndWatch` snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateSummary {
    /// Entries in the message.
    pub received: usize,
    /// Distinct devices kept.
    pub devices: usize,
    /// Entries dropped because their ID appeared earlier in the same message.
    pub duplicate_ids: usize,
    /// Entries dropped because their ID was empty.
    pub empty_ids: usize,
    /// Healthy devices after the update.
    pub healthy: usize,
    /// Devices that are new or whose health changed compared to the previous snapshot.
    pub changed: usize,
}

/// The current devices of one resource, in the order the plugin first listed them.
#[derive(Debug, Clone, Default)]
pub struct ResourceDevices {
    devices: Vec<Device>,
    index: HashMap<String, usize>,
    healthy: usize,
    /// Every device before this position is allocated or unhealthy, so the search for the first
    /// free devices starts here instead of at 0 (keeps a pick O(devices picked) as the node
    /// fills up). A new snapshot starts again at 0; freeing a device lowers it.
    free_hint: usize,
}

impl ResourceDevices {
    /// Builds the device set from a snapshot, applying the duplicate / empty-ID rules.
    pub fn from_snapshot(incoming: Vec<Device>) -> (Self, UpdateSummary) {
        let mut summary = UpdateSummary {
            received: incoming.len(),
            ..UpdateSummary::default()
        };
        let mut devices: Vec<Device> = Vec::with_capacity(incoming.len());
        let mut index: HashMap<String, usize> = HashMap::with_capacity(incoming.len());
        for device in incoming {
            if device.id.is_empty() {
                summary.empty_ids += 1;
                continue;
            }
            match index.get(&device.id) {
                Some(&pos) => {
                    summary.duplicate_ids += 1;
                    if let Some(slot) = devices.get_mut(pos) {
                        *slot = device;
                    }
                }
                None => {
                    index.insert(device.id.clone(), devices.len());
                    devices.push(device);
                }
            }
        }
        let healthy = devices
            .iter()
            .filter(|d| d.health == Health::Healthy)
            .count();
        summary.devices = devices.len();
        summary.healthy = healthy;
        summary.changed = devices.len();
        (
            ResourceDevices {
                devices,
                index,
                healthy,
                free_hint: 0,
            },
            summary,
        )
    }

    /// Number of devices that are new in `self` or whose health differs from `previous`.
    pub fn count_changes_from(&self, previous: &ResourceDevices) -> usize {
        self.devices
            .iter()
            .filter(|d| previous.get(&d.id).is_none_or(|old| old.health != d.health))
            .count()
    }

    /// All devices, in plugin order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Looks a device up by ID.
    pub fn get(&self, id: &str) -> Option<&Device> {
        self.index.get(id).and_then(|&pos| self.devices.get(pos))
    }

    /// Where the search for free devices may start (see the field's comment).
    pub fn free_hint(&self) -> usize {
        self.free_hint.min(self.devices.len())
    }

    /// Records that every device before `position` is allocated or unhealthy.
    pub fn set_free_hint(&mut self, position: usize) {
        self.free_hint = position;
    }

    /// Device `id` became free: the search must look at it again.
    pub fn device_freed(&mut self, id: &str) {
        if let Some(&pos) = self.index.get(id) {
            self.free_hint = self.free_hint.min(pos);
        }
    }

    /// Number of devices (the resource's capacity).
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// True when the plugin advertises no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Number of healthy devices (the resource's allocatable).
    pub fn healthy_count(&self) -> usize {
        self.healthy
    }

    /// Marks every device unhealthy (`markResourceUnhealthy`, used when the plugin disconnects).
    pub fn mark_all_unhealthy(&mut self) {
        for device in &mut self.devices {
            device.health = Health::Unhealthy;
        }
        self.healthy = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a2_only_exact_healthy_string_is_healthy() {
        assert_eq!(Health::from_plugin_str("Healthy"), Health::Healthy);
        for other in ["", "healthy", "HEALTHY", "Unhealthy", "Unknown"] {
            assert_eq!(Health::from_plugin_str(other), Health::Unhealthy);
        }
    }

    #[test]
    fn duplicate_ids_keep_last_entry_and_count_once() {
        let (set, summary) = ResourceDevices::from_snapshot(vec![
            Device::healthy("a"),
            Device::healthy("b"),
            Device::healthy("a").with_health(Health::Unhealthy),
        ]);
        assert_eq!(summary.duplicate_ids, 1);
        assert_eq!(set.len(), 2);
        assert_eq!(set.healthy_count(), 1);
        assert_eq!(set.get("a").map(|d| d.health), Some(Health::Unhealthy));
        let ids: Vec<&str> = set.devices().iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
    }

    #[test]
    fn empty_ids_are_dropped_and_empty_list_is_allowed() {
        let (set, summary) =
            ResourceDevices::from_snapshot(vec![Device::healthy(""), Device::healthy("x")]);
        assert_eq!(summary.empty_ids, 1);
        assert_eq!(set.len(), 1);
        let (empty, summary) = ResourceDevices::from_snapshot(vec![]);
        assert!(empty.is_empty());
        assert_eq!(summary, UpdateSummary::default());
    }

    #[test]
    fn changes_count_new_and_health_flipped_devices() {
        let (old, _) =
            ResourceDevices::from_snapshot(vec![Device::healthy("a"), Device::healthy("b")]);
        let (new, _) = ResourceDevices::from_snapshot(vec![
            Device::healthy("a"),
            Device::healthy("b").with_health(Health::Unhealthy),
            Device::healthy("c"),
        ]);
        assert_eq!(new.count_changes_from(&old), 2);
    }

    #[test]
    fn a3_mark_all_unhealthy_zeroes_allocatable_keeps_capacity() {
        let (mut set, _) =
            ResourceDevices::from_snapshot(vec![Device::healthy("a"), Device::healthy("b")]);
        set.mark_all_unhealthy();
        assert_eq!(set.len(), 2);
        assert_eq!(set.healthy_count(), 0);
        assert!(set.devices().iter().all(|d| d.health == Health::Unhealthy));
    }
}
