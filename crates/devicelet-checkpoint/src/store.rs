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
//! **Corruption policy.** A torn final journal record (crash mid-append, never acknowledged) is
//! dropped and the journal truncated to its valid prefix. Any other damage — a kubelet file that
//! fails to decode or verify, an empty file, a directory in its place, a damaged journal record, a
//! journal that does not belong to the kubelet file — is *never* repaired silently: the bad file
//! is moved aside to `<name>.corrupt-<UTC timestamp>` (never overwritten or deleted), a quarantine
//! marker is written next to the journal, and [`DeviceStore::open`] fails with an error for which
//! [`StoreError::ownership_unknown`] is true until an operator runs [`recover`]. The caller must
//! then refuse to hand out devices (allocatable 0) and say so in logs and metrics. A journal with
//! an unknown (newer) version is refused but left in place: it is not damaged.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::aside::{self, move_aside};
use crate::atomic_write::{self, AtomicWriteError, sync_dir, write_file_atomic};
use crate::device::{self, DEVICE_CHECKPOINT_FILE, DeviceCheckpointFormat};
use crate::error::DecodeError;
use crate::fault::{self, Op};
use crate::journal::{self, JournalError, JournalHeader, JournalRecord, TornTail, encode_record};
use crate::state::{Change, DeviceState, InvalidChange};

/// Re-exported from [`crate::aside`], where it names the files moved aside.
pub use crate::aside::utc_timestamp;

/// File name of the journal in devicelet's directory (`R/devicelet/`).
pub const JOURNAL_FILE: &str = "device-allocations.journal";
/// File name of the quarantine marker in devicelet's directory.
pub const QUARANTINE_FILE: &str = "device-allocations.quarantine";

/// Where the store keeps its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePaths {
    /// `R/device-plugins/kubelet_internal_checkpoint`.
    pub kubelet_file: PathBuf,
    /// `R/devicelet/device-allocations.journal`.
    pub journal: PathBuf,
    /// `R/devicelet/device-allocations.quarantine`.
    pub quarantine_marker: PathBuf,
}

impl StorePaths {
    /// Paths for a kubelet checkpoint directory (`R/device-plugins`) and a journal directory
    /// (`R/devicelet`).
    pub fn new(kubelet_dir: &Path, journal_dir: &Path) -> Self {
        Self {
            kubelet_file: kubelet_dir.join(DEVICE_CHECKPOINT_FILE),
            journal: journal_dir.join(JOURNAL_FILE),
            quarantine_marker: journal_dir.join(QUARANTINE_FILE),
        }
    }

    fn journal_dir(&self) -> &Path {
        self.journal.parent().unwrap_or(Path::new("."))
    }

    fn kubelet_dir(&self) -> &Path {
        self.kubelet_file.parent().unwrap_or(Path::new("."))
    }
}

/// Tuning knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Compact after this many journal records.
    pub compact_after_records: u64,
    /// Compact after this many journal bytes.
    pub compact_after_bytes: u64,
    /// Compact when the oldest uncompacted commit is this old (the kubelet-file lag bound).
    pub max_lag: Duration,
    /// Run compaction on a background thread (otherwise only [`DeviceStore::compact`] and
    /// [`DeviceStore::close`] compact).
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

/// What was damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// The kubelet checkpoint failed to decode or verify.
    #[error("kubelet checkpoint: {0}")]
    Checkpoint(DecodeError),
    /// The journal is damaged.
    #[error("journal: {0}")]
    Journal(JournalError),
    /// Something other than a regular file is in the file's place.
    #[error("not a regular file (found a {0})")]
    NotARegularFile(&'static str),
    /// The journal was written on top of a different kubelet checkpoint (the file was replaced
    /// behind devicelet's back, e.g. by a kubelet).
    #[error(
        "journal applies to a kubelet checkpoint with checksum {journal_base}, but the file on disk has {file_checksum}"
    )]
    BaseMismatch {
        /// The journal's base (or markers) do not include this value.
        journal_base: String,
        /// Checksum of the file on disk (`none` if missing).
        file_checksum: String,
    },
}

/// Errors from the store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// An I/O error (the operation did not take effect).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A file is damaged; it has been moved aside and the store quarantined.
    #[error(
        "device state is corrupt, device ownership is unknown: {file}: {cause}{}",
        moved_to.as_ref().map(|p| format!(" (moved aside to {})", p.display())).unwrap_or_default()
    )]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// Where it was moved.
        moved_to: Option<PathBuf>,
        /// What is wrong.
        cause: Corruption,
    },
    /// An earlier open found damage; an operator must run recovery.
    #[error(
        "device state is quarantined ({marker}): {detail}; run `devicelet state recover` after checking the files"
    )]
    Quarantined {
        /// The marker file.
        marker: PathBuf,
        /// The marker's content.
        detail: String,
    },
    /// The journal was written by a newer devicelet.
    #[error(
        "{file}: journal format version {found} is not supported by this build (reads {supported}); device ownership is unknown"
    )]
    UnknownJournalVersion {
        /// The journal.
        file: PathBuf,
        /// Its version.
        found: u32,
        /// Ours.
        supported: u32,
    },
    /// A change is malformed.
    #[error("invalid change: {0}")]
    InvalidChange(InvalidChange),
    /// A failed write could not be rolled back; the store refuses further commits.
    #[error("device store is unusable after a failed write that could not be rolled back: {0}")]
    Poisoned(String),
}

