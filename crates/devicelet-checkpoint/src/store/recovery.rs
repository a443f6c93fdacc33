//! Opening the [`DeviceStore`]: reads the kubelet file (`pkg/kubelet/cm/devicemanager/checkpoint/`
//! format) and the journal in parallel, finds where the file's content sits in the journal (its
//! base or a compaction marker), replays the rest, drops a torn final record, and quarantines any
//! other damage: the bad file is moved aside, a marker is written, and the open fails with an
//! error for which [`StoreError::ownership_unknown`] is true (see the module docs of `store`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::aside::{self, move_aside, utc_timestamp};
use crate::atomic_write::{self, write_file_atomic};
use crate::device::{self, DeviceCheckpointFormat};
use crate::error::DecodeError;
use crate::journal::{self, JournalError, JournalRecord, TornTail};
use crate::snapshot::{self, SnapshotHeader, SnapshotMismatch};
use crate::state::{Change, DeviceState};

use super::compaction::compactor_loop;
use super::device_store::{CommitQueue, CompactorControl, DeviceStore, Shared};
use super::error::{Corruption, StoreError};
use super::options::StoreOptions;
use super::paths::StorePaths;
use super::stats::StoreStats;
use super::writer::{JournalWriter, create_journal};

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
    /// Whether the restart snapshot was used, and why not.
    pub snapshot: SnapshotUse,
    /// Time spent in [`DeviceStore::open`].
    #[serde(with = "duration_ms")]
    pub open_duration: Duration,
}

/// What became of the restart snapshot (`crate::snapshot`) at open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum SnapshotUse {
    /// There was none (or no journal to check it against).
    Absent,
    /// The kubelet file's state and the journal prefix came from it.
    Used,
    /// It was ignored; the files were read instead.
    Ignored {
        /// Why (also logged).
        reason: String,
    },
}

mod duration_ms {
    use serde::Serializer;
    pub fn serialize<S: Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
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

        // The files are read first (a few MB from the page cache), so the restart snapshot can
        // be checked against the exact bytes of the kubelet file and the journal (see
        // `crate::snapshot`). Then the kubelet file's state (from the snapshot when it matches,
        // else by parsing and verifying the file) and the journal records (after the snapshot's
        // prefix, or all of them) are decoded on two threads: restart to ready is judged at
        // 10 000 containers, where each takes milliseconds. Errors are then handled in order: the
        // kubelet file first, then the journal. Without a thread (none could be started), the
        // journal is parsed after the file.
        let kubelet_bytes = read_regular(&paths.kubelet_file)?;
        let journal_bytes = read_regular(&paths.journal)?;
        let (snapshot, mut snapshot_use) = usable_snapshot(&paths, &kubelet_bytes, &journal_bytes);
        let (kubelet_read, journal_read) = std::thread::scope(|scope| {
            let prefix = snapshot.as_ref().map(|(header, _)| header);
            let journal_bytes = &journal_bytes;
            let journal = std::thread::Builder::new()
                .name("devicelet-journal-read".into())
                .spawn_scoped(scope, move || parse_journal(journal_bytes, prefix));
            let (kubelet, used) = match &snapshot {
                Some((header, bytes)) => match snapshot_state(header, bytes) {
                    Ok(read) => (read, true),
                    Err(reason) => {
                        snapshot_use = snapshot_skipped(&paths, &reason);
                        (decode_kubelet_file(&kubelet_bytes), false)
                    }
                },
                None => (decode_kubelet_file(&kubelet_bytes), false),
            };
            let journal = match journal {
                Ok(reader) => reader
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => parse_journal(journal_bytes, prefix),
            };
            // A snapshot whose body did not decode: the journal must be read whole.
            let journal = if prefix.is_some() && !used {
                parse_journal(journal_bytes, None)
            } else {
                journal
            };
            if used {
                snapshot_use = SnapshotUse::Used;
                tracing::debug!(snapshot = %paths.snapshot.display(), "restored from the restart snapshot");
            }
            (kubelet, journal)
        });

