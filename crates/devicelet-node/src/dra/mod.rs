//! DRA on the node: the daemon's side of Dynamic Resource Allocation.
//!
//! Follows `pkg/kubelet/cm/dra/manager.go` and `plugin/dra_plugin_manager.go` (spec
//! dra-kubelet.md §1.7–§1.12, §2, E1–E4 fixed in `devicelet-dra`) plus, because there is no API
//! server, the parts of the scheduler and the resourceclaim controller a single host needs
//! (ecosystem.md A7, A8). [`DraNode`] is split by operation:
//! - [`store`]: DeviceClasses, ResourceSlices, ResourceClaims and ResourceClaimTemplates
//!   stored by `devicelet apply` in `R/devicelet/dra_objects.json`, plus the admitted pods that
//!   use claims ([`LocalStore`], the [`ClaimSource`] of the local flow); `objects`: its writes.
//! - `admit`: admission of a pod's claims (template claims created, unallocated claims
//!   allocated by `devicelet-allocator` against stored and driver-published slices, claims
//!   reserved for the pod, then prepared through the drivers by the [`ClaimCache`]).
//! - `release`: removal (unprepare from cached information, then release; an unprepare that
//!   fails is retried in the background until the driver answers, and the claim is not
//!   released before that, B19).
//! - `drivers` and `health`: driver instances registered by the plugin watcher (the
//!   `"DRAPlugin"` handler is devicelet-rpc's `DraHandler`), their `v1alpha1` health streams
//!   (cancel handle stored before the stream starts, E21) and the wipe of a driver's published
//!   ResourceSlices when no instance came back within the wipe delay (§1.11).
//! - [`numa`]: the NUMA nodes of a pod's claim devices (`resource.kubernetes.io/numaNode`),
//!   the Topology Manager's DRA hints (devicelet's addition, not upstream 1.36).
//! - `views`: what the node shows (claim devices per container, CDI devices, `GET /v1/dra`).
//!
//! The seam that replaces the API server: drivers publish their ResourceSlices with
//! `POST /v1/resourceslices` on the control socket and read claims with
//! `GET /v1/resourceclaims/{namespace}/{name}` (see docs/dra.md).
//!
//! In cluster mode ([`ClaimOrigin::Api`]) there is an API server: claims are read from it (one
//! GET per claim), the scheduler allocates and reserves them and kube-controller-manager
//! creates template claims, so admission only checks and prepares (spec cluster.md §3).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use devicelet_dra::{ClaimSource, DraError};

mod admit;
mod drivers;
mod health;
mod health_cache;
mod node;
pub mod numa;
mod objects;
mod release;
pub mod store;
pub mod views;

pub use node::DraNode;
pub use numa::{ClaimDeviceNuma, ClaimNuma, NUMA_NODE_ATTRIBUTE};
pub use store::{LocalStore, Objects, recover_dra};
pub use views::{ClaimDeviceView, DraSnapshot, DriverView};

/// File of the local DRA objects, in `R/devicelet`.
pub const OBJECTS_FILE: &str = "dra_objects.json";
/// Quarantine marker of the local DRA objects (in `R/devicelet`): present while the objects
/// file could not be read, until `devicelet state recover`.
pub const OBJECTS_QUARANTINE_FILE: &str = "dra_objects.quarantine";
/// How long a driver's published slices survive after its last instance went away (§1.11).
pub const DEFAULT_WIPE_DELAY: Duration = Duration::from_secs(30);
/// Pause between health streams of one instance (§1.10).
pub const HEALTH_RESTART_DELAY: Duration = Duration::from_secs(5);
/// Period of the background unprepare retry for removed pods.
pub const UNPREPARE_RETRY_PERIOD: Duration = Duration::from_secs(1);

/// Why a DRA operation on the node failed.
#[derive(Debug, thiserror::Error)]
pub enum DraNodeError {
    /// An object given to `apply` or `publish` is not usable.
    #[error("invalid object: {0}")]
    Invalid(String),
    /// Something the pod refers to does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The structured allocator found no devices (the text is its explanation).
    #[error("{0}")]
    Allocation(String),
    /// Preparing or unpreparing through a driver failed.
    #[error(transparent)]
    Dra(#[from] DraError),
    /// The local store could not be written.
    #[error("writing {path}: {reason}")]
    Store {
        /// File.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
    /// The local DRA objects could not be read at start: DRA is fail-closed (nothing is
    /// allocated, reserved, prepared or released) until the operator recovers.
    #[error(
        "DRA objects state unknown: {detail}; DRA operations are refused until `devicelet state recover` (stop devicelet, drain the node's DRA pods, then recover; marker {marker})"
    )]
    StateUnknown {
        /// What happened to the file.
        detail: String,
        /// The quarantine marker.
        marker: PathBuf,
    },
}

// ------------------------------------------------------------------------------ origin

/// Where the node's ResourceClaims come from.
#[derive(Clone, Default)]
pub enum ClaimOrigin {
    /// The local store (`devicelet apply`): admission creates template claims, allocates
    /// with the structured allocator and reserves claims for the pod, as the control plane
    /// would.
    #[default]
    Local,
    /// The API server (cluster mode): claims are read through the source, one uncached GET
    /// each, and only checked (allocated, reserved for the pod, same UID as the checkpoint)
    /// and prepared; allocation, reservation and template claims belong to the control plane.
    Api(Arc<dyn ClaimSource>),
}

impl std::fmt::Debug for ClaimOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimOrigin::Local => f.write_str("Local"),
            ClaimOrigin::Api(_) => f.write_str("Api"),
        }
    }
}
