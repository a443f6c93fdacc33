//! [`CachedClaim`]: one entry of the claim cache (`ClaimInfo` of
//! `pkg/kubelet/cm/dra/claiminfo.go`) and its conversion to and from the `dra_manager_state`
//! entry (`ClaimInfoState` of `pkg/kubelet/cm/dra/state/`).

use std::collections::{BTreeMap, BTreeSet};

use devicelet_checkpoint::dra::{ClaimInfoState, DraDevice, DriverState};

use crate::client::{ClaimRef, PreparedDevice};

/// A cached claim (`ClaimInfo`), as reported to callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedClaim {
    /// Claim UID.
    pub uid: String,
    /// Claim name.
    pub name: String,
    /// Claim namespace.
    pub namespace: String,
    /// Pods using the claim.
    pub pod_uids: BTreeSet<String>,
    /// Devices per driver (every driver of the allocation has a key).
    pub drivers: BTreeMap<String, Vec<PreparedDevice>>,
    /// Whether the drivers prepared it on this boot.
    pub prepared: bool,
}

impl CachedClaim {
    pub(super) fn claim_ref(&self) -> ClaimRef {
        ClaimRef {
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            name: self.name.clone(),
        }
    }

    pub(super) fn to_state(&self) -> ClaimInfoState {
        let list = |v: &[String]| (!v.is_empty()).then(|| v.to_vec());
        ClaimInfoState {
            claim_uid: self.uid.clone(),
            claim_name: self.name.clone(),
            namespace: self.namespace.clone(),
            pod_uids: Some(self.pod_uids.clone()),
            driver_state: Some(
                self.drivers
                    .iter()
                    .map(|(driver, devices)| {
                        let devices = (!devices.is_empty()).then(|| {
                            devices
                                .iter()
                                .map(|d| DraDevice {
                                    pool_name: d.pool_name.clone(),
                                    device_name: d.device_name.clone(),
                                    share_id: d.share_id.clone(),
                                    request_names: list(&d.request_names),
                                    cdi_device_ids: list(&d.cdi_device_ids),
                                })
                                .collect()
                        });
                        (driver.clone(), DriverState { devices })
                    })
                    .collect(),
            ),
        }
    }

    pub(super) fn from_state(s: ClaimInfoState) -> Self {
        CachedClaim {
            uid: s.claim_uid,
            name: s.claim_name,
            namespace: s.namespace,
            pod_uids: s.pod_uids.unwrap_or_default(),
            drivers: s
                .driver_state
                .unwrap_or_default()
                .into_iter()
                .map(|(driver, st)| {
                    let devices = st
                        .devices
                        .unwrap_or_default()
                        .into_iter()
                        .map(|d| PreparedDevice {
                            request_names: d.request_names.unwrap_or_default(),
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: d.cdi_device_ids.unwrap_or_default(),
                            share_id: d.share_id,
                        })
                        .collect();
                    (driver, devices)
                })
                .collect(),
            prepared: false,
        }
    }

    /// CDI IDs of the devices serving `request` (`None` = whole claim). Exact request match as
    /// the kubelet (E19); devices without request names serve every request.
    pub fn cdi_ids_for(&self, request: Option<&str>) -> impl Iterator<Item = &String> {
        self.drivers
            .values()
            .flatten()
            .filter(move |d| match request {
                None => true,
                Some(r) => d.request_names.is_empty() || d.request_names.iter().any(|n| n == r),
            })
            .flat_map(|d| d.cdi_device_ids.iter())
    }
}

/// The cache key of a claim: `namespace/name`.
pub(super) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}
