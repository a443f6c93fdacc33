//! Pod admission on the daemon side, following the kubelet's device-manager admit path
//! (Topology Manager → `devicemanager.Allocate` for every init container in order, then every
//! app container; spec devicemanager.md §2 C1): a Kubernetes Pod (k8s-openapi) in, devices per
//! container out. Admission is idempotent by pod UID and all-or-nothing: a rejection leaves
//! no device allocated. Device allocation is serialized, as in the kubelet, because the
//! init-container reuse pool holds one pod at a time; the durable commit that follows runs
//! outside that lock so concurrent admissions share one fsync ([`crate::durable`]). An
//! admission or removal is answered only once it is durable.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use devicelet_cpumanager::{CpuManagerError, pod_from_k8s};
use devicelet_devicemanager::{
    AdmissionError, ContainerKind, ContainerRequest, DeviceManager, RunContainerOptions, validation,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::info;

pub use crate::admitted::{ActivePods, AdmittedPod, ContainerView, PodList, PodRef, PodSync};
use crate::alignment::{AdmitFailure, Alignment, AlignmentRejection, ClaimTopology};
use crate::dra::DraNode;
use crate::durable::{DurableError, DurableState};

/// Why a pod was not admitted (or a pod operation failed).
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The manifest lacks something admission needs.
    #[error("invalid pod: {0}")]
    Invalid(String),
    /// A container asks for an extended resource no device plugin advertises.
    #[error("container {container:?} requests {resource}, which no device plugin advertises")]
    UnknownResource {
        /// Container name.
        container: String,
        /// Resource.
        resource: String,
    },
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
    Alignment(AlignmentRejection),
    /// A DRA claim of the pod could not be allocated, reserved or prepared.
    #[error("claims: {0}")]
    Claims(#[from] crate::dra::DraNodeError),
    /// No pod with this UID is admitted.
    #[error("pod {uid} is not admitted")]
    NotFound {
        /// Pod UID.
        uid: String,
    },
    /// The change could not be made durable, or device ownership is unknown; nothing changed.
    #[error(transparent)]
    Durable(#[from] DurableError),
    /// The pod has no container of that name.
    #[error("pod {uid} has no container {container:?}")]
    NoSuchContainer {
        /// Pod UID.
        uid: String,
        /// Container name.
        container: String,
    },
}

impl PodError {
    /// The reason and message the kubelet gives a pod it refuses for this error
    /// (`topologymanager` / `lifecycle` admit results): `TopologyAffinityError` for a Topology
    /// Manager refusal, `UnexpectedAdmissionError` with "Allocate failed due to ..., which is
    /// unexpected" for every other failure. Cluster mode writes these into the pod's status;
    /// the CLI prints them.
    pub fn kubelet_rejection(&self) -> (&'static str, String) {
        let unexpected = |cause: &dyn std::fmt::Display| {
            format!("Allocate failed due to {cause}, which is unexpected")
        };
        match self {
            PodError::Alignment(AlignmentRejection::TopologyAffinity { .. }) => (
                "TopologyAffinityError",
                "Resources cannot be allocated with Topology locality".to_owned(),
            ),
            // KEP-5526: `PodLevelTopologyAffinityError`, same reason, its own message.
            PodError::Alignment(AlignmentRejection::PodLevelTopologyAffinity { scope, .. }) => {
                ("TopologyAffinityError", scope.kubelet_message().to_owned())
            }
            // KEP-5526: `EmptyPodSharedPoolError`, the policy's text as the message.
            PodError::Alignment(AlignmentRejection::Cpus {
                source: CpuManagerError::EmptyPodSharedPool(text),
                ..
            })
            | PodError::Alignment(AlignmentRejection::Memory {
                source: devicelet_memorymanager::MemoryManagerError::EmptyPodSharedPool(text),
                ..
            }) => ("EmptyPodSharedPoolError", text.clone()),
            // `full-pcpus-only` refusals are admission errors of their own type in the kubelet
            // (`SMTAlignmentError`), with the CPU manager's text as the message.
            PodError::Alignment(AlignmentRejection::Cpus { source, .. }) if is_smt(source) => {
                ("SMTAlignmentError", source.to_string())
            }
            // The managers' own errors, wrapped once as the kubelet wraps them.
            PodError::Alignment(AlignmentRejection::Cpus { source, .. }) => {
                ("UnexpectedAdmissionError", unexpected(source))
            }
            PodError::Alignment(AlignmentRejection::Memory { source, .. }) => {
                ("UnexpectedAdmissionError", unexpected(source))
            }
            _ => ("UnexpectedAdmissionError", unexpected(self)),
        }
    }

    /// A short CamelCase reason for `devicelet_pod_rejections_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            PodError::Invalid(_) => "InvalidPod",
            PodError::UnknownResource { .. } => "UnknownResource",
            PodError::Admission { source, .. } => match source {
                AdmissionError::Allocation(_) => "DeviceAllocationFailed",
                AdmissionError::Endpoint(_) => "DevicePluginUnavailable",
                AdmissionError::Preferred { .. }
                | AdmissionError::Allocate { .. }
                | AdmissionError::PreStart { .. } => "DevicePluginError",
                AdmissionError::Stopped => "Stopping",
            },
            PodError::Alignment(
                AlignmentRejection::TopologyAffinity { .. }
                | AlignmentRejection::PodLevelTopologyAffinity { .. },
            ) => "TopologyAffinityError",
            PodError::Alignment(AlignmentRejection::Cpus {
                source: CpuManagerError::EmptyPodSharedPool(_),
                ..
            })
            | PodError::Alignment(AlignmentRejection::Memory {
                source: devicelet_memorymanager::MemoryManagerError::EmptyPodSharedPool(_),
                ..
            }) => "EmptyPodSharedPoolError",
            PodError::Alignment(AlignmentRejection::Cpus { source, .. }) if is_smt(source) => {
                "SMTAlignmentError"
            }
            PodError::Alignment(
                AlignmentRejection::Cpus { .. } | AlignmentRejection::Memory { .. },
            ) => "UnexpectedAdmissionError",
            PodError::Durable(DurableError::OwnershipUnknown(_)) => "DeviceOwnershipUnknown",
            PodError::Durable(DurableError::Write(_)) => "CheckpointWriteFailed",
            PodError::Claims(crate::dra::DraNodeError::Allocation(_)) => "ClaimAllocationFailed",
            PodError::Claims(_) => "ClaimPreparationFailed",
            PodError::NotFound { .. } => "NotFound",
            PodError::NoSuchContainer { .. } => "NoSuchContainer",
        }
    }
}

