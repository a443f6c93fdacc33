//! What the node shows of its claims: per-container claim devices (`admit` / `get pods` JSON),
//! CDI devices for container starts and `GET /v1/dra`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use devicelet_dra::pod::container_claim_requests;
use serde::{Deserialize, Serialize};

use super::health_cache::health_str;

use super::DraNodeError;
use super::node::{DraNode, find_container, lock};
use super::store::{key, ns_of};

/// One prepared device of a claim a container uses (the `claims` entries of `admit` JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDeviceView {
    /// ResourceClaim name.
    pub claim: String,
    /// ResourceClaim namespace.
    pub namespace: String,
    /// Request the container asked for (absent = the whole claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Fully-qualified CDI device names.
    pub cdi_devices: Vec<String>,
    /// ShareID of a consumable-capacity allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Device health from the driver's health stream: Healthy, Unhealthy or Unknown.
    pub health: String,
    /// The driver's health message, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_message: String,
}

/// What `GET /v1/dra` shows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DraSnapshot {
    /// Registered driver instances: driver, endpoint, service.
    pub drivers: Vec<DriverView>,
    /// Published ResourceSlices per driver (names).
    pub published_slices: BTreeMap<String, usize>,
    /// Claims in the claim cache: `namespace/name` → pod UIDs.
    pub cached_claims: BTreeMap<String, Vec<String>>,
    /// Pods whose claims still wait for a driver to unprepare them.
    pub pending_unprepare: Vec<String>,
    /// Why DRA is fail-closed (corrupt claim checkpoint or objects file), if it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<String>,
}

/// One registered driver instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriverView {
    /// Driver name.
    pub driver: String,
    /// DRA service socket.
    pub endpoint: PathBuf,
    /// Chosen service (`v1.DRAPlugin` or `v1beta1.DRAPlugin`).
    pub service: String,
}

impl DraNode {
    /// CDI device names for a container start (`GetResources`, B13).
    pub fn container_cdi_devices(
        &self,
        uid: &str,
        container: &str,
    ) -> Result<Vec<String>, DraNodeError> {
        let Some(pod) = self.pod(uid) else {
            return Ok(Vec::new());
        };
        let Some(c) = find_container(&pod, container) else {
            return Ok(Vec::new());
        };
        Ok(self.cache.container_cdi_devices(&pod, &c)?)
    }

    /// The prepared devices a container uses, with health (for `admit` and `get pods`).
    pub fn container_claims(&self, uid: &str, container: &str) -> Vec<ClaimDeviceView> {
        let Some(pod) = self.pod(uid) else {
            return Vec::new();
        };
        let Some(c) = find_container(&pod, container) else {
            return Vec::new();
        };
        let namespace = ns_of(&pod.metadata);
        let Ok(refs) = container_claim_requests(&pod, &c) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (claim_name, request) in refs {
            let Some(cached) = self.cache.get(&namespace, &claim_name) else {
                continue;
            };
            for (driver, devices) in &cached.drivers {
                for d in devices {
                    let serves = request.as_deref().is_none_or(|r| {
                        d.request_names.is_empty() || d.request_names.iter().any(|n| n == r)
                    });
                    if !serves {
                        continue;
                    }
                    let (health, message) = self.health.get(driver, &d.pool_name, &d.device_name);
                    out.push(ClaimDeviceView {
                        claim: claim_name.clone(),
                        namespace: namespace.clone(),
                        request: request.clone(),
                        driver: driver.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        cdi_devices: d.cdi_device_ids.clone(),
                        share_id: d.share_id.clone(),
                        health: health_str(health).to_owned(),
                        health_message: message,
                    });
                }
            }
        }
        out
    }

    /// `GET /v1/dra`.
    pub fn snapshot(&self) -> DraSnapshot {
        DraSnapshot {
            drivers: self
                .registry
                .list()
                .into_iter()
                .map(|(driver, endpoint, service)| DriverView {
                    driver,
                    endpoint,
                    service: service.as_str().to_owned(),
                })
                .collect(),
            published_slices: lock(&self.published)
                .iter()
                .map(|(d, s)| (d.clone(), s.len()))
                .collect(),
            cached_claims: self
                .cache
                .claims()
                .into_iter()
                .map(|c| (key(&c.namespace, &c.name), c.pod_uids.into_iter().collect()))
                .collect(),
            pending_unprepare: self.pending_unprepare(),
            quarantine: self.quarantine(),
        }
    }

    /// Why DRA is fail-closed, if it is: the claim cache's and the objects' quarantine.
    pub fn quarantine(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.cache.quarantined() {
            out.push(format!(
                "{}: claim checkpoint unreadable; prepare/unprepare refused",
                devicelet_dra::claim_cache::QUARANTINE_FILE
            ));
        }
        if let Some(detail) = self.store.quarantine() {
            out.push(detail.to_owned());
        }
        out
    }
}
