//! [`DraPluginRegistry`]: registered DRA driver instances.
//!
//! Follows `pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go` (spec dra-kubelet.md §1.7–§1.9,
//! §1.12, E12–E16): the plugin watcher calls [`DraPluginRegistry::validate`],
//! [`DraPluginRegistry::register`] and [`DraPluginRegistry::deregister`]; the service is the
//! first entry of the plugin's own `supported_versions` list that we support (v1 before
//! v1beta1 only if the plugin lists it first, E12); several instances of one driver are kept in
//! registration order and calls go to the newest connected instance, else the newest (rolling
//! update / HA); deregistration removes exactly one `(driver, endpoint)` and is idempotent.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::info;

use crate::client::{DraPluginClient, DraPluginDialer, DraService};
use crate::error::{DraError, VersionError};

/// Deadline of `NodePrepareResources` / `NodeUnprepareResources` (the kubelet's 45 s).
pub const DRA_RPC_TIMEOUT: Duration = Duration::from_secs(45);

/// Services we support, in our preference order (`plugin/dra_plugin.go:46-49`).
pub const SUPPORTED_SERVICES: [DraService; 2] = [DraService::V1, DraService::V1Beta1];

/// Picks the service: first entry of the plugin's list we support (§1.8).
pub fn choose_service(versions: &[String]) -> Result<DraService, VersionError> {
    if versions.is_empty() {
        return Err(VersionError::Empty);
    }
    versions
        .iter()
        .find_map(|v| SUPPORTED_SERVICES.into_iter().find(|s| s.as_str() == v))
        .ok_or_else(|| VersionError::NoneSupported {
            theirs: versions.to_vec(),
            ours: SUPPORTED_SERVICES.iter().map(|s| s.as_str()).collect(),
        })
}

/// One registered driver instance.
#[derive(Clone)]
pub struct DraPluginInstance {
    /// Driver name.
    pub driver: String,
    /// DRA service socket.
    pub endpoint: PathBuf,
    /// Chosen service.
    pub service: DraService,
    /// Deadline of each prepare/unprepare call.
    pub call_timeout: Duration,
    /// The instance's one connection.
    pub client: Arc<dyn DraPluginClient>,
}

impl std::fmt::Debug for DraPluginInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraPluginInstance")
            .field("driver", &self.driver)
            .field("endpoint", &self.endpoint)
            .field("service", &self.service)
            .field("connected", &self.client.is_connected())
            .finish()
    }
}

/// Registered driver instances; cheap to clone (shared state).
#[derive(Clone)]
pub struct DraPluginRegistry {
    dialer: Arc<dyn DraPluginDialer>,
    call_timeout: Duration,
    /// Registration order, oldest first.
    instances: Arc<Mutex<Vec<DraPluginInstance>>>,
}

impl std::fmt::Debug for DraPluginRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraPluginRegistry")
            .field("instances", &*self.lock())
            .finish()
    }
}

impl DraPluginRegistry {
    /// A registry dialing through `dialer` with the kubelet's 45 s call deadline.
    pub fn new(dialer: Arc<dyn DraPluginDialer>) -> Self {
        Self::with_call_timeout(dialer, DRA_RPC_TIMEOUT)
    }

    /// A registry with another per-call deadline.
    pub fn with_call_timeout(dialer: Arc<dyn DraPluginDialer>, call_timeout: Duration) -> Self {
        DraPluginRegistry {
            dialer,
            call_timeout,
            instances: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DraPluginInstance>> {
        self.instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `ValidatePlugin`: version negotiation only (names are not validated, §1.8).
    pub fn validate(
        &self,
        driver: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), DraError> {
        choose_service(versions)
            .map(|_| ())
            .map_err(|reason| DraError::InvalidVersions {
                driver: driver.to_owned(),
                endpoint: endpoint.to_path_buf(),
                reason,
            })
    }

    /// `RegisterPlugin`: adds an instance with its own connection (created lazily).
    pub fn register(
        &self,
        driver: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<DraService, DraError> {
        let service = choose_service(versions).map_err(|reason| DraError::InvalidVersions {
            driver: driver.to_owned(),
            endpoint: endpoint.to_path_buf(),
            reason,
        })?;
        if self
            .lock()
            .iter()
            .any(|i| i.driver == driver && i.endpoint == endpoint)
        {
            return Err(DraError::AlreadyRegistered {
                driver: driver.to_owned(),
                endpoint: endpoint.to_path_buf(),
            });
        }
        let client = self.dialer.dial(driver, endpoint, service)?;
        let mut instances = self.lock();
        // Re-check: another registration may have raced us while dialing.
        if instances
            .iter()
            .any(|i| i.driver == driver && i.endpoint == endpoint)
        {
            return Err(DraError::AlreadyRegistered {
                driver: driver.to_owned(),
                endpoint: endpoint.to_path_buf(),
            });
        }
        info!(driver, endpoint = %endpoint.display(), service = service.as_str(), "DRA driver instance registered");
        instances.push(DraPluginInstance {
            driver: driver.to_owned(),
            endpoint: endpoint.to_path_buf(),
            service,
            call_timeout: self.call_timeout,
            client,
        });
        Ok(service)
    }

    /// `DeRegisterPlugin`: removes exactly `(driver, endpoint)`; unknown pairs are ignored.
    pub fn deregister(&self, driver: &str, endpoint: &Path) {
        let removed = {
            let mut instances = self.lock();
            let pos = instances
                .iter()
                .position(|i| i.driver == driver && i.endpoint == endpoint);
            pos.map(|p| instances.remove(p))
        };
        if let Some(instance) = removed {
            // Closed outside the lock.
            instance.client.close();
            info!(driver, endpoint = %endpoint.display(), "DRA driver instance deregistered");
        }
    }

    /// `GetPlugin`: newest connected instance, else newest (E14).
    pub fn get(&self, driver: &str) -> Result<DraPluginInstance, DraError> {
        if driver.is_empty() {
            return Err(DraError::EmptyDriverName);
        }
        let instances = self.lock();
        let mut newest = None;
        for i in instances.iter().rev().filter(|i| i.driver == driver) {
            if i.client.is_connected() {
                return Ok(i.clone());
            }
            if newest.is_none() {
                newest = Some(i);
            }
        }
        newest
            .cloned()
            .ok_or_else(|| DraError::NotRegistered(driver.to_owned()))
    }

    /// The instance registered for exactly `(driver, endpoint)`.
    pub fn instance(&self, driver: &str, endpoint: &Path) -> Option<DraPluginInstance> {
        self.lock()
            .iter()
            .find(|i| i.driver == driver && i.endpoint == endpoint)
            .cloned()
    }

    /// Whether any instance of `driver` is registered.
    pub fn is_registered(&self, driver: &str) -> bool {
        self.lock().iter().any(|i| i.driver == driver)
    }

    /// All registered `(driver, endpoint, service)` in registration order.
    pub fn list(&self) -> Vec<(String, PathBuf, DraService)> {
        self.lock()
            .iter()
            .map(|i| (i.driver.clone(), i.endpoint.clone(), i.service))
            .collect()
    }
}
