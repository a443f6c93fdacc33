//! The durable local object store (`R/devicelet/dra_objects.json`): DeviceClasses,
//! ResourceSlices, ResourceClaims and templates of local mode, the [`ClaimSource`] of the
//! local flow, and its quarantine/recovery.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use devicelet_checkpoint::aside::{self, move_aside};
use devicelet_checkpoint::atomic_write::write_file_atomic;
use devicelet_dra::{ClaimCache, ClaimSource, ClaimSourceError};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimStatus, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{DraNodeError, OBJECTS_QUARANTINE_FILE};

/// What `R/devicelet/dra_objects.json` holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Objects {
    /// DeviceClasses by name.
    pub device_classes: BTreeMap<String, DeviceClass>,
    /// Applied ResourceSlices by name.
    pub resource_slices: BTreeMap<String, ResourceSlice>,
    /// ResourceClaims by `namespace/name`.
    pub resource_claims: BTreeMap<String, ResourceClaim>,
    /// ResourceClaimTemplates by `namespace/name`.
    pub resource_claim_templates: BTreeMap<String, ResourceClaimTemplate>,
    /// Admitted pods that use claims, by UID (with `status.resourceClaimStatuses` filled in).
    pub pods: BTreeMap<String, Pod>,
}

pub(super) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// `devicelet state recover` for DRA (devicelet stopped): clears the claim cache quarantine
/// (`R/devicelet/dra_manager_state.quarantine`, after a corrupt `R/dra_manager_state`) and the
/// objects quarantine (after a corrupt `R/devicelet/dra_objects.json`). Returns the markers
/// removed. Drain the node's DRA pods first: claims recorded only in the lost state are not
/// unprepared, and claims the cache still holds for pods no longer known are unprepared by the
/// next start.
pub fn recover_dra(root: &Path) -> Result<Vec<PathBuf>, DraNodeError> {
    let dir = root.join(devicelet_dra::claim_cache::DEVICELET_DIR);
    let mut cleared = Vec::new();
    if ClaimCache::recover(root)? {
        cleared.push(dir.join(devicelet_dra::claim_cache::QUARANTINE_FILE));
    }
    if LocalStore::recover(&dir)? {
        cleared.push(dir.join(OBJECTS_QUARANTINE_FILE));
    }
    Ok(cleared)
}

pub(super) fn ns_of(meta: &ObjectMeta) -> String {
    meta.namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

/// The durable local object store; the [`ClaimSource`] of the local flow.
#[derive(Debug)]
pub struct LocalStore {
    path: PathBuf,
    objects: Mutex<Objects>,
    marker: PathBuf,
    /// Set when the file could not be read: the store is empty and refuses writes.
    quarantine: Option<String>,
}

pub(super) fn store_err(path: &Path) -> impl Fn(std::io::Error) -> DraNodeError + '_ {
    move |e| DraNodeError::Store {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

impl LocalStore {
    /// Loads `path` (missing = empty). A file that cannot be parsed does not stop the daemon:
    /// it is moved aside to `<path>.corrupt-<UTC>` (never overwritten), a quarantine marker
    /// [`OBJECTS_QUARANTINE_FILE`] is written next to it, and the store opens empty and
    /// quarantined (fail-closed for DRA only; see docs/dra.md). A marker left by an earlier
    /// start keeps it quarantined until [`LocalStore::recover`].
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, DraNodeError> {
        let path = path.into();
        let marker = path.with_file_name(OBJECTS_QUARANTINE_FILE);
        let quarantined = |detail: String| LocalStore {
            path: path.clone(),
            objects: Mutex::default(),
            marker: marker.clone(),
            quarantine: Some(detail),
        };
        match std::fs::read(&marker) {
            Ok(detail) => {
                let detail = String::from_utf8_lossy(&detail).trim().to_owned();
                warn!(marker = %marker.display(), %detail, "DRA objects quarantined; DRA operations refused until `devicelet state recover`");
                return Ok(quarantined(detail));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(store_err(&marker)(e)),
        }
        let objects = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(o) => o,
                Err(e) => {
                    let kept = move_aside(&path, aside::CORRUPT).map_err(store_err(&path))?;
                    let detail = format!(
                        "{} could not be read ({e}); kept as {}",
                        path.display(),
                        kept.display()
                    );
                    write_file_atomic(&marker, format!("{detail}\n").as_bytes()).map_err(|e| {
                        DraNodeError::Store {
                            path: marker.clone(),
                            reason: e.to_string(),
                        }
                    })?;
                    tracing::error!(%detail, "DRA objects quarantined; DRA operations refused until `devicelet state recover`");
                    return Ok(quarantined(detail));
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Objects::default(),
            Err(e) => return Err(store_err(&path)(e)),
        };
        Ok(LocalStore {
            path,
            objects: Mutex::new(objects),
            marker,
            quarantine: None,
        })
    }

    /// Why the store is quarantined, if it is.
    pub fn quarantine(&self) -> Option<&str> {
        self.quarantine.as_deref()
    }

    pub(super) fn check_quarantine(&self) -> Result<(), DraNodeError> {
        match &self.quarantine {
            None => Ok(()),
            Some(detail) => Err(DraNodeError::StateUnknown {
                detail: detail.clone(),
                marker: self.marker.clone(),
            }),
        }
    }

    /// Operator recovery (devicelet stopped): removes the quarantine marker in the devicelet
    /// directory `dir` (`R/devicelet`); the next start opens an empty store (the bad file
    /// stays aside). Returns whether there was a marker.
    pub fn recover(dir: &Path) -> Result<bool, DraNodeError> {
        let marker = dir.join(OBJECTS_QUARANTINE_FILE);
        match std::fs::remove_file(&marker) {
            Ok(()) => {
                devicelet_checkpoint::atomic_write::sync_dir(dir).map_err(store_err(dir))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(store_err(&marker)(e)),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of everything stored.
    pub fn snapshot(&self) -> Objects {
        self.lock().clone()
    }

    /// Changes the objects and writes them durably before returning. Refused while quarantined.
    pub fn update<T>(&self, f: impl FnOnce(&mut Objects) -> T) -> Result<T, DraNodeError> {
        self.check_quarantine()?;
        let mut objects = self.lock();
        let out = f(&mut objects);
        let bytes = serde_json::to_vec(&*objects).map_err(|e| DraNodeError::Store {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        write_file_atomic(&self.path, &bytes).map_err(|e| DraNodeError::Store {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        Ok(out)
    }

    /// One claim.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.lock()
            .resource_claims
            .get(&key(namespace, name))
            .cloned()
    }
}

impl ClaimSource for LocalStore {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let r = self
            .claim(namespace, name)
            .ok_or_else(|| ClaimSourceError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        futures::future::ready(r).boxed()
    }

    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let k = key(namespace, name);
        let r = self
            .update(|o| {
                o.resource_claims.get_mut(&k).map(|c| {
                    c.status = Some(status);
                    c.clone()
                })
            })
            .map_err(|e| ClaimSourceError::Other(e.to_string()))
            .and_then(|c| {
                c.ok_or_else(|| ClaimSourceError::NotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            });
        futures::future::ready(r).boxed()
    }
}
