//! ResourceSlices of DRA drivers that are gone are wiped, after a delay
//! (`pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`, spec cluster.md §4).
//!
//! A DRA driver publishes its node's ResourceSlices itself; when its last plugin instance
//! disconnects, the kubelet deletes them (one `DeleteCollection` with the field selector
//! `spec.nodeName=NODE,spec.driver=DRIVER`) after a wiping delay of 30 s, cancelled if the
//! driver connects again meanwhile (a driver upgrade or restart keeps its slices). At start,
//! every driver that has slices on this node and is not connected gets the same delay, not an
//! immediate wipe: a driver that registers again after devicelet restarted keeps its slices
//! (a reported upstream failure: a kubelet restart deleted slices that no one published again).
//! Failed calls are retried with back-off.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::client::with_deadline;
use crate::core::NodeCore;
use crate::error::ClusterError;
use crate::metrics::ClusterMetrics;
use crate::node::sleep_or_shutdown;

/// The kubelet's wiping delay.
pub const WIPE_DELAY: Duration = Duration::from_secs(30);
/// How often the connected drivers are compared with the last look.
const CHECK_PERIOD: Duration = Duration::from_secs(1);

/// The ResourceSlice calls the janitor makes (the API server, or a fake in tests).
pub trait SliceApi: Send + Sync + 'static {
    /// Drivers with at least one ResourceSlice on this node.
    fn drivers_with_slices(
        &self,
    ) -> impl Future<Output = Result<BTreeSet<String>, ClusterError>> + Send;
    /// Deletes every ResourceSlice of `driver` on this node.
    fn wipe(&self, driver: &str) -> impl Future<Output = Result<(), ClusterError>> + Send;
}

/// [`SliceApi`] on the API server, with the node identity: the Node authorizer allows
/// list and deletecollection of ResourceSlices selected by `spec.nodeName=<own node>`.
#[derive(Clone)]
pub struct KubeSlices {
    api: Api<ResourceSlice>,
    node: String,
}

impl KubeSlices {
    /// The ResourceSlices of node `node`.
    pub fn new(client: Client, node: &str) -> Self {
        KubeSlices {
            api: Api::all(client),
            node: node.to_owned(),
        }
    }
}

impl KubeSlices {
    /// Every ResourceSlice of this node (selected by `spec.nodeName`).
    pub async fn list(&self) -> Result<Vec<ResourceSlice>, ClusterError> {
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let list = with_deadline(
            format!("list ResourceSlices of node {}", self.node),
            self.api.list(&params),
        )
        .await?;
        Ok(list.items)
    }
}

/// `devicelet get slices` in cluster mode: what the drivers published for this node.
#[cfg(feature = "node")]
impl devicelet_dra::SliceSource for KubeSlices {
    fn node_slices(
        &self,
    ) -> futures::future::BoxFuture<'static, Result<Vec<ResourceSlice>, String>> {
        let this = self.clone();
        Box::pin(async move { this.list().await.map_err(|e| e.to_string()) })
    }
}

impl SliceApi for KubeSlices {
    async fn drivers_with_slices(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .map(|s| s.spec.driver)
            .collect())
    }

    async fn wipe(&self, driver: &str) -> Result<(), ClusterError> {
        let params = ListParams::default()
            .fields(&format!("spec.nodeName={},spec.driver={driver}", self.node));
        with_deadline(
            format!(
                "delete ResourceSlices of driver {driver} on node {}",
                self.node
            ),
            self.api
                .delete_collection(&DeleteParams::default(), &params),
        )
        .await
        .map(|_| ())
    }
}

/// Deletes the slices of drivers that stay disconnected for [`WIPE_DELAY`].
pub struct SliceJanitor<N, A> {
    node: Arc<N>,
    api: A,
    node_name: String,
    metrics: Option<ClusterMetrics>,
    delay: Duration,
}

impl<N: NodeCore, A: SliceApi> SliceJanitor<N, A> {
    /// A janitor for the slices of node `node_name`.
    pub fn new(node: Arc<N>, api: A, node_name: &str, metrics: Option<ClusterMetrics>) -> Self {
        SliceJanitor {
            node,
            api,
            node_name: node_name.to_owned(),
            metrics,
            delay: WIPE_DELAY,
        }
    }

    fn failed(&self, operation: &str, subject: &str, err: &ClusterError, what: &str) {
        match &self.metrics {
            Some(m) => m.failed(operation, subject, err, what),
            None => warn!(node = %self.node_name, subject, error = %err, "{what}"),
        }
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // driver -> when its slices are wiped (and the back-off of failed wipes).
        let mut pending: BTreeMap<String, (Instant, Backoff)> = BTreeMap::new();
        let mut connected: BTreeSet<String> = self.node.dra_drivers().into_iter().collect();
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            match self.api.drivers_with_slices().await {
                Ok(drivers) => {
                    let at = Instant::now() + self.delay;
                    for driver in drivers.into_iter().filter(|d| !connected.contains(d)) {
                        info!(node = %self.node_name, driver = %driver, delay_s = self.delay.as_secs(),
                              "DRA driver with ResourceSlices on this node is not connected; wiping them after the delay unless it registers");
                        pending.insert(driver, (at, wipe_backoff()));
                    }
                    break;
                }
                Err(e) => {
                    self.failed(
                        "slice_list",
                        &self.node_name,
                        &e,
                        "listing the node's ResourceSlices failed; retrying",
                    );
                    if sleep_or_shutdown(backoff.next_delay(), &mut shutdown).await {
                        return;
                    }
                }
            }
        }
        loop {
            let now: BTreeSet<String> = self.node.dra_drivers().into_iter().collect();
            for gone in connected.difference(&now) {
                info!(node = %self.node_name, driver = %gone, delay_s = self.delay.as_secs(),
                      "DRA driver disconnected; wiping its ResourceSlices after the delay unless it comes back");
                pending.insert(gone.clone(), (Instant::now() + self.delay, wipe_backoff()));
            }
            for back in &now {
                if pending.remove(back).is_some() {
                    info!(node = %self.node_name, driver = %back, "DRA driver connected; its ResourceSlices are kept");
                }
            }
            connected = now;
            let due: Vec<String> = pending
                .iter()
                .filter(|(_, (at, _))| *at <= Instant::now())
                .map(|(d, _)| d.clone())
                .collect();
            for driver in due {
                match self.api.wipe(&driver).await {
                    Ok(()) => {
                        info!(node = %self.node_name, driver = %driver, "ResourceSlices of the disconnected DRA driver deleted");
                        pending.remove(&driver);
                    }
                    Err(e) => {
                        self.failed("slice_wipe", &driver, &e, "deleting the ResourceSlices of a disconnected DRA driver failed; retrying");
                        if let Some((at, b)) = pending.get_mut(&driver) {
                            *at = Instant::now() + b.next_delay();
                        }
                    }
                }
            }
            if sleep_or_shutdown(CHECK_PERIOD, &mut shutdown).await {
                return;
            }
        }
    }
}

fn wipe_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
}
