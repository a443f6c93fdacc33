//! Durable device allocations for the daemon: devicelet-checkpoint's journalled
//! [`DeviceStore`] wired into admission, removal and restart. Follows the kubelet's
//! `writeCheckpoint` / `readCheckpoint` (`pkg/kubelet/cm/devicemanager/manager.go`, spec
//! devicemanager.md §3, §1.7) with the fixes of ecosystem.md A1–A2:
//!
//! * an admission is answered only after its record is fsync'd (the kubelet never fsyncs the
//!   directory and rewrites the whole file; we append to a journal and share fsyncs between
//!   concurrent admissions, so the cost does not grow with the number of pods);
//! * a removal is durable *before* the devices are freed in memory, so a crash can never leave
//!   a journal in which two pods hold one device;
//! * on a corrupt or unknown-version state, the daemon still starts, but refuses every admission
//!   (device ownership is unknown) until an operator runs `devicelet state recover`; the status is
//!   in [`CheckpointStatus`] and the error log.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use devicelet_checkpoint::state::{Change, ContainerRecord, DeviceState, PodRecord};
use devicelet_checkpoint::store::{DeviceStore, StoreError, StoreOptions, StorePaths};
use devicelet_devicemanager::{
    CachedResponse, ContainerAllocateResponse, ContainerKind, DeviceManager, ResourceAllocation,
    ResponseDecoder,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::admitted::{AdmittedPod, ContainerView, PodRef};

/// Encodes and decodes the plugin's `Allocate` answer that the checkpoint keeps per
/// (container, resource) as `AllocResp`. The kubelet stores the device plugin API's protobuf
/// bytes there; the node holds no wire types, so the front end that speaks the device plugin
/// API supplies the encoding (devicelet-rpc's `ProtoAllocResp`).
pub trait AllocRespCodec: Send + Sync + 'static {
    /// The bytes stored for `response`.
    fn encode(&self, response: &ContainerAllocateResponse) -> Vec<u8>;
    /// The answer stored as `bytes`; `None` when they do not decode. Empty bytes are the empty
    /// answer, as Go's `proto.Unmarshal` reads them.
    fn decode(&self, bytes: &[u8]) -> Option<ContainerAllocateResponse>;
}

/// Health of the durable state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointHealth {
    /// Open and writable.
    Ok,
    /// The state could not be read (corrupt, unknown version, quarantined): no device is
    /// handed out until an operator recovers.
    OwnershipUnknown,
    /// No durable state (tests and embedders that opt out).
    Disabled,
}

/// What `GET /v1/state` and metrics report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointStatus {
    /// Health.
    pub health: CheckpointHealth,
    /// Why, when not ok.
    pub detail: Option<String>,
    /// Failed reads and writes of the state since start (`devicelet_checkpoint_errors_total`).
    pub errors_total: u64,
    /// Commits acknowledged since start.
    pub commits: u64,
    /// Journal fsyncs (fewer than commits when group commit shared them).
    pub journal_syncs: u64,
    /// Compactions into `kubelet_internal_checkpoint` since start.
    pub compactions: u64,
    /// How stale `kubelet_internal_checkpoint` is (ms), if it lags the journal.
    pub kubelet_file_lag_ms: Option<f64>,
    /// The last compaction error.
    pub last_compaction_error: Option<String>,
    /// Pods restored at start.
    pub restored_pods: usize,
    /// Time to read and replay the state at start, and give it to the Device Manager (ms).
    pub open_ms: f64,
    /// Of `open_ms`, reading, checking and replaying the files (the rest is the restore).
    #[serde(default)]
    pub read_ms: f64,
}

/// One commit for the journal thread, and where its result goes.
type JournalRequest = (
    Vec<Change>,
    tokio::sync::oneshot::Sender<Result<(), StoreError>>,
);

/// The thread that writes the journal (group commit): it takes every commit queued while its
/// previous write and fsync ran and makes them durable with one record and one fsync, so under
/// load each fsync carries many admissions, no async worker ever waits on a disk, and no
/// blocking-pool thread is parked per admission.
struct JournalThread {
    queue: std::sync::mpsc::Sender<JournalRequest>,
}

