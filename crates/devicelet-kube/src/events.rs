//! Warning events on pods, as the kubelet's event recorder writes them
//! (`k8s.io/client-go/tools/record`, source component `kubelet`, host = the node).
//!
//! Used for what a user must see while a pod waits on this node (e.g.
//! `FailedPrepareDynamicResources`: a claim the node cannot prepare yet). The node identity may
//! create events (the Node authorizer's node rules). An event is best effort: a failed write is
//! logged and counted, never retried, and never blocks the pod worker.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::client::with_deadline;
use crate::metrics::ClusterMetrics;

/// Writes Warning events about pods as component `kubelet` on this node.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    node_name: String,
    metrics: ClusterMetrics,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder for node `node_name`.
    pub fn new(client: Client, node_name: &str, metrics: ClusterMetrics) -> Self {
        EventRecorder {
            client,
            node_name: node_name.to_owned(),
            metrics,
        }
    }

    /// Sends a Warning event `reason`/`message` about `pod` in the background.
    pub fn warning(&self, pod: &Pod, reason: &str, message: &str) {
        let event = warning_event(pod, &self.node_name, reason, message);
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let metrics = self.metrics.clone();
        let subject = format!(
            "{namespace}/{}",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        tokio::spawn(async move {
            let result =
                with_deadline("create event", api.create(&PostParams::default(), &event)).await;
            if let Err(e) = result {
                metrics.failed("create_event", &subject, &e, "writing a pod event failed");
            }
        });
    }
}

/// The Event object for a warning about `pod` (name `<pod>.<unique suffix>`, as client-go's
/// recorder names them).
pub fn warning_event(pod: &Pod, node_name: &str, reason: &str, message: &str) -> Event {
    pod_event(
        pod,
        "Warning",
        reason,
        message,
        "kubelet",
        node_name,
        Some(node_name),
    )
}

/// A core/v1 Event about `pod` written by `component` (instance `instance`, on `host` when it
/// runs on a node), named `<pod>.<unique suffix>`, first and last seen now.
pub fn pod_event(
    pod: &Pod,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
    instance: &str,
    host: Option<&str>,
) -> Event {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{pod_name}.")),
            namespace: pod.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(type_.to_owned()),
        count: Some(1),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: host.map(str::to_owned),
        }),
        reporting_component: Some(component.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        ..Event::default()
    }
}
