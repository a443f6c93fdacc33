//! The CPU manager with the kubelet's `none` and `static` policies, after
//! `cpumanager/cpu_manager.go` (construction, reserved CPUs, state), `policy_none.go`,
//! `policy_static.go` (`Allocate`, `RemoveContainer`, `validateState`, `GetTopologyHints`,
//! `GetPodTopologyHints`, `generateCPUTopologyHints`, `updateCPUsToReuse`) and
//! `policy_options.go` (every 1.36.3 option, parsed in [`crate::options`]).
//!
//! `strict-cpu-reservation`: the reserved CPUs are left out of `defaultCpuSet` itself (so of
//! the shared pool and of the checkpoint), exactly as `validateState` initialises it.
//! `align-by-socket`: hints spanning the fewest sockets are preferred too, and the allocation
//! first takes CPUs from the sockets of the hint's NUMA nodes.
//!
//! The Topology Manager talks to it through [`HintProvider`]; its pod view ([`PodSpec`]) has no
//! QoS class, so admission registers each pod's [`PodCpuInfo`] first
//! ([`CpuManager::register_pod`]); an unregistered pod gets no exclusive CPUs.
//!
//! Pod-level resource management (KEP-5526; `PodLevelResourceManagers` with
//! `PodLevelResources`, read from `featureGates`) follows `policy_static.go` `AllocatePod`,
//! `podGuaranteedCPUs`, `validatePodScopeResources` and `RemoveContainer`: a pod with
//! `spec.resources` gets one set of CPUs for its own whole CPU request
//! ([`CpuManager::assign_pod`], recorded as its `podEntries` set), split among its containers,
//! and released with its last container. With the gates off such a pod gets nothing, as in the
//! kubelet.
//!
//! CPU hints are returned as a [`HintFamily`] (free CPUs as items, init-container CPUs to reuse
//! as required units), so the merge never enumerates NUMA subsets.
//!
//! Every change is made in memory and given a version; [`CpuManager::persist`] writes
//! `cpu_manager_state` (an fsync) when the file lacks the newest version. Admission assigns
//! CPUs in memory ([`CpuManager::assign_container`]) under its lock and persists once per pod
//! after releasing it, so concurrent admissions share writes; the other public changes
//! ([`CpuManager::allocate_container`], removals) persist before they return.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use devicelet_checkpoint::cpuset::CpuSet;
use devicelet_topology::{
    ContainerSpec, FeatureGates, HintFamily, HintProvider, NumaMask, PodSpec, ProviderError,
    ProviderHints, ResourceHints, TopologyHint,
};

use crate::assign::take_by_topology_with;
use crate::bits::CpuBits;
use crate::error::CpuManagerError;
use crate::options::StaticPolicyOptions;
use crate::pod::{PodCpuInfo, PodLevelGates};
use crate::state::{CheckpointFile, CpuState};
use crate::topology::CpuTopology;

/// The resource name CPU hints are given under.
pub const CPU_RESOURCE: &str = "cpu";

/// `cpuManagerPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuPolicyName {
    /// No exclusive CPUs; every container may use every CPU.
    None,
    /// Exclusive integer CPUs for Guaranteed pods.
    Static,
}

impl CpuPolicyName {
    /// The configuration / checkpoint spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            CpuPolicyName::None => "none",
            CpuPolicyName::Static => "static",
        }
    }
}

impl std::str::FromStr for CpuPolicyName {
    type Err = CpuManagerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" | "" => Ok(CpuPolicyName::None),
            "static" => Ok(CpuPolicyName::Static),
            other => Err(CpuManagerError::UnknownPolicy(other.to_string())),
        }
    }
}

/// CPUs kept for the system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReservedCpus {
    /// `reservedSystemCPUs`, a CPU list such as `0,64` or `0-1`.
    List(String),
    /// Whole CPUs from `kubeReserved.cpu + systemReserved.cpu` (rounded up); picked with
    /// `takeByTopology` like the kubelet.
    Count(usize),
}

impl ReservedCpus {
    /// From KubeletConfiguration fields, as `cpu_manager.go` derives them: a non-empty
    /// `reservedSystemCPUs` wins; otherwise `kubeReserved.cpu + systemReserved.cpu` rounded up
    /// to whole CPUs (fractional CPUs cannot be reserved exclusively).
    pub fn from_kubelet_config(
        reserved_system_cpus: Option<&str>,
        kube_reserved_cpu: Option<&str>,
        system_reserved_cpu: Option<&str>,
    ) -> Result<ReservedCpus, CpuManagerError> {
        if let Some(list) = reserved_system_cpus
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            return Ok(ReservedCpus::List(list.to_string()));
        }
        let mut millis: i128 = 0;
        for q in [kube_reserved_cpu, system_reserved_cpu]
            .into_iter()
            .flatten()
        {
            let parsed = crate::pod::Quantity::parse(q)
                .map_err(|e| CpuManagerError::BadReservedList(q.to_string(), e.to_string()))?;
            millis += parsed.milli_value_ceil().max(0);
        }
        let count = usize::try_from((millis + 999) / 1000).map_err(|_| {
            CpuManagerError::BadReservedList(format!("{millis}m"), "too large".into())
        })?;
        Ok(ReservedCpus::Count(count))
    }
}

