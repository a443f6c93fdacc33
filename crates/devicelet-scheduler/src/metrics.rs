//! The scheduler's Prometheus metrics under kube-scheduler's names
//! (`pkg/scheduler/metrics/metrics.go`, spec S143), served with `/healthz` on
//! `--metrics-address`. Rendered as OpenMetrics text (counters end in `_total`, as
//! kube-scheduler's `scheduler_schedule_attempts_total`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::framework::Plugin;
use crate::queue::QueueCounts;

/// `Content-Type` of [`SchedulerMetrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
    profile: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IncomingLabels {
    queue: String,
    event: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptsLabels {
    attempts: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExtensionLabels {
    extension_point: String,
    status: String,
    profile: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    plugin: String,
    profile: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn attempt_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}
fn sli_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 20))
}
fn extension_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 12))
}

struct Inner {
    registry: Registry,
    attempts: Family<ResultLabels, Counter>,
    attempt_duration: HistogramFamily<ResultLabels>,
    algorithm_duration: Histogram,
    pending: Family<QueueLabels, Gauge>,
    incoming: Family<IncomingLabels, Counter>,
    sli: HistogramFamily<AttemptsLabels>,
    pod_attempts: Histogram,
    extension: HistogramFamily<ExtensionLabels>,
    podgroup_attempts: Family<ResultLabels, Counter>,
    podgroup_attempt_duration: HistogramFamily<ResultLabels>,
    podgroup_algorithm_duration: Histogram,
    unschedulable: Family<PluginLabels, Gauge>,
    preemption_attempts: Counter,
    preemption_victims: Histogram,
    leader: Gauge,
    healthy: AtomicBool,
    /// The caches have synced and the process is not shutting down (`/readyz`).
    ready: AtomicBool,
}

/// One cloneable handle; clones share every series.
#[derive(Clone)]
pub struct SchedulerMetrics {
    inner: Arc<Inner>,
    profile: String,
}

impl std::fmt::Debug for SchedulerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerMetrics")
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

/// The result label of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    Scheduled,
    Unschedulable,
    Error,
    /// A pod group whose victims are being evicted (W37).
    WaitingOnPreemption,
}

impl AttemptResult {
    fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Scheduled => "scheduled",
            AttemptResult::Unschedulable => "unschedulable",
            AttemptResult::Error => "error",
            AttemptResult::WaitingOnPreemption => "waiting_on_preemption",
        }
    }
}

