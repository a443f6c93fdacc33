//! The node's Lease in `kube-node-lease` (`pkg/kubelet/nodelease`,
//! `k8s.io/component-helpers/apimachinery/lease/controller.go`): named after the node,
//! `holderIdentity` the node name, `leaseDurationSeconds` 40, renewed every 10 s (a quarter of
//! the duration), owned by the Node object so it goes with it.
//!
//! As upstream: get or create the Lease, then update `renewTime`; a conflict or a missing
//! Lease is read or created again, and failures back off. Unlike krustlet, a Lease that is
//! missing (first start, Node recreated and the old Lease garbage-collected) is created, not
//! reported as a raw NotFound.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::backoff::Backoff;
use crate::client::with_deadline;
use crate::error::ClusterError;
use crate::metrics::ClusterMetrics;
use crate::node::sleep_or_shutdown;

/// The namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// `leaseDurationSeconds`.
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// Renewal period: a quarter of the duration, as upstream.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps the node's Lease.
pub struct LeaseKeeper {
    api: Api<Lease>,
    name: String,
    node_uid: watch::Receiver<Option<String>>,
    metrics: ClusterMetrics,
}

impl LeaseKeeper {
    /// A keeper for node `name`; `node_uid` is the Node's UID once registered.
    pub fn new(
        client: Client,
        name: &str,
        node_uid: watch::Receiver<Option<String>>,
        metrics: ClusterMetrics,
    ) -> Self {
        LeaseKeeper {
            metrics,
            api: Api::namespaced(client, LEASE_NAMESPACE),
            name: name.to_owned(),
            node_uid,
        }
    }

    /// The Lease object for this node, renewed now, owned by Node `uid`.
    fn desired(&self, base: Option<Lease>, uid: &str) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(LEASE_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        lease.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: self.name.clone(),
            uid: uid.to_owned(),
            ..OwnerReference::default()
        }]);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.name.clone());
        spec.lease_duration_seconds = Some(LEASE_DURATION_SECONDS);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        lease
    }

    /// One renewal: update the known Lease, or get/create it.
    async fn renew(&self, known: Option<Lease>, uid: &str) -> Result<Lease, ClusterError> {
        if let Some(lease) = known {
            let updated = self.desired(Some(lease), uid);
            let result = with_deadline(
                format!("update lease {}/{}", LEASE_NAMESPACE, self.name),
                self.api
                    .replace(&self.name, &PostParams::default(), &updated),
            )
            .await;
            match result {
                Ok(lease) => return Ok(lease),
                // Someone else wrote it, or it is gone: read or create it below.
                Err(e) if e.is_conflict() || e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let current = with_deadline(
            format!("get lease {}/{}", LEASE_NAMESPACE, self.name),
            self.api.get_opt(&self.name),
        )
        .await?;
        match current {
            Some(lease) => {
                let updated = self.desired(Some(lease), uid);
                with_deadline(
                    format!("update lease {}/{}", LEASE_NAMESPACE, self.name),
                    self.api
                        .replace(&self.name, &PostParams::default(), &updated),
                )
                .await
            }
            None => {
                let lease = with_deadline(
                    format!("create lease {}/{}", LEASE_NAMESPACE, self.name),
                    self.api
                        .create(&PostParams::default(), &self.desired(None, uid)),
                )
                .await?;
                info!(node = %self.name, "node lease created");
                Ok(lease)
            }
        }
    }

    /// Runs until `shutdown` turns true. Waits for the Node to be registered first.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(Duration::from_millis(200), RENEW_INTERVAL);
        let mut known: Option<Lease> = None;
        loop {
            let uid = self.node_uid.borrow().clone();
            let Some(uid) = uid else {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    changed = self.node_uid.changed() => if changed.is_err() { return },
                }
                continue;
            };
            let delay = match self.renew(known.take(), &uid).await {
                Ok(lease) => {
                    debug!(node = %self.name, "lease renewed");
                    known = Some(lease);
                    backoff.reset();
                    RENEW_INTERVAL
                }
                Err(e) => {
                    self.metrics
                        .failed("lease", &self.name, &e, "lease renewal failed; retrying");
                    backoff.next_delay()
                }
            };
            if sleep_or_shutdown(delay, &mut shutdown).await {
                return;
            }
        }
    }
}