/// Configuration (KubeletConfiguration field names in the comments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuManagerConfig {
    /// `cpuManagerPolicy`: `none` or `static`.
    pub policy: String,
    /// `reservedSystemCPUs` or the reserved count.
    pub reserved: ReservedCpus,
    /// `cpuManagerPolicyOptions`.
    pub policy_options: BTreeMap<String, String>,
    /// `featureGates` (the options' stage gates); `Default` is 1.36.3's defaults.
    pub feature_gates: FeatureGates,
    /// `topologyManagerPolicy`, which `align-by-socket` is checked against.
    pub topology_manager_policy: String,
}

struct Inner {
    state: CpuState,
    /// Increases with every change of `state`; the file holds [`CpuManager::written`].
    version: u64,
    /// pod UID → CPUs of finished-allocation init containers that later containers may reuse.
    cpus_to_reuse: HashMap<String, CpuBits>,
    pods: HashMap<String, PodCpuInfo>,
}

/// What [`CpuManager::assign_container`] changed, so that a failed write can undo it.
struct Assigned {
    pod_uid: String,
    container: String,
    cpus: CpuBits,
    reuse_before: HashMap<String, CpuBits>,
}

/// The CPU manager.
pub struct CpuManager {
    topology: CpuTopology,
    policy: CpuPolicyName,
    options: StaticPolicyOptions,
    reserved: CpuBits,
    /// Every thread of the cores holding a reserved CPU (`reservedPhysicalCPUs`).
    reserved_physical: CpuBits,
    checkpoint: CheckpointFile,
    /// `PodLevelResources` / `PodLevelResourceManagers`.
    gates: PodLevelGates,
    inner: Mutex<Inner>,
    /// The version of `state` the file holds. Held for the whole write (lock order: this, then
    /// `inner`), so writes are serialised and each writes the newest state: an older state can
    /// never overwrite a newer one.
    written: Mutex<u64>,
}

impl std::fmt::Debug for CpuManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuManager")
            .field("policy", &self.policy)
            .field("reserved", &self.reserved.to_string())
            .field("checkpoint", &self.checkpoint.path())
            .finish()
    }
}

impl CpuManager {
    /// `NewManager` + `Start`: parses the configuration, picks the reserved CPUs, restores
    /// `<state_dir>/cpu_manager_state` (or creates it) and validates it against the machine.
    pub fn new(
        topology: CpuTopology,
        config: &CpuManagerConfig,
        state_dir: &Path,
    ) -> Result<Self, CpuManagerError> {
        let policy: CpuPolicyName = config.policy.parse()?;
        let gates = PodLevelGates::from_gates(&config.feature_gates);
        // The kubelet's state layout follows `PodLevelResourceManagers` alone.
        let checkpoint =
            CheckpointFile::new(state_dir, policy.as_str()).with_pod_level(gates.managers);
        let (options, reserved) = match policy {
            CpuPolicyName::None => {
                if !config.policy_options.is_empty() {
                    // Go prints the map with `%v`: sorted `key:value` pairs.
                    let pairs: Vec<String> = config
                        .policy_options
                        .iter()
                        .map(|(k, v)| format!("{k}:{v}"))
                        .collect();
                    return Err(CpuManagerError::NonePolicyOptions(pairs.join(" ")));
                }
                (StaticPolicyOptions::default(), CpuBits::new())
            }
            CpuPolicyName::Static => {
                let options =
                    StaticPolicyOptions::parse(&config.policy_options, &config.feature_gates)?;
                options.validate_with_topology(&topology, &config.topology_manager_policy)?;
                let reserved = Self::pick_reserved(&topology, &config.reserved, &options)?;
                (options, reserved)
            }
        };
        let mut reserved_physical = CpuBits::new();
        for cpu in reserved.iter() {
            if let Some(core) = topology
                .info(cpu)
                .and_then(|i| topology.cores().get(&i.core))
            {
                reserved_physical = reserved_physical.union(core);
            }
        }
        let restored = checkpoint.load()?;
        let mut changed = restored.is_none();
        let mut state = restored.unwrap_or_default();
        if policy == CpuPolicyName::Static {
            changed |= Self::validate_state(&topology, &reserved, &options, &mut state)?;
        }
        if changed {
            checkpoint.store(&state)?;
        }
        Ok(CpuManager {
            topology,
            policy,
            options,
            reserved,
            reserved_physical,
            checkpoint,
            gates,
            inner: Mutex::new(Inner {
                state,
                version: 0,
                cpus_to_reuse: HashMap::new(),
                pods: HashMap::new(),
            }),
            written: Mutex::new(0),
        })
    }

