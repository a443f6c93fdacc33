//! Driver instances coming and going (plugin watcher `"DRAPlugin"`): registration starts the
//! health stream; a driver gone for the wipe delay loses its published ResourceSlices (§1.11).

use std::path::Path;
use std::sync::Arc;

use devicelet_dra::DraError;
use tracing::info;

use super::node::{DraNode, lock};

impl DraNode {
    /// The driver's last instance went away: its published slices are wiped after the wipe
    /// delay unless an instance registers before (§1.11). A wipe already pending keeps its
    /// deadline (the kubelet keeps the first one); a registration cancels it, so a later
    /// absence gets a full delay of its own (A8 row 55: a driver that comes back, and even goes
    /// away again, within the window keeps its slices).
    pub(super) fn schedule_wipe(self: &Arc<Self>, driver: &str) {
        if self.registry.is_registered(driver) {
            return;
        }
        let token = {
            let mut wipes = lock(&self.wipes);
            if wipes.contains_key(driver) {
                return;
            }
            let token = self
                .next_wipe
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            wipes.insert(driver.to_owned(), token);
            token
        };
        let me = Arc::clone(self);
        let driver = driver.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(me.wipe_delay).await;
            {
                let mut wipes = lock(&me.wipes);
                if wipes.get(&driver) != Some(&token) {
                    return; // cancelled by a registration
                }
                wipes.remove(&driver);
            }
            if !me.registry.is_registered(&driver) && lock(&me.published).remove(&driver).is_some()
            {
                info!(
                    driver,
                    "driver gone; its published ResourceSlices are wiped"
                );
            }
        });
    }

    /// An instance of `driver` registered: a pending wipe is cancelled.
    /// A driver instance registered with the plugin watcher (`RegisterPlugin`): recorded in
    /// the registry, a pending wipe of its slices cancelled, its health stream started.
    pub fn register_driver(
        &self,
        driver: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), DraError> {
        self.registry.register(driver, endpoint, versions)?;
        self.cancel_wipe(driver);
        self.start_health(driver, endpoint);
        Ok(())
    }

    /// A driver instance's socket went away: its health stream stops, it leaves the registry,
    /// and its slices are wiped unless an instance comes back within the wipe delay (§1.11).
    pub fn deregister_driver(self: &Arc<Self>, driver: &str, endpoint: &Path) {
        self.stop_health(driver, endpoint);
        self.registry.deregister(driver, endpoint);
        self.schedule_wipe(driver);
    }

    pub(super) fn cancel_wipe(&self, driver: &str) {
        if lock(&self.wipes).remove(driver).is_some() {
            info!(
                driver,
                "driver back within the wipe delay; its ResourceSlices are kept"
            );
        }
    }
}
