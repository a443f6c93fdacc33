//! DRA on the node: the daemon's side of Dynamic Resource Allocation.
//!
//! Follows `pkg/kubelet/cm/dra/manager.go` and `plugin/dra_plugin_manager.go` (spec
//! dra-kubelet.md §1.7–§1.12, §2, E1–E4 fixed in `devicelet-dra`) plus, because there is no API
//! server, the parts of the scheduler and the resourceclaim controller a single host needs
//! (ecosystem.md A7, A8):
//! - [`DraHandler`]: the plugin watcher's `"DRAPlugin"` handler (validation, registration into the
//!   [`DraPluginRegistry`], deregistration) that also runs each instance's `v1alpha1` health
//!   stream (cancel handle stored before the stream starts, E21) and wipes a driver's published
//!   ResourceSlices when no instance came back within the wipe delay (§1.11).
//! - [`LocalStore`]: DeviceClasses, ResourceSlices, ResourceClaims and ResourceClaimTemplates
//!   stored by `devicelet apply` in `R/devicelet/dra_objects.json`, plus the admitted pods that
//!   use claims; it is the [`ClaimSource`] drivers and the claim cache read claims from.
//! - [`DraNode`]: admission of a pod's claims (template claims created, unallocated claims
//!   allocated by `devicelet-allocator` against stored and driver-published slices, claims
//!   reserved for the pod, then prepared through the drivers by the [`ClaimCache`]), CDI device
//!   names for container starts, and removal (unprepare from cached information, then release;
//!   an unprepare that fails is retried in the background until the driver answers, and the
//!   claim is not released before that, B19).
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
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use devicelet_allocator::explain::{Explanation, explain_node};
use devicelet_allocator::scenario::{apply_api_defaults, render_explanation_table};
use devicelet_allocator::{
    AllocateOptions, AllocatedState, Allocator, CelFeatures, Features, SelectorCache, Semantics,
};
use devicelet_checkpoint::aside::{self, move_aside};
use devicelet_checkpoint::atomic_write::write_file_atomic;
use devicelet_dra::pod::{
    POD_CLAIM_NAME_ANNOTATION, container_claim_requests, extended_resource_claim, pod_claim_names,
    resolve_pod_claim, template_claim_name,
};
use devicelet_dra::{
    BootIdSource, ClaimCache, ClaimSource, ClaimSourceError, DeviceHealthReport, DraError,
    DraPluginRegistry, HealthStatus, RpcCode,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, PodResourceClaimStatus, PodStatus};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus,
    ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::health::{ResourceHealth, ResourceStatus};
use crate::plugin_watcher::{HandlerError, PluginHandler};

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

// ------------------------------------------------------------------------------- store

/// What `R/devicelet/dra_objects.json` holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Objects {
    /// DeviceClasses by name.
    pub device_classes: BTreeMap<String, DeviceClass>,
    /// Applied ResourceSlices by name.
    pub resource_slices: BTreeMap<String, ResourceSlice>,
    /// ResourceClaims by `namespace/name`.
    pub resource_claims: BTreeMap<String, ResourceClaim>,
    /// ResourceClaimTemplates by `namespace/name`.
    pub resource_claim_templates: BTreeMap<String, ResourceClaimTemplate>,
    /// Admitted pods that use claims, by UID (with `status.resourceClaimStatuses` filled in).
    pub pods: BTreeMap<String, Pod>,
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// `devicelet state recover` for DRA (devicelet stopped): clears the claim cache quarantine
/// (`R/devicelet/dra_manager_state.quarantine`, after a corrupt `R/dra_manager_state`) and the
/// objects quarantine (after a corrupt `R/devicelet/dra_objects.json`). Returns the markers
/// removed. Drain the node's DRA pods first: claims recorded only in the lost state are not
/// unprepared, and claims the cache still holds for pods no longer known are unprepared by the
/// next start.
pub fn recover_dra(root: &Path) -> Result<Vec<PathBuf>, DraNodeError> {
    let dir = root.join(devicelet_dra::claim_cache::DEVICELET_DIR);
    let mut cleared = Vec::new();
    if ClaimCache::recover(root)? {
        cleared.push(dir.join(devicelet_dra::claim_cache::QUARANTINE_FILE));
    }
    if LocalStore::recover(&dir)? {
        cleared.push(dir.join(OBJECTS_QUARANTINE_FILE));
    }
    Ok(cleared)
}

