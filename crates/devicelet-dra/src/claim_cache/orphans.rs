//! Orphan reconciliation (spec dra-kubelet.md B11; the kubelet's `reconcileLoop` in
//! `pkg/kubelet/cm/dra/manager.go`): pods referenced by cached claims but no longer active still
//! owe an unprepare, which is retried until it succeeds.

use std::collections::{BTreeSet, HashSet};

use tracing::warn;

use crate::error::DraError;

use super::cache::ClaimCache;

impl ClaimCache {
    /// B11: pod UIDs referenced by cached claims but not in `active` — pods whose unprepare is
    /// still owed (force-deleted, removed while a driver was away, deleted during a restart).
    pub fn orphaned_pods(&self, active: &HashSet<String>) -> Vec<String> {
        let st = self.state();
        let set: BTreeSet<&String> = st
            .entries
            .values()
            .flat_map(|c| c.pod_uids.iter())
            .filter(|u| !active.contains(*u))
            .collect();
        set.into_iter().cloned().collect()
    }

    /// B11 reconcile pass: unprepares every orphaned pod; returns each pod's outcome. Call it
    /// periodically (the kubelet: every 60 s) so obligations survive pod removal.
    pub async fn reconcile_orphans(
        &self,
        active: &HashSet<String>,
    ) -> Vec<(String, Result<(), DraError>)> {
        let mut out = Vec::new();
        for uid in self.orphaned_pods(active) {
            let r = self.unprepare_resources(&uid).await;
            if let Err(e) = &r {
                warn!(pod_uid = %uid, error = %e, "unprepare of orphaned pod failed; will retry");
            }
            out.push((uid, r));
        }
        out
    }

    /// B11 loop: runs [`ClaimCache::reconcile_orphans`] now and then every `period` (the
    /// kubelet uses 60 s) with the active pod UIDs from `active_pods`, until `shutdown` turns
    /// true. Spawn it once all pod sources are ready.
    pub async fn run_orphan_reconciler<F>(
        self,
        period: std::time::Duration,
        active_pods: F,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) where
        F: Fn() -> HashSet<String> + Send,
    {
        loop {
            if *shutdown.borrow() {
                return;
            }
            self.reconcile_orphans(&active_pods()).await;
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
