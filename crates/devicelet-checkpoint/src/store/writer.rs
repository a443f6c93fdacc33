//! The open journal of the [`DeviceStore`](super::DeviceStore) (record format in
//! [`crate::journal`]): appending a record with fsync (the acknowledgement point), cutting a
//! failed append back, and writing a fresh journal. devicelet's own: the kubelet has no journal,
//! it rewrites `kubelet_internal_checkpoint` whole (`pkg/kubelet/cm/devicemanager/manager.go`
//! `writeCheckpoint`).

use std::fs::File;
use std::io;
use std::path::Path;
use std::time::Instant;

use crate::atomic_write::{self, write_file_atomic};
use crate::fault::{self, Op};
use crate::journal::{self, JournalHeader};

use super::error::{StoreError, from_atomic};
use super::paths::StorePaths;

/// The journal as appended to: its file, length, next sequence number and what compaction owes.
pub(super) struct JournalWriter {
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) next_seq: u64,
    pub(super) uncompacted_records: u64,
    pub(super) uncompacted_bytes: u64,
    pub(super) oldest_uncompacted: Option<Instant>,
    pub(super) poisoned: Option<String>,
}

/// The header of a fresh journal.
pub(super) fn journal_header(base: u64, first_seq: u64) -> JournalHeader {
    JournalHeader {
        version: journal::JOURNAL_VERSION,
        flags: 0,
        base,
        first_seq,
    }
}

/// Writes a fresh journal (header + `tail` records) via temp file + rename, fsyncs the directory,
/// and returns a writer positioned at its end.
pub(super) fn create_journal(
    paths: &StorePaths,
    base: u64,
    first_seq: u64,
    tail: &[u8],
) -> Result<JournalWriter, StoreError> {
    let header = journal_header(base, first_seq);
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

/// Appends one record to the journal and fsyncs it (the acknowledgement point).
pub(super) fn append_synced(file: &mut File, bytes: &[u8], path: &Path) -> io::Result<()> {
    fault::write_all(file, bytes, path)?;
    fault::check(Op::Fsync, path)?;
    file.sync_data()
}

/// Cuts the journal back to `len` bytes (the last acknowledged record) after a failed append,
/// and fsyncs it. When no byte of the record reached the file (a read-only file system, a disk
/// full before the first block) there is nothing to cut: the store stays usable, where
/// truncating (which fails on a read-only file system too) would poison it.
pub(super) fn roll_back(file: &File, len: u64, path: &Path) -> io::Result<()> {
    if file.metadata()?.len() == len {
        return Ok(());
    }
    fault::check(Op::Truncate, path)?;
    file.set_len(len)?;
    file.sync_all()
}
