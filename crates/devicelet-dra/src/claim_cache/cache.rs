//! [`ClaimCache`] and its shared state: the claim entries (the kubelet's `claimInfoCache`,
//! `pkg/kubelet/cm/dra/claiminfo.go`), the quarantine, the per-claim locks and the file paths.
//! The operations are in the sibling files (`prepare.rs`, `unprepare.rs`, `persistence.rs`,
//! `orphans.rs`, `queries.rs`, `locks.rs`, `metrics.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use devicelet_metrics::Metrics;

use crate::registry::DraPluginRegistry;

use super::cached_claim::CachedClaim;

/// The cached claims by `namespace/name`, and the quarantine detail while the state is unknown.
pub(super) struct CacheState {
    pub(super) entries: HashMap<String, CachedClaim>,
    pub(super) quarantine: Option<String>,
    /// The allocated devices of entries prepared (or re-recorded) by this process, by cache
    /// key with the claim UID: what the device-in-use check compares against. Not in the
    /// checkpoint (the kubelet's format has no place for it); a key whose entry is gone or has
    /// another UID is stale and ignored.
    pub(super) allocated: HashMap<String, (String, Vec<AllocatedDevice>)>,
}

/// One device of a claim's allocation, as far as sharing is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AllocatedDevice {
    pub(super) driver: String,
    pub(super) pool: String,
    pub(super) device: String,
    /// Admin access: may use a device in use by others.
    pub(super) admin_access: bool,
    /// Consumable capacity: one share of a device that allows multiple allocations.
    pub(super) share_id: Option<String>,
}

impl AllocatedDevice {
    /// Whether two allocations may hold this device at once.
    pub(super) fn may_share_with(&self, other: &AllocatedDevice) -> bool {
        self.admin_access
            || other.admin_access
            || (self.share_id.is_some() && other.share_id.is_some())
    }

    pub(super) fn same_device(&self, other: &AllocatedDevice) -> bool {
        self.driver == other.driver && self.pool == other.pool && self.device == other.device
    }
}

/// The DRA claim cache and prepare/unprepare logic; cheap to clone (shared state).
#[derive(Clone)]
pub struct ClaimCache {
    pub(super) shared: Arc<Shared>,
}

/// What every clone of a [`ClaimCache`] shares.
pub(super) struct Shared {
    pub(super) registry: DraPluginRegistry,
    pub(super) checkpoint_path: PathBuf,
    pub(super) prepared_path: PathBuf,
    pub(super) quarantine_path: PathBuf,
    pub(super) boot_id: String,
    pub(super) rebooted: bool,
    pub(super) state: Mutex<CacheState>,
    pub(super) claim_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Serialises snapshot+write so an older snapshot never overwrites a newer one; holds
    /// which change each file covers (group commit, `persistence.rs`).
    pub(super) write_lock: Mutex<Written>,
    /// Changes made in memory so far (each durable write covers every change counted before
    /// its snapshot).
    pub(super) changes: std::sync::atomic::AtomicU64,
    /// The node's metrics (B15); set once by whoever wires the node.
    pub(super) metrics: OnceLock<Metrics>,
}

/// The last change (of [`Shared::changes`]) each file's latest successful write covers.
#[derive(Debug, Default)]
pub(super) struct Written {
    pub(super) checkpoint: u64,
    pub(super) marks: u64,
}

impl std::fmt::Debug for ClaimCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimCache")
            .field("checkpoint", &self.shared.checkpoint_path)
            .field("claims", &self.state().entries.len())
            .finish()
    }
}

impl ClaimCache {
    /// The cache state, locked (a panic while holding it leaves plain data: keep going).
    pub(super) fn state(&self) -> MutexGuard<'_, CacheState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
