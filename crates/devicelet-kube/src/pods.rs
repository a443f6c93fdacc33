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
//! A pod the node cannot admit *yet* ([`Rejection::retry`]: its claims are not ready — the Node
//! authorizer may not know the pod's claim yet, a DRA driver is away, an API call failed) stays
//! Pending and is tried again with back-off (0.5 s doubling to 10 s, the kubelet's pod sync
//! back-off) and on every event for it, with a Warning event `FailedPrepareDynamicResources`
//! each time the reason changes; the kubelet prepares claims in pod sync, not in admission,
//! and never fails a pod for it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::core::{NodeCore, Rejection};
use crate::events::EventRecorder;
use crate::metrics::ClusterMetrics;
use crate::node::now_rfc3339;
use crate::pod_status;
use crate::status_manager::{Desired, StatusManager};

/// How long the first list after a start waits for the device plugins the node had before
/// to register again (plugins re-register within seconds of `kubelet.sock` reappearing).
pub const PLUGIN_REREGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// First and longest pause before a pod that could not be admitted yet is tried again.
pub const ADMIT_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// See [`ADMIT_RETRY_INITIAL`].
pub const ADMIT_RETRY_MAX: Duration = Duration::from_secs(10);

/// A pod waiting to be admitted again.
#[derive(Debug)]
struct Waiting {
    pod: Pod,
    backoff: Backoff,
    due: tokio::time::Instant,
    /// The last message reported in an event (a new one is sent only when it changes).
    message: String,
}

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
    events: Option<EventRecorder>,
    /// Pods of a relist in progress (between `Init` and `InitDone`).
    listing: Option<Vec<Pod>>,
    /// Whether the first full list was handled (the plugin wait happens once).
    listed_once: bool,
    plugin_wait: Duration,
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
            events: None,
            listing: None,
            listed_once: false,
            plugin_wait: PLUGIN_REREGISTRATION_WAIT,
        }
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

    /// Tries every waiting pod whose back-off has passed again.
    pub async fn retry_due(&mut self) {
        let now = tokio::time::Instant::now();
        let due: Vec<Pod> = self
            .waiting
            .values()
            .filter(|w| w.due <= now)
            .map(|w| w.pod.clone())
            .collect();
        for pod in due {
            self.apply(pod).await;
        }
    }

    fn next_retry(&self) -> Option<tokio::time::Instant> {
        self.waiting.values().map(|w| w.due).min()
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
        loop {
            let retry_at = self.next_retry();
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = sleep_until_some(retry_at) => self.retry_due().await,
                changed = inventory.changed() => {
                    if changed.is_err() { return; }
                    self.report_health();
                }
                // DRA health (KEP-4680): the drivers' streams feed allocatedResourcesStatus.
                changed = changed_or_pending(&mut claim_health) => {
                    if changed.is_err() { claim_health = None; }
                    self.report_health();
                }
                event = events.next() => match event {
                    None => return,
                    Some(Ok(event)) => self.handle(event).await,
                    Some(Err(e)) => {
                        metrics.watch_error();
                        warn!(node = %self.node_name, error = %e, "pod watch failed; retrying with back-off");
                    }
                }
            }
        }
    }

    /// Handles one watch event.
    pub async fn handle(&mut self, event: Event<Pod>) {
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
            self.release(&uid, None).await;
        }
        self.rejected.retain(|uid| listed.contains(uid.as_str()));
        self.waiting.retain(|uid, _| listed.contains(uid.as_str()));
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
        for pod in pods {
            self.apply(pod).await;
        }
    }

    async fn apply(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let name = key(&pod);
        if pod.metadata.deletion_timestamp.is_some() || pod_status::is_terminal(&pod) {
            self.waiting.remove(&uid);
        }
        if pod.metadata.deletion_timestamp.is_some() {
            self.release(&uid, Some(&name)).await;
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let short = pod.metadata.name.as_deref().unwrap_or_default();
            self.statuses.set(&uid, namespace, short, Desired::Delete);
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
            self.admitted.insert(uid.clone(), Admitted { pod, started });
            self.report(&uid);
            return;
        }
        let start = Instant::now();
        match self.node.admit(&pod).await {
            Ok(()) => {
                self.waiting.remove(&uid);
                let elapsed = start.elapsed();
                info!(pod = %name, pod_uid = %uid, admission_ms = elapsed.as_secs_f64() * 1e3, "pod admitted");
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
        let entry = self.waiting.entry(uid.clone()).or_insert_with(|| Waiting {
            pod: pod.clone(),
            backoff: Backoff::new(ADMIT_RETRY_INITIAL, ADMIT_RETRY_MAX),
            due: tokio::time::Instant::now(),
            message: String::new(),
        });
        entry.pod = pod;
        let delay = entry.backoff.next_delay();
        entry.due = tokio::time::Instant::now() + delay;
        if entry.message != rejection.message {
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
        self.waiting.remove(&uid);
        self.release(&uid, Some(&key(&pod))).await;
        self.rejected.remove(&uid);
        self.statuses.forget(&uid);
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
        let status = pod_status::running(&known.pod, &self.host_ip, &known.started, &health);
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
