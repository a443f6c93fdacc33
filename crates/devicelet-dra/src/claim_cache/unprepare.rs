//! `UnprepareResources(pod)` (spec dra-kubelet.md B9–B10; `pkg/kubelet/cm/dra/manager.go`
//! `UnprepareResources`): works from the cache alone; shared claims lose the pod reference, the
//! others get one NodeUnprepareResources per driver. Upstream bug E2 (unprepare of a claim the pod
//! never referenced) is fixed here, E11 (the dropped reference written at once) too.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use crate::client::ClaimRef;
use crate::error::{DraError, RpcCode};

use super::cache::ClaimCache;
use super::cached_claim::{CachedClaim, key};

const UNPREPARE: &str = "NodeUnprepareResources";

impl ClaimCache {
    /// `UnprepareResources(pod)` (B9–B10): works from the cache alone (the claim and the pod
    /// may be gone from every API). Shared claims just lose the pod reference; claims only this
    /// pod uses get one NodeUnprepareResources per driver (instance chosen now, E8) and are
    /// dropped when all their drivers succeeded. On error the pod stays referenced, so
    /// [`ClaimCache::pod_might_need_to_unprepare`] stays true and a retry (or
    /// [`ClaimCache::reconcile_orphans`]) finishes the job.
    pub async fn unprepare_resources(&self, pod_uid: &str) -> Result<(), DraError> {
        let start = Instant::now();
        let result = self.unprepare_resources_inner(pod_uid).await;
        self.record_operation("UnprepareResources", result.is_err(), start.elapsed());
        result
    }

    async fn unprepare_resources_inner(&self, pod_uid: &str) -> Result<(), DraError> {
        self.check_quarantine()?;
        // Upstream bug E2: only claims that list this pod are considered.
        let keys: BTreeSet<String> = {
            let st = self.state();
            st.entries
                .iter()
                .filter(|(_, c)| c.pod_uids.contains(pod_uid))
                .map(|(k, _)| k.clone())
                .collect()
        };
        if keys.is_empty() {
            return Ok(());
        }
        let _guards = self.lock_claims(&keys).await;
        let result = self.unprepare_locked(pod_uid, &keys).await;
        self.prune_locks(&keys);
        result
    }

    async fn unprepare_locked(
        &self,
        pod_uid: &str,
        keys: &BTreeSet<String>,
    ) -> Result<(), DraError> {
        let mut to_unprepare: Vec<CachedClaim> = Vec::new();
        let mut refs_dropped = false;
        let mut marks_cleared = false;
        let before = self.save_entries(keys);
        {
            let mut st = self.state();
            for k in keys {
                let Some(entry) = st.entries.get_mut(k) else {
                    continue;
                };
                if !entry.pod_uids.contains(pod_uid) {
                    continue;
                }
                if entry.pod_uids.len() > 1 {
                    entry.pod_uids.remove(pod_uid);
                    refs_dropped = true;
                } else if entry.drivers.is_empty() {
                    st.entries.remove(k);
                    refs_dropped = true;
                } else {
                    marks_cleared |= entry.prepared;
                    entry.prepared = false;
                    to_unprepare.push(entry.clone());
                }
            }
        }
        // E11: the dropped shared reference is durable at once; the "prepared" mark is gone
        // durably before any driver starts tearing the claim down.
        if refs_dropped || marks_cleared {
            self.persist_or_restore(refs_dropped, marks_cleared, before)
                .await?;
        }
        if to_unprepare.is_empty() {
            return Ok(());
        }
        let mut batches: BTreeMap<String, Vec<ClaimRef>> = BTreeMap::new();
        for c in &to_unprepare {
            for d in c.drivers.keys() {
                batches.entry(d.clone()).or_default().push(c.claim_ref());
            }
        }
        let calls = batches.into_iter().map(|(driver, claims)| async move {
            let result = match self.shared.registry.get(&driver) {
                Err(e) => Err(e),
                Ok(inst) => {
                    let start = Instant::now();
                    let result = inst
                        .client
                        .node_unprepare_resources(claims.clone(), inst.call_timeout)
                        .await;
                    let code = result.as_ref().map_or_else(|e| e.code, |_| RpcCode::Ok);
                    self.record_rpc(
                        &driver,
                        inst.service.unprepare_method(),
                        code,
                        start.elapsed(),
                    );
                    result.map_err(|source| DraError::Rpc {
                        method: UNPREPARE,
                        source,
                    })
                }
            };
            (driver, claims, result)
        });
        let answers = futures::future::join_all(calls).await;
        let mut errors = Vec::new();
        let mut ok: HashMap<String, usize> = HashMap::new();
        for (_driver, claims, result) in answers {
            let response = match result {
                Ok(r) => r,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let uids: HashSet<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
            if let Some(uid) = response.keys().find(|u| !uids.contains(u.as_str())) {
                errors.push(DraError::UnknownClaimUid {
                    method: UNPREPARE,
                    uid: uid.clone(),
                });
                continue;
            }
            for c in &claims {
                match response.get(&c.uid) {
                    None => {}
                    Some(err) if !err.is_empty() => errors.push(DraError::ClaimFailed {
                        method: UNPREPARE,
                        claim: c.name.clone(),
                        error: err.clone(),
                    }),
                    Some(_) => *ok.entry(c.uid.clone()).or_default() += 1,
                }
            }
            let skipped = claims.len().saturating_sub(response.len());
            if skipped > 0 {
                errors.push(DraError::Skipped {
                    method: UNPREPARE,
                    count: skipped,
                });
            }
        }
        let mut removed = false;
        let unprepared = self.save_entries(keys);
        {
            let mut st = self.state();
            for c in &to_unprepare {
                if ok.get(&c.uid).copied() == Some(c.drivers.len()) {
                    st.entries.remove(&key(&c.namespace, &c.name));
                    removed = true;
                }
            }
        }
        // Not durable: the claims stay cached and referenced, so the unprepare is retried.
        if removed {
            self.persist_or_restore(true, false, unprepared).await?;
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(DraError::Multiple(errors)),
        }
    }
}
