//! Device health from the drivers' `v1alpha1` DRAResourceHealth streams, per driver, pool
//! and device (E20: an ended stream clears the driver); no DraNode here, so the node, its
//! health operations and its views can all read it.

use devicelet_dra::{DeviceHealthReport, HealthStatus};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub(super) struct HealthEntry {
    health: HealthStatus,
    message: String,
    updated: Instant,
    timeout: Duration,
}

/// Device health from the drivers' `v1alpha1` streams, keyed by driver name (E20: an ended
/// stream clears the driver).
#[derive(Debug)]
pub(super) struct HealthCache {
    pub(super) devices: Mutex<HashMap<(String, String, String), HealthEntry>>,
    /// Bumped when a device's health or message changes, so pod statuses are reported again.
    pub(super) changes: watch::Sender<u64>,
}

impl Default for HealthCache {
    fn default() -> Self {
        HealthCache {
            devices: Mutex::default(),
            changes: watch::channel(0).0,
        }
    }
}

impl HealthCache {
    pub(super) fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<(String, String, String), HealthEntry>> {
        self.devices.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// B18: every reported device is stored with our receive time (the plugin's timestamp is
    /// ignored); devices not reported go stale by their own timeout.
    pub(super) fn update(&self, driver: &str, reports: Vec<DeviceHealthReport>) {
        let now = Instant::now();
        let mut changed = false;
        {
            let mut devices = self.lock();
            for r in reports {
                let entry = HealthEntry {
                    health: r.health,
                    message: r.message,
                    updated: now,
                    timeout: r.timeout,
                };
                // A stale entry read as Unknown, so its refresh is a change too.
                let differs = |o: &HealthEntry| {
                    o.health != entry.health
                        || o.message != entry.message
                        || o.updated.elapsed() > o.timeout
                };
                let key = (driver.to_owned(), r.pool_name, r.device_name);
                changed |= devices.get(&key).is_none_or(differs);
                devices.insert(key, entry);
            }
        }
        if changed {
            self.changed();
        }
    }

    pub(super) fn clear_driver(&self, driver: &str) {
        let removed = {
            let mut devices = self.lock();
            let before = devices.len();
            devices.retain(|(d, _, _), _| d != driver);
            devices.len() != before
        };
        if removed {
            self.changed();
        }
    }

    /// Health and message; stale or absent = Unknown.
    pub(super) fn get(&self, driver: &str, pool: &str, device: &str) -> (HealthStatus, String) {
        let devices = self.lock();
        match devices.get(&(driver.to_owned(), pool.to_owned(), device.to_owned())) {
            Some(e) if e.updated.elapsed() <= e.timeout => (e.health, e.message.clone()),
            _ => (HealthStatus::Unknown, String::new()),
        }
    }
}

pub(super) fn health_str(h: HealthStatus) -> &'static str {
    match h {
        HealthStatus::Healthy => "Healthy",
        HealthStatus::Unhealthy => "Unhealthy",
        HealthStatus::Unknown => "Unknown",
    }
}