/// A `full-pcpus-only` refusal (the kubelet's `SMTAlignmentError`).
fn is_smt(err: &CpuManagerError) -> bool {
    matches!(
        err,
        CpuManagerError::SmtNotMultiple { .. } | CpuManagerError::SmtNotEnoughPhysical { .. }
    )
}

impl From<AdmitFailure> for PodError {
    fn from(failure: AdmitFailure) -> Self {
        match failure {
            AdmitFailure::Admission { container, source } => {
                PodError::Admission { container, source }
            }
            AdmitFailure::Rejected(r) => PodError::Alignment(r),
        }
    }
}

/// Admits pods into a [`DeviceManager`] and remembers them.
#[derive(Debug)]
pub struct PodAdmitter {
    manager: DeviceManager,
    alignment: Arc<Alignment>,
    /// Shared so that readers copy pointers, not pods, while they hold the lock.
    pods: Mutex<BTreeMap<String, Arc<AdmittedPod>>>,
    /// Increases after every change to what [`PodAdmitter::list`] shows (admission,
    /// re-admission, removal), so readers can tell whether an answer built earlier is current.
    generation: AtomicU64,
    admission: tokio::sync::Mutex<()>,
    durable: Arc<DurableState>,
    dra: Option<Arc<DraNode>>,
}

impl PodAdmitter {
    /// An admitter over `manager`.
    pub fn new(manager: DeviceManager) -> Self {
        Self::with_alignment(manager, Arc::new(Alignment::disabled()))
    }

    /// An admitter over `manager` that aligns devices and CPUs with `alignment`.
    pub fn with_alignment(manager: DeviceManager, alignment: Arc<Alignment>) -> Self {
        PodAdmitter {
            manager,
            alignment,
            pods: Mutex::default(),
            generation: AtomicU64::new(0),
            admission: tokio::sync::Mutex::new(()),
            durable: Arc::new(DurableState::disabled()),
            dra: None,
        }
    }

