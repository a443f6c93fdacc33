//! Pods bound to this node: admitted through the node core, reported, released, deleted.
//!
//! Follows the kubelet's pod handling (`pkg/kubelet/kubelet.go` `HandlePodAdditions`,
//! `HandlePodRemoves`, `rejectPod`; `pkg/kubelet/config` watching pods with
//! `spec.nodeName=<node>`):
//! - a new pod is admitted through [`NodeCore::admit`] (devices, Topology and CPU managers,
//!   claims); admitted, it is reported `Running` (simulated runtime); rejected, it is `Failed`
//!   with the kubelet's reason and never retried (a later event for it is not admitted again);
//! - a pod with `deletionTimestamp`, or one whose object is deleted, is released (devices, CPUs,
//!   claims) and then deleted with grace period 0, as the kubelet's final delete;
//! - a pod in a terminal phase is released;
//! - on every full list (start, and every relist after a watch expired with 410 Gone, which
//!   kube's watcher does), admitted pods the list does not contain are released first — pods
//!   force-deleted while devicelet was down or while the watch was broken — and the listed pods
//!   are then handled oldest first (the kubelet sorts additions by creation time), so a
//!   restarted devicelet resumes from its checkpoint and the API: admission is idempotent by
//!   UID, so no pod is admitted twice and a running pod keeps its devices.
//!
//! - after a restart, the first list waits (at most [`PLUGIN_REREGISTRATION_WAIT`]) for the
//!   device plugins the node had before to register again before admitting new pods: the
//!   kubelet admits at once and rejects them with `UnexpectedAdmissionError` ("no healthy
//!   devices"), so a Deployment churns through failed replicas after every kubelet restart
//!   (k/k#133382, squat/generic-device-plugin#33; ecosystem A1 rows 4 and 8).
//!
//! Inventory changes re-report the `allocatedResourcesStatus` of admitted pods (KEP-4680).
//!
//! Admissions run concurrently, one at a time per pod: the loop hands each to its own task and
//! goes on with other pods' events, so a pod whose claims take a GET and a driver call holds up
//! no other pod (the kubelet's pod workers are per pod too). An event for a pod whose admission
//! is in flight is kept and handled when it finishes (the latest one wins). A full list is still
//! admitted one pod at a time, oldest first.
//!
//! A pod the node cannot admit *yet* ([`Rejection::retry`]: its claims are not ready — the Node
//! authorizer may not know the pod's claim yet, a DRA driver is away, an API call failed) stays
//! Pending and is tried again on every event for it — kube-controller-manager writing its
//! `resourceClaimStatuses`, kube-scheduler's binding — and with back-off, with a Warning event
//! `FailedPrepareDynamicResources` each time the reason changes; the kubelet prepares claims in
//! pod sync, not in admission, and never fails a pod for it. The back-off starts at 0.5 s
//! (the kubelet's pod sync back-off), except for a claim the Node authorizer has not linked to
//! the node yet ([`Rejection::retry_soon`]): its graph follows the binding within milliseconds
//! (hundreds under load) and the node cannot watch it, so that pod is tried again after 5 ms,
//! doubling, quietly, for 2 s; only then does it get a warning, an event and the usual back-off.
//!
//! Every admitted pod gets a start-up record ([`crate::startup`]): where its time went from the
//! moment the node first saw it bound to its Running status written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinSet};
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::core::{AdmitStages, NodeCore, PodRuntime, Rejection};
use crate::events::EventRecorder;
use crate::metrics::ClusterMetrics;
use crate::node::now_rfc3339;
use crate::pod_status;
use crate::startup::StartupRecord;
use crate::status_manager::{Desired, StatusManager};