impl JournalThread {
    /// Starts the thread for `store`; it ends when the last sender is dropped.
    fn start(store: Arc<DeviceStore>) -> std::io::Result<Self> {
        let (queue, requests) = std::sync::mpsc::channel::<JournalRequest>();
        std::thread::Builder::new()
            .name("devicelet-journal".into())
            .spawn(move || {
                while let Ok(first) = requests.recv() {
                    let mut group = vec![first];
                    group.extend(requests.try_iter());
                    let (commits, answers): (Vec<_>, Vec<_>) = group.into_iter().unzip();
                    let results = store.commit_group(commits);
                    for (answer, result) in answers.into_iter().zip(results) {
                        // The admission may have been dropped meanwhile: nothing to tell.
                        let _ = answer.send(result);
                    }
                }
            })?;
        Ok(JournalThread { queue })
    }
}

/// The daemon's durable device state (see the module docs).
pub struct DurableState {
    store: Option<Arc<DeviceStore>>,
    journal: Option<JournalThread>,
    /// How `AllocResp` is stored; `None` only without a store.
    codec: Option<Arc<dyn AllocRespCodec>>,
    unknown: Option<String>,
    errors: AtomicU64,
    restored_pods: usize,
    open_ms: f64,
    read_ms: f64,
    metrics: Option<devicelet_metrics::Metrics>,
}

impl std::fmt::Debug for DurableState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableState")
            .field("unknown", &self.unknown)
            .finish_non_exhaustive()
    }
}

/// Why an admission or removal could not be made durable.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The state is unreadable; nothing is handed out. The text says why and what to do:
    /// `devicelet state recover` for damage, fixing the file system for an I/O error.
    #[error("{0}")]
    OwnershipUnknown(String),
    /// The write failed (e.g. a full disk); nothing changed.
    #[error("cannot record the change durably: {0}")]
    Write(#[from] StoreError),
}

/// The store's paths for a root directory: `R/device-plugins/kubelet_internal_checkpoint` and
/// `R/devicelet/device-allocations.journal`.
pub fn store_paths(device_plugins: &Path, devicelet_dir: &Path) -> StorePaths {
    StorePaths::new(device_plugins, devicelet_dir)
}

impl DurableState {
    /// No durability (in-memory only).
    pub fn disabled() -> Self {
        DurableState {
            store: None,
            journal: None,
            codec: None,
            unknown: None,
            errors: AtomicU64::new(0),
            restored_pods: 0,
            open_ms: 0.0,
            read_ms: 0.0,
            metrics: None,
        }
    }

    /// Opens the store and restores `manager` from it (allocations, cached responses,
    /// registered resources with zero allocatable, spec §3.4); returns the admitted pods.
    /// A state that cannot be read does not fail the start: it is reported and admission is
    /// refused.
    pub fn open_and_restore(
        paths: StorePaths,
        manager: &DeviceManager,
        codec: Arc<dyn AllocRespCodec>,
    ) -> (Self, BTreeMap<String, AdmittedPod>) {
        let started = Instant::now();
        let mut durable = Self::disabled();
        durable.metrics = Some(manager.metrics().clone());
        durable.codec = Some(Arc::clone(&codec));
        match DeviceStore::open_with(paths, StoreOptions::default()) {
            Ok((store, recovered)) => {
                let read_ms = started.elapsed().as_secs_f64() * 1000.0;
                let pods = restore(manager, &recovered.state, &codec);
                durable.restored_pods = pods.len();
                durable.open_ms = started.elapsed().as_secs_f64() * 1000.0;
                durable.read_ms = read_ms;
                info!(
                    pods = pods.len(),
                    containers = recovered.state.entry_count(),
                    replayed = recovered.records_replayed,
                    read_ms = (read_ms * 1e3).round() / 1e3,
                    ms = (durable.open_ms * 1e3).round() / 1e3,
                    "device state restored"
                );
                let store = Arc::new(store);
                match JournalThread::start(Arc::clone(&store)) {
                    Ok(thread) => durable.journal = Some(thread),
                    // Commits then run on the blocking pool, sharing fsyncs among themselves.
                    Err(e) => {
                        warn!(error = %e, "cannot start the journal thread; committing on the blocking pool")
                    }
                }
                durable.store = Some(store);
                (durable, pods)
            }
            Err(e) => {
                durable.count_error();
                // Damage needs an operator's recovery; an I/O error (a read-only or full file
                // system, permissions) needs the file system fixed and a restart, and running
                // `state recover` then would move intact files aside for nothing.
                let reason = if e.ownership_unknown() {
                    format!(
                        "device ownership is unknown ({e}); no devices are handed out until an operator runs `devicelet state recover`"
                    )
                } else {
                    format!(
                        "device state cannot be opened ({e}); no devices are handed out until the file system is writable again and devicelet restarts (the files are intact: no recovery is needed)"
                    )
                };
                error!("{reason}");
                durable.unknown = Some(reason);
                (durable, BTreeMap::new())
            }
        }
    }

