//! The device manager's side of topology, after `pkg/kubelet/cm/devicemanager/topology_hints.go`
//! (`GetTopologyHints`, `deviceHasTopologyAlignment`, `deviceNUMANodes`,
//! `generateDeviceTopologyHints`) and `manager.go` (`filterByAffinity`), as pure functions.
//!
//! Hints come back as a [`HintFamily`] (the same set the kubelet lists, described by its rule)
//! so generation costs O(devices) instead of O(2^nodes · devices). Choices made on purpose:
//! * only NUMA nodes that host devices of the resource are enumerated (the recent upstream
//!   behaviour, spec §7 item 14); unknown ids are dropped and reported back;
//! * a device id that the resource does not know is treated as having no topology (upstream
//!   bug: Go dereferences the missing entry and panics; spec §7 item 17).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::TopologyError;
use crate::hint::{HintFamily, ResourceHints};
use crate::mask::{MAX_NUMA_NODES, NumaMask};

/// A device and the NUMA ids its plugin reports (`None` = no `TopologyInfo`; `Some(vec![])`
/// = a `TopologyInfo` with no nodes, which is not the same, spec §7 item 18).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNuma {
    /// Device id.
    pub id: String,
    /// Reported NUMA ids.
    pub numa_nodes: Option<Vec<i64>>,
}

impl DeviceNuma {
    /// Convenience constructor.
    pub fn new(id: impl Into<String>, numa_nodes: Option<Vec<i64>>) -> Self {
        DeviceNuma {
            id: id.into(),
            numa_nodes,
        }
    }

    /// Reported ids that fit in a mask (others cannot be machine nodes).
    fn mask(&self) -> NumaMask {
        let mut m = NumaMask::EMPTY;
        for &n in self.numa_nodes.iter().flatten() {
            if (0..MAX_NUMA_NODES as i64).contains(&n) {
                m = m.or(NumaMask::from_bits(1u64 << n));
            }
        }
        m
    }
}

/// Generated hints plus what was dropped on the way.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceHints {
    /// The hints for the resource.
    pub hints: ResourceHints,
    /// (device, NUMA id) pairs naming nodes the machine lacks; dropped like the kubelet does.
    pub unknown_numa_nodes: Vec<(String, i64)>,
}

/// `deviceHasTopologyAlignment`: some device has a non-empty topology.
pub fn has_topology_alignment(all: &[DeviceNuma]) -> bool {
    all.iter()
        .any(|d| d.numa_nodes.as_ref().is_some_and(|n| !n.is_empty()))
}

/// `deviceNUMANodes`: sorted machine NUMA ids used by any device, unknown ids returned apart.
/// Falls back to all machine nodes when no device names a known node.
pub fn device_numa_nodes(all: &[DeviceNuma], machine: NumaMask) -> (NumaMask, Vec<(String, i64)>) {
    let mut nodes = NumaMask::EMPTY;
    let mut unknown = vec![];
    for d in all {
        for &n in d.numa_nodes.iter().flatten() {
            match usize::try_from(n).ok().filter(|&n| machine.is_set(n)) {
                Some(n) => nodes = nodes.or(NumaMask::from_bits(1u64 << n)),
                None => unknown.push((d.id.clone(), n)),
            }
        }
    }
    if nodes.is_empty() {
        nodes = machine;
    }
    (nodes, unknown)
}

/// Typed check for callers that want to refuse, not drop, devices on unknown NUMA nodes.
pub fn check_device_numa_nodes(all: &[DeviceNuma], machine: NumaMask) -> Result<(), TopologyError> {
    match device_numa_nodes(all, machine).1.into_iter().next() {
        Some((device, node)) => Err(TopologyError::UnknownNumaNode { device, node }),
        None => Ok(()),
    }
}

