//! `PrepareResources(pod)` (spec dra-kubelet.md B1–B7; `pkg/kubelet/cm/dra/manager.go`
//! `PrepareResources`): validates the pod's claims, records the pod reference durably, sends one
//! NodePrepareResources per driver, and reports success only once the devices are durable.
//! Upstream bugs E1 (device lists appended) and E4 (the same claim twice) are fixed here.
//!
//! Not upstream, defence in depth (issue 25): a claim whose allocation names a device that
//! another claim prepared on this node holds is refused with [`DraError::DeviceInUse`] naming
//! both claims, unless one of them has admin access or both hold shares of a device that
//! allows multiple allocations (consumable capacity). The kubelet trusts the scheduler; two
//! schedulers allocating one driver's devices would otherwise give one GPU to two pods. The
//! pod waits (cluster mode retries with `FailedPrepareDynamicResources`) until the other claim
//! is unprepared. Entries restored from the checkpoint are checked once a pod re-records them
//! (the checkpoint does not say which devices were taken with admin access).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::client::ClaimRef;
use crate::error::{DraError, RpcCode};
use crate::pod::distinct_pod_claim_names;
use crate::registry::DraPluginInstance;
use crate::source::ClaimSource;

use super::cache::{AllocatedDevice, CacheState, ClaimCache};
use super::cached_claim::{CachedClaim, key};

const PREPARE: &str = "NodePrepareResources";

/// A claim validated for a pod (B2), ready to be recorded.
struct ValidatedClaim {
    key: String,
    claim: ClaimRef,
    /// Driver → instance fixed at validation time (E8).
    drivers: BTreeMap<String, DraPluginInstance>,
    /// The allocation's devices (the device-in-use check).
    devices: Vec<AllocatedDevice>,
}

/// The first device of `v` that another live entry holds, with that entry's key.
fn device_in_use(st: &CacheState, v: &ValidatedClaim) -> Option<(String, String)> {
    for (other_key, (other_uid, devices)) in &st.allocated {
        let live = st
            .entries
            .get(other_key)
            .is_some_and(|e| e.uid == *other_uid);
        if !live || *other_uid == v.claim.uid {
            continue;
        }
        for mine in &v.devices {
            if let Some(theirs) = devices.iter().find(|d| d.same_device(mine))
                && !mine.may_share_with(theirs)
            {
                let device = format!("{}/{}/{}", mine.driver, mine.pool, mine.device);
                return Some((device, other_key.clone()));
            }
        }
    }
    None
}

/// Where the time of one successful [`ClaimCache::prepare_resources`] went (the pod start-up
/// record of cluster mode).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrepareTimings {
    /// Reading the pod's claims from the claim source (concurrent GETs: the slowest one).
    pub claim_get: Duration,
    /// The drivers' NodePrepareResources calls (concurrent, one per driver: the slowest one).
    pub driver: Duration,
    /// Writing `dra_manager_state` and the prepared marks (the pod reference before the
    /// drivers are called, the devices after).
    pub checkpoint: Duration,
}

