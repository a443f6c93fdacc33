//! Resource health in pod status (KEP-4680, gate `ResourceHealthStatus`, beta and on in 1.36),
//! following the device manager's `UpdateAllocatedResourcesStatus` (`dm/manager.go`, spec
//! devicemanager.md §2 E1): every app container that holds devices gets
//! `allocatedResourcesStatus`, one `{name: <resource>, resources: [{resourceID, health}]}` per
//! resource. `health` is `Healthy` when the device's current health is exactly `Healthy` and
//! `Unhealthy` for anything else; a device the plugin no longer reports counts as `Healthy`,
//! as upstream does. Init containers (including sidecars) are left alone: upstream only looks
//! at `status.containerStatuses`. Resources are in name order (upstream: map order).
//!
//! Deliberate difference: while the resource's plugin is not connected (stopped inside the
//! grace period, not back after a restart, or gone), its devices are `Unknown`. The 1.36
//! kubelet keeps reporting the last health the plugin sent (`allDevices` is not touched on
//! disconnect), so a pod keeps showing `Healthy` for a device nobody watches any more; and an
//! earlier devicelet reported `Unhealthy`, which claims a fault nobody observed. `Unknown` is
//! the API's own value for "no current information" (core/v1 `ResourceHealthStatus`) and what
//! the kubelet reports for DRA devices whose health stream ended.
//!
//! `message` (1.36, gate `ResourceHealthStatusMessage`) stays empty here: the device plugin
//! API v1beta1 `Device` carries only ID, health and topology, so there is nothing to report
//! (DRA devices get theirs from the driver's health stream, see `dra/health.rs`).
//!
//! The status is computed when pods are shown (`GET /v1/pods`, the watch), from the live
//! inventory, so a health change reaches the next answer without any bookkeeping.

use std::collections::{BTreeMap, HashMap};

use crate::admitted::AdmittedPod;
pub use crate::admitted::{ResourceHealth, ResourceStatus};
use devicelet_devicemanager::{ContainerKind, DeviceManager, HEALTHY, UNHEALTHY};

/// `ResourceHealthStatus` for a device whose plugin is not connected.
pub const UNKNOWN: &str = "Unknown";

/// Current health of every device, by resource and device ID; [`UNKNOWN`] for every device of
/// a resource whose plugin is not serving.
fn device_health(manager: &DeviceManager) -> HashMap<String, HashMap<String, String>> {
    manager
        .snapshot()
        .resources
        .into_iter()
        .map(|r| {
            let serving = r.endpoint.as_ref().is_some_and(|e| e.state == "Serving");
            let devices = r
                .devices
                .into_iter()
                .map(|d| {
                    let health = if serving {
                        d.health
                    } else {
                        UNKNOWN.to_owned()
                    };
                    (d.id, health)
                })
                .collect();
            (r.name, devices)
        })
        .collect()
}

/// The `allocatedResourcesStatus` of a container holding `devices` (resource → IDs).
pub fn container_status(
    devices: &BTreeMap<String, Vec<String>>,
    health: &HashMap<String, HashMap<String, String>>,
) -> Vec<ResourceStatus> {
    devices
        .iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(resource, ids)| ResourceStatus {
            name: resource.clone(),
            resources: ids
                .iter()
                .map(|id| {
                    let current = health.get(resource).and_then(|devices| devices.get(id));
                    let health = match current.map(String::as_str) {
                        None | Some(HEALTHY) => HEALTHY,
                        Some(UNKNOWN) => UNKNOWN,
                        Some(_) => UNHEALTHY,
                    };
                    ResourceHealth {
                        resource_id: id.clone(),
                        health: health.to_owned(),
                        // The device plugin API (v1beta1 `Device`) has no health message in
                        // 1.36, so a plugin device never carries one.
                        message: None,
                    }
                })
                .collect(),
        })
        .collect()
}

/// Fills `allocatedResourcesStatus` of every app container of `pods` from the live inventory.
pub fn annotate(manager: &DeviceManager, pods: &mut [AdmittedPod]) {
    let health = device_health(manager);
    for pod in pods {
        for container in &mut pod.containers {
            container.allocated_resources_status = if container.kind == ContainerKind::App {
                container_status(&container.devices, &health)
            } else {
                Vec::new()
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e1_health_per_device_missing_device_counts_as_healthy() {
        let devices = BTreeMap::from([
            (
                "r/a".to_owned(),
                vec!["d0".to_owned(), "d1".to_owned(), "gone".to_owned()],
            ),
            ("r/b".to_owned(), Vec::new()),
        ]);
        let health = HashMap::from([(
            "r/a".to_owned(),
            HashMap::from([
                ("d0".to_owned(), "Healthy".to_owned()),
                ("d1".to_owned(), "Unhealthy".to_owned()),
            ]),
        )]);
        let status = container_status(&devices, &health);
        assert_eq!(status.len(), 1, "a resource without devices gets no entry");
        let got: Vec<(&str, &str)> = status[0]
            .resources
            .iter()
            .map(|r| (r.resource_id.as_str(), r.health.as_str()))
            .collect();
        assert_eq!(
            got,
            [("d0", "Healthy"), ("d1", "Unhealthy"), ("gone", "Healthy")]
        );
        let json = serde_json::to_value(&status).unwrap();

        // The plugin is not connected: Unknown, not the last report and not Unhealthy.
        let health = HashMap::from([(
            "r/a".to_owned(),
            HashMap::from([
                ("d0".to_owned(), UNKNOWN.to_owned()),
                ("d1".to_owned(), UNKNOWN.to_owned()),
            ]),
        )]);
        let status = container_status(&devices, &health);
        let got: Vec<&str> = status[0]
            .resources
            .iter()
            .map(|r| r.health.as_str())
            .collect();
        assert_eq!(got, ["Unknown", "Unknown", "Healthy"]);
        assert_eq!(json[0]["name"], "r/a");
        assert_eq!(json[0]["resources"][1]["resourceID"], "d1");
        // No message from the device plugin API, so none in the status either.
        assert!(json[0]["resources"][1].get("message").is_none(), "{json}");
    }
}
