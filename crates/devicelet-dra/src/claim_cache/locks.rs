//! Per-claim async locks, held across the driver RPCs of prepare and unprepare so the two never
//! interleave for one claim (upstream bug E3 of `pkg/kubelet/cm/dra/manager.go`).

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError};

use tokio::sync::OwnedMutexGuard;

use super::cache::ClaimCache;

impl ClaimCache {
    /// Locks the claims in sorted key order (no deadlock between pods).
    pub(super) async fn lock_claims(&self, keys: &BTreeSet<String>) -> Vec<OwnedMutexGuard<()>> {
        let mut guards = Vec::with_capacity(keys.len());
        for k in keys {
            let lock = {
                let mut locks = self
                    .shared
                    .claim_locks
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                Arc::clone(locks.entry(k.clone()).or_default())
            };
            guards.push(lock.lock_owned().await);
        }
        guards
    }

    /// Drops lock-table entries nobody else holds or waits for; call while still holding the
    /// guards, after every mutation.
    pub(super) fn prune_locks(&self, keys: &BTreeSet<String>) {
        let mut locks = self
            .shared
            .claim_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for k in keys {
            // Map + our guard's Arc = 2.
            if locks.get(k).is_some_and(|l| Arc::strong_count(l) <= 2) {
                locks.remove(k);
            }
        }
    }
}