fn ns_of(meta: &ObjectMeta) -> String {
    meta.namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

/// The durable local object store; the [`ClaimSource`] of the local flow.
#[derive(Debug)]
pub struct LocalStore {
    path: PathBuf,
    objects: Mutex<Objects>,
    marker: PathBuf,
    /// Set when the file could not be read: the store is empty and refuses writes.
    quarantine: Option<String>,
}

fn store_err(path: &Path) -> impl Fn(std::io::Error) -> DraNodeError + '_ {
    move |e| DraNodeError::Store {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

impl LocalStore {
    /// Loads `path` (missing = empty). A file that cannot be parsed does not stop the daemon:
    /// it is moved aside to `<path>.corrupt-<UTC>` (never overwritten), a quarantine marker
    /// [`OBJECTS_QUARANTINE_FILE`] is written next to it, and the store opens empty and
    /// quarantined (fail-closed for DRA only; see docs/dra.md). A marker left by an earlier
    /// start keeps it quarantined until [`LocalStore::recover`].
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, DraNodeError> {
        let path = path.into();
        let marker = path.with_file_name(OBJECTS_QUARANTINE_FILE);
        let quarantined = |detail: String| LocalStore {
            path: path.clone(),
            objects: Mutex::default(),
            marker: marker.clone(),
            quarantine: Some(detail),
        };
        match std::fs::read(&marker) {
            Ok(detail) => {
                let detail = String::from_utf8_lossy(&detail).trim().to_owned();
                warn!(marker = %marker.display(), %detail, "DRA objects quarantined; DRA operations refused until `devicelet state recover`");
                return Ok(quarantined(detail));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(store_err(&marker)(e)),
        }
        let objects = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(o) => o,
                Err(e) => {
                    let kept = move_aside(&path, aside::CORRUPT).map_err(store_err(&path))?;
                    let detail = format!(
                        "{} could not be read ({e}); kept as {}",
                        path.display(),
                        kept.display()
                    );
                    write_file_atomic(&marker, format!("{detail}\n").as_bytes()).map_err(|e| {
                        DraNodeError::Store {
                            path: marker.clone(),
                            reason: e.to_string(),
                        }
                    })?;
                    tracing::error!(%detail, "DRA objects quarantined; DRA operations refused until `devicelet state recover`");
                    return Ok(quarantined(detail));
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Objects::default(),
            Err(e) => return Err(store_err(&path)(e)),
        };
        Ok(LocalStore {
            path,
            objects: Mutex::new(objects),
            marker,
            quarantine: None,
        })
    }

    /// Why the store is quarantined, if it is.
    pub fn quarantine(&self) -> Option<&str> {
        self.quarantine.as_deref()
    }

    fn check_quarantine(&self) -> Result<(), DraNodeError> {
        match &self.quarantine {
            None => Ok(()),
            Some(detail) => Err(DraNodeError::StateUnknown {
                detail: detail.clone(),
                marker: self.marker.clone(),
            }),
        }
    }

    /// Operator recovery (devicelet stopped): removes the quarantine marker in the devicelet
    /// directory `dir` (`R/devicelet`); the next start opens an empty store (the bad file
    /// stays aside). Returns whether there was a marker.
    pub fn recover(dir: &Path) -> Result<bool, DraNodeError> {
        let marker = dir.join(OBJECTS_QUARANTINE_FILE);
        match std::fs::remove_file(&marker) {
            Ok(()) => {
                devicelet_checkpoint::atomic_write::sync_dir(dir).map_err(store_err(dir))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(store_err(&marker)(e)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of everything stored.
    pub fn snapshot(&self) -> Objects {
        self.lock().clone()
    }

    /// Changes the objects and writes them durably before returning. Refused while quarantined.
    pub fn update<T>(&self, f: impl FnOnce(&mut Objects) -> T) -> Result<T, DraNodeError> {
        self.check_quarantine()?;
        let mut objects = self.lock();
        let out = f(&mut objects);
        let bytes = serde_json::to_vec(&*objects).map_err(|e| DraNodeError::Store {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        write_file_atomic(&self.path, &bytes).map_err(|e| DraNodeError::Store {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        Ok(out)
    }

    /// One claim.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.lock()
            .resource_claims
            .get(&key(namespace, name))
            .cloned()
    }
}

impl ClaimSource for LocalStore {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let r = self
            .claim(namespace, name)
            .ok_or_else(|| ClaimSourceError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        futures::future::ready(r).boxed()
    }

    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let k = key(namespace, name);
        let r = self
            .update(|o| {
                o.resource_claims.get_mut(&k).map(|c| {
                    c.status = Some(status);
                    c.clone()
                })
            })
            .map_err(|e| ClaimSourceError::Other(e.to_string()))
            .and_then(|c| {
                c.ok_or_else(|| ClaimSourceError::NotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            });
        futures::future::ready(r).boxed()
    }
}

/// A claim source that adds up the time its GETs take (for the admission log line: how much
/// of a prepare is the API server's).
struct TimedSource {
    inner: Arc<dyn ClaimSource>,
    spent_us: Arc<std::sync::atomic::AtomicU64>,
}

impl TimedSource {
    fn new(inner: Arc<dyn ClaimSource>) -> Self {
        TimedSource {
            inner,
            spent_us: Arc::default(),
        }
    }

    fn spent(&self) -> Duration {
        Duration::from_micros(self.spent_us.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl ClaimSource for TimedSource {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let call = self.inner.get_claim(namespace, name);
        let spent = Arc::clone(&self.spent_us);
        async move {
            let started = Instant::now();
            let result = call.await;
            let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            spent.fetch_add(us, std::sync::atomic::Ordering::Relaxed);
            result
        }
        .boxed()
    }

    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        status: ResourceClaimStatus,
    ) -> futures::future::BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        self.inner.update_status(namespace, name, status)
    }
}

// ------------------------------------------------------------------------------ health

#[derive(Debug, Clone)]
struct HealthEntry {
    health: HealthStatus,
    message: String,
    updated: Instant,
    timeout: Duration,
}

/// Device health from the drivers' `v1alpha1` streams, keyed by driver name (E20: an ended
/// stream clears the driver).
#[derive(Debug)]
struct HealthCache {
    devices: Mutex<HashMap<(String, String, String), HealthEntry>>,
    /// Bumped when a device's health or message changes, so pod statuses are reported again.
    changes: watch::Sender<u64>,
}

impl Default for HealthCache {
    fn default() -> Self {
        HealthCache {
            devices: Mutex::default(),
            changes: watch::channel(0).0,
        }
    }
}

impl HealthCache {
    fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String, String), HealthEntry>> {
        self.devices.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// B18: every reported device is stored with our receive time (the plugin's timestamp is
    /// ignored); devices not reported go stale by their own timeout.
    fn update(&self, driver: &str, reports: Vec<DeviceHealthReport>) {
        let now = Instant::now();
        let mut changed = false;
        {
            let mut devices = self.lock();
            for r in reports {
                let entry = HealthEntry {
                    health: r.health,
                    message: r.message,
                    updated: now,
                    timeout: r.timeout,
                };
                // A stale entry read as Unknown, so its refresh is a change too.
                let differs = |o: &HealthEntry| {
                    o.health != entry.health
                        || o.message != entry.message
                        || o.updated.elapsed() > o.timeout
                };
                let key = (driver.to_owned(), r.pool_name, r.device_name);
                changed |= devices.get(&key).is_none_or(differs);
                devices.insert(key, entry);
            }
        }
        if changed {
            self.changed();
        }
    }

    fn clear_driver(&self, driver: &str) {
        let removed = {
            let mut devices = self.lock();
            let before = devices.len();
            devices.retain(|(d, _, _), _| d != driver);
            devices.len() != before
        };
        if removed {
            self.changed();
        }
    }

    /// Health and message; stale or absent = Unknown.
    fn get(&self, driver: &str, pool: &str, device: &str) -> (HealthStatus, String) {
        let devices = self.lock();
        match devices.get(&(driver.to_owned(), pool.to_owned(), device.to_owned())) {
            Some(e) if e.updated.elapsed() <= e.timeout => (e.health, e.message.clone()),
            _ => (HealthStatus::Unknown, String::new()),
        }
    }
}

fn health_str(h: HealthStatus) -> &'static str {
    match h {
        HealthStatus::Healthy => "Healthy",
        HealthStatus::Unhealthy => "Unhealthy",
        HealthStatus::Unknown => "Unknown",
    }
}

// ------------------------------------------------------------------------------- views

/// One prepared device of a claim a container uses (the `claims` entries of `admit` JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDeviceView {
    /// ResourceClaim name.
    pub claim: String,
    /// ResourceClaim namespace.
    pub namespace: String,
    /// Request the container asked for (absent = the whole claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Fully-qualified CDI device names.
    pub cdi_devices: Vec<String>,
    /// ShareID of a consumable-capacity allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Device health from the driver's health stream: Healthy, Unhealthy or Unknown.
    pub health: String,
    /// The driver's health message, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_message: String,
}

/// What `GET /v1/dra` shows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DraSnapshot {
    /// Registered driver instances: driver, endpoint, service.
    pub drivers: Vec<DriverView>,
    /// Published ResourceSlices per driver (names).
    pub published_slices: BTreeMap<String, usize>,
    /// Claims in the claim cache: `namespace/name` → pod UIDs.
    pub cached_claims: BTreeMap<String, Vec<String>>,
    /// Pods whose claims still wait for a driver to unprepare them.
    pub pending_unprepare: Vec<String>,
    /// Why DRA is fail-closed (corrupt claim checkpoint or objects file), if it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<String>,
}

/// One registered driver instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriverView {
    /// Driver name.
    pub driver: String,
    /// DRA service socket.
    pub endpoint: PathBuf,
    /// Chosen service (`v1.DRAPlugin` or `v1beta1.DRAPlugin`).
    pub service: String,
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

    /// `devicelet apply`: stores DeviceClasses, ResourceSlices, ResourceClaims and
    /// ResourceClaimTemplates (`resource.k8s.io/v1`). Claims get a UID when they have none; a
    /// re-applied claim keeps its UID and status (the spec is immutable in Kubernetes, so a
    /// changed spec of an allocated claim is refused). Returns `kind/name` per object.
    pub fn apply(&self, docs: Vec<serde_json::Value>) -> Result<Vec<String>, DraNodeError> {
        if let ClaimOrigin::Api(_) = self.origin {
            // Objects stored here would never be used: admission reads the API server.
            return Err(DraNodeError::Invalid(
                "cluster mode: DRA objects come from the API server (use kubectl), not devicelet apply".to_owned(),
            ));
        }
        enum Obj {
            Class(Box<DeviceClass>),
            Slice(Box<ResourceSlice>),
            Claim(Box<ResourceClaim>),
            Template(Box<ResourceClaimTemplate>),
        }
        let mut parsed = Vec::with_capacity(docs.len());
        for doc in docs {
            let field = |f: &str| {
                doc.get(f)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (api, kind) = (field("apiVersion"), field("kind"));
            if api != "resource.k8s.io/v1" {
                return Err(DraNodeError::Invalid(format!(
                    "{kind}: apiVersion {api:?} is not supported (use resource.k8s.io/v1)"
                )));
            }
            let bad = |e: serde_json::Error| DraNodeError::Invalid(format!("{kind}: {e}"));
            let obj = match kind.as_str() {
                "DeviceClass" => Obj::Class(serde_json::from_value(doc).map_err(bad)?),
                "ResourceSlice" => Obj::Slice(serde_json::from_value(doc).map_err(bad)?),
                "ResourceClaim" => Obj::Claim(serde_json::from_value(doc).map_err(bad)?),
                "ResourceClaimTemplate" => Obj::Template(serde_json::from_value(doc).map_err(bad)?),
                other => {
                    return Err(DraNodeError::Invalid(format!(
                        "kind {other:?} is not one of DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate"
                    )));
                }
            };
            let name = match &obj {
                Obj::Class(o) => o.metadata.name.clone(),
                Obj::Slice(o) => o.metadata.name.clone(),
                Obj::Claim(o) => o.metadata.name.clone(),
                Obj::Template(o) => o.metadata.name.clone(),
            };
            if name.as_deref().is_none_or(str::is_empty) {
                return Err(DraNodeError::Invalid(format!(
                    "{kind}: metadata.name is missing"
                )));
            }
            parsed.push(obj);
        }
        self.store.update(|o| {
            let mut out = Vec::new();
            for obj in parsed {
                match obj {
                    Obj::Class(c) => {
                        let n = c.metadata.name.clone().unwrap_or_default();
                        out.push(format!("deviceclass/{n}"));
                        o.device_classes.insert(n, *c);
                    }
                    Obj::Slice(s) => {
                        let n = s.metadata.name.clone().unwrap_or_default();
                        out.push(format!("resourceslice/{n}"));
                        o.resource_slices.insert(n, *s);
                    }
                    Obj::Template(mut t) => {
                        let ns = ns_of(&t.metadata);
                        t.metadata.namespace = Some(ns.clone());
                        let n = t.metadata.name.clone().unwrap_or_default();
                        out.push(format!("resourceclaimtemplate/{n}"));
                        o.resource_claim_templates.insert(key(&ns, &n), *t);
                    }
                    Obj::Claim(mut c) => {
                        let ns = ns_of(&c.metadata);
                        c.metadata.namespace = Some(ns.clone());
                        let n = c.metadata.name.clone().unwrap_or_default();
                        let k = key(&ns, &n);
                        if let Some(old) = o.resource_claims.get(&k) {
                            // Keep identity and status (allocation, reservations).
                            c.metadata.uid = old.metadata.uid.clone();
                            if old.status.as_ref().is_some_and(|s| s.allocation.is_some())
                                && old.spec != c.spec
                            {
                                out.push(format!(
                                    "resourceclaim/{n} unchanged (allocated; spec is immutable)"
                                ));
                                continue;
                            }
                            c.status = old.status.clone();
                        } else if c.metadata.uid.as_deref().is_none_or(str::is_empty) {
                            c.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
                        }
                        out.push(format!("resourceclaim/{n}"));
                        o.resource_claims.insert(k, *c);
                    }
                }
            }
            out
        })
    }

    /// Removes a claim from the store (as a force delete in the API server would); returns
    /// whether it existed. Prepared devices stay prepared until their pods are removed.
    pub fn delete_claim(&self, namespace: &str, name: &str) -> Result<bool, DraNodeError> {
        self.store
            .update(|o| o.resource_claims.remove(&key(namespace, name)).is_some())
    }

    /// A driver publishes its ResourceSlices (replacing what it published before), the way
    /// the kubelet-plugin helper's ResourceSlice controller does against the API server.
    /// Slices without node selection are bound to this node.
    pub fn publish(&self, driver: &str, slices: Vec<ResourceSlice>) -> Result<(), DraNodeError> {
        let mut out = Vec::with_capacity(slices.len());
        for (i, mut s) in slices.into_iter().enumerate() {
            if s.spec.driver != driver {
                return Err(DraNodeError::Invalid(format!(
                    "ResourceSlice #{i} is for driver {:?}, not {driver:?}",
                    s.spec.driver
                )));
            }
            if s.spec.node_name.is_none()
                && s.spec.all_nodes != Some(true)
                && s.spec.node_selector.is_none()
                && s.spec.per_device_node_selection != Some(true)
            {
                s.spec.node_name = Some(self.node_name.clone());
            }
            if s.metadata.name.as_deref().is_none_or(str::is_empty) {
                s.metadata.name = Some(format!("{}-{driver}-{i}", self.node_name));
            }
            out.push(s);
        }
        info!(driver, slices = out.len(), "ResourceSlices published");
        lock(&self.published).insert(driver.to_owned(), out);
        Ok(())
    }

    /// Stored and published slices.
    pub fn slices(&self) -> Vec<ResourceSlice> {
        let mut all: Vec<ResourceSlice> = self
            .store
            .lock()
            .resource_slices
            .values()
            .cloned()
            .collect();
        all.extend(lock(&self.published).values().flatten().cloned());
        all
    }

    /// Whether `uid` is an admitted pod with claims (or one still being unprepared). With the
    /// objects quarantined, the claim cache tells (so its removal is refused, not skipped).
    pub fn has_pod(&self, uid: &str) -> bool {
        if self.store.quarantine().is_some() {
            return self.cache.claims().iter().any(|c| c.pod_uids.contains(uid));
        }
        self.store.lock().pods.contains_key(uid)
    }

    /// Admits the claims of `pod`: creates template claims, allocates unallocated claims,
    /// reserves them for the pod and prepares them through their drivers. Returns the pod
    /// with `status.resourceClaimStatuses` filled in. Idempotent by pod UID. On failure
    /// nothing stays allocated or reserved for the pod.
    pub async fn admit(&self, pod: &Pod) -> Result<Option<Pod>, DraNodeError> {
        let has_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        // The scheduler's claim for extended resources backed by DRA exists only in a cluster
        // (local mode has no scheduler to create it; the device manager skips those resources).
        let extended =
            matches!(self.origin, ClaimOrigin::Api(_)) && extended_resource_claim(pod).is_some();
        if !has_claims && !extended {
            return Ok(None);
        }
        if let ClaimOrigin::Api(source) = &self.origin {
            return self.admit_from_api(pod, source).await.map(Some);
        }
        // Fail-closed before anything is allocated or reserved (a prepare refused afterwards
        // would leave a reservation that cannot be undone until recovery).
        self.store.check_quarantine()?;
        self.cache.check_quarantine()?;
        let _serial = self.admission.lock().await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let resolved = self.allocate_and_reserve(pod)?;
        let result = self.cache.prepare_resources(&resolved, &*self.store).await;
        if let Err(err) = result {
            // All or nothing: undo the pod's reference and reservations (a driver that is away
            // leaves this to the background retry; the claims stay reserved meanwhile).
            warn!(pod_uid = %uid, error = %err, "preparing claims failed; releasing them");
            if let Err(e) = self.release_pod_locked(&uid).await {
                warn!(pod_uid = %uid, error = %e, "unprepare after a failed prepare failed; retrying in the background");
                lock(&self.pending).insert(uid);
            }
            return Err(err.into());
        }
        info!(pod_uid = %uid, "claims prepared");
        Ok(Some(resolved))
    }

    /// Cluster mode admission (spec cluster.md §3): claim names from `spec.resourceClaims`
    /// (template claims through `status.resourceClaimStatuses`, written by
    /// kube-controller-manager; a missing entry is "ResourceClaim not created yet"), one GET per
    /// claim through `source`, which must be allocated, reserved for the pod and, when the
    /// claim is already prepared, have the checkpointed UID (a replaced claim is refused and
    /// nothing is prepared; the claim cache does these checks before any driver call). Nothing
    /// is created, allocated or reserved here. The pod is recorded before the driver is called,
    /// so a failure leaves nothing behind for a new pod; a re-admitted pod keeps what it had.
    async fn admit_from_api(
        &self,
        pod: &Pod,
        source: &Arc<dyn ClaimSource>,
    ) -> Result<Pod, DraNodeError> {
        let source = TimedSource::new(Arc::clone(source));
        self.store.check_quarantine()?;
        self.cache.check_quarantine()?;
        let _serial = self.admission.lock().await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Claims of deleted pods whose driver was away are unprepared before anything new is
        // prepared: the control plane may have given their devices to this pod's claims.
        self.unprepare_pending_locked().await;
        let mut resolved = pod.clone();
        resolved.metadata.namespace = Some(ns_of(&pod.metadata));
        // Resolved before anything is recorded: an unresolvable pod leaves no trace.
        pod_claim_names(&resolved)?;
        let readmission = self.store.lock().pods.contains_key(&uid);
        let record = resolved.clone();
        self.store.update(|o| {
            o.pods.insert(uid.clone(), record);
        })?;
        let started = Instant::now();
        if let Err(err) = self.cache.prepare_resources(&resolved, &source).await {
            if readmission {
                // A running pod's claims stay prepared; the failure is reported only.
                warn!(pod_uid = %uid, error = %err, "preparing claims of an admitted pod again failed");
                return Err(err.into());
            }
            warn!(pod_uid = %uid, error = %err, "preparing claims failed; unpreparing them");
            if let Err(e) = self.release_pod_locked(&uid).await {
                warn!(pod_uid = %uid, error = %e, "unprepare after a failed prepare failed; retrying in the background");
                lock(&self.pending).insert(uid);
            }
            return Err(err.into());
        }
        // prepare_ms: claim GETs (fetch_ms), the drivers' NodePrepareResources and the checkpoint.
        info!(pod_uid = %uid, prepare_ms = started.elapsed().as_secs_f64() * 1e3,
              fetch_ms = source.spent().as_secs_f64() * 1e3,
              "claims from the API server prepared");
        Ok(resolved)
    }

    /// Steps before prepare, in one store update: template claims, allocation, reservation.
    fn allocate_and_reserve(&self, pod: &Pod) -> Result<Pod, DraNodeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = ns_of(&pod.metadata);
        let mut resolved = pod.clone();
        resolved.metadata.namespace = Some(namespace.clone());
        let entries = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.clone())
            .unwrap_or_default();
        let mut objects = self.store.snapshot();

        // Template claims (the resourceclaim controller's job): deterministic names so a
        // re-admission finds the same claim.
        let mut statuses = Vec::new();
        for e in &entries {
            if e.resource_claim_name.is_some() {
                continue;
            }
            let Some(template_name) = &e.resource_claim_template_name else {
                continue;
            };
            let claim_name = template_claim_name(&pod_name, &e.name, &uid);
            let k = key(&namespace, &claim_name);
            if !objects.resource_claims.contains_key(&k) {
                let template = objects
                    .resource_claim_templates
                    .get(&key(&namespace, template_name))
                    .ok_or_else(|| {
                        DraNodeError::NotFound(format!(
                            "pod {namespace}/{pod_name}: ResourceClaimTemplate {namespace}/{template_name} not found"
                        ))
                    })?;
                let claim = ResourceClaim {
                    metadata: ObjectMeta {
                        name: Some(claim_name.clone()),
                        namespace: Some(namespace.clone()),
                        uid: Some(uuid::Uuid::new_v4().to_string()),
                        annotations: Some(BTreeMap::from([(
                            POD_CLAIM_NAME_ANNOTATION.to_owned(),
                            e.name.clone(),
                        )])),
                        labels: template
                            .spec
                            .metadata
                            .as_ref()
                            .and_then(|m| m.labels.clone()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".to_owned(),
                            kind: "Pod".to_owned(),
                            name: pod_name.clone(),
                            uid: uid.clone(),
                            controller: Some(true),
                            block_owner_deletion: Some(true),
                        }]),
                        ..ObjectMeta::default()
                    },
                    spec: template.spec.spec.clone(),
                    status: None,
                };
                objects.resource_claims.insert(k, claim);
            }
            statuses.push(PodResourceClaimStatus {
                name: e.name.clone(),
                resource_claim_name: Some(claim_name),
            });
        }
        if !statuses.is_empty() {
            let status = resolved.status.get_or_insert_with(PodStatus::default);
            let list = status.resource_claim_statuses.get_or_insert_with(Vec::new);
            for s in statuses {
                if !list.iter().any(|x| x.name == s.name) {
                    list.push(s);
                }
            }
        }

        // Which claims; de-duplicated (the same claim listed twice, E4).
        let names = pod_claim_names(&resolved)?;
        let mut keys: Vec<String> = Vec::new();
        for n in &names {
            let k = key(&namespace, &n.claim_name);
            if !objects.resource_claims.contains_key(&k) {
                return Err(DraNodeError::NotFound(format!(
                    "pod {namespace}/{pod_name}: ResourceClaim {k} not found"
                )));
            }
            if !keys.contains(&k) {
                keys.push(k);
            }
        }

        // Allocation of the unallocated ones, against everything else already allocated.
        let unallocated: Vec<String> = keys
            .iter()
            .filter(|k| {
                objects.resource_claims[*k]
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_none()
            })
            .cloned()
            .collect();
        if !unallocated.is_empty() {
            let results = self.allocate(&objects, &unallocated)?;
            for (k, result) in unallocated.iter().zip(results) {
                if let Some(c) = objects.resource_claims.get_mut(k) {
                    c.status.get_or_insert_with(Default::default).allocation = Some(result);
                }
            }
        }

        // Reservation for the pod.
        for k in &keys {
            if let Some(c) = objects.resource_claims.get_mut(k) {
                let reserved = c
                    .status
                    .get_or_insert_with(Default::default)
                    .reserved_for
                    .get_or_insert_with(Vec::new);
                if !reserved.iter().any(|r| r.uid == uid) {
                    reserved.push(ResourceClaimConsumerReference {
                        api_group: None,
                        resource: "pods".to_owned(),
                        name: pod_name.clone(),
                        uid: uid.clone(),
                    });
                }
            }
        }
        objects.pods.insert(uid, resolved.clone());
        let Objects {
            resource_claims,
            pods,
            ..
        } = objects;
        self.store.update(move |o| {
            o.resource_claims = resource_claims;
            o.pods = pods;
        })?;
        Ok(resolved)
    }

    /// Runs the structured allocator for the claims `keys` on this node.
    fn allocate(
        &self,
        objects: &Objects,
        keys: &[String],
    ) -> Result<Vec<k8s_openapi::api::resource::v1::AllocationResult>, DraNodeError> {
        let features = Features::kubernetes_1_36_defaults();
        let classes: Vec<DeviceClass> = objects.device_classes.values().cloned().collect();
        let mut slices: Vec<ResourceSlice> = objects.resource_slices.values().cloned().collect();
        slices.extend(lock(&self.published).values().flatten().cloned());
        let mut state = AllocatedState::default();
        for (k, c) in &objects.resource_claims {
            if keys.contains(k) {
                continue;
            }
            let results = c
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref());
            for r in results.into_iter().flatten() {
                state
                    .add_result(r, features.consumable_capacity)
                    .map_err(|e| DraNodeError::Allocation(format!("claim {k}: {e}")))?;
            }
        }
        let claims: Vec<ResourceClaim> = keys
            .iter()
            .filter_map(|k| objects.resource_claims.get(k).cloned())
            .map(|mut c| {
                apply_api_defaults(&mut c);
                c
            })
            .collect();
        let refs: Vec<&ResourceClaim> = claims.iter().collect();
        let cel = Arc::new(SelectorCache::new(CelFeatures {
            enable_consumable_capacity: features.consumable_capacity,
            enable_list_type_attributes: features.list_type_attributes,
        }));
        let allocator = Allocator::new(features, Semantics::Fixed, &state, &classes, &slices, cel);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/hostname".to_owned(),
                    self.node_name.clone(),
                )])),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let outcome = allocator.allocate(&node, &refs, &AllocateOptions::default());
        match outcome {
            Ok(Some(results)) => Ok(results),
            Ok(None) | Err(_) => {
                let err = outcome.as_ref().err();
                let explanation = Explanation {
                    nodes: vec![explain_node(&allocator, &node, &refs, err)],
                };
                Err(DraNodeError::Allocation(format!(
                    "cannot allocate ResourceClaims {} on node {}:\n{}",
                    keys.join(", "),
                    self.node_name,
                    render_explanation_table(&explanation).trim_end()
                )))
            }
        }
    }

    /// The pod as admitted (with template claim names resolved).
    pub fn pod(&self, uid: &str) -> Option<Pod> {
        self.store.lock().pods.get(uid).cloned()
    }

    /// CDI device names for a container start (`GetResources`, B13).
    pub fn container_cdi_devices(
        &self,
        uid: &str,
        container: &str,
    ) -> Result<Vec<String>, DraNodeError> {
        let Some(pod) = self.pod(uid) else {
            return Ok(Vec::new());
        };
        let Some(c) = find_container(&pod, container) else {
            return Ok(Vec::new());
        };
        Ok(self.cache.container_cdi_devices(&pod, &c)?)
    }

    /// The prepared devices a container uses, with health (for `admit` and `get pods`).
    pub fn container_claims(&self, uid: &str, container: &str) -> Vec<ClaimDeviceView> {
        let Some(pod) = self.pod(uid) else {
            return Vec::new();
        };
        let Some(c) = find_container(&pod, container) else {
            return Vec::new();
        };
        let namespace = ns_of(&pod.metadata);
        let Ok(refs) = container_claim_requests(&pod, &c) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (claim_name, request) in refs {
            let Some(cached) = self.cache.get(&namespace, &claim_name) else {
                continue;
            };
            for (driver, devices) in &cached.drivers {
                for d in devices {
                    let serves = request.as_deref().is_none_or(|r| {
                        d.request_names.is_empty() || d.request_names.iter().any(|n| n == r)
                    });
                    if !serves {
                        continue;
                    }
                    let (health, message) = self.health.get(driver, &d.pool_name, &d.device_name);
                    out.push(ClaimDeviceView {
                        claim: claim_name.clone(),
                        namespace: namespace.clone(),
                        request: request.clone(),
                        driver: driver.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        cdi_devices: d.cdi_device_ids.clone(),
                        share_id: d.share_id.clone(),
                        health: health_str(health).to_owned(),
                        health_message: message,
                    });
                }
            }
        }
        out
    }

    /// The container's `allocatedResourcesStatus` entries for its claims (B17,
    /// `manager.go` `UpdateAllocatedResourcesStatus`): one `claim:<pod claim>` entry (with
    /// `/<request>` when the container names a request) per reference; resourceID = the
    /// device's first CDI ID, else `<driver>/<pool>/<device>`; duplicates by resourceID dropped;
    /// request matching by base request; entries without devices left out.
    pub fn claim_resource_status(&self, uid: &str, container: &str) -> Vec<ResourceStatus> {
        let Some(pod) = self.pod(uid) else {
            return Vec::new();
        };
        let Some(c) = find_container(&pod, container) else {
            return Vec::new();
        };
        let namespace = ns_of(&pod.metadata);
        let mut out = Vec::new();
        for r in c.resources.iter().flat_map(|r| r.claims.iter().flatten()) {
            let Ok(Some(resolved)) = resolve_pod_claim(&pod, &r.name) else {
                continue;
            };
            let Some(cached) = self.cache.get(&namespace, &resolved.claim_name) else {
                continue;
            };
            let request = r.request.as_deref().filter(|s| !s.is_empty());
            let mut resources: Vec<ResourceHealth> = Vec::new();
            for (driver, devices) in &cached.drivers {
                for d in devices {
                    let serves = request.is_none_or(|req| {
                        let base = req.split('/').next().unwrap_or(req);
                        d.request_names.is_empty()
                            || d.request_names
                                .iter()
                                .any(|n| n.split('/').next() == Some(base))
                    });
                    if !serves {
                        continue;
                    }
                    let id =
                        d.cdi_device_ids.first().cloned().unwrap_or_else(|| {
                            format!("{driver}/{}/{}", d.pool_name, d.device_name)
                        });
                    if resources.iter().any(|x| x.resource_id == id) {
                        continue;
                    }
                    let (health, _) = self.health.get(driver, &d.pool_name, &d.device_name);
                    resources.push(ResourceHealth {
                        resource_id: id,
                        health: health_str(health).to_owned(),
                    });
                }
            }
            if resources.is_empty() {
                continue;
            }
            let name = match request {
                Some(req) => format!("claim:{}/{req}", r.name),
                None => format!("claim:{}", r.name),
            };
            out.push(ResourceStatus { name, resources });
        }
        out
    }

    /// The pod is gone: unprepare its claims from cached information (works when the claim
    /// objects are gone), then release them (reservation dropped; a claim nobody reserves is
    /// deallocated; template claims owned by the pod are deleted). If a driver does not answer,
    /// the pod stays pending and is retried in the background; nothing is released before the
    /// driver unprepared (B19).
    pub async fn remove(&self, uid: &str) -> Result<(), DraNodeError> {
        // Fail-closed: not pending either (nothing to retry until recovery).
        self.store.check_quarantine()?;
        let _serial = self.admission.lock().await;
        match self.release_pod_locked(uid).await {
            Ok(()) => {
                lock(&self.pending).remove(uid);
                Ok(())
            }
            Err(e) => {
                lock(&self.pending).insert(uid.to_owned());
                Err(e)
            }
        }
    }

    async fn release_pod_locked(&self, uid: &str) -> Result<(), DraNodeError> {
        self.cache.unprepare_resources(uid).await?;
        if let ClaimOrigin::Api(_) = self.origin {
            // From the checkpoint only (no API call, so a force-deleted pod's claims are
            // released too); reservations and deallocation are the control plane's.
            self.store.update(|o| {
                o.pods.remove(uid);
            })?;
            info!(pod_uid = %uid, "claims unprepared");
            return Ok(());
        }
        self.store.update(|o| {
            o.pods.remove(uid);
            let mut drop = Vec::new();
            for (k, c) in o.resource_claims.iter_mut() {
                let Some(status) = c.status.as_mut() else {
                    continue;
                };
                let Some(reserved) = status.reserved_for.as_mut() else {
                    continue;
                };
                let before = reserved.len();
                reserved.retain(|r| r.uid != uid);
                if reserved.len() == before {
                    continue;
                }
                if reserved.is_empty() {
                    status.reserved_for = None;
                    status.allocation = None;
                    let owned = c
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.controller == Some(true) && r.uid == uid);
                    if owned {
                        drop.push(k.clone());
                    }
                }
            }
            for k in drop {
                o.resource_claims.remove(&k);
            }
        })?;
        info!(pod_uid = %uid, "claims unprepared and released");
        Ok(())
    }

    /// Retries pending unprepares once; returns how many are still pending.
    pub async fn retry_pending(&self) -> usize {
        if self.store.quarantine().is_some() || self.cache.quarantined() {
            return lock(&self.pending).len();
        }
        let pending: Vec<String> = lock(&self.pending).iter().cloned().collect();
        for uid in pending {
            let _serial = self.admission.lock().await;
            self.retry_unprepare_locked(&uid).await;
        }
        lock(&self.pending).len()
    }

    /// [`Self::retry_pending`] with the admission lock already held.
    async fn unprepare_pending_locked(&self) {
        let pending: Vec<String> = lock(&self.pending).iter().cloned().collect();
        for uid in pending {
            self.retry_unprepare_locked(&uid).await;
        }
    }

    async fn retry_unprepare_locked(&self, uid: &str) {
        match self.release_pod_locked(uid).await {
            Ok(()) => {
                lock(&self.pending).remove(uid);
            }
            Err(e) => warn!(pod_uid = %uid, error = %e, "unprepare still failing; will retry"),
        }
    }

    /// Bumped whenever a driver's health stream changes a device's health (or a stream ends),
    /// so front ends report the affected pods' `allocatedResourcesStatus` again.
    pub fn health_changes(&self) -> watch::Receiver<u64> {
        self.health.changes.subscribe()
    }

    /// Pods waiting for a driver to unprepare them.
    pub fn pending_unprepare(&self) -> Vec<String> {
        lock(&self.pending).iter().cloned().collect()
    }

    /// Background work until `shutdown`: pending unprepares retried every `period`.
    pub async fn run(self: Arc<Self>, period: Duration, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => return,
            }
            if !lock(&self.pending).is_empty() {
                self.retry_pending().await;
            }
            if !lock(&self.reprepare).is_empty() {
                self.prepare_again().await;
            }
        }
    }

    /// Cluster mode after a reboot: prepares the claims of the recorded pods again, once each.
    /// A pod whose driver has not registered again yet is retried on the next call; any other
    /// failure is logged and the pod dropped (its claims stay as the checkpoint says). Returns
    /// how many pods still wait.
    pub async fn prepare_again(&self) -> usize {
        let ClaimOrigin::Api(source) = &self.origin else {
            return 0;
        };
        let uids: Vec<String> = lock(&self.reprepare).iter().cloned().collect();
        for uid in uids {
            let Some(pod) = self.pod(&uid) else {
                // Removed meanwhile.
                lock(&self.reprepare).remove(&uid);
                continue;
            };
            match self.admit_from_api(&pod, source).await {
                Ok(_) => {
                    info!(pod_uid = %uid, "claims prepared again after a reboot");
                }
                Err(DraNodeError::Dra(e)) if e.is_driver_unavailable() => continue,
                Err(e) => {
                    warn!(pod_uid = %uid, error = %e, "preparing claims again after a reboot failed");
                }
            }
            lock(&self.reprepare).remove(&uid);
        }
        lock(&self.reprepare).len()
    }

    /// `GET /v1/dra`.
    pub fn snapshot(&self) -> DraSnapshot {
        DraSnapshot {
            drivers: self
                .registry
                .list()
                .into_iter()
                .map(|(driver, endpoint, service)| DriverView {
                    driver,
                    endpoint,
                    service: service.as_str().to_owned(),
                })
                .collect(),
            published_slices: lock(&self.published)
                .iter()
                .map(|(d, s)| (d.clone(), s.len()))
                .collect(),
            cached_claims: self
                .cache
                .claims()
                .into_iter()
                .map(|c| (key(&c.namespace, &c.name), c.pod_uids.into_iter().collect()))
                .collect(),
            pending_unprepare: self.pending_unprepare(),
            quarantine: self.quarantine(),
        }
    }

    /// Why DRA is fail-closed, if it is: the claim cache's and the objects' quarantine.
    pub fn quarantine(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.cache.quarantined() {
            out.push(format!(
                "{}: claim checkpoint unreadable; prepare/unprepare refused",
                devicelet_dra::claim_cache::QUARANTINE_FILE
            ));
        }
        if let Some(detail) = self.store.quarantine() {
            out.push(detail.to_owned());
        }
        out
    }

    fn start_health(&self, driver: &str, endpoint: &Path) {
        let Some(instance) = self.registry.instance(driver, endpoint) else {
            return;
        };
        let (stop_tx, mut stop) = watch::channel(false);
        // Stored before the loop starts, so a deregistration always finds it (E21).
        if let Some(old) =
            lock(&self.health_tasks).insert((driver.to_owned(), endpoint.to_path_buf()), stop_tx)
        {
            let _ = old.send(true);
        }
        let health = Arc::clone(&self.health);
        let driver = driver.to_owned();
        tokio::spawn(async move {
            loop {
                match instance.client.watch_health().await {
                    Ok(mut stream) => loop {
                        tokio::select! {
                            item = stream.next() => match item {
                                Some(Ok(list)) => health.update(&driver, list),
                                Some(Err(e)) => {
                                    warn!(driver, error = %e.message, "health stream ended");
                                    break;
                                }
                                None => break,
                            },
                            _ = stop.changed() => {
                                health.clear_driver(&driver);
                                return;
                            }
                        }
                    },
                    Err(e) if e.code == RpcCode::Unimplemented => {}
                    Err(e) => warn!(driver, error = %e.message, "cannot open health stream"),
                }
                health.clear_driver(&driver);
                tokio::select! {
                    _ = tokio::time::sleep(HEALTH_RESTART_DELAY) => {}
                    _ = stop.changed() => return,
                }
            }
        });
    }

    fn stop_health(&self, driver: &str, endpoint: &Path) {
        if let Some(stop) =
            lock(&self.health_tasks).remove(&(driver.to_owned(), endpoint.to_path_buf()))
        {
            let _ = stop.send(true);
        }
    }

    /// The driver's last instance went away: its published slices are wiped after the wipe
    /// delay unless an instance registers before (§1.11). A wipe already pending keeps its
    /// deadline (the kubelet keeps the first one); a registration cancels it, so a later
    /// absence gets a full delay of its own (A8 row 55: a driver that comes back, and even goes
    /// away again, within the window keeps its slices).
    fn schedule_wipe(self: &Arc<Self>, driver: &str) {
        if self.registry.is_registered(driver) {
            return;
        }
        let token = {
            let mut wipes = lock(&self.wipes);
            if wipes.contains_key(driver) {
                return;
            }
            let token = self
                .next_wipe
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            wipes.insert(driver.to_owned(), token);
            token
        };
        let me = Arc::clone(self);
        let driver = driver.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(me.wipe_delay).await;
            {
                let mut wipes = lock(&me.wipes);
                if wipes.get(&driver) != Some(&token) {
                    return; // cancelled by a registration
                }
                wipes.remove(&driver);
            }
            if !me.registry.is_registered(&driver) && lock(&me.published).remove(&driver).is_some()
            {
                info!(
                    driver,
                    "driver gone; its published ResourceSlices are wiped"
                );
            }
        });
    }

    /// An instance of `driver` registered: a pending wipe is cancelled.
    fn cancel_wipe(&self, driver: &str) {
        if lock(&self.wipes).remove(driver).is_some() {
            info!(
                driver,
                "driver back within the wipe delay; its ResourceSlices are kept"
            );
        }
    }

    /// The `/v1/dra`, `/v1/draobjects`, `/v1/resourceslices` and `/v1/resourceclaims` routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/dra", get(get_dra))
            .route("/v1/draobjects", post(apply_objects).get(list_objects))
            .route("/v1/resourceslices/{driver}", post(publish_slices))
            .route(
                "/v1/resourceclaims/{namespace}/{name}",
                get(get_claim).delete(delete_claim),
            )
            .with_state(Arc::clone(self))
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

