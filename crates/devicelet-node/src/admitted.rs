//! What the node shows of an admitted pod: the DESIGN.md `admit` / `get pods` JSON
//! ([`AdmittedPod`], [`PodList`]) and `sync-pods` ([`PodSync`]). Plain data; admission
//! ([`crate::pods`]) builds it, the durable state ([`crate::durable`]) records and restores it.

use std::collections::BTreeMap;

use devicelet_devicemanager::ContainerKind;
use serde::{Deserialize, Serialize};

use crate::dra::views::ClaimDeviceView;

/// Identity of an admitted pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// One container's allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerView {
    /// Container name.
    pub name: String,
    /// Device IDs per resource.
    pub devices: BTreeMap<String, Vec<String>>,
    /// DRA claims: one entry per prepared device, with live health.
    #[serde(default)]
    pub claims: Vec<ClaimDeviceView>,
    /// KEP-4680 health of the container's devices (app containers; filled from the live
    /// inventory when pods are shown by `crate::health`).
    #[serde(
        default,
        rename = "allocatedResourcesStatus",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allocated_resources_status: Vec<ResourceStatus>,
    /// Exclusive CPUs (static CPU manager policy); absent for the shared pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// NUMA nodes of the merged topology hint; absent without affinity.
    #[serde(
        default,
        rename = "numaAffinity",
        skip_serializing_if = "Option::is_none"
    )]
    pub numa_affinity: Option<Vec<usize>>,
    /// Memory and huge pages pinned to NUMA nodes (Static memory manager policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<MemoryView>,
    /// Device-plugin limits, kept for `start`.
    #[serde(skip)]
    pub limits: BTreeMap<String, u64>,
    /// Init, sidecar or app: PodResources lists sidecars and app containers only.
    #[serde(skip, default = "app_container")]
    pub kind: ContainerKind,
}

/// One memory block of a container (the memory manager's `Block`, PodResources
/// `ContainerMemory`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryView {
    /// `memory` or `hugepages-<size>`.
    #[serde(rename = "type")]
    pub memory_type: String,
    /// Bytes.
    pub size: u64,
    /// NUMA nodes the block is on.
    pub numa_nodes: Vec<usize>,
}

impl From<devicelet_memorymanager::MemoryBlock> for MemoryView {
    fn from(block: devicelet_memorymanager::MemoryBlock) -> Self {
        MemoryView {
            memory_type: block.resource,
            size: block.size,
            numa_nodes: block.numa_affinity,
        }
    }
}

fn app_container() -> ContainerKind {
    ContainerKind::App
}

/// DESIGN.md `admit` JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmittedPod {
    /// The pod.
    pub pod: PodRef,
    /// Containers in admission order (init containers first).
    pub containers: Vec<ContainerView>,
}

/// DESIGN.md `get pods` JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodList {
    /// Admitted pods by UID.
    pub pods: Vec<AdmittedPod>,
}

/// What [`crate::pods::PodAdmitter::retain_active`] did (`devicelet sync-pods` JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSync {
    /// Admitted pods that were not active: removed, their devices and CPUs freed.
    pub removed: Vec<String>,
    /// How many admitted pods are active and kept.
    pub kept: usize,
    /// Removed pods whose claims a driver has not unprepared yet (retried in the background).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_unprepare: Vec<String>,
}

/// Body of `POST /v1/pods/sync`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivePods {
    /// UIDs of every pod still active on the node.
    pub active_pods: Vec<String>,
}

/// `core/v1.ResourceStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceStatus {
    /// The resource name (device plugins) or `claim:<name>` (DRA).
    pub name: String,
    /// One entry per device.
    #[serde(default)]
    pub resources: Vec<ResourceHealth>,
}

/// `core/v1.ResourceHealth`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceHealth {
    /// The device ID.
    #[serde(rename = "resourceID")]
    pub resource_id: String,
    /// `Healthy`, `Unhealthy` (or `Unknown` for DRA).
    pub health: String,
    /// The DRA driver's message for the device's health (1.36 `ResourceHealth.message`, gate
    /// `ResourceHealthStatusMessage`, beta and on): only a non-empty message from a current
    /// report; absent for device plugin devices, whose API has no message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
