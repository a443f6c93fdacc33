//! Cluster-mode metrics and failure logging: every failed API call is logged with what it was
//! about and counted in `devicelet_api_server_errors_total{operation, reason}`; a call the
//! node identity is denied says which identity devicelet should run as, once per failure, and
//! is retried with back-off rather than crash-looping.

use devicelet_metrics::Metrics;
use tracing::warn;

use crate::error::ClusterError;

/// The node's metrics, as used by the cluster front end.
#[derive(Debug, Clone)]
pub struct ClusterMetrics {
    metrics: Metrics,
    node: String,
}

impl ClusterMetrics {
    /// Records `kubelet_node_name{node}` and returns the handle.
    pub fn new(metrics: Metrics, node: &str) -> Self {
        metrics.set_node_name(node);
        ClusterMetrics {
            metrics,
            node: node.to_owned(),
        }
    }

    /// One stage of a pod's start (`devicelet_pod_start_stage_duration_seconds`).
    pub fn pod_start_stage(&self, stage: &str, took: std::time::Duration) {
        self.metrics.pod_start_stage(stage, took);
    }

    /// A pod's whole start and devicelet's share of it.
    pub fn pod_started(&self, total: std::time::Duration, own: std::time::Duration) {
        self.metrics.pod_started(total, own);
    }

    /// The watch of the node's pods failed once.
    pub fn watch_error(&self) {
        self.metrics.pod_watch_error();
    }

    /// Logs and counts a failed call; `operation` is a fixed word for the metric label,
    /// `subject` names the object (a pod, the node), `what` says what happens next.
    pub fn failed(&self, operation: &str, subject: &str, err: &ClusterError, what: &str) {
        let reason = reason(err);
        self.metrics.api_server_error(operation, reason);
        if reason == "denied" {
            warn!(node = %self.node, subject, error = %err,
                  "{what}: the API server denied the node identity (devicelet's kubeconfig must be \
                   the node identity system:node:{} in group system:nodes)", self.node);
        } else {
            warn!(node = %self.node, subject, error = %err, "{what}");
        }
    }
}

/// The `reason` label of a failed call.
pub fn reason(err: &ClusterError) -> &'static str {
    match (err, err.status()) {
        (ClusterError::Deadline { .. }, _) => "deadline",
        (_, Some(401 | 403)) => "denied",
        (_, Some(404)) => "not_found",
        (_, Some(409)) => "conflict",
        (_, Some(429)) => "throttled",
        (_, Some(code)) if code >= 500 => "server_error",
        _ => "other",
    }
}