    /// Makes admissions and removals durable in `durable`, starting with the pods restored
    /// from it.
    pub fn with_durable(
        mut self,
        durable: Arc<DurableState>,
        restored: BTreeMap<String, AdmittedPod>,
    ) -> Self {
        // CPUs (and memory) are written before the journal acknowledges a pod, so a crash in
        // between leaves them held by a pod the journal never admitted. The kubelet frees such
        // state only when its `removeStaleState` next runs with the active pods; here the
        // journal is the list of admitted pods, so they are freed at start. Not when the
        // journal is unreadable: then nobody knows which pods are admitted.
        if durable.ownership_unknown().is_none() {
            let admitted: std::collections::HashSet<String> = restored.keys().cloned().collect();
            self.alignment.retain_pods(&admitted);
        }
        self.durable = durable;
        self.pods = Mutex::new(
            restored
                .into_iter()
                .map(|(uid, mut pod)| {
                    for c in &mut pod.containers {
                        c.memory = self
                            .alignment
                            .memory_blocks(&uid, &c.name)
                            .into_iter()
                            .map(Into::into)
                            .collect();
                    }
                    (uid, Arc::new(pod))
                })
                .collect(),
        );
        self
    }

    /// The durable state behind this admitter.
    pub fn durable(&self) -> &Arc<DurableState> {
        &self.durable
    }

    /// Also admits pods' DRA claims through `dra`.
    pub fn with_dra(mut self, dra: Arc<DraNode>) -> Self {
        self.dra = Some(dra);
        self
    }

    /// The DRA side, if enabled.
    pub fn dra(&self) -> Option<&Arc<DraNode>> {
        self.dra.as_ref()
    }

