//! Reads of the claim cache: the cached claims, `dra_resource_claims_in_use` counts, the
//! quarantine, B12 `PodMightNeedToUnprepareResources` and B13 `GetResources` (the container's CDI
//! device IDs), as in `pkg/kubelet/cm/dra/manager.go`.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::error::DraError;
use crate::pod::container_claim_requests;
use crate::registry::DraPluginRegistry;

use super::cache::ClaimCache;
use super::cached_claim::{CachedClaim, key};

impl ClaimCache {
    /// The registry used to reach drivers.
    pub fn registry(&self) -> &DraPluginRegistry {
        &self.shared.registry
    }

    /// The boot ID this cache runs under.
    pub fn boot_id(&self) -> &str {
        &self.shared.boot_id
    }

    /// Whether the node rebooted since claims were last prepared (restored claims are then
    /// not prepared and will be re-prepared on their next sandbox creation).
    pub fn rebooted(&self) -> bool {
        self.shared.rebooted
    }

    /// Whether the claim state is unknown (corrupt checkpoint, awaiting operator recovery).
    pub fn quarantined(&self) -> bool {
        self.state().quarantine.is_some()
    }

    /// `Err(DraError::StateUnknown)` while quarantined (every prepare/unprepare fails so).
    pub fn check_quarantine(&self) -> Result<(), DraError> {
        match &self.state().quarantine {
            None => Ok(()),
            Some(detail) => Err(DraError::StateUnknown {
                detail: detail.clone(),
                marker: self.shared.quarantine_path.clone(),
            }),
        }
    }

    /// Snapshot of every cached claim, sorted by namespace/name.
    pub fn claims(&self) -> Vec<CachedClaim> {
        let st = self.state();
        let mut v: Vec<_> = st.entries.values().cloned().collect();
        v.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        v
    }

    /// One cached claim.
    pub fn get(&self, namespace: &str, name: &str) -> Option<CachedClaim> {
        self.state().entries.get(&key(namespace, name)).cloned()
    }

    /// `dra_resource_claims_in_use`: prepared claims per driver plus `"<any>"` (B15).
    pub fn claims_in_use(&self) -> BTreeMap<String, usize> {
        let st = self.state();
        let mut out = BTreeMap::from([("<any>".to_owned(), 0)]);
        for c in st.entries.values().filter(|c| c.prepared) {
            *out.entry("<any>".to_owned()).or_default() += 1;
            for d in c.drivers.keys() {
                *out.entry(d.clone()).or_default() += 1;
            }
        }
        out
    }

    /// B12: whether any cached claim still lists the pod (or state is unknown). While true, no
    /// terminal phase may be reported for the pod (B19).
    pub fn pod_might_need_to_unprepare(&self, pod_uid: &str) -> bool {
        let st = self.state();
        st.quarantine.is_some() || st.entries.values().any(|c| c.pod_uids.contains(pod_uid))
    }

    /// `GetResources(pod, container)` (B13): the CDI device IDs for the container's
    /// `resources.claims`, for the runtime's `cdiDevices`. Unlike the kubelet (E19) the list is
    /// de-duplicated (first occurrence kept): a device serving two referenced requests would
    /// otherwise be injected twice.
    pub fn container_cdi_devices(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Vec<String>, DraError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let refs = container_claim_requests(pod, container)?;
        let st = self.state();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (claim_name, request) in refs {
            let Some(c) = st.entries.get(&key(&namespace, &claim_name)) else {
                return Err(DraError::NotCached {
                    namespace: namespace.clone(),
                    claim: claim_name,
                });
            };
            for id in c.cdi_ids_for(request.as_deref()) {
                if seen.insert(id.clone()) {
                    out.push(id.clone());
                }
            }
        }
        Ok(out)
    }
}
