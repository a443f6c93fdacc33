//! NUMA alignment at admission: the kubelet's Topology Manager admit handler
//! (`pkg/kubelet/cm/topologymanager/topology_manager.go` `Admit`, `scope_container.go`,
//! `scope_pod.go`, `scope_none.go`) over devicelet's async device manager, with the device
//! manager (`cm/devicemanager/topology_hints.go`) and the CPU manager (`cm/cpumanager`, static
//! policy) as hint providers in the kubelet's registration order
//! (`cm/container_manager_linux.go`), and the configuration the kubelet reads from
//! KubeletConfiguration (`topologyManagerPolicy`, `topologyManagerScope`,
//! `topologyManagerPolicyOptions`, `cpuManagerPolicy`, `cpuManagerPolicyOptions`,
//! `reservedSystemCPUs`, `kubeReserved`/`systemReserved` cpu).
//!
//! Per container (scope `container`) or once per pod (scope `pod`): collect hints, merge them
//! with the policy, reject with `TopologyAffinityError` when the policy says so, then allocate
//! devices (`filterByAffinity` with the merged mask) and CPUs (aligned to the same mask) for
//! each container in order. Unlike the kubelet, a rejection at any step frees everything the
//! pod got in this admission (upstream leaves earlier containers' allocations to a later GC).
//!
//! KEP-5526 (`PodLevelResourceManagers`): under the pod scope a pod with pod-level resources is
//! allocated as a whole (`scope_pod.go` `admitUsingPodResources`: the CPU then the memory
//! manager's `AllocatePod`), and its refusals carry the kubelet's `PodLevelTopologyAffinityError`
//! and `EmptyPodSharedPoolError` texts.
//!
//! Devices on NUMA nodes the machine lacks are ignored for alignment as the kubelet does, but
//! logged by name and named in the rejection, so the cause is visible.
//!
//! Beyond upstream 1.36: DRA claim devices are a fourth hint provider ([`ClaimTopology`],
//! `crate::dra::numa`): a claim's devices whose ResourceSlice gives
//! `resource.kubernetes.io/numaNode` (KEP-6072) give the containers that use the claim (the
//! whole pod under scope `pod`) a fixed hint, the NUMA mask of those devices.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use devicelet_cpumanager::pod::PodLevelGates;
use devicelet_cpumanager::{
    CpuManager, CpuManagerConfig, CpuManagerError, CpuPolicyName, CpuTopology, PodCpuInfo,
    ReservedCpus,
};
use devicelet_devicemanager::{AdmissionError, ContainerDevices, ContainerRequest, DeviceManager};
use devicelet_memorymanager::{
    MemoryBlock, MemoryManager, MemoryManagerConfig, MemoryManagerError, MemoryPolicyName,
    MemoryTopology, NumaMemory, ReservedMemory,
};
use devicelet_topology::{
    ContainerSpec, DeviceNuma, MachineConfig, NumaMask, NumaTopology, PodAdmission, Policy,
    ProviderHints, ScopeName, TopologyManager, allocated_device_hints, pod_effective_limits,
    resource_hints,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::admitted::ContainerView;
use crate::dra::ClaimNuma;

/// A pod's DRA claims as the Topology Manager sees them: each claim's allocated devices with
/// their NUMA nodes, and which claims each container lists in `resources.claims`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimTopology {
    /// The pod's claims.
    pub claims: Vec<ClaimNuma>,
    /// Container name → the pod claim names it uses.
    pub used_by: BTreeMap<String, Vec<String>>,
}

impl ClaimTopology {
    /// `claims` with the users read from `pod` (init and app containers).
    pub fn new(pod: &k8s_openapi::api::core::v1::Pod, claims: Vec<ClaimNuma>) -> Self {
        let mut used_by = BTreeMap::new();
        let spec = pod.spec.as_ref();
        let containers = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .chain(spec.map(|s| s.containers.iter()).into_iter().flatten());
        for c in containers {
            let names: Vec<String> = c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .into_iter()
                .flatten()
                .map(|rc| rc.name.clone())
                .collect();
            if !names.is_empty() {
                used_by.insert(c.name.clone(), names);
            }
        }
        ClaimTopology { claims, used_by }
    }

    /// The claims any of `containers` uses, each once, in the pod's order.
    fn used(&self, containers: &[&str]) -> Vec<&ClaimNuma> {
        self.claims
            .iter()
            .filter(|c| {
                containers.iter().any(|name| {
                    self.used_by
                        .get(*name)
                        .is_some_and(|names| names.contains(&c.pod_claim))
                })
            })
            .collect()
    }
}

/// Hint key of a claim: `claim:<pod claim name>`, the naming of the claim's
/// `allocatedResourcesStatus` entries (B17).
fn claim_resource(claim: &ClaimNuma) -> String {
    format!("claim:{}", claim.pod_claim)
}

