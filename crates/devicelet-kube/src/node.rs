//! Node registration and status reporting (`pkg/kubelet/kubelet_node_status.go`).
//!
//! - Registration (`registerWithAPIServer`): create the Node; if it already exists, use it
//!   (a restarted devicelet keeps its Node). Retried with back-off until it succeeds.
//! - Status (`syncNodeStatus`): every [`STATUS_CHECK_PERIOD`] and on every inventory change
//!   (at most once per [`MIN_PATCH_INTERVAL`]) the status is computed; it is sent when it
//!   differs from the last one sent, and at least every [`STATUS_REPORT_PERIOD`].
//! - A Node object that disappears (404 on the patch) is registered again; one recreated by
//!   someone else is noticed by its new UID. Either way extended resources the object lists
//!   that the node does not have are reported as 0 (never deleted), and the live inventory is
//!   advertised again — a kubelet that stays up never re-registers, which leaves such a node
//!   without status until restarted; devicelet fixes that.
//!
//! The node's UID is published for the Lease's owner reference ([`crate::lease`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::client::with_deadline;
use crate::core::NodeCore;
use crate::error::ClusterError;
use crate::metrics::ClusterMetrics;
use crate::node_status::{self, MachineInfo, Readiness};
use crate::numa_resources;

/// How often the status is recomputed without an inventory change (the kubelet's
/// `nodeStatusUpdateFrequency`); grace-period expiry is noticed at this pace.
pub const STATUS_CHECK_PERIOD: Duration = Duration::from_secs(10);
/// An unchanged status is still sent this often (`nodeStatusReportFrequency`).
pub const STATUS_REPORT_PERIOD: Duration = Duration::from_secs(5 * 60);
/// Inventory changes are batched: at most one patch per this interval.
pub const MIN_PATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Registers the Node and keeps its status.
pub struct NodeReporter<N> {
    api: Api<Node>,
    name: String,
    machine: MachineInfo,
    readiness: Readiness,
    node: Arc<N>,
    metrics: ClusterMetrics,
    uid: watch::Sender<Option<String>>,
}

impl<N: NodeCore> NodeReporter<N> {
    /// A reporter for Node `name`.
    pub fn new(
        client: Client,
        name: &str,
        machine: MachineInfo,
        readiness: Readiness,
        node: Arc<N>,
        metrics: ClusterMetrics,
    ) -> Self {
        NodeReporter {
            metrics,
            api: Api::all(client),
            name: name.to_owned(),
            machine,
            readiness,
            node,
            uid: watch::channel(None).0,
        }
    }

    /// The Node's UID once registered (changes when the object is recreated).
    pub fn node_uid(&self) -> watch::Receiver<Option<String>> {
        self.uid.subscribe()
    }

    /// Creates the Node, or finds the existing one.
    async fn register(&self) -> Result<Node, ClusterError> {
        let initial = node_status::initial_node(&self.name, &self.machine);
        let created = with_deadline(
            format!("create node {}", self.name),
            self.api.create(&PostParams::default(), &initial),
        )
        .await;
        match created {
            Ok(node) => {
                info!(node = %self.name, "node registered");
                Ok(node)
            }
            Err(e) if e.is_conflict() => {
                let node =
                    with_deadline(format!("get node {}", self.name), self.api.get(&self.name))
                        .await?;
                info!(node = %self.name, "node already registered; using it");
                Ok(node)
            }
            Err(e) => Err(e),
        }
    }

