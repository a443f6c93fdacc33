//! The static policy's arithmetic on the state, after `policy_static.go`: the default machine
//! state, hint generation (`calculateHints`, `regenerateHints`), the choice of the affinity
//! (`getDefaultHint`, `extendTopologyManagerHint`, `findBestHint`), placing and releasing
//! blocks (`updateMachineState`, `releaseMemory`), init-container memory reuse
//! (`updatePodReusableMemory`, `updateInitContainersMemoryBlocks`) and `validateState`.
//!
//! Differences from the kubelet, all deliberate:
//! * Go ranges over maps in random order; resources and nodes are visited in sorted order here,
//!   so block order and the error reported first are deterministic.
//! * A requested resource missing from a node's memory map counts as 0 bytes; the kubelet
//!   dereferences a nil table and panics (upstream bug).
//! * Hint enumeration: the kubelet lists every subset of NUMA nodes (2^n). Up to
//!   [`EXACT_ENUMERATION_NODES`] nodes the list here is the kubelet's, in its order. Beyond
//!   that (where the kubelet would never finish) the list holds every valid hint of at most
//!   the preferred size (at most 3 nodes) or of an existing multi-NUMA group, plus the mask of
//!   every unused node, so merges still find the narrow placements and a catch-all; see
//!   `calculate_hints`. The Topology Manager's compact `HintFamily` cannot express these
//!   hints (byte thresholds over several resources, exact multi-NUMA groups), so they are
//!   listed.

use std::collections::BTreeMap;

use devicelet_topology::mask::{for_each_k_subset, iterate_bit_masks};
use devicelet_topology::{ContainerSpec, NumaMask, PodSpec, TopologyHint};

use crate::config::SystemReserved;
use crate::error::MemoryManagerError;
use crate::state::{MachineState, MemoryBlock, MemoryState, MemoryTableState, NodeState};
use crate::topology::{
    MEMORY_RESOURCE, MemoryTopology, hugepage_resource_name, is_memory_resource,
};

/// Up to this many NUMA nodes, hints are the kubelet's full list.
pub const EXACT_ENUMERATION_NODES: usize = 16;

/// Resource → bytes requested.
pub type Requests = BTreeMap<String, u64>;

/// pod UID → affinity → resource → bytes that init containers leave for later containers.
pub type Reusable = BTreeMap<String, BTreeMap<NumaMask, BTreeMap<String, u64>>>;

/// `getDefaultMachineState`.
pub fn default_machine_state(topology: &MemoryTopology, reserved: &SystemReserved) -> MachineState {
    let reserved_of = |id: usize, name: &str| -> u64 {
        reserved
            .get(&id)
            .and_then(|r| r.get(name))
            .copied()
            .unwrap_or(0)
    };
    let mut out = MachineState::new();
    for (&id, node) in topology.nodes() {
        let mut state = NodeState {
            number_of_assignments: 0,
            memory_map: BTreeMap::new(),
            cells: vec![id],
        };
        let mut in_hugepages: u64 = 0;
        for (&page, &count) in &node.hugepages {
            let name = hugepage_resource_name(page);
            let sr = reserved_of(id, &name);
            let total = count.wrapping_mul(page);
            // Go's uint64 arithmetic wraps when more is reserved than exists.
            let allocatable = total.wrapping_sub(sr);
            state.memory_map.insert(
                name,
                crate::state::MemoryTableState {
                    total,
                    system_reserved: sr,
                    allocatable,
                    reserved: 0,
                    free: allocatable,
                },
            );
            in_hugepages = in_hugepages.wrapping_add(total);
        }
        let sr = reserved_of(id, MEMORY_RESOURCE);
        let allocatable = node
            .memory_bytes
            .wrapping_sub(sr)
            .wrapping_sub(in_hugepages);
        state.memory_map.insert(
            MEMORY_RESOURCE.to_string(),
            crate::state::MemoryTableState {
                total: node.memory_bytes,
                system_reserved: sr,
                allocatable,
                reserved: 0,
                free: allocatable,
            },
        );
        out.insert(id, state);
    }
    out
}

/// `getContainerRequestedResources`: memory and hugepages of one container (requests equal
/// limits for the Guaranteed pods this is asked about).
pub fn container_requests(container: &ContainerSpec) -> Requests {
    container
        .limits
        .iter()
        .filter(|(k, _)| is_memory_resource(k))
        .map(|(k, &v)| (k.clone(), v as u64))
        .collect()
}

