//! [`CriRuntime`]: runs admitted pods in a CRI runtime and reports their containers' states.
//!
//! Follows the kubelet's `pkg/kubelet/kuberuntime/kuberuntime_manager.go` (`SyncPod`,
//! `KillPod`) and the PLEG's relist (`pkg/kubelet/pleg/generic.go`, see [`crate::pleg`]): the
//! runtime's own listing is the truth. Once a second the runtime is listed for all pods at once
//! (one `ListPodSandbox`, one `ListContainers`); a pod is synced only when that listing shows a
//! change of its sandboxes or containers, when its object changed (added, updated), when a
//! back-off it waits out ends, or after a failed sync. A sync creates the sandbox if there is
//! none, starts containers that never ran and restarts exited ones per `restartPolicy` (see
//! [`crate::status::plan`]). A pod with nothing to do costs no runtime call.
//!
//! Every sandbox and container carries the kubelet's `io.kubernetes.*` labels and
//! `io.devicelet.managed=<instance>`, and each pod devicelet runs is recorded in
//! `<root>/runtime/pods/<uid>.json` (its Pod object, written atomically with fsync before its
//! sandbox is created). A restarted devicelet therefore adopts what it created: a running
//! container is seen running and is not started again; a sandbox of a pod it no longer runs
//! is stopped and removed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use devicelet_devicemanager::RunContainerOptions;
use devicelet_proto::cri::v1 as cri;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::cdi::{CdiEdits, CdiResolver};
use crate::config::{self, ContainerInputs, LABEL_MANAGED, LABEL_POD_UID, PodIdentity};
use crate::cri::CriClient;
use crate::error::RuntimeError;
use crate::logs::pod_log_dir;
use crate::pleg::{self, Job, Outcome, PodRecord, Relist, Schedule, Wake};
use crate::status::{self, Facts, Observed, PodRuntimeStatus, RunState};
use crate::volumes::{PodApiHandle, VOLUME_REFRESH, VolumeManager, service_env};

/// How often the runtime is listed for all pods (the kubelet's PLEG relists every second).
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);

/// A back-off end is slept past by this much, so the sync it wakes for finds it over (the
/// plan compares wall-clock nanoseconds; the loop sleeps on the monotonic clock).
const BACKOFF_SLACK: Duration = Duration::from_millis(5);

/// Attempts of a container kept in the runtime (the newest and the one before it).
const KEPT_ATTEMPTS: usize = 2;

/// Grace given to the containers of a pod that is gone (removed while devicelet was down, or
/// whose record was lost): the kubelet's default `terminationGracePeriodSeconds`.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// What the node decided for one container (device plugin settings after PreStartContainer,
/// exclusive CPUs, memory nodes, CDI names): the seam to the node core.
pub trait ContainerSettings: Send + Sync + 'static {
    /// The settings of `container` of admitted pod `pod_uid`.
    fn settings<'a>(
        &'a self,
        pod_uid: &'a str,
        container: &'a str,
    ) -> BoxFuture<'a, Result<RunContainerOptions, String>>;
}

impl ContainerSettings for devicelet_node::PodAdmitter {
    fn settings<'a>(
        &'a self,
        pod_uid: &'a str,
        container: &'a str,
    ) -> BoxFuture<'a, Result<RunContainerOptions, String>> {
        Box::pin(async move {
            self.start(pod_uid, container)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Settings of the CRI runtime.
#[derive(Debug, Clone)]
pub struct CriConfig {
    /// `--container-runtime-endpoint`.
    pub endpoint: String,
    /// devicelet's root directory (`<root>/runtime`, `<root>/logs`, `<root>/pods` are used).
    pub root: PathBuf,
    /// CDI spec directories devicelet resolves names in.
    pub cdi_spec_dirs: Vec<String>,
    /// Pass CDI names to the runtime (`CDIDevices`) instead of resolving them in devicelet.
    pub runtime_applies_cdi: bool,
    /// The node's name (`spec.nodeName` in env references).
    pub node_name: String,
    /// The node's IP (`status.hostIP` in env references).
    pub host_ip: String,
    /// Where CRI calls and container starts are counted (the kubelet's metric names).
    pub metrics: devicelet_metrics::Metrics,
    /// Cluster mode: where configMap, secret and projected volumes, service account tokens
    /// and the `kubernetes` Service's env come from. `None` (local mode): such volumes are
    /// refused.
    pub pod_api: Option<PodApiHandle>,
}

impl CriConfig {
    /// Where container logs go: `<root>/logs`.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    fn state_dir(&self) -> PathBuf {
        self.root.join("runtime").join("pods")
    }

    fn volumes_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pods").join(uid).join("volumes")
    }
}