impl SchedulerMetrics {
    /// The metrics of the profile (scheduler name) `profile`.
    pub fn new(profile: &str) -> Self {
        let mut registry = Registry::default();
        let attempts = Family::<ResultLabels, Counter>::default();
        registry.register(
            "scheduler_schedule_attempts",
            "[STABLE] Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
            attempts.clone(),
        );
        let attempt_duration: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(attempt_buckets);
        registry.register(
            "scheduler_scheduling_attempt_duration_seconds",
            "[STABLE] Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            attempt_duration.clone(),
        );
        let algorithm_duration = attempt_buckets();
        registry.register(
            "scheduler_scheduling_algorithm_duration_seconds",
            "[ALPHA] Scheduling algorithm latency in seconds",
            algorithm_duration.clone(),
        );
        let pending = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "scheduler_pending_pods",
            "[STABLE] Number of pending pods, by the queue type. 'active' means number of pods in activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means number of pods in unschedulablePods that the scheduler attempted to schedule and failed; 'gated' is the number of unschedulable pods that the scheduler never attempted to schedule because they are gated.",
            pending.clone(),
        );
        let incoming = Family::<IncomingLabels, Counter>::default();
        registry.register(
            "scheduler_queue_incoming_pods",
            "[STABLE] Number of pods added to scheduling queues by event and queue type.",
            incoming.clone(),
        );
        let sli: HistogramFamily<AttemptsLabels> = Family::new_with_constructor(sli_buckets);
        registry.register(
            "scheduler_pod_scheduling_sli_duration_seconds",
            "[BETA] E2e latency for a pod being scheduled, from the time the pod enters the scheduling queue and might involve multiple scheduling attempts.",
            sli.clone(),
        );
        let pod_attempts = Histogram::new(exponential_buckets(1.0, 2.0, 5));
        registry.register(
            "scheduler_pod_scheduling_attempts",
            "[STABLE] Number of attempts to successfully schedule a pod.",
            pod_attempts.clone(),
        );
        let extension: HistogramFamily<ExtensionLabels> =
            Family::new_with_constructor(extension_buckets);
        registry.register(
            "scheduler_framework_extension_point_duration_seconds",
            "[STABLE] Latency for running all plugins of a specific extension point.",
            extension.clone(),
        );
        let unschedulable = Family::<PluginLabels, Gauge>::default();
        registry.register(
            "scheduler_unschedulable_pods",
            "[ALPHA] The number of unschedulable pods broken down by plugin name. A pod will increment the gauge for all plugins that caused it to not schedule and so this metric have meaning only when broken down by plugin.",
            unschedulable.clone(),
        );
        let podgroup_attempts = Family::<ResultLabels, Counter>::default();
        registry.register(
            "scheduler_podgroup_schedule_attempts",
            "[ALPHA] Number of attempts to schedule pod groups, by the result. 'unschedulable' means a pod group could not be scheduled, while 'error' means an internal scheduler problem.",
            podgroup_attempts.clone(),
        );
        let podgroup_attempt_duration: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(attempt_buckets);
        registry.register(
            "scheduler_podgroup_scheduling_attempt_duration_seconds",
            "[ALPHA] Pod group scheduling attempt latency in seconds",
            podgroup_attempt_duration.clone(),
        );
        let podgroup_algorithm_duration = attempt_buckets();
        registry.register(
            "scheduler_podgroup_scheduling_algorithm_duration_seconds",
            "[ALPHA] Pod group scheduling algorithm latency in seconds",
            podgroup_algorithm_duration.clone(),
        );
        let preemption_attempts = Counter::default();
        registry.register(
            "scheduler_preemption_attempts",
            "[STABLE] Total preemption attempts in the cluster till now",
            preemption_attempts.clone(),
        );
        let preemption_victims = Histogram::new(exponential_buckets(1.0, 2.0, 7));
        registry.register(
            "scheduler_preemption_victims",
            "[STABLE] Number of selected preemption victims",
            preemption_victims.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "devicelet_scheduler_is_leader",
            "1 while this replica holds the leader Lease and schedules, 0 otherwise.",
            leader.clone(),
        );
        SchedulerMetrics {
            inner: Arc::new(Inner {
                registry,
                attempts,
                attempt_duration,
                algorithm_duration,
                pending,
                incoming,
                sli,
                pod_attempts,
                extension,
                podgroup_attempts,
                podgroup_attempt_duration,
                podgroup_algorithm_duration,
                unschedulable,
                preemption_attempts,
                preemption_victims,
                leader,
                healthy: AtomicBool::new(true),
                ready: AtomicBool::new(false),
            }),
            profile: profile.to_owned(),
        }
    }

    /// The same metrics, labelled with profile `profile`.
    pub fn for_profile(&self, profile: &str) -> Self {
        SchedulerMetrics {
            inner: self.inner.clone(),
            profile: profile.to_owned(),
        }
    }

    /// DefaultPreemption ran for a pod (W77).
    pub fn preemption_attempt(&self) {
        self.inner.preemption_attempts.inc();
    }

    /// Preemption chose `victims` pods to evict (W90).
    pub fn preemption_victims(&self, victims: usize) {
        self.inner.preemption_victims.observe(victims as f64);
    }

    /// One scheduling attempt ended.
    pub fn attempt(&self, result: AttemptResult, duration: Duration) {
        let labels = ResultLabels {
            result: result.as_str().to_owned(),
            profile: self.profile.clone(),
        };
        self.inner.attempts.get_or_create(&labels).inc();
        self.inner
            .attempt_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// One pod-group cycle ended (W37): `result` is `scheduled`, `unschedulable` or `error`.
    pub fn podgroup_attempt(&self, result: AttemptResult, duration: Duration, algorithm: Duration) {
        let labels = ResultLabels {
            result: result.as_str().to_owned(),
            profile: self.profile.clone(),
        };
        self.inner.podgroup_attempts.get_or_create(&labels).inc();
        self.inner
            .podgroup_attempt_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        self.inner
            .podgroup_algorithm_duration
            .observe(algorithm.as_secs_f64());
    }

    /// The decision part of an attempt.
    pub fn algorithm(&self, duration: Duration) {
        self.inner
            .algorithm_duration
            .observe(duration.as_secs_f64());
    }

    /// A pod was bound after `attempts` attempts, `since_first` after it was first queued.
    pub fn bound(&self, attempts: u32, since_first: Duration) {
        let label = if attempts >= 15 {
            "15+".to_owned()
        } else {
            attempts.to_string()
        };
        self.inner
            .sli
            .get_or_create(&AttemptsLabels { attempts: label })
            .observe(since_first.as_secs_f64());
        self.inner.pod_attempts.observe(f64::from(attempts));
    }

    /// A pod entered `queue` because of `event`.
    pub fn incoming(&self, queue: &str, event: &str) {
        self.inner
            .incoming
            .get_or_create(&IncomingLabels {
                queue: queue.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    /// One extension point's run (`PreBind`, `Bind`, `PostFilter`).
    pub fn extension_point(&self, point: &str, ok: bool, duration: Duration) {
        self.inner
            .extension
            .get_or_create(&ExtensionLabels {
                extension_point: point.to_owned(),
                status: if ok { "Success" } else { "Error" }.to_owned(),
                profile: self.profile.clone(),
            })
            .observe(duration.as_secs_f64());
    }

    /// The queue sizes now.
    pub fn pending(&self, counts: QueueCounts) {
        for (queue, n) in [
            ("active", counts.active),
            ("backoff", counts.backoff),
            ("unschedulable", counts.unschedulable),
            ("gated", counts.gated),
        ] {
            self.inner
                .pending
                .get_or_create(&QueueLabels {
                    queue: queue.to_owned(),
                })
                .set(n as i64);
        }
    }

    /// Unschedulable pods per rejecting plugin (every plugin, so a count that went back to
    /// zero shows zero).
    pub fn unschedulable_by_plugin(&self, counts: &BTreeMap<Plugin, usize>) {
        for plugin in Plugin::ALL {
            self.inner
                .unschedulable
                .get_or_create(&PluginLabels {
                    plugin: plugin.name().to_owned(),
                    profile: self.profile.clone(),
                })
                .set(counts.get(&plugin).copied().unwrap_or(0) as i64);
        }
    }

    /// Leadership changed.
    pub fn set_leader(&self, leader: bool) {
        self.inner.leader.set(i64::from(leader));
    }

    /// `/healthz` turns unhealthy (e.g. leadership lost before exiting).
    pub fn set_healthy(&self, healthy: bool) {
        self.inner.healthy.store(healthy, Ordering::Relaxed);
    }

    /// `/readyz` answers ok (caches synced) or not (before the sync, and once shutting down),
    /// as kube-scheduler's `sched-handler-sync` and `shutdown` checks.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/readyz` answers ok.
    pub fn ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// Whether `/healthz` answers ok.
    pub fn healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    /// Every metric, OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.inner.registry).is_err() {
            out.push_str("# EOF\n");
        }
        out
    }
}

/// Produces the `/debug/snapshot` document (argument: redact opaque driver configuration).
pub type SnapshotFn = std::sync::Arc<dyn Fn(bool) -> Result<String, String> + Send + Sync>;

/// Serves [`router`] in plain HTTP on `listener` (loopback only, see `--metrics-address`) until
/// the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: SchedulerMetrics,
    snapshot: SnapshotFn,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, snapshot)).await
}