impl StoreError {
    fn io(context: impl Into<String>, source: io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// True when the caller must refuse to hand out devices: who owns which device is not known.
    pub fn ownership_unknown(&self) -> bool {
        matches!(
            self,
            StoreError::Corrupt { .. }
                | StoreError::Quarantined { .. }
                | StoreError::UnknownJournalVersion { .. }
        )
    }

    /// True when the underlying error is a full disk (`ENOSPC`/`EDQUOT`).
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => {
                source.kind() == io::ErrorKind::StorageFull
                    || source.kind() == io::ErrorKind::QuotaExceeded
            }
            _ => false,
        }
    }
}

fn from_atomic(context: &str, e: AtomicWriteError) -> StoreError {
    let text = e.to_string();
    match e {
        AtomicWriteError::InvalidPath(_) => {
            StoreError::io(context, io::Error::new(io::ErrorKind::InvalidInput, text))
        }
        AtomicWriteError::WriteTemp { source, .. }
        | AtomicWriteError::Rename { source, .. }
        | AtomicWriteError::SyncDirectory { source, .. } => {
            StoreError::io(format!("{context}: {text}"), source)
        }
    }
}

/// Where the recovered kubelet-file part came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum KubeletFileOrigin {
    /// No kubelet file (fresh node, or the kubelet never wrote one).
    Missing,
    /// Loaded and verified.
    Loaded {
        /// Layout found.
        format: DeviceCheckpointFormat,
        /// Its checksum.
        checksum: u32,
        /// Entries in it.
        entries: usize,
    },
}

/// What recovery did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecoveredState {
    /// The recovered state (also available via [`DeviceStore::snapshot`]). Shared with the
    /// store: drop it before the first commit to spare the store a copy.
    pub state: Arc<DeviceState>,
    /// The kubelet file.
    pub kubelet_file: KubeletFileOrigin,
    /// True when no journal existed and a fresh one was created (fresh node or import).
    pub journal_created: bool,
    /// Journal records applied on top of the kubelet file.
    pub records_replayed: u64,
    /// An incomplete final record that was discarded (it was never acknowledged).
    pub torn_tail: Option<TornTail>,
    /// Time spent in [`DeviceStore::open`].
    #[serde(with = "duration_ms")]
    pub open_duration: Duration,
}

mod duration_ms {
    use serde::Serializer;
    pub fn serialize<S: Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
    }
}

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

/// The marker written when files were quarantined.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuarantineMarker {
    file: PathBuf,
    moved_to: Option<PathBuf>,
    cause: String,
    time: String,
}

struct JournalWriter {
    file: File,
    len: u64,
    next_seq: u64,
    uncompacted_records: u64,
    uncompacted_bytes: u64,
    oldest_uncompacted: Option<Instant>,
    poisoned: Option<String>,
}

#[derive(Default)]
struct CommitQueue {
    next_ticket: u64,
    pending: Vec<(u64, Vec<Change>)>,
    leader_active: bool,
    results: HashMap<u64, Result<(), StoreError>>,
}

#[derive(Default)]
struct CompactorControl {
    shutdown: bool,
}

struct Shared {
    paths: StorePaths,
    options: StoreOptions,
    /// Shared with [`RecoveredState::state`] after open, so a restart does not copy the whole
    /// state; the first commit copies it only if the caller still holds the recovered one.
    state: RwLock<Arc<DeviceState>>,
    writer: Mutex<JournalWriter>,
    queue: Mutex<CommitQueue>,
    queue_cv: Condvar,
    compact_lock: Mutex<()>,
    control: Mutex<CompactorControl>,
    control_cv: Condvar,
    stats: Mutex<StoreStats>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of our locks leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Durable device-allocation store (see the module docs).
pub struct DeviceStore {
    shared: Arc<Shared>,
    compactor: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for DeviceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStore")
            .field("paths", &self.shared.paths)
            .finish()
    }
}

impl DeviceStore {
    /// Opens (recovers) the store with default options: loads the kubelet file from
    /// `kubelet_dir`, replays the journal in `journal_dir`.
    pub fn open(
        kubelet_dir: &Path,
        journal_dir: &Path,
    ) -> Result<(DeviceStore, RecoveredState), StoreError> {
        Self::open_with(
            StorePaths::new(kubelet_dir, journal_dir),
            StoreOptions::default(),
        )
    }

