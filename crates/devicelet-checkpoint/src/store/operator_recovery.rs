//! The operator's explicit recovery ([`recover`], `devicelet state recover` / `import`): resolves
//! a quarantine by starting empty, importing the kubelet file, or rebuilding the allocations from
//! the journal alone ([`rebuild_from_journal`]). Old files are moved aside, never deleted.
//! devicelet's own: the kubelet has no operator recovery for `kubelet_internal_checkpoint`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::aside::{self, move_aside};
use crate::atomic_write::{sync_dir, write_file_atomic};
use crate::device;
use crate::journal::{self, JournalError, JournalRecord, encode_record};
use crate::state::DeviceState;

use super::error::{Corruption, StoreError, from_atomic};
use super::paths::StorePaths;
use super::recovery::{FileRead, read_regular};
use super::writer::create_journal;

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
/// checkpoint) so that the next [`DeviceStore::open`](super::DeviceStore::open) succeeds. Must
/// not run while a store is open on the same files.
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