/// A pod devicelet runs.
#[derive(Debug, Clone)]
struct Managed {
    pod: Pod,
    /// The last create/start failure of each container: (reason, message).
    errors: BTreeMap<String, (String, String)>,
    /// Exited containers' states (they no longer change).
    exited: HashMap<String, Observed>,
    /// Containers whose create or start failed: (failures in a row, last failure in ns since
    /// the epoch). The next try waits out the back-off, as the kubelet's image pull and
    /// crash-loop back-offs do, so a pod that cannot start costs no runtime calls meanwhile.
    failures: BTreeMap<String, (u32, i64)>,
    /// The sandbox was stopped after the pod finished.
    sandbox_stopped: bool,
}

impl Managed {
    fn new(pod: Pod) -> Self {
        Managed {
            pod,
            errors: BTreeMap::new(),
            exited: HashMap::new(),
            failures: BTreeMap::new(),
            sandbox_stopped: false,
        }
    }
}

/// Runs pods in a CRI runtime.
pub struct CriRuntime {
    client: CriClient,
    runtime_name: String,
    runtime_version: String,
    /// This devicelet's value of [`LABEL_MANAGED`].
    instance: String,
    config: CriConfig,
    settings: Arc<dyn ContainerSettings>,
    cdi: CdiResolver,
    /// configMap, secret, projected and downwardAPI volumes.
    volumes: VolumeManager,
    pods: Mutex<BTreeMap<String, Managed>>,
    statuses: Mutex<BTreeMap<String, PodRuntimeStatus>>,
    /// One sync or kill of a pod at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per pod: turns true when the pod is being killed, cancelling a sync in flight (an image
    /// pull, a create) so the kill need not wait for it.
    cancels: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// Pods being killed (their object, for the log directory); `run_pod` refuses them.
    terminating: Mutex<HashMap<String, Pod>>,
    changes: watch::Sender<u64>,
    /// Pods added or updated since the sync loop last looked (it is woken by `kick`).
    desired: Mutex<HashSet<String>>,
    kick: Notify,
    /// The last relist's record of each pod, for syncs that need not list the runtime.
    relisted: Mutex<Arc<Relist>>,
}

