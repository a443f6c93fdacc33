//! DRA device health (KEP-4680, `v1alpha1` DRAResourceHealth streams, §1.10, E20, E21): the
//! per-driver cache, the stream per instance and `claim:` entries of `allocatedResourcesStatus`.

use std::path::Path;
use std::sync::Arc;

use devicelet_dra::HealthStatus;
use devicelet_dra::pod::resolve_pod_claim;
use futures::StreamExt;
use tokio::sync::watch;
use tracing::warn;

use crate::health::{ResourceHealth, ResourceStatus};

use super::HEALTH_RESTART_DELAY;
use super::health_cache::health_str;
use super::node::{DraNode, find_container, lock};
use super::store::ns_of;

/// One `resources[]` entry of a claim's status: the cached health and, when the driver sent one
/// with a current report, its message (the kubelet leaves `message` unset for an empty one, and
/// the cache already answers a stale device with Unknown and no message).
fn resource_health(resource_id: String, health: HealthStatus, message: String) -> ResourceHealth {
    ResourceHealth {
        resource_id,
        health: health_str(health).to_owned(),
        message: Some(message).filter(|m| !m.is_empty()),
    }
}

impl DraNode {
    /// The container's `allocatedResourcesStatus` entries for its claims (B17,
    /// `manager.go` `UpdateAllocatedResourcesStatus`): one `claim:<pod claim>` entry (with
    /// `/<request>` when the container names a request) per reference; resourceID = the
    /// device's first CDI ID, else `<driver>/<pool>/<device>`; duplicates by resourceID dropped;
    /// request matching by base request; entries without devices left out.
    pub fn claim_resource_status(&self, uid: &str, container: &str) -> Vec<ResourceStatus> {
        let Some(pod) = self.pod(uid) else {
            return Vec::new();
        };
        let Some(c) = find_container(&pod, container) else {
            return Vec::new();
        };
        let namespace = ns_of(&pod.metadata);
        let mut out = Vec::new();
        for r in c.resources.iter().flat_map(|r| r.claims.iter().flatten()) {
            let Ok(Some(resolved)) = resolve_pod_claim(&pod, &r.name) else {
                continue;
            };
            let Some(cached) = self.cache.get(&namespace, &resolved.claim_name) else {
                continue;
            };
            let request = r.request.as_deref().filter(|s| !s.is_empty());
            let mut resources: Vec<ResourceHealth> = Vec::new();
            for (driver, devices) in &cached.drivers {
                for d in devices {
                    let serves = request.is_none_or(|req| {
                        let base = req.split('/').next().unwrap_or(req);
                        d.request_names.is_empty()
                            || d.request_names
                                .iter()
                                .any(|n| n.split('/').next() == Some(base))
                    });
                    if !serves {
                        continue;
                    }
                    let id =
                        d.cdi_device_ids.first().cloned().unwrap_or_else(|| {
                            format!("{driver}/{}/{}", d.pool_name, d.device_name)
                        });
                    if resources.iter().any(|x| x.resource_id == id) {
                        continue;
                    }
                    let (health, message) = self.health.get(driver, &d.pool_name, &d.device_name);
                    resources.push(resource_health(id, health, message));
                }
            }
            if resources.is_empty() {
                continue;
            }
            let name = match request {
                Some(req) => format!("claim:{}/{req}", r.name),
                None => format!("claim:{}", r.name),
            };
            out.push(ResourceStatus { name, resources });
        }
        out
    }

    /// Bumped whenever a driver's health stream changes a device's health (or a stream ends),
    /// so front ends report the affected pods' `allocatedResourcesStatus` again.
    pub fn health_changes(&self) -> watch::Receiver<u64> {
        self.health.changes.subscribe()
    }