/// How long the first list after a start waits for the device plugins the node had before
/// to register again (plugins re-register within seconds of `kubelet.sock` reappearing).
pub const PLUGIN_REREGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// First and longest pause before a pod that could not be admitted yet is tried again.
pub const ADMIT_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// See [`ADMIT_RETRY_INITIAL`].
pub const ADMIT_RETRY_MAX: Duration = Duration::from_secs(10);
/// First pause before a pod whose claim the Node authorizer has not linked yet
/// ([`Rejection::retry_soon`]) is tried again; doubling to [`ADMIT_RETRY_SOON_MAX`].
pub const ADMIT_RETRY_SOON: Duration = Duration::from_millis(5);
/// See [`ADMIT_RETRY_SOON`]. The graph's lag is milliseconds on a quiet API server and hundreds
/// of them on a loaded one; the pause doubles so that a loaded server is not also flooded with
/// refused GETs (capped at 20 ms, 100 nodes' retries made the API server slower for every call:
/// claim GET p99 0.25 s → 0.76 s, 22 attempts per pod at p99 instead of 4).
pub const ADMIT_RETRY_SOON_MAX: Duration = Duration::from_secs(1);
/// How long a claim the Node authorizer has not linked yet is retried on the short back-off,
/// logged at debug level only; then it is a warning, an event and the usual back-off (the node
/// identity may really lack the permission).
const QUIET_NOT_LINKED: Duration = Duration::from_secs(2);

/// A pod waiting to be admitted again.
#[derive(Debug)]
struct Waiting {
    pod: Pod,
    backoff: Backoff,
    /// The back-off of [`Rejection::retry_soon`] causes.
    soon: Backoff,
    due: tokio::time::Instant,
    /// The last message reported in an event (a new one is sent only when it changes).
    message: String,
}

/// A pod on its way to admission: when the node first saw it, and how many tries so far.
#[derive(Debug, Clone, Copy)]
struct Starting {
    seen: tokio::time::Instant,
    attempts: u32,
}

/// What arrived for a pod while its admission was in flight.
#[derive(Debug)]
enum Followup {
    Apply(Pod),
    Delete(Pod),
}

/// One finished admission attempt.
struct Attempt {
    pod: Pod,
    started: tokio::time::Instant,
    took: Duration,
    result: Result<AdmitStages, Rejection>,
}

/// What follows once a pod's containers are stopped (and its devices released).
#[derive(Debug, Clone)]
enum AfterKill {
    /// The pod is being deleted: delete its object with grace period 0.
    Delete { namespace: String, name: String },
    /// The object is gone already.
    Forget,
    /// Nothing (a pod no longer bound to the node).
    Nothing,
}

/// One finished kill: the pod whose containers are gone.
struct Killed {
    uid: String,
}

/// First and longest pause before a failed kill of a pod's containers is tried again.
const KILL_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// See [`KILL_RETRY_INITIAL`].
const KILL_RETRY_MAX: Duration = Duration::from_secs(10);

/// A pod the node admitted, as last seen.
#[derive(Debug, Clone)]
struct Admitted {
    pod: Pod,
    started: String,
}

/// Where the worker's decisions about pod objects go: [`StatusManager`] in production, a
/// recorder in tests.
pub trait PodWrites: Send + 'static {
    /// Pod `uid` should become `desired`.
    fn set(&self, uid: &str, namespace: &str, name: &str, desired: Desired);
    /// Pod `uid`'s object is gone.
    fn forget(&self, uid: &str);
    /// Pod `uid` was admitted: `record` is completed when its Running status is written.
    fn started(&self, _uid: &str, _record: StartupRecord) {}
    /// Like `set`, but sent even if it was sent before (the API object lost it).
    fn resend(&self, uid: &str, namespace: &str, name: &str, desired: Desired) {
        self.set(uid, namespace, name, desired);
    }
}

impl PodWrites for StatusManager {
    fn set(&self, uid: &str, namespace: &str, name: &str, desired: Desired) {
        StatusManager::set(self, uid, namespace, name, desired);
    }

    fn forget(&self, uid: &str) {
        StatusManager::forget(self, uid);
    }

    fn started(&self, uid: &str, record: StartupRecord) {
        StatusManager::started(self, uid, record);
    }

    fn resend(&self, uid: &str, namespace: &str, name: &str, desired: Desired) {
        StatusManager::resend(self, uid, namespace, name, desired);
    }
}

