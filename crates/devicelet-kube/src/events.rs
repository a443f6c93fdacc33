//! Warning events on pods, as the kubelet's event recorder writes them
//! (`k8s.io/client-go/tools/record`, source component `kubelet`, host = the node).
//!
//! Used for what a user must see while a pod waits on this node (e.g.
//! `FailedPrepareDynamicResources`: a claim the node cannot prepare yet). The node identity may
//! create and patch events (the Node authorizer's node rules). An event is best effort: a failed
//! write is logged and counted, never retried, and never blocks the pod worker.
//!
//! Repeats are correlated as the kubelet's recorder does (`tools/record/events_cache.go`,
//! [`EventCorrelator`]): the same event again patches the first one's `count` and
//! `lastTimestamp` instead of creating an object; more than 10 different messages of one reason
//! for one object within 10 minutes become one `(combined from similar events)` event; and each
//! object gets at most 25 events at once, then one per 5 minutes (the spam filter).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::client::with_deadline;
use crate::error::ClusterError;
use crate::metrics::ClusterMetrics;

/// Writes Warning events about pods as component `kubelet` on this node.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    node_name: String,
    metrics: ClusterMetrics,
    correlator: Arc<Mutex<EventCorrelator>>,
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
            correlator: Arc::default(),
        }
    }

    /// Sends a Warning event `reason`/`message` about `pod` in the background.
    pub fn warning(&self, pod: &Pod, reason: &str, message: &str) {
        let now = Timestamp::now();
        let event = warning_event(pod, &self.node_name, reason, message);
        let correlated = match self.correlator.lock() {
            Ok(mut c) => c.correlate(event, now),
            Err(_) => return,
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let metrics = self.metrics.clone();
        let subject = format!(
            "{namespace}/{}",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        tokio::spawn(async move {
            let result = match correlated {
                Correlated::Skip => return,
                Correlated::Create(event) => {
                    with_deadline("create event", api.create(&PostParams::default(), &event))
                        .await
                        .map(|_| ())
                }
                Correlated::Patch { event, patch } => {
                    let name = event.metadata.name.clone().unwrap_or_default();
                    let params = PatchParams::default();
                    let patch = Patch::Strategic(&patch);
                    match with_deadline("patch event", api.patch(&name, &params, &patch)).await {
                        // Gone (the API server's event TTL): written anew, as upstream does.
                        Err(ClusterError::Api { source, .. }) if is_not_found(&source) => {
                            let mut event = event;
                            event.metadata.resource_version = None;
                            with_deadline(
                                "create event",
                                api.create(&PostParams::default(), &event),
                            )
                            .await
                            .map(|_| ())
                        }
                        other => other.map(|_| ()),
                    }
                }
            };
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

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// At most this many keys per cache (upstream's LRU size); beyond, the oldest go.
const MAX_KEYS: usize = 4096;
/// More different messages than this for one object and reason ...
const AGGREGATE_MAX_EVENTS: usize = 10;
/// ... within this many seconds become one aggregate event.
const AGGREGATE_INTERVAL_SECONDS: i64 = 600;
/// Events per object at once, then one per [`SPAM_REFILL_SECONDS`].
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL_SECONDS: f64 = 300.0;

/// What to write for an event after correlation.
#[derive(Debug, Clone, PartialEq)]
pub enum Correlated {
    /// A new event object.
    Create(Event),
    /// An event seen before: `patch` (count, lastTimestamp, message) of `event`'s name; `event`
    /// is the whole object, for creating it again if it expired.
    Patch { event: Event, patch: Value },
    /// Dropped by the spam filter.
    Skip,
}

#[derive(Debug)]
struct Similar {
    messages: HashSet<String>,
    last: Timestamp,
}

#[derive(Debug)]
struct Logged {
    name: String,
    count: i32,
    first: Option<Time>,
    last: Timestamp,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Timestamp,
}

/// The kubelet recorder's correlation of repeated events (`EventCorrelator`): aggregation,
/// deduplication and the per-object spam filter. Pure: the caller writes what it returns.
#[derive(Debug, Default)]
pub struct EventCorrelator {
    similar: HashMap<String, Similar>,
    logged: HashMap<String, Logged>,
    spam: HashMap<String, Bucket>,
}

impl EventCorrelator {
    /// What to write for `event` (named or not; a new event is named `<object>.<hex ns>`)
    /// observed at `now`.
    pub fn correlate(&mut self, mut event: Event, now: Timestamp) -> Correlated {
        // Aggregation: the 10th different message within 10 minutes and later ones become one
        // "combined" event, deduplicated under the aggregate key.
        let aggregate_key = object_key(&event, true);
        let message = event.message.clone().unwrap_or_default();
        let similar = self
            .similar
            .entry(aggregate_key.clone())
            .or_insert_with(|| Similar {
                messages: HashSet::new(),
                last: now,
            });
        if seconds_between(similar.last, now) > AGGREGATE_INTERVAL_SECONDS as f64 {
            similar.messages.clear();
        }
        similar.last = now;
        similar.messages.insert(message.clone());
        let key = if similar.messages.len() < AGGREGATE_MAX_EVENTS {
            format!("{aggregate_key}\u{0}{message}")
        } else {
            // Keep the set at its size, as upstream pops one.
            similar.messages.remove(&message);
            event.message = Some(format!("(combined from similar events): {message}"));
            event.metadata.name = None;
            aggregate_key
        };
        evict_oldest(&mut self.similar, |s| s.last);
        // Deduplication: a repeat patches the first one's count.
        let time = Time(now);
        let patch = match self.logged.get_mut(&key) {
            Some(seen) => {
                seen.count += 1;
                seen.last = now;
                event.metadata.name = Some(seen.name.clone());
                event.first_timestamp = seen.first.clone();
                event.count = Some(seen.count);
                event.last_timestamp = Some(time.clone());
                Some(json!({
                    "count": seen.count,
                    "lastTimestamp": time,
                    "message": event.message,
                }))
            }
            None => {
                let name = event.metadata.name.clone().unwrap_or_else(|| {
                    let object = event.involved_object.name.as_deref().unwrap_or_default();
                    format!("{object}.{:x}", now.as_nanosecond())
                });
                event.metadata.name = Some(name.clone());
                event.metadata.generate_name = None;
                event.count = Some(1);
                event.first_timestamp = Some(time.clone());
                event.last_timestamp = Some(time);
                self.logged.insert(
                    key,
                    Logged {
                        name,
                        count: 1,
                        first: event.first_timestamp.clone(),
                        last: now,
                    },
                );
                None
            }
        };
        evict_oldest(&mut self.logged, |l| l.last);
        // The spam filter: a token bucket per object and type.
        let bucket = self.spam.entry(spam_key(&event)).or_insert_with(|| Bucket {
            tokens: SPAM_BURST,
            last: now,
        });
        bucket.tokens = (bucket.tokens + seconds_between(bucket.last, now) / SPAM_REFILL_SECONDS)
            .min(SPAM_BURST);
        bucket.last = now;
        if bucket.tokens < 1.0 {
            return Correlated::Skip;
        }
        bucket.tokens -= 1.0;
        evict_oldest(&mut self.spam, |b| b.last);
        match patch {
            Some(patch) => Correlated::Patch { event, patch },
            None => Correlated::Create(event),
        }
    }
}

fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    (later.as_nanosecond() - earlier.as_nanosecond()).max(0) as f64 / 1e9
}

fn evict_oldest<V>(map: &mut HashMap<String, V>, last: impl Fn(&V) -> Timestamp) {
    if map.len() <= MAX_KEYS {
        return;
    }
    if let Some(oldest) = map
        .iter()
        .min_by_key(|(_, v)| last(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}

/// The source, the involved object and type; with `reason`, the reason and reporter too
/// (upstream's aggregate key; the spam key is without).
fn object_key(e: &Event, reason: bool) -> String {
    let source = e.source.clone().unwrap_or_default();
    let o = &e.involved_object;
    let mut parts = vec![
        source.component.unwrap_or_default(),
        source.host.unwrap_or_default(),
        o.kind.clone().unwrap_or_default(),
        o.namespace.clone().unwrap_or_default(),
        o.name.clone().unwrap_or_default(),
        o.uid.clone().unwrap_or_default(),
        o.api_version.clone().unwrap_or_default(),
        e.type_.clone().unwrap_or_default(),
    ];
    if reason {
        parts.push(e.reason.clone().unwrap_or_default());
        parts.push(e.reporting_component.clone().unwrap_or_default());
        parts.push(e.reporting_instance.clone().unwrap_or_default());
    }
    parts.join("\u{0}")
}

fn spam_key(e: &Event) -> String {
    object_key(e, false)
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

#[cfg(test)]
mod correlator_tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("a time")
    }

    fn warn(c: &mut EventCorrelator, pod_name: &str, message: &str, t: i64) -> Correlated {
        let event = warning_event(
            &pod(pod_name),
            "node-1",
            "FailedPrepareDynamicResources",
            message,
        );
        c.correlate(event, at(t))
    }

    #[test]
    fn a_repeat_patches_the_first_events_count() {
        let mut c = EventCorrelator::default();
        let Correlated::Create(first) = warn(&mut c, "p", "driver not registered", 0) else {
            panic!("the first is created")
        };
        let name = first.metadata.name.clone().expect("named");
        assert!(name.starts_with("p."), "{name}");
        assert_eq!(first.metadata.generate_name, None);
        for (t, count) in [(5, 2), (9, 3)] {
            match warn(&mut c, "p", "driver not registered", t) {
                Correlated::Patch { event, patch } => {
                    assert_eq!(event.metadata.name.as_deref(), Some(name.as_str()));
                    assert_eq!(patch["count"], count);
                    assert_eq!(event.first_timestamp, first.first_timestamp);
                }
                other => panic!("repeat {count}: {other:?}"),
            }
        }
        // Another pod's same warning is its own event.
        assert!(matches!(
            warn(&mut c, "q", "driver not registered", 10),
            Correlated::Create(_)
        ));
    }

    #[test]
    fn ten_different_messages_become_one_combined_event() {
        let mut c = EventCorrelator::default();
        for i in 0..9 {
            assert!(matches!(
                warn(&mut c, "p", &format!("attempt {i}"), i),
                Correlated::Create(_)
            ));
        }
        let Correlated::Create(combined) = warn(&mut c, "p", "attempt 9", 9) else {
            panic!("the tenth is a combined event")
        };
        assert_eq!(
            combined.message.as_deref(),
            Some("(combined from similar events): attempt 9")
        );
        match warn(&mut c, "p", "attempt 10", 10) {
            Correlated::Patch { event, patch } => {
                assert_eq!(event.metadata.name, combined.metadata.name);
                assert_eq!(patch["count"], 2);
                assert_eq!(
                    patch["message"],
                    "(combined from similar events): attempt 10"
                );
            }
            other => panic!("{other:?}"),
        }
        // Ten minutes later the messages count again from nothing.
        assert!(
            matches!(warn(&mut c, "p", "attempt 11", 700), Correlated::Create(e) if e.message.as_deref() == Some("attempt 11"))
        );
    }

    #[test]
    fn an_object_gets_25_events_at_once_then_one_per_five_minutes() {
        let mut c = EventCorrelator::default();
        let written = (0..40)
            .filter(|i| !matches!(warn(&mut c, "p", "same", *i / 10), Correlated::Skip))
            .count();
        assert_eq!(written, 25);
        assert_eq!(warn(&mut c, "p", "same", 100), Correlated::Skip);
        assert!(matches!(
            warn(&mut c, "p", "same", 400),
            Correlated::Patch { .. }
        ));
        assert_eq!(warn(&mut c, "p", "same", 401), Correlated::Skip);
        // Other objects are not limited by this one.
        assert!(matches!(
            warn(&mut c, "q", "same", 401),
            Correlated::Create(_)
        ));
    }
}
