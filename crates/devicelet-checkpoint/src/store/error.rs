//! [`StoreError`] and [`Corruption`]: how a [`DeviceStore`](super::DeviceStore) operation
//! fails, and which of those failures leave device ownership unknown (the caller then hands out
//! no devices, spec ecosystem.md A2.19).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::atomic_write::AtomicWriteError;
use crate::error::DecodeError;
use crate::journal::JournalError;
use crate::state::InvalidChange;

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
    pub(super) fn io(context: impl Into<String>, source: io::Error) -> Self {
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

pub(super) fn from_atomic(context: &str, e: AtomicWriteError) -> StoreError {
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
