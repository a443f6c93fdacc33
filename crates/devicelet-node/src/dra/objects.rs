//! The local object store's write side (local mode, `devicelet apply`): DeviceClasses,
//! claims, templates and driver-published ResourceSlices (§1.11 `publish`).

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use tracing::info;

use super::node::{DraNode, lock};
use super::store::{key, ns_of};
use super::{ClaimOrigin, DraNodeError};

impl DraNode {
    /// `devicelet apply`: stores DeviceClasses, ResourceSlices, ResourceClaims and
    /// ResourceClaimTemplates (`resource.k8s.io/v1`). Claims get a UID when they have none; a
    /// re-applied claim keeps its UID and status (the spec is immutable in Kubernetes, so a
    /// changed spec of an allocated claim is refused). Returns `kind/name` per object.
    pub fn apply(&self, docs: Vec<serde_json::Value>) -> Result<Vec<String>, DraNodeError> {
        if let ClaimOrigin::Api(_) = self.origin {
            // Objects stored here would never be used: admission reads the API server.
            return Err(DraNodeError::Invalid(
                "cluster mode: DRA objects come from the API server (use kubectl), not devicelet apply".to_owned(),
            ));
        }
        enum Obj {
            Class(Box<DeviceClass>),
            Slice(Box<ResourceSlice>),
            Claim(Box<ResourceClaim>),
            Template(Box<ResourceClaimTemplate>),
        }
        let mut parsed = Vec::with_capacity(docs.len());
        for doc in docs {
            let field = |f: &str| {
                doc.get(f)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (api, kind) = (field("apiVersion"), field("kind"));
            if api != "resource.k8s.io/v1" {
                return Err(DraNodeError::Invalid(format!(
                    "{kind}: apiVersion {api:?} is not supported (use resource.k8s.io/v1)"
                )));
            }
            let bad = |e: serde_json::Error| DraNodeError::Invalid(format!("{kind}: {e}"));
            let obj = match kind.as_str() {
                "DeviceClass" => Obj::Class(serde_json::from_value(doc).map_err(bad)?),
                "ResourceSlice" => Obj::Slice(serde_json::from_value(doc).map_err(bad)?),
                "ResourceClaim" => Obj::Claim(serde_json::from_value(doc).map_err(bad)?),
                "ResourceClaimTemplate" => Obj::Template(serde_json::from_value(doc).map_err(bad)?),
                other => {
                    return Err(DraNodeError::Invalid(format!(
                        "kind {other:?} is not one of DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate"
                    )));
                }
            };
            let name = match &obj {
                Obj::Class(o) => o.metadata.name.clone(),
                Obj::Slice(o) => o.metadata.name.clone(),
                Obj::Claim(o) => o.metadata.name.clone(),
                Obj::Template(o) => o.metadata.name.clone(),
            };
            if name.as_deref().is_none_or(str::is_empty) {
                return Err(DraNodeError::Invalid(format!(
                    "{kind}: metadata.name is missing"
                )));
            }
            parsed.push(obj);
        }
        self.store.update(|o| {
            let mut out = Vec::new();
            for obj in parsed {
                match obj {
                    Obj::Class(c) => {
                        let n = c.metadata.name.clone().unwrap_or_default();
                        out.push(format!("deviceclass/{n}"));
                        o.device_classes.insert(n, *c);
                    }
                    Obj::Slice(s) => {
                        let n = s.metadata.name.clone().unwrap_or_default();
                        out.push(format!("resourceslice/{n}"));
                        o.resource_slices.insert(n, *s);
                    }
                    Obj::Template(mut t) => {
                        let ns = ns_of(&t.metadata);
                        t.metadata.namespace = Some(ns.clone());
                        let n = t.metadata.name.clone().unwrap_or_default();
                        out.push(format!("resourceclaimtemplate/{n}"));
                        o.resource_claim_templates.insert(key(&ns, &n), *t);
                    }
                    Obj::Claim(mut c) => {
                        let ns = ns_of(&c.metadata);
                        c.metadata.namespace = Some(ns.clone());
                        let n = c.metadata.name.clone().unwrap_or_default();
                        let k = key(&ns, &n);
                        if let Some(old) = o.resource_claims.get(&k) {
                            // Keep identity and status (allocation, reservations).
                            c.metadata.uid = old.metadata.uid.clone();
                            if old.status.as_ref().is_some_and(|s| s.allocation.is_some())
                                && old.spec != c.spec
                            {
                                out.push(format!(
                                    "resourceclaim/{n} unchanged (allocated; spec is immutable)"
                                ));
                                continue;
                            }
                            c.status = old.status.clone();
                        } else if c.metadata.uid.as_deref().is_none_or(str::is_empty) {
                            c.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
                        }
                        out.push(format!("resourceclaim/{n}"));
                        o.resource_claims.insert(k, *c);
                    }
                }
            }
            out
        })
    }

    /// Removes a claim from the store (as a force delete in the API server would); returns
    /// whether it existed. Prepared devices stay prepared until their pods are removed.
    pub fn delete_claim(&self, namespace: &str, name: &str) -> Result<bool, DraNodeError> {
        self.store
            .update(|o| o.resource_claims.remove(&key(namespace, name)).is_some())
    }

    /// A driver publishes its ResourceSlices (replacing what it published before), the way
    /// the kubelet-plugin helper's ResourceSlice controller does against the API server.
    /// Slices without node selection are bound to this node.
    pub fn publish(&self, driver: &str, slices: Vec<ResourceSlice>) -> Result<(), DraNodeError> {
        let mut out = Vec::with_capacity(slices.len());
        for (i, mut s) in slices.into_iter().enumerate() {
            if s.spec.driver != driver {
                return Err(DraNodeError::Invalid(format!(
                    "ResourceSlice #{i} is for driver {:?}, not {driver:?}",
                    s.spec.driver
                )));
            }
            if s.spec.node_name.is_none()
                && s.spec.all_nodes != Some(true)
                && s.spec.node_selector.is_none()
                && s.spec.per_device_node_selection != Some(true)
            {
                s.spec.node_name = Some(self.node_name.clone());
            }
            if s.metadata.name.as_deref().is_none_or(str::is_empty) {
                s.metadata.name = Some(format!("{}-{driver}-{i}", self.node_name));
            }
            out.push(s);
        }
        info!(driver, slices = out.len(), "ResourceSlices published");
        lock(&self.published).insert(driver.to_owned(), out);
        Ok(())
    }

    /// Stored and published slices.
    pub fn slices(&self) -> Vec<ResourceSlice> {
        let mut all: Vec<ResourceSlice> = self
            .store
            .lock()
            .resource_slices
            .values()
            .cloned()
            .collect();
        all.extend(lock(&self.published).values().flatten().cloned());
        all
    }
}