/// Watches the node's pods and drives the node core.
pub struct PodWorker<N, W = StatusManager> {
    node_name: String,
    host_ip: String,
    node: Arc<N>,
    statuses: W,
    admitted: HashMap<String, Admitted>,
    rejected: HashSet<String>,
    waiting: HashMap<String, Waiting>,
    starting: HashMap<String, Starting>,
    /// Pods whose admission is in flight, with what arrived for them meanwhile.
    in_flight: HashMap<String, Option<Followup>>,
    admissions: JoinSet<Attempt>,
    /// Which pod each admission task is for.
    tasks: HashMap<tokio::task::Id, String>,
    events: Option<EventRecorder>,
    /// Pods of a relist in progress (between `Init` and `InitDone`).
    listing: Option<Vec<Pod>>,
    /// Whether the first full list was handled (the plugin wait happens once).
    listed_once: bool,
    plugin_wait: Duration,
    /// The container runtime (`None`: simulated, nothing runs).
    runtime: Option<Arc<dyn PodRuntime>>,
    /// Pods whose containers are being stopped, with what follows.
    killing: HashMap<String, AfterKill>,
    kills: JoinSet<Killed>,
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl<N: NodeCore, W: PodWrites> PodWorker<N, W> {
    /// A worker for the pods bound to `node_name` whose writes go to `statuses`.
    pub fn new(node_name: &str, host_ip: &str, node: Arc<N>, statuses: W) -> Self {
        PodWorker {
            statuses,
            node_name: node_name.to_owned(),
            host_ip: host_ip.to_owned(),
            node,
            admitted: HashMap::new(),
            rejected: HashSet::new(),
            waiting: HashMap::new(),
            starting: HashMap::new(),
            in_flight: HashMap::new(),
            admissions: JoinSet::new(),
            tasks: HashMap::new(),
            events: None,
            listing: None,
            listed_once: false,
            plugin_wait: PLUGIN_REREGISTRATION_WAIT,
            runtime: None,
            killing: HashMap::new(),
            kills: JoinSet::new(),
        }
    }

    /// Runs admitted pods in `runtime` and reports their containers' real states; a deleted
    /// pod's containers are stopped (within its grace period) before its devices are released
    /// and its object deleted.
    pub fn with_runtime(mut self, runtime: Arc<dyn PodRuntime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Sends Warning events about pods that wait (without it nothing is recorded).
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = Some(events);
        self
    }

    /// UIDs of pods waiting to be admitted again.
    pub fn waiting(&self) -> Vec<String> {
        self.waiting.keys().cloned().collect()
    }

    /// Tries every waiting pod whose back-off has passed again and waits for those tries.
    pub async fn retry_due(&mut self) {
        self.start_due_retries().await;
        self.settle().await;
    }

    /// Starts the admission of every waiting pod whose back-off has passed.
    async fn start_due_retries(&mut self) {
        let now = tokio::time::Instant::now();
        let due: Vec<Pod> = self
            .waiting
            .iter()
            .filter(|(uid, w)| w.due <= now && !self.in_flight.contains_key(*uid))
            .map(|(_, w)| w.pod.clone())
            .collect();
        for pod in due {
            self.apply(pod).await;
        }
    }

    /// When the next waiting pod is due to be tried again.
    pub fn next_retry(&self) -> Option<tokio::time::Instant> {
        self.waiting
            .iter()
            .filter(|(uid, _)| !self.in_flight.contains_key(*uid))
            .map(|(_, w)| w.due)
            .min()
    }

    /// Waits for every admission in flight to finish and handles its result (and whatever
    /// arrived for the pod meanwhile).
    pub async fn settle(&mut self) {
        while let Some(joined) = self.admissions.join_next_with_id().await {
            self.admission_done(joined).await;
        }
    }

    /// Sets how long the first list waits for device plugins to register again.
    pub fn with_plugin_wait(mut self, wait: Duration) -> Self {
        self.plugin_wait = wait;
        self
    }

    /// Waits until every device plugin the node knew before its restart registered again,
    /// at most `plugin_wait`.
    async fn wait_for_plugins(&self) {
        let started = tokio::time::Instant::now();
        let mut changes = self.node.inventory_changes();
        let mut waited = false;
        loop {
            let waiting = self.node.awaiting_plugins();
            if waiting.is_empty() {
                if waited {
                    info!(node = %self.node_name, waited_ms = started.elapsed().as_millis() as u64,
                          "device plugins registered again; admitting pods");
                }
                return;
            }
            let left = self.plugin_wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                warn!(node = %self.node_name, resources = ?waiting,
                      "device plugins did not register again in time; admitting pods anyway");
                return;
            }
            if !waited {
                info!(node = %self.node_name, resources = ?waiting,
                      "waiting for device plugins to register again before admitting new pods");
                waited = true;
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(left.min(Duration::from_secs(1))) => {}
            }
        }
    }