        // 1. The kubelet file.
        let (mut state, file_checksum, kubelet_origin) = match kubelet_read {
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
            KubeletRead::Snapshot {
                state,
                checksum,
                origin,
            } => (state, checksum, origin),
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
        let (writer, journal_created, records_replayed, torn_tail) = match journal_read {
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
            snapshot: snapshot_use,
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
}

pub(super) enum FileRead {
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
    /// The kubelet file's state (and the journal prefix's pod records) from the snapshot.
    Snapshot {
        state: DeviceState,
        checksum: Option<u32>,
        origin: KubeletFileOrigin,
    },
}

/// Decodes and verifies the kubelet file as read.
fn decode_kubelet_file(read: &FileRead) -> KubeletRead {
    match read {
        FileRead::Missing => KubeletRead::Missing,
        FileRead::NotRegular(kind) => KubeletRead::NotRegular(kind),
        FileRead::Bytes(bytes) => match device::decode(bytes) {
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
    }
}

/// The journal as read (and parsed) at open.
enum JournalRead {
    Missing,
    NotRegular(&'static str),
    Parsed(Result<journal::ParsedJournal, JournalError>),
}

/// Parses the journal as read: whole, or only the records after a snapshot's prefix.
fn parse_journal(read: &FileRead, after: Option<&SnapshotHeader>) -> JournalRead {
    match read {
        FileRead::Missing => JournalRead::Missing,
        FileRead::NotRegular(kind) => JournalRead::NotRegular(kind),
        FileRead::Bytes(bytes) => JournalRead::Parsed(match after {
            Some(h) => journal::parse_after(
                bytes,
                usize::try_from(h.journal_prefix_len).unwrap_or(usize::MAX),
                h.journal_next_seq,
            ),
            None => journal::parse(bytes),
        }),
    }
}

/// Why the restart snapshot was not checked against the files, or did not match them.
fn snapshot_skipped(paths: &StorePaths, reason: &dyn std::fmt::Display) -> SnapshotUse {
    tracing::warn!(snapshot = %paths.snapshot.display(), %reason,
        "restart snapshot not used; reading the kubelet checkpoint and the journal");
    SnapshotUse::Ignored {
        reason: reason.to_string(),
    }
}

/// Reads the restart snapshot and checks it against the kubelet file and the journal as read;
/// returns its header and bytes when it may be used. Every reason not to use it is logged (a
/// missing snapshot quietly): the files are then read as without one.
fn usable_snapshot(
    paths: &StorePaths,
    kubelet: &FileRead,
    journal: &FileRead,
) -> (Option<(SnapshotHeader, Vec<u8>)>, SnapshotUse) {
    let FileRead::Bytes(journal) = journal else {
        // No journal (fresh node or import) or none that can be read: recovery reads the files.
        return (None, SnapshotUse::Absent);
    };
    let kubelet = match kubelet {
        FileRead::Missing => None,
        FileRead::Bytes(bytes) => Some(bytes.as_slice()),
        FileRead::NotRegular(_) => return (None, SnapshotUse::Absent),
    };
    let bytes = match read_regular(&paths.snapshot) {
        Ok(FileRead::Bytes(bytes)) => bytes,
        Ok(FileRead::Missing) => return (None, SnapshotUse::Absent),
        Ok(FileRead::NotRegular(kind)) => {
            return (None, snapshot_skipped(paths, &format!("it is a {kind}")));
        }
        Err(e) => return (None, snapshot_skipped(paths, &e)),
    };
    let checked = snapshot::parse_header(&bytes).and_then(|(header, _)| {
        snapshot::check_sources(&header, kubelet, journal).map(|()| header)
    });
    match checked {
        // Used once its body decodes (`SnapshotUse::Used` is set then).
        Ok(header) => (Some((header, bytes)), SnapshotUse::Absent),
        Err(reason) => (None, snapshot_skipped(paths, &reason)),
    }
}

/// The kubelet file's part of the state (and the journal prefix's pod records), from a checked
/// snapshot.
fn snapshot_state(header: &SnapshotHeader, bytes: &[u8]) -> Result<KubeletRead, SnapshotMismatch> {
    let body = bytes
        .get(snapshot::SNAPSHOT_HEADER_LEN..)
        .ok_or(SnapshotMismatch::Malformed("no body"))?;
    let state = snapshot::decode_body(body)?;
    Ok(match header.kubelet_file {
        None => KubeletRead::Snapshot {
            state,
            checksum: None,
            origin: KubeletFileOrigin::Missing,
        },
        Some(_) => KubeletRead::Snapshot {
            state,
            checksum: Some(header.kubelet_checksum),
            origin: KubeletFileOrigin::Loaded {
                format: header.kubelet_format,
                checksum: header.kubelet_checksum,
                entries: usize::try_from(header.kubelet_entries).unwrap_or(usize::MAX),
            },
        },
    })
}

pub(super) fn read_regular(path: &Path) -> Result<FileRead, StoreError> {
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