/// `getPodRequestedResources`: per resource, the larger of the init phase's peak and the sum of
/// long-running containers (app containers and sidecars); only resources app containers
/// request are kept, as upstream.
pub fn pod_requests(pod: &PodSpec) -> Requests {
    let mut by_init: Requests = BTreeMap::new();
    let mut by_sidecars: Requests = BTreeMap::new();
    for c in &pod.init_containers {
        for (name, qty) in container_requests(c) {
            let init = by_init.entry(name.clone()).or_insert(0);
            let side = by_sidecars.entry(name).or_insert(0);
            if c.restartable {
                *side = side.wrapping_add(qty);
            } else if side.wrapping_add(qty) > *init {
                *init = side.wrapping_add(qty);
            }
        }
    }
    let mut by_apps: Requests = BTreeMap::new();
    for c in &pod.containers {
        for (name, qty) in container_requests(c) {
            let e = by_apps.entry(name).or_insert(0);
            *e = e.wrapping_add(qty);
        }
    }
    by_apps
        .into_iter()
        .map(|(name, apps)| {
            let long_running = apps.wrapping_add(by_sidecars.get(&name).copied().unwrap_or(0));
            let init = by_init.get(&name).copied().unwrap_or(0);
            (name, long_running.max(init))
        })
        .collect()
}

fn mask_of(nodes: &[usize]) -> Option<NumaMask> {
    NumaMask::from_nodes(nodes.iter().copied()).ok()
}

fn table_free(machine: &MachineState, id: usize, name: &str) -> u64 {
    machine
        .get(&id)
        .and_then(|n| n.memory_map.get(name))
        .map_or(0, |t| t.free)
}

fn table_allocatable(machine: &MachineState, id: usize, name: &str) -> u64 {
    machine
        .get(&id)
        .and_then(|n| n.memory_map.get(name))
        .map_or(0, |t| t.allocatable)
}

fn sorted(v: &[usize]) -> Vec<usize> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

/// `areGroupsEqual` (order-insensitive, duplicates count).
pub fn groups_equal(a: &[usize], b: &[usize]) -> bool {
    sorted(a) == sorted(b)
}

/// `getPodReusableMemory`.
pub fn reusable_of(reusable: &Reusable, pod_uid: &str, mask: NumaMask, name: &str) -> u64 {
    reusable
        .get(pod_uid)
        .and_then(|m| m.get(&mask))
        .and_then(|r| r.get(name))
        .copied()
        .unwrap_or(0)
}

/// Per-resource sums over the nodes of `mask`.
fn sums(
    machine: &MachineState,
    mask: NumaMask,
    requests: &Requests,
    of: fn(&MachineState, usize, &str) -> u64,
) -> impl Iterator<Item = (u64, u64)> {
    requests.iter().map(move |(name, &want)| {
        let have = mask
            .nodes()
            .fold(0u64, |a, n| a.wrapping_add(of(machine, n, name)));
        (have, want)
    })
}

fn allocatable_fits(machine: &MachineState, mask: NumaMask, requests: &Requests) -> bool {
    sums(machine, mask, requests, table_allocatable).all(|(have, want)| have >= want)
}

/// The group and free-memory checks of `calculateHints` for one mask whose allocatable memory
/// is enough.
fn mask_is_hint(
    machine: &MachineState,
    reusable: &Reusable,
    pod_uid: &str,
    mask: NumaMask,
    requests: &Requests,
) -> bool {
    let bits: Vec<usize> = mask.nodes().collect();
    let single = bits.len() == 1;
    if single && machine.get(&bits[0]).is_some_and(|n| n.cells.len() > 1) {
        return false;
    }
    if !single {
        for &id in &bits {
            let Some(n) = machine.get(&id) else { continue };
            if n.number_of_assignments > 0 && (n.cells.len() == 1 || !groups_equal(&n.cells, &bits))
            {
                return false;
            }
        }
    }
    requests.iter().all(|(name, &want)| {
        let free = bits
            .iter()
            .fold(0u64, |a, &n| a.wrapping_add(table_free(machine, n, name)));
        free.wrapping_add(reusable_of(reusable, pod_uid, mask, name)) >= want
    })
}