/// `generateDeviceTopologyHints(resource, available, reusable, request)` as a family.
/// `all` is every device of the resource (healthy or not, allocated or not).
pub fn device_hints(
    all: &[DeviceNuma],
    available: &[&str],
    reusable: &[&str],
    request: usize,
    machine: NumaMask,
) -> DeviceHints {
    let (nodes, unknown_numa_nodes) = device_numa_nodes(all, machine);
    if nodes.is_empty() {
        // No machine nodes at all: the kubelet's loop yields nothing.
        return DeviceHints {
            hints: ResourceHints::Hints(vec![]),
            unknown_numa_nodes,
        };
    }
    let by_id: HashMap<&str, &DeviceNuma> = all.iter().map(|d| (d.id.as_str(), d)).collect();
    let all_masks: Vec<NumaMask> = all.iter().map(|d| d.mask().and(nodes)).collect();
    let min_affinity = HintFamily::min_nodes_to_cover(nodes, &all_masks, request)
        .map_or(nodes.count(), |k| k.min(nodes.count()));
    // Reusable devices with topology must all touch the mask; without topology they are
    // skipped and not counted (spec §7 item 16). A missing record counts as no topology.
    let required: Vec<NumaMask> = reusable
        .iter()
        .filter_map(|id| {
            by_id
                .get(id)
                .and_then(|d| d.numa_nodes.as_ref().map(|_| d.mask().and(nodes)))
        })
        .collect();
    let items: Vec<NumaMask> = available
        .iter()
        .map(|id| {
            by_id
                .get(id)
                .map_or(NumaMask::EMPTY, |d| d.mask().and(nodes))
        })
        .filter(|m| !m.is_empty())
        .collect();
    let family = HintFamily::new(nodes, items, required, request, min_affinity);
    DeviceHints {
        hints: ResourceHints::Family(family),
        unknown_numa_nodes,
    }
}

/// The per-resource part of `GetTopologyHints` (container scope) / `GetPodTopologyHints`:
/// * no device with topology -> no preference;
/// * already allocated to the container: other count -> `[]`, else hints from those devices;
/// * fewer free + reusable devices than requested -> `[]`;
/// * otherwise generated hints.
///
/// `allocated` is what the container (or, pod scope, the pod) already holds; `free` the healthy
/// unallocated devices; `reusable` the pod's reusable pool (empty in pod scope).
pub fn resource_hints(
    all: &[DeviceNuma],
    free: &[&str],
    reusable: &[&str],
    allocated: &[&str],
    request: usize,
    machine: NumaMask,
) -> DeviceHints {
    if !has_topology_alignment(all) {
        return DeviceHints {
            hints: ResourceHints::NoPreference,
            unknown_numa_nodes: vec![],
        };
    }
    if !allocated.is_empty() {
        if allocated.len() != request {
            return DeviceHints {
                hints: ResourceHints::Hints(vec![]),
                unknown_numa_nodes: vec![],
            };
        }
        return device_hints(all, allocated, &[], request, machine);
    }
    let union: BTreeSet<&str> = free.iter().chain(reusable.iter()).copied().collect();
    if union.len() < request {
        return DeviceHints {
            hints: ResourceHints::Hints(vec![]),
            unknown_numa_nodes: vec![],
        };
    }
    device_hints(all, free, reusable, request, machine)
}