    pub(super) fn start_health(&self, driver: &str, endpoint: &Path) {
        let Some(instance) = self.registry.instance(driver, endpoint) else {
            return;
        };
        let (stop_tx, mut stop) = watch::channel(false);
        // Stored before the loop starts, so a deregistration always finds it (E21).
        if let Some(old) =
            lock(&self.health_tasks).insert((driver.to_owned(), endpoint.to_path_buf()), stop_tx)
        {
            let _ = old.send(true);
        }
        let health = Arc::clone(&self.health);
        let driver = driver.to_owned();
        tokio::spawn(async move {
            loop {
                match instance.client.watch_health().await {
                    Ok(mut stream) => loop {
                        tokio::select! {
                            item = stream.next() => match item {
                                Some(Ok(list)) => health.update(&driver, list),
                                Some(Err(e)) => {
                                    warn!(driver, error = %e.message, "health stream ended");
                                    break;
                                }
                                None => break,
                            },
                            _ = stop.changed() => {
                                health.clear_driver(&driver);
                                return;
                            }
                        }
                    },
                    Err(e) if e.code == devicelet_dra::RpcCode::Unimplemented => {}
                    Err(e) => warn!(driver, error = %e.message, "cannot open health stream"),
                }
                health.clear_driver(&driver);
                tokio::select! {
                    _ = tokio::time::sleep(HEALTH_RESTART_DELAY) => {}
                    _ = stop.changed() => return,
                }
            }
        });
    }

    pub(super) fn stop_health(&self, driver: &str, endpoint: &Path) {
        if let Some(stop) =
            lock(&self.health_tasks).remove(&(driver.to_owned(), endpoint.to_path_buf()))
        {
            let _ = stop.send(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::health_cache::HealthCache;
    use super::*;
    use devicelet_dra::DeviceHealthReport;
    use std::time::Duration;

    fn report(device: &str, health: HealthStatus, message: &str) -> DeviceHealthReport {
        DeviceHealthReport {
            pool_name: "pool".to_owned(),
            device_name: device.to_owned(),
            health,
            timeout: Duration::from_secs(30),
            message: message.to_owned(),
        }
    }

    fn entry(cache: &HealthCache, device: &str) -> ResourceHealth {
        let (health, message) = cache.get("drv", "pool", device);
        resource_health(format!("drv/pool/{device}"), health, message)
    }

    #[test]
    fn message_reaches_the_status_entry_and_an_empty_one_is_left_out() {
        let cache = HealthCache::default();
        cache.update(
            "drv",
            vec![
                report(
                    "gpu-0",
                    HealthStatus::Unhealthy,
                    "ECC errors over threshold",
                ),
                report("gpu-1", HealthStatus::Healthy, ""),
            ],
        );
        let sick = entry(&cache, "gpu-0");
        assert_eq!(sick.health, "Unhealthy");
        assert_eq!(sick.message.as_deref(), Some("ECC errors over threshold"));
        let well = entry(&cache, "gpu-1");
        assert_eq!(well.health, "Healthy");
        assert_eq!(well.message, None);
        let json = serde_json::to_value([&sick, &well]).unwrap();
        assert_eq!(json[0]["message"], "ECC errors over threshold");
        assert!(
            json[1].get("message").is_none(),
            "no message key without a message: {json}"
        );

        // Never reported, or the driver's stream ended: Unknown without a message.
        assert_eq!(entry(&cache, "gpu-9").message, None);
        cache.clear_driver("drv");
        let gone = entry(&cache, "gpu-0");
        assert_eq!((gone.health.as_str(), gone.message), ("Unknown", None));
    }

    #[test]
    fn a_stale_report_loses_its_message() {
        let cache = HealthCache::default();
        let mut r = report("gpu-0", HealthStatus::Unhealthy, "fan stopped");
        r.timeout = Duration::ZERO;
        cache.update("drv", vec![r]);
        std::thread::sleep(Duration::from_millis(5));
        let stale = entry(&cache, "gpu-0");
        assert_eq!((stale.health.as_str(), stale.message), ("Unknown", None));
    }

    #[test]
    fn a_message_change_alone_signals_a_status_update() {
        let cache = HealthCache::default();
        let changes = cache.changes.subscribe();
        let seen = |c: &tokio::sync::watch::Receiver<u64>| *c.borrow();
        cache.update(
            "drv",
            vec![report("gpu-0", HealthStatus::Unhealthy, "fan slow")],
        );
        let first = seen(&changes);
        assert_ne!(first, 0, "a new device is a change");
        // The periodic resend of the same report is not.
        cache.update(
            "drv",
            vec![report("gpu-0", HealthStatus::Unhealthy, "fan slow")],
        );
        assert_eq!(seen(&changes), first);
        // Same health, new message: the pod status must be written again.
        cache.update(
            "drv",
            vec![report("gpu-0", HealthStatus::Unhealthy, "fan stopped")],
        );
        assert_ne!(seen(&changes), first);
        assert_eq!(
            entry(&cache, "gpu-0").message.as_deref(),
            Some("fan stopped")
        );
    }
}