    fn pods(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<AdmittedPod>>> {
        self.pods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits `pod`; an already admitted UID returns its existing allocation. Records
    /// `devicelet_pod_admissions_total` (new admissions only) or
    /// `devicelet_pod_rejections_total{reason}`.
    pub async fn admit(&self, pod: &Pod) -> Result<AdmittedPod, PodError> {
        self.admit_timed(pod).await.0
    }

    /// [`Self::admit`], also saying where the time went (the pod start-up record of cluster
    /// mode); the timings cover the last attempt only and are zero for what it did not do.
    pub async fn admit_timed(
        &self,
        pod: &Pod,
    ) -> (Result<AdmittedPod, PodError>, AdmissionTimings) {
        let start = std::time::Instant::now();
        let known = pod
            .metadata
            .uid
            .as_ref()
            .is_some_and(|uid| self.pods().contains_key(uid));
        let mut timings = AdmissionTimings::default();
        let result = self.admit_pod(pod, &mut timings).await;
        let metrics = self.manager.metrics();
        match &result {
            Ok(_) if !known => metrics.pod_admitted(start.elapsed()),
            Ok(_) => {}
            Err(err) => metrics.pod_rejected(err.reason()),
        }
        (result, timings)
    }

    async fn admit_pod(
        &self,
        pod: &Pod,
        timings: &mut AdmissionTimings,
    ) -> Result<AdmittedPod, PodError> {
        if let Some(reason) = self.durable.ownership_unknown() {
            return Err(DurableError::OwnershipUnknown(reason.to_owned()).into());
        }
        let serial = self.admission.lock().await;
        let meta = &pod.metadata;
        let uid = meta
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| PodError::Invalid("metadata.uid is missing".into()))?;
        let existing = self.pods().get(&uid).map(|p| AdmittedPod::clone(p));
        if let Some(mut existing) = existing {
            drop(serial);
            // Re-admission (e.g. sandbox re-created after a reboot): claims not prepared on
            // this boot are prepared again; prepared ones cost no driver call.
            if let Some(dra) = &self.dra {
                timings.claims = dra.admit_timed(pod).await?.1;
                for c in &mut existing.containers {
                    c.claims = dra.container_claims(&uid, &c.name);
                }
                // Claims may have been prepared again.
                self.changed();
            }
            return Ok(existing);
        }
        let name = meta
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| PodError::Invalid("metadata.name is missing".into()))?;
        let namespace = meta
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let spec = pod
            .spec
            .as_ref()
            .ok_or_else(|| PodError::Invalid("spec is missing".into()))?;

        let mut plan: Vec<(ContainerKind, &Container)> = Vec::new();
        for c in spec.init_containers.iter().flatten() {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            plan.push((kind, c));
        }
        plan.extend(spec.containers.iter().map(|c| (ContainerKind::App, c)));

        let known = self.manager.capacity().capacity;
        let dra_backed = dra_backed_resources(pod);
        let mut requests = Vec::with_capacity(plan.len());
        for (kind, container) in plan {
            let mut limits = device_limits(container)?;
            // C2: an extended resource the scheduler mapped to a DRA claim (KEP-5004,
            // DRAExtendedResource) is not a device plugin's to allocate.
            limits.retain(|resource, _| {
                !dra_backed.contains(&(container.name.as_str(), resource.as_str()))
            });
            if let Some(resource) = limits.keys().find(|r| !known.contains_key(*r)) {
                return Err(PodError::UnknownResource {
                    container: container.name.clone(),
                    resource: resource.clone(),
                });
            }
            requests.push(ContainerRequest {
                pod_uid: uid.clone(),
                container: container.name.clone(),
                kind,
                limits,
                affinity: None,
            });
        }

        let plan: Vec<_> = requests
            .iter()
            .map(|r| (r.container.clone(), r.limits.clone(), r.kind))
            .collect();
        // The pod as the Topology and CPU managers see it, converted once.
        let info = pod_from_k8s(pod).map_err(|e| PodError::Invalid(e.to_string()))?;
        // DRA claims as a hint provider (devicelet's addition, docs/topology.md): their devices
        // are chosen before alignment (local mode: allocated and reserved here, as the
        // scheduler would have), so the Topology Manager sees their NUMA nodes. Only when
        // hints are asked for; otherwise claims are handled after alignment as before.
        let early_claims = match &self.dra {
            Some(dra) if self.alignment.uses_hints() => Some(dra.claim_numa(pod).await?),
            _ => None,
        };
        let claim_topology = ClaimTopology::new(pod, early_claims.clone().unwrap_or_default());
        // From here on the pod holds devices and CPUs: the guard gives them back on every
        // return that is not the commit below.
        let guard = AdmissionGuard {
            admitter: self,
            uid: uid.clone(),
            committed: false,
        };
        // Topology Manager + device and CPU allocation.
        let aligned = match self
            .alignment
            .admit(&self.manager, &info, requests, &claim_topology)
            .await
        {
            Ok(aligned) => aligned,
            Err(failure) => {
                drop(guard);
                drop(serial);
                // Local mode allocated and reserved the claims above: a refused pod keeps none.
                if let (Some(dra), Some(claims)) = (&self.dra, &early_claims)
                    && !claims.is_empty()
                    && matches!(dra.origin(), crate::dra::ClaimOrigin::Local)
                    && let Err(e) = dra.remove(&uid).await
                {
                    tracing::warn!(pod_uid = %uid, error = %e, "releasing the claims of a refused pod failed");
                }
                return Err(failure.into());
            }
        };
        timings.plugin_allocate = aligned.iter().map(|a| a.plugin_allocate).sum();
        let mut containers: Vec<ContainerView> = plan
            .into_iter()
            .zip(aligned)
            .map(|((name, limits, kind), got)| ContainerView {
                name,
                devices: got.devices,
                claims: Vec::new(),
                allocated_resources_status: Vec::new(),
                cpus: got.cpus,
                numa_affinity: got.numa_affinity,
                memory: got.memory.into_iter().map(Into::into).collect(),
                limits,
                kind,
            })
            .collect();
        // Claims are prepared outside the allocation lock: a pod whose claim GETs and driver
        // calls take a while holds up no other pod's admission.
        drop(serial);
        if let Some(dra) = &self.dra {
            // All or nothing: a claim that cannot be prepared frees the devices and CPUs.
            timings.claims = dra.admit_timed(pod).await?.1;
            for c in &mut containers {
                c.claims = dra.container_claims(&uid, &c.name);
            }
        }
        let admitted = AdmittedPod {
            pod: PodRef {
                namespace,
                name,
                uid: uid.clone(),
            },
            containers,
        };
        // Durable before it is answered; the fsync is shared with concurrent admissions, so it
        // runs after the allocation lock is released.
        let changes = self.durable.admission_changes(&admitted, &self.manager);
        let writing = std::time::Instant::now();
        // One ordered commit: memory_manager_state and cpu_manager_state (what was assigned in
        // memory above; one write may cover several admissions), then the journal, which
        // acknowledges the pod. dra_manager_state was written by prepare, before a driver's
        // answer counted. A crash in between leaves CPUs and memory of an unacknowledged pod,
        // which `retain_pods` frees at the next start.
        self.alignment
            .persist_state(&admitted.containers)
            .await
            .map_err(PodError::Alignment)?;
        self.durable.commit(changes).await?;
        timings.state_write = writing.elapsed();
        guard.commit();
        info!(pod_uid = %uid, pod = %admitted.pod.name, "pod admitted");
        self.pods().insert(uid, Arc::new(admitted.clone()));
        self.changed();
        Ok(admitted)
    }