impl std::fmt::Debug for CriRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriRuntime")
            .field("endpoint", &self.config.endpoint)
            .field("runtime", &self.runtime_name)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CriRuntime {
    /// Connects to the runtime and loads the pods an earlier run recorded (they are looked at,
    /// not started again, by [`CriRuntime::run`]).
    pub async fn connect(
        config: CriConfig,
        settings: Arc<dyn ContainerSettings>,
    ) -> Result<Arc<Self>, RuntimeError> {
        let client = CriClient::connect(&config.endpoint, config.metrics.clone()).await?;
        let version = client.version().await?;
        info!(endpoint = %config.endpoint, runtime = %version.runtime_name,
              version = %version.runtime_version, "container runtime connected");
        let state_dir = config.state_dir();
        std::fs::create_dir_all(&state_dir).map_err(|e| RuntimeError::State {
            path: state_dir.clone(),
            why: e.to_string(),
        })?;
        let pods = load_recorded(&state_dir)?;
        let runtime = CriRuntime {
            client,
            runtime_name: version.runtime_name,
            runtime_version: version.runtime_version,
            instance: config::instance_id(&config.root, &config.node_name),
            cdi: CdiResolver::new(config.cdi_spec_dirs.clone()),
            volumes: VolumeManager::new(config.pod_api.clone(), VOLUME_REFRESH),
            config,
            settings,
            pods: Mutex::new(pods),
            statuses: Mutex::new(BTreeMap::new()),
            locks: Mutex::new(HashMap::new()),
            cancels: Mutex::new(HashMap::new()),
            terminating: Mutex::new(HashMap::new()),
            changes: watch::channel(0).0,
            desired: Mutex::new(HashSet::new()),
            kick: Notify::new(),
            relisted: Mutex::new(Arc::new(Relist::new())),
        };
        Ok(Arc::new(runtime))
    }

    /// The runtime's name (`containerd`), the scheme of container IDs.
    pub fn runtime_name(&self) -> &str {
        &self.runtime_name
    }

    /// `<name>://<version>`, as the Node's `containerRuntimeVersion` shows it.
    pub fn runtime_version(&self) -> String {
        format!("{}://{}", self.runtime_name, self.runtime_version)
    }

    /// The settings it runs with.
    pub fn config(&self) -> &CriConfig {
        &self.config
    }

    /// UIDs of the pods it runs (those recorded by an earlier run included).
    pub fn pods(&self) -> Vec<String> {
        lock(&self.pods).keys().cloned().collect()
    }

    /// Bumped whenever a pod's runtime status changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The runtime status of pod `uid`, once it was looked at.
    pub fn status(&self, uid: &str) -> Option<PodRuntimeStatus> {
        lock(&self.statuses).get(uid).cloned()
    }

    /// Runs `pod` (admitted by the node): recorded durably, then started by the sync loop. A
    /// pod it already runs only has its object updated: nothing is started twice.
    pub fn run_pod(&self, pod: &Pod) -> Result<(), RuntimeError> {
        config::check_pod(pod)?;
        let id = PodIdentity::of(pod)?;
        if lock(&self.terminating).contains_key(&id.uid) {
            return Err(RuntimeError::Config(format!(
                "pod {} is being stopped; it cannot be run again until that is done",
                id.key()
            )));
        }
        {
            let mut pods = lock(&self.pods);
            if let Some(known) = pods.get_mut(&id.uid) {
                if known.pod != *pod {
                    known.pod = pod.clone();
                    lock(&self.desired).insert(id.uid.clone());
                    self.kick.notify_one();
                }
                return Ok(());
            }
        }
        let path = self.config.state_dir().join(format!("{}.json", id.uid));
        let body = serde_json::to_vec(pod).map_err(|e| RuntimeError::State {
            path: path.clone(),
            why: e.to_string(),
        })?;
        devicelet_checkpoint::atomic_write::write_file_atomic(&path, &body).map_err(|e| {
            RuntimeError::State {
                path: path.clone(),
                why: e.to_string(),
            }
        })?;
        lock(&self.pods).insert(id.uid.clone(), Managed::new(pod.clone()));
        info!(pod = %id.key(), pod_uid = %id.uid, "pod handed to the container runtime");
        lock(&self.desired).insert(id.uid.clone());
        self.kick.notify_one();
        Ok(())
    }

    /// Stops pod `uid`'s containers (SIGTERM, SIGKILL after `grace`), removes its sandboxes
    /// and forgets it. Also cleans up a pod devicelet does not know but the runtime has
    /// (labelled by an earlier run). Idempotent.
    pub async fn kill_pod(&self, uid: &str, grace: Duration) -> Result<(), RuntimeError> {
        // First nothing more is started for it (also if this kill fails and is retried), and a
        // sync in flight is cancelled rather than waited for.
        if let Some(managed) = lock(&self.pods).remove(uid) {
            lock(&self.terminating).insert(uid.to_owned(), managed.pod);
        }
        if let Some(cancel) = lock(&self.cancels).get(uid) {
            cancel.send_replace(true);
        }
        let pod_lock = self.pod_lock(uid);
        let _held = pod_lock.lock().await;
        let known = lock(&self.terminating).get(uid).cloned();
        let selector = [
            (LABEL_MANAGED, self.instance.as_str()),
            (LABEL_POD_UID, uid),
        ];
        let containers = self.client.list_containers(&selector).await?;
        let running: Vec<_> = containers
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .collect();
        let stops = running
            .iter()
            .map(|c| self.client.stop_container(&c.id, grace));
        for (c, result) in running.iter().zip(futures::future::join_all(stops).await) {
            if let Err(e) = result {
                warn!(pod_uid = %uid, container_id = %c.id, error = %e, "stopping container failed");
            }
        }
        for sandbox in self.client.list_pod_sandboxes(&selector).await? {
            self.client.stop_pod_sandbox(&sandbox.id).await?;
            self.client.remove_pod_sandbox(&sandbox.id).await?;
        }
        lock(&self.terminating).remove(uid);
        lock(&self.statuses).remove(uid);
        self.volumes.forget(uid);
        lock(&self.cancels).remove(uid);
        // The UID comes from a request path: only a name that cannot leave the root is used
        // to remove files (a pod with any other UID was never recorded).
        if config::is_path_safe(uid) {
            let record = self.config.state_dir().join(format!("{uid}.json"));
            remove_quietly(&record);
            let _ = std::fs::remove_dir_all(self.config.root.join("pods").join(uid));
        }
        if let Some(id) = known.and_then(|pod| PodIdentity::of(&pod).ok()) {
            let _ = std::fs::remove_dir_all(pod_log_dir(
                &self.config.logs_dir(),
                &id.namespace,
                &id.name,
                &id.uid,
            ));
        }
        info!(pod_uid = %uid, stopped = running.len(), "pod's containers stopped and sandbox removed");
        self.changes.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Stops pod `uid` as [`CriRuntime::kill_pod`] with its own grace period
    /// (`terminationGracePeriodSeconds`, shortened by the deletion's grace period).
    pub async fn kill_pod_gracefully(&self, uid: &str) -> Result<(), RuntimeError> {
        let grace = self.grace(uid).unwrap_or(ORPHAN_GRACE);
        self.kill_pod(uid, grace).await
    }

    /// The grace period of a pod it runs or is stopping.
    fn grace(&self, uid: &str) -> Option<Duration> {
        let running = lock(&self.pods).get(uid).map(|m| grace_of(&m.pod));
        running.or_else(|| lock(&self.terminating).get(uid).map(grace_of))
    }

    /// Keeps only the pods in `keep`: every other pod it runs, and every sandbox labelled as
    /// devicelet's whose pod is not in `keep`, is killed (after a restart: pods removed while
    /// devicelet was down).
    pub async fn retain(
        &self,
        keep: &HashSet<String>,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let mut gone: HashSet<String> = self
            .pods()
            .into_iter()
            .filter(|u| !keep.contains(u))
            .collect();
        for sandbox in self
            .client
            .list_pod_sandboxes(&[(LABEL_MANAGED, self.instance.as_str())])
            .await?
        {
            if let Some(uid) = sandbox.labels.get(LABEL_POD_UID)
                && !keep.contains(uid)
            {
                gone.insert(uid.clone());
            }
        }
        // All at once, each with its own grace period (`grace` for a pod it has no record of).
        let kills = gone.iter().map(|uid| {
            info!(pod_uid = %uid, "pod no longer on the node; removing its containers");
            self.kill_pod(uid, self.grace(uid).unwrap_or(grace))
        });
        let mut first_error = None;
        for (uid, result) in gone.iter().zip(futures::future::join_all(kills).await) {
            if let Err(e) = result {
                warn!(pod_uid = %uid, error = %e, "removing a gone pod's containers failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The sync loop, until `shutdown` turns true: relists the runtime every [`RELIST_PERIOD`]
    /// and syncs the pods that need it (see [`crate::pleg::Schedule`]); between relists it
    /// sleeps until the next relist, the earliest back-off end or volume refresh, or a pod
    /// being added or updated.
    ///
    /// Each pod's sync is a task of its own: a pod pulling a large image or waiting on a slow
    /// runtime call holds up no other pod; a pod whose sync is still running is synced again
    /// after it, if it is still due.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut jobs: tokio::task::JoinSet<(String, Outcome)> = tokio::task::JoinSet::new();
        // Which pod each job is for, should one panic.
        let mut job_pods: HashMap<tokio::task::Id, String> = HashMap::new();
        let mut schedule = Schedule::new();
        // What an earlier run recorded is synced from the first relist.
        schedule.adopt(&self.pods());
        let mut next_relist = tokio::time::Instant::now();
        loop {
            let pods = self.pods();
            schedule.set_pods(&pods);
            for uid in std::mem::take(&mut *lock(&self.desired)) {
                schedule.desired_changed(&uid);
            }
            let now = tokio::time::Instant::now();
            if now >= next_relist {
                match self.relist().await {
                    Ok(changed) => schedule.relisted(&changed),
                    Err(e) => {
                        warn!(error = %e, "listing the container runtime failed; trying again on the next relist");
                        schedule.relist_failed();
                    }
                }
                next_relist = tokio::time::Instant::now() + RELIST_PERIOD;
            }
            for job in schedule.take_due(tokio::time::Instant::now()) {
                let uid = job.uid().to_owned();
                let runtime = Arc::clone(&self);
                let handle = jobs.spawn(async move { runtime.run_job(job).await });
                job_pods.insert(handle.id(), uid);
            }
            self.forget_idle_locks(&pods);
            let wake = schedule
                .next_wake()
                .map_or(next_relist, |at| at.min(next_relist));
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = self.kick.notified() => {}
                Some(done) = jobs.join_next_with_id(), if !jobs.is_empty() => {
                    match done {
                        Ok((id, (uid, outcome))) => {
                            job_pods.remove(&id);
                            schedule.finished(&uid, outcome);
                        }
                        Err(e) => {
                            if let Some(uid) = job_pods.remove(&e.id()) {
                                warn!(pod_uid = %uid, error = %e, "pod sync panicked; retrying on the next relist");
                                schedule.finished(&uid, Outcome::Failed);
                            }
                        }
                    }
                }
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }

    /// One job of the loop; the pod's UID and when it wants to be looked at again.
    async fn run_job(&self, job: Job) -> (String, Outcome) {
        match job {
            Job::Sync { uid, use_relist } => {
                let record = if use_relist {
                    Some(lock(&self.relisted).get(&uid).cloned().unwrap_or_default())
                } else {
                    None
                };
                let outcome = match self.sync_pod_with(&uid, record).await {
                    Ok(wake) => Outcome::Done(wake),
                    Err(e) => {
                        warn!(pod_uid = %uid, error = %e, "pod sync failed; retrying on the next relist");
                        Outcome::Failed
                    }
                };
                (uid, outcome)
            }
            Job::Volumes { uid } => {
                let due = self.refresh_volumes(&uid).await;
                (uid, Outcome::Refreshed(due))
            }
        }
    }

    /// The relist: one `ListPodSandbox` and one `ListContainers` of everything this devicelet
    /// made, grouped by pod and compared with the previous relist. The pods with an event.
    pub async fn relist(&self) -> Result<Vec<String>, RuntimeError> {
        let selector = [(LABEL_MANAGED, self.instance.as_str())];
        let sandboxes = self.client.list_pod_sandboxes(&selector).await?;
        let containers = self.client.list_containers(&selector).await?;
        let current = Arc::new(pleg::group(&sandboxes, &containers));
        let previous = std::mem::replace(&mut *lock(&self.relisted), Arc::clone(&current));
        let events = pleg::events(&previous, &current);
        for e in &events {
            debug!(pod_uid = %e.pod_uid, id = %e.id, event = ?e.kind, "relist event");
        }
        Ok(pleg::changed_pods(&events).into_iter().collect())
    }

    /// Drops the locks and cancel switches of pods it no longer runs or stops.
    fn forget_idle_locks(&self, pods: &[String]) {
        let terminating: HashSet<String> = lock(&self.terminating).keys().cloned().collect();
        let keep = |uid: &String| pods.contains(uid) || terminating.contains(uid);
        // A lock someone holds or waits for (more than the map's reference) stays.
        lock(&self.locks).retain(|uid, l| keep(uid) || Arc::strong_count(l) > 1);
        lock(&self.cancels).retain(|uid, _| keep(uid));
    }

    /// One look at every pod, from one relist.
    pub async fn sync_all(&self) {
        let relisted = match self.relist().await {
            Ok(_) => Some(Arc::clone(&lock(&self.relisted))),
            Err(e) => {
                warn!(error = %e, "listing the container runtime failed; each pod lists its own");
                None
            }
        };
        let uids = self.pods();
        let syncs = uids.iter().map(|uid| {
            let record = relisted
                .as_ref()
                .map(|r| r.get(uid).cloned().unwrap_or_default());
            self.sync_pod_with(uid, record)
        });
        for (uid, result) in uids.iter().zip(futures::future::join_all(syncs).await) {
            if let Err(e) = result {
                warn!(pod_uid = %uid, error = %e, "pod sync failed; retrying on the next relist");
            }
        }
    }

    fn pod_lock(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.locks).entry(uid.to_owned()).or_default())
    }

    /// One look at pod `uid`, listing the runtime for it: create its sandbox, start or restart
    /// its containers, record its status.
    pub async fn sync_pod(&self, uid: &str) -> Result<(), RuntimeError> {
        self.sync_pod_with(uid, None).await.map(drop)
    }

    /// [`CriRuntime::sync_pod`], from `record` (the pod's part of a relist taken since its last
    /// sync) instead of listing the runtime when given. When to look again.
    async fn sync_pod_with(
        &self,
        uid: &str,
        record: Option<PodRecord>,
    ) -> Result<Wake, RuntimeError> {
        let pod_lock = self.pod_lock(uid);
        let _held = pod_lock.lock().await;
        let mut cancelled = lock(&self.cancels)
            .entry(uid.to_owned())
            .or_insert_with(|| watch::channel(false).0)
            .subscribe();
        let backoff = tokio::select! {
            result = self.sync_pod_locked(uid, record) => result?,
            // Being killed: drop the calls in flight; the kill removes whatever they made.
            _ = cancelled.wait_for(|c| *c) => None,
        };
        Ok(Wake {
            backoff: backoff.map(|end| instant_of(end) + BACKOFF_SLACK),
            volumes: self.volumes_due(uid),
        })
    }

    /// When pod `uid`'s API-backed volumes are next due to be read (none for a finished pod).
    fn volumes_due(&self, uid: &str) -> Option<tokio::time::Instant> {
        let pods = lock(&self.pods);
        let managed = pods.get(uid).filter(|m| !m.sandbox_stopped)?;
        self.volumes.refresh_due(&managed.pod)
    }

    /// Reads pod `uid`'s configMap, secret and projected volumes again if due (no runtime
    /// call); when they are due next.
    async fn refresh_volumes(&self, uid: &str) -> Option<tokio::time::Instant> {
        let pod_lock = self.pod_lock(uid);
        let _held = pod_lock.lock().await;
        let pod = lock(&self.pods)
            .get(uid)
            .filter(|m| !m.sandbox_stopped)
            .map(|m| m.pod.clone());
        if let Some(pod) = pod {
            self.volumes
                .refresh(&pod, &self.config.volumes_dir(uid))
                .await;
        }
        self.volumes_due(uid)
    }

    /// The pod's sandboxes and containers, listed for it alone.
    async fn list_pod(&self, uid: &str) -> Result<PodRecord, RuntimeError> {
        let selector = [
            (LABEL_MANAGED, self.instance.as_str()),
            (LABEL_POD_UID, uid),
        ];
        let containers = self.client.list_containers(&selector).await?;
        let sandboxes = self.client.list_pod_sandboxes(&selector).await?;
        Ok(pleg::group(&sandboxes, &containers)
            .remove(uid)
            .unwrap_or_default())
    }

    /// The sync itself; the earliest end (ns since the epoch) of a back-off the pod waits out.
    async fn sync_pod_locked(
        &self,
        uid: &str,
        mut record: Option<PodRecord>,
    ) -> Result<Option<i64>, RuntimeError> {
        let Some(mut managed) = lock(&self.pods).get(uid).cloned() else {
            return Ok(None);
        };
        if managed.sandbox_stopped {
            return Ok(None);
        }
        let pod = managed.pod.clone();
        let pod = &pod;
        let id = PodIdentity::of(pod)?;
        let log_dir = pod_log_dir(&self.config.logs_dir(), &id.namespace, &id.name, &id.uid);
        // configMaps, secrets and tokens change: read again every VOLUME_REFRESH.
        self.volumes
            .refresh(pod, &self.config.volumes_dir(&id.uid))
            .await;
        let mut sandbox_id: Option<String> = None;
        let mut next_backoff: Option<i64> = None;
        for _ in 0..2 {
            // The relist's record the first time (when given); after starting something, the
            // pod is listed afresh.
            let listed = match record.take() {
                Some(r) => r,
                None => self.list_pod(uid).await?,
            };
            let observed = self.observe(uid, &mut managed, &listed).await?;
            let ready = listed.ready_sandbox().map(str::to_owned);
            let mut plan = status::plan(
                pod,
                Facts {
                    observed: &observed,
                    errors: &managed.errors,
                    runtime_name: &self.runtime_name,
                    sandbox_id: ready.as_deref().unwrap_or_default(),
                    now: now_nanos(),
                },
            );
            if plan.status.is_terminal() {
                // Finished (also when found finished after a restart): stop what is left, never
                // make a new sandbox for it. Its containers stay for their logs and status.
                info!(pod = %id.key(), pod_uid = %uid, phase = %plan.status.phase, "pod finished; stopping its sandbox");
                for s in &listed.sandboxes {
                    self.client.stop_pod_sandbox(&s.id).await?;
                }
                managed.sandbox_stopped = true;
                self.record(uid, &managed, plan.status);
                return Ok(None);
            }
            let now = now_nanos();
            next_backoff = plan.next_backoff_end;
            plan.start.retain(|(name, _)| {
                managed.failures.get(name).is_none_or(|(count, at)| {
                    let wait = status::backoff(count.saturating_sub(1));
                    let end = at.saturating_add(i64::try_from(wait.as_nanos()).unwrap_or(i64::MAX));
                    if now < end {
                        next_backoff = Some(next_backoff.map_or(end, |e| e.min(end)));
                    }
                    now >= end
                })
            });
            if plan.start.is_empty() {
                self.record(uid, &managed, plan.status);
                return Ok(next_backoff);
            }
            let sandbox = match (ready, &sandbox_id) {
                (Some(id_), _) => id_,
                (None, Some(made)) => made.clone(),
                (None, None) => {
                    let attempt = listed.next_sandbox_attempt();
                    make_dir(&log_dir)?;
                    let config = config::sandbox_config(pod, &self.instance, attempt, &log_dir)?;
                    let made = self.client.run_pod_sandbox(config).await?;
                    info!(pod = %id.key(), pod_uid = %uid, sandbox_id = %made, attempt, "pod sandbox started");
                    made
                }
            };
            sandbox_id = Some(sandbox.clone());
            plan.status.sandbox_id.clone_from(&sandbox);
            for (name, attempt) in &plan.start {
                let container_type = if is_init_container(pod, name) {
                    "init_container"
                } else {
                    "container"
                };
                let started = self
                    .start_container(&managed.pod, &sandbox, &log_dir, name, *attempt)
                    .await;
                self.config
                    .metrics
                    .container_started(container_type, started.as_ref().err().map(error_reason));
                match started {
                    Ok(container_id) => {
                        managed.errors.remove(name);
                        managed.failures.remove(name);
                        info!(pod = %id.key(), pod_uid = %uid, container = %name, attempt,
                              container_id = %container_id, "container started");
                    }
                    Err(e) => {
                        warn!(pod = %id.key(), pod_uid = %uid, container = %name, error = %e,
                              "container could not be started");
                        managed
                            .errors
                            .insert(name.clone(), (error_reason(&e).to_owned(), e.to_string()));
                        let failures = managed.failures.entry(name.clone()).or_insert((0, 0));
                        *failures = (failures.0 + 1, now_nanos());
                    }
                }
            }
            // Look again at once, so the status says Running (or the error).
            self.record(uid, &managed, plan.status);
        }
        // Started twice over: the next relist shows what came of it. A start that failed now
        // waits out its back-off.
        let now = now_nanos();
        for (count, at) in managed.failures.values() {
            let wait = status::backoff(count.saturating_sub(1));
            let end = at.saturating_add(i64::try_from(wait.as_nanos()).unwrap_or(i64::MAX));
            if now < end {
                next_backoff = Some(next_backoff.map_or(end, |e| e.min(end)));
            }
        }
        Ok(next_backoff)
    }

    /// Stores the pod's bookkeeping and status; tells watchers when the status changed.
    fn record(&self, uid: &str, managed: &Managed, status: PodRuntimeStatus) {
        if let Some(m) = lock(&self.pods).get_mut(uid) {
            m.errors.clone_from(&managed.errors);
            m.exited.clone_from(&managed.exited);
            m.failures.clone_from(&managed.failures);
            m.sandbox_stopped = managed.sandbox_stopped;
        }
        let changed = lock(&self.statuses)
            .insert(uid.to_owned(), status.clone())
            .as_ref()
            != Some(&status);
        if changed {
            debug!(pod_uid = %uid, phase = %status.phase, "pod runtime status changed");
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Every attempt of each container of the pod, oldest first, from the pod's listing (the
    /// state of a container not known to have exited is asked for: `ContainerStatus`).
    async fn observe(
        &self,
        uid: &str,
        managed: &mut Managed,
        listed: &PodRecord,
    ) -> Result<BTreeMap<String, Vec<Observed>>, RuntimeError> {
        let mut out: BTreeMap<String, Vec<Observed>> = BTreeMap::new();
        for c in &listed.containers {
            let name = c.name.clone();
            let observed = match managed.exited.get(&c.id) {
                Some(done) => done.clone(),
                None => {
                    let s = self.client.container_status(&c.id).await?;
                    let state = match cri::ContainerState::try_from(s.state) {
                        Ok(cri::ContainerState::ContainerCreated) => RunState::Created,
                        Ok(cri::ContainerState::ContainerRunning) => RunState::Running,
                        Ok(cri::ContainerState::ContainerExited) => RunState::Exited(s.exit_code),
                        _ => RunState::Unknown,
                    };
                    let o = Observed {
                        id: c.id.clone(),
                        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
                        state,
                        started_at: s.started_at,
                        finished_at: s.finished_at,
                        reason: s.reason,
                        message: s.message,
                        image_ref: s.image_ref,
                    };
                    if matches!(state, RunState::Exited(_)) {
                        managed.exited.insert(c.id.clone(), o.clone());
                    }
                    o
                }
            };
            out.entry(name).or_default().push(observed);
        }
        for attempts in out.values_mut() {
            attempts.sort_by_key(|o| o.attempt);
            // The kubelet's container GC: dead attempts beyond the newest two (the current one
            // and the one `lastState` and `logs --previous` show) are removed, so a crash-looping
            // container does not pile up. Their log files stay until the pod goes.
            let keep_from = attempts.len().saturating_sub(KEPT_ATTEMPTS);
            for old in attempts.drain(..keep_from) {
                if matches!(old.state, RunState::Exited(_)) {
                    managed.exited.remove(&old.id);
                    if let Err(e) = self.client.remove_container(&old.id).await {
                        debug!(pod_uid = %uid, container_id = %old.id, error = %e, "removing a dead container failed");
                    }
                }
            }
        }
        Ok(out)
    }

    /// Pulls the image if needed, asks the node for the container's settings, creates and
    /// starts the container.
    async fn start_container(
        &self,
        pod: &Pod,
        sandbox_id: &str,
        log_dir: &Path,
        name: &str,
        attempt: u32,
    ) -> Result<String, RuntimeError> {
        let id = PodIdentity::of(pod)?;
        let container = find_container(pod, name).ok_or_else(|| {
            RuntimeError::Config(format!("no container {name:?} in the pod spec"))
        })?;
        let image_ref = self.ensure_image(container).await?;
        let options = self
            .settings
            .settings(&id.uid, name)
            .await
            .map_err(RuntimeError::Settings)?;
        let cdi = if self.config.runtime_applies_cdi {
            CdiEdits::default()
        } else {
            self.cdi.resolve(&options.cdi_devices)?
        };
        let volumes_dir = self.config.volumes_dir(&id.uid);
        let volumes = config::volume_host_paths(pod, &volumes_dir)?;
        for path in volumes.values().filter(|p| p.starts_with(&volumes_dir)) {
            make_dir(path)?;
        }
        self.volumes.prepare(pod, &volumes_dir).await?;
        let service_env = match self.volumes.api() {
            Some(api) => {
                let address = api.kubernetes_service().await.map_err(|e| {
                    RuntimeError::Config(format!("the kubernetes Service's env: {e}"))
                })?;
                service_env("kubernetes", &address)
            }
            None => Vec::new(),
        };
        for vm in container.volume_mounts.iter().flatten() {
            if let (Some(sub), Some(volume)) = (
                vm.sub_path.as_deref().filter(|s| !s.is_empty()),
                volumes.get(&vm.name),
            ) {
                check_sub_path(volume, sub)?;
            }
        }
        make_dir(&log_dir.join(name))?;
        let container_config = config::container_config(ContainerInputs {
            pod,
            instance: &self.instance,
            container,
            attempt,
            image_ref: &image_ref,
            options: &options,
            cdi: &cdi,
            pass_cdi_names: self.config.runtime_applies_cdi,
            volumes: &volumes,
            node_name: &self.config.node_name,
            host_ip: &self.config.host_ip,
            service_env: &service_env,
        })?;
        let sandbox_config = config::sandbox_config(pod, &self.instance, 0, log_dir)?;
        let container_id = self
            .client
            .create_container(sandbox_id, container_config, sandbox_config)
            .await?;
        if let Err(e) = self.client.start_container(&container_id).await {
            // A container that cannot start is removed, so the next attempt is clean.
            let _ = self.client.remove_container(&container_id).await;
            return Err(e);
        }
        Ok(container_id)
    }

    /// The image's reference in the runtime, pulled per `imagePullPolicy` (the API's default:
    /// `Always` for `:latest` or no tag, else `IfNotPresent`).
    async fn ensure_image(&self, container: &Container) -> Result<String, RuntimeError> {
        let image = container
            .image
            .clone()
            .filter(|i| !i.is_empty())
            .ok_or_else(|| {
                RuntimeError::Config(format!("container {:?} has no image", container.name))
            })?;
        let last = image.rsplit('/').next().unwrap_or(&image);
        let untagged_or_latest =
            !last.contains(':') && !image.contains('@') || last.ends_with(":latest");
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or(if untagged_or_latest {
                "Always"
            } else {
                "IfNotPresent"
            });
        let present = self.client.image_id(&image).await?;
        match (policy, present) {
            ("Never", Some(id)) | ("IfNotPresent", Some(id)) => Ok(id),
            ("Never", None) => Err(RuntimeError::Config(format!(
                "ErrImageNeverPull: image {image} is not present and imagePullPolicy is Never"
            ))),
            _ => {
                self.client.pull_image(&image).await.map_err(|e| {
                    RuntimeError::Config(format!("ErrImagePull: pulling {image}: {e}"))
                })
            }
        }
    }
}

/// A pod's grace period (see [`config::grace_seconds`]).
pub fn grace_of(pod: &Pod) -> Duration {
    Duration::from_secs(u64::try_from(config::grace_seconds(pod)).unwrap_or(0))
}

fn error_reason(e: &RuntimeError) -> &'static str {
    match e {
        RuntimeError::Config(msg) if msg.starts_with("ErrImagePull") => "ErrImagePull",
        RuntimeError::Config(msg) if msg.starts_with("ErrImageNeverPull") => "ErrImageNeverPull",
        other => other.waiting_reason(),
    }
}

fn is_init_container(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|inits| inits.iter().any(|c| c.name == name))
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
}

/// A `subPath` must stay inside its volume: a component that is a symbolic link must resolve
/// inside the volume (a container could otherwise point one at `/` and have a later mount
/// expose the host, the kubelet's CVE-2017-1002101; the kubelet too resolves the links and
/// checks the result is within the volume, so a configMap key, a link into `..data`, works).
/// Missing directories are created, as the kubelet does. A link swapped in between this check
/// and the runtime's mount is not caught (the kubelet's openat walk is not reproduced).
fn check_sub_path(volume: &Path, sub: &str) -> Result<(), RuntimeError> {
    let mut path = volume.to_path_buf();
    let inside = |p: &Path| match (p.canonicalize(), volume.canonicalize()) {
        (Ok(resolved), Ok(base)) => resolved.starts_with(base),
        _ => false,
    };
    for part in sub.split('/').filter(|p| !p.is_empty() && *p != ".") {
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() && inside(&path) => {}
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(RuntimeError::Config(format!(
                    "subPath {sub:?}: {} is a symbolic link; it could leave the volume",
                    path.display()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => make_dir(&path)?,
            Err(e) => {
                return Err(RuntimeError::State {
                    path,
                    why: e.to_string(),
                });
            }
        }
    }
    Ok(())
}

fn make_dir(path: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(path).map_err(|e| RuntimeError::State {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

fn remove_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!(path = %path.display(), error = %e, "could not remove runtime record");
    }
}

/// The pods an earlier run recorded. A record that cannot be read is set aside (renamed
/// `.bad`), never silently dropped; its containers are then removed as those of a gone pod.
fn load_recorded(dir: &Path) -> Result<BTreeMap<String, Managed>, RuntimeError> {
    let mut out = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| RuntimeError::State {
        path: dir.to_path_buf(),
        why: e.to_string(),
    })?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let pod: Result<Pod, String> = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        match pod.and_then(|p| {
            PodIdentity::of(&p)
                .map(|id| (id, p))
                .map_err(|e| e.to_string())
        }) {
            Ok((id, pod)) => {
                out.insert(id.uid, Managed::new(pod));
            }
            Err(why) => {
                warn!(path = %path.display(), error = %why, "unreadable runtime record set aside");
                let _ = std::fs::rename(&path, path.with_extension("json.bad"));
            }
        }
    }
    Ok(out)
}

/// The monotonic instant of `nanos` since the epoch (now, for a time already past).
fn instant_of(nanos: i64) -> tokio::time::Instant {
    let ahead = u64::try_from(nanos.saturating_sub(now_nanos())).unwrap_or(0);
    tokio::time::Instant::now() + Duration::from_nanos(ahead)
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_path_through_a_symlink_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        std::fs::create_dir_all(&volume).expect("mkdir");
        std::os::unix::fs::symlink("/", volume.join("escape")).expect("symlink");
        let err = check_sub_path(&volume, "escape/etc")
            .expect_err("symlink")
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        check_sub_path(&volume, "a/b").expect("plain directories");
        std::os::unix::fs::symlink("a", volume.join("inside")).expect("symlink");
        check_sub_path(&volume, "inside/b").expect("a link resolving inside the volume");
        assert!(volume.join("a/b").is_dir(), "created");
    }
}