    /// `Some(reason)` when no device may be handed out.
    pub fn ownership_unknown(&self) -> Option<&str> {
        self.unknown.as_deref()
    }

    /// Makes `changes` durable (shared fsync with concurrent callers). The blocking write runs
    /// off the async threads.
    pub async fn commit(&self, changes: Vec<Change>) -> Result<(), DurableError> {
        if let Some(reason) = &self.unknown {
            return Err(DurableError::OwnershipUnknown(reason.clone()));
        }
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let started = Instant::now();
        let result = match &self.journal {
            Some(journal) => {
                let (answer, result) = tokio::sync::oneshot::channel();
                match journal.queue.send((changes, answer)) {
                    Ok(()) => result.await.unwrap_or_else(|_| {
                        Err(StoreError::Poisoned("the journal thread stopped".into()))
                    }),
                    Err(_) => Err(StoreError::Poisoned("the journal thread stopped".into())),
                }
            }
            None => tokio::task::spawn_blocking(move || store.commit(&changes))
                .await
                .unwrap_or_else(|join| {
                    Err(StoreError::Poisoned(format!("commit task failed: {join}")))
                }),
        };
        self.observe(started.elapsed());
        if let Err(e) = &result {
            self.count_error();
            error!(error = %e, "device state write failed; the change was not made");
        }
        Ok(result?)
    }

    /// Exported as `devicelet_checkpoint_errors_total{checkpoint="kubelet_internal_checkpoint"}`.
    fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.checkpoint_error(devicelet_checkpoint::device::DEVICE_CHECKPOINT_FILE);
        }
    }

    /// Exported as `devicelet_checkpoint_write_duration_seconds`.
    fn observe(&self, took: Duration) {
        if let Some(m) = &self.metrics {
            m.checkpoint_write(devicelet_checkpoint::device::DEVICE_CHECKPOINT_FILE, took);
        }
    }

    /// The current status.
    pub fn status(&self) -> CheckpointStatus {
        let (health, detail) = match (&self.unknown, &self.store) {
            (Some(r), _) => (CheckpointHealth::OwnershipUnknown, Some(r.clone())),
            (None, Some(_)) => (CheckpointHealth::Ok, None),
            (None, None) => (CheckpointHealth::Disabled, None),
        };
        let stats = self.store.as_ref().map(|s| s.stats()).unwrap_or_default();
        CheckpointStatus {
            health,
            detail,
            errors_total: self.errors.load(Ordering::Relaxed),
            commits: stats.commits,
            journal_syncs: stats.journal_syncs,
            compactions: stats.compactions,
            kubelet_file_lag_ms: stats.kubelet_file_lag.map(|d| d.as_secs_f64() * 1000.0),
            last_compaction_error: stats.last_compaction_error,
            restored_pods: self.restored_pods,
            open_ms: self.open_ms,
            read_ms: self.read_ms,
        }
    }

    /// Keeps the checkpoint's registered resources in line with the manager's (the kubelet
    /// writes them after every `ListAndWatch` snapshot), at most every 100 ms, until `shutdown` fires.
    pub async fn sync_registered(
        self: Arc<Self>,
        manager: DeviceManager,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let Some(store) = self.store.clone() else {
            let _ = shutdown.changed().await;
            return;
        };
        let mut changes = manager.subscribe();
        loop {
            // Stopping disconnects every plugin, which empties their device lists; the kubelet
            // writes nothing at stop, so its file keeps the last lists seen while running.
            if *shutdown.borrow() {
                return;
            }
            let current = manager.registered_resources();
            let diff = store.read(|s| registered_diff(&s.registered, &current));
            if !diff.is_empty()
                && let Err(e) = self.commit(diff).await
            {
                warn!(error = %e, "cannot record registered resources");
            }
            // At most one diff per 100 ms (admissions notify too), the first one at once.
            tokio::time::sleep(Duration::from_millis(100)).await;
            tokio::select! {
                _ = shutdown.changed() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        }
    }

    /// Clean stop: folds the journal into `kubelet_internal_checkpoint`.
    pub fn shutdown(&self) {
        if let Some(store) = &self.store
            && let Err(e) = store.shutdown()
        {
            warn!(error = %e, "final compaction failed; the journal keeps every change");
        }
    }
}