    /// Runtime settings for a container start (PreStartContainer first when asked for).
    pub async fn start(&self, uid: &str, container: &str) -> Result<RunContainerOptions, PodError> {
        let dra_known = self.dra.as_ref().is_some_and(|d| d.has_pod(uid));
        let limits = {
            let pods = self.pods();
            match pods.get(uid) {
                Some(pod) => pod
                    .containers
                    .iter()
                    .find(|c| c.name == container)
                    .map(|c| c.limits.clone())
                    .ok_or_else(|| PodError::NoSuchContainer {
                        uid: uid.to_owned(),
                        container: container.to_owned(),
                    })?,
                // Restarted daemon: the claims are durable even where devices are not.
                None if dra_known => BTreeMap::new(),
                None => {
                    return Err(PodError::NotFound {
                        uid: uid.to_owned(),
                    });
                }
            }
        };
        // D1: settings lost with an undecodable checkpoint entry are asked for again, and the
        // new answer is made durable before it is used.
        let refreshed = self
            .manager
            .refresh_lost_responses(uid, container, &limits)
            .await
            .map_err(|source| PodError::Admission {
                container: container.to_owned(),
                source,
            })?;
        let admitted = self.pods().get(uid).cloned();
        if let (true, Some(pod)) = (refreshed, admitted) {
            let changes = self.durable.admission_changes(&pod, &self.manager);
            self.durable.commit(changes).await?;
        }
        let mut options = self
            .manager
            .run_container_options(uid, container, &limits)
            .await
            .map_err(|source| PodError::Admission {
                container: container.to_owned(),
                source,
            })?
            .unwrap_or_default();
        options.cpuset_cpus = self.alignment.cpuset_for(uid, container);
        // The kubelet's PreCreateContainer: the memory manager's nodes, joined with commas.
        let mems = self.alignment.memory_numa_nodes(uid, container);
        if !mems.is_empty() {
            let mems: Vec<String> = mems.iter().map(usize::to_string).collect();
            options.cpuset_mems = Some(mems.join(","));
        }
        if let Some(dra) = &self.dra {
            for id in dra.container_cdi_devices(uid, container)? {
                if !options.cdi_devices.contains(&id) {
                    options.cdi_devices.push(id);
                }
            }
        }
        Ok(options)
    }

    /// Forgets a pod and frees its devices, once the removal is durable (freeing first could
    /// let a crash leave two owners of a device in the journal).
    pub async fn remove(&self, uid: &str) -> Result<(), PodError> {
        if !self.pods().contains_key(uid) {
            return Err(PodError::NotFound {
                uid: uid.to_owned(),
            });
        }
        self.durable
            .commit(vec![devicelet_checkpoint::state::Change::RemovePod {
                pod_uid: uid.to_owned(),
            }])
            .await?;
        self.pods().remove(uid);
        self.manager.remove_pod(uid);
        self.alignment.remove_pod(uid);
        self.changed();
        info!(pod_uid = %uid, "pod removed; devices freed");
        Ok(())
    }

