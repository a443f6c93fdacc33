//! [`DeviceStore`] and the state shared by its callers and its compaction thread: the state, the
//! journal writer, the commit queue, the compactor's control and the counters; plus the reads that
//! change nothing. Opening is in `recovery.rs`, commits in `group_commit.rs`, compaction in
//! `compaction.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

use crate::state::{Change, DeviceState};

use super::error::StoreError;
use super::options::StoreOptions;
use super::paths::StorePaths;
use super::stats::StoreStats;
use super::writer::JournalWriter;

/// Commits waiting for the group-commit leader, and the results it hands back.
#[derive(Default)]
pub(super) struct CommitQueue {
    pub(super) next_ticket: u64,
    pub(super) pending: Vec<(u64, Vec<Change>)>,
    pub(super) leader_active: bool,
    pub(super) results: HashMap<u64, Result<(), StoreError>>,
}

/// Tells the compaction thread to stop.
#[derive(Default)]
pub(super) struct CompactorControl {
    pub(super) shutdown: bool,
}

/// What the store's handle and its compaction thread share.
pub(super) struct Shared {
    pub(super) paths: StorePaths,
    pub(super) options: StoreOptions,
    /// Shared with [`RecoveredState::state`](super::RecoveredState::state) after open, so a
    /// restart does not copy the whole state; the first commit copies it only if the caller still
    /// holds the recovered one.
    pub(super) state: RwLock<Arc<DeviceState>>,
    pub(super) writer: Mutex<JournalWriter>,
    pub(super) queue: Mutex<CommitQueue>,
    pub(super) queue_cv: Condvar,
    pub(super) compact_lock: Mutex<()>,
    pub(super) control: Mutex<CompactorControl>,
    pub(super) control_cv: Condvar,
    pub(super) stats: Mutex<StoreStats>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of our locks leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Durable device-allocation store (see the module docs).
pub struct DeviceStore {
    pub(super) shared: Arc<Shared>,
    pub(super) compactor: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for DeviceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStore")
            .field("paths", &self.shared.paths)
            .finish()
    }
}

impl DeviceStore {
    /// A copy of the current (durable) state.
    pub fn snapshot(&self) -> DeviceState {
        DeviceState::clone(&self.shared.state.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `f` on the current state without copying it.
    pub fn read<R>(&self, f: impl FnOnce(&DeviceState) -> R) -> R {
        f(&self.shared.state.read().unwrap_or_else(|p| p.into_inner()))
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
}
