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
//! - `views`: what the node shows (claim devices per container, CDI devices, `GET /v1/dra`).
//!
//! The seam that replaces the API server: drivers publish their ResourceSlices with
//! `POST /v1/resourceslices` on the control socket and read claims with
//! `GET /v1/resourceclaims/{namespace}/{name}` (see docs/dra.md).
//!
//! In cluster mode ([`ClaimOrigin::Api`]) there is an API server: claims are read from it (one
//! GET per claim), the scheduler allocates and reserves them and kube-controller-manager
//! creates template claims, so admission only checks and prepares (spec cluster.md §3).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use devicelet_dra::{BootIdSource, ClaimCache, ClaimSource, DraError, DraPluginRegistry};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;

mod admit;
mod drivers;
mod health;
mod objects;
mod release;
pub mod store;
mod views;

use health::HealthCache;
pub use store::{LocalStore, Objects, recover_dra};
use store::{key, ns_of};
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

// -------------------------------------------------------------------------------- node

/// The node's DRA state; cheap to share behind an `Arc`.
pub struct DraNode {
    node_name: String,
    store: Arc<LocalStore>,
    registry: DraPluginRegistry,
    cache: ClaimCache,
    published: Mutex<BTreeMap<String, Vec<ResourceSlice>>>,
    health: Arc<HealthCache>,
    health_tasks: Mutex<HashMap<(String, PathBuf), watch::Sender<bool>>>,
    wipe_delay: Duration,
    /// Pending slice wipes: driver → token of the wipe task that may act (§1.11).
    wipes: Mutex<HashMap<String, u64>>,
    next_wipe: std::sync::atomic::AtomicU64,
    /// Allocation, reservation and release are serialized (one scheduler, one controller).
    admission: tokio::sync::Mutex<()>,
    /// Removed pods whose claims are not unprepared yet.
    pending: Mutex<BTreeSet<String>>,
    /// Where claims come from.
    origin: ClaimOrigin,
    /// Cluster mode after a reboot: pods whose claims are to be prepared again.
    reprepare: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for DraNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraNode")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DraNode {
    /// Opens the node's DRA state under the kubelet root `root`: the local store in
    /// `R/devicelet/dra_objects.json` and the claim cache `R/dra_manager_state` (restart
    /// recovery: claims prepared on this boot stay prepared; after a reboot they are prepared
    /// again). `origin` says where claims come from; the store also keeps the admitted pods
    /// with [`ClaimOrigin::Api`].
    pub fn open(
        root: &Path,
        node_name: &str,
        registry: DraPluginRegistry,
        boot: &dyn BootIdSource,
        wipe_delay: Duration,
        origin: ClaimOrigin,
    ) -> Result<Arc<Self>, DraNodeError> {
        let store = LocalStore::open(root.join("devicelet").join(OBJECTS_FILE))?;
        let cache = ClaimCache::open(root, registry.clone(), boot)?;
        let pending: BTreeSet<String> = if store.quarantine().is_some() {
            // Which pods are gone is unknown: nothing is unprepared until recovery.
            BTreeSet::new()
        } else {
            // Pods removed while a driver was away are still referenced by the cache but no
            // longer admitted; they are retried like any other pending unprepare.
            let pods = store.lock();
            cache
                .claims()
                .iter()
                .flat_map(|c| c.pod_uids.iter())
                .filter(|uid| !pods.pods.contains_key(*uid))
                .cloned()
                .collect()
        };
        // After a reboot the kubelet's pod sync prepares every pod's claims again; in cluster
        // mode nothing admits a resumed pod again, so the node does it (see `run`).
        let reprepare: BTreeSet<String> = match origin {
            ClaimOrigin::Api(_) if cache.rebooted() && store.quarantine().is_none() => {
                store.lock().pods.keys().cloned().collect()
            }
            _ => BTreeSet::new(),
        };
        Ok(Arc::new(DraNode {
            node_name: node_name.to_owned(),
            store: Arc::new(store),
            registry,
            cache,
            published: Mutex::default(),
            health: Arc::default(),
            health_tasks: Mutex::default(),
            wipe_delay,
            wipes: Mutex::default(),
            next_wipe: std::sync::atomic::AtomicU64::new(0),
            admission: tokio::sync::Mutex::new(()),
            reprepare: Mutex::new(reprepare),
            pending: Mutex::new(pending),
            origin,
        }))
    }

    /// Where claims come from.
    pub fn origin(&self) -> &ClaimOrigin {
        &self.origin
    }

    /// The node name slices are matched against.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The claim cache.
    pub fn cache(&self) -> &ClaimCache {
        &self.cache
    }

    /// The local store.
    pub fn store(&self) -> &Arc<LocalStore> {
        &self.store
    }

    /// The driver registry.
    pub fn registry(&self) -> &DraPluginRegistry {
        &self.registry
    }

    /// Whether `uid` is an admitted pod with claims (or one still being unprepared). With the
    /// objects quarantined, the claim cache tells (so its removal is refused, not skipped).
    pub fn has_pod(&self, uid: &str) -> bool {
        if self.store.quarantine().is_some() {
            return self.cache.claims().iter().any(|c| c.pod_uids.contains(uid));
        }
        self.store.lock().pods.contains_key(uid)
    }

    /// The pod as admitted (with template claim names resolved).
    pub fn pod(&self, uid: &str) -> Option<Pod> {
        self.store.lock().pods.get(uid).cloned()
    }
}

fn find_container(pod: &Pod, name: &str) -> Option<k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
        .cloned()
}