    /// Watches the pods bound to the node through `client` until `shutdown` turns true.
    pub async fn run(
        mut self,
        client: Client,
        metrics: ClusterMetrics,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let api: Api<Pod> = Api::all(client);
        let config =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut inventory = self.node.inventory_changes();
        let mut claim_health = self.node.claim_health_changes();
        let mut runtime_changes = self.runtime.as_ref().map(|r| r.changes());
        loop {
            let retry_at = self.next_retry();
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = sleep_until_some(retry_at) => self.start_due_retries().await,
                Some(joined) = self.admissions.join_next_with_id(), if !self.admissions.is_empty() => {
                    self.admission_done(joined).await;
                }
                changed = inventory.changed() => {
                    if changed.is_err() { return; }
                    self.report_health();
                }
                Some(joined) = self.kills.join_next(), if !self.kills.is_empty() => {
                    if let Ok(killed) = joined { self.killed(killed).await; }
                }
                // Containers started, exited, restarted: report the pods again.
                changed = changed_or_pending(&mut runtime_changes) => {
                    if changed.is_err() { runtime_changes = None; }
                    self.report_health();
                }
                // DRA health (KEP-4680): the drivers' streams feed allocatedResourcesStatus.
                changed = changed_or_pending(&mut claim_health) => {
                    if changed.is_err() { claim_health = None; }
                    self.report_health();
                }
                event = events.next() => match event {
                    None => return,
                    Some(Ok(event)) => self.dispatch(event).await,
                    Some(Err(e)) => {
                        metrics.watch_error();
                        warn!(node = %self.node_name, error = %e, "pod watch failed; retrying with back-off");
                    }
                }
            }
        }
    }

    /// Handles one watch event and waits for the admissions it started ([`Self::settle`]).
    pub async fn handle(&mut self, event: Event<Pod>) {
        self.dispatch(event).await;
        self.settle().await;
    }

    /// Handles one watch event; admissions it starts run on (see the module docs) until
    /// [`Self::settle`] or the watch loop collects them.
    pub async fn dispatch(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.listing = Some(Vec::new()),
            Event::InitApply(pod) => match &mut self.listing {
                Some(list) => list.push(pod),
                None => self.apply(pod).await,
            },
            Event::InitDone => {
                let list = self.listing.take().unwrap_or_default();
                self.relisted(list).await;
            }
            Event::Apply(pod) => self.apply(pod).await,
            Event::Delete(pod) => self.deleted(pod).await,
        }
    }

    /// A full list: release what is gone, then handle every pod oldest first.
    async fn relisted(&mut self, mut pods: Vec<Pod>) {
        // Admissions in flight finish first, so a pod the list no longer has is released below.
        self.settle().await;
        let listed: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let gone: Vec<String> = self
            .node
            .admitted()
            .into_iter()
            .filter(|uid| !listed.contains(uid.as_str()))
            .collect();
        for uid in gone {
            info!(pod_uid = %uid, "admitted pod is no longer bound to this node; releasing it");
            // Gone from the API: its containers are killed at once (no grace left to honour)
            // and its devices freed before the listed pods are admitted; a kill that fails is
            // retried on its own task and the devices wait for it.
            if let Some(runtime) = self.runtime.clone()
                && let Err(e) = runtime.kill_pod(&uid, Duration::ZERO).await
            {
                warn!(pod_uid = %uid, error = %e, "stopping a gone pod's containers failed; retrying");
                self.start_kill(&uid, Duration::ZERO, AfterKill::Nothing);
                continue;
            }
            self.release(&uid, None).await;
        }
        self.rejected.retain(|uid| listed.contains(uid.as_str()));
        self.waiting.retain(|uid, _| listed.contains(uid.as_str()));
        self.starting.retain(|uid, _| listed.contains(uid.as_str()));
        pods.sort_by(|a, b| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b)).then_with(|| key(a).cmp(&key(b)))
        });
        info!(node = %self.node_name, pods = pods.len(), "pods bound to this node listed");
        if !self.listed_once {
            self.listed_once = true;
            let new_pods = pods.iter().any(|p| {
                p.metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| !self.node.is_admitted(uid))
            });
            if new_pods {
                self.wait_for_plugins().await;
            }
        }
        // One at a time, oldest first: the oldest pod gets the devices, as on the kubelet.
        for pod in pods {
            self.apply(pod).await;
            self.settle().await;
        }
    }

    async fn apply(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if let Some(next) = self.in_flight.get_mut(&uid) {
            *next = Some(Followup::Apply(pod));
            return;
        }
        if self.killing.contains_key(&uid) {
            // Its containers are being stopped; what follows is decided.
            return;
        }
        let name = key(&pod);
        if pod.metadata.deletion_timestamp.is_some() || pod_status::is_terminal(&pod) {
            self.waiting.remove(&uid);
            self.starting.remove(&uid);
        }
        if pod.metadata.deletion_timestamp.is_some() {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let short = pod.metadata.name.clone().unwrap_or_default();
            if self.runtime.is_some() {
                // The kubelet deletes the object only once the containers stopped.
                self.admitted.remove(&uid);
                let after = AfterKill::Delete {
                    namespace,
                    name: short,
                };
                self.start_kill(&uid, grace_of(&pod), after);
                return;
            }
            self.release(&uid, Some(&name)).await;
            self.statuses.set(&uid, &namespace, &short, Desired::Delete);
            return;
        }
        if pod_status::is_terminal(&pod) {
            if self.node.is_admitted(&uid) {
                info!(pod = %name, pod_uid = %uid, phase = pod_status::phase(&pod), "pod finished; releasing it");
                self.release(&uid, Some(&name)).await;
            }
            return;
        }
        if self.rejected.contains(&uid) {
            return;
        }
        if let Some(known) = self.admitted.get_mut(&uid) {
            known.pod = pod;
            self.reconcile(&uid);
            return;
        }
        if self.node.is_admitted(&uid) {
            // Admitted by an earlier run (the checkpoint): resume reporting, admit nothing.
            info!(pod = %name, pod_uid = %uid, "pod admitted before a restart; resuming");
            // Keep the start time already reported, so a restart does not look like one of the pod.
            let started = pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_else(now_rfc3339);
            // The runtime adopts its containers: nothing is started twice.
            self.run_in_runtime(&pod);
            self.admitted.insert(uid.clone(), Admitted { pod, started });
            self.report(&uid);
            return;
        }
        self.start_admission(uid, pod);
    }

    /// Hands the admission of `pod` to its own task ([`Self::admission_done`] gets the result).
    fn start_admission(&mut self, uid: String, pod: Pod) {
        let starting = self.starting.entry(uid.clone()).or_insert(Starting {
            seen: tokio::time::Instant::now(),
            attempts: 0,
        });
        starting.attempts += 1;
        self.in_flight.insert(uid.clone(), None);
        let node = Arc::clone(&self.node);
        let task = self.admissions.spawn(async move {
            let started = tokio::time::Instant::now();
            let result = node.admit(&pod).await;
            Attempt {
                pod,
                started,
                took: started.elapsed(),
                result,
            }
        });
        self.tasks.insert(task.id(), uid);
    }

    /// An admission task finished: its result, then what arrived for the pod meanwhile.
    async fn admission_done(&mut self, joined: Result<(tokio::task::Id, Attempt), JoinError>) {
        let (uid, attempt) = match joined {
            Ok((id, attempt)) => (self.tasks.remove(&id), Some(attempt)),
            Err(e) => (self.tasks.remove(&e.id()), None),
        };
        let Some(uid) = uid else {
            return;
        };
        let followup = self.in_flight.remove(&uid).flatten();
        match attempt {
            Some(attempt) => self.admission_result(uid, attempt),
            // A panic in the node: nothing was admitted; the next event or relist tries again.
            None => {
                warn!(pod_uid = %uid, "pod admission task failed; the next event for the pod tries again")
            }
        }
        match followup {
            Some(Followup::Apply(pod)) => self.apply(pod).await,
            Some(Followup::Delete(pod)) => self.deleted(pod).await,
            None => {}
        }
    }

    fn admission_result(&mut self, uid: String, attempt: Attempt) {
        let Attempt {
            pod,
            started,
            took,
            result,
        } = attempt;
        let name = key(&pod);
        match result {
            Ok(stages) => {
                self.waiting.remove(&uid);
                let starting = self.starting.remove(&uid);
                info!(pod = %name, pod_uid = %uid, admission_ms = devicelet_metrics::log_ms(took), "pod admitted");
                let record = StartupRecord {
                    pod: name,
                    seen: starting.map_or(started, |s| s.seen).into_std(),
                    attempt_started: started.into_std(),
                    admitted: (started + took).into_std(),
                    stages,
                    attempts: starting.map_or(1, |s| s.attempts),
                };
                // Before the status is queued, so its write completes the record.
                self.statuses.started(&uid, record);
                self.run_in_runtime(&pod);
                self.admitted.insert(
                    uid.clone(),
                    Admitted {
                        pod,
                        started: now_rfc3339(),
                    },
                );
                self.report(&uid);
            }
            Err(rejection) if rejection.retry => self.wait(uid, pod, &name, &rejection),
            Err(rejection) => {
                self.waiting.remove(&uid);
                self.starting.remove(&uid);
                warn!(pod = %name, pod_uid = %uid, reason = %rejection.reason,
                      message = %rejection.message, "pod rejected");
                self.rejected.insert(uid.clone());
                let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
                let short = pod.metadata.name.as_deref().unwrap_or_default();
                self.statuses.set(
                    &uid,
                    namespace,
                    short,
                    Desired::Status(pod_status::rejected(&rejection.reason, &rejection.message)),
                );
            }
        }
    }

    /// Pod `uid` cannot be admitted yet: it waits (Pending) and is tried again after a back-off.
    fn wait(&mut self, uid: String, pod: Pod, name: &str, rejection: &Rejection) {
        // Expected right after a binding: no warning and no event unless it lasts.
        let quiet = rejection.retry_soon
            && self
                .starting
                .get(&uid)
                .is_some_and(|s| s.seen.elapsed() < QUIET_NOT_LINKED);
        let entry = self.waiting.entry(uid.clone()).or_insert_with(|| Waiting {
            pod: pod.clone(),
            backoff: Backoff::new(ADMIT_RETRY_INITIAL, ADMIT_RETRY_MAX),
            soon: Backoff::new(ADMIT_RETRY_SOON, ADMIT_RETRY_SOON_MAX),
            due: tokio::time::Instant::now(),
            message: String::new(),
        });
        entry.pod = pod;
        let delay = if quiet {
            entry.soon.next_delay()
        } else {
            entry.backoff.next_delay()
        };
        entry.due = tokio::time::Instant::now() + delay;
        if quiet {
            debug!(pod = %name, pod_uid = %uid, message = %rejection.message,
                   retry_in_ms = delay.as_millis() as u64,
                   "claim not linked to the node by the Node authorizer yet; retrying");
        } else if entry.message != rejection.message {
            entry.message.clone_from(&rejection.message);
            warn!(pod = %name, pod_uid = %uid, reason = %rejection.reason,
                  message = %rejection.message, retry_in_ms = delay.as_millis() as u64,
                  "pod cannot be admitted yet; retrying");
            if let Some(events) = &self.events {
                events.warning(&entry.pod, &rejection.reason, &rejection.message);
            }
        } else {
            debug!(pod = %name, pod_uid = %uid, retry_in_ms = delay.as_millis() as u64,
                   "pod still cannot be admitted; retrying");
        }
    }

    async fn deleted(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if let Some(next) = self.in_flight.get_mut(&uid) {
            *next = Some(Followup::Delete(pod));
            return;
        }
        self.waiting.remove(&uid);
        self.starting.remove(&uid);
        if self.runtime.is_some() {
            // Deleted while being stopped, or force-deleted: stop, release, then forget.
            self.admitted.remove(&uid);
            match self.killing.get_mut(&uid) {
                Some(after) => *after = AfterKill::Forget,
                None => self.start_kill(&uid, grace_of(&pod), AfterKill::Forget),
            }
            return;
        }
        self.release(&uid, Some(&key(&pod))).await;
        self.rejected.remove(&uid);
        self.statuses.forget(&uid);
    }

    /// Hands an admitted pod to the container runtime (a no-op without one).
    fn run_in_runtime(&self, pod: &Pod) {
        let Some(runtime) = &self.runtime else {
            return;
        };
        if let Err(e) = runtime.run_pod(pod) {
            warn!(pod = %key(pod), error = %e, "pod admitted but the container runtime could not take it");
            if let Some(events) = &self.events {
                events.warning(pod, "FailedCreatePodSandBox", &e.to_string());
            }
        }
    }

    /// Stops pod `uid`'s containers on its own task ([`Self::killed`] follows).
    fn start_kill(&mut self, uid: &str, grace: Duration, after: AfterKill) {
        let Some(runtime) = self.runtime.clone() else {
            return;
        };
        if self.killing.contains_key(uid) {
            return;
        }
        self.killing.insert(uid.to_owned(), after);
        let uid = uid.to_owned();
        self.kills.spawn(async move {
            // A kill that fails (the runtime is restarting) is tried again here, so the pod
            // keeps its devices until its containers are really gone; the loop goes on.
            let mut backoff = Backoff::new(KILL_RETRY_INITIAL, KILL_RETRY_MAX);
            loop {
                match runtime.kill_pod(&uid, grace).await {
                    Ok(()) => return Killed { uid },
                    Err(e) => {
                        let delay = backoff.next_delay();
                        warn!(pod_uid = %uid, error = %e, retry_in_ms = delay.as_millis() as u64,
                              "stopping the pod's containers failed; retrying");
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        });
    }

    /// A pod's containers stopped: its devices are released, then its object deleted or
    /// forgotten.
    async fn killed(&mut self, killed: Killed) {
        let Killed { uid } = killed;
        let Some(after) = self.killing.remove(&uid) else {
            return;
        };
        self.release(&uid, None).await;
        match after {
            AfterKill::Delete { namespace, name } => {
                self.statuses.set(&uid, &namespace, &name, Desired::Delete);
            }
            AfterKill::Forget => {
                self.rejected.remove(&uid);
                self.statuses.forget(&uid);
            }
            AfterKill::Nothing => {}
        }
    }

    /// Waits for every kill in flight (tests).
    pub async fn settle_kills(&mut self) {
        while let Some(joined) = self.kills.join_next().await {
            if let Ok(killed) = joined {
                self.killed(killed).await;
            }
        }
    }

    /// Releases `uid` in the node core (a no-op for a pod the node does not hold).
    async fn release(&mut self, uid: &str, name: Option<&str>) {
        self.admitted.remove(uid);
        if !self.node.is_admitted(uid) {
            return;
        }
        match self.node.release(uid).await {
            Ok(()) => {
                info!(pod = name.unwrap_or_default(), pod_uid = %uid, "pod released");
            }
            // The node keeps what it could not release (e.g. a driver that must unprepare is
            // away) and retries on its own; the pod object may go.
            Err(e) => warn!(pod = name.unwrap_or_default(), pod_uid = %uid, error = %e,
                            "pod release failed; the node retries"),
        }
    }

    /// Sends the current status of admitted pod `uid`.
    fn report(&self, uid: &str) {
        self.send_status(uid, false);
    }

    /// Reports pod `uid` again after a watch event, re-sending the status if the API object no
    /// longer agrees with it (the node lifecycle controller marked the pod not Ready).
    fn reconcile(&self, uid: &str) {
        self.send_status(uid, true);
    }

    fn send_status(&self, uid: &str, check_api: bool) {
        let Some(known) = self.admitted.get(uid) else {
            return;
        };
        let health: BTreeMap<_, _> = self.node.resource_health(uid);
        let status = match &self.runtime {
            Some(runtime) => pod_status::from_runtime(
                &known.pod,
                &self.host_ip,
                &known.started,
                &health,
                runtime.status(uid).as_ref(),
            ),
            None => pod_status::running(&known.pod, &self.host_ip, &known.started, &health),
        };
        let namespace = known.pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = known.pod.metadata.name.as_deref().unwrap_or_default();
        if check_api && !pod_status::agrees(&known.pod, &status) {
            debug!(pod = %format!("{namespace}/{name}"), pod_uid = %uid,
                   "pod status in the API differs from what this node reports; sending it again");
            self.statuses
                .resend(uid, namespace, name, Desired::Status(status));
        } else {
            self.statuses
                .set(uid, namespace, name, Desired::Status(status));
        }
    }

    /// Re-reports every admitted pod (device health may have changed).
    fn report_health(&self) {
        for uid in self.admitted.keys() {
            self.report(uid);
        }
    }
}

/// A pod's grace period for stopping its containers: the deletion's, else the spec's (30 s).
fn grace_of(pod: &Pod) -> Duration {
    let spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .unwrap_or(spec)
        .min(spec);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// Waits for the next change of an optional watch; never completes for `None`.
async fn changed_or_pending(
    rx: &mut Option<watch::Receiver<u64>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; never completes for `None`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
