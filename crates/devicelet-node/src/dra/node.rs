//! The node's DRA state ([`DraNode`]): what it holds and how it opens; its operations live in
//! the sibling files (admit, release, objects, drivers, health, views).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use devicelet_dra::{BootIdSource, ClaimCache, DraPluginRegistry};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;

use super::health_cache::HealthCache;
use super::store::LocalStore;
use super::{ClaimOrigin, DraNodeError, OBJECTS_FILE};

/// The node's DRA state; cheap to share behind an `Arc`.
pub struct DraNode {
    pub(super) node_name: String,
    pub(super) store: Arc<LocalStore>,
    pub(super) registry: DraPluginRegistry,
    pub(super) cache: ClaimCache,
    pub(super) published: Mutex<BTreeMap<String, Vec<ResourceSlice>>>,
    pub(super) health: Arc<HealthCache>,
    pub(super) health_tasks: Mutex<HashMap<(String, PathBuf), watch::Sender<bool>>>,
    pub(super) wipe_delay: Duration,
    /// Pending slice wipes: driver → token of the wipe task that may act (§1.11).
    pub(super) wipes: Mutex<HashMap<String, u64>>,
    pub(super) next_wipe: std::sync::atomic::AtomicU64,
    /// Allocation, reservation and release are serialized (one scheduler, one controller).
    pub(super) admission: tokio::sync::Mutex<()>,
    /// Removed pods whose claims are not unprepared yet.
    pub(super) pending: Mutex<BTreeSet<String>>,
    /// Per pending pod, the unprepare error last logged at warning level and when: a driver
    /// that stays away is reported when its error changes or once a minute, not every retry.
    pub(super) unprepare_warned: Mutex<HashMap<String, (String, std::time::Instant)>>,
    /// Where claims come from.
    pub(super) origin: ClaimOrigin,
    /// Cluster mode after a reboot: pods whose claims are to be prepared again.
    pub(super) reprepare: Mutex<BTreeSet<String>>,
    /// Where the node's ResourceSlices are listed besides the control socket (cluster mode),
    /// for the NUMA attribute of claim devices (`numa.rs`).
    pub(super) slice_source: Mutex<Option<Arc<dyn devicelet_dra::SliceSource>>>,
}

impl std::fmt::Debug for DraNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraNode")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
            unprepare_warned: Mutex::default(),
            origin,
            slice_source: Mutex::default(),
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

pub(super) fn find_container(
    pod: &Pod,
    name: &str,
) -> Option<k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
        .cloned()
}