fn registered_diff(
    stored: &BTreeMap<String, Vec<String>>,
    current: &BTreeMap<String, Vec<String>>,
) -> Vec<Change> {
    let mut diff: Vec<Change> = current
        .iter()
        .filter(|(name, ids)| stored.get(*name) != Some(*ids))
        .map(|(name, ids)| Change::SetRegistered {
            resource: name.clone(),
            device_ids: ids.clone(),
        })
        .collect();
    diff.extend(
        stored
            .keys()
            .filter(|name| !current.contains_key(*name))
            .map(|name| Change::RemoveRegistered {
                resource: name.clone(),
            }),
    );
    diff
}

fn kind_name(kind: ContainerKind) -> &'static str {
    match kind {
        ContainerKind::Init => "init",
        ContainerKind::Sidecar => "sidecar",
        ContainerKind::App => "app",
    }
}

fn kind_from_name(name: &str) -> ContainerKind {
    match name {
        "init" => ContainerKind::Init,
        "sidecar" => ContainerKind::Sidecar,
        _ => ContainerKind::App,
    }
}

impl DurableState {
    /// The changes that record an admitted pod: its record, every (container, resource)
    /// allocation with the cached `Allocate` answer, and the registration of any resource it
    /// uses that the checkpoint does not list yet (so a restart knows the resource, §3.4).
    pub fn admission_changes(&self, pod: &AdmittedPod, manager: &DeviceManager) -> Vec<Change> {
        // Without a store nothing is recorded (`commit` is a no-op).
        let (Some(store), Some(codec)) = (&self.store, &self.codec) else {
            return Vec::new();
        };
        let mut changes = pod_changes(pod, manager, codec.as_ref());
        {
            let missing: Vec<String> = store.read(|s| {
                pod.containers
                    .iter()
                    .flat_map(|c| c.devices.keys())
                    .filter(|r| !s.registered.contains_key(*r))
                    .cloned()
                    .collect()
            });
            if !missing.is_empty() {
                let registered = manager.registered_resources();
                for resource in missing {
                    let device_ids = registered.get(&resource).cloned().unwrap_or_default();
                    changes.push(Change::SetRegistered {
                        resource,
                        device_ids,
                    });
                }
            }
        }
        changes
    }
}

fn pod_changes(
    pod: &AdmittedPod,
    manager: &DeviceManager,
    codec: &dyn AllocRespCodec,
) -> Vec<Change> {
    let uid = &pod.pod.uid;
    let mut changes = vec![Change::SetPod {
        pod_uid: uid.clone(),
        record: PodRecord {
            namespace: pod.pod.namespace.clone(),
            name: pod.pod.name.clone(),
            containers: pod
                .containers
                .iter()
                .map(|c| ContainerRecord {
                    name: c.name.clone(),
                    kind: kind_name(c.kind).to_owned(),
                    limits: c.limits.clone(),
                    devices: c.devices.clone(),
                    cpus: c.cpus.clone(),
                    numa_affinity: c.numa_affinity.clone(),
                })
                .collect(),
        },
    }];
    for c in &pod.containers {
        for (resource, allocation) in manager.container_allocations(uid, &c.name) {
            changes.push(Change::AddContainer {
                pod_uid: uid.clone(),
                container: c.name.clone(),
                resource,
                device_ids_by_numa: allocation.devices_per_numa,
                alloc_resp: match allocation.response.encoded_bytes() {
                    // Restored and not changed since: the same bytes again.
                    Some(bytes) => bytes.to_vec(),
                    None => allocation
                        .response
                        .get()
                        .map(|r| codec.encode(r))
                        .unwrap_or_default(),
                },
            });
        }
    }
    changes
}

/// Restores `manager` from `state` and returns the admitted pods (spec §3.4, §1.7).
pub fn restore(
    manager: &DeviceManager,
    state: &DeviceState,
    codec: &Arc<dyn AllocRespCodec>,
) -> BTreeMap<String, AdmittedPod> {
    manager.restore_registered(state.registered.keys().cloned());
    // The pods (devicelet's records) and the Device Manager's allocations are built from
    // different parts of the state: build them on two threads (restart to ready is judged
    // at 10 000 containers).
    let mut pods = std::thread::scope(|scope| {
        let pods = std::thread::Builder::new()
            .name("devicelet-restore-pods".into())
            .spawn_scoped(scope, || pods_from_records(state));
        restore_device_allocations(manager, state, codec);
        match pods {
            Ok(builder) => builder
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread could be started: build them here.
            Err(_) => pods_from_records(state),
        }
    });
    // Pods known only from a kubelet's checkpoint (after `state import`): no name, every
    // container an app container whose limits are its device counts.
    for (uid, containers) in &state.pods {
        if pods.contains_key(uid) {
            continue;
        }
        let containers = containers
            .keys()
            .map(|name| {
                let held = manager.container_allocations(uid, name);
                ContainerView {
                    name: name.clone(),
                    limits: held
                        .iter()
                        .map(|(r, a)| (r.clone(), a.device_ids.len() as u64))
                        .collect(),
                    devices: held.into_iter().map(|(r, a)| (r, a.device_ids)).collect(),
                    claims: Vec::new(),
                    allocated_resources_status: Vec::new(),
                    cpus: Default::default(),
                    numa_affinity: Default::default(),
                    memory: Vec::new(),
                    kind: ContainerKind::App,
                }
            })
            .collect();
        pods.insert(
            uid.clone(),
            AdmittedPod {
                pod: PodRef {
                    namespace: String::new(),
                    name: String::new(),
                    uid: uid.clone(),
                },
                containers,
            },
        );
    }
    pods
}