/// `/metrics`, `/healthz` and `/livez` (alive), `/readyz` (caches synced, not shutting down)
/// and `/debug/snapshot` (the scheduler's view as an AllocationScenario).
pub fn router(metrics: SchedulerMetrics, snapshot: SnapshotFn) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let m1 = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m1.clone();
                async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.encode()) }
            }),
        )
        // Redacted, and unredacted on a path of its own so RBAC can grant one without the
        // other (`nonResourceURLs`); the metrics-reader role grants the redacted one only.
        .route(
            "/debug/snapshot",
            get(snapshot_handler(snapshot.clone(), true)),
        )
        .route(
            "/debug/snapshot/unredacted",
            get(snapshot_handler(snapshot, false)),
        )
        .route(
            "/readyz",
            get({
                let m = metrics.clone();
                move || {
                    let ready = m.ready();
                    async move {
                        if ready {
                            (StatusCode::OK, "ok")
                        } else {
                            (
                                StatusCode::SERVICE_UNAVAILABLE,
                                "not ready: caches not synced, or shutting down",
                            )
                        }
                    }
                }
            }),
        );
    // kube-scheduler serves both: `/healthz` (older probes) and `/livez`.
    let alive = get(move || {
        let m = metrics.clone();
        async move {
            if m.healthy() {
                (StatusCode::OK, "ok")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "unhealthy")
            }
        }
    });
    app.route("/healthz", alive.clone()).route("/livez", alive)
}

/// `GET /debug/snapshot[/unredacted]`.
fn snapshot_handler(
    snapshot: SnapshotFn,
    redact: bool,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = axum::response::Response> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    move || {
        let snapshot = snapshot.clone();
        Box::pin(async move {
            // Cloning the cache's view is quick but not free: off the async workers.
            match tokio::task::spawn_blocking(move || snapshot(redact)).await {
                Ok(Ok(json)) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    json,
                )
                    .into_response(),
                Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s143_names_as_kube_scheduler() {
        let m = SchedulerMetrics::new("devicelet-scheduler");
        m.attempt(AttemptResult::Scheduled, Duration::from_millis(3));
        m.pending(QueueCounts {
            active: 1,
            ..QueueCounts::default()
        });
        m.unschedulable_by_plugin(&BTreeMap::from([(Plugin::DynamicResources, 2)]));
        let text = m.encode();
        assert!(text.contains(
            "scheduler_unschedulable_pods{plugin=\"DynamicResources\",profile=\"devicelet-scheduler\"} 2"
        ));
        assert!(text.contains(
            "scheduler_unschedulable_pods{plugin=\"NodeName\",profile=\"devicelet-scheduler\"} 0"
        ));
        assert!(text.contains(
            "scheduler_schedule_attempts_total{result=\"scheduled\",profile=\"devicelet-scheduler\"} 1"
        ));
        assert!(text.contains("scheduler_pending_pods{queue=\"active\"} 1"));
        assert!(text.contains("scheduler_scheduling_attempt_duration_seconds_bucket"));
    }
}
