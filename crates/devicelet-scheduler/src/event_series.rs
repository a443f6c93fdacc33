//! Event series: a repeated event is one object with a count, not one object per occurrence
//! (`k8s.io/client-go/tools/events/event_broadcaster.go`, the recorder kube-scheduler uses).
//!
//! Events are isomorphic when they agree on type, reason, action, reporting component and
//! regarding and related objects; the note does not count. The first is created. The second,
//! within [`FINISH_AFTER`], turns the first into a series (`series.count` 2, patched). Later
//! ones only count here: a series is written again every [`REFRESH_EVERY`] and once more when
//! it has been quiet for [`FINISH_AFTER`], then forgotten, as upstream. A pod retried every
//! back-off so costs the API server two event writes per half hour instead of one per attempt.
//!
//! Pure bookkeeping: the caller writes what [`EventSeriesCache::observe`], `refresh` and
//! `finish` return.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// A series quiet this long is written a last time and forgotten; a single event this old is
/// forgotten (upstream's `finishTime`).
pub const FINISH_AFTER: Duration = Duration::from_secs(6 * 60);
/// How often every open series is written again (upstream's `refreshTime`).
pub const REFRESH_EVERY: Duration = Duration::from_secs(30 * 60);

/// What makes two events the same event (upstream's `eventKey`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    pub type_: String,
    pub reason: String,
    pub action: String,
    pub component: String,
    /// The regarding object's namespace/name/uid.
    pub regarding: (String, String, String),
    /// The related object's uid, if any.
    pub related: Option<String>,
}

/// A write the caller makes.
#[derive(Debug, Clone, PartialEq)]
pub enum SeriesWrite {
    /// Create the event named `name` (a first occurrence).
    Create { name: String },
    /// Patch `series` of event `namespace/name` (creating it, series included, if it is gone).
    Series {
        namespace: String,
        name: String,
        count: u32,
        last_observed: Timestamp,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    namespace: String,
    name: String,
    first: Timestamp,
    /// 1 for a single event, ≥ 2 for a series.
    count: u32,
    last_observed: Timestamp,
}

impl Entry {
    fn write(&self) -> SeriesWrite {
        SeriesWrite::Series {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            count: self.count,
            last_observed: self.last_observed,
        }
    }
}

/// The events recorded recently, by [`SeriesKey`].
#[derive(Debug, Default)]
pub struct EventSeriesCache {
    entries: HashMap<SeriesKey, Entry>,
}

impl EventSeriesCache {
    /// An event `key` about an object in `namespace` happened at `now`; `name` is the name a new
    /// event would get. Returns the write to make, if any.
    pub fn observe(
        &mut self,
        key: SeriesKey,
        namespace: &str,
        name: impl FnOnce() -> String,
        now: Timestamp,
    ) -> Option<SeriesWrite> {
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.count += 1;
            entry.last_observed = now;
            // The second occurrence opens the series; the next ones wait for a refresh.
            return (entry.count == 2).then(|| entry.write());
        }
        let name = name();
        self.entries.insert(
            key,
            Entry {
                namespace: namespace.to_owned(),
                name: name.clone(),
                first: now,
                count: 1,
                last_observed: now,
            },
        );
        Some(SeriesWrite::Create { name })
    }

    /// Every open series, to be written again (every [`REFRESH_EVERY`]).
    pub fn refresh(&self) -> Vec<SeriesWrite> {
        self.entries
            .values()
            .filter(|e| e.count >= 2)
            .map(Entry::write)
            .collect()
    }

    /// Forgets what ended by `now`: series quiet for [`FINISH_AFTER`] (returned, for their last
    /// write) and single events older than that.
    pub fn finish(&mut self, now: Timestamp) -> Vec<SeriesWrite> {
        let mut last = Vec::new();
        self.entries.retain(|_, e| {
            let since = if e.count >= 2 {
                e.last_observed
            } else {
                e.first
            };
            let ended = now
                .duration_since(since)
                .try_into()
                .is_ok_and(|d: Duration| d >= FINISH_AFTER);
            if ended && e.count >= 2 {
                last.push(e.write());
            }
            !ended
        });
        last
    }

