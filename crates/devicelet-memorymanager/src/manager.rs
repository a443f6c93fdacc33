//! The memory manager with the kubelet's `None` and `Static` policies, after
//! `memorymanager/memory_manager.go` (construction, reserved memory, stale state) and
//! `policy_static.go` (`Allocate`, `RemoveContainer`, `GetTopologyHints`,
//! `GetPodTopologyHints`, `GetAllocatableMemory`); KEP-1769.
//!
//! The Topology Manager talks to it through [`HintProvider`]; its pod view ([`PodSpec`]) has no
//! QoS class, so admission registers each pod first ([`MemoryManager::register_pod`], the same
//! [`PodCpuInfo`] the CPU manager takes); an unregistered pod is treated as not Guaranteed and
//! gets no blocks. Memory and hugepage requests are read from [`ContainerSpec::limits`]
//! (`memory`, `hugepages-<size>`, bytes): for Guaranteed pods they equal the requests the
//! kubelet reads.
//!
//! Every change is made in memory and given a version; [`MemoryManager::persist`] writes
//! `memory_manager_state` (an fsync) when the file lacks the newest version, as the CPU manager
//! does.
//!
//! Pod-level resource management (KEP-5526, `PodLevelResourceManagers` with
//! `PodLevelResources`; [`MemoryManager::new_with_gates`]) follows `policy_static.go`
//! `AllocatePod`, `GetPodTopologyHints`, `validatePodScopeResources` and `RemoveContainer`:
//! the pod's own memory and hugepages requests are placed once on the pod's NUMA nodes
//! (`podEntries`), then split among the containers ([`MemoryManager::assign_pod`]); the pod's
//! memory is released with its last container. With the gates off a pod with pod-level
//! resources gets no hints and no blocks, as in the kubelet.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use devicelet_cpumanager::pod::PodLevelGates;
use devicelet_cpumanager::{PodCpuInfo, QosClass};
use devicelet_topology::{
    ContainerSpec, HintProvider, PodSpec, ProviderError, ProviderHints, ResourceHints, TopologyHint,
};

use crate::config::{
    MemoryManagerConfig, MemoryPolicyName, SystemReserved, static_system_reserved,
};
use crate::error::MemoryManagerError;
use crate::policy::{self, Requests, Reusable};
use crate::state::{CheckpointFile, MachineState, MemoryBlock, MemoryState};
use crate::topology::{MEMORY_RESOURCE, MemoryTopology};

struct Inner {
    state: MemoryState,
    /// Increases with every change of `state`; the file holds [`MemoryManager::written`].
    version: u64,
    reusable: Reusable,
    pods: HashMap<String, PodCpuInfo>,
}

/// What an allocation replaced, so that a failed write can put it back.
struct Undo {
    version: u64,
    state: MemoryState,
    reusable: Reusable,
}

/// The memory manager.
pub struct MemoryManager {
    topology: MemoryTopology,
    policy: MemoryPolicyName,
    system_reserved: SystemReserved,
    checkpoint: CheckpointFile,
    /// `PodLevelResources` / `PodLevelResourceManagers`.
    gates: PodLevelGates,
    inner: Mutex<Inner>,
    /// The version of `state` the file holds; held for the whole write (lock order: this, then
    /// `inner`), so an older state never overwrites a newer one.
    written: Mutex<u64>,
}

impl std::fmt::Debug for MemoryManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryManager")
            .field("policy", &self.policy)
            .field("checkpoint", &self.checkpoint.path())
            .finish()
    }
}

fn hints_for(requests: &Requests, hints: Option<Vec<TopologyHint>>) -> ProviderHints {
    let mut out = ProviderHints::new();
    if let Some(hints) = hints {
        for name in requests.keys() {
            out.insert(name.clone(), ResourceHints::Hints(hints.clone()));
        }
    }
    out
}