/// Gives `manager` the allocations and cached `Allocate` answers of `state`. The answers stay
/// the checkpoint's bytes until first used (a restart with 10 000 containers would otherwise
/// decode 10 000 of them before it is ready); one that does not decode is logged then.
fn restore_device_allocations(
    manager: &DeviceManager,
    state: &DeviceState,
    codec: &Arc<dyn AllocRespCodec>,
) {
    let codec = Arc::clone(codec);
    let decoder: ResponseDecoder = Arc::new(move |bytes: &[u8]| {
        let response = codec.decode(bytes);
        if response.is_none() {
            warn!(
                bytes = bytes.len(),
                "cached Allocate response in the checkpoint does not decode; the devices stay allocated"
            );
        }
        response
    });
    let mut entries = Vec::with_capacity(state.entry_count());
    for (uid, containers) in &state.pods {
        let record = state.pod_records.get(uid);
        for (container, resources) in containers {
            // Allocation order as admitted, when devicelet's own record has it.
            let ordered = record
                .and_then(|r| r.containers.iter().find(|c| &c.name == container))
                .map(|c| &c.devices);
            for (resource, devices) in resources {
                let response =
                    CachedResponse::encoded(devices.alloc_resp.clone(), Arc::clone(&decoder));
                let device_ids = match ordered.and_then(|o| o.get(resource)) {
                    Some(ids) => ids.clone(),
                    None => {
                        let mut ids: Vec<String> = Vec::new();
                        for id in devices.device_ids_by_numa.values().flatten() {
                            if !ids.contains(id) {
                                ids.push(id.clone());
                            }
                        }
                        ids
                    }
                };
                entries.push((
                    uid.clone(),
                    container.clone(),
                    resource.clone(),
                    ResourceAllocation {
                        device_ids,
                        devices_per_numa: devices.device_ids_by_numa.clone(),
                        response,
                    },
                ));
            }
        }
    }
    manager.restore_allocations(entries);
}

/// The admitted pods as devicelet recorded them (`SetPod` records).
fn pods_from_records(state: &DeviceState) -> BTreeMap<String, AdmittedPod> {
    let mut pods = BTreeMap::new();
    for (uid, record) in &state.pod_records {
        let containers = record
            .containers
            .iter()
            .map(|c| ContainerView {
                name: c.name.clone(),
                devices: c.devices.clone(),
                claims: Vec::new(),
                allocated_resources_status: Vec::new(),
                cpus: c.cpus.clone(),
                numa_affinity: c.numa_affinity.clone(),
                // Not in the journal: `memory_manager_state` holds the blocks, and the
                // admitter fills them in from the memory manager when it restores the pods.
                memory: Vec::new(),
                limits: c.limits.clone(),
                kind: kind_from_name(&c.kind),
            })
            .collect();
        pods.insert(
            uid.clone(),
            AdmittedPod {
                pod: PodRef {
                    namespace: record.namespace.clone(),
                    name: record.name.clone(),
                    uid: uid.clone(),
                },
                containers,
            },
        );
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_diff_sets_changed_and_removes_gone_resources() {
        let stored = BTreeMap::from([
            ("a".to_string(), vec!["1".to_string()]),
            ("gone".to_string(), vec![]),
        ]);
        let current = BTreeMap::from([
            ("a".to_string(), vec!["1".to_string()]),
            ("b".to_string(), vec!["2".to_string()]),
        ]);
        let diff = registered_diff(&stored, &current);
        assert_eq!(
            diff,
            vec![
                Change::SetRegistered {
                    resource: "b".into(),
                    device_ids: vec!["2".into()]
                },
                Change::RemoveRegistered {
                    resource: "gone".into()
                }
            ]
        );
        assert!(registered_diff(&current, &current).is_empty());
    }
}
