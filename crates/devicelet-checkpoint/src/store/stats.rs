//! [`StoreStats`]: the [`DeviceStore`](super::DeviceStore)'s counters for metrics, including how
//! far the kubelet file lags behind the journal.

use std::time::Duration;

use serde::Serialize;

/// Counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Journal size in bytes.
    pub journal_bytes: u64,
    /// Batch records not yet folded into the kubelet file.
    pub uncompacted_records: u64,
    /// Commits acknowledged since open.
    pub commits: u64,
    /// fsyncs of the journal for commits (fewer than `commits` when group commit merged some).
    pub journal_syncs: u64,
    /// Compactions completed since open.
    pub compactions: u64,
    /// The last compaction error, if the last attempt failed.
    pub last_compaction_error: Option<String>,
    /// Age of the oldest commit not yet in the kubelet file (how stale that file is), if any.
    #[serde(with = "opt_duration_ms")]
    pub kubelet_file_lag: Option<Duration>,
}

mod opt_duration_ms {
    use serde::Serializer;
    pub fn serialize<S: Serializer>(
        d: &Option<std::time::Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64() * 1000.0),
            None => s.serialize_none(),
        }
    }
}
