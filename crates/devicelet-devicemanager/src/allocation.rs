//! Pure device picking for one (container, resource), following `devicesToAllocate` and
//! `filterByAffinity` in `pkg/kubelet/cm/devicemanager/manager.go` (spec devicemanager.md §2
//! C3-C6). No IO: the optional `GetPreferredAllocation` RPC sits between
//! [`DevicePicker::preferred_request`] and [`DevicePicker::finish`], so the caller can make it
//! without holding any lock (as the kubelet releases its lock for that RPC).
//!
//! Upstream picks among equal devices in random set order; we pick in plugin order (the order
//! of the last `ListAndWatch` snapshot), a valid and reproducible instance of that behaviour.

use std::collections::HashSet;

use devicelet_topology::NumaMask;

use crate::types::{Device, PreferredAllocationRequest};

/// Why devices could not be picked. Messages are the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// C3 step 1: the container already holds a different number of devices.
    #[error(
        "pod \"{pod_uid}\" container \"{container}\" changed request for resource \"{resource}\" from {had} to {required}"
    )]
    ChangedRequest {
        /// Pod UID.
        pod_uid: String,
        /// Container name.
        container: String,
        /// Resource.
        resource: String,
        /// Devices held.
        had: usize,
        /// Devices requested now.
        required: usize,
    },
    /// C3 step 3: no plugin ever sent devices for the resource.
    #[error("cannot allocate unregistered device {resource}")]
    Unregistered {
        /// Resource.
        resource: String,
    },
    /// C3 step 4: the resource has no healthy device (checked even for a zero request).
    #[error("no healthy devices present; cannot allocate unhealthy devices {resource}")]
    NoHealthyDevices {
        /// Resource.
        resource: String,
    },
    /// C3 step 5: devices held by the container turned unhealthy.
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
    )]
    PreviouslyAllocatedUnhealthy {
        /// Resource.
        resource: String,
    },
    /// C4 step 2: not enough free healthy devices; `requested` is what is still needed after reuse.
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        /// Resource.
        resource: String,
        /// Devices still needed.
        requested: usize,
        /// Free healthy devices.
        available: usize,
    },
    /// C4 steps 4-5: could not fill the request (full request and what was got).
    #[error(
        "unexpectedly allocated less resources than required. Requested: {requested}, Got: {got}"
    )]
    AllocatedLess {
        /// The container's full request.
        requested: usize,
        /// Devices picked.
        got: usize,
    },
}

/// `filterByAffinity` result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AffinitySplit {
    /// Devices with at least one NUMA node in the mask.
    pub aligned: Vec<String>,
    /// Devices with NUMA nodes, none in the mask.
    pub unaligned: Vec<String>,
    /// Devices without topology (nil or empty).
    pub no_affinity: Vec<String>,
}

/// Classifies `available` devices against `affinity` (spec C6). With no mask, or when no
/// device of the resource has a non-empty topology, everything is `no_affinity`.
pub fn filter_by_affinity(
    available: &[&Device],
    affinity: Option<NumaMask>,
    resource_has_topology: bool,
) -> AffinitySplit {
    let mut split = AffinitySplit::default();
    let Some(mask) = affinity.filter(|_| resource_has_topology) else {
        split.no_affinity = available.iter().map(|d| d.id.clone()).collect();
        return split;
    };
    for device in available {
        match device.numa_nodes.as_deref() {
            None | Some([]) => split.no_affinity.push(device.id.clone()),
            // Negative ids (and ids of 64 and above, see `NumaMask::is_set`) are never in the mask.
            Some(nodes)
                if nodes
                    .iter()
                    .any(|&n| usize::try_from(n).is_ok_and(|n| mask.is_set(n))) =>
            {
                split.aligned.push(device.id.clone())
            }
            Some(_) => split.unaligned.push(device.id.clone()),
        }
    }
    split
}