/// The resource-manager part of a KubeletConfiguration file, plus devicelet's own `devicelet`
/// block. Other KubeletConfiguration fields are accepted and ignored (listed in `ignored`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlignmentConfig {
    /// `topologyManagerPolicy`: none (default), best-effort, restricted, single-numa-node.
    #[serde(default = "none")]
    pub topology_manager_policy: String,
    /// `topologyManagerScope`: container (default) or pod.
    #[serde(default = "container")]
    pub topology_manager_scope: String,
    /// `topologyManagerPolicyOptions`: prefer-closest-numa-nodes, max-allowable-numa-nodes.
    #[serde(default)]
    pub topology_manager_policy_options: BTreeMap<String, String>,
    /// `cpuManagerPolicy`: none (default) or static.
    #[serde(default = "none")]
    pub cpu_manager_policy: String,
    /// `cpuManagerPolicyOptions`: every static-policy option of 1.36 (`full-pcpus-only`,
    /// `distribute-cpus-across-numa`, `align-by-socket`, `distribute-cpus-across-cores`,
    /// `strict-cpu-reservation`, `prefer-align-cpus-by-uncorecache`).
    #[serde(default)]
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// `featureGates` (name → on/off); the resource managers' gates are checked.
    #[serde(default)]
    pub feature_gates: BTreeMap<String, bool>,
    /// `reservedSystemCPUs`: CPUs kept for the system (a cpulist such as `0,4`).
    #[serde(default, rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    /// `kubeReserved` (`cpu` and `memory` are read; like the kubelet, only cpu, memory,
    /// ephemeral-storage and pid may be listed).
    #[serde(default)]
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved` (as `kubeReserved`).
    #[serde(default)]
    pub system_reserved: BTreeMap<String, String>,
    /// `memoryManagerPolicy`: `None` (default) or `Static`.
    #[serde(default = "memory_none")]
    pub memory_manager_policy: String,
    /// `reservedMemory`: memory and huge pages kept for the system, per NUMA node.
    #[serde(default)]
    pub reserved_memory: Vec<MemoryReservation>,
    /// `evictionHard` (only `memory.available` is read: the kubelet counts it in the memory
    /// that `reservedMemory` must add up to). Absent: the kubelet's default `100Mi`.
    #[serde(default)]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// `mergeDefaultEvictionSettings`: thresholds `evictionHard` leaves out take the
    /// kubelet's defaults (so `memory.available` is 100Mi unless set).
    #[serde(default)]
    pub merge_default_eviction_settings: bool,
    /// devicelet's extension: where the machine's NUMA layout comes from.
    #[serde(default)]
    pub devicelet: MachineSource,
    /// Other KubeletConfiguration fields: accepted, not used.
    #[serde(flatten, skip_serializing)]
    pub ignored: BTreeMap<String, serde_json::Value>,
}

fn none() -> String {
    "none".to_owned()
}

fn container() -> String {
    "container".to_owned()
}

fn memory_none() -> String {
    "None".to_owned()
}

/// One `reservedMemory` entry of a KubeletConfiguration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryReservation {
    /// `numaNode`.
    pub numa_node: i32,
    /// `limits`: resource name (`memory`, `hugepages-<size>`) → quantity.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
}

impl Default for AlignmentConfig {
    fn default() -> Self {
        AlignmentConfig {
            topology_manager_policy: none(),
            topology_manager_scope: container(),
            topology_manager_policy_options: BTreeMap::new(),
            cpu_manager_policy: none(),
            cpu_manager_policy_options: BTreeMap::new(),
            feature_gates: BTreeMap::new(),
            reserved_system_cpus: None,
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            memory_manager_policy: memory_none(),
            reserved_memory: Vec::new(),
            eviction_hard: None,
            merge_default_eviction_settings: false,
            devicelet: MachineSource::default(),
            ignored: BTreeMap::new(),
        }
    }
}

/// The `devicelet:` block: a described machine (tests, demos) instead of sysfs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSource {
    /// NUMA nodes, their CPUs and distances (`nodes` + `cpusPerNode`, or `layout`;
    /// `distances` or `remoteDistance`). Wins over `sysfsRoot`.
    #[serde(default)]
    pub machine: Option<MachineConfig>,
    /// Root of the sysfs tree to read (default `/sys`).
    #[serde(default)]
    pub sysfs_root: Option<PathBuf>,
    /// Memory of every NUMA node of a described `machine` (the Memory Manager's view);
    /// ignored with sysfs, which has the real amounts.
    #[serde(default)]
    pub memory: Option<DescribedMemory>,
}

/// Memory of each node of a described machine (all nodes alike).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DescribedMemory {
    /// Memory per NUMA node, a quantity (`16Gi`).
    pub per_node: String,
    /// Huge pages per NUMA node: page size (`2Mi`, `1Gi`) → pages.
    #[serde(default)]
    pub hugepages_per_node: BTreeMap<String, u64>,
}

/// Configuration problems, each naming the KubeletConfiguration field at fault.
#[derive(Debug, thiserror::Error)]
pub enum AlignmentError {
    /// A field holds a value the kubelet would refuse.
    #[error("{field}: {message}")]
    Field {
        /// KubeletConfiguration field name.
        field: &'static str,
        /// What is wrong (the kubelet's text where it has one).
        message: String,
    },
    /// The machine's NUMA/CPU layout could not be read.
    #[error("cannot discover the machine's NUMA topology ({source_name}): {message}")]
    Discovery {
        /// `devicelet.machine` or the sysfs root.
        source_name: String,
        /// The cause.
        message: String,
    },
    /// The CPU manager's state could not be restored or written.
    #[error("{0}")]
    CpuState(CpuManagerError),
    /// The memory manager's state could not be restored or written.
    #[error("{0}")]
    MemoryState(MemoryManagerError),
}

/// A pod the Topology Manager refused, or whose CPUs could not be allocated.
#[derive(Debug, thiserror::Error)]
pub enum AlignmentRejection {
    /// The merged hint is not admissible under the policy (the kubelet's reason and message).
    #[error(
        "TopologyAffinityError: Resources cannot be allocated with Topology locality ({detail})"
    )]
    TopologyAffinity {
        /// Which container (or the pod) and what it asked for.
        detail: String,
    },
    /// KEP-5526: a pod with pod-level resources refused under `PodLevelResourceManagers`
    /// (the kubelet's `PodLevelTopologyAffinityError`: reason `TopologyAffinityError`, a
    /// message naming the scope).
    #[error("TopologyAffinityError: {}: ({detail})", scope.kubelet_message())]
    PodLevelTopologyAffinity {
        /// Which scope refused it.
        scope: PodLevelScope,
        /// Which container (or the pod) and what it asked for.
        detail: String,
    },
    /// The CPU manager failed (`UnexpectedAdmissionError` in the kubelet).
    #[error(
        "UnexpectedAdmissionError: container {container:?}: Allocate failed due to {source}, which is unexpected"
    )]
    Cpus {
        /// Container name.
        container: String,
        /// Cause.
        source: CpuManagerError,
    },
    /// The memory manager failed (`UnexpectedAdmissionError` in the kubelet).
    #[error(
        "UnexpectedAdmissionError: container {container:?}: Allocate failed due to {source}, which is unexpected"
    )]
    Memory {
        /// Container name.
        container: String,
        /// Cause.
        source: MemoryManagerError,
    },
}

/// The scope that refused a pod with pod-level resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodLevelScope {
    /// `topologyManagerScope: pod`.
    Pod,
    /// `topologyManagerScope: container`.
    Container,
}

impl PodLevelScope {
    /// The kubelet's message (`scope_pod.go` / `scope_container.go`).
    pub fn kubelet_message(&self) -> &'static str {
        match self {
            PodLevelScope::Pod => {
                "Pod Scope pod with pod-level resources failed admission under pod-scope topology manager"
            }
            PodLevelScope::Container => {
                "Pod Scope pod with pod-level resources failed admission with a container-level topology manager"
            }
        }
    }
}

/// Why [`Alignment::admit`] failed; `crate::pods` turns it into its `PodError`.
#[derive(Debug, thiserror::Error)]
pub enum AdmitFailure {
    /// Device allocation failed for a container.
    #[error("container {container:?}: {source}")]
    Admission {
        /// Container name.
        container: String,
        /// Cause.
        source: AdmissionError,
    },
    /// The Topology Manager or the CPU manager refused the pod.
    #[error(transparent)]
    Rejected(AlignmentRejection),
}

/// What one container got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlignedContainer {
    /// Devices per resource.
    pub devices: ContainerDevices,
    /// NUMA nodes of the merged hint (`None`: no affinity).
    pub numa_affinity: Option<Vec<usize>>,
    /// Exclusive CPUs (static policy, Guaranteed pod, integer CPU request).
    pub cpus: Option<String>,
    /// Memory and huge pages pinned to NUMA nodes (Static memory policy, Guaranteed pod).
    pub memory: Vec<MemoryBlock>,
    /// Time in the device allocation, nearly all of it the device plugins' `Allocate` calls
    /// (their own time, for the pod start-up record).
    pub plugin_allocate: std::time::Duration,
}

/// What one NUMA node can still give a new pod ([`Alignment::numa_free`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumaFree {
    /// NUMA node id.
    pub id: usize,
    /// CPUs a new exclusive allocation may take there; `None` without the static CPU policy.
    pub cpus: Option<u64>,
    /// Bytes of `memory` the Static memory policy can pin there; `None` without it.
    pub memory: Option<u64>,
}

/// Topology Manager + CPU and memory managers for one node.
#[derive(Debug)]
pub struct Alignment {
    /// The Topology Manager (policy, scope); `None` when alignment is disabled. No providers
    /// are registered with it: device allocation is async here, so admission drives its
    /// [`PodAdmission`] step by step with the device then CPU manager's hints.
    topology: Option<TopologyManager>,
    machine: NumaMask,
    cpu: Option<CpuManager>,
    memory: Option<MemoryManager>,
    /// `PodLevelResources` / `PodLevelResourceManagers` (KEP-5526).
    pod_level_gates: PodLevelGates,
}

fn field(field: &'static str, message: impl ToString) -> AlignmentError {
    AlignmentError::Field {
        field,
        message: message.to_string(),
    }
}

impl Alignment {
    /// No alignment and no CPU manager (both policies none, no machine needed).
    pub fn disabled() -> Self {
        Alignment {
            topology: None,
            machine: NumaMask::EMPTY,
            cpu: None,
            memory: None,
            pod_level_gates: PodLevelGates::default(),
        }
    }

    /// Checks the configuration in the kubelet's order, reads the machine, and starts the CPU
    /// manager with its state file `<state_dir>/cpu_manager_state`.
    pub fn new(config: &AlignmentConfig, state_dir: &Path) -> Result<Self, AlignmentError> {
        let cpu_policy: CpuPolicyName = config
            .cpu_manager_policy
            .parse()
            .map_err(|e| field("cpuManagerPolicy", e))?;
        let memory_policy: MemoryPolicyName = config
            .memory_manager_policy
            .parse()
            .map_err(|e| field("memoryManagerPolicy", e))?;
        let all_none = config.topology_manager_policy == "none"
            && cpu_policy == CpuPolicyName::None
            && memory_policy == MemoryPolicyName::None;
        let (numa, cpus, memory_topology) = match discover(&config.devicelet) {
            Ok(found) => found,
            Err(err) if all_none => {
                warn!(error = %err, "no NUMA topology; running without topology alignment and CPU manager");
                return Ok(Self::disabled());
            }
            Err(err) => return Err(err),
        };
        let tm = TopologyManager::new(
            &numa,
            &config.topology_manager_policy,
            &config.topology_manager_scope,
            &config.topology_manager_policy_options,
        )
        .map_err(|e| {
            use devicelet_topology::ConfigError as C;
            let name = match e {
                C::UnknownPolicy(_) => "topologyManagerPolicy",
                C::UnknownScope(_) => "topologyManagerScope",
                _ => "topologyManagerPolicyOptions",
            };
            field(name, e)
        })?;
        let reserved = ReservedCpus::from_kubelet_config(
            config.reserved_system_cpus.as_deref(),
            config.kube_reserved.get("cpu").map(String::as_str),
            config.system_reserved.get("cpu").map(String::as_str),
        )
        .map_err(|e| field("reservedSystemCPUs", e))?;
        let feature_gates = devicelet_topology::FeatureGates::from_map(&config.feature_gates)
            .map_err(|e| field("featureGates", e))?;
        let pod_level_gates = PodLevelGates::from_gates(&feature_gates);
        let cpu_config = CpuManagerConfig {
            policy: config.cpu_manager_policy.clone(),
            reserved,
            policy_options: config.cpu_manager_policy_options.clone(),
            feature_gates,
            topology_manager_policy: config.topology_manager_policy.clone(),
        };
        let cpu = CpuManager::new(cpus, &cpu_config, state_dir).map_err(|e| match e {
            CpuManagerError::UnknownOption(_)
            | CpuManagerError::BadOptionValue { .. }
            | CpuManagerError::OptionGateDisabled { .. }
            | CpuManagerError::IncompatibleOptions { .. }
            | CpuManagerError::AlignBySocketWithSingleNumaNode
            | CpuManagerError::AlignBySocketMoreSocketsThanNuma
            | CpuManagerError::NonePolicyOptions(_) => field("cpuManagerPolicyOptions", e),
            CpuManagerError::NoReservedCpus
            | CpuManagerError::ReserveFailed { .. }
            | CpuManagerError::ReservedNotOnMachine { .. }
            | CpuManagerError::BadReservedList(..) => field("reservedSystemCPUs", e),
            other => AlignmentError::CpuState(other),
        })?;
        // Memory that cannot be read matters only to the Static policy; `None` pins nothing
        // and keeps only its state file, as the kubelet does.
        let memory_topology = match memory_topology {
            Ok(found) => found,
            Err(err) if memory_policy == MemoryPolicyName::None => {
                warn!(error = %err, "cannot read memory per NUMA node; the None memory policy does not need it");
                described_memory(&numa, None).map_err(|message| AlignmentError::Discovery {
                    source_name: "NUMA nodes".into(),
                    message,
                })?
            }
            Err(err) => return Err(err),
        };
        let memory = start_memory_manager(config, memory_topology, state_dir, pod_level_gates)?;
        info!(
            topology_manager_policy = %tm.policy().name(),
            scope = ?tm.scope(),
            numa_nodes = numa.node_count(),
            cpu_manager_policy = cpu_policy.as_str(),
            reserved = %cpu.reserved_cpus(),
            memory_manager_policy = memory_policy.as_str(),
            "resource managers configured"
        );
        Ok(Alignment {
            topology: Some(tm),
            machine: numa.default_mask(),
            cpu: Some(cpu),
            memory: Some(memory),
            pod_level_gates,
        })
    }

    /// The CPU manager, when one runs.
    pub fn cpu_manager(&self) -> Option<&CpuManager> {
        self.cpu.as_ref()
    }

    /// The memory manager, when one runs.
    pub fn memory_manager(&self) -> Option<&MemoryManager> {
        self.memory.as_ref()
    }

    /// Admits a pod's containers (`requests` in admission order: init, then app containers);
    /// `info` is the pod as the managers see it, converted once by the caller. What a rejected
    /// pod got so far is freed by the caller's admission guard
    /// ([`crate::pods`]), which owns the rollback of the whole admission.
    pub async fn admit(
        &self,
        manager: &DeviceManager,
        info: &PodCpuInfo,
        requests: Vec<ContainerRequest>,
        claims: &ClaimTopology,
    ) -> Result<Vec<AlignedContainer>, AdmitFailure> {
        if let Some(cpu) = &self.cpu {
            cpu.register_pod(info);
        }
        if let Some(memory) = &self.memory {
            memory.register_pod(info);
        }
        let start = std::time::Instant::now();
        let result = self.admit_inner(manager, info, requests, claims).await;
        // The kubelet's Topology Manager `Admit` counts every pod, whatever the policy, and any
        // failure of the scope (refusal or allocation error) as an error.
        manager
            .metrics()
            .topology_admission(result.is_err(), start.elapsed());
        result
    }

    async fn admit_inner(
        &self,
        manager: &DeviceManager,
        info: &PodCpuInfo,
        requests: Vec<ContainerRequest>,
        claims: &ClaimTopology,
    ) -> Result<Vec<AlignedContainer>, AdmitFailure> {
        let pod = &info.spec;
        // KEP-5526: with `PodLevelResourceManagers` a pod with pod-level resources is
        // allocated as a whole under the pod scope, and refused with its own message.
        let gates = self.pod_level_gates;
        let pod_level_refusal = |failure: AdmitFailure, scope: PodLevelScope| match failure {
            AdmitFailure::Rejected(AlignmentRejection::TopologyAffinity { detail }) => {
                AdmitFailure::Rejected(AlignmentRejection::PodLevelTopologyAffinity {
                    scope,
                    detail,
                })
            }
            other => other,
        };
        // The Topology Manager's scope decides when hints are asked for and merged (none: never;
        // pod: once, here; container: per container, after the previous one allocated).
        let mut pod_limits = BTreeMap::new();
        let mut pod_unknown = Vec::new();
        let admission = match &self.topology {
            None => PodAdmission::Unaligned,
            Some(tm) => tm
                .begin_admission(|| {
                    let names: Vec<&str> = pod.all_containers().map(|c| c.name.as_str()).collect();
                    pod_limits = pod_effective_limits(pod)
                        .into_iter()
                        .filter(|(r, _)| requests.iter().any(|q| q.limits.contains_key(r)))
                        .map(|(r, v)| (r, u64::try_from(v).unwrap_or(0)))
                        .collect();
                    let devices = self.device_hints(
                        manager,
                        &pod.uid,
                        &names,
                        &pod_limits,
                        false,
                        &mut pod_unknown,
                    );
                    let cpus = self
                        .cpu
                        .as_ref()
                        .map(|c| c.pod_hints(pod))
                        .unwrap_or_default();
                    let memory = self
                        .memory
                        .as_ref()
                        .map(|m| m.pod_hints(pod))
                        .unwrap_or_default();
                    let dra = self.claim_hints(&claims.used(&names), &mut pod_unknown);
                    vec![devices, cpus, memory, dra]
                })
                .map_err(|_| {
                    let names: Vec<&str> = pod.all_containers().map(|c| c.name.as_str()).collect();
                    let asked = self.asked(
                        &pod_limits,
                        info.pod_guaranteed_cpus(),
                        &claims.used(&names),
                    );
                    self.count_aligned(manager, ScopeName::Pod, true);
                    let failure = reject(
                        Some(tm.policy()),
                        "the pod",
                        &asked,
                        self.machine,
                        &pod_unknown,
                    );
                    if info.managed_at_pod_level(gates) {
                        pod_level_refusal(failure, PodLevelScope::Pod)
                    } else {
                        failure
                    }
                })?,
        };
        // `scope_pod.go` `admitUsingPodResources`: one `AllocatePod` per provider once every
        // container has the pod's hint. The kubelet's device manager does nothing there (its
        // `Allocate` runs when the container starts, with the same stored hint); devicelet
        // allocates devices at admission as always, with that hint.
        let whole_pod =
            matches!(admission, PodAdmission::PerPod(_)) && info.managed_at_pod_level(gates);
        let empty = ContainerSpec::default();
        let mut out = Vec::with_capacity(requests.len());
        let mut names: Vec<String> = Vec::new();
        for mut request in requests {
            let spec = pod
                .all_containers()
                .find(|c| c.name == request.container)
                .unwrap_or(&empty);
            let mut unknown = Vec::new();
            let hint = admission
                .container_hint(|| {
                    let devices = self.device_hints(
                        manager,
                        &pod.uid,
                        &[request.container.as_str()],
                        &request.limits,
                        true,
                        &mut unknown,
                    );
                    let cpus = self
                        .cpu
                        .as_ref()
                        .map(|c| c.container_hints(pod, spec))
                        .unwrap_or_default();
                    let memory = self
                        .memory
                        .as_ref()
                        .map(|m| m.container_hints(pod, spec))
                        .unwrap_or_default();
                    let dra =
                        self.claim_hints(&claims.used(&[request.container.as_str()]), &mut unknown);
                    vec![devices, cpus, memory, dra]
                })
                .map_err(|_| {
                    let asked = self.asked(
                        &request.limits,
                        info.guaranteed_cpus(&request.container),
                        &claims.used(&[request.container.as_str()]),
                    );
                    let what = format!("container {:?}", request.container);
                    self.count_aligned(manager, ScopeName::Container, true);
                    // Only a merge refuses, so a Topology Manager is configured.
                    let policy = self.topology.as_ref().map(TopologyManager::policy);
                    let failure = reject(policy, &what, &asked, self.machine, &unknown);
                    if gates.managers && info.pod_level_set() {
                        pod_level_refusal(failure, PodLevelScope::Container)
                    } else {
                        failure
                    }
                })?;
            request.affinity = hint.affinity;
            let allocating = std::time::Instant::now();
            let devices = manager
                .allocate_container(&request)
                .await
                .map_err(|source| AdmitFailure::Admission {
                    container: request.container.clone(),
                    source,
                })?;
            let plugin_allocate = allocating.elapsed();
            let mut cpus = None;
            if whole_pod {
                out.push(AlignedContainer {
                    devices,
                    numa_affinity: hint.affinity.map(|m| m.nodes().collect()),
                    cpus: None,
                    memory: Vec::new(),
                    plugin_allocate,
                });
                names.push(request.container.clone());
                continue;
            }
            if let Some(cpu) = &self.cpu {
                let pinned = cpu.policy() == CpuPolicyName::Static
                    && info.guaranteed_cpus(&request.container) > 0;
                // In memory: the file is written once per pod, after the admission lock
                // ([`Alignment::persist_state`]).
                let allocated = cpu.assign_container(pod, spec, &hint);
                if pinned {
                    manager.metrics().cpu_pinning(allocated.is_err());
                }
                allocated.map_err(|source| {
                    AdmitFailure::Rejected(AlignmentRejection::Cpus {
                        container: request.container.clone(),
                        source,
                    })
                })?;
                cpus = cpu
                    .state()
                    .get(&pod.uid, &request.container)
                    .map(|set| set.to_string());
            }
            // The kubelet's provider order: devices, CPUs, then memory.
            let mut memory = Vec::new();
            if let Some(mm) = &self.memory {
                // The kubelet counts every Static-policy allocation of a Guaranteed pod's
                // container as a pinning request.
                let pinned = mm.policy() == MemoryPolicyName::Static
                    && info.qos == devicelet_cpumanager::QosClass::Guaranteed;
                let allocated = mm.assign_container(pod, spec, &hint);
                if pinned {
                    manager.metrics().memory_pinning(allocated.is_err());
                }
                allocated.map_err(|source| {
                    AdmitFailure::Rejected(AlignmentRejection::Memory {
                        container: request.container.clone(),
                        source,
                    })
                })?;
                memory = mm.memory_blocks(&pod.uid, &request.container);
            }
            out.push(AlignedContainer {
                devices,
                numa_affinity: hint.affinity.map(|m| m.nodes().collect()),
                cpus,
                memory,
                plugin_allocate,
            });
            self.count_aligned(manager, ScopeName::Container, false);
        }
        if let PodAdmission::PerPod(hint) = admission
            && whole_pod
        {
            self.allocate_whole_pod(manager, info, &hint, &names, &mut out)?;
        }
        self.count_aligned(manager, ScopeName::Pod, false);
        Ok(out)
    }

    /// KEP-5526 `AllocatePod` of the CPU then the memory manager (the kubelet's provider
    /// order), then what each container got.
    fn allocate_whole_pod(
        &self,
        manager: &DeviceManager,
        info: &PodCpuInfo,
        hint: &devicelet_topology::TopologyHint,
        names: &[String],
        out: &mut [AlignedContainer],
    ) -> Result<(), AdmitFailure> {
        let pod = &info.spec;
        // The kubelet keys the pod's hint by its first container.
        let first = pod
            .all_containers()
            .next()
            .map(|c| c.name.clone())
            .unwrap_or_default();
        if let Some(cpu) = &self.cpu {
            let pinned = cpu.policy() == CpuPolicyName::Static
                && info.pod_guaranteed_cpus_with(self.pod_level_gates) > 0;
            let allocated = cpu.assign_pod(pod, hint);
            if pinned {
                manager.metrics().cpu_pinning(allocated.is_err());
            }
            allocated.map_err(|source| {
                AdmitFailure::Rejected(AlignmentRejection::Cpus {
                    container: first.clone(),
                    source,
                })
            })?;
        }
        if let Some(mm) = &self.memory {
            let pinned = mm.policy() == MemoryPolicyName::Static
                && info.qos_with(self.pod_level_gates)
                    == devicelet_cpumanager::QosClass::Guaranteed;
            let allocated = mm.assign_pod(pod, hint);
            if pinned {
                manager.metrics().memory_pinning(allocated.is_err());
            }
            allocated.map_err(|source| {
                AdmitFailure::Rejected(AlignmentRejection::Memory {
                    container: first.clone(),
                    source,
                })
            })?;
        }
        for (name, got) in names.iter().zip(out.iter_mut()) {
            if let Some(cpu) = &self.cpu {
                got.cpus = cpu.state().get(&pod.uid, name).map(|set| set.to_string());
            }
            if let Some(mm) = &self.memory {
                got.memory = mm.memory_blocks(&pod.uid, name);
            }
        }
        Ok(())
    }

    /// `kubelet_container_aligned_compute_resources_{count,failure_count}{boundary="numa_node"}`
    /// for the configured scope: only `single-numa-node` guarantees alignment (the kubelet's
    /// `IsAlignmentGuaranteed`); pod scope counts once per pod, container scope per container.
    fn count_aligned(&self, manager: &DeviceManager, scope: ScopeName, failed: bool) {
        use devicelet_metrics::{AlignBoundary, AlignScope};
        let Some(tm) = &self.topology else {
            return;
        };
        if tm.scope() != Some(scope)
            || tm.policy().name() != devicelet_topology::PolicyName::SingleNumaNode
        {
            return;
        }
        let scope = match scope {
            ScopeName::Container => AlignScope::Container,
            ScopeName::Pod => AlignScope::Pod,
        };
        manager
            .metrics()
            .aligned_compute_resources(scope, AlignBoundary::NumaNode, failed);
    }

    /// "example.com/gpu=2, exclusive cpus=4, claim "gpu" (ResourceClaim default/gpu) with
    /// devices on NUMA nodes [1] (gpu.example.com/node-a/gpu-2 on [1])" for a rejection message.
    fn asked(&self, limits: &BTreeMap<String, u64>, cpus: usize, claims: &[&ClaimNuma]) -> String {
        let mut asked: Vec<String> = limits.iter().map(|(r, n)| format!("{r}={n}")).collect();
        if cpus > 0
            && self
                .cpu
                .as_ref()
                .is_some_and(|c| c.policy() == CpuPolicyName::Static)
        {
            asked.push(format!("exclusive cpus={cpus}"));
        }
        for claim in claims {
            asked.push(claim_text(claim));
        }
        if asked.is_empty() {
            "no aligned resources".to_owned()
        } else {
            asked.join(", ")
        }
    }

    /// Whether admissions ask providers for hints (a Topology Manager policy other than
    /// `none`): only then do claim devices' NUMA nodes matter before the claims are prepared.
    pub fn uses_hints(&self) -> bool {
        self.topology
            .as_ref()
            .is_some_and(|tm| tm.policy().name() != devicelet_topology::PolicyName::None)
    }

    /// The DRA hint provider (devicelet's addition): one fixed hint list per claim, keyed
    /// `claim:<pod claim>`, from the NUMA nodes of its allocated devices
    /// ([`allocated_device_hints`]); a claim none of whose devices has a known NUMA node gives
    /// no preference.
    fn claim_hints(&self, claims: &[&ClaimNuma], unknown: &mut Vec<String>) -> ProviderHints {
        let mut hints = ProviderHints::new();
        for claim in claims {
            let devices: Vec<DeviceNuma> = claim
                .devices
                .iter()
                .map(|d| DeviceNuma::new(d.device.clone(), d.numa_nodes.clone()))
                .collect();
            let generated = allocated_device_hints(&devices, self.machine);
            for (device, node) in generated.unknown_numa_nodes {
                warn!(claim = %claim.claim, device = %device, node,
                    "claim device names a NUMA node this machine does not have; ignored for alignment");
                unknown.push(format!(
                    "claim {:?} device {device} names NUMA node {node}, which this machine does not have",
                    claim.pod_claim
                ));
            }
            hints.insert(claim_resource(claim), generated.hints);
        }
        hints
    }

    /// The device manager's `GetTopologyHints` / `GetPodTopologyHints` (spec §4.7) for the
    /// device-plugin resources in `limits`.
    fn device_hints(
        &self,
        manager: &DeviceManager,
        pod_uid: &str,
        containers: &[&str],
        limits: &BTreeMap<String, u64>,
        with_reuse: bool,
        unknown: &mut Vec<String>,
    ) -> ProviderHints {
        let mut hints = ProviderHints::new();
        for (resource, &request) in limits {
            let Some(view) = manager.topology_view(pod_uid, containers, resource, with_reuse)
            else {
                continue;
            };
            let all: Vec<DeviceNuma> = view
                .devices
                .into_iter()
                .map(|(id, nodes)| DeviceNuma::new(id, nodes))
                .collect();
            let generated = resource_hints(
                &all,
                &refs(&view.free),
                &refs(&view.reusable),
                &refs(&view.held),
                usize::try_from(request).unwrap_or(usize::MAX),
                self.machine,
            );
            for (device, node) in generated.unknown_numa_nodes {
                warn!(resource = %resource, device = %device, node,
                    "device reports a NUMA node this machine does not have; ignored for alignment");
                unknown.push(format!(
                    "{resource} device {device:?} reports NUMA node {node}, which this machine does not have"
                ));
            }
            hints.insert(resource.clone(), generated.hints);
        }
        hints
    }

    /// Writes `memory_manager_state`, then `cpu_manager_state`, with the blocks and exclusive
    /// CPUs [`Alignment::admit`] assigned in memory for a pod's `containers`, on one blocking
    /// thread; one write may cover several admissions, and a pod that pinned nothing writes
    /// nothing. Call it outside the admission lock and before the journal commit that
    /// acknowledges the pod. The error names the pod's first pinned container, as an `Allocate`
    /// failure does; the caller's admission guard then rolls the pod back.
    pub async fn persist_state(
        self: &Arc<Self>,
        containers: &[ContainerView],
    ) -> Result<(), AlignmentRejection> {
        let first = |pinned: fn(&ContainerView) -> bool| {
            containers
                .iter()
                .find(|c| pinned(c))
                .map(|c| c.name.clone())
        };
        // Containers of a pod managed at pod level (KEP-5526) may hold empty blocks, which
        // the kubelet writes too: any unwritten change is written, named after the first
        // container when none holds memory.
        let memory_owner = self.memory.as_ref().and_then(|mm| {
            first(|c| !c.memory.is_empty()).or_else(|| {
                mm.has_unwritten()
                    .then(|| containers.first().map(|c| c.name.clone()))
                    .flatten()
            })
        });
        let cpu_owner = self.cpu.as_ref().and(first(|c| c.cpus.is_some()));
        if memory_owner.is_none() && cpu_owner.is_none() {
            return Ok(());
        }
        let this = Arc::clone(self);
        let (memory, cpu) = (memory_owner.clone(), cpu_owner.clone());
        tokio::task::spawn_blocking(move || this.persist_blocking(memory, cpu))
            .await
            .unwrap_or_else(|join| {
                let detail = format!("write task failed: {join}");
                if let (Some(container), Some(mm)) = (memory_owner, &self.memory) {
                    let path = mm.state_file().to_owned();
                    let source = MemoryManagerError::Write { path, detail };
                    return Err(AlignmentRejection::Memory { container, source });
                }
                let path = self.cpu.as_ref().map(|c| c.state_file().to_owned());
                let source = CpuManagerError::Write {
                    path: path.unwrap_or_default(),
                    detail,
                };
                let container = cpu_owner.unwrap_or_default();
                Err(AlignmentRejection::Cpus { container, source })
            })
    }

    /// The writes of [`Alignment::persist_state`]: memory first, then CPUs, each only when the
    /// pod pinned some (`*_owner`: its first container that did).
    fn persist_blocking(
        &self,
        memory_owner: Option<String>,
        cpu_owner: Option<String>,
    ) -> Result<(), AlignmentRejection> {
        if let (Some(mm), Some(container)) = (&self.memory, memory_owner) {
            mm.persist()
                .map_err(|source| AlignmentRejection::Memory { container, source })?;
        }
        if let (Some(cpu), Some(container)) = (&self.cpu, cpu_owner) {
            cpu.persist()
                .map_err(|source| AlignmentRejection::Cpus { container, source })?;
        }
        Ok(())
    }

    /// Frees a pod's CPUs and memory.
    pub fn remove_pod(&self, pod_uid: &str) {
        if let Some(cpu) = &self.cpu
            && let Err(err) = cpu.remove_pod(pod_uid)
        {
            warn!(pod_uid, error = %err, "cannot free the pod's CPUs");
        }
        if let Some(memory) = &self.memory
            && let Err(err) = memory.remove_pod(pod_uid)
        {
            warn!(pod_uid, error = %err, "cannot free the pod's memory");
        }
    }

    /// Frees the CPUs and memory of every pod not in `active` (the CPU and memory managers'
    /// `removeStaleState`).
    pub fn retain_pods(&self, active: &std::collections::HashSet<String>) {
        if let Some(memory) = &self.memory {
            match memory.retain_pods(|uid| active.contains(uid)) {
                Ok(freed) if freed.is_empty() => {}
                Ok(freed) => {
                    info!(pods = ?freed, "freed the memory of pods that are not active")
                }
                Err(err) => {
                    warn!(error = %err, "freed the memory of pods that are not active, but cannot write the memory state")
                }
            }
        }
        let Some(cpu) = &self.cpu else {
            return;
        };
        match cpu.retain_pods(|uid| active.contains(uid)) {
            Ok(freed) if freed.is_empty() => {}
            Ok(freed) => {
                info!(pods = ?freed, "freed the exclusive CPUs of pods that are not active")
            }
            Err(err) => {
                warn!(error = %err, "freed the CPUs of pods that are not active, but cannot write the CPU state")
            }
        }
    }

    /// `cpusetCpus` for a container start: its exclusive CPUs, else the shared pool; `None`
    /// without the static policy (the runtime leaves the cpuset alone).
    pub fn cpuset_for(&self, pod_uid: &str, container: &str) -> Option<String> {
        let cpu = self.cpu.as_ref()?;
        (cpu.policy() == CpuPolicyName::Static)
            .then(|| cpu.cpuset_for(pod_uid, container).to_string())
    }

    /// Exclusive CPUs of a container (PodResources `cpu_ids`).
    pub fn exclusive_cpus(&self, pod_uid: &str, container: &str) -> Vec<i64> {
        self.cpu
            .as_ref()
            .and_then(|c| {
                c.state()
                    .get(pod_uid, container)
                    .map(|s| s.iter().map(i64::from).collect())
            })
            .unwrap_or_default()
    }

    /// Memory blocks of a container (PodResources `memory`).
    pub fn memory_blocks(&self, pod_uid: &str, container: &str) -> Vec<MemoryBlock> {
        self.memory
            .as_ref()
            .map(|m| m.memory_blocks(pod_uid, container))
            .unwrap_or_default()
    }

    /// NUMA nodes a container's memory is pinned to (`cpusetMems`); empty when not pinned.
    pub fn memory_numa_nodes(&self, pod_uid: &str, container: &str) -> Vec<usize> {
        self.memory
            .as_ref()
            .map(|m| m.memory_numa_nodes(pod_uid, container))
            .unwrap_or_default()
    }

    /// Allocatable memory per NUMA node (PodResources `GetAllocatableResources`): the Static
    /// policy's blocks, none under `None`.
    pub fn allocatable_memory(&self) -> Vec<MemoryBlock> {
        self.memory
            .as_ref()
            .map(MemoryManager::allocatable_memory)
            .unwrap_or_default()
    }

    /// The Topology Manager's policy and scope names (`none` and `container` without one).
    pub fn topology_names(&self) -> (&'static str, &'static str) {
        match &self.topology {
            Some(tm) => (
                tm.policy().name().as_str(),
                tm.scope().unwrap_or_default().as_str(),
            ),
            None => ("none", "container"),
        }
    }

    /// Per NUMA node of the machine, what a new pod can still get there: the CPUs a new
    /// exclusive allocation may take (static CPU policy) and the `memory` the Static memory
    /// policy can pin on that node alone (a node already serving a multi-NUMA group gives
    /// none to a single-NUMA allocation). What the scheduler reads to pick a NUMA node for a
    /// pod's DRA devices (`devicelet_kube::numa_resources`).
    pub fn numa_free(&self) -> Vec<NumaFree> {
        let cpus = self
            .cpu
            .as_ref()
            .filter(|c| c.policy() == CpuPolicyName::Static)
            .map(|c| (c.available_cpus(), c.topology()));
        let memory = self
            .memory
            .as_ref()
            .filter(|m| m.policy() == devicelet_memorymanager::MemoryPolicyName::Static)
            .map(MemoryManager::machine_state);
        self.machine
            .nodes()
            .map(|id| NumaFree {
                id,
                cpus: cpus.as_ref().map(|(free, topology)| {
                    topology
                        .cpus()
                        .iter()
                        .filter(|c| c.numa == id && free.contains(c.id))
                        .count() as u64
                }),
                memory: memory.as_ref().map(|m| {
                    m.get(&id)
                        .filter(|n| n.cells.len() <= 1 || n.number_of_assignments == 0)
                        .and_then(|n| n.memory_map.get("memory"))
                        .map_or(0, |t| t.free)
                }),
            })
            .collect()
    }

    /// CPUs that can be handed out exclusively (PodResources `GetAllocatableResources`):
    /// every CPU but the reserved ones under the static policy, none otherwise.
    pub fn allocatable_cpus(&self) -> Vec<i64> {
        match &self.cpu {
            Some(cpu) if cpu.policy() == CpuPolicyName::Static => {
                let reserved = cpu.reserved_cpus();
                cpu.topology()
                    .all_cpus()
                    .iter()
                    .filter(|c| !reserved.contains(*c))
                    .map(i64::from)
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// `claim "gpu" (ResourceClaim default/gpu) with devices on NUMA nodes [1]
/// (gpu.example.com/node-a/gpu-2 on [1])`; devices without the attribute say so.
fn claim_text(claim: &ClaimNuma) -> String {
    let mut nodes: Vec<i64> = claim
        .devices
        .iter()
        .flat_map(|d| d.numa_nodes.iter().flatten().copied())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let devices: Vec<String> = claim
        .devices
        .iter()
        .map(|d| match &d.numa_nodes {
            Some(n) => format!("{} on {n:?}", d.device),
            None => format!("{} without NUMA node", d.device),
        })
        .collect();
    format!(
        "claim {:?} (ResourceClaim {}) with devices on NUMA nodes {nodes:?} ({})",
        claim.pod_claim,
        claim.claim,
        devices.join(", ")
    )
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The kubelet's `TopologyAffinityError`, with what was asked and any device on an unknown
/// NUMA node (devicelet's addition: the kubelet says only the fixed message).
fn reject(
    policy: Option<&Policy>,
    what: &str,
    asked: &str,
    machine: NumaMask,
    unknown: &[String],
) -> AdmitFailure {
    let name = policy.map_or("none", |p| p.name().as_str());
    let mut detail = format!(
        "{what} asks for {asked}; no placement is admissible under the {name} policy on NUMA nodes {:?}",
        machine.nodes().collect::<Vec<_>>(),
    );
    for u in unknown {
        detail.push_str("; ");
        detail.push_str(u);
    }
    AdmitFailure::Rejected(AlignmentRejection::TopologyAffinity { detail })
}

/// The kubelet's default hard eviction threshold for memory (`eviction.DefaultEvictionHard`).
const DEFAULT_EVICTION_MEMORY_AVAILABLE: &str = "100Mi";

/// The memory part of the kubelet's `GetNodeAllocatableReservation`: `kubeReserved` +
/// `systemReserved` + the hard eviction threshold for `memory.available` (an absolute
/// quantity, or a percentage of `memory_capacity`), per resource. `reservedMemory` must add up
/// to exactly this. The reserved lists are checked as the kubelet's `parseResourceList` checks
/// them (only cpu, memory, ephemeral-storage and pid may be reserved).
pub fn memory_reservation(
    config: &AlignmentConfig,
    memory_capacity: u64,
) -> Result<BTreeMap<String, i64>, AlignmentError> {
    use devicelet_quantity::Quantity;
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for (name, list) in [
        ("kubeReserved", &config.kube_reserved),
        ("systemReserved", &config.system_reserved),
    ] {
        for (resource, value) in list {
            if !matches!(
                resource.as_str(),
                "cpu" | "memory" | "ephemeral-storage" | "pid"
            ) {
                return Err(field(name, format!("cannot reserve {resource:?} resource")));
            }
            let q = Quantity::parse(value).map_err(|e| {
                field(
                    name,
                    format!("failed to parse quantity {value:?} for {resource:?} resource: {e}"),
                )
            })?;
            if q.sign() < 0 {
                return Err(field(
                    name,
                    format!("resource quantity for {resource:?} cannot be negative: {value}"),
                ));
            }
            if resource == "memory" {
                let bytes = i64::try_from(q.value_ceil()).unwrap_or(i64::MAX);
                let e = out.entry("memory".to_owned()).or_insert(0);
                *e = e.saturating_add(bytes);
            }
        }
    }
    // `evictionHard` absent: the kubelet's defaults; present: only what it lists, unless
    // `mergeDefaultEvictionSettings` fills the gaps (cmd/kubelet/app/server.go).
    let threshold = match &config.eviction_hard {
        None => Some(DEFAULT_EVICTION_MEMORY_AVAILABLE.to_owned()),
        Some(map) => map.get("memory.available").cloned().or_else(|| {
            config
                .merge_default_eviction_settings
                .then(|| DEFAULT_EVICTION_MEMORY_AVAILABLE.to_owned())
        }),
    };
    if let Some(value) = threshold {
        let bytes = if let Some(pct) = value.trim().strip_suffix('%') {
            // The kubelet parses the percentage as a float32 fraction and scales the capacity
            // in float64 (`ParsePercentage`, `GetThresholdQuantity`).
            let fraction =
                pct.trim().parse::<f32>().map_err(|e| {
                    field("evictionHard", format!("memory.available: {value:?}: {e}"))
                })? / 100.0;
            (memory_capacity as f64 * f64::from(fraction)) as i64
        } else {
            let q = Quantity::parse(&value)
                .map_err(|e| field("evictionHard", format!("memory.available: {value:?}: {e}")))?;
            i64::try_from(q.value_ceil()).unwrap_or(i64::MAX)
        };
        let e = out.entry("memory".to_owned()).or_insert(0);
        *e = e.saturating_add(bytes);
    }
    Ok(out)
}

/// Starts the memory manager (`memoryManagerPolicy`, `reservedMemory` checked against the
/// memory `kubeReserved`, `systemReserved` and `evictionHard` keep) with its state file
/// `<state_dir>/memory_manager_state`.
fn start_memory_manager(
    config: &AlignmentConfig,
    topology: MemoryTopology,
    state_dir: &Path,
    gates: PodLevelGates,
) -> Result<MemoryManager, AlignmentError> {
    let capacity = topology
        .nodes()
        .values()
        .map(|n| n.memory_bytes)
        .fold(0u64, u64::saturating_add);
    let memory_config = MemoryManagerConfig {
        policy: config.memory_manager_policy.clone(),
        reserved_memory: config
            .reserved_memory
            .iter()
            .map(|r| ReservedMemory {
                numa_node: i64::from(r.numa_node),
                limits: r.limits.clone(),
            })
            .collect(),
        node_allocatable_reservation: memory_reservation(config, capacity)?,
    };
    MemoryManager::new_with_gates(topology, &memory_config, state_dir, gates).map_err(|e| {
        use MemoryManagerError as E;
        match e {
            E::UnknownPolicy(_) | E::BestEffortNotSupported => field("memoryManagerPolicy", e),
            E::ReservedOnMissingNode(_)
            | E::ReservedMismatch { .. }
            | E::ReservedNotInteger
            | E::BadQuantity { .. }
            | E::NoReservedMemory => field("reservedMemory", e),
            other => AlignmentError::MemoryState(other),
        }
    })
}

/// The memory of a described machine's nodes; nodes without a description have none.
fn described_memory(
    numa: &NumaTopology,
    memory: Option<&DescribedMemory>,
) -> Result<MemoryTopology, String> {
    let mut node = NumaMemory::default();
    if let Some(memory) = memory {
        let per_node = devicelet_quantity::Quantity::parse(&memory.per_node)
            .map_err(|e| format!("memory.perNode {:?}: {e}", memory.per_node))?;
        node.memory_bytes = u64::try_from(per_node.value_ceil()).unwrap_or(0);
        for (size, pages) in &memory.hugepages_per_node {
            let q = devicelet_quantity::Quantity::parse(size)
                .map_err(|e| format!("memory.hugepagesPerNode {size:?}: {e}"))?;
            let bytes = u64::try_from(q.value_ceil())
                .ok()
                .filter(|b| *b > 0)
                .ok_or_else(|| format!("memory.hugepagesPerNode {size:?}: not a page size"))?;
            node.hugepages.insert(bytes, *pages);
        }
    }
    MemoryTopology::new(numa.nodes.iter().map(|n| (n.id, node.clone()))).map_err(|e| e.to_string())
}

/// Reads the machine: the described one, or sysfs.
/// The machine's NUMA nodes, CPUs and memory; the memory is a result of its own, because only
/// the Static memory policy needs it.
type Discovered = (
    NumaTopology,
    CpuTopology,
    Result<MemoryTopology, AlignmentError>,
);

fn discover(source: &MachineSource) -> Result<Discovered, AlignmentError> {
    if let Some(machine) = &source.machine {
        let fail = |message: String| AlignmentError::Discovery {
            source_name: "devicelet.machine".into(),
            message,
        };
        let numa = machine.to_topology().map_err(|e| fail(e.to_string()))?;
        let cpus = CpuTopology::from_numa(&numa).map_err(|e| fail(e.to_string()))?;
        let memory = described_memory(&numa, source.memory.as_ref()).map_err(fail);
        return Ok((numa, cpus, memory));
    }
    let root = source
        .sysfs_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(devicelet_machine::SYSFS_ROOT));
    let fail = |message: String| AlignmentError::Discovery {
        source_name: format!("sysfs {}", root.display()),
        message,
    };
    let machine = devicelet_machine::discover(&root).map_err(|e| fail(e.to_string()))?;
    let memory = devicelet_machine::read_memory_topology(&root).map_err(|e| fail(e.to_string()));
    Ok((machine.numa, machine.cpus, memory))
}