impl ClaimCache {
    /// B1–B2: resolves, fetches and validates the pod's claims without changing any state.
    async fn validate_pod(
        &self,
        pod: &Pod,
        source: &dyn ClaimSource,
    ) -> Result<Vec<ValidatedClaim>, DraError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        // Upstream bug E4: each claim once.
        let names = distinct_pod_claim_names(pod)?;
        // One GET per claim, all at once: a pod's claims do not wait for each other's round
        // trips (the kubelet reads them one after another).
        let fetched = futures::future::join_all(
            names
                .iter()
                .map(|pc| source.get_claim(&namespace, &pc.claim_name)),
        )
        .await;
        let mut seen_uids = HashSet::new();
        let mut out = Vec::new();
        for (pc, fetched) in names.into_iter().zip(fetched) {
            let claim: ResourceClaim =
                fetched.map_err(|e| DraError::fetch_claim(&pc.claim_name, &e))?;
            let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
            if !seen_uids.insert(claim_uid.clone()) {
                continue;
            }
            // KEP-4671 (DRAWorkloadResourceClaims, spec workloads.md W47, W50): a claim made
            // for the pod's PodGroup from a PodGroup template, and reserved for that PodGroup,
            // serves every member pod, as upstream's `IsForPod` / `IsReservedForPod` decide.
            let group = crate::pod::pod_group_name(pod);
            if pc.from_template {
                let owned = claim.metadata.owner_references.iter().flatten().any(|o| {
                    o.controller == Some(true)
                        && (o.uid == pod_uid || crate::pod::is_pod_group_owner(o, group))
                });
                if !owned {
                    return Err(DraError::NotOwner {
                        namespace: namespace.clone(),
                        claim: pc.claim_name.clone(),
                        pod: pod_name.clone(),
                    });
                }
            }
            let status = claim.status.as_ref();
            let reserved = status
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| {
                    r.iter()
                        .any(|c| c.uid == pod_uid || crate::pod::is_pod_group_consumer(c, group))
                });
            if !reserved {
                return Err(DraError::NotReserved {
                    pod: pod_name.clone(),
                    pod_uid: pod_uid.clone(),
                    claim: pc.claim_name.clone(),
                    claim_uid,
                });
            }
            let Some(allocation) = status.and_then(|s| s.allocation.as_ref()) else {
                return Err(DraError::NotAllocated(pc.claim_name.clone()));
            };
            let mut drivers = BTreeMap::new();
            let mut devices = Vec::new();
            for r in allocation
                .devices
                .as_ref()
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
            {
                devices.push(AllocatedDevice {
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    admin_access: r.admin_access == Some(true),
                    share_id: r.share_id.clone(),
                });
                if !drivers.contains_key(&r.driver) {
                    // B2.5 / E7: every driver must be registered, even for prepared claims.
                    let inst = self.shared.registry.get(&r.driver)?;
                    drivers.insert(r.driver.clone(), inst);
                }
            }
            out.push(ValidatedClaim {
                key: key(&namespace, &pc.claim_name),
                claim: ClaimRef {
                    namespace: namespace.clone(),
                    uid: claim_uid,
                    name: pc.claim_name,
                },
                drivers,
                devices,
            });
        }
        Ok(out)
    }

    /// `PrepareResources(pod)` (B1–B7): validates the pod's claims, records the pod reference
    /// durably, sends one NodePrepareResources per driver for the claims not yet prepared, and
    /// returns only after the devices are durable in the checkpoint.
    /// Returns where the time went.
    pub async fn prepare_resources(
        &self,
        pod: &Pod,
        source: &dyn ClaimSource,
    ) -> Result<PrepareTimings, DraError> {
        let start = Instant::now();
        let result = self.prepare_resources_inner(pod, source).await;
        self.record_operation("PrepareResources", result.is_err(), start.elapsed());
        result
    }

    async fn prepare_resources_inner(
        &self,
        pod: &Pod,
        source: &dyn ClaimSource,
    ) -> Result<PrepareTimings, DraError> {
        self.check_quarantine()?;
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut timings = PrepareTimings::default();
        let fetching = Instant::now();
        let validated = self.validate_pod(pod, source).await?;
        timings.claim_get = fetching.elapsed();
        if validated.is_empty() {
            return Ok(timings);
        }
        let keys: BTreeSet<String> = validated.iter().map(|v| v.key.clone()).collect();
        let _guards = self.lock_claims(&keys).await;
        let result = self
            .prepare_locked(&pod_uid, &validated, &mut timings)
            .await;
        self.prune_locks(&keys);
        result.map(|()| timings)
    }

    async fn prepare_locked(
        &self,
        pod_uid: &str,
        validated: &[ValidatedClaim],
        timings: &mut PrepareTimings,
    ) -> Result<(), DraError> {
        // B3: record the intent. All UID checks first, so nothing is recorded on mismatch.
        let mut batches: BTreeMap<String, (DraPluginInstance, Vec<ClaimRef>)> = BTreeMap::new();
        let mut changed = false;
        let before = self.save_entries(validated.iter().map(|v| &v.key));
        {
            let mut st = self.state();
            for v in validated {
                if let Some(c) = st.entries.get(&v.key)
                    && c.uid != v.claim.uid
                {
                    return Err(DraError::UidMismatch {
                        name: v.claim.name.clone(),
                        cached_uid: c.uid.clone(),
                    });
                }
                if let Some((device, other)) = device_in_use(&st, v) {
                    return Err(DraError::DeviceInUse {
                        claim: v.key.clone(),
                        device,
                        other,
                    });
                }
            }
            let st = &mut *st;
            let entries = &st.entries;
            st.allocated
                .retain(|k, (uid, _)| entries.get(k).is_some_and(|e| e.uid == *uid));
            for v in validated {
                st.allocated
                    .insert(v.key.clone(), (v.claim.uid.clone(), v.devices.clone()));
            }
            for v in validated {
                let entry = st
                    .entries
                    .entry(v.key.clone())
                    .or_insert_with(|| CachedClaim {
                        uid: v.claim.uid.clone(),
                        name: v.claim.name.clone(),
                        namespace: v.claim.namespace.clone(),
                        pod_uids: BTreeSet::new(),
                        drivers: BTreeMap::new(),
                        prepared: false,
                    });
                changed |= entry.pod_uids.insert(pod_uid.to_owned());
                for d in v.drivers.keys() {
                    if !entry.drivers.contains_key(d) {
                        entry.drivers.insert(d.clone(), Vec::new());
                        changed = true;
                    }
                }
                if entry.prepared {
                    continue;
                }
                for (driver, inst) in &v.drivers {
                    batches
                        .entry(driver.clone())
                        .or_insert_with(|| (inst.clone(), Vec::new()))
                        .1
                        .push(v.claim.clone());
                }
            }
        }
        // E10: the pod reference is durable before any driver is called; if it cannot be
        // written it is not kept in memory either (a retry must write it again).
        if changed {
            let writing = Instant::now();
            self.persist_or_restore(true, false, before).await?;
            timings.checkpoint += writing.elapsed();
        }
        if batches.is_empty() {
            return Ok(());
        }
        let calling = Instant::now();
        let calls = batches
            .into_iter()
            .map(|(driver, (inst, claims))| async move {
                let start = Instant::now();
                let result = inst
                    .client
                    .node_prepare_resources(claims.clone(), inst.call_timeout)
                    .await;
                let code = result.as_ref().map_or_else(|e| e.code, |_| RpcCode::Ok);
                self.record_rpc(
                    &driver,
                    inst.service.prepare_method(),
                    code,
                    start.elapsed(),
                );
                (driver, claims, result)
            });
        let answers = futures::future::join_all(calls).await;
        timings.driver = calling.elapsed();

        let mut errors = Vec::new();
        // claim UID -> all of its drivers answered successfully so far
        let mut ok_drivers: HashMap<String, usize> = HashMap::new();
        let intended = self.save_entries(validated.iter().map(|v| &v.key));
        {
            let mut st = self.state();
            for (driver, claims, result) in answers {
                let response = match result {
                    Ok(r) => r,
                    Err(source) => {
                        errors.push(DraError::Rpc {
                            method: PREPARE,
                            source,
                        });
                        continue;
                    }
                };
                let by_uid: HashMap<&str, &ClaimRef> =
                    claims.iter().map(|c| (c.uid.as_str(), c)).collect();
                if let Some(uid) = response.keys().find(|u| !by_uid.contains_key(u.as_str())) {
                    errors.push(DraError::UnknownClaimUid {
                        method: PREPARE,
                        uid: uid.clone(),
                    });
                    continue;
                }
                for c in &claims {
                    match response.get(&c.uid) {
                        None => {}
                        Some(r) if !r.error.is_empty() => errors.push(DraError::ClaimFailed {
                            method: PREPARE,
                            claim: c.name.clone(),
                            error: r.error.clone(),
                        }),
                        Some(r) => {
                            if let Some(entry) = st.entries.get_mut(&key(&c.namespace, &c.name)) {
                                // Upstream bug E1: devices were appended on every re-prepare;
                                // this driver's answer replaces its list.
                                entry.drivers.insert(driver.clone(), r.devices.clone());
                                *ok_drivers.entry(c.uid.clone()).or_default() += 1;
                            }
                        }
                    }
                }
                let skipped = claims.len().saturating_sub(response.len());
                if skipped > 0 {
                    errors.push(DraError::Skipped {
                        method: PREPARE,
                        count: skipped,
                    });
                }
            }
            for v in validated {
                if ok_drivers.get(&v.claim.uid).copied() == Some(v.drivers.len())
                    && let Some(entry) = st.entries.get_mut(&v.key)
                {
                    entry.prepared = true;
                }
            }
        }
        // B5: durable before success is reported. Not durable: the devices are not kept in
        // memory only and the preparation is not claimed; the durable pod reference makes the
        // next attempt (or an unprepare) reach the drivers again.
        let writing = Instant::now();
        self.persist_or_restore(true, true, intended).await?;
        timings.checkpoint += writing.elapsed();
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(DraError::Multiple(errors)),
        }
    }
}
