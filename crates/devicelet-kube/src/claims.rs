//! ResourceClaims from the API server: the [`ClaimSource`] of cluster mode.
//!
//! The kubelet reads each claim of a pod it prepares with one uncached GET, with the node
//! identity (the Node authorizer allows `get` of claims referenced by a pod bound to the node,
//! and nothing else: no list, no watch, no writes; spec cluster.md §1, §3). Allocation and
//! reservation belong to kube-scheduler, template claims to kube-controller-manager, so the
//! status update of the trait is refused here.

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};
use kube::{Api, Client};

use devicelet_dra::{ClaimSource, ClaimSourceError};

use crate::client::with_deadline;

/// Reads `resource.k8s.io/v1` ResourceClaims from the API server, one GET per call.
#[derive(Clone)]
pub struct ApiClaimSource {
    client: Client,
}

impl std::fmt::Debug for ApiClaimSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClaimSource").finish_non_exhaustive()
    }
}

impl ApiClaimSource {
    /// A source reading through `client` (the node's identity).
    pub fn new(client: Client) -> Self {
        ApiClaimSource { client }
    }
}

impl ClaimSource for ApiClaimSource {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        async move {
            let what = format!("get ResourceClaim {namespace}/{name}");
            match with_deadline(what, api.get(&name)).await {
                Ok(claim) => Ok(claim),
                Err(e) if e.is_not_found() => Err(ClaimSourceError::NotFound { namespace, name }),
                Err(e) if e.status() == Some(403) => {
                    Err(ClaimSourceError::Forbidden(e.to_string()))
                }
                Err(e) => Err(ClaimSourceError::Other(e.to_string())),
            }
        }
        .boxed()
    }

    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        _status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let reason = format!(
            "ResourceClaim {namespace}/{name}: not updated; in cluster mode kube-scheduler owns allocation and reservation"
        );
        futures::future::ready(Err(ClaimSourceError::Other(reason))).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn update_status_is_refused() {
        crate::client::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let client = Client::try_from(config).expect("client");
        let source = ApiClaimSource::new(client);
        let err = source
            .update_status("ns", "c", ResourceClaimStatus::default())
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("kube-scheduler owns allocation"));
    }
}