    /// Opens with explicit paths and options.
    pub fn open_with(
        paths: StorePaths,
        options: StoreOptions,
    ) -> Result<(DeviceStore, RecoveredState), StoreError> {
        let started = Instant::now();
        for dir in [paths.kubelet_dir(), paths.journal_dir()] {
            fs::create_dir_all(dir)
                .map_err(|e| StoreError::io(format!("creating {}", dir.display()), e))?;
        }
        if let Some(marker) =
            atomic_write::read_if_exists(&paths.quarantine_marker).map_err(|e| {
                StoreError::io(format!("reading {}", paths.quarantine_marker.display()), e)
            })?
        {
            return Err(StoreError::Quarantined {
                marker: paths.quarantine_marker.clone(),
                detail: String::from_utf8_lossy(&marker).into_owned(),
            });
        }

        // The two files are independent until the journal is applied: read and parse them on
        // two threads (restart to ready is judged at 10 000 containers, where each takes tens of
        // milliseconds). Errors are then handled in order: the kubelet file first, then the journal.
        // Without a thread (none could be started), the journal is read after the file.
        let (kubelet_read, journal_read) = std::thread::scope(|scope| {
            let journal = std::thread::Builder::new()
                .name("devicelet-journal-read".into())
                .spawn_scoped(scope, || read_journal(&paths.journal));
            let kubelet = read_kubelet_file(&paths.kubelet_file);
            let journal = match journal {
                Ok(reader) => reader
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => read_journal(&paths.journal),
            };
            (kubelet, journal)
        });

        // 1. The kubelet file.
        let (mut state, file_checksum, kubelet_origin) = match kubelet_read? {
            KubeletRead::Missing => (DeviceState::default(), None, KubeletFileOrigin::Missing),
            KubeletRead::NotRegular(kind) => {
                return Err(quarantine(
                    &paths,
                    &paths.kubelet_file,
                    Corruption::NotARegularFile(kind),
                ));
            }
            KubeletRead::Decoded {
                state,
                checksum,
                origin,
            } => (state, Some(checksum), origin),
            KubeletRead::Undecodable(e) => {
                return Err(quarantine(
                    &paths,
                    &paths.kubelet_file,
                    Corruption::Checkpoint(e),
                ));
            }
        };
        let base_now = file_checksum.map_or(journal::NO_BASE, u64::from);

        // 2. The journal.
        let (writer, journal_created, records_replayed, torn_tail) = match journal_read? {
            JournalRead::NotRegular(kind) => {
                return Err(quarantine(
                    &paths,
                    &paths.journal,
                    Corruption::NotARegularFile(kind),
                ));
            }
            JournalRead::Missing => {
                let writer = create_journal(&paths, base_now, 1, &[])?;
                (writer, true, 0, None)
            }
            JournalRead::Parsed(parsed) => {
                let mut parsed = match parsed {
                    Ok(p) => p,
                    Err(JournalError::UnknownVersion { found, supported }) => {
                        return Err(StoreError::UnknownJournalVersion {
                            file: paths.journal.clone(),
                            found,
                            supported,
                        });
                    }
                    Err(e) => {
                        return Err(quarantine(&paths, &paths.journal, Corruption::Journal(e)));
                    }
                };
                // Find where the kubelet file's content sits in the journal: the header's base, or
                // the last compaction marker with the same checksum.
                let mut start: Option<usize> = (parsed.header.base == base_now).then_some(0);
                for (i, (_, _, rec)) in parsed.records.iter().enumerate() {
                    if matches!(rec, JournalRecord::CompactionStarted { kubelet_checksum, .. } if *kubelet_checksum == base_now)
                    {
                        start = Some(i + 1);
                    }
                }
                let Some(start) = start else {
                    let describe = |v: u64| {
                        if v == journal::NO_BASE {
                            "none".to_string()
                        } else {
                            v.to_string()
                        }
                    };
                    let mut bases = vec![describe(parsed.header.base)];
                    bases.extend(parsed.records.iter().filter_map(|(_, _, r)| match r {
                        JournalRecord::CompactionStarted {
                            kubelet_checksum, ..
                        } => Some(describe(*kubelet_checksum)),
                        JournalRecord::Batch { .. } => None,
                    }));
                    return Err(quarantine(
                        &paths,
                        &paths.journal,
                        Corruption::BaseMismatch {
                            journal_base: bases.join(" or "),
                            file_checksum: describe(base_now),
                        },
                    ));
                };
                let next_seq = parsed.next_seq();
                let uncompacted_start = parsed.records.get(start).map(|(off, _, _)| *off);
                // Records already folded into the kubelet file still carry the pod records,
                // which that file cannot hold. Changes are moved into the state, not copied.
                let mut replayed = 0u64;
                for (i, (_, _, rec)) in std::mem::take(&mut parsed.records).into_iter().enumerate()
                {
                    let JournalRecord::Batch { commits, .. } = rec else {
                        continue;
                    };
                    if i < start {
                        for change in commits.into_iter().flatten() {
                            state.apply_records_only(change);
                        }
                        continue;
                    }
                    let mut devices_changed = false;
                    for change in commits.into_iter().flatten() {
                        devices_changed |= !matches!(change, Change::SetPod { .. });
                        state.apply_owned(change);
                    }
                    // A batch of pod records only (the snapshot a compaction starts a new
                    // journal with) does not make the kubelet file stale.
                    replayed += u64::from(devices_changed);
                }
                let file = atomic_write::open_append(&paths.journal).map_err(|e| {
                    StoreError::io(format!("opening {}", paths.journal.display()), e)
                })?;
                if parsed.torn_tail.is_some() {
                    // The torn record was never acknowledged; drop it so appends continue from a
                    // clean record boundary.
                    file.set_len(parsed.valid_len)
                        .and_then(|()| file.sync_all())
                        .map_err(|e| {
                            StoreError::io(
                                format!("truncating torn tail of {}", paths.journal.display()),
                                e,
                            )
                        })?;
                    tracing::warn!(
                        journal = %paths.journal.display(),
                        offset = parsed.valid_len,
                        "discarded an incomplete final journal record (crash during append; it was never acknowledged)"
                    );
                }
                let uncompacted_bytes = parsed
                    .valid_len
                    .saturating_sub(uncompacted_start.unwrap_or(parsed.valid_len));
                let writer = JournalWriter {
                    file,
                    len: parsed.valid_len,
                    next_seq,
                    uncompacted_records: replayed,
                    uncompacted_bytes,
                    oldest_uncompacted: (replayed > 0).then(Instant::now),
                    poisoned: None,
                };
                (writer, false, replayed, parsed.torn_tail)
            }
        };

        let journal_bytes = writer.len;
        let uncompacted = writer.uncompacted_records;
        let state = Arc::new(state);
        let shared = Arc::new(Shared {
            paths,
            options,
            state: RwLock::new(Arc::clone(&state)),
            writer: Mutex::new(writer),
            queue: Mutex::new(CommitQueue::default()),
            queue_cv: Condvar::new(),
            compact_lock: Mutex::new(()),
            control: Mutex::new(CompactorControl::default()),
            control_cv: Condvar::new(),
            stats: Mutex::new(StoreStats {
                journal_bytes,
                uncompacted_records: uncompacted,
                ..StoreStats::default()
            }),
        });
        let compactor = if shared.options.background_compaction {
            let s = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name("devicelet-compactor".into())
                    .spawn(move || compactor_loop(&s))
                    .map_err(|e| StoreError::io("starting the compaction thread", e))?,
            )
        } else {
            None
        };
        let recovered = RecoveredState {
            state,
            kubelet_file: kubelet_origin,
            journal_created,
            records_replayed,
            torn_tail,
            open_duration: started.elapsed(),
        };
        Ok((
            DeviceStore {
                shared,
                compactor: Mutex::new(compactor),
            },
            recovered,
        ))
    }

    /// Makes `changes` durable (journal fsync'd) and applies them. When it returns `Ok`, the
    /// changes survive a crash. When it returns `Err`, they were not applied and were rolled back
    /// from the journal. Concurrent callers share one fsync.
    pub fn commit(&self, changes: &[Change]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        for c in changes {
            c.validate().map_err(StoreError::InvalidChange)?;
        }
        let shared = &self.shared;
        let mut q = lock(&shared.queue);
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.pending.push((ticket, changes.to_vec()));
        loop {
            if let Some(res) = q.results.remove(&ticket) {
                return res;
            }
            if !q.leader_active {
                q.leader_active = true;
                let batch = std::mem::take(&mut q.pending);
                drop(q);
                let tickets: Vec<u64> = batch.iter().map(|(t, _)| *t).collect();
                let commits: Vec<Vec<Change>> = batch.into_iter().map(|(_, c)| c).collect();
                let res = shared.write_batch(commits);
                q = lock(&shared.queue);
                for t in tickets {
                    q.results.insert(t, res.clone());
                }
                q.leader_active = false;
                shared.queue_cv.notify_all();
                continue;
            }
            q = shared.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A copy of the current (durable) state.
    pub fn snapshot(&self) -> DeviceState {
        DeviceState::clone(&self.shared.state.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `f` on the current state without copying it.
    pub fn read<R>(&self, f: impl FnOnce(&DeviceState) -> R) -> R {
        f(&self.shared.state.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Folds the journal into the kubelet file now (no-op when nothing changed since the last
    /// compaction). Returns whether a compaction ran.
    pub fn compact(&self) -> Result<bool, StoreError> {
        self.shared.compact()
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        let lag = lock(&self.shared.writer)
            .oldest_uncompacted
            .map(|t| t.elapsed());
        let mut stats = lock(&self.shared.stats).clone();
        stats.kubelet_file_lag = lag;
        stats
    }

    /// The store's files.
    pub fn paths(&self) -> &StorePaths {
        &self.shared.paths
    }

    /// Clean shutdown: stops the compactor and compacts, so the kubelet file is current.
    pub fn close(self) -> Result<(), StoreError> {
        self.shutdown()
    }

    /// Like [`DeviceStore::close`] for a shared store: stops background compaction and compacts.
    /// Commits still work afterwards (they are durable in the journal); only [`DeviceStore::compact`]
    /// folds them into the kubelet file then.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        self.stop_compactor();
        self.shared.compact().map(|_| ())
    }

    fn stop_compactor(&self) {
        if let Some(handle) = lock(&self.compactor).take() {
            lock(&self.shared.control).shutdown = true;
            self.shared.control_cv.notify_all();
            if handle.join().is_err() {
                tracing::error!("device store compaction thread panicked");
            }
        }
    }
}

impl Drop for DeviceStore {
    fn drop(&mut self) {
        self.stop_compactor();
    }
}

impl Shared {
    fn write_batch(&self, commits: Vec<Vec<Change>>) -> Result<(), StoreError> {
        let mut w = lock(&self.writer);
        if let Some(reason) = &w.poisoned {
            return Err(StoreError::Poisoned(reason.clone()));
        }
        let n_commits = commits.len() as u64;
        let record = JournalRecord::Batch {
            seq: w.next_seq,
            commits,
        };
        let bytes = encode_record(&record)
            .map_err(|e| StoreError::io("encoding journal record", io::Error::other(e)))?;
        if bytes.len() - journal::RECORD_HEADER_LEN > journal::MAX_PAYLOAD as usize {
            // Recovery would refuse such a record as damaged; refuse it here instead.
            return Err(StoreError::InvalidChange(InvalidChange::BatchTooLarge {
                bytes: bytes.len(),
                limit: journal::MAX_PAYLOAD,
            }));
        }
        if let Err(e) = append_synced(&mut w.file, &bytes, &self.paths.journal) {
            // Roll the journal back to the last acknowledged record so the failed batch can
            // never be replayed.
            let good = w.len;
            if let Err(e2) = roll_back(&w.file, good, &self.paths.journal) {
                let reason = format!("append failed ({e}) and truncating back failed ({e2})");
                tracing::error!(journal = %self.paths.journal.display(), "{reason}");
                w.poisoned = Some(reason);
            }
            return Err(StoreError::io(
                format!("appending to {}", self.paths.journal.display()),
                e,
            ));
        }
        w.len += bytes.len() as u64;
        w.next_seq += 1;
        w.uncompacted_records += 1;
        w.uncompacted_bytes += bytes.len() as u64;
        let first_uncompacted = w.oldest_uncompacted.is_none();
        if first_uncompacted {
            w.oldest_uncompacted = Some(Instant::now());
        }
        {
            let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
            let st = Arc::make_mut(&mut st);
            if let JournalRecord::Batch { commits, .. } = &record {
                for change in commits.iter().flatten() {
                    st.apply(change);
                }
            }
        }
        let due = w.uncompacted_records >= self.options.compact_after_records
            || w.uncompacted_bytes >= self.options.compact_after_bytes;
        {
            let mut s = lock(&self.stats);
            s.commits += n_commits;
            s.journal_syncs += 1;
            s.journal_bytes = w.len;
            s.uncompacted_records = w.uncompacted_records;
        }
        drop(w);
        if due || first_uncompacted {
            self.control_cv.notify_all();
        }
        Ok(())
    }

    fn compaction_due(&self) -> (bool, Option<Duration>) {
        let w = lock(&self.writer);
        if w.poisoned.is_some() || w.uncompacted_records == 0 {
            return (false, None);
        }
        if w.uncompacted_records >= self.options.compact_after_records
            || w.uncompacted_bytes >= self.options.compact_after_bytes
        {
            return (true, None);
        }
        match w.oldest_uncompacted {
            Some(t) => {
                let age = t.elapsed();
                if age >= self.options.max_lag {
                    (true, None)
                } else {
                    (false, Some(self.options.max_lag - age))
                }
            }
            None => (false, None),
        }
    }

    fn compact(&self) -> Result<bool, StoreError> {
        let _serial = lock(&self.compact_lock);
        let res = self.compact_inner();
        let mut s = lock(&self.stats);
        match &res {
            Ok(true) => {
                s.compactions += 1;
                s.last_compaction_error = None;
            }
            Ok(false) => {}
            Err(e) => s.last_compaction_error = Some(e.to_string()),
        }
        res
    }

    fn compact_inner(&self) -> Result<bool, StoreError> {
        // Phase 1 (journal locked): snapshot the state and log the intent.
        let (data, pod_records, sum, marker_seq, tail_start) = {
            let mut w = lock(&self.writer);
            if let Some(reason) = &w.poisoned {
                return Err(StoreError::Poisoned(reason.clone()));
            }
            if w.uncompacted_records == 0 {
                return Ok(false);
            }
            let (data, pod_records) = {
                let st = self.state.read().unwrap_or_else(|p| p.into_inner());
                (st.to_checkpoint(), st.pod_record_changes())
            };
            let sum = device::checksum(&data);
            let marker = JournalRecord::CompactionStarted {
                seq: w.next_seq,
                kubelet_checksum: u64::from(sum),
            };
            let bytes = encode_record(&marker)
                .map_err(|e| StoreError::io("encoding journal record", io::Error::other(e)))?;
            if let Err(e) = append_synced(&mut w.file, &bytes, &self.paths.journal) {
                let good = w.len;
                if let Err(e2) = roll_back(&w.file, good, &self.paths.journal) {
                    w.poisoned = Some(format!(
                        "marker append failed ({e}) and truncating back failed ({e2})"
                    ));
                }
                return Err(StoreError::io(
                    format!("appending to {}", self.paths.journal.display()),
                    e,
                ));
            }
            let marker_seq = w.next_seq;
            w.len += bytes.len() as u64;
            w.next_seq += 1;
            (data, pod_records, sum, marker_seq, w.len)
        };

        // Phase 2 (no locks): write the kubelet file.
        let bytes = device::encode(&data);
        write_file_atomic(&self.paths.kubelet_file, &bytes)
            .map_err(|e| from_atomic("writing the kubelet checkpoint", e))?;

        // Phase 3 (journal locked): start a new journal holding only what came after the marker.
        let mut w = lock(&self.writer);
        let mut tail = Vec::with_capacity((w.len - tail_start) as usize);
        w.file
            .seek(SeekFrom::Start(tail_start))
            .and_then(|_| (&w.file).take(w.len - tail_start).read_to_end(&mut tail))
            .map_err(|e| StoreError::io(format!("reading {}", self.paths.journal.display()), e))?;
        let tail_records = w.next_seq - marker_seq - 1;
        // The new journal starts with the pod records as of the marker (they are not in the
        // kubelet file), numbered so that the copied tail stays consecutive.
        let (first_seq, snapshot) = if pod_records.is_empty() {
            (marker_seq + 1, Vec::new())
        } else {
            let record = JournalRecord::Batch {
                seq: marker_seq,
                commits: vec![pod_records],
            };
            let bytes = encode_record(&record)
                .map_err(|e| StoreError::io("encoding journal record", io::Error::other(e)))?;
            (marker_seq, bytes)
        };
        let mut body = snapshot;
        body.extend_from_slice(&tail);
        let new_writer = create_journal(&self.paths, u64::from(sum), first_seq, &body)?;
        w.file = new_writer.file;
        w.len = new_writer.len;
        w.uncompacted_records = tail_records;
        w.uncompacted_bytes = tail.len() as u64;
        w.oldest_uncompacted = (tail_records > 0).then(Instant::now);
        let mut s = lock(&self.stats);
        s.journal_bytes = w.len;
        s.uncompacted_records = w.uncompacted_records;
        Ok(true)
    }
}

/// Appends one record to the journal and fsyncs it (the acknowledgement point).
fn append_synced(file: &mut File, bytes: &[u8], path: &Path) -> io::Result<()> {
    fault::write_all(file, bytes, path)?;
    fault::check(Op::Fsync, path)?;
    file.sync_data()
}

/// Cuts the journal back to `len` bytes (the last acknowledged record) after a failed append,
/// and fsyncs it. When no byte of the record reached the file (a read-only file system, a disk
/// full before the first block) there is nothing to cut: the store stays usable, where
/// truncating (which fails on a read-only file system too) would poison it.
fn roll_back(file: &File, len: u64, path: &Path) -> io::Result<()> {
    if file.metadata()?.len() == len {
        return Ok(());
    }
    fault::check(Op::Truncate, path)?;
    file.set_len(len)?;
    file.sync_all()
}

fn compactor_loop(shared: &Shared) {
    loop {
        {
            let mut ctl = lock(&shared.control);
            loop {
                if ctl.shutdown {
                    return;
                }
                let (due, wait) = shared.compaction_due();
                if due {
                    break;
                }
                let timeout = wait
                    .unwrap_or(shared.options.max_lag)
                    .max(Duration::from_millis(1));
                ctl = shared
                    .control_cv
                    .wait_timeout(ctl, timeout)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        if let Err(e) = shared.compact() {
            tracing::warn!(error = %e, "compaction of the device journal failed; will retry");
            let ctl = lock(&shared.control);
            if ctl.shutdown {
                return;
            }
            let _unused = shared.control_cv.wait_timeout(ctl, shared.options.max_lag);
        }
    }
}

/// Writes a fresh journal (header + `tail` records) via temp file + rename, fsyncs the directory,
/// and returns a writer positioned at its end.
fn create_journal(
    paths: &StorePaths,
    base: u64,
    first_seq: u64,
    tail: &[u8],
) -> Result<JournalWriter, StoreError> {
    let header = JournalHeader {
        version: journal::JOURNAL_VERSION,
        flags: 0,
        base,
        first_seq,
    };
    let mut bytes = Vec::with_capacity(journal::HEADER_LEN + tail.len());
    bytes.extend_from_slice(&header.encode());
    bytes.extend_from_slice(tail);
    write_file_atomic(&paths.journal, &bytes)
        .map_err(|e| from_atomic("creating the device journal", e))?;
    let file = atomic_write::open_append(&paths.journal)
        .map_err(|e| StoreError::io(format!("opening {}", paths.journal.display()), e))?;
    Ok(JournalWriter {
        file,
        len: bytes.len() as u64,
        next_seq: first_seq,
        uncompacted_records: 0,
        uncompacted_bytes: 0,
        oldest_uncompacted: None,
        poisoned: None,
    })
}

enum FileRead {
    Missing,
    NotRegular(&'static str),
    Bytes(Vec<u8>),
}

/// The kubelet file as read (and decoded) at open.
enum KubeletRead {
    Missing,
    NotRegular(&'static str),
    Decoded {
        state: DeviceState,
        checksum: u32,
        origin: KubeletFileOrigin,
    },
    Undecodable(DecodeError),
}

fn read_kubelet_file(path: &Path) -> Result<KubeletRead, StoreError> {
    Ok(match read_regular(path)? {
        FileRead::Missing => KubeletRead::Missing,
        FileRead::NotRegular(kind) => KubeletRead::NotRegular(kind),
        FileRead::Bytes(bytes) => match device::decode(&bytes) {
            Ok(decoded) => KubeletRead::Decoded {
                origin: KubeletFileOrigin::Loaded {
                    format: decoded.format,
                    checksum: decoded.checksum,
                    entries: decoded.data.pod_device_entries.as_ref().map_or(0, Vec::len),
                },
                checksum: decoded.checksum,
                state: DeviceState::from_checkpoint_owned(decoded.data),
            },
            Err(e) => KubeletRead::Undecodable(e),
        },
    })
}

/// The journal as read (and parsed) at open.
enum JournalRead {
    Missing,
    NotRegular(&'static str),
    Parsed(Result<journal::ParsedJournal, JournalError>),
}

fn read_journal(path: &Path) -> Result<JournalRead, StoreError> {
    Ok(match read_regular(path)? {
        FileRead::Missing => JournalRead::Missing,
        FileRead::NotRegular(kind) => JournalRead::NotRegular(kind),
        FileRead::Bytes(bytes) => JournalRead::Parsed(journal::parse(&bytes)),
    })
}

fn read_regular(path: &Path) -> Result<FileRead, StoreError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(FileRead::Missing),
        Err(e) => return Err(StoreError::io(format!("stat {}", path.display()), e)),
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        return Ok(FileRead::NotRegular("directory"));
    }
    if ft.is_symlink() {
        // Follow it, like the kubelet's os.ReadFile would.
        match fs::metadata(path) {
            Ok(m) if m.is_file() => {}
            Ok(m) if m.is_dir() => return Ok(FileRead::NotRegular("directory")),
            Ok(_) => return Ok(FileRead::NotRegular("special file")),
            Err(_) => return Ok(FileRead::NotRegular("dangling symlink")),
        }
    } else if !ft.is_file() {
        return Ok(FileRead::NotRegular("special file"));
    }
    fs::read(path)
        .map(FileRead::Bytes)
        .map_err(|e| StoreError::io(format!("reading {}", path.display()), e))
}

/// Moves the bad file aside, writes the quarantine marker and builds the error.
fn quarantine(paths: &StorePaths, bad: &Path, cause: Corruption) -> StoreError {
    let moved_to = match move_aside(bad, aside::CORRUPT) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!(file = %bad.display(), error = %e, "could not move the corrupt file aside");
            None
        }
    };
    let marker = QuarantineMarker {
        file: bad.to_path_buf(),
        moved_to: moved_to.clone(),
        cause: cause.to_string(),
        time: utc_timestamp(SystemTime::now()),
    };
    match serde_json::to_vec_pretty(&marker) {
        Ok(bytes) => {
            if let Err(e) = write_file_atomic(&paths.quarantine_marker, &bytes) {
                tracing::error!(marker = %paths.quarantine_marker.display(), error = %e, "could not write the quarantine marker");
            }
        }
        Err(e) => tracing::error!(error = %e, "could not encode the quarantine marker"),
    }
    tracing::error!(
        file = %bad.display(),
        moved_to = ?moved_to,
        cause = %cause,
        "device state is corrupt: refusing to hand out devices whose ownership is unknown until an operator runs recovery"
    );
    StoreError::Corrupt {
        file: bad.to_path_buf(),
        moved_to,
        cause,
    }
}

/// What [`recover`] should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoverAction {
    /// Start with no allocations: moves any kubelet file and journal aside (never deletes them).
    StartEmpty,
    /// Take the kubelet file as the truth (it must verify): moves the journal aside. This is also
    /// `devicelet state import` for a node that was run by a kubelet.
    ImportKubeletFile,
    /// Rebuild the allocations from the journal alone, for when the kubelet file is damaged: the
    /// journal's own changes, plus the pod records a compaction starts every journal with (they
    /// name each container's devices). Writes a new kubelet file and a new journal; the old
    /// files are moved aside. Cached `Allocate` responses folded into the lost file cannot come
    /// back, so those containers keep their devices but `start` returns no plugin settings.
    RebuildFromJournal,
}

/// What [`recover`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecoverReport {
    /// Files moved aside (original → new name).
    pub moved: Vec<(PathBuf, PathBuf)>,
    /// Whether a quarantine marker was cleared.
    pub cleared_quarantine: bool,
    /// Entries in the imported kubelet file, for [`RecoverAction::ImportKubeletFile`].
    pub imported_entries: Option<usize>,
    /// What [`RecoverAction::RebuildFromJournal`] rebuilt.
    pub rebuilt: Option<RebuildSummary>,
}

/// What [`RecoverAction::RebuildFromJournal`] found in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RebuildSummary {
    /// Pods with allocations or records.
    pub pods: usize,
    /// (pod, container, resource) entries written to the new kubelet file.
    pub entries: usize,
    /// Entries known only from pod records: devices kept, cached `Allocate` response lost.
    pub entries_without_response: usize,
}

/// The state a journal describes on its own: every change in order, then an entry without a
/// cached response for each device list a pod record names that no change carried (pods
/// admitted before the last compaction, whose responses were folded into the kubelet file).
pub fn rebuild_from_journal(parsed: &journal::ParsedJournal) -> (DeviceState, RebuildSummary) {
    let mut state = DeviceState::default();
    for (_, _, record) in &parsed.records {
        if let JournalRecord::Batch { commits, .. } = record {
            for change in commits.iter().flatten() {
                state.apply(change);
            }
        }
    }
    let mut without_response = 0;
    let records = state.pod_records.clone();
    for (uid, record) in &records {
        for container in &record.containers {
            for (resource, ids) in &container.devices {
                if ids.is_empty() || state.get(uid, &container.name, resource).is_some() {
                    continue;
                }
                // NUMA placement is not in the record; -1 is the kubelet's "no topology".
                state
                    .pods
                    .entry(uid.clone())
                    .or_default()
                    .entry(container.name.clone())
                    .or_default()
                    .insert(
                        resource.clone(),
                        crate::state::ContainerDevices {
                            device_ids_by_numa: BTreeMap::from([(-1, ids.clone())]),
                            alloc_resp: Vec::new(),
                        },
                    );
                without_response += 1;
            }
        }
    }
    // Resources held by a pod count as registered (zero allocatable until the plugin returns).
    let held: Vec<String> = state
        .pods
        .values()
        .flat_map(|containers| containers.values().flat_map(|r| r.keys().cloned()))
        .collect();
    for resource in held {
        state.registered.entry(resource).or_default();
    }
    let mut pods: std::collections::BTreeSet<&String> = state.pods.keys().collect();
    pods.extend(state.pod_records.keys());
    let summary = RebuildSummary {
        pods: pods.len(),
        entries: state.entry_count(),
        entries_without_response: without_response,
    };
    (state, summary)
}

/// The operator's explicit recovery: resolves a quarantine (or takes over a kubelet's
/// checkpoint) so that the next [`DeviceStore::open`] succeeds. Must not run while a store is open
/// on the same files.
pub fn recover(paths: &StorePaths, action: RecoverAction) -> Result<RecoverReport, StoreError> {
    let mut moved = Vec::new();
    let mut imported_entries = None;
    let mut rebuilt = None;
    let aside = |p: &Path, moved: &mut Vec<(PathBuf, PathBuf)>| -> Result<(), StoreError> {
        if fs::symlink_metadata(p).is_ok() {
            let to = move_aside(p, aside::REPLACED)
                .map_err(|e| StoreError::io(format!("moving {} aside", p.display()), e))?;
            moved.push((p.to_path_buf(), to));
        }
        Ok(())
    };
    match action {
        RecoverAction::StartEmpty => {
            aside(&paths.kubelet_file, &mut moved)?;
            aside(&paths.journal, &mut moved)?;
        }
        RecoverAction::ImportKubeletFile => {
            match read_regular(&paths.kubelet_file)? {
                FileRead::Missing => {}
                FileRead::NotRegular(kind) => {
                    return Err(StoreError::Corrupt {
                        file: paths.kubelet_file.clone(),
                        moved_to: None,
                        cause: Corruption::NotARegularFile(kind),
                    });
                }
                FileRead::Bytes(b) => {
                    let decoded = device::decode(&b).map_err(|e| StoreError::Corrupt {
                        file: paths.kubelet_file.clone(),
                        moved_to: None,
                        cause: Corruption::Checkpoint(e),
                    })?;
                    imported_entries =
                        Some(decoded.data.pod_device_entries.as_ref().map_or(0, Vec::len));
                }
            }
            aside(&paths.journal, &mut moved)?;
        }
        RecoverAction::RebuildFromJournal => {
            let parsed = match read_regular(&paths.journal)? {
                FileRead::Bytes(bytes) => journal::parse(&bytes).map_err(|e| match e {
                    JournalError::UnknownVersion { found, supported } => {
                        StoreError::UnknownJournalVersion {
                            file: paths.journal.clone(),
                            found,
                            supported,
                        }
                    }
                    e => StoreError::Corrupt {
                        file: paths.journal.clone(),
                        moved_to: None,
                        cause: Corruption::Journal(e),
                    },
                })?,
                FileRead::Missing => {
                    return Err(StoreError::io(
                        format!("reading {}", paths.journal.display()),
                        io::Error::new(io::ErrorKind::NotFound, "no journal to rebuild from"),
                    ));
                }
                FileRead::NotRegular(kind) => {
                    return Err(StoreError::Corrupt {
                        file: paths.journal.clone(),
                        moved_to: None,
                        cause: Corruption::NotARegularFile(kind),
                    });
                }
            };
            let (state, summary) = rebuild_from_journal(&parsed);
            let data = state.to_checkpoint();
            let checksum = device::checksum(&data);
            // Both old files stay as evidence; the new pair is consistent (journal base = file).
            aside(&paths.kubelet_file, &mut moved)?;
            aside(&paths.journal, &mut moved)?;
            write_file_atomic(&paths.kubelet_file, &device::encode(&data))
                .map_err(|e| from_atomic("writing the rebuilt kubelet checkpoint", e))?;
            let records = state.pod_record_changes();
            let first_seq = parsed.next_seq();
            let tail = if records.is_empty() {
                Vec::new()
            } else {
                encode_record(&JournalRecord::Batch {
                    seq: first_seq,
                    commits: vec![records],
                })
                .map_err(|e| StoreError::io("encoding journal record", io::Error::other(e)))?
            };
            create_journal(paths, u64::from(checksum), first_seq, &tail)?;
            rebuilt = Some(summary);
        }
    }
    let cleared_quarantine = match fs::remove_file(&paths.quarantine_marker) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(StoreError::io(
                format!("removing {}", paths.quarantine_marker.display()),
                e,
            ));
        }
    };
    if cleared_quarantine {
        sync_dir(paths.journal_dir())
            .map_err(|e| StoreError::io("fsync of the journal directory", e))?;
    }
    tracing::warn!(?action, moved = ?moved, "device state recovered by operator");
    Ok(RecoverReport {
        moved,
        cleared_quarantine,
        imported_entries,
        rebuilt,
    })
}