    /// The set of pods still active on the node is known (the kubelet's
    /// `UpdateAllocatedDevices`, spec §2.C C7, and restart recovery, §3.4): every admitted pod
    /// not in `active` is removed as by [`PodAdmitter::remove_with_claims`]. The removals are
    /// made durable in one commit before any device is freed. Admissions wait meanwhile, so a
    /// pod being admitted is never mistaken for a gone one (the kubelet's
    /// `TestDevicesToAllocateConflictWithUpdateAllocatedDevices` race).
    pub async fn retain_active(
        &self,
        active: &std::collections::HashSet<String>,
    ) -> Result<PodSync, PodError> {
        let serial = self.admission.lock().await;
        let (gone, kept): (Vec<String>, Vec<String>) = self
            .pods()
            .keys()
            .cloned()
            .partition(|uid| !active.contains(uid));
        if !gone.is_empty() {
            self.durable
                .commit(
                    gone.iter()
                        .map(|uid| devicelet_checkpoint::state::Change::RemovePod {
                            pod_uid: uid.clone(),
                        })
                        .collect(),
                )
                .await?;
        }
        for uid in &gone {
            self.pods().remove(uid);
            self.manager.remove_pod(uid);
            self.alignment.remove_pod(uid);
            self.changed();
            info!(pod_uid = %uid, "pod no longer active; devices freed");
        }
        // Exclusive CPUs of any other pod that is not active (one never acknowledged: a crash
        // between the CPU state and the journal, a rollback that could not be written) are
        // freed too, as the kubelet's `removeStaleState` does.
        self.alignment.retain_pods(active);
        drop(serial);
        let mut pending_unprepare = Vec::new();
        if let Some(dra) = &self.dra {
            for uid in gone.iter().filter(|uid| dra.has_pod(uid)) {
                // A driver that does not answer leaves the pod pending; the DRA node retries.
                if let Err(e) = dra.remove(uid).await {
                    tracing::warn!(pod_uid = %uid, error = %e, "unprepare of a gone pod failed; will retry");
                    pending_unprepare.push(uid.clone());
                }
            }
        }
        Ok(PodSync {
            removed: gone,
            kept: kept.len(),
            pending_unprepare,
        })
    }

    /// [`PodAdmitter::remove`], then the pod's DRA claims are unprepared and released. A
    /// driver that does not answer leaves the claims pending: the error says so and devicelet
    /// retries in the background until the driver unprepares them.
    pub async fn remove_with_claims(&self, uid: &str) -> Result<(), PodError> {
        let devices = self.remove(uid).await;
        let Some(dra) = self.dra.as_ref().filter(|d| d.has_pod(uid)) else {
            return devices;
        };
        dra.remove(uid).await?;
        match devices {
            // Known to the DRA side only (removed earlier while its driver was away).
            Ok(()) | Err(PodError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Appends the DRA part of `allocatedResourcesStatus` (B17: `claim:<pod claim>[/<request>]`
    /// entries) to the app containers of `pods`.
    pub fn annotate_claim_health(&self, pods: &mut [AdmittedPod]) {
        let Some(dra) = &self.dra else { return };
        for pod in pods {
            for c in pod
                .containers
                .iter_mut()
                .filter(|c| c.kind == ContainerKind::App)
            {
                c.allocated_resources_status
                    .extend(dra.claim_resource_status(&pod.pod.uid, &c.name));
            }
        }
    }

    /// The admitted pod with this namespace and name.
    pub fn get(&self, namespace: &str, name: &str) -> Option<AdmittedPod> {
        self.pods()
            .values()
            .find(|p| p.pod.namespace == namespace && p.pod.name == name)
            .map(|p| AdmittedPod::clone(p))
    }

    /// The device manager pods are admitted into.
    pub fn manager(&self) -> &DeviceManager {
        &self.manager
    }

    /// NUMA alignment and the CPU manager.
    pub fn alignment(&self) -> &Alignment {
        &self.alignment
    }

    /// Marks a change of the admitted pods (after it is made; see `generation`).
    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// A number that increases after every admission, re-admission and removal. An answer
    /// built from the pods after reading generation `g` is current for every reader that saw
    /// generation `g` or lower.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Every admitted pod as it was admitted (device lists, CPUs, no live claim values),
    /// shared rather than copied: the pods lock is held only to copy pointers, so a reader of
    /// thousands of pods does not hold up admissions.
    pub fn snapshot(&self) -> Vec<Arc<AdmittedPod>> {
        self.pods().values().cloned().collect()
    }

    /// Admitted pods.
    pub fn list(&self) -> PodList {
        let mut pods: Vec<AdmittedPod> = self
            .pods()
            .values()
            .map(|p| AdmittedPod::clone(p))
            .collect();
        if let Some(dra) = &self.dra {
            // Claims carry live device health.
            for pod in &mut pods {
                for c in &mut pod.containers {
                    c.claims = dra.container_claims(&pod.pod.uid, &c.name);
                }
            }
        }
        PodList { pods }
    }
}

/// An admission in progress: the devices and exclusive CPUs the pod got so far. Dropping it
/// without [`AdmissionGuard::commit`] (a rejection, an error, a failed write, a cancelled
/// future) gives them back, so every exit of `admit_pod` is all-or-nothing without a rollback
/// at each `return`. Claims are not part of it: their preparation is durable on its own in
/// `dra_manager_state`, as in the kubelet (where claims are prepared in pod sync, after
/// admission), and they are unprepared when the pod is removed.
/// Where the time of one admission went ([`PodAdmitter::admit_timed`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdmissionTimings {
    /// Preparing the pod's DRA claims (claim reads, drivers, `dra_manager_state`).
    pub claims: devicelet_dra::PrepareTimings,
    /// Allocating devices, nearly all of it the device plugins' `Allocate` calls.
    pub plugin_allocate: std::time::Duration,
    /// Making the admission durable: `memory_manager_state`, `cpu_manager_state` and the
    /// device journal (group commit).
    pub state_write: std::time::Duration,
}

struct AdmissionGuard<'a> {
    admitter: &'a PodAdmitter,
    uid: String,
    committed: bool,
}

impl AdmissionGuard<'_> {
    /// The admission is durable: the pod keeps what it got.
    fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for AdmissionGuard<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        self.admitter.manager.remove_pod(&self.uid);
        self.admitter.alignment.remove_pod(&self.uid);
    }
}

