//! Pod status writes and final deletes, off the watch loop (`pkg/kubelet/status/status_manager.go`).
//!
//! The watch loop decides what each pod's status should be; this manager sends it. Per pod it
//! keeps the desired state and the last one sent: an unchanged status is never sent twice, a
//! pod is never written by two requests at once (a change that arrives meanwhile is sent
//! after), different pods are written concurrently (bounded), and a failed write is retried
//! with back-off. The final delete (grace period 0, UID precondition) goes the same way, after
//! the node released the pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::client::with_deadline;
use crate::error::ClusterError;
use crate::metrics::ClusterMetrics;
use crate::startup::StartupRecord;

/// How many pod writes may be in flight at once.
pub const MAX_CONCURRENT_WRITES: usize = 16;

/// What the API object of a pod should become.
#[derive(Debug, Clone, PartialEq)]
pub enum Desired {
    /// This strategic-merge patch of `pods/<name>/status`.
    Status(Value),
    /// Deleted with grace period 0 (the kubelet's final delete).
    Delete,
}

#[derive(Debug)]
struct Entry {
    namespace: String,
    name: String,
    desired: Desired,
    sent: Option<Desired>,
    in_flight: bool,
    backoff: Backoff,
}

/// Sends pod statuses and final deletes.
#[derive(Debug, Clone)]
pub struct StatusManager {
    metrics: ClusterMetrics,
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    /// Start-up records completed by the pod's next successful status write.
    startups: Arc<Mutex<HashMap<String, StartupRecord>>>,
    queue: mpsc::UnboundedSender<String>,
}

impl StatusManager {
    /// Starts the manager's worker on the current runtime.
    pub fn start(client: Client, metrics: ClusterMetrics) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let manager = StatusManager {
            metrics,
            entries: Arc::new(Mutex::new(HashMap::new())),
            startups: Arc::default(),
            queue,
        };
        tokio::spawn(manager.clone().work(client, rx));
        manager
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets what pod `uid` should become; sent unless it is what was last sent.
    pub fn set(&self, uid: &str, namespace: &str, name: &str, desired: Desired) {
        let mut entries = self.entries();
        let entry = entries.entry(uid.to_owned()).or_insert_with(|| Entry {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            desired: desired.clone(),
            sent: None,
            in_flight: false,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
        });
        if entry.sent.as_ref() == Some(&desired) && !entry.in_flight {
            entry.desired = desired;
            return;
        }
        entry.desired = desired;
        drop(entries);
        // The worker lives as long as any sender; a closed queue means shutdown.
        let _ = self.queue.send(uid.to_owned());
    }

    /// Sends `desired` for pod `uid` even if it was sent before: the API object no longer
    /// shows it (someone else wrote the pod's status).
    pub fn resend(&self, uid: &str, namespace: &str, name: &str, desired: Desired) {
        if let Some(entry) = self.entries().get_mut(uid) {
            // A write in flight is the answer already; its completion re-checks.
            if !entry.in_flight {
                entry.sent = None;
            }
        }
        self.set(uid, namespace, name, desired);
    }

    /// Forgets pod `uid` (its object is gone).
    pub fn forget(&self, uid: &str) {
        self.entries().remove(uid);
        self.startups().remove(uid);
    }

    /// Pod `uid` was admitted: its next successful status write completes `record`.
    pub fn started(&self, uid: &str, record: StartupRecord) {
        self.startups().insert(uid.to_owned(), record);
    }

    fn startups(&self) -> MutexGuard<'_, HashMap<String, StartupRecord>> {
        self.startups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many pods have a write pending or in flight.
    pub fn pending(&self) -> usize {
        self.entries()
            .values()
            .filter(|e| e.in_flight || e.sent.as_ref() != Some(&e.desired))
            .count()
    }

