//! Persistence of the claim cache: `R/dra_manager_state` in the kubelet's format
//! (`pkg/kubelet/cm/dra/state/`, spec dra-kubelet.md §3.1) and the per-boot
//! prepared marks in `R/devicelet/dra_prepared_claims` (E5). Restores both at open (a corrupt
//! checkpoint is moved aside and quarantined instead of refusing to start), removes the
//! quarantine on operator recovery, and writes durably; a change whose write fails is undone in
//! memory.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use devicelet_checkpoint::aside::{self, move_aside};
use devicelet_checkpoint::atomic_write::{sync_dir, write_file_atomic};
use devicelet_checkpoint::dra::{self as ckpt, ClaimInfoState};
use tracing::{info, warn};

use crate::boot::BootIdSource;
use crate::error::DraError;
use crate::registry::DraPluginRegistry;

use super::cache::{CacheState, ClaimCache, Shared};
use super::cached_claim::{CachedClaim, key};

/// devicelet's own sub-directory of the kubelet root.
pub const DEVICELET_DIR: &str = "devicelet";
/// Per-boot prepared marks (in [`DEVICELET_DIR`]).
pub const PREPARED_FILE: &str = "dra_prepared_claims";
/// Quarantine marker (in [`DEVICELET_DIR`]).
pub const QUARANTINE_FILE: &str = "dra_manager_state.quarantine";

fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> DraError + 'a {
    move |source| DraError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, DraError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("reading", path)(e)),
    }
}

impl ClaimCache {
    /// Opens (or creates) the cache in the kubelet root `state_dir`: loads
    /// `state_dir/dra_manager_state`, or writes an empty one if missing. A damaged file puts the
    /// cache in the quarantined state (see the module docs) instead of failing.
    pub fn open(
        state_dir: &Path,
        registry: DraPluginRegistry,
        boot: &dyn BootIdSource,
    ) -> Result<Self, DraError> {
        let own_dir = state_dir.join(DEVICELET_DIR);
        std::fs::create_dir_all(&own_dir).map_err(io_err("creating", &own_dir))?;
        let boot_id = boot.boot_id()?;
        let checkpoint_path = state_dir.join(ckpt::DRA_CHECKPOINT_FILE);
        let prepared_path = own_dir.join(PREPARED_FILE);
        let quarantine_path = own_dir.join(QUARANTINE_FILE);
        let mut entries = HashMap::new();
        let mut quarantine = None;
        let mut rebooted = false;
        if let Some(marker) = read_opt(&quarantine_path)? {
            quarantine = Some(String::from_utf8_lossy(&marker).trim().to_owned());
        } else {
            match read_opt(&checkpoint_path)? {
                None => {
                    write_file_atomic(&checkpoint_path, &ckpt::encode(None)).map_err(|e| {
                        DraError::CheckpointWrite {
                            path: checkpoint_path.clone(),
                            reason: e.to_string(),
                        }
                    })?;
                }
                Some(bytes) => match ckpt::decode(&bytes) {
                    Ok(cp) => {
                        let (prev_boot, prepared) = read_prepared(&prepared_path)?;
                        rebooted = prev_boot.as_deref().is_some_and(|b| b != boot_id);
                        let same_boot = prev_boot.as_deref() == Some(boot_id.as_str());
                        for state in cp.claims.unwrap_or_default() {
                            let mut c = CachedClaim::from_state(state);
                            c.prepared = same_boot && prepared.contains(&c.uid);
                            entries.insert(key(&c.namespace, &c.name), c);
                        }
                    }
                    Err(err) => {
                        let moved = move_aside(&checkpoint_path, aside::CORRUPT)
                            .map_err(io_err("moving aside", &checkpoint_path))?;
                        let detail = format!(
                            "{} could not be loaded ({err}); moved aside to {}",
                            checkpoint_path.display(),
                            moved.display()
                        );
                        warn!(%detail, "DRA checkpoint corrupt; claim state is unknown");
                        write_file_atomic(&quarantine_path, detail.as_bytes()).map_err(|e| {
                            DraError::CheckpointWrite {
                                path: quarantine_path.clone(),
                                reason: e.to_string(),
                            }
                        })?;
                        quarantine = Some(detail);
                    }
                },
            }
        }
        if rebooted {
            info!(
                claims = entries.len(),
                "node rebooted since the DRA claims were prepared; they will be prepared again"
            );
        }
        Ok(ClaimCache {
            shared: Arc::new(Shared {
                registry,
                checkpoint_path,
                prepared_path,
                quarantine_path,
                boot_id,
                rebooted,
                state: Mutex::new(CacheState {
                    entries,
                    quarantine,
                    allocated: HashMap::new(),
                }),
                claim_locks: Mutex::default(),
                write_lock: Mutex::default(),
                changes: AtomicU64::new(0),
                metrics: OnceLock::new(),
            }),
        })
    }

    /// Operator recovery after a corrupt checkpoint: removes the quarantine marker. The next
    /// [`ClaimCache::open`] starts from whatever `dra_manager_state` the operator left (none =
    /// empty). Drain the node first: claims prepared before the damage are not unprepared.
    pub fn recover(state_dir: &Path) -> Result<bool, DraError> {
        let own_dir = state_dir.join(DEVICELET_DIR);
        let marker = own_dir.join(QUARANTINE_FILE);
        match std::fs::remove_file(&marker) {
            Ok(()) => {
                sync_dir(&own_dir).map_err(io_err("fsync", &own_dir))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("removing", &marker)(e)),
        }
    }

