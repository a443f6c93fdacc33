//! [`StoreOptions`]: when the [`DeviceStore`](super::DeviceStore) folds its journal into the
//! kubelet file (spec devicemanager.md §3; the kubelet has no such knob, it rewrites the file on
//! every allocation).

use std::time::Duration;

/// Tuning knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Compact after this many journal records.
    pub compact_after_records: u64,
    /// Compact after this many journal bytes.
    pub compact_after_bytes: u64,
    /// Compact when the oldest uncompacted commit is this old (the kubelet-file lag bound).
    pub max_lag: Duration,
    /// Run compaction on a background thread (otherwise only
    /// [`DeviceStore::compact`](super::DeviceStore::compact) and
    /// [`DeviceStore::close`](super::DeviceStore::close) compact).
    pub background_compaction: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            compact_after_records: 4096,
            compact_after_bytes: 16 * 1024 * 1024,
            max_lag: Duration::from_secs(1),
            background_compaction: true,
        }
    }
}
