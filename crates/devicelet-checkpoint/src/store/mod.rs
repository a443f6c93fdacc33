//! [`DeviceStore`]: durable device allocations whose per-admission cost does not depend on how
//! many pods are already admitted.
//!
//! The kubelet rewrites `kubelet_internal_checkpoint` whole after every allocation
//! (`pkg/kubelet/cm/devicemanager/manager.go` `writeCheckpoint`), so admission slows down as the
//! file grows. devicelet instead appends each commit to a journal in `R/devicelet/` (format in
//! [`crate::journal`]) and fsyncs it before `commit` returns; that costs the same with 0 or
//! 10 000 containers admitted. Concurrent commits share one fsync (group commit).
//!
//! **Compaction.** A background thread folds the journal into the kubelet-format file (atomic
//! replace, see [`crate::atomic_write`]) and starts a fresh journal. It runs when
//! `compact_after_records` records or `compact_after_bytes` bytes have accumulated, when the oldest
//! uncompacted commit is `max_lag` old, and on clean shutdown ([`DeviceStore::close`]).
//!
//! **Lag bound.** Tools that read `kubelet_internal_checkpoint` (e.g. to learn which pod holds
//! which device) see every commit acknowledged more than `max_lag` + 2 × (one compaction) ago —
//! the second compaction covers a commit that lands while one is running. Defaults: `max_lag` =
//! 1 s; a compaction of 10 000 containers costs ~40 ms of CPU plus five fsyncs. After a clean
//! shutdown the file is exact. If compaction keeps failing (e.g. a full disk) the lag grows; it is
//! exposed as [`StoreStats::kubelet_file_lag`] and [`StoreStats::last_compaction_error`], and
//! commits keep working as long as the journal can grow. The journal, not the kubelet file, is
//! the authority while devicelet runs.
//!
//! **Compaction crash safety.** Before writing the kubelet file, a `CompactionStarted` record
//! carrying the new file's checksum is appended and fsync'd. Recovery accepts a kubelet file whose
//! checksum equals the journal's base or any marker, and replays only the records after the last
//! matching one; a crash at any step therefore recovers exactly the acknowledged state.
//!
//! **Restart snapshot.** Each compaction ends by writing `R/devicelet/device-allocations.snapshot`
//! ([`crate::snapshot`]): the state of the new kubelet file and of the new journal's first bytes,
//! binary, with XXH3 hashes of both. [`DeviceStore::open`] uses it instead of parsing the kubelet
//! file's JSON (and its spew + FNV checksum) and those journal records when both files still hash
//! as recorded, and replays only the journal records after them; otherwise it is ignored
//! ([`RecoveredState::snapshot`] says why) and the files are read as without one.
//!
//! **Corruption policy.** A torn final journal record (crash mid-append, never acknowledged) is
//! dropped and the journal truncated to its valid prefix. Any other damage — a kubelet file that
//! fails to decode or verify, an empty file, a directory in its place, a damaged journal record, a
//! journal that does not belong to the kubelet file — is *never* repaired silently: the bad file
//! is moved aside to `<name>.corrupt-<UTC timestamp>` (never overwritten or deleted), a quarantine
//! marker is written next to the journal, and [`DeviceStore::open`] fails with an error for which
//! [`StoreError::ownership_unknown`] is true until an operator runs [`recover`]. The caller must
//! then refuse to hand out devices (allocatable 0) and say so in logs and metrics. A journal with
//! an unknown (newer) version is refused but left in place: it is not damaged.
//!
//! **Files.** `device_store.rs` holds [`DeviceStore`] and its shared state; `group_commit.rs`
//! the commit path; `compaction.rs` the background folding into the kubelet file; `recovery.rs`
//! opening, replay and quarantine; `operator_recovery.rs` [`recover`]; `writer.rs` the journal
//! appends; `paths.rs`, `options.rs`, `error.rs` and `stats.rs` the public types.

mod compaction;
mod device_store;
mod error;
mod group_commit;
mod operator_recovery;
mod options;
mod paths;
mod recovery;
mod stats;
mod writer;

/// Re-exported from [`crate::aside`], where it names the files moved aside.
pub use crate::aside::utc_timestamp;
pub use device_store::DeviceStore;
pub use error::{Corruption, StoreError};
pub use operator_recovery::{
    RebuildSummary, RecoverAction, RecoverReport, rebuild_from_journal, recover,
};
pub use options::StoreOptions;
pub use paths::{JOURNAL_FILE, QUARANTINE_FILE, StorePaths};
pub use recovery::{KubeletFileOrigin, RecoveredState, SnapshotUse};
pub use stats::StoreStats;