impl MemoryManager {
    /// `NewManager` + `Start`: parses the configuration, checks the reserved memory, restores
    /// `<state_dir>/memory_manager_state` (or creates it) and validates it against the machine.
    pub fn new(
        topology: MemoryTopology,
        config: &MemoryManagerConfig,
        state_dir: &Path,
    ) -> Result<Self, MemoryManagerError> {
        Self::new_with_gates(topology, config, state_dir, PodLevelGates::default())
    }

    /// [`MemoryManager::new`] under the given pod-level feature gates (the state file's layout
    /// follows `PodLevelResourceManagers`, as the kubelet's does).
    pub fn new_with_gates(
        topology: MemoryTopology,
        config: &MemoryManagerConfig,
        state_dir: &Path,
        gates: PodLevelGates,
    ) -> Result<Self, MemoryManagerError> {
        let policy: MemoryPolicyName = config.policy.parse()?;
        let system_reserved = match policy {
            MemoryPolicyName::None => SystemReserved::new(),
            MemoryPolicyName::Static => static_system_reserved(&topology, config)?,
        };
        let checkpoint =
            CheckpointFile::new(state_dir, policy.as_str()).with_pod_level(gates.managers);
        let restored = checkpoint.load()?;
        let mut changed = restored.is_none();
        let mut state = restored.unwrap_or_default();
        if policy == MemoryPolicyName::Static {
            let default = policy::default_machine_state(&topology, &system_reserved);
            changed |= policy::validate_state(&mut state, &default)?;
        }
        if changed {
            checkpoint.store(&state)?;
        }
        Ok(MemoryManager {
            topology,
            policy,
            system_reserved,
            checkpoint,
            gates,
            inner: Mutex::new(Inner {
                state,
                version: 0,
                reusable: Reusable::new(),
                pods: HashMap::new(),
            }),
            written: Mutex::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No step of a change can panic half-way (checks run before the state is modified).
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The policy.
    pub fn policy(&self) -> MemoryPolicyName {
        self.policy
    }

    /// The machine it was built for.
    pub fn topology(&self) -> &MemoryTopology {
        &self.topology
    }

    /// Reserved bytes per NUMA node and resource (static policy; empty for `None`).
    pub fn system_reserved(&self) -> &SystemReserved {
        &self.system_reserved
    }

    /// The state file.
    pub fn state_file(&self) -> &Path {
        self.checkpoint.path()
    }

    /// A copy of the current state.
    pub fn state(&self) -> MemoryState {
        self.lock().state.clone()
    }

    /// The machine state (per NUMA node tables, groups, assignment counts).
    pub fn machine_state(&self) -> MachineState {
        self.lock().state.machine.clone()
    }

    /// Writes `memory_manager_state` (atomic, fsynced) when memory holds changes the file
    /// lacks; returns whether it wrote. A failed write changes nothing in memory: the next call
    /// writes again.
    pub fn persist(&self) -> Result<bool, MemoryManagerError> {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (version, state) = {
            let inner = self.lock();
            if inner.version == *written {
                return Ok(false);
            }
            (inner.version, inner.state.clone())
        };
        self.checkpoint.store(&state)?;
        *written = version;
        Ok(true)
    }

    /// Whether memory holds changes the file lacks (a pod-level pod's containers can hold
    /// empty blocks, which the file records all the same).
    pub fn has_unwritten(&self) -> bool {
        let written = *self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.lock().version != written
    }

    /// Tells the manager a pod's QoS class; call before admission.
    pub fn register_pod(&self, pod: &PodCpuInfo) {
        self.lock().pods.insert(pod.spec.uid.clone(), pod.clone());
    }

    fn guaranteed(&self, inner: &Inner, pod_uid: &str) -> bool {
        inner
            .pods
            .get(pod_uid)
            .is_some_and(|p| p.qos_with(self.gates) == QosClass::Guaranteed)
    }

    /// A pod with pod-level resources that the gates keep from the manager.
    fn skipped(&self, inner: &Inner, pod_uid: &str) -> bool {
        inner
            .pods
            .get(pod_uid)
            .is_some_and(|p| p.skipped_for_pod_level(self.gates))
    }

    /// `getContainerRequestedResources`: under pod-level management, nothing for a container
    /// that is not Guaranteed on its own.
    fn container_requests(
        &self,
        inner: &Inner,
        pod_uid: &str,
        container: &ContainerSpec,
    ) -> Requests {
        let info = inner.pods.get(pod_uid);
        if info.is_some_and(|p| {
            p.managed_at_pod_level(self.gates) && !p.is_equivalent_guaranteed(&container.name)
        }) {
            return Requests::new();
        }
        policy::container_requests(container)
    }

    /// `getPodRequestedResources`; `None` when the pod's own amounts are not whole bytes.
    fn pod_requests(&self, inner: &Inner, pod: &PodSpec) -> Option<Requests> {
        match inner.pods.get(&pod.uid) {
            Some(p) if p.managed_at_pod_level(self.gates) => {
                p.pod_level.as_ref().and_then(|l| l.memory_requests.clone())
            }
            _ => Some(policy::pod_requests(pod)),
        }
    }

    /// Container-scope hints (`GetTopologyHints`).
    pub fn container_hints(&self, pod: &PodSpec, container: &ContainerSpec) -> ProviderHints {
        if self.policy == MemoryPolicyName::None {
            return ProviderHints::new();
        }
        let inner = self.lock();
        if !self.guaranteed(&inner, &pod.uid) {
            return ProviderHints::new();
        }
        let requests = self.container_requests(&inner, &pod.uid, container);
        if self.skipped(&inner, &pod.uid) {
            return ProviderHints::new();
        }
        if let Some(blocks) = inner.state.blocks(&pod.uid, &container.name) {
            return Self::regenerated(blocks, &requests);
        }
        let hints =
            policy::calculate_hints(&inner.state.machine, &inner.reusable, &pod.uid, &requests);
        hints_for(&requests, hints)
    }

    fn regenerated(blocks: &[MemoryBlock], requests: &Requests) -> ProviderHints {
        match policy::regenerate_hints(blocks, requests) {
            None => ProviderHints::new(),
            Some(m) => m
                .into_iter()
                .map(|(k, v)| (k, ResourceHints::Hints(v)))
                .collect(),
        }
    }

    /// Pod-scope hints (`GetPodTopologyHints`).
    pub fn pod_hints(&self, pod: &PodSpec) -> ProviderHints {
        if self.policy == MemoryPolicyName::None {
            return ProviderHints::new();
        }
        let inner = self.lock();
        if !self.guaranteed(&inner, &pod.uid) {
            return ProviderHints::new();
        }
        let Some(requests) = self.pod_requests(&inner, pod) else {
            return ProviderHints::new();
        };
        if self.skipped(&inner, &pod.uid) {
            return ProviderHints::new();
        }
        // An empty shared pool: every requested resource gets an empty list (no hint fits).
        if let Some(info) = inner.pods.get(&pod.uid)
            && info.managed_at_pod_level(self.gates)
            && self
                .validate_pod_shared_memory(&inner, info, &requests)
                .is_err()
        {
            return requests
                .keys()
                .map(|k| (k.clone(), ResourceHints::Hints(vec![])))
                .collect();
        }
        if requests.is_empty() {
            return ProviderHints::new();
        }
        // As upstream, the first container already holding blocks decides (after a restart).
        for c in pod.all_containers() {
            if let Some(blocks) = inner.state.blocks(&pod.uid, &c.name) {
                return Self::regenerated(blocks, &requests);
            }
        }
        // Pod hints are computed once for all containers: no init-container reuse applies.
        let hints =
            policy::calculate_hints(&inner.state.machine, &Reusable::new(), &pod.uid, &requests);
        hints_for(&requests, hints)
    }

    /// The static policy's `Allocate` for one container, aligned with `hint` (the Topology
    /// Manager's affinity for it, or the pod's in pod scope), written to `memory_manager_state`
    /// before it returns. When the write fails the allocation is undone in memory.
    pub fn allocate_container(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<(), MemoryManagerError> {
        let Some(undo) = self.assign(pod, container, hint)? else {
            return Ok(());
        };
        self.persist().map(drop).inspect_err(|_| {
            let mut inner = self.lock();
            // Put back what was there unless something else changed the state meanwhile.
            if inner.version == undo.version {
                inner.state = undo.state;
                inner.reusable = undo.reusable;
                inner.version += 1;
            }
        })
    }

    /// [`MemoryManager::allocate_container`] in memory only: the file gets the blocks with the
    /// next [`MemoryManager::persist`]. A pod whose persist fails is rolled back with
    /// [`MemoryManager::remove_pod`].
    pub fn assign_container(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<(), MemoryManagerError> {
        self.assign(pod, container, hint).map(drop)
    }

    fn assign(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<Option<Undo>, MemoryManagerError> {
        if self.policy == MemoryPolicyName::None {
            return Ok(None);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !self.guaranteed(inner, &pod.uid) || self.skipped(inner, &pod.uid) {
            return Ok(None);
        }
        if let Some(blocks) = inner.state.blocks(&pod.uid, &container.name).cloned() {
            policy::update_reusable(&mut inner.reusable, pod, &container.name, &blocks);
            return Ok(None);
        }
        let requests = self.container_requests(inner, &pod.uid, container);
        let mask = Self::resolve_hint(inner, &pod.uid, &requests, hint)?;
        let undo = Undo {
            version: 0,
            state: inner.state.clone(),
            reusable: inner.reusable.clone(),
        };
        let affinity: Vec<usize> = mask.nodes().collect();
        let mut blocks = Vec::with_capacity(requests.len());
        for (name, &size) in &requests {
            blocks.push(MemoryBlock {
                numa_affinity: affinity.clone(),
                resource: name.clone(),
                size,
            });
            let reuse = policy::reusable_of(&inner.reusable, &pod.uid, mask, name);
            let take = size.saturating_sub(reuse);
            policy::place(&mut inner.state.machine, &affinity, name, take);
        }
        policy::update_reusable(&mut inner.reusable, pod, &container.name, &blocks);
        inner
            .state
            .assignments
            .entry(pod.uid.clone())
            .or_default()
            .insert(container.name.clone(), blocks.clone());
        policy::shrink_init_blocks(&mut inner.state, pod, &container.name, &blocks);
        inner.version += 1;
        Ok(Some(Undo {
            version: inner.version,
            ..undo
        }))
    }

    /// The NUMA nodes an allocation of `requests` uses under the Topology Manager's `hint`:
    /// the default hint when it has no affinity, widened when its nodes cannot hold the
    /// requests; refused when it would mix single- and cross-NUMA allocations on a node.
    fn resolve_hint(
        inner: &Inner,
        pod_uid: &str,
        requests: &Requests,
        hint: &TopologyHint,
    ) -> Result<devicelet_topology::NumaMask, MemoryManagerError> {
        let machine = &inner.state.machine;
        let mut best = *hint;
        if best.affinity.is_none() {
            let hints = policy::calculate_hints(machine, &inner.reusable, pod_uid, requests)
                .ok_or(MemoryManagerError::NoDefaultAffinity)?;
            let default = Self::best_memory_hint(requests, &hints);
            if !default.preferred && best.preferred {
                return Err(MemoryManagerError::NoDefaultPreferredHint);
            }
            best = default;
        }
        let mask = best.affinity.unwrap_or_default();
        if !policy::affinity_satisfies(machine, mask, requests) {
            let hints = policy::calculate_hints(machine, &inner.reusable, pod_uid, requests)
                .unwrap_or_default();
            let containing: Vec<TopologyHint> = if requests.contains_key(MEMORY_RESOURCE) {
                hints
                    .into_iter()
                    .filter(|h| h.affinity.is_some_and(|a| mask.is_subset_of(a)))
                    .collect()
            } else {
                vec![]
            };
            let extended =
                policy::find_best_hint(&containing).ok_or(MemoryManagerError::CannotExtendHint)?;
            if !extended.preferred && best.preferred {
                return Err(MemoryManagerError::NoExtendedPreferredHint);
            }
            best = extended;
        }
        let mask = best.affinity.unwrap_or_default();
        if policy::violates_numa_allocations(machine, mask) {
            return Err(MemoryManagerError::ViolatesNumaAllocation);
        }
        Ok(mask)
    }

    /// `validatePodScopeResources` (memory): under pod-level management, the containers that
    /// use the pod's shared memory must find some of each resource. Err: the kubelet's text.
    fn validate_pod_shared_memory(
        &self,
        inner: &Inner,
        info: &PodCpuInfo,
        total: &Requests,
    ) -> Result<(), String> {
        let mut shared_long_running = false;
        let mut exclusive: Requests = Requests::new();
        for c in &info.spec.init_containers {
            let reqs = self.container_requests(inner, &info.spec.uid, c);
            if !c.restartable {
                if reqs.is_empty() {
                    for (name, &pool) in total {
                        if exclusive.get(name).copied().unwrap_or(0) >= pool {
                            return Err(format!(
                                "pod rejected, pod has shared init containers but no {name} available for them"
                            ));
                        }
                    }
                }
            } else if reqs.is_empty() {
                shared_long_running = true;
            } else {
                for (name, v) in reqs {
                    let e = exclusive.entry(name).or_insert(0);
                    *e = e.wrapping_add(v);
                }
            }
        }
        for c in &info.spec.containers {
            let reqs = self.container_requests(inner, &info.spec.uid, c);
            if reqs.is_empty() {
                shared_long_running = true;
            } else {
                for (name, v) in reqs {
                    let e = exclusive.entry(name).or_insert(0);
                    *e = e.wrapping_add(v);
                }
            }
        }
        if shared_long_running {
            for (name, &pool) in total {
                if exclusive.get(name).copied().unwrap_or(0) >= pool {
                    return Err(format!(
                        "pod rejected, sum of exclusive container {name} requests equals pod budget, leaving no memory for shared containers"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The static policy's `AllocatePod` (KEP-5526), in memory only like
    /// [`MemoryManager::assign_container`]: the pod's own memory and hugepages requests are
    /// placed on the pod's NUMA nodes (the Topology Manager's pod `hint`, defaulted or widened
    /// as for a container) and recorded as the pod's entry; containers Guaranteed on their own
    /// get blocks of their own requests, a regular init container without its own gets the
    /// whole pod amount minus the sidecars' so far, and every other container shares what the
    /// app containers and sidecars left. Only the pod's amounts count against the machine.
    pub fn assign_pod(&self, pod: &PodSpec, hint: &TopologyHint) -> Result<(), MemoryManagerError> {
        if self.policy == MemoryPolicyName::None {
            return Ok(());
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(info) = inner.pods.get(&pod.uid).cloned() else {
            return Ok(());
        };
        if info.qos_with(self.gates) != QosClass::Guaranteed {
            return Ok(());
        }
        // The kubelet logs a failure to read the amounts and admits the pod without memory.
        let Some(total) = self.pod_requests(inner, pod) else {
            return Ok(());
        };
        self.validate_pod_shared_memory(inner, &info, &total)
            .map_err(MemoryManagerError::EmptyPodSharedPool)?;
        // Deliberate deviation, as for CPUs: a pod admitted again keeps what it holds.
        if inner.state.pod_entries.contains_key(&pod.uid) {
            return Ok(());
        }
        let mask = Self::resolve_hint(inner, &pod.uid, &total, hint)?;
        let affinity: Vec<usize> = mask.nodes().collect();
        let blocks_of = |amounts: &Requests| -> Vec<MemoryBlock> {
            amounts
                .iter()
                .filter(|(_, v)| **v > 0)
                .map(|(name, &size)| MemoryBlock {
                    numa_affinity: affinity.clone(),
                    resource: name.clone(),
                    size,
                })
                .collect()
        };
        // Go's unsigned arithmetic wraps; valid pods never get there (the API server keeps
        // the containers' requests within the pod's).
        let minus = |a: &Requests, b: &Requests| -> Requests {
            a.iter()
                .map(|(k, v)| (k.clone(), v.wrapping_sub(b.get(k).copied().unwrap_or(0))))
                .collect()
        };
        let mut exclusive: BTreeMap<String, Vec<MemoryBlock>> = BTreeMap::new();
        let mut sidecars = Requests::new();
        for c in &pod.init_containers {
            let reqs = self.container_requests(inner, &pod.uid, c);
            if reqs.is_empty() {
                if !c.restartable {
                    exclusive.insert(c.name.clone(), blocks_of(&minus(&total, &sidecars)));
                }
                continue;
            }
            exclusive.insert(c.name.clone(), blocks_of(&reqs));
            if c.restartable {
                for (name, v) in reqs {
                    let e = sidecars.entry(name).or_insert(0);
                    *e = e.wrapping_add(v);
                }
            }
        }
        let mut pool = minus(&total, &sidecars);
        for c in &pod.containers {
            let reqs = self.container_requests(inner, &pod.uid, c);
            if reqs.is_empty() {
                continue;
            }
            for (name, &v) in &reqs {
                if v > 0 {
                    let e = pool.entry(name.clone()).or_insert(0);
                    *e = e.wrapping_sub(v);
                }
            }
            exclusive.insert(c.name.clone(), blocks_of(&reqs));
        }
        let shared = blocks_of(&pool);
        let pod_blocks: Vec<MemoryBlock> = total
            .iter()
            .map(|(name, &size)| MemoryBlock {
                numa_affinity: affinity.clone(),
                resource: name.clone(),
                size,
            })
            .collect();
        for (name, &size) in &total {
            policy::place(&mut inner.state.machine, &affinity, name, size);
        }
        inner.state.pod_entries.insert(pod.uid.clone(), pod_blocks);
        let slot = inner.state.assignments.entry(pod.uid.clone()).or_default();
        for c in pod.all_containers() {
            let blocks = exclusive
                .get(&c.name)
                .cloned()
                .unwrap_or_else(|| shared.clone());
            slot.insert(c.name.clone(), blocks);
        }
        inner.version += 1;
        Ok(())
    }

    /// The pod-level feature gates this manager reads.
    pub fn pod_level_gates(&self) -> PodLevelGates {
        self.gates
    }

    /// The best hint of the `memory` list (the kubelet looks only at regular memory).
    fn best_memory_hint(requests: &Requests, hints: &[TopologyHint]) -> TopologyHint {
        if requests.contains_key(MEMORY_RESOURCE) {
            policy::find_best_hint(hints).unwrap_or_default()
        } else {
            TopologyHint::default()
        }
    }

    /// `RemoveContainer`: releases the container's blocks. When the file cannot be written the
    /// memory is still released in memory and the error returned (the kubelet only logs).
    pub fn remove_container(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Result<(), MemoryManagerError> {
        if !Self::free_container(&mut self.lock(), pod_uid, container) {
            return Ok(());
        }
        self.persist().map(drop)
    }

    fn free_container(inner: &mut Inner, pod_uid: &str, container: &str) -> bool {
        // A pod managed at pod level releases the pod's memory with its last container; the
        // containers' blocks are parts of it.
        if let Some(pod_blocks) = inner.state.pod_entries.get(pod_uid).cloned() {
            let had = inner.state.blocks(pod_uid, container).is_some();
            inner.state.delete(pod_uid, container);
            if !inner.state.assignments.contains_key(pod_uid) {
                policy::release(&mut inner.state.machine, &pod_blocks);
                inner.state.pod_entries.remove(pod_uid);
                inner.version += 1;
                return true;
            }
            if had {
                inner.version += 1;
            }
            return had;
        }
        let Some(blocks) = inner.state.blocks(pod_uid, container).cloned() else {
            return false;
        };
        inner.state.delete(pod_uid, container);
        policy::release(&mut inner.state.machine, &blocks);
        inner.version += 1;
        true
    }

    /// Removes every container of a pod and forgets the pod, in one write.
    pub fn remove_pod(&self, pod_uid: &str) -> Result<(), MemoryManagerError> {
        let freed = {
            let mut inner = self.lock();
            let names: Vec<String> = inner
                .state
                .assignments
                .get(pod_uid)
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default();
            let mut freed = false;
            for name in names {
                freed |= Self::free_container(&mut inner, pod_uid, &name);
            }
            // An entry left without containers (restored from a file) goes too.
            if inner.state.assignments.remove(pod_uid).is_some() {
                inner.version += 1;
                freed = true;
            }
            if let Some(blocks) = inner.state.pod_entries.remove(pod_uid) {
                policy::release(&mut inner.state.machine, &blocks);
                inner.version += 1;
                freed = true;
            }
            inner.pods.remove(pod_uid);
            inner.reusable.remove(pod_uid);
            freed
        };
        if freed {
            self.persist()?;
        }
        Ok(())
    }

    /// `removeStaleState` by pod: releases the blocks of every pod that `keep` rejects, in one
    /// write; returns their UIDs.
    pub fn retain_pods(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, MemoryManagerError> {
        let stale: Vec<String> = {
            let mut inner = self.lock();
            let stale: Vec<String> = inner
                .state
                .assignments
                .keys()
                .filter(|uid| !keep(uid))
                .cloned()
                .collect();
            for uid in &stale {
                let names: Vec<String> = inner
                    .state
                    .assignments
                    .get(uid)
                    .map(|c| c.keys().cloned().collect())
                    .unwrap_or_default();
                for name in names {
                    Self::free_container(&mut inner, uid, &name);
                }
                inner.state.assignments.remove(uid);
                inner.pods.remove(uid);
                inner.reusable.remove(uid);
            }
            if !stale.is_empty() {
                inner.version += 1;
            }
            stale
        };
        if !stale.is_empty() {
            self.persist()?;
        }
        Ok(stale)
    }

    /// The blocks of one container (`GetMemory`, for PodResources).
    pub fn memory_blocks(&self, pod_uid: &str, container: &str) -> Vec<MemoryBlock> {
        self.lock()
            .state
            .blocks(pod_uid, container)
            .cloned()
            .unwrap_or_default()
    }

    /// NUMA nodes of a container's memory (`GetMemoryNUMANodes`, for `cpuset.mems`); empty
    /// when it has no blocks.
    pub fn memory_numa_nodes(&self, pod_uid: &str, container: &str) -> Vec<usize> {
        let mut nodes: Vec<usize> = self
            .memory_blocks(pod_uid, container)
            .into_iter()
            .flat_map(|b| b.numa_affinity)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// `GetAllocatableMemory`: allocatable bytes per node and resource (non-zero only), by
    /// node then resource; empty with the `None` policy.
    pub fn allocatable_memory(&self) -> Vec<MemoryBlock> {
        if self.policy == MemoryPolicyName::None {
            return vec![];
        }
        let inner = self.lock();
        let mut out = vec![];
        for (&id, node) in &inner.state.machine {
            for (name, t) in &node.memory_map {
                if t.allocatable == 0 {
                    continue;
                }
                out.push(MemoryBlock {
                    numa_affinity: vec![id],
                    resource: name.clone(),
                    size: t.allocatable,
                });
            }
        }
        out
    }

    /// Assignments by pod and container (for inspection).
    pub fn assignments(&self) -> BTreeMap<String, BTreeMap<String, Vec<MemoryBlock>>> {
        self.lock().state.assignments.clone()
    }
}

impl HintProvider for MemoryManager {
    fn get_topology_hints(&self, pod: &PodSpec, container: &ContainerSpec) -> ProviderHints {
        self.container_hints(pod, container)
    }

    fn get_pod_topology_hints(&self, pod: &PodSpec) -> ProviderHints {
        self.pod_hints(pod)
    }

    fn allocate(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        affinity: &TopologyHint,
    ) -> Result<(), ProviderError> {
        self.allocate_container(pod, container, affinity)
            .map_err(|e| Box::new(e) as ProviderError)
    }
}