/// Smallest number of nodes whose allocatable memory holds every requested resource (the
/// kubelet's `minAffinitySize`, which starts at the node count).
fn min_affinity_size(machine: &MachineState, requests: &Requests) -> usize {
    let ids: Vec<usize> = machine.keys().copied().collect();
    let n = ids.len();
    if n <= EXACT_ENUMERATION_NODES {
        let mut best = n;
        iterate_bit_masks(&ids, |m| {
            if m.count() < best && allocatable_fits(machine, m, requests) {
                best = m.count();
            }
        });
        return best;
    }
    let all = mask_of(&ids).unwrap_or_default();
    // Branch and bound by size: for each resource the best `left` remaining nodes bound what
    // can still be added.
    for k in 1..=n {
        let mut found = false;
        for_each_k_subset(all, k, |m| {
            found = allocatable_fits(machine, m, requests);
            !found
        });
        if found {
            return k;
        }
        if k >= 3 {
            // Past 3 nodes exhaustive search is too costly; a greedy cover gives a size that
            // fits (the bound is only used on machines the kubelet cannot enumerate).
            return greedy_cover(machine, requests, &ids)
                .unwrap_or(n)
                .max(k + 1)
                .min(n);
        }
    }
    n
}

fn greedy_cover(machine: &MachineState, requests: &Requests, ids: &[usize]) -> Option<usize> {
    let mut order = ids.to_vec();
    order.sort_by_key(|&id| std::cmp::Reverse(table_allocatable(machine, id, MEMORY_RESOURCE)));
    let mut mask = NumaMask::EMPTY;
    for (i, &id) in order.iter().enumerate() {
        mask = mask.with(id).ok()?;
        if allocatable_fits(machine, mask, requests) {
            return Some(i + 1);
        }
    }
    None
}

/// `calculateHints`: `None` when no mask qualifies (the kubelet then returns an empty map).
pub fn calculate_hints(
    machine: &MachineState,
    reusable: &Reusable,
    pod_uid: &str,
    requests: &Requests,
) -> Option<Vec<TopologyHint>> {
    // The kubelet's hints are a map by resource: nothing requested, no entry, and its
    // `getDefaultHint` then fails ("no NUMA nodes with enough memory"). Only a container
    // without requests of its own in a pod managed at pod level (KEP-5526) under the container
    // or none scope gets here: upstream refuses that pod (UnexpectedAdmissionError), and
    // devicelet keeps that behaviour.
    if requests.is_empty() {
        return None;
    }
    let ids: Vec<usize> = machine.keys().copied().collect();
    let min_size = min_affinity_size(machine, requests);
    let mut hints = vec![];
    let consider = |m: NumaMask, hints: &mut Vec<TopologyHint>| {
        if allocatable_fits(machine, m, requests)
            && mask_is_hint(machine, reusable, pod_uid, m, requests)
        {
            hints.push(TopologyHint::new(m, m.count() == min_size));
        }
    };
    if ids.len() <= EXACT_ENUMERATION_NODES {
        iterate_bit_masks(&ids, |m| consider(m, &mut hints));
    } else {
        let all = mask_of(&ids).unwrap_or_default();
        let fresh = mask_of(
            &machine
                .iter()
                .filter(|(_, n)| n.number_of_assignments <= 0)
                .map(|(&id, _)| id)
                .collect::<Vec<_>>(),
        )
        .unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for_each_k_subset(all, 1, |m| {
            seen.insert(m);
            consider(m, &mut hints);
            true
        });
        // Larger masks can only be unused nodes or exactly an existing group.
        // Exhaustive up to 3 nodes (C(64,3) = 41 664 masks); wider fresh masks are represented
        // by the widest one below.
        for k in 2..=min_size.min(3) {
            for_each_k_subset(fresh, k, |m| {
                seen.insert(m);
                consider(m, &mut hints);
                true
            });
        }
        let groups: std::collections::BTreeSet<NumaMask> = machine
            .values()
            .filter(|n| n.cells.len() > 1)
            .filter_map(|n| mask_of(&n.cells))
            .collect();
        for g in groups.into_iter().chain([fresh]) {
            if g.count() > 1 && seen.insert(g) {
                consider(g, &mut hints);
            }
        }
    }
    (!hints.is_empty()).then_some(hints)
}

/// `regenerateHints`: the hints of a container (or pod) that already holds blocks; `None` when
/// they do not match the request (the kubelet then gives no preference).
pub fn regenerate_hints(
    blocks: &[MemoryBlock],
    requests: &Requests,
) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
    if blocks.len() != requests.len() {
        return None;
    }
    let mut out: BTreeMap<String, Vec<TopologyHint>> =
        requests.keys().map(|k| (k.clone(), vec![])).collect();
    for b in blocks {
        let want = requests.get(&b.resource)?;
        if b.size != *want {
            return None;
        }
        let mask = mask_of(&b.numa_affinity)?;
        out.entry(b.resource.clone())
            .or_default()
            .push(TopologyHint::new(mask, true));
    }
    Some(out)
}

