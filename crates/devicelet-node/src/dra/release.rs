//! Removal of a pod's claims (`UnprepareResources`): unprepare from cached information, then
//! release; an unprepare that fails is retried in the background until the driver answers and
//! the claim is not released before that (B19). Pending unprepares run before any new prepare.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::node::{DraNode, lock};
use super::{ClaimOrigin, DraNodeError};

/// How often an unchanged unprepare failure of one pod is logged at warning level.
const UNPREPARE_WARN_EVERY: Duration = Duration::from_secs(60);

impl DraNode {
    /// The pod is gone: unprepare its claims from cached information (works when the claim
    /// objects are gone), then release them (reservation dropped; a claim nobody reserves is
    /// deallocated; template claims owned by the pod are deleted). If a driver does not answer,
    /// the pod stays pending and is retried in the background; nothing is released before the
    /// driver unprepared (B19).
    pub async fn remove(&self, uid: &str) -> Result<(), DraNodeError> {
        // Fail-closed: not pending either (nothing to retry until recovery).
        self.store.check_quarantine()?;
        let _serial = self.admission.lock().await;
        match self.release_pod_locked(uid).await {
            Ok(()) => {
                lock(&self.pending).remove(uid);
                Ok(())
            }
            Err(e) => {
                lock(&self.pending).insert(uid.to_owned());
                Err(e)
            }
        }
    }

    pub(super) async fn release_pod_locked(&self, uid: &str) -> Result<(), DraNodeError> {
        self.cache.unprepare_resources(uid).await?;
        if let ClaimOrigin::Api(_) = self.origin {
            // From the checkpoint only (no API call, so a force-deleted pod's claims are
            // released too); reservations and deallocation are the control plane's.
            self.store.update(|o| {
                o.pods.remove(uid);
            })?;
            info!(pod_uid = %uid, "claims unprepared");
            return Ok(());
        }
        self.store.update(|o| {
            o.pods.remove(uid);
            let mut drop = Vec::new();
            for (k, c) in o.resource_claims.iter_mut() {
                let Some(status) = c.status.as_mut() else {
                    continue;
                };
                let Some(reserved) = status.reserved_for.as_mut() else {
                    continue;
                };
                let before = reserved.len();
                reserved.retain(|r| r.uid != uid);
                if reserved.len() == before {
                    continue;
                }
                if reserved.is_empty() {
                    status.reserved_for = None;
                    status.allocation = None;
                    let owned = c
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.controller == Some(true) && r.uid == uid);
                    if owned {
                        drop.push(k.clone());
                    }
                }
            }
            for k in drop {
                o.resource_claims.remove(&k);
            }
        })?;
        info!(pod_uid = %uid, "claims unprepared and released");
        Ok(())
    }

    /// Retries pending unprepares once; returns how many are still pending.
    pub async fn retry_pending(&self) -> usize {
        if self.store.quarantine().is_some() || self.cache.quarantined() {
            return lock(&self.pending).len();
        }
        let pending: Vec<String> = lock(&self.pending).iter().cloned().collect();
        for uid in pending {
            let _serial = self.admission.lock().await;
            self.retry_unprepare_locked(&uid).await;
        }
        lock(&self.pending).len()
    }

    /// [`Self::retry_pending`] with the admission lock already held.
    pub(super) async fn unprepare_pending_locked(&self) {
        let pending: Vec<String> = lock(&self.pending).iter().cloned().collect();
        for uid in pending {
            self.retry_unprepare_locked(&uid).await;
        }
    }

    pub(super) async fn retry_unprepare_locked(&self, uid: &str) {
        match self.release_pod_locked(uid).await {
            Ok(()) => {
                lock(&self.pending).remove(uid);
                lock(&self.unprepare_warned).remove(uid);
            }
            Err(e) => {
                let text = e.to_string();
                let now = std::time::Instant::now();
                let mut warned = lock(&self.unprepare_warned);
                let repeat = warned.get(uid).is_some_and(|(last, at)| {
                    *last == text && now.duration_since(*at) < UNPREPARE_WARN_EVERY
                });
                if repeat {
                    debug!(pod_uid = %uid, error = %text, "unprepare still failing; will retry");
                } else {
                    warn!(pod_uid = %uid, error = %text, "unprepare still failing; will retry (same error logged at debug level for a minute)");
                    warned.insert(uid.to_owned(), (text, now));
                }
            }
        }
    }

    /// Pods waiting for a driver to unprepare them.
    pub fn pending_unprepare(&self) -> Vec<String> {
        lock(&self.pending).iter().cloned().collect()
    }

    /// Background work until `shutdown`: pending unprepares retried every `period`.
    pub async fn run(self: Arc<Self>, period: Duration, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => return,
            }
            if !lock(&self.pending).is_empty() {
                self.retry_pending().await;
            }
            if !lock(&self.reprepare).is_empty() {
                self.prepare_again().await;
            }
        }
    }

    /// Cluster mode after a reboot: prepares the claims of the recorded pods again, once each.
    /// A pod whose driver has not registered again yet is retried on the next call; any other
    /// failure is logged and the pod dropped (its claims stay as the checkpoint says). Returns
    /// how many pods still wait.
    pub async fn prepare_again(&self) -> usize {
        let ClaimOrigin::Api(source) = &self.origin else {
            return 0;
        };
        let uids: Vec<String> = lock(&self.reprepare).iter().cloned().collect();
        for uid in uids {
            let Some(pod) = self.pod(&uid) else {
                // Removed meanwhile.
                lock(&self.reprepare).remove(&uid);
                continue;
            };
            match self.admit_from_api(&pod, source).await {
                Ok(_) => {
                    info!(pod_uid = %uid, "claims prepared again after a reboot");
                }
                Err(DraNodeError::Dra(e)) if e.is_driver_unavailable() => continue,
                Err(e) => {
                    warn!(pod_uid = %uid, error = %e, "preparing claims again after a reboot failed");
                }
            }
            lock(&self.reprepare).remove(&uid);
        }
        lock(&self.reprepare).len()
    }
}