fn err_json(status: StatusCode, message: &str) -> Response {
    crate::control::error_response(status, message)
}

async fn get_dra(State(dra): State<Arc<DraNode>>) -> Json<DraSnapshot> {
    Json(dra.snapshot())
}

async fn apply_objects(
    State(dra): State<Arc<DraNode>>,
    Json(docs): Json<Vec<serde_json::Value>>,
) -> Response {
    match dra.apply(docs) {
        Ok(names) => Json(names).into_response(),
        Err(e) => err_json(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn list_objects(State(dra): State<Arc<DraNode>>) -> Json<Objects> {
    Json(dra.store.snapshot())
}

async fn publish_slices(
    State(dra): State<Arc<DraNode>>,
    UrlPath(driver): UrlPath<String>,
    Json(slices): Json<Vec<ResourceSlice>>,
) -> Response {
    match dra.publish(&driver, slices) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => err_json(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn get_claim(
    State(dra): State<Arc<DraNode>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    match dra.store.claim(&namespace, &name) {
        Some(c) => Json(c).into_response(),
        None => err_json(
            StatusCode::NOT_FOUND,
            &format!(
                "resourceclaims.resource.k8s.io \"{name}\" not found in namespace {namespace}"
            ),
        ),
    }
}

async fn delete_claim(
    State(dra): State<Arc<DraNode>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    match dra.delete_claim(&namespace, &name) {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => err_json(StatusCode::NOT_FOUND, "no such ResourceClaim"),
        Err(e) => err_json(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

// ----------------------------------------------------------------------------- handler

/// The plugin watcher's handler for `"DRAPlugin"` registrations.
#[derive(Debug, Clone)]
pub struct DraHandler {
    node: Arc<DraNode>,
}

impl DraHandler {
    /// A handler registering drivers into `node`'s registry.
    pub fn new(node: Arc<DraNode>) -> Self {
        DraHandler { node }
    }
}

impl PluginHandler for DraHandler {
    fn validate(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        Ok(self.node.registry.validate(name, endpoint, versions)?)
    }

    fn register(
        &self,
        name: String,
        endpoint: PathBuf,
        versions: Vec<String>,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        let node = Arc::clone(&self.node);
        async move {
            node.registry.register(&name, &endpoint, &versions)?;
            node.cancel_wipe(&name);
            node.start_health(&name, &endpoint);
            Ok(())
        }
        .boxed()
    }

    fn deregister(&self, name: &str, endpoint: &Path) {
        self.node.stop_health(name, endpoint);
        self.node.registry.deregister(name, endpoint);
        self.node.schedule_wipe(name);
    }
}