/// `findBestHint`: preferred first, then the narrowest.
pub fn find_best_hint(hints: &[TopologyHint]) -> Option<TopologyHint> {
    let mut best: Option<TopologyHint> = None;
    for h in hints {
        let Some(b) = best else {
            best = Some(*h);
            continue;
        };
        if h.preferred && !b.preferred {
            best = Some(*h);
            continue;
        }
        let narrower = match (h.affinity, b.affinity) {
            (Some(x), Some(y)) => x.is_narrower_than(y),
            _ => false,
        };
        if h.preferred == b.preferred && narrower {
            best = Some(*h);
        }
    }
    best
}

/// `isAffinitySatisfyRequest`.
pub fn affinity_satisfies(machine: &MachineState, mask: NumaMask, requests: &Requests) -> bool {
    sums(machine, mask, requests, table_free).all(|(have, want)| have >= want)
}

/// `isAffinityViolatingNUMAAllocations`.
pub fn violates_numa_allocations(machine: &MachineState, mask: NumaMask) -> bool {
    let bits: Vec<usize> = mask.nodes().collect();
    if bits.len() == 1 {
        return false;
    }
    bits.iter().any(|id| {
        machine.get(id).is_some_and(|n| {
            n.number_of_assignments != 0 && (n.cells.len() == 1 || !groups_equal(&n.cells, &bits))
        })
    })
}

/// `updateMachineState`: counts the assignment on every node of the affinity and takes `size`
/// from their free memory, node after node.
pub fn place(machine: &mut MachineState, affinity: &[usize], name: &str, mut size: u64) {
    for id in affinity {
        let Some(node) = machine.get_mut(id) else {
            continue;
        };
        node.number_of_assignments += 1;
        node.cells = affinity.to_vec();
        if size == 0 {
            continue;
        }
        if let Some(t) = node.memory_map.get_mut(name) {
            size = reserve_from(t, size);
        }
    }
}

/// Moves up to `size` bytes of a node's free memory of one resource to reserved; returns
/// what is still to be placed on the next nodes.
fn reserve_from(t: &mut MemoryTableState, size: u64) -> u64 {
    let taken = size.min(t.free);
    t.reserved += taken;
    t.free -= taken;
    size - taken
}

/// `releaseMemory`.
pub fn release(machine: &mut MachineState, blocks: &[MemoryBlock]) {
    for b in blocks {
        let mut size = b.size;
        for &id in &b.numa_affinity {
            let Some(node) = machine.get_mut(&id) else {
                continue;
            };
            node.number_of_assignments -= 1;
            if node.number_of_assignments == 0 {
                node.cells = vec![id];
            }
            if size == 0 {
                continue;
            }
            let Some(t) = node.memory_map.get_mut(&b.resource) else {
                continue;
            };
            if t.reserved == 0 {
                continue;
            }
            if t.reserved < size {
                size -= t.reserved;
                t.free += t.reserved;
                t.reserved = 0;
                continue;
            }
            t.free += size;
            t.reserved -= size;
            size = 0;
        }
    }
}

/// `updatePodReusableMemory`: only one pod's entry is kept; a regular init container records
/// the largest block per affinity and resource, any other container consumes from it.
pub fn update_reusable(
    reusable: &mut Reusable,
    pod: &PodSpec,
    container: &str,
    blocks: &[MemoryBlock],
) {
    reusable.retain(|uid, _| *uid == pod.uid);
    let regular_init = pod
        .init_containers
        .iter()
        .find(|c| c.name == container)
        .is_some_and(|c| !c.restartable);
    if regular_init {
        let entry = reusable.entry(pod.uid.clone()).or_default();
        for b in blocks {
            let mask = mask_of(&b.numa_affinity).unwrap_or_default();
            let slot = entry
                .entry(mask)
                .or_default()
                .entry(b.resource.clone())
                .or_insert(0);
            if b.size > *slot {
                *slot = b.size;
            }
        }
        return;
    }
    for b in blocks {
        let mask = mask_of(&b.numa_affinity).unwrap_or_default();
        if let Some(slot) = reusable
            .get_mut(&pod.uid)
            .and_then(|m| m.get_mut(&mask))
            .and_then(|r| r.get_mut(&b.resource))
            .filter(|v| **v != 0)
        {
            *slot = slot.saturating_sub(b.size);
        }
    }
}