/// (container, resource) pairs that `status.extendedResourceClaimStatus.requestMappings` backs
/// with a DRA claim.
fn dra_backed_resources(pod: &Pod) -> std::collections::HashSet<(&str, &str)> {
    pod.status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|e| {
            e.request_mappings
                .iter()
                .map(|m| (m.container_name.as_str(), m.resource_name.as_str()))
                .collect()
        })
        .unwrap_or_default()
}

/// Extended-resource limits of a container as integer device counts (the kubelet reads
/// limits only; requests are ignored). Fractional or negative counts are rejected.
fn device_limits(container: &Container) -> Result<BTreeMap<String, u64>, PodError> {
    let mut limits = BTreeMap::new();
    let Some(resources) = container.resources.as_ref().and_then(|r| r.limits.as_ref()) else {
        return Ok(limits);
    };
    for (resource, quantity) in resources {
        if !validation::is_extended_resource_name(resource) {
            continue;
        }
        let text = quantity.0.trim();
        // Any Kubernetes quantity that is a whole, non-negative number ("2", "1k", "1e1") is a
        // device count, as the kubelet's Quantity.Value() reads it; fractions are refused.
        let count = devicelet_quantity::Quantity::parse(text)
            .ok()
            .filter(|q| q.sign() >= 0 && q.is_integer())
            .and_then(|q| u64::try_from(q.value_ceil()).ok())
            .ok_or_else(|| {
                PodError::Invalid(format!(
                    "container {:?}: limit {resource}={text:?} is not a non-negative integer device count",
                    container.name
                ))
            })?;
        limits.insert(resource.clone(), count);
    }
    Ok(limits)
}

#[cfg(test)]
mod device_limit_tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    fn container_with_limit(value: &str) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "example.com/gpu".to_string(),
                    K8sQuantity(value.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn c1_device_counts_accept_any_whole_quantity_and_refuse_fractions() {
        for (text, want) in [("2", 2), ("1k", 1000), ("1e1", 10), ("3000m", 3), ("0", 0)] {
            let limits = device_limits(&container_with_limit(text)).unwrap();
            assert_eq!(limits.get("example.com/gpu"), Some(&want), "{text}");
        }
        for text in ["1.5", "500m", "-1", "abc", ""] {
            let err = device_limits(&container_with_limit(text)).unwrap_err();
            assert!(
                err.to_string()
                    .contains("not a non-negative integer device count"),
                "{text}: {err}"
            );
        }
    }
}
