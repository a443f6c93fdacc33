//! Compaction: folds the [`DeviceStore`]'s journal into the kubelet-format
//! `kubelet_internal_checkpoint` (atomic replace, [`crate::atomic_write`]; format of
//! `pkg/kubelet/cm/devicemanager/checkpoint/`) and starts a fresh journal, on a background thread
//! (by record count, bytes, or the `max_lag` bound), on demand and on clean shutdown. A
//! `CompactionStarted` marker with the new file's checksum is fsync'd first, so a crash at any
//! step recovers the acknowledged state (see the module docs of `store`). Each compaction ends by
//! writing the restart snapshot ([`crate::snapshot`]) of the new kubelet file and journal prefix.

use std::io::{self, Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use crate::atomic_write::write_file_atomic;
use crate::device::{self, DeviceCheckpointFormat};
use crate::journal::{self, JournalRecord, encode_record};
use crate::snapshot::{self, SnapshotHeader};
use crate::state::Change;

use super::device_store::{DeviceStore, Shared, lock};
use super::error::{StoreError, from_atomic};
use super::writer::{append_synced, create_journal, journal_header, roll_back};

impl DeviceStore {
    /// Folds the journal into the kubelet file now (no-op when nothing changed since the last
    /// compaction). Returns whether a compaction ran.
    pub fn compact(&self) -> Result<bool, StoreError> {
        self.shared.compact()
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

        // The restart snapshot's body: the same state, binary (see `crate::snapshot`).
        let snapshot_body = snapshot::encode_body(
            &data,
            pod_records.iter().filter_map(|c| match c {
                Change::SetPod { pod_uid, record } => Some((pod_uid, record)),
                _ => None,
            }),
        );
        let kubelet_entries = data.pod_device_entries.as_ref().map_or(0, Vec::len) as u64;
        let kubelet_file = (bytes.len() as u64, snapshot::hash(&bytes));
        drop(data);
        drop(bytes);

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
        // What the restart snapshot covers of the new journal: its header and the pod records.
        let prefix_len = journal::HEADER_LEN + snapshot.len();
        let prefix_hash = snapshot::hash_parts(&[
            &journal_header(u64::from(sum), first_seq).encode(),
            &snapshot,
        ]);
        let mut body = snapshot;
        body.extend_from_slice(&tail);
        let new_writer = create_journal(&self.paths, u64::from(sum), first_seq, &body)?;
        w.file = new_writer.file;
        w.len = new_writer.len;
        w.uncompacted_records = tail_records;
        w.uncompacted_bytes = tail.len() as u64;
        w.oldest_uncompacted = (tail_records > 0).then(Instant::now);
        {
            let mut s = lock(&self.stats);
            s.journal_bytes = w.len;
            s.uncompacted_records = w.uncompacted_records;
        }
        drop(w);

        // Last, the restart snapshot (outside the journal lock; commits go on). Without it a
        // restart reads the files as before, so a failure is only logged.
        let header = SnapshotHeader {
            kubelet_file: Some(kubelet_file),
            kubelet_checksum: sum,
            kubelet_format: DeviceCheckpointFormat::V2,
            kubelet_entries,
            journal_prefix_len: prefix_len as u64,
            journal_prefix_hash: prefix_hash,
            journal_next_seq: marker_seq + 1,
        };
        let file = snapshot::encode(&header, &snapshot_body);
        if let Err(e) = write_file_atomic(&self.paths.snapshot, &file) {
            tracing::warn!(snapshot = %self.paths.snapshot.display(), error = %e,
                "could not write the restart snapshot; the next start reads the kubelet checkpoint");
        }
        Ok(true)
    }
}

/// The background thread: compacts when due (see `compaction_due`), retries after a failure,
/// until [`DeviceStore::close`] or [`DeviceStore::shutdown`] stops it.
pub(super) fn compactor_loop(shared: &Shared) {
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
