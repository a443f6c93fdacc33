//! What the scheduler tells users through the API (spec S133-S138): the `PodScheduled=False`
//! condition and the `FailedScheduling` event of a failed attempt, the `Scheduled` event of a
//! bound pod. Best effort: a failed write is logged, never retried, never blocks scheduling.
//! A repeated event becomes a series ([`crate::event_series`]), as kube-scheduler's recorder
//! makes it: a pod retried every back-off is one event object with a count.

use devicelet_kube::events::pod_event;
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::Semaphore;
use tracing::debug;

use crate::config::ContentType;
use crate::event_series::{EventSeriesCache, REFRESH_EVERY, SeriesKey, SeriesWrite};
use crate::framework::truncate_note;
use devicelet_kube::protobuf;

/// At most this many condition and event writes at once. A backlog of unschedulable pods
/// (900 left by a deleted namespace when a new leader starts) otherwise opened one HTTP/1.1
/// connection per write at once (as it still would with `DEVICELET_KUBE_API_HTTP1`): the TLS handshakes and an API server answering `Handler
/// timeout` starved the process (its Lease went unrenewed and another replica took over).
const REPORT_SLOTS: usize = 16;

/// Writes conditions and events as the scheduler `name`.
#[derive(Clone)]
pub struct Reporter {
    client: Client,
    name: String,
    /// How events are encoded (`clientConnection.contentType`).
    content_type: ContentType,
    slots: Arc<Semaphore>,
    series: Arc<Mutex<EventSeriesCache>>,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How often the series are looked at: a series quiet for
/// [`crate::event_series::FINISH_AFTER`] is written within a minute after.
const SERIES_TICK: std::time::Duration = std::time::Duration::from_secs(60);

/// Refreshes and finishes the series of `series` until the reporter is gone.
async fn maintain_series(series: Weak<Mutex<EventSeriesCache>>, client: Client) {
    let mut since_refresh = std::time::Duration::ZERO;
    loop {
        tokio::time::sleep(SERIES_TICK).await;
        since_refresh += SERIES_TICK;
        let Some(series) = series.upgrade() else {
            return;
        };
        let writes = {
            let Ok(mut cache) = series.lock() else {
                return;
            };
            let mut writes = cache.finish(k8s_openapi::jiff::Timestamp::now());
            if since_refresh >= REFRESH_EVERY {
                since_refresh = std::time::Duration::ZERO;
                writes.extend(cache.refresh());
            }
            writes
        };
        drop(series);
        for write in writes {
            if let Err(e) = write_series(&client, write).await {
                debug!(error = %e, "event series not written");
            }
        }
    }
}

/// Writes an event's `series` (count and last observed time) with a merge patch. An event gone
/// meanwhile (expired by the API server's event TTL) is not created again: its next occurrence
/// after [`crate::event_series::FINISH_AFTER`] starts a new one.
async fn write_series(client: &Client, write: SeriesWrite) -> Result<(), kube::Error> {
    let SeriesWrite::Series {
        namespace,
        name,
        count,
        last_observed,
    } = write
    else {
        return Ok(());
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let patch = json!({"series": {"count": count, "lastObservedTime": MicroTime(last_observed)}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// The condition reason of a failed attempt (S133).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// Rejected by a plugin.
    Unschedulable,
    /// An internal or API error.
    SchedulerError,
}

impl FailureReason {
    fn as_str(self) -> &'static str {
        match self {
            FailureReason::Unschedulable => "Unschedulable",
            FailureReason::SchedulerError => "SchedulerError",
        }
    }
}

/// Whether `pod` already carries this exact `PodScheduled=False` condition (S133: not written
/// again).
pub fn has_condition(pod: &Pod, reason: FailureReason, message: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some(reason.as_str())
                && c.message.as_deref() == Some(message)
        })
}

impl Reporter {
    /// A reporter for scheduler `name`.
    pub fn new(client: Client, name: &str, content_type: ContentType) -> Self {
        let reporter = Reporter {
            client,
            content_type,
            name: name.to_owned(),
            slots: Arc::new(Semaphore::new(REPORT_SLOTS)),
            series: Arc::new(Mutex::new(EventSeriesCache::default())),
        };
        // Series are written again every 30 min and finished after 6 quiet minutes; the task
        // ends with the last clone of this reporter.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(maintain_series(
                Arc::downgrade(&reporter.series),
                reporter.client.clone(),
            ));
        }
        reporter
    }

    /// A failed attempt: the condition (unless already there) and a `FailedScheduling` event.
    pub async fn failed(&self, pod: &Pod, reason: FailureReason, message: &str) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if !has_condition(pod, reason, message) {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let patch = json!({
                "status": {
                    "conditions": [{
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason.as_str(),
                        "message": message,
                        "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now()),
                        "lastProbeTime": null,
                        "observedGeneration": pod.metadata.generation,
                    }]
                }
            });
            let _slot = self.slots.acquire().await;
            let r = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await;
            if let Err(e) = r {
                debug!(pod = %format!("{ns}/{name}"), error = %e, "pod condition not written");
            }
        }
        self.event(pod, "Warning", "FailedScheduling", "Scheduling", message)
            .await;
    }

    /// A bound pod: `Successfully assigned ns/pod to node` (S136).
    pub async fn scheduled(&self, pod: &Pod, node: &str) {
        let note = format!(
            "Successfully assigned {}/{} to {node}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        self.event(pod, "Normal", "Scheduled", "Binding", &note)
            .await;
    }

    /// A victim of preemption (W88): `Preempted by pod <uid> on node <node>`, recorded by the
    /// preemptor's profile, with the preemptor as related object.
    pub async fn preempted(&self, victim: &Pod, preemptor: &Pod, node: &str) {
        let related = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: preemptor.metadata.name.clone(),
            namespace: preemptor.metadata.namespace.clone(),
            uid: preemptor.metadata.uid.clone(),
            ..Default::default()
        };
        self.preempted_by(victim, preemptor, "pod", node, related)
            .await;
    }

    /// W99: the `Preempted` event on a victim of a pod group's preemption (the whole cluster is
    /// its domain: node `cluster`), related to the PodGroup.
    pub async fn preempted_by_group(
        &self,
        victim: &Pod,
        member: &Pod,
        group: &k8s_openapi::api::scheduling::v1alpha2::PodGroup,
    ) {
        let related = ObjectReference {
            api_version: Some("scheduling.k8s.io/v1alpha2".to_owned()),
            kind: Some("PodGroup".to_owned()),
            name: group.metadata.name.clone(),
            namespace: group.metadata.namespace.clone(),
            uid: group.metadata.uid.clone(),
            ..Default::default()
        };
        self.preempted_by(victim, member, "podgroup", "cluster", related)
            .await;
    }

    /// `Preempted by <kind> <uid of related> on node <node>`, recorded by `preemptor`'s profile.
    async fn preempted_by(
        &self,
        victim: &Pod,
        preemptor: &Pod,
        kind: &str,
        node: &str,
        related: ObjectReference,
    ) {
        let note = format!(
            "Preempted by {kind} {} on node {node}",
            related.uid.as_deref().unwrap_or("")
        );
        self.write_event(
            victim,
            self.component_of(preemptor),
            "Normal",
            "Preempted",
            "Preempting",
            &note,
            Some(related),
        )
        .await;
    }

    /// Creates `event` in the configured encoding.
    async fn create_event(&self, api: &Api<Event>, event: &Event) -> Result<(), kube::Error> {
        match self.content_type {
            ContentType::Protobuf => {
                let body = protobuf::envelope("v1", "Event", &protobuf::event(event));
                protobuf::create(&self.client, api.resource_url(), body).await
            }
            ContentType::Json => api.create(&PostParams::default(), event).await.map(|_| ()),
        }
    }

    /// The scheduler name `pod` names (each profile records as itself, as upstream's one
    /// recorder per profile), else this scheduler's.
    fn component_of<'a>(&'a self, pod: &'a Pod) -> &'a str {
        pod.spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.name)
    }

    /// Any event about `pod`.
    pub async fn event(&self, pod: &Pod, type_: &str, reason: &str, action: &str, note: &str) {
        self.write_event(
            pod,
            self.component_of(pod),
            type_,
            reason,
            action,
            note,
            None,
        )
        .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_event(
        &self,
        pod: &Pod,
        component: &str,
        type_: &str,
        reason: &str,
        action: &str,
        note: &str,
        related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let mut event = pod_event(
            pod,
            type_,
            reason,
            &truncate_note(note),
            component,
            component,
            None,
        );
        // What the scheduler's events.k8s.io recorder adds: the action and a micro-time.
        let now = k8s_openapi::jiff::Timestamp::now();
        event.action = Some(action.to_owned());
        event.event_time = Some(MicroTime(now));
        let key = SeriesKey {
            type_: type_.to_owned(),
            reason: reason.to_owned(),
            action: action.to_owned(),
            component: component.to_owned(),
            regarding: (
                ns.clone(),
                pod_name.clone(),
                pod.metadata.uid.clone().unwrap_or_default(),
            ),
            related: related.as_ref().map(|r| r.uid.clone().unwrap_or_default()),
        };
        event.related = related;
        // Upstream's name for a new event: `<regarding>.<unix nanoseconds in hex>`.
        let name = || format!("{pod_name}.{:x}", now.as_nanosecond());
        let write = match self.series.lock() {
            Ok(mut series) => series.observe(key, &ns, name, now),
            Err(_) => Some(SeriesWrite::Create { name: name() }),
        };
        let _slot = self.slots.acquire().await;
        let written = match write {
            None => return,
            Some(SeriesWrite::Create { name }) => {
                event.metadata.generate_name = None;
                event.metadata.name = Some(name);
                self.create_event(&api, &event).await
            }
            Some(series) => write_series(&self.client, series).await,
        };
        if let Err(e) = written {
            debug!(pod = %format!("{ns}/{pod_name}"), error = %e, reason, "event not written");
        }
    }
}
