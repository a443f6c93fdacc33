//! What a node reads for its pods' volumes and env, under the node identity: ConfigMaps and
//! Secrets by name (GET, never a list or watch: the Node authorizer allows a node only the
//! objects its own pods reference), service account tokens bound to a pod (the TokenRequest
//! API), and the `kubernetes` Service in `default`.
//!
//! Follows the kubelet's `pkg/kubelet/configmap` and `pkg/kubelet/secret` managers (here
//! without a cache: each volume refresh GETs again) and `pkg/kubelet/token/token_manager.go`
//! (the request it sends).

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::client::with_deadline;
use crate::error::ClusterError;

/// Where pods are told the API server is (`serve --pod-api-server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodApiServer {
    /// The `kubernetes` Service's ClusterIP and ports, as the kubelet does.
    Service,
    /// A fixed host and port: the API server devicelet itself uses (for host-network pods
    /// on a cluster without kube-proxy).
    Fixed {
        /// Host (IP or name).
        host: String,
        /// Port.
        port: u16,
    },
}

/// A token the API server issued: the token, its expiry (Unix seconds) and the lifetime it
/// was issued with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token.
    pub token: String,
    /// Expiry, seconds since the epoch.
    pub expires_unix: i64,
    /// The lifetime asked for (the API's `spec.expirationSeconds` in the answer).
    pub expiration_seconds: i64,
}

/// Reads pod-referenced objects with the node's client.
#[derive(Clone)]
pub struct PodObjects {
    client: Client,
}

impl std::fmt::Debug for PodObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodObjects").finish_non_exhaustive()
    }
}

impl PodObjects {
    /// Reads with `client` (the node identity).
    pub fn new(client: Client) -> Self {
        PodObjects { client }
    }

    /// ConfigMap `namespace/name`, `None` when it does not exist.
    pub async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, ClusterError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        with_deadline(
            format!("get configmap {namespace}/{name}"),
            api.get_opt(name),
        )
        .await
    }

    /// Secret `namespace/name`, `None` when it does not exist.
    pub async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Secret>, ClusterError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        with_deadline(format!("get secret {namespace}/{name}"), api.get_opt(name)).await
    }

    /// A token of service account `namespace/service_account` bound to pod `pod_name`
    /// (`pod_uid`), for `audiences` (empty: the API server's), valid `expiration_seconds`.
    pub async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration_seconds: i64,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<Token, ClusterError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(audiences.to_vec()),
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    name: Some(pod_name.to_owned()),
                    uid: Some(pod_uid.to_owned()),
                }),
            }),
            ..Default::default()
        };
        let answer = with_deadline(
            format!("create token for serviceaccount {namespace}/{service_account}"),
            api.create_token_request(service_account, &PostParams::default(), &request),
        )
        .await?;
        let status = answer.status.unwrap_or_default();
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ClusterError::Api {
                what: format!("create token for serviceaccount {namespace}/{service_account}"),
                source: kube::Error::Service("the answer holds no token".into()),
            })?;
        Ok(Token {
            token,
            expires_unix: status.expiration_timestamp.map_or(0, |t| t.0.as_second()),
            expiration_seconds: answer
                .spec
                .and_then(|s| s.expiration_seconds)
                .unwrap_or(expiration_seconds),
        })
    }

    /// The `kubernetes` Service in `default`: its ClusterIP and ports (name, port, protocol).
    pub async fn kubernetes_service(
        &self,
    ) -> Result<(String, Vec<(String, i32, String)>), ClusterError> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let service =
            with_deadline("get service default/kubernetes", api.get("kubernetes")).await?;
        let spec = service.spec.unwrap_or_default();
        let ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                (
                    p.name.unwrap_or_default(),
                    p.port,
                    p.protocol.unwrap_or_default(),
                )
            })
            .collect();
        Ok((spec.cluster_ip.unwrap_or_default(), ports))
    }
}

/// The host and port of a kubeconfig's API server URL (`https://127.0.0.1:6443`), for
/// [`PodApiServer::Fixed`]; the port defaults to 443.
pub fn host_and_port(url: &http::Uri) -> Option<(String, u16)> {
    let host = url.host()?.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_owned(), url.port_u16().unwrap_or(443)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_and_port_of_a_server_url() {
        let at = |s: &str| host_and_port(&s.parse().expect("uri"));
        assert_eq!(
            at("https://127.0.0.1:6443"),
            Some(("127.0.0.1".into(), 6443))
        );
        assert_eq!(at("https://api.example"), Some(("api.example".into(), 443)));
        assert_eq!(at("https://[::1]:8443/"), Some(("::1".into(), 8443)));
    }
}
