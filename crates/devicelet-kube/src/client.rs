//! Connecting to the API server with the node's identity, and deadlines on every call.
//!
//! The configuration is a kubeconfig file (`--kubeconfig`), or inferred as client-go does
//! (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account). The identity should
//! be a node identity (`system:node:<name>` in `system:nodes`): everything the front end does
//! is allowed by the Node authorizer with the NodeRestriction admission plugin.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::ClusterError;

/// How long a single (non-watch) API call may take.
pub const API_DEADLINE: Duration = Duration::from_secs(15);

/// Where the client configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterSource {
    /// A kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// `KUBECONFIG`, `~/.kube/config`, then the in-cluster service account.
    Infer,
}

/// Builds a client for `source`.
pub async fn connect(source: &ClusterSource) -> Result<Client, ClusterError> {
    install_crypto_provider();
    let mut config = load_config(source).await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    // Watches hold a request open for up to their server-side timeout (290 s in kube's
    // watcher); every other call is bounded by `with_deadline`.
    config.read_timeout = Some(Duration::from_secs(300));
    config.write_timeout = Some(API_DEADLINE);
    Client::try_from(config).map_err(ClusterError::Client)
}

/// The API server's URL `source` names (`https://127.0.0.1:6443`).
pub async fn server_url(source: &ClusterSource) -> Result<http::Uri, ClusterError> {
    Ok(load_config(source).await?.cluster_url)
}

async fn load_config(source: &ClusterSource) -> Result<Config, ClusterError> {
    Ok(match source {
        ClusterSource::Kubeconfig(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| ClusterError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClusterError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        ClusterSource::Infer => Config::infer().await?,
    })
}

/// Runs one API call with [`API_DEADLINE`]; `what` names it in errors and logs.
pub async fn with_deadline<T>(
    what: impl Into<String>,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ClusterError> {
    let what = what.into();
    match tokio::time::timeout(API_DEADLINE, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(ClusterError::Api { what, source }),
        Err(_) => Err(ClusterError::Deadline {
            what,
            seconds: API_DEADLINE.as_secs(),
        }),
    }
}

/// Makes `ring` rustls' process-wide crypto provider. kube's TLS is built on `ring`; another
/// crate in the same binary (the CDI library's HTTP client, through `jsonschema`) enables
/// rustls' `aws-lc-rs` too, and with two providers compiled in rustls refuses to pick one and
/// panics on the first TLS client it builds. An already installed provider is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