/// `updateInitContainersMemoryBlocks`: shrinks the blocks of earlier regular init containers by
/// what `container` reused from them, so the pod's blocks add up to what it holds.
pub fn shrink_init_blocks(
    state: &mut MemoryState,
    pod: &PodSpec,
    container: &str,
    blocks: &[MemoryBlock],
) {
    for cb in blocks {
        let mut size = cb.size;
        for init in &pod.init_containers {
            if init.name == container || size == 0 {
                break;
            }
            if init.restartable {
                continue;
            }
            let Some(init_blocks) = state
                .assignments
                .get_mut(&pod.uid)
                .and_then(|p| p.get_mut(&init.name))
            else {
                continue;
            };
            for ib in init_blocks.iter_mut() {
                if ib.size == 0 || ib.resource != cb.resource {
                    continue;
                }
                if mask_of(&ib.numa_affinity).is_none()
                    || mask_of(&ib.numa_affinity) != mask_of(&cb.numa_affinity)
                {
                    continue;
                }
                if ib.size > size {
                    ib.size -= size;
                    size = 0;
                } else {
                    size -= ib.size;
                    ib.size = 0;
                }
            }
        }
    }
}

/// `updateExpectedMachineState` for `validateState`.
fn expect_blocks(
    expected: &mut MachineState,
    blocks: &[MemoryBlock],
    pod: &str,
    container: &str,
) -> Result<(), MemoryManagerError> {
    for b in blocks {
        let mut size = b.size;
        for id in &b.numa_affinity {
            let Some(node) = expected.get_mut(id) else {
                return Err(MemoryManagerError::InvalidState(format!(
                    "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses the NUMA that does not exist"
                )));
            };
            node.number_of_assignments += 1;
            node.cells = b.numa_affinity.clone();
            let Some(t) = node.memory_map.get_mut(&b.resource) else {
                return Err(MemoryManagerError::InvalidState(format!(
                    "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses memory resource that does not exist"
                )));
            };
            size = reserve_from(t, size);
        }
    }
    Ok(())
}

/// `areMachineStatesEqual`.
fn machine_states_equal(a: &MachineState, b: &MachineState) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (id, n1) in a {
        let Some(n2) = b.get(id) else { return false };
        if n1.number_of_assignments != n2.number_of_assignments
            || !groups_equal(&n1.cells, &n2.cells)
            || n1.memory_map.len() != n2.memory_map.len()
        {
            return false;
        }
        for (name, t1) in &n1.memory_map {
            let Some(t2) = n2.memory_map.get(name) else {
                return false;
            };
            if t1.total != t2.total
                || t1.system_reserved != t2.system_reserved
                || t1.allocatable != t2.allocatable
            {
                return false;
            }
            // Free and reserved are compared over the node's whole group: a block spread over
            // several nodes may be split between them differently.
            let mut sums = [0u64; 4];
            for cell in &n1.cells {
                let (Some(c1), Some(c2)) = (a.get(cell), b.get(cell)) else {
                    return false;
                };
                let g = |n: &NodeState| n.memory_map.get(name).copied().unwrap_or_default();
                sums[0] = sums[0].wrapping_add(g(c1).free);
                sums[1] = sums[1].wrapping_add(g(c1).reserved);
                sums[2] = sums[2].wrapping_add(g(c2).free);
                sums[3] = sums[3].wrapping_add(g(c2).reserved);
            }
            if sums[0] != sums[2] || sums[1] != sums[3] {
                return false;
            }
        }
    }
    true
}

/// `validateState`: initialises an empty machine state (returns `true`), or checks that the
/// restored one is what the machine, the reservations and the assignments imply.
pub fn validate_state(
    state: &mut MemoryState,
    default: &MachineState,
) -> Result<bool, MemoryManagerError> {
    if state.machine.is_empty() {
        if !state.assignments.is_empty() {
            return Err(MemoryManagerError::InvalidState(
                "[memorymanager] machine state can not be empty when it has memory assignments"
                    .into(),
            ));
        }
        state.machine = default.clone();
        return Ok(true);
    }
    let mut expected = default.clone();
    for (pod, containers) in &state.assignments {
        // A pod managed at pod level (KEP-5526) holds the pod's blocks; its containers' blocks
        // are parts of them and count once, as the pod's.
        if let Some(blocks) = state.pod_entries.get(pod).filter(|b| !b.is_empty()) {
            expect_blocks(&mut expected, blocks, pod, "")?;
            continue;
        }
        for (c, blocks) in containers {
            expect_blocks(&mut expected, blocks, pod, c)?;
        }
    }
    if !machine_states_equal(&state.machine, &expected) {
        return Err(MemoryManagerError::InvalidState(
            "[memorymanager] the expected machine state is different from the real one".into(),
        ));
    }
    Ok(false)
}