/// True when at least one device has a non-empty topology (`deviceHasTopologyAlignment`).
pub fn has_topology(devices: &[Device]) -> bool {
    devices
        .iter()
        .any(|d| d.numa_nodes.as_ref().is_some_and(|n| !n.is_empty()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Branch {
    /// Enough devices already (from reuse, or all aligned were exactly enough).
    Done,
    /// `needed < |aligned|`: choose among aligned devices.
    AmongAligned,
    /// All aligned taken; fill from the rest.
    BeyondAligned,
}

/// Picks devices for one (container, resource) in the kubelet's order (spec C4).
#[derive(Debug, Clone)]
pub struct DevicePicker {
    required: usize,
    needed: usize,
    chosen: Vec<String>,
    chosen_set: HashSet<String>,
    split: AffinitySplit,
    /// All free healthy devices (for the preferred request in the "beyond aligned" branch).
    available: Vec<String>,
    branch: Branch,
}

impl DevicePicker {
    /// Starts picking `required` devices of `resource` (`required` already reduced by nothing:
    /// the container holds no devices of it yet). `reusable` are devices of earlier init
    /// containers of the same pod; `free` are healthy devices not allocated to anyone, in
    /// plugin order; `affinity` is the topology hint's mask.
    pub fn new(
        resource: &str,
        required: usize,
        reusable: &[String],
        free: &[&Device],
        affinity: Option<NumaMask>,
        resource_has_topology: bool,
    ) -> Result<Self, AllocationError> {
        let mut picker = DevicePicker {
            required,
            needed: required,
            chosen: Vec::new(),
            chosen_set: HashSet::new(),
            split: AffinitySplit::default(),
            available: Vec::new(),
            branch: Branch::Done,
        };
        // Step 1: reuse devices of init containers first.
        for id in reusable {
            if picker.needed == 0 {
                break;
            }
            picker.take(id);
        }
        if picker.needed == 0 {
            return Ok(picker);
        }
        // Step 2: free devices, minus those just reused.
        let free: Vec<&Device> = free
            .iter()
            .copied()
            .filter(|d| !picker.chosen_set.contains(&d.id))
            .collect();
        if free.len() < picker.needed {
            return Err(AllocationError::Unavailable {
                resource: resource.to_owned(),
                requested: picker.needed,
                available: free.len(),
            });
        }
        picker.available = free.iter().map(|d| d.id.clone()).collect();
        // Step 3.
        picker.split = filter_by_affinity(&free, affinity, resource_has_topology);
        // Steps 4-5.
        if picker.needed < picker.split.aligned.len() {
            picker.branch = Branch::AmongAligned;
        } else {
            let aligned = std::mem::take(&mut picker.split.aligned);
            for id in &aligned {
                picker.take(id);
            }
            picker.branch = if picker.needed == 0 {
                Branch::Done
            } else {
                Branch::BeyondAligned
            };
        }
        Ok(picker)
    }

    fn take(&mut self, id: &str) {
        if self.needed > 0 && self.chosen_set.insert(id.to_owned()) {
            self.chosen.push(id.to_owned());
            self.needed -= 1;
        }
    }

    /// The `GetPreferredAllocation` arguments to send, if the plugin offers it and a choice is
    /// left (spec C4 steps 4-5, §7 item 9): `size` is the full request, `mustInclude` what is
    /// already chosen, `available` includes `mustInclude`.
    pub fn preferred_request(&self) -> Option<PreferredAllocationRequest> {
        let candidates: &[String] = match self.branch {
            Branch::Done => return None,
            Branch::AmongAligned => &self.split.aligned,
            Branch::BeyondAligned => &self.available,
        };
        let mut available: Vec<String> = candidates.to_vec();
        for id in &self.chosen {
            if !candidates.contains(id) {
                available.push(id.clone());
            }
        }
        Some(PreferredAllocationRequest {
            available_device_ids: available,
            must_include_device_ids: self.chosen.clone(),
            allocation_size: i32::try_from(self.required).unwrap_or(i32::MAX),
        })
    }

    /// Completes the pick with the plugin's preferred IDs (`None`: no preference or not
    /// asked). Preferred IDs outside the candidates are ignored, as are extras.
    pub fn finish(mut self, preferred: Option<&[String]>) -> Result<Vec<String>, AllocationError> {
        match self.branch {
            Branch::Done => {}
            Branch::AmongAligned => {
                let aligned = std::mem::take(&mut self.split.aligned);
                let aligned_set: HashSet<&String> = aligned.iter().collect();
                for id in preferred.unwrap_or_default() {
                    if aligned_set.contains(id) {
                        self.take(id);
                    }
                }
                for id in &aligned {
                    self.take(id);
                }
            }
            Branch::BeyondAligned => {
                let available = std::mem::take(&mut self.available);
                let available_set: HashSet<&String> = available.iter().collect();
                for id in preferred.unwrap_or_default() {
                    if available_set.contains(id) {
                        self.take(id);
                    }
                }
                let unaligned = std::mem::take(&mut self.split.unaligned);
                let no_affinity = std::mem::take(&mut self.split.no_affinity);
                for id in unaligned.iter().chain(&no_affinity) {
                    self.take(id);
                }
            }
        }
        if self.needed > 0 {
            return Err(AllocationError::AllocatedLess {
                requested: self.required,
                got: self.required - self.needed,
            });
        }
        Ok(self.chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, numa: &[i64]) -> Device {
        Device::healthy(id).on_numa(numa.iter().copied())
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn c6_filter_by_affinity_splits_aligned_unaligned_and_no_affinity() {
        let devices = [
            dev("a", &[0]),
            dev("b", &[1]),
            dev("c", &[0, 1]),
            Device::healthy("d"),
            dev("e", &[]),
            dev("f", &[64]),
            dev("g", &[-1]),
        ];
        let refs: Vec<&Device> = devices.iter().collect();
        let split = filter_by_affinity(&refs, Some(NumaMask::from_bits(0b1)), true);
        assert_eq!(split.aligned, ids(&["a", "c"]));
        assert_eq!(split.unaligned, ids(&["b", "f", "g"]));
        assert_eq!(split.no_affinity, ids(&["d", "e"]));
        let none = filter_by_affinity(&refs, None, true);
        assert_eq!(none.no_affinity.len(), 7);
        let no_topology = filter_by_affinity(&refs, Some(NumaMask::from_bits(0b1)), false);
        assert!(no_topology.aligned.is_empty());
    }

    #[test]
    fn c4_reusable_devices_are_taken_first_and_no_rpc_when_enough() {
        let free = [dev("a", &[0])];
        let refs: Vec<&Device> = free.iter().collect();
        let picker = DevicePicker::new("r", 2, &ids(&["x", "y", "z"]), &refs, None, true).unwrap();
        assert!(picker.preferred_request().is_none());
        assert_eq!(picker.finish(None).unwrap(), ids(&["x", "y"]));
    }

    #[test]
    fn c4_unavailable_error_counts_what_is_still_needed_after_reuse() {
        let free = [dev("a", &[0])];
        let refs: Vec<&Device> = free.iter().collect();
        let err =
            DevicePicker::new("example.com/gpu", 4, &ids(&["x"]), &refs, None, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "requested number of devices unavailable for example.com/gpu. Requested: 3, Available: 1"
        );
    }

    #[test]
    fn c4_aligned_exactly_enough_makes_no_preferred_call() {
        let free = [dev("a", &[0]), dev("b", &[0]), dev("c", &[1])];
        let refs: Vec<&Device> = free.iter().collect();
        let picker =
            DevicePicker::new("r", 2, &[], &refs, Some(NumaMask::from_bits(0b1)), true).unwrap();
        assert!(picker.preferred_request().is_none());
        assert_eq!(picker.finish(None).unwrap(), ids(&["a", "b"]));
    }

    #[test]
    fn c4_more_aligned_than_needed_asks_preferred_among_aligned_only() {
        let free = [
            dev("a", &[0]),
            dev("b", &[0]),
            dev("c", &[0]),
            dev("d", &[1]),
        ];
        let refs: Vec<&Device> = free.iter().collect();
        let picker =
            DevicePicker::new("r", 2, &[], &refs, Some(NumaMask::from_bits(0b1)), true).unwrap();
        let request = picker.preferred_request().unwrap();
        assert_eq!(request.available_device_ids, ids(&["a", "b", "c"]));
        assert!(request.must_include_device_ids.is_empty());
        assert_eq!(request.allocation_size, 2);
        // Bogus preferred IDs (unaligned "d", unknown "zz") are ignored.
        let chosen = picker.finish(Some(&ids(&["d", "zz", "c"]))).unwrap();
        assert_eq!(chosen, ids(&["c", "a"]));
    }

    #[test]
    fn c4_beyond_aligned_takes_all_aligned_then_preferred_then_unaligned_then_no_affinity() {
        let free = [
            dev("a", &[0]),
            dev("b", &[1]),
            Device::healthy("n"),
            dev("c", &[1]),
        ];
        let refs: Vec<&Device> = free.iter().collect();
        let picker =
            DevicePicker::new("r", 3, &[], &refs, Some(NumaMask::from_bits(0b1)), true).unwrap();
        let request = picker.preferred_request().unwrap();
        // mustInclude = the aligned devices already chosen; available includes them.
        assert_eq!(request.must_include_device_ids, ids(&["a"]));
        assert_eq!(request.available_device_ids, ids(&["a", "b", "n", "c"]));
        assert_eq!(request.allocation_size, 3);
        assert_eq!(
            picker.clone().finish(Some(&ids(&["n"]))).unwrap(),
            ids(&["a", "n", "b"])
        );
        assert_eq!(picker.finish(None).unwrap(), ids(&["a", "b", "c"]));
    }

    #[test]
    fn c4_preferred_parameters_with_reused_devices_use_full_request_size() {
        // TestGetPreferredAllocationParameters: reused devices are mustInclude, size is the
        // container's full request.
        let free = [
            Device::healthy("a"),
            Device::healthy("b"),
            Device::healthy("c"),
        ];
        let refs: Vec<&Device> = free.iter().collect();
        let picker = DevicePicker::new("r", 3, &ids(&["x"]), &refs, None, false).unwrap();
        let request = picker.preferred_request().unwrap();
        assert_eq!(request.must_include_device_ids, ids(&["x"]));
        assert_eq!(request.available_device_ids, ids(&["a", "b", "c", "x"]));
        assert_eq!(request.allocation_size, 3);
        assert_eq!(
            picker.finish(Some(&ids(&["c", "b"]))).unwrap(),
            ids(&["x", "c", "b"])
        );
    }

    #[test]
    fn c3_error_texts_match_the_kubelet() {
        assert_eq!(
            AllocationError::NoHealthyDevices {
                resource: "r".into()
            }
            .to_string(),
            "no healthy devices present; cannot allocate unhealthy devices r"
        );
        assert_eq!(
            AllocationError::Unregistered {
                resource: "r".into()
            }
            .to_string(),
            "cannot allocate unregistered device r"
        );
        assert_eq!(
            AllocationError::ChangedRequest {
                pod_uid: "u".into(),
                container: "c".into(),
                resource: "r".into(),
                had: 1,
                required: 2
            }
            .to_string(),
            "pod \"u\" container \"c\" changed request for resource \"r\" from 1 to 2"
        );
    }

    #[test]
    fn devices_on_out_of_range_numa_ids_are_never_aligned() {
        let devices = [dev("a", &[63]), dev("b", &[64]), dev("c", &[-1])];
        let refs: Vec<&Device> = devices.iter().collect();
        let mask = NumaMask::from_bits(u64::MAX);
        let split = filter_by_affinity(&refs, Some(mask), true);
        assert_eq!(split.aligned, ids(&["a"]));
        assert_eq!(split.unaligned, ids(&["b", "c"]));
    }
}