    async fn work(self, client: Client, mut rx: mpsc::UnboundedReceiver<String>) {
        let limit = Arc::new(Semaphore::new(MAX_CONCURRENT_WRITES));
        while let Some(uid) = rx.recv().await {
            let job = {
                let mut entries = self.entries();
                let Some(entry) = entries.get_mut(&uid) else {
                    continue;
                };
                if entry.in_flight || entry.sent.as_ref() == Some(&entry.desired) {
                    // In flight: the completion re-checks and sends the newer state.
                    continue;
                }
                entry.in_flight = true;
                (
                    entry.namespace.clone(),
                    entry.name.clone(),
                    entry.desired.clone(),
                )
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let manager = self.clone();
            let client = client.clone();
            tokio::spawn(async move {
                let (namespace, name, desired) = job;
                let result = write(&client, &namespace, &name, &uid, &desired).await;
                drop(permit);
                manager
                    .finish(&uid, &namespace, &name, desired, result)
                    .await;
            });
        }
    }

    async fn finish(
        &self,
        uid: &str,
        namespace: &str,
        name: &str,
        written: Desired,
        result: Result<(), ClusterError>,
    ) {
        let retry_after = {
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(uid) else {
                return;
            };
            entry.in_flight = false;
            match result {
                Ok(()) => {
                    entry.backoff.reset();
                    if written == Desired::Delete {
                        entries.remove(uid);
                        return;
                    }
                    if let Some(record) = self.startups().remove(uid) {
                        record.finish(uid, std::time::Instant::now(), &self.metrics);
                    }
                    entry.sent = Some(written);
                    if entry.sent.as_ref() == Some(&entry.desired) {
                        return;
                    }
                    Duration::ZERO
                }
                Err(e) if e.is_not_found() => {
                    // The pod is gone (or was replaced by another with the same name: the
                    // UID precondition failed): nothing more to write.
                    debug!(pod = %format!("{namespace}/{name}"), pod_uid = %uid, "pod gone; status dropped");
                    entries.remove(uid);
                    return;
                }
                Err(e) => {
                    let delay = entry.backoff.next_delay();
                    let operation = if written == Desired::Delete {
                        "pod_delete"
                    } else {
                        "pod_status"
                    };
                    self.metrics.failed(
                        operation,
                        &format!("{namespace}/{name}"),
                        &e,
                        "pod write failed; retrying",
                    );
                    delay
                }
            }
        };
        if !retry_after.is_zero() {
            tokio::time::sleep(retry_after).await;
        }
        let _ = self.queue.send(uid.to_owned());
    }
}

async fn write(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    desired: &Desired,
) -> Result<(), ClusterError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match desired {
        Desired::Status(patch) => {
            let what = format!("patch pod {namespace}/{name} status");
            if crate::protobuf::node_uses_protobuf() {
                // The answer (the whole pod) is not needed: asked for in protobuf and dropped.
                let path = format!("{}/{name}/status", api.resource_url());
                with_deadline(what, crate::protobuf::strategic_patch(client, &path, patch)).await?;
            } else {
                let params = PatchParams::default();
                let patch = Patch::Strategic(patch);
                with_deadline(what, api.patch_status(name, &params, &patch)).await?;
            }
            debug!(pod = %format!("{namespace}/{name}"), pod_uid = %uid, "pod status written");
        }
        Desired::Delete => {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let result = with_deadline(
                format!("delete pod {namespace}/{name}"),
                api.delete(name, &params),
            )
            .await;
            match result {
                Ok(_) => info!(pod = %format!("{namespace}/{name}"), pod_uid = %uid, "pod deleted"),
                // 404: already gone; 409: the UID precondition failed, a newer pod has the
                // name, so ours is gone too.
                Err(e) if e.is_not_found() || e.is_conflict() => {
                    debug!(pod = %format!("{namespace}/{name}"), pod_uid = %uid, "pod already deleted");
                }
                Err(e) => {
                    warn!(pod = %format!("{namespace}/{name}"), pod_uid = %uid, error = %e, "final delete failed");
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}