    fn pick_reserved(
        topology: &CpuTopology,
        reserved: &ReservedCpus,
        options: &StaticPolicyOptions,
    ) -> Result<CpuBits, CpuManagerError> {
        let all = topology.all_cpus();
        match reserved {
            ReservedCpus::List(s) => {
                let set = CpuSet::parse(s.trim())
                    .map_err(|e| CpuManagerError::BadReservedList(s.clone(), e.to_string()))?;
                let bits = CpuBits::from_cpuset(&set);
                if bits.is_empty() {
                    return Err(CpuManagerError::NoReservedCpus);
                }
                if !bits.is_subset_of(all) {
                    return Err(CpuManagerError::ReservedNotOnMachine {
                        reserved: bits.to_string(),
                        all: all.to_string(),
                    });
                }
                Ok(bits)
            }
            ReservedCpus::Count(0) => Err(CpuManagerError::NoReservedCpus),
            // The kubelet picks them with the policy's own take, options included.
            ReservedCpus::Count(n) => match take_by_topology_with(topology, all, *n, options) {
                Ok(bits) if bits.len() == *n => Ok(bits),
                Ok(bits) => Err(CpuManagerError::ReserveFailed {
                    got: bits.to_string(),
                    want: *n,
                }),
                Err(_) => Err(CpuManagerError::ReserveFailed {
                    got: String::new(),
                    want: *n,
                }),
            },
        }
    }

