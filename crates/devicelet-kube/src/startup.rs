//! The start-up record of a pod admitted in cluster mode: where its time went, from the moment
//! the node first saw it bound to the moment its Running status was written.
//!
//! The kubelet measures the whole span (`kubelet_pod_start_duration_seconds`, "from kubelet
//! seeing a pod for the first time to the pod starting to run"; `pkg/kubelet/metrics`) but not
//! its parts; devicelet splits it into stages, exported as
//! `devicelet_pod_start_stage_duration_seconds{stage}` and written to the debug log (target
//! `devicelet_kube::startup`), one line per pod:
//!
//! | stage | what |
//! |---|---|
//! | `claim_wait` | from first seeing the pod to the start of the attempt that admitted it (earlier attempts refused because a claim was not usable yet, and the waits between them) |
//! | `claim_get` | reading the pod's ResourceClaims from the API server |
//! | `driver_prepare` | the DRA drivers' NodePrepareResources (the drivers' own time) |
//! | `plugin_allocate` | the device plugins' `Allocate` calls (the plugins' own time) |
//! | `checkpoint_write` | durable writes: `dra_manager_state`, CPU and memory state, the device journal |
//! | `admission` | the rest of the admitting attempt: devices, Topology, CPU and memory managers |
//! | `status_write` | from the pod admitted to its Running status written (queue and PATCH) |
//!
//! `devicelet_pod_start_duration_seconds` is the whole span, and
//! `devicelet_pod_start_own_duration_seconds` the span without `driver_prepare` and
//! `plugin_allocate`: devicelet's own share of a pod's start.

use std::time::{Duration, Instant};

use tracing::debug;

use crate::core::AdmitStages;
use crate::metrics::ClusterMetrics;

/// The stage names, in order (the `stage` label).
pub const STAGES: [&str; 7] = [
    "claim_wait",
    "claim_get",
    "driver_prepare",
    "plugin_allocate",
    "checkpoint_write",
    "admission",
    "status_write",
];

/// One pod's start, from first seen to admitted; completed by [`StartupRecord::finish`] when
/// the Running status is written.
#[derive(Debug, Clone, PartialEq)]
pub struct StartupRecord {
    /// `namespace/name`.
    pub pod: String,
    /// When the node first saw the pod bound to it (its watch event).
    pub seen: Instant,
    /// When the attempt that admitted it started.
    pub attempt_started: Instant,
    /// When that attempt finished.
    pub admitted: Instant,
    /// Where the admitting attempt spent its time.
    pub stages: AdmitStages,
    /// Attempts it took (1 when nothing had to wait).
    pub attempts: u32,
}

/// A finished record: each stage's duration, the whole span and devicelet's share.
#[derive(Debug, Clone, PartialEq)]
pub struct StartupTimes {
    /// `(stage, duration)` in the order of [`STAGES`].
    pub stages: [(&'static str, Duration); 7],
    /// First seen to Running written.
    pub total: Duration,
    /// `total` without the drivers' and plugins' time.
    pub own: Duration,
}

impl StartupRecord {
    /// The stage durations when the Running status was written at `written`.
    pub fn times(&self, written: Instant) -> StartupTimes {
        let s = &self.stages;
        let attempt = self
            .admitted
            .saturating_duration_since(self.attempt_started);
        let admission = attempt
            .saturating_sub(s.claim_get)
            .saturating_sub(s.driver_prepare)
            .saturating_sub(s.plugin_allocate)
            .saturating_sub(s.checkpoint_write);
        let total = written.saturating_duration_since(self.seen);
        StartupTimes {
            stages: [
                (
                    STAGES[0],
                    self.attempt_started.saturating_duration_since(self.seen),
                ),
                (STAGES[1], s.claim_get),
                (STAGES[2], s.driver_prepare),
                (STAGES[3], s.plugin_allocate),
                (STAGES[4], s.checkpoint_write),
                (STAGES[5], admission),
                (STAGES[6], written.saturating_duration_since(self.admitted)),
            ],
            total,
            own: total
                .saturating_sub(s.driver_prepare)
                .saturating_sub(s.plugin_allocate),
        }
    }

    /// The Running status of pod `uid` was written at `written`: records every stage in the
    /// histograms and logs the record at debug level.
    pub fn finish(&self, uid: &str, written: Instant, metrics: &ClusterMetrics) {
        let t = self.times(written);
        for (stage, took) in t.stages {
            metrics.pod_start_stage(stage, took);
        }
        metrics.pod_started(t.total, t.own);
        let ms = devicelet_metrics::log_ms;
        let [wait, get, driver, plugin, checkpoint, admission, status] =
            t.stages.map(|(_, d)| ms(d));
        debug!(target: "devicelet_kube::startup", pod = %self.pod, pod_uid = %uid,
               total_ms = ms(t.total), own_ms = ms(t.own), claim_wait_ms = wait,
               claim_get_ms = get, driver_prepare_ms = driver, plugin_allocate_ms = plugin,
               checkpoint_write_ms = checkpoint,
               admission_ms = admission, status_write_ms = status, attempts = self.attempts,
               "pod start-up stages");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_add_up_to_the_whole_span_and_own_leaves_out_the_driver() {
        let seen = Instant::now();
        let ms = Duration::from_millis;
        let record = StartupRecord {
            pod: "ns/p".into(),
            seen,
            attempt_started: seen + ms(30),
            admitted: seen + ms(30) + ms(20),
            stages: AdmitStages {
                claim_get: ms(3),
                driver_prepare: ms(10),
                plugin_allocate: ms(1),
                checkpoint_write: ms(2),
            },
            attempts: 3,
        };
        let t = record.times(seen + ms(57));
        let got: Vec<(&str, u128)> = t.stages.iter().map(|(s, d)| (*s, d.as_millis())).collect();
        assert_eq!(
            got,
            [
                ("claim_wait", 30),
                ("claim_get", 3),
                ("driver_prepare", 10),
                ("plugin_allocate", 1),
                ("checkpoint_write", 2),
                ("admission", 4),
                ("status_write", 7),
            ]
        );
        let sum: Duration = t.stages.iter().map(|(_, d)| *d).sum();
        assert_eq!(sum, t.total);
        assert_eq!(t.total, ms(57));
        assert_eq!(t.own, ms(46));
    }
}
