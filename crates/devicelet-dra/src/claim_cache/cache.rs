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
    /// Serialises snapshot+write so an older snapshot never overwrites a newer one.
    pub(super) write_lock: Mutex<()>,
    /// The node's metrics (B15); set once by whoever wires the node.
    pub(super) metrics: OnceLock<Metrics>,
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