    /// The static policy's `validateState`; returns whether the state was initialised. With
    /// `strict-cpu-reservation` the machine's CPUs minus the reserved ones are what the state
    /// must account for, and the reserved CPUs must not be in `defaultCpuSet`.
    fn validate_state(
        topology: &CpuTopology,
        reserved: &CpuBits,
        options: &StaticPolicyOptions,
        state: &mut CpuState,
    ) -> Result<bool, CpuManagerError> {
        let all = if options.strict_cpu_reservation {
            topology.all_cpus().difference(reserved)
        } else {
            topology.all_cpus().clone()
        };
        let all = &all;
        if state.default_cpu_set.is_empty() {
            if !state.assignments.values().all(|c| c.is_empty()) {
                return Err(CpuManagerError::InvalidState(
                    "default cpuset cannot be empty".into(),
                ));
            }
            state.default_cpu_set = all.clone();
            return Ok(true);
        }
        if options.strict_cpu_reservation {
            let present = reserved.intersection(&state.default_cpu_set);
            if !present.is_empty() {
                return Err(CpuManagerError::InvalidState(format!(
                    "some of strictly reserved cpus: \"{}\" are present in defaultCpuSet: \"{}\"",
                    present, state.default_cpu_set
                )));
            }
        } else if !reserved.is_subset_of(&state.default_cpu_set) {
            return Err(CpuManagerError::InvalidState(format!(
                "not all reserved cpus: \"{}\" are present in defaultCpuSet: \"{}\"",
                reserved, state.default_cpu_set
            )));
        }
        for (pod, containers) in &state.assignments {
            for (c, set) in containers {
                if set.intersects(&state.default_cpu_set) {
                    return Err(CpuManagerError::InvalidState(format!(
                        "pod: {pod}, container: {c} cpuset: \"{set}\" overlaps with default cpuset \"{}\"",
                        state.default_cpu_set
                    )));
                }
            }
        }
        let known = state.default_cpu_set.union(&state.assigned());
        if !known.same_as(all) {
            return Err(CpuManagerError::InvalidState(format!(
                "current set of available CPUs \"{all}\" doesn't match with CPUs in state \"{known}\""
            )));
        }
        Ok(false)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the state half-written: no step of a
        // change can fail or panic once the state is being modified (the CPU search runs first).
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `cpu_manager_state` (atomic, fsynced) when memory holds changes the file lacks;
    /// returns whether it wrote. Blocking: async callers run it off their workers. Writes are
    /// serialised and each takes the newest state when its turn comes, so one write covers
    /// every change made before it started (concurrent admissions share it) and an older
    /// state never replaces a newer one. A failed write changes nothing in memory: the next
    /// call writes again.
    pub fn persist(&self) -> Result<bool, CpuManagerError> {
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

    /// The `cpu_manager_state` file.
    pub fn state_file(&self) -> &Path {
        self.checkpoint.path()
    }

    /// The policy in force.
    pub fn policy(&self) -> CpuPolicyName {
        self.policy
    }

    /// The machine.
    pub fn topology(&self) -> &CpuTopology {
        &self.topology
    }

    /// CPUs never handed out exclusively.
    pub fn reserved_cpus(&self) -> CpuSet {
        self.reserved.to_cpuset()
    }

    /// The shared pool (`defaultCpuSet`).
    pub fn default_cpu_set(&self) -> CpuSet {
        self.lock().state.default_cpu_set.to_cpuset()
    }

    /// A copy of the state: default set and exclusive assignments.
    pub fn state(&self) -> CpuState {
        self.lock().state.clone()
    }

    /// CPUs a new exclusive allocation may use (`GetAvailableCPUs`: default − reserved).
    pub fn available_cpus(&self) -> CpuSet {
        let inner = self.lock();
        inner
            .state
            .default_cpu_set
            .difference(&self.reserved)
            .to_cpuset()
    }

    /// Tells the manager a pod's QoS class and CPU requests; call before admission.
    pub fn register_pod(&self, pod: &PodCpuInfo) {
        self.lock().pods.insert(pod.spec.uid.clone(), pod.clone());
    }

    /// The runtime's answer (`cpusetCpus`): the container's exclusive CPUs, else the shared
    /// pool; with the none policy every CPU.
    pub fn cpuset_for(&self, pod_uid: &str, container: &str) -> CpuSet {
        if self.policy == CpuPolicyName::None {
            return self.topology.all_cpus().to_cpuset();
        }
        let inner = self.lock();
        match inner.state.get(pod_uid, container) {
            Some(set) => set.to_cpuset(),
            None => inner.state.default_cpu_set.to_cpuset(),
        }
    }

    fn guaranteed_cpus(&self, inner: &Inner, pod_uid: &str, container: &str) -> usize {
        inner
            .pods
            .get(pod_uid)
            .map_or(0, |p| p.guaranteed_cpus_with(self.gates, container))
    }

    /// A pod with pod-level resources that the gates keep from the manager: the kubelet gives
    /// it no hints and no CPUs ("allocation skipped").
    fn skipped(&self, inner: &Inner, pod_uid: &str) -> bool {
        inner
            .pods
            .get(pod_uid)
            .is_some_and(|p| p.skipped_for_pod_level(self.gates))
    }

    /// The feature gates this manager reads for pod-level resources.
    pub fn pod_level_gates(&self) -> PodLevelGates {
        self.gates
    }

    /// Whether the pod is managed at pod level: the gates are on and it has pod-level
    /// resources (the Topology Manager's pod scope then calls [`CpuManager::assign_pod`]).
    pub fn manages_at_pod_level(&self, pod_uid: &str) -> bool {
        self.lock()
            .pods
            .get(pod_uid)
            .is_some_and(|p| p.managed_at_pod_level(self.gates))
    }

    /// The static policy's `Allocate` for one container, aligned with `hint` (the Topology
    /// Manager's merged affinity), written to `cpu_manager_state` before it returns. When the
    /// write fails the allocation is undone in memory and the error returned.
    pub fn allocate_container(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<(), CpuManagerError> {
        let Some(assigned) = self.assign(pod, container, hint)? else {
            return Ok(());
        };
        self.persist()
            .map(drop)
            .inspect_err(|_| self.unassign(assigned))
    }

    /// [`CpuManager::allocate_container`] in memory only: the file gets the CPUs with the next
    /// [`CpuManager::persist`], which admission calls once per pod outside its lock. A pod whose
    /// persist fails is rolled back with [`CpuManager::remove_pod`].
    pub fn assign_container(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<(), CpuManagerError> {
        self.assign(pod, container, hint).map(drop)
    }

    /// Gives back the CPUs of an allocation whose write failed, leaving memory as it was
    /// before it (other changes made meanwhile are kept). CPUs the container reused from an
    /// init container stay with that init container, as in any removal
    /// ([`CpuManager::free_container`]).
    fn unassign(&self, assigned: Assigned) {
        let mut inner = self.lock();
        let current = inner.state.get(&assigned.pod_uid, &assigned.container);
        if current != Some(&assigned.cpus) {
            return;
        }
        Self::free_container(&mut inner, &assigned.pod_uid, &assigned.container);
        inner.cpus_to_reuse = assigned.reuse_before;
    }

    /// The allocation itself; `Some` when it took new CPUs.
    fn assign(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<Option<Assigned>, CpuManagerError> {
        if self.policy == CpuPolicyName::None {
            return Ok(None);
        }
        let mut inner = self.lock();
        let count = self.guaranteed_cpus(&inner, &pod.uid, &container.name);
        if count == 0 || self.skipped(&inner, &pod.uid) {
            return Ok(None);
        }
        // Deliberate deviation (not in the spec's bug list): the kubelet runs the
        // full-pcpus-only checks before looking up an existing assignment, so a container
        // re-admitted after a restart can be rejected for lack of free cores it no longer
        // needs; we look the assignment up first so re-admission is idempotent.
        if let Some(set) = inner.state.get(&pod.uid, &container.name).cloned() {
            Self::update_cpus_to_reuse(&mut inner, pod, container, &set);
            return Ok(None);
        }
        self.enforce_smt_alignment(&inner, count)?;
        let reusable = inner
            .cpus_to_reuse
            .get(&pod.uid)
            .cloned()
            .unwrap_or_default();
        let result = self.choose_cpus(&inner, count, hint.affinity, &reusable)?;

        let reuse_before = inner.cpus_to_reuse.clone();
        let state = &mut inner.state;
        state.default_cpu_set = state.default_cpu_set.difference(&result);
        state
            .assignments
            .entry(pod.uid.clone())
            .or_default()
            .insert(container.name.clone(), result.clone());
        inner.version += 1;
        Self::update_cpus_to_reuse(&mut inner, pod, container, &result);
        Ok(Some(Assigned {
            pod_uid: pod.uid.clone(),
            container: container.name.clone(),
            cpus: result,
            reuse_before,
        }))
    }

    /// `enforceSMTAlignment` (`full-pcpus-only`).
    fn enforce_smt_alignment(&self, inner: &Inner, count: usize) -> Result<(), CpuManagerError> {
        if self.options.full_pcpus_only {
            let per_core = self.topology.cpus_per_core().max(1);
            if !count.is_multiple_of(per_core) {
                return Err(CpuManagerError::SmtNotMultiple {
                    requested: count,
                    cpus_per_core: per_core,
                });
            }
            // `GetAvailablePhysicalCPUs`: the shared pool minus every thread of the reserved
            // cores (not a count of wholly free cores).
            let physical = inner
                .state
                .default_cpu_set
                .difference(&self.reserved_physical)
                .len();
            if count > physical {
                return Err(CpuManagerError::SmtNotEnoughPhysical {
                    available: physical,
                    requested: count,
                    cpus_per_core: per_core,
                });
            }
        }
        Ok(())
    }

    /// `allocateCPUs` without its state change: `count` CPUs from the free ones (minus the
    /// reserved) plus `reusable`, those in the hint's NUMA nodes (or their sockets under
    /// `align-by-socket`) first.
    fn choose_cpus(
        &self,
        inner: &Inner,
        count: usize,
        affinity: Option<NumaMask>,
        reusable: &CpuBits,
    ) -> Result<CpuBits, CpuManagerError> {
        let available = inner.state.default_cpu_set.difference(&self.reserved);
        let allocatable = available.union(reusable);
        let mut result = CpuBits::new();
        if let Some(mask) = affinity {
            let region = if self.options.align_by_socket {
                self.topology.cpus_in_sockets_of_numa_mask(mask)
            } else {
                self.topology.cpus_in_numa_mask(mask)
            };
            let aligned = allocatable.intersection(&region);
            let take = aligned.len().min(count);
            result = take_by_topology_with(&self.topology, &aligned, take, &self.options)?;
        }
        let rest = take_by_topology_with(
            &self.topology,
            &allocatable.difference(&result),
            count - result.len(),
            &self.options,
        )?;
        Ok(result.union(&rest))
    }

    /// The static policy's `AllocatePod` (KEP-5526), in memory only like
    /// [`CpuManager::assign_container`]: one set of CPUs for the whole pod (its own whole CPU
    /// request, aligned with the pod's `hint`), recorded as the pod's entry, then split among
    /// its containers. Containers Guaranteed on their own take exclusive CPUs from it
    /// (regular init containers from all of it but the sidecars' CPUs taken so far; sidecars
    /// and app containers for good); a regular init container without its own CPUs gets all of
    /// it but the sidecars'; every other container shares what the exclusive ones left.
    pub fn assign_pod(&self, pod: &PodSpec, hint: &TopologyHint) -> Result<(), CpuManagerError> {
        if self.policy == CpuPolicyName::None {
            return Ok(());
        }
        let mut inner = self.lock();
        let Some(info) = inner.pods.get(&pod.uid).cloned() else {
            return Ok(());
        };
        let total = info.pod_guaranteed_cpus_with(self.gates);
        if total == 0 {
            return Ok(());
        }
        validate_pod_shared_cpus(&info, self.gates).map_err(CpuManagerError::EmptyPodSharedPool)?;
        // Deliberate deviation, as in `assign`: the kubelet allocates again when a pod is
        // admitted twice; devicelet keeps what the pod already holds (re-admission after a
        // restart is idempotent).
        if inner.state.pod_entries.contains_key(&pod.uid) {
            return Ok(());
        }
        self.enforce_smt_alignment(&inner, total)?;
        let pod_set = self.choose_cpus(&inner, total, hint.affinity, &CpuBits::new())?;

        // The split is computed before anything changes, so a failure leaves the state as it
        // was (the kubelet has by then taken the pod's CPUs and leaves them to nobody).
        let mut exclusive: BTreeMap<String, CpuBits> = BTreeMap::new();
        let mut sidecars = CpuBits::new();
        for c in &pod.init_containers {
            let n = info.guaranteed_cpus_with(self.gates, &c.name);
            if n > 0 {
                let pool = pod_set.difference(&sidecars);
                let set = take_by_topology_with(&self.topology, &pool, n, &self.options)?;
                if c.restartable {
                    sidecars = sidecars.union(&set);
                }
                exclusive.insert(c.name.clone(), set);
            } else if !c.restartable {
                exclusive.insert(c.name.clone(), pod_set.difference(&sidecars));
            }
        }
        let mut shared = pod_set.difference(&sidecars);
        for c in &pod.containers {
            let n = info.guaranteed_cpus_with(self.gates, &c.name);
            if n > 0 {
                let set = take_by_topology_with(&self.topology, &shared, n, &self.options)?;
                shared = shared.difference(&set);
                exclusive.insert(c.name.clone(), set);
            }
        }

        let state = &mut inner.state;
        state.default_cpu_set = state.default_cpu_set.difference(&pod_set);
        state.pod_entries.insert(pod.uid.clone(), pod_set);
        let slot = state.assignments.entry(pod.uid.clone()).or_default();
        for c in pod.all_containers() {
            let set = exclusive
                .get(&c.name)
                .cloned()
                .unwrap_or_else(|| shared.clone());
            slot.insert(c.name.clone(), set);
        }
        inner.version += 1;
        Ok(())
    }

    /// `updateCPUsToReuse`: one pod at a time; regular init containers add their CPUs,
    /// sidecars and app containers consume them.
    fn update_cpus_to_reuse(
        inner: &mut Inner,
        pod: &PodSpec,
        container: &ContainerSpec,
        set: &CpuBits,
    ) {
        inner.cpus_to_reuse.retain(|uid, _| *uid == pod.uid);
        let entry = inner.cpus_to_reuse.entry(pod.uid.clone()).or_default();
        let is_regular_init = pod
            .init_containers
            .iter()
            .any(|c| c.name == container.name && !c.restartable);
        *entry = if is_regular_init {
            entry.union(set)
        } else {
            entry.difference(set)
        };
    }

    /// `RemoveContainer`: gives the container's CPUs back to the shared pool, except those a
    /// sibling in the same pod still holds (app containers reusing init-container CPUs). When
    /// the file cannot be written the CPUs are still freed in memory and the error returned
    /// (the kubelet panics instead, `state_checkpoint.go` `storeState`).
    pub fn remove_container(&self, pod_uid: &str, container: &str) -> Result<(), CpuManagerError> {
        if !Self::free_container(&mut self.lock(), pod_uid, container) {
            return Ok(());
        }
        // The CPUs are freed in memory even when the write fails (EIO, a full disk): the file
        // then still lists them, an over-reservation but never a second owner, and the next
        // successful write (always of the whole state) drops them. Keeping them would leak them
        // for good, because a failed admission is rolled back on the same failing disk.
        self.persist().map(drop)
    }

    /// Frees one container's CPUs in memory; whether it held any.
    fn free_container(inner: &mut Inner, pod_uid: &str, container: &str) -> bool {
        let state = &mut inner.state;
        let Some(pod) = state.assignments.get_mut(pod_uid) else {
            return false;
        };
        let Some(set) = pod.remove(container) else {
            return false;
        };
        // A pod managed at pod level gives its whole set back with its last container; its
        // containers' sets are parts of it (only pods restored or admitted with
        // `PodLevelResourceManagers` have an entry).
        if let Some(pod_set) = state.pod_entries.get(pod_uid).cloned() {
            if pod.is_empty() {
                state.assignments.remove(pod_uid);
                state.pod_entries.remove(pod_uid);
                state.default_cpu_set = state.default_cpu_set.union(&pod_set);
            }
            inner.version += 1;
            return true;
        }
        let in_use = pod.values().fold(CpuBits::new(), |a, s| a.union(s));
        state.default_cpu_set = state.default_cpu_set.union(&set.difference(&in_use));
        if pod.is_empty() {
            state.assignments.remove(pod_uid);
        }
        inner.version += 1;
        true
    }

    /// Removes every container of a pod and forgets the pod, in one write. Every container's
    /// CPUs are freed even when writing the file fails; the write error is returned.
    pub fn remove_pod(&self, pod_uid: &str) -> Result<(), CpuManagerError> {
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
            // A pod-level set left without containers (restored from a file) goes too.
            if let Some(set) = inner.state.pod_entries.remove(pod_uid) {
                inner.state.default_cpu_set = inner.state.default_cpu_set.union(&set);
                inner.version += 1;
                freed = true;
            }
            inner.pods.remove(pod_uid);
            inner.cpus_to_reuse.remove(pod_uid);
            freed
        };
        if freed {
            self.persist()?;
        }
        Ok(())
    }

    /// `removeStaleState`: frees the CPUs of every pod that `keep` rejects (pods no longer
    /// active), in one write; returns their UIDs. Assignments of pods devicelet never
    /// acknowledged end up here too: a crash between writing `cpu_manager_state` and making the
    /// admission durable, or a failed admission's rollback that could not be written, leaves
    /// them in the file, and nothing else would ever free them. As in
    /// [`CpuManager::remove_container`], memory is updated even when the write fails.
    pub fn retain_pods(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<String>, CpuManagerError> {
        let mut inner = self.lock();
        let stale: Vec<String> = inner
            .state
            .assignments
            .keys()
            .filter(|uid| !keep(uid))
            .cloned()
            .collect();
        if stale.is_empty() {
            return Ok(stale);
        }
        for uid in &stale {
            if let Some(containers) = inner.state.assignments.remove(uid) {
                for set in containers.values() {
                    inner.state.default_cpu_set = inner.state.default_cpu_set.union(set);
                }
            }
            // The last container of a pod-level pod releases the pod's whole set.
            if let Some(set) = inner.state.pod_entries.remove(uid) {
                inner.state.default_cpu_set = inner.state.default_cpu_set.union(&set);
            }
            inner.pods.remove(uid);
            inner.cpus_to_reuse.remove(uid);
        }
        inner.version += 1;
        drop(inner);
        self.persist().map(|_| stale)
    }

    /// `generateCPUTopologyHints` as a family: a mask is a hint when every reusable CPU's node
    /// is in it and reusable + available CPUs in it cover the request; preferred when it is
    /// as narrow as the fewest nodes whose CPUs (all of them, free or not) could hold it.
    fn cpu_hints(&self, available: &CpuBits, reusable: &CpuBits, request: usize) -> ResourceHints {
        let universe = self.topology.numa_mask();
        let items: Vec<NumaMask> = available.iter().map(|c| self.topology.numa_of(c)).collect();
        let required: Vec<NumaMask> = reusable.iter().map(|c| self.topology.numa_of(c)).collect();
        let mut sizes: Vec<usize> = self
            .topology
            .numa_nodes()
            .values()
            .map(CpuBits::len)
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut have = 0;
        let mut min_affinity = universe.count();
        for (k, s) in sizes.iter().enumerate() {
            have += s;
            if have >= request {
                min_affinity = k + 1;
                break;
            }
        }
        let family = HintFamily::new(universe, items, required, request, min_affinity);
        if !self.options.align_by_socket {
            return ResourceHints::Family(family);
        }
        // align-by-socket also prefers hints spanning the fewest sockets, which the compact
        // family cannot say: list the hints as the kubelet does. Beyond 16 NUMA nodes the
        // listing is refused and the plain family (NUMA-count preference only) is returned.
        match family.to_hints(16) {
            Ok(mut hints) => {
                for h in &mut hints {
                    if let Some(mask) = h.affinity
                        && self.is_hint_socket_aligned(mask, min_affinity)
                    {
                        h.preferred = true;
                    }
                }
                ResourceHints::Hints(hints)
            }
            Err(_) => ResourceHints::Family(family),
        }
    }

    /// `isHintSocketAligned`: the hint's NUMA nodes lie on as few sockets as the narrowest
    /// hint needs.
    fn is_hint_socket_aligned(&self, mask: NumaMask, min_affinity: usize) -> bool {
        let per_socket = self.topology.num_numa_nodes() / self.topology.num_sockets().max(1);
        if per_socket == 0 {
            return false;
        }
        let min_sockets = min_affinity.div_ceil(per_socket);
        self.topology.sockets_in_numa_mask(mask).len() == min_sockets
    }

    fn hints_map(h: ResourceHints) -> ProviderHints {
        let mut m = ProviderHints::new();
        m.insert(CPU_RESOURCE.to_string(), h);
        m
    }

    /// Container-scope hints (`GetTopologyHints`).
    pub fn container_hints(&self, pod: &PodSpec, container: &ContainerSpec) -> ProviderHints {
        if self.policy == CpuPolicyName::None {
            return ProviderHints::new();
        }
        let inner = self.lock();
        let request = self.guaranteed_cpus(&inner, &pod.uid, &container.name);
        if request == 0 || self.skipped(&inner, &pod.uid) {
            return ProviderHints::new();
        }
        if let Some(allocated) = inner.state.get(&pod.uid, &container.name) {
            if allocated.len() != request {
                return Self::hints_map(ResourceHints::Hints(vec![]));
            }
            return Self::hints_map(self.cpu_hints(allocated, &CpuBits::new(), request));
        }
        let available = inner.state.default_cpu_set.difference(&self.reserved);
        let reusable = inner
            .cpus_to_reuse
            .get(&pod.uid)
            .cloned()
            .unwrap_or_default();
        Self::hints_map(self.cpu_hints(&available, &reusable, request))
    }

    /// Pod-scope hints (`GetPodTopologyHints`).
    pub fn pod_hints(&self, pod: &PodSpec) -> ProviderHints {
        if self.policy == CpuPolicyName::None {
            return ProviderHints::new();
        }
        let inner = self.lock();
        let info = inner.pods.get(&pod.uid);
        let request = info.map_or(0, |p| p.pod_guaranteed_cpus_with(self.gates));
        if request == 0 || self.skipped(&inner, &pod.uid) {
            return ProviderHints::new();
        }
        // Under pod-level management a pod whose shared containers would find no CPU left is
        // refused by the merge (no hint fits).
        if let Some(info) = info
            && info.managed_at_pod_level(self.gates)
            && validate_pod_shared_cpus(info, self.gates).is_err()
        {
            return Self::hints_map(ResourceHints::Hints(vec![]));
        }
        let mut assigned = CpuBits::new();
        for c in pod.all_containers() {
            let want = self.guaranteed_cpus(&inner, &pod.uid, &c.name);
            if let Some(set) = inner.state.get(&pod.uid, &c.name) {
                if set.len() != want {
                    return Self::hints_map(ResourceHints::Hints(vec![]));
                }
                assigned = assigned.union(set);
            }
        }
        if assigned.len() == request {
            return Self::hints_map(self.cpu_hints(&assigned, &CpuBits::new(), request));
        }
        let available = inner.state.default_cpu_set.difference(&self.reserved);
        let reusable = inner
            .cpus_to_reuse
            .get(&pod.uid)
            .cloned()
            .unwrap_or_default()
            .union(&assigned);
        Self::hints_map(self.cpu_hints(&available, &reusable, request))
    }
}

impl HintProvider for CpuManager {
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

/// `validatePodScopeResources` (CPU): under pod-level management, the containers that run on
/// the pod's shared CPUs must find some. A regular init container without exclusive CPUs runs
/// on what the sidecars started before it left; app containers and sidecars without exclusive
/// CPUs share what every long-running exclusive container leaves. Err: the kubelet's message.
pub fn validate_pod_shared_cpus(info: &PodCpuInfo, gates: PodLevelGates) -> Result<(), String> {
    let total = info.pod_guaranteed_cpus_with(gates);
    let mut shared_long_running = false;
    let mut exclusive_long_running = 0usize;
    for c in &info.spec.init_containers {
        let n = info.guaranteed_cpus_with(gates, &c.name);
        if !c.restartable {
            if n == 0 && exclusive_long_running >= total {
                return Err(
                    "pod rejected, pod has shared init containers but no cpus available for them"
                        .into(),
                );
            }
        } else if n == 0 {
            shared_long_running = true;
        } else {
            exclusive_long_running += n;
        }
    }
    for c in &info.spec.containers {
        let n = info.guaranteed_cpus_with(gates, &c.name);
        if n == 0 {
            shared_long_running = true;
        } else {
            exclusive_long_running += n;
        }
    }
    if shared_long_running && exclusive_long_running >= total {
        return Err("pod rejected, sum of exclusive container cpu requests equals pod budget, leaving no cpus for shared containers".into());
    }
    Ok(())
}