/// Hints for devices that are already chosen and cannot change: a DRA claim's allocated
/// devices, each with the NUMA ids its ResourceSlice gives in `resource.kubernetes.io/numaNode`
/// (KEP-6072; `None` when the device has no such attribute). devicelet's addition: upstream
/// 1.36 has no DRA hint provider (kubernetes/website#56232).
///
/// Like the device manager's hints for devices a container holds already
/// (`generateDeviceTopologyHints(allocated, {}, len(allocated))`), a mask is a hint when every
/// device touches it, and preferred when it is as narrow as these devices allow (the narrowest
/// set of nodes that every device touches). Unlike it, `min_affinity` is taken from the
/// chosen devices, not from every device of the driver: the claim cannot get other devices
/// on this node, so no narrower placement exists for it. Devices without the attribute, or
/// naming only NUMA nodes the machine lacks (returned in `unknown_numa_nodes`), take no part:
/// when no device has a known node the answer is no preference.
pub fn allocated_device_hints(devices: &[DeviceNuma], machine: NumaMask) -> DeviceHints {
    let (_, unknown_numa_nodes) = device_numa_nodes(devices, machine);
    let items: Vec<NumaMask> = devices
        .iter()
        .map(|d| d.mask().and(machine))
        .filter(|m| !m.is_empty())
        .collect();
    if items.is_empty() {
        return DeviceHints {
            hints: ResourceHints::NoPreference,
            unknown_numa_nodes,
        };
    }
    let universe = items.iter().fold(NumaMask::EMPTY, |u, m| u.or(*m));
    let request = items.len();
    // Every item touches the universe, so a cover always exists.
    let min_affinity = HintFamily::min_nodes_to_cover(universe, &items, request)
        .unwrap_or(universe.count())
        .max(1);
    DeviceHints {
        hints: ResourceHints::Family(HintFamily::new(
            universe,
            items,
            vec![],
            request,
            min_affinity,
        )),
        unknown_numa_nodes,
    }
}

/// Devices split by the merged affinity, as `filterByAffinity` does: devices on a node of the
/// affinity, devices on other nodes, devices without topology. Upstream returns sets; here each
/// list is ordered by the kubelet's node order (affinity nodes, then others, each by ascending
/// number of available devices, ties by node id), then by device id, so callers are
/// deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AffinityGroups {
    /// On at least one node of the affinity.
    pub aligned: Vec<String>,
    /// Only on nodes outside the affinity.
    pub unaligned: Vec<String>,
    /// No (or empty) topology.
    pub without_topology: Vec<String>,
}

/// `filterByAffinity`. `affinity == None` or a resource without topology alignment puts every
/// device into `without_topology`, like the kubelet returning `available` unsorted.
pub fn filter_by_affinity(
    all: &[DeviceNuma],
    available: &[&str],
    affinity: Option<NumaMask>,
) -> AffinityGroups {
    let by_id: HashMap<&str, &DeviceNuma> = all.iter().map(|d| (d.id.as_str(), d)).collect();
    let mut available: Vec<&str> = available.to_vec();
    available.sort_unstable();
    available.dedup();
    let Some(affinity) = affinity.filter(|_| has_topology_alignment(all)) else {
        return AffinityGroups {
            without_topology: available.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
    };
    // Devices per node (a device may sit on several nodes).
    let mut per_node: BTreeMap<i64, usize> = BTreeMap::new();
    let nodes_of = |id: &str| -> Vec<i64> {
        by_id
            .get(id)
            .and_then(|d| d.numa_nodes.clone())
            .unwrap_or_default()
    };
    for id in &available {
        for n in nodes_of(id) {
            *per_node.entry(n).or_default() += 1;
        }
    }
    let in_affinity = |n: i64| usize::try_from(n).is_ok_and(|n| affinity.is_set(n));
    let mut order: Vec<i64> = per_node.keys().copied().collect();
    order.sort_by_key(|&n| (!in_affinity(n), per_node[&n], n));
    let rank: HashMap<i64, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut groups = AffinityGroups::default();
    let mut keyed: Vec<(usize, &str)> = vec![];
    for id in &available {
        let nodes = nodes_of(id);
        match nodes.iter().filter_map(|n| rank.get(n).copied()).min() {
            None => groups.without_topology.push(id.to_string()),
            Some(r) => keyed.push((r, id)),
        }
    }
    keyed.sort();
    for (r, id) in keyed {
        if in_affinity(order[r]) {
            groups.aligned.push(id.to_string());
        } else {
            groups.unaligned.push(id.to_string());
        }
    }
    groups
}