    async fn patch(&self, body: &Value) -> Result<Node, ClusterError> {
        with_deadline(
            format!("patch node {} status", self.name),
            self.api.patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Strategic(body.clone()),
            ),
        )
        .await
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.node.inventory_changes();
        let mut allocations = self.node.allocation_changes();
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let mut registered: Option<Node> = None;
        let mut existing: BTreeMap<String, Quantity> = BTreeMap::new();
        let mut last_sent: Option<(Value, Instant)> = None;
        let mut last_patch = Instant::now() - MIN_PATCH_INTERVAL;
        let ready_since = now_rfc3339();
        // The Node object itself is watched so that its deletion or recreation by someone
        // else is noticed at once, not at the next status change.
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut node_events = watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .boxed();
        let mut seen_in_list = false;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if registered.is_none() {
                match self.register().await {
                    Ok(node) => {
                        self.publish_uid(&node);
                        existing = capacity_of(&node);
                        registered = Some(node);
                        last_sent = None;
                        backoff.reset();
                    }
                    Err(e) => {
                        self.metrics.failed(
                            "node_register",
                            &self.name,
                            &e,
                            "node registration failed; retrying",
                        );
                        if sleep_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let patch = node_status::status_patch(
                &self.machine,
                &self.node.capacity(),
                &existing,
                &self.readiness,
                &now_rfc3339(),
                &ready_since,
                &self.name,
            );
            let mut patch = patch;
            self.annotate(&mut patch, registered.as_ref());
            let key = node_status::without_heartbeat(&patch);
            let due = match &last_sent {
                None => true,
                Some((sent, at)) => *sent != key || at.elapsed() >= STATUS_REPORT_PERIOD,
            };
            if due {
                let wait = MIN_PATCH_INTERVAL.saturating_sub(last_patch.elapsed());
                if !wait.is_zero() && sleep_or_shutdown(wait, &mut shutdown).await {
                    return;
                }
                last_patch = Instant::now();
                match self.patch(&patch).await {
                    Ok(node) => {
                        self.publish_uid(&node);
                        existing = capacity_of(&node);
                        last_sent = Some((key, Instant::now()));
                        backoff.reset();
                        // Recompute at once: the answer may list stale extended resources
                        // (a recreated object) that the next patch reports as 0.
                        continue;
                    }
                    Err(e) if e.is_not_found() => {
                        warn!(node = %self.name, "Node object is gone; registering it again");
                        registered = None;
                        continue;
                    }
                    Err(e) => {
                        self.metrics.failed(
                            "node_status",
                            &self.name,
                            &e,
                            "node status update failed; retrying",
                        );
                        if sleep_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = shutdown.changed() => {}
                event = node_events.next() => match event {
                    Some(Ok(Event::Init)) => seen_in_list = false,
                    Some(Ok(Event::Apply(node) | Event::InitApply(node))) => {
                        seen_in_list = true;
                        if node.metadata.uid != registered.as_ref().and_then(|n| n.metadata.uid.clone()) {
                            // Recreated by someone else: report everything again.
                            last_sent = None;
                        }
                        self.publish_uid(&node);
                        existing = capacity_of(&node);
                        registered = Some(node);
                    }
                    Some(Ok(Event::Delete(_))) => {
                        warn!(node = %self.name, "Node object was deleted; registering it again");
                        registered = None;
                    }
                    Some(Ok(Event::InitDone)) if !seen_in_list && registered.is_some() => {
                        warn!(node = %self.name, "Node object is gone; registering it again");
                        registered = None;
                    }
                    Some(Ok(Event::InitDone)) | None => {}
                    Some(Err(e)) => {
                        warn!(node = %self.name, error = %e, "watch of the Node object failed; retrying with back-off");
                    }
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The node core is gone: nothing more to report.
                        return;
                    }
                }
                changed = async {
                    match allocations.as_mut() {
                        Some(rx) => rx.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if changed.is_err() {
                        allocations = None;
                    }
                }
                _ = tokio::time::sleep(STATUS_CHECK_PERIOD) => {}
            }
        }
    }

    /// Adds the node's NUMA figures to the patch ([`crate::numa_resources`]); where the node has
    /// none, removes an annotation a previous run left.
    fn annotate(&self, patch: &mut Value, registered: Option<&Node>) {
        let value = match self.node.numa_resources() {
            Some(r) => Value::String(r.to_annotation()),
            None if registered
                .and_then(|n| n.metadata.annotations.as_ref())
                .is_some_and(|a| a.contains_key(numa_resources::ANNOTATION)) =>
            {
                Value::Null
            }
            None => return,
        };
        patch["metadata"] =
            serde_json::json!({ "annotations": { numa_resources::ANNOTATION: value } });
    }

    fn publish_uid(&self, node: &Node) {
        let uid = node.metadata.uid.clone();
        self.uid.send_if_modified(|current| {
            if *current == uid {
                return false;
            }
            if current.is_some() {
                warn!(node = %self.name, old = ?current, new = ?uid,
                      "Node object was recreated; advertising the live inventory again");
            }
            *current = uid;
            true
        });
    }
}

/// `status.capacity` of a Node.
fn capacity_of(node: &Node) -> BTreeMap<String, Quantity> {
    node.status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default()
}

/// The current time in RFC 3339 with seconds, as `metav1.Time` serializes.
pub fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(now)
        .to_string()
}

/// Sleeps `delay`; true when `shutdown` turned true meanwhile.
pub(crate) async fn sleep_or_shutdown(
    delay: Duration,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}