    /// The cached entries of `keys` as they are now, for [`ClaimCache::restore_entries`].
    pub(super) fn save_entries<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a String>,
    ) -> Vec<(String, Option<CachedClaim>)> {
        let st = self.state();
        keys.into_iter()
            .map(|k| (k.clone(), st.entries.get(k).cloned()))
            .collect()
    }

    /// Puts entries back as saved: a change whose write failed must not stay in memory only
    /// (the caller holds the claims' locks, so nobody else changed them meanwhile).
    fn restore_entries(&self, saved: Vec<(String, Option<CachedClaim>)>) {
        let mut st = self.state();
        for (k, entry) in saved {
            match entry {
                Some(entry) => st.entries.insert(k, entry),
                None => st.entries.remove(&k),
            };
        }
    }

    /// Makes the change just made in memory durable: `checkpoint` and/or the prepared
    /// `marks`; when that fails, the entries are put back as `saved` and the error returned.
    ///
    /// Group commit, off the async threads: the write (file and directory fsyncs) runs on a
    /// blocking thread, and one write covers every change made before its snapshot, so pods
    /// preparing at once share writes instead of queueing one full rewrite each (the kubelet
    /// writes the whole checkpoint once per claim change, in its pod worker). A change that a
    /// write started after it already covers returns without writing.
    pub(super) async fn persist_or_restore(
        &self,
        checkpoint: bool,
        marks: bool,
        saved: Vec<(String, Option<CachedClaim>)>,
    ) -> Result<(), DraError> {
        // Counted after the change is in memory: a snapshot taken once this count is visible
        // contains the change.
        let change = self.shared.changes.fetch_add(1, Ordering::SeqCst) + 1;
        let cache = self.clone();
        let path = self.shared.checkpoint_path.clone();
        tokio::task::spawn_blocking(move || cache.persist_change(change, checkpoint, marks, saved))
            .await
            .unwrap_or_else(|join| {
                Err(DraError::CheckpointWrite {
                    path,
                    reason: format!("write task failed: {join}"),
                })
            })
    }

    /// [`Self::persist_or_restore`] on the blocking thread.
    fn persist_change(
        &self,
        change: u64,
        checkpoint: bool,
        marks: bool,
        saved: Vec<(String, Option<CachedClaim>)>,
    ) -> Result<(), DraError> {
        let mut written = self
            .shared
            .write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let checkpoint = checkpoint && written.checkpoint < change;
        let marks = marks && written.marks < change;
        if !checkpoint && !marks {
            return Ok(());
        }
        // Read before the snapshot: every change counted up to here is in it.
        let covers = self.shared.changes.load(Ordering::SeqCst);
        match self.write_files(checkpoint, marks) {
            Ok(()) => {
                if checkpoint {
                    written.checkpoint = covers;
                }
                if marks {
                    written.marks = covers;
                }
                Ok(())
            }
            Err(e) => {
                warn!(error = %e, "DRA state could not be written; the change is undone in memory");
                // Undone while the write lock is held, so no later write can still pick the
                // failed change up.
                self.restore_entries(saved);
                Err(e)
            }
        }
    }

    /// Writes the checkpoint and/or the prepared marks from the current state, durably (the
    /// caller holds the write lock).
    fn write_files(&self, checkpoint: bool, prepared: bool) -> Result<(), DraError> {
        let (bytes, marks) = {
            let st = self.state();
            let mut list: Vec<&CachedClaim> = st.entries.values().collect();
            list.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            let bytes = checkpoint.then(|| {
                let states: Vec<ClaimInfoState> = list.iter().map(|c| c.to_state()).collect();
                ckpt::encode(Some(&states))
            });
            let marks = prepared.then(|| {
                let mut s = self.shared.boot_id.clone();
                s.push('\n');
                for c in list.iter().filter(|c| c.prepared) {
                    s.push_str(&c.uid);
                    s.push('\n');
                }
                s
            });
            (bytes, marks)
        };
        let write_checkpoint = |bytes: Vec<u8>| {
            write_file_atomic(&self.shared.checkpoint_path, &bytes).map_err(|e| {
                DraError::CheckpointWrite {
                    path: self.shared.checkpoint_path.clone(),
                    reason: e.to_string(),
                }
            })
        };
        let write_marks = |marks: String| {
            write_file_atomic(&self.shared.prepared_path, marks.as_bytes()).map_err(|e| {
                DraError::CheckpointWrite {
                    path: self.shared.prepared_path.clone(),
                    reason: e.to_string(),
                }
            })
        };
        // The devices first, then the marks that say they are prepared: a mark never claims
        // a preparation whose devices are not on disk.
        if let Some(bytes) = bytes {
            write_checkpoint(bytes)?;
        }
        if let Some(marks) = marks {
            write_marks(marks)?;
        }
        Ok(())
    }
}

fn read_prepared(path: &Path) -> Result<(Option<String>, HashSet<String>), DraError> {
    let Some(bytes) = read_opt(path)? else {
        return Ok((None, HashSet::new()));
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    let boot = lines
        .next()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty());
    let uids = lines
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    Ok((boot, uids))
}
