//! The state the scheduling loop, the watches and the binding tasks share: the cache and the
//! queue, each behind a short-held mutex, and the condition variable that wakes the loop.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::cache::ClusterCache;
use crate::metrics::SchedulerMetrics;
use crate::queue::SchedulingQueue;

/// Shared scheduler state.
#[derive(Debug)]
pub struct Shared {
    cache: Mutex<ClusterCache>,
    queue: Mutex<SchedulingQueue>,
    wake: Condvar,
    pub metrics: SchedulerMetrics,
    /// The scheduler's name: its first profile's (the Lease's and the snapshot's name).
    pub name: String,
    /// Every profile's name: the pods whose `spec.schedulerName` is one of these are ours.
    pub profiles: Vec<String>,
    /// How long a claim may wait for its binding conditions (KEP-5007, S39, S54).
    pub binding_timeout: Duration,
    /// How bindings and events are encoded (`clientConnection.contentType`).
    pub content_type: crate::config::ContentType,
}

impl Shared {
    /// Empty state for scheduler `name`.
    pub fn new(name: &str, metrics: SchedulerMetrics, binding_timeout: Duration) -> Self {
        Shared {
            binding_timeout,
            cache: Mutex::new(ClusterCache::new()),
            queue: Mutex::new(SchedulingQueue::new()),
            wake: Condvar::new(),
            metrics,
            name: name.to_owned(),
            profiles: vec![name.to_owned()],
            content_type: crate::config::ContentType::default(),
        }
    }

    /// The metrics labelled with `pod`'s profile.
    pub fn metrics_of(&self, pod: &k8s_openapi::api::core::v1::Pod) -> SchedulerMetrics {
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or(&self.name);
        if name == self.name {
            self.metrics.clone()
        } else {
            self.metrics.for_profile(name)
        }
    }

    /// The scheduler's view as an AllocationScenario (`GET /debug/snapshot`): what
    /// `devicelet snapshot --redact-config` writes from the API, from this scheduler's watches,
    /// with the claims it wrote and the allocations still in flight; `devicelet allocate -f`
    /// replays it. Opaque driver configuration is redacted unless `redact_config` is false.
    pub fn snapshot(&self, redact_config: bool) -> Result<String, String> {
        let pending: Vec<k8s_openapi::api::core::v1::Pod> = self
            .queue()
            .pending_pods()
            .into_iter()
            .map(|p| (*p).clone())
            .collect();
        let state = {
            let cache = self.cache();
            let mut pods = pending;
            pods.extend(cache.scheduled_group_members());
            cache.cluster_state(pods)
        };
        let options = devicelet_kube::snapshot::ScenarioOptions {
            name: format!("{} live snapshot", self.name),
            // Served over the network: opaque driver configuration may hold credentials.
            redact_config,
        };
        let scenario = devicelet_kube::snapshot::to_scenario(&state, &options);
        devicelet_kube::snapshot::scenario_value(&scenario)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .map_err(|e| e.to_string())
    }

    /// The cache (a panic while it was held does not stop the scheduler: the data is plain).
    pub fn cache(&self) -> MutexGuard<'_, ClusterCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue.
    pub fn queue(&self) -> MutexGuard<'_, SchedulingQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the queue's sizes (`scheduler_pending_pods`, `scheduler_unschedulable_pods`);
    /// run on a timer, not on every change, as it walks the whole queue.
    pub fn record_queue_metrics(&self) {
        let queue = self.queue();
        self.metrics.pending(queue.counts());
        self.metrics
            .unschedulable_by_plugin(&queue.unschedulable_by_plugin());
    }

    /// Wakes the scheduling loop (a pod may be ready).
    pub fn notify(&self) {
        self.wake.notify_all();
    }

    /// Waits on the queue until notified or `until` (at most one second, so flushes run).
    pub fn wait<'a>(
        &self,
        guard: MutexGuard<'a, SchedulingQueue>,
        until: Option<Instant>,
    ) -> MutexGuard<'a, SchedulingQueue> {
        let now = Instant::now();
        let max = Duration::from_secs(1);
        let timeout = until
            .map(|t| t.saturating_duration_since(now).min(max))
            .unwrap_or(max);
        match self.wake.wait_timeout(guard, timeout) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        }
    }
}
