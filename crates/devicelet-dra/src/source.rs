//! [`ClaimSource`]: where ResourceClaims are read and their status is written.
//!
//! The kubelet reads claims live from the API server (`GET resourceclaims`, spec
//! dra-kubelet.md §2 B2.1) and never writes them; the local flow (`devicelet apply`, admit with
//! claims) also reserves and allocates, so the trait has a status update. [`InMemoryClaimSource`]
//! is the local store; a real API server client can implement the same trait later.
//! [`SliceSource`] lists the ResourceSlices published for the node (`devicelet get slices` in
//! cluster mode, where drivers publish to the API server).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus, ResourceSlice};

/// Why a claim source call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimSourceError {
    /// No such claim.
    #[error("resourceclaims.resource.k8s.io \"{name}\" not found in namespace {namespace}")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The update was based on an outdated object.
    #[error("conflict updating ResourceClaim {namespace}/{name}: {reason}")]
    Conflict {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The API server refused the read (HTTP 403). For a node this is usually the Node
    /// authorizer not having linked the claim to a pod bound to the node *yet*: its graph
    /// follows the pod's binding and `status.resourceClaimStatuses` a few milliseconds after
    /// the node's own watch shows them.
    #[error("{0}")]
    Forbidden(String),
    /// Anything else (transport, other errors).
    #[error("{0}")]
    Other(String),
}

/// Reads and updates ResourceClaims.
pub trait ClaimSource: Send + Sync + 'static {
    /// `GET namespaces/<ns>/resourceclaims/<name>`.
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>>;
    /// Replaces `status` (allocation, reservedFor) of the claim; returns the updated claim.
    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>>;
}

/// Lists the ResourceSlices published for this node, wherever drivers publish them.
pub trait SliceSource: Send + Sync + 'static {
    /// Every ResourceSlice whose `spec.nodeName` is this node; the error says why not.
    fn node_slices(&self) -> BoxFuture<'static, Result<Vec<ResourceSlice>, String>>;
}

/// Claims kept in memory, keyed by namespace/name; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct InMemoryClaimSource {
    claims: Arc<Mutex<BTreeMap<(String, String), ResourceClaim>>>,
}

impl InMemoryClaimSource {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores (or replaces) a claim; namespace defaults to `default`.
    pub fn insert(&self, claim: ResourceClaim) {
        let ns = claim
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((ns, name), claim);
    }

    /// Removes a claim (like a force delete); returns it.
    pub fn remove(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_owned(), name.to_owned()))
    }

    /// All stored claims.
    pub fn list(&self) -> Vec<ResourceClaim> {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }
}

impl ClaimSource for InMemoryClaimSource {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let result = self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ClaimSourceError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        futures::future::ready(result).boxed()
    }

    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let result = match claims.get_mut(&(namespace.to_owned(), name.to_owned())) {
            None => Err(ClaimSourceError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            Some(claim) => {
                claim.status = Some(status);
                Ok(claim.clone())
            }
        };
        futures::future::ready(result).boxed()
    }
}
