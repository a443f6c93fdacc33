//! Connecting to the API server with the node's identity, and deadlines on every call.
//!
//! The configuration is a kubeconfig file (`--kubeconfig`), or inferred as client-go does
//! (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account). The identity should
//! be a node identity (`system:node:<name>` in `system:nodes`): everything the front end does
//! is allowed by the Node authorizer with the NodeRestriction admission plugin.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder};

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

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An HTTP/2 connection with nothing received for this long is pinged (client-go's
/// `ReadIdleTimeout`, 30 s) ...
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// ... and closed when the ping is not answered in this long (client-go's `PingTimeout`, 15 s),
/// so a dead connection fails its requests and watches, which are then retried on a new one.
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The environment variable that keeps the HTTP/1.1 client.
pub const HTTP1_ENV: &str = "DEVICELET_KUBE_API_HTTP1";

/// Builds a client for `source`: HTTP/2 where the server offers it, unless [`HTTP1_ENV`] is
/// set to `1` or `true`.
pub async fn connect(source: &ClusterSource) -> Result<Client, ClusterError> {
    install_crypto_provider();
    let mut config = load_config(source).await?;
    if http1_only() {
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        // Watches hold a request open for up to their server-side timeout (290 s in kube's
        // watcher); every other call is bounded by `with_deadline`.
        config.read_timeout = Some(Duration::from_secs(300));
        config.write_timeout = Some(API_DEADLINE);
        return Client::try_from(config).map_err(ClusterError::Client);
    }
    multiplexed_client(&config).map_err(ClusterError::Client)
}

fn http1_only() -> bool {
    std::env::var(HTTP1_ENV).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// kube's client stack (base URI, authentication, extra headers) over a connection pool that
/// negotiates HTTP/2 by ALPN and keeps one connection per server for every request, falling
/// back to HTTP/1.1 where the server does not offer `h2`. Per-request deadlines are
/// [`with_deadline`]'s; a dead connection is found by HTTP/2 pings rather than socket read
/// timeouts, which would cut a quiet watch sharing the connection.
fn multiplexed_client(config: &Config) -> Result<Client, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_nodelay(true);
    let tls = config.rustls_client_config()?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = config.tls_server_name.as_ref() {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| kube::Error::Service(format!("tls-server-name {name:?}: {e}").into()))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let connector = https.enable_all_versions().wrap_connector(tcp);
    let pool = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(pool);
    Ok(ClientBuilder::new(service, config.default_namespace.clone()).build())
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
