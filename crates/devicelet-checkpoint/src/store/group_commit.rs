//! Group commit: [`DeviceStore::commit`] appends each commit to the journal and fsyncs it before
//! returning, so an admission costs the same with 0 or 10 000 containers admitted; concurrent
//! commits share one record and one fsync (a leader writes the batch of everyone waiting). The
//! kubelet instead rewrites `kubelet_internal_checkpoint` whole after every allocation
//! (`pkg/kubelet/cm/devicemanager/manager.go` `writeCheckpoint`).

use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::journal::{self, JournalRecord, encode_record};
use crate::state::{Change, InvalidChange};

use super::device_store::{DeviceStore, Shared, lock};
use super::error::StoreError;
use super::writer::{append_synced, roll_back};

impl DeviceStore {
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
}

impl DeviceStore {
    /// Makes several independent commits durable with one journal record and one fsync, for a
    /// caller that gathers them itself (devicelet's journal thread drains every admission that
    /// queued while the previous fsync ran). Returns one result per commit, in order: an
    /// invalid commit fails alone; a failed write fails every valid one (none was applied).
    pub fn commit_group(&self, commits: Vec<Vec<Change>>) -> Vec<Result<(), StoreError>> {
        let mut results: Vec<Result<(), StoreError>> = Vec::with_capacity(commits.len());
        let mut valid = Vec::with_capacity(commits.len());
        for changes in commits {
            match changes.iter().try_for_each(Change::validate) {
                Err(e) => results.push(Err(StoreError::InvalidChange(e))),
                Ok(()) => {
                    results.push(Ok(()));
                    if !changes.is_empty() {
                        valid.push(changes);
                    }
                }
            }
        }
        if valid.is_empty() {
            return results;
        }
        if let Err(e) = self.shared.write_batch(valid) {
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(e.clone());
            }
        }
        results
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
}