    /// How many events are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str, pod: &str) -> SeriesKey {
        SeriesKey {
            type_: "Warning".into(),
            reason: reason.into(),
            action: "Scheduling".into(),
            component: "devicelet-scheduler".into(),
            regarding: ("ns".into(), pod.into(), format!("uid-{pod}")),
            related: None,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("a time")
    }

    #[test]
    fn a_repeated_event_is_created_then_patched_once_then_only_counted() {
        let mut cache = EventSeriesCache::default();
        let first = cache.observe(key("FailedScheduling", "p"), "ns", || "p.1".into(), at(0));
        assert_eq!(first, Some(SeriesWrite::Create { name: "p.1".into() }));
        let second = cache.observe(key("FailedScheduling", "p"), "ns", || "p.2".into(), at(10));
        assert_eq!(
            second,
            Some(SeriesWrite::Series {
                namespace: "ns".into(),
                name: "p.1".into(),
                count: 2,
                last_observed: at(10),
            })
        );
        for i in 0..50 {
            let w = cache.observe(
                key("FailedScheduling", "p"),
                "ns",
                || "p.x".into(),
                at(20 + i),
            );
            assert_eq!(w, None, "occurrence {} is only counted", i + 3);
        }
        assert_eq!(
            cache.refresh(),
            vec![SeriesWrite::Series {
                namespace: "ns".into(),
                name: "p.1".into(),
                count: 52,
                last_observed: at(69),
            }]
        );
    }

    #[test]
    fn other_objects_reasons_and_related_objects_are_other_events() {
        let mut cache = EventSeriesCache::default();
        assert!(matches!(
            cache.observe(key("FailedScheduling", "a"), "ns", || "a.1".into(), at(0)),
            Some(SeriesWrite::Create { .. })
        ));
        assert!(matches!(
            cache.observe(key("FailedScheduling", "b"), "ns", || "b.1".into(), at(0)),
            Some(SeriesWrite::Create { .. })
        ));
        assert!(matches!(
            cache.observe(key("Scheduled", "a"), "ns", || "a.2".into(), at(0)),
            Some(SeriesWrite::Create { .. })
        ));
        let mut related = key("Preempted", "a");
        related.related = Some("preemptor-1".into());
        let mut other = related.clone();
        other.related = Some("preemptor-2".into());
        assert!(
            cache
                .observe(related, "ns", || "a.3".into(), at(0))
                .is_some()
        );
        assert!(matches!(
            cache.observe(other, "ns", || "a.4".into(), at(0)),
            Some(SeriesWrite::Create { .. })
        ));
        assert_eq!(cache.len(), 5);
    }

    #[test]
    fn finish_writes_a_quiet_series_last_and_forgets_old_single_events() {
        let mut cache = EventSeriesCache::default();
        cache.observe(key("FailedScheduling", "a"), "ns", || "a.1".into(), at(0));
        cache.observe(key("FailedScheduling", "a"), "ns", || "a.1".into(), at(60));
        cache.observe(key("FailedScheduling", "a"), "ns", || "a.1".into(), at(120));
        cache.observe(key("Scheduled", "b"), "ns", || "b.1".into(), at(100));
        // 6 min after the single event, 5 min 40 s after the series' last occurrence.
        assert_eq!(cache.finish(at(460)), vec![]);
        assert_eq!(cache.len(), 1, "the single event is forgotten");
        let last = cache.finish(at(480));
        assert_eq!(
            last,
            vec![SeriesWrite::Series {
                namespace: "ns".into(),
                name: "a.1".into(),
                count: 3,
                last_observed: at(120),
            }]
        );
        assert!(cache.is_empty());
        // Forgotten: the same event starts a new object.
        assert!(matches!(
            cache.observe(key("FailedScheduling", "a"), "ns", || "a.9".into(), at(500)),
            Some(SeriesWrite::Create { .. })
        ));
    }
}
