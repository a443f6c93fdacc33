//! The seam between the cluster front end and the node core.
//!
//! The cluster front end (Node status, Lease, the pod watcher) drives the same node logic as
//! the local control API: admission, release and health all go through [`NodeCore`]. The
//! binary implements it on the node; tests implement it with an in-memory fake.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceStatus};
use tokio::sync::watch;

use crate::node_status::DeviceCapacity;

/// Why the node rejected a pod, in the kubelet's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// CamelCase reason (`UnexpectedAdmissionError`, `TopologyAffinityError`, ...).
    pub reason: String,
    /// What happened, for the pod's status message.
    pub message: String,
    /// The pod cannot be admitted *yet* (a claim not ready, a DRA driver away, an API error):
    /// it stays Pending and is tried again with back-off, as the kubelet's pod sync retries
    /// `PrepareResources`; `false` is a final rejection (the pod is Failed).
    pub retry: bool,
    /// With `retry`: the cause clears on its own within milliseconds, with no event the node
    /// can watch for (the Node authorizer has not linked the pod's claim to the node yet), so
    /// the pod is tried again after a few milliseconds rather than the usual back-off.
    pub retry_soon: bool,
}

/// Where the node spent an admission's time, for the pod start-up record
/// ([`crate::startup`]). Zero for what the admission did not do.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdmitStages {
    /// Reading the pod's ResourceClaims from the API server.
    pub claim_get: Duration,
    /// The DRA drivers' NodePrepareResources (the drivers' own time, not devicelet's).
    pub driver_prepare: Duration,
    /// The device plugins' `Allocate` calls (the plugins' own time, not devicelet's).
    pub plugin_allocate: Duration,
    /// Durable writes: `dra_manager_state`, the CPU and memory state, the device journal.
    pub checkpoint_write: Duration,
}

/// A failure of the node to release a pod (logged and retried by the caller).
pub type ReleaseError = Box<dyn std::error::Error + Send + Sync>;

/// What the cluster front end needs of the node.
pub trait NodeCore: Send + Sync + 'static {
    /// Admits `pod` (devices, Topology and CPU managers, DRA claims), durably. Idempotent by
    /// UID: an admitted pod gets its existing allocation. Says where the time went.
    fn admit(&self, pod: &Pod) -> impl Future<Output = Result<AdmitStages, Rejection>> + Send;

    /// Releases an admitted pod's devices, CPUs and claims; a pod that is not admitted is a
    /// no-op.
    fn release(&self, uid: &str) -> impl Future<Output = Result<(), ReleaseError>> + Send;

    /// Whether `uid` is admitted.
    fn is_admitted(&self, uid: &str) -> bool;

    /// UIDs of every admitted pod.
    fn admitted(&self) -> Vec<String>;

    /// Resources the node knew before it restarted whose plugin has not registered again and
    /// reported its devices yet (admitting a pod that needs one now would fail).
    fn awaiting_plugins(&self) -> Vec<String>;

    /// Device plugin resources (`GetCapacity`).
    fn capacity(&self) -> DeviceCapacity;

    /// Bumped whenever the device inventory changes (capacity or health).
    fn inventory_changes(&self) -> watch::Receiver<u64>;

    /// `allocatedResourcesStatus` per container name of an admitted pod (KEP-4680).
    fn resource_health(&self, uid: &str) -> BTreeMap<String, Vec<ResourceStatus>>;

    /// Bumped whenever DRA device health from the drivers' health streams changes; `None`
    /// without DRA.
    fn claim_health_changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// Names of the DRA drivers with at least one connected plugin instance.
    fn dra_drivers(&self) -> Vec<String> {
        Vec::new()
    }

    /// What each NUMA node can still give a new pod, for the scheduler
    /// ([`crate::numa_resources`]); `None` when the node aligns nothing.
    fn numa_resources(&self) -> Option<crate::numa_resources::NumaResources> {
        None
    }

    /// Bumped whenever an admission or a release changes what [`NodeCore::numa_resources`]
    /// says; `None` when it never changes.
    fn allocation_changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }
}

/// What a container runtime reports of one pod, in the API's shapes: `phase`, and
/// `v1.ContainerStatus` objects (`name`, `state`, `lastState`, `containerID`, `restartCount`,
/// `ready`, `started`, `image`, `imageID`) in spec order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimePodStatus {
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    /// Whether the pod's sandbox exists (the `PodReadyToStartContainers` condition).
    pub sandbox_ready: bool,
    /// Init containers' statuses.
    pub init_container_statuses: Vec<serde_json::Value>,
    /// App containers' statuses.
    pub container_statuses: Vec<serde_json::Value>,
}

/// A future the runtime seam returns.
pub type RuntimeFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ReleaseError>> + Send + 'a>>;

/// A real container runtime under the cluster front end (`serve --runtime cri`): admitted
/// pods are handed to it, deleted ones killed before their devices are released, and their
/// statuses come from it. The binary implements it on devicelet's CRI runtime.
pub trait PodRuntime: Send + Sync + 'static {
    /// The runtime's name (the Node's `containerRuntimeVersion` scheme).
    fn name(&self) -> String;
    /// Runs an admitted pod (idempotent: a pod it runs is not started again).
    fn run_pod(&self, pod: &Pod) -> Result<(), ReleaseError>;
    /// Stops the pod's containers within `grace` and removes its sandbox (idempotent).
    fn kill_pod<'a>(&'a self, uid: &'a str, grace: Duration) -> RuntimeFuture<'a>;
    /// The pod's status, once the runtime looked at it.
    fn status(&self, uid: &str) -> Option<RuntimePodStatus>;
    /// Bumped whenever a pod's status changes.
    fn changes(&self) -> watch::Receiver<u64>;
}
