//! DRA driver clients: the [`DraPluginClient`] / [`DraPluginDialer`] seams and the real tonic
//! implementation for `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and `...v1beta1.DRAPlugin`.
//!
//! Follows `pkg/kubelet/cm/dra/plugin/dra_plugin.go` and `dra/v1beta1/conversion.go`
//! (spec dra-kubelet.md §1.2, §1.3, §1.9): one long-lived channel per driver instance created
//! without a blocking dial (registration succeeds even if nothing listens yet), every call
//! carries a deadline (45 s by default) that is also enforced locally, and the channel
//! reconnects by itself after the driver restarts. Wire messages are converted into our own
//! domain types ([`ClaimRef`], [`PreparedDevice`]); a v1beta1 driver never reports a ShareID.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use devicelet_proto::dra::{v1, v1beta1};
use devicelet_transport::{call_with_deadline, request_with_deadline};
use futures::FutureExt;
use futures::future::BoxFuture;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{DraError, RpcError};

/// Which DRA service a driver instance is spoken to with (§1.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraService {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1Beta1,
}

impl DraService {
    /// The string advertised in `PluginInfo.supported_versions`.
    pub fn as_str(self) -> &'static str {
        match self {
            DraService::V1 => devicelet_proto::constants::dra::V1_DRA_PLUGIN_SERVICE,
            DraService::V1Beta1 => devicelet_proto::constants::dra::V1BETA1_DRA_PLUGIN_SERVICE,
        }
    }

    /// Full gRPC path of `NodePrepareResources` (the `method_name` label of
    /// `dra_grpc_operations_duration_seconds`, B15).
    pub fn prepare_method(self) -> &'static str {
        match self {
            DraService::V1 => "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            DraService::V1Beta1 => {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
            }
        }
    }

    /// Full gRPC path of `NodeUnprepareResources`.
    pub fn unprepare_method(self) -> &'static str {
        match self {
            DraService::V1 => "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            DraService::V1Beta1 => {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
            }
        }
    }
}

/// grpc-go's name of a status code (`codes.Code.String()`: `OK`, `DeadlineExceeded`, ...), the
/// `grpc_status_code` label the kubelet's interceptor records (B15).
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "Canceled",
        C::Unknown => "Unknown",
        C::InvalidArgument => "InvalidArgument",
        C::DeadlineExceeded => "DeadlineExceeded",
        C::NotFound => "NotFound",
        C::AlreadyExists => "AlreadyExists",
        C::PermissionDenied => "PermissionDenied",
        C::ResourceExhausted => "ResourceExhausted",
        C::FailedPrecondition => "FailedPrecondition",
        C::Aborted => "Aborted",
        C::OutOfRange => "OutOfRange",
        C::Unimplemented => "Unimplemented",
        C::Internal => "Internal",
        C::Unavailable => "Unavailable",
        C::DataLoss => "DataLoss",
        C::Unauthenticated => "Unauthenticated",
    }
}

/// One claim as sent to a driver (`Claim{namespace, uid, name}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimRef {
    /// Claim namespace.
    pub namespace: String,
    /// Claim UID.
    pub uid: String,
    /// Claim name.
    pub name: String,
}

/// One device a driver prepared (`Device`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// Requests of the claim this device serves; empty = all requests.
    pub request_names: Vec<String>,
    /// Pool name.
    pub pool_name: String,
    /// Device name.
    pub device_name: String,
    /// Fully-qualified CDI device IDs.
    pub cdi_device_ids: Vec<String>,
    /// ShareID of a consumable-capacity allocation (v1 only).
    pub share_id: Option<String>,
}

/// Per-claim answer of `NodePrepareResources` (`NodePrepareResourceResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClaimPrepareResult {
    /// Devices (ignored when `error` is non-empty).
    pub devices: Vec<PreparedDevice>,
    /// Non-empty = preparation of this claim failed.
    pub error: String,
}

/// Answer of `NodePrepareResources`, keyed by claim UID.
pub type PrepareResponse = HashMap<String, ClaimPrepareResult>;
/// Answer of `NodeUnprepareResources`, keyed by claim UID; value = error text (empty = ok).
pub type UnprepareResponse = HashMap<String, String>;

/// One connection to one driver instance. All calls of the instance share it (§1.9).
pub trait DraPluginClient: Send + Sync + 'static {
    /// `NodePrepareResources` for a batch of claims, bounded by `deadline`.
    fn node_prepare_resources(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Duration,
    ) -> BoxFuture<'static, Result<PrepareResponse, RpcError>>;
    /// `NodeUnprepareResources` for a batch of claims, bounded by `deadline`.
    fn node_unprepare_resources(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Duration,
    ) -> BoxFuture<'static, Result<UnprepareResponse, RpcError>>;
    /// Whether a transport to the driver is currently up (drives instance choice, E14).
    fn is_connected(&self) -> bool;
    /// Closes the connection (deregistration).
    fn close(&self) {}
    /// Opens `v1alpha1.DRAResourceHealth/NodeWatchResources` on the instance's connection
    /// (§1.4, §1.10). Each item is the driver's complete device list. Drivers without the
    /// service answer `Unimplemented`; the default is that answer.
    fn watch_health(&self) -> BoxFuture<'static, Result<HealthStream, RpcError>> {
        futures::future::ready(Err(RpcError {
            code: tonic::Code::Unimplemented,
            message: "health stream not supported by this client".to_owned(),
        }))
        .boxed()
    }
}

/// Device health as reported by a driver (`DeviceHealth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthStatus {
    /// `UNKNOWN` (also any unknown enum value).
    Unknown,
    /// `HEALTHY`.
    Healthy,
    /// `UNHEALTHY`.
    Unhealthy,
}

/// One device's health report, converted (§1.4, B18).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealthReport {
    /// Pool name.
    pub pool_name: String,
    /// Device name.
    pub device_name: String,
    /// Health.
    pub health: HealthStatus,
    /// How long the report stays valid (≤0 from the driver → 30 s).
    pub timeout: Duration,
    /// Message, at most 1024 bytes.
    pub message: String,
}

/// Stream of complete device lists from one driver instance.
pub type HealthStream =
    futures::stream::BoxStream<'static, Result<Vec<DeviceHealthReport>, RpcError>>;

/// Cuts `msg` to the 1024-byte API limit ending in `...`. Upstream (E20) cuts bytes and can
/// split a UTF-8 sequence; we cut at a character boundary.
pub fn truncate_health_message(msg: &str) -> String {
    let max = devicelet_proto::constants::dra::HEALTH_MESSAGE_MAX_LENGTH;
    if msg.len() <= max {
        return msg.to_owned();
    }
    let mut n = max - 3;
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    format!("{}...", &msg[..n])
}

fn health_from_proto(d: devicelet_proto::dra_health::v1alpha1::DeviceHealth) -> DeviceHealthReport {
    use devicelet_proto::dra_health::v1alpha1::HealthStatus as Pb;
    let id = d.device.unwrap_or_default();
    let health = match Pb::try_from(d.health) {
        Ok(Pb::Healthy) => HealthStatus::Healthy,
        Ok(Pb::Unhealthy) => HealthStatus::Unhealthy,
        _ => HealthStatus::Unknown,
    };
    let timeout = u64::try_from(d.health_check_timeout_seconds)
        .ok()
        .filter(|s| *s > 0)
        .map_or(
            devicelet_proto::constants::dra::DEFAULT_HEALTH_CHECK_TIMEOUT,
            Duration::from_secs,
        );
    DeviceHealthReport {
        pool_name: id.pool_name,
        device_name: id.device_name,
        health,
        timeout,
        message: truncate_health_message(&d.message),
    }
}

/// Creates the client of a newly registered driver instance. Must not block on the driver
/// (registration succeeds before the driver listens, §1.9).
pub trait DraPluginDialer: Send + Sync + 'static {
    /// A client for `driver` at `endpoint`, speaking `service`.
    fn dial(
        &self,
        driver: &str,
        endpoint: &Path,
        service: DraService,
    ) -> Result<Arc<dyn DraPluginClient>, DraError>;
}

/// The real dialer: a lazily connecting tonic channel over the Unix socket `endpoint`.
#[derive(Debug, Clone, Default)]
pub struct GrpcDraDialer;

impl DraPluginDialer for GrpcDraDialer {
    fn dial(
        &self,
        driver: &str,
        endpoint: &Path,
        service: DraService,
    ) -> Result<Arc<dyn DraPluginClient>, DraError> {
        Ok(Arc::new(GrpcDraClient::connect_lazy(
            driver, endpoint, service,
        )?))
    }
}

/// tonic client of one driver instance (v1 or v1beta1 on the wire).
#[derive(Debug, Clone)]
pub struct GrpcDraClient {
    channel: Channel,
    service: DraService,
    connected: Arc<AtomicBool>,
}

/// gRPC reconnect uses tonic's own back-off; this bounds one connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

impl GrpcDraClient {
    /// Creates the channel without dialing; the first call (or tonic's reconnect) connects.
    pub fn connect_lazy(
        driver: &str,
        endpoint: &Path,
        service: DraService,
    ) -> Result<Self, DraError> {
        if endpoint.as_os_str().len() > devicelet_transport::MAX_SOCKET_PATH_LEN {
            return Err(DraError::Dial {
                driver: driver.to_owned(),
                endpoint: endpoint.to_path_buf(),
                reason: "socket path too long".to_owned(),
            });
        }
        let socket: PathBuf = endpoint.to_path_buf();
        let connected = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&connected);
        let connector = tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            let flag = Arc::clone(&flag);
            async move {
                let result = tokio::net::UnixStream::connect(&socket).await;
                flag.store(result.is_ok(), Ordering::Relaxed);
                result.map(hyper_util::rt::TokioIo::new)
            }
        });
        // The kubelet dials with `:authority = localhost` (kubernetes#112597).
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(CONNECT_TIMEOUT)
            .connect_with_connector_lazy(connector);
        Ok(GrpcDraClient {
            channel,
            service,
            connected,
        })
    }

    fn note(&self, status: &tonic::Status) {
        if status.code() == tonic::Code::Unavailable {
            self.connected.store(false, Ordering::Relaxed);
        }
    }
}

fn to_v1_claims(claims: Vec<ClaimRef>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

fn to_v1beta1_claims(claims: Vec<ClaimRef>) -> Vec<v1beta1::Claim> {
    claims
        .into_iter()
        .map(|c| v1beta1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

fn from_v1_response(r: v1::NodePrepareResourcesResponse) -> PrepareResponse {
    r.claims
        .into_iter()
        .map(|(uid, c)| {
            let devices = c
                .devices
                .into_iter()
                .map(|d| PreparedDevice {
                    request_names: d.request_names,
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                    share_id: d.share_id,
                })
                .collect();
            (
                uid,
                ClaimPrepareResult {
                    devices,
                    error: c.error,
                },
            )
        })
        .collect()
}

fn from_v1beta1_response(r: v1beta1::NodePrepareResourcesResponse) -> PrepareResponse {
    r.claims
        .into_iter()
        .map(|(uid, c)| {
            let devices = c
                .devices
                .into_iter()
                .map(|d| PreparedDevice {
                    request_names: d.request_names,
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                    share_id: None,
                })
                .collect();
            (
                uid,
                ClaimPrepareResult {
                    devices,
                    error: c.error,
                },
            )
        })
        .collect()
}

impl DraPluginClient for GrpcDraClient {
    fn node_prepare_resources(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Duration,
    ) -> BoxFuture<'static, Result<PrepareResponse, RpcError>> {
        let this = self.clone();
        async move {
            let result = match this.service {
                DraService::V1 => {
                    let mut c = v1::dra_plugin_client::DraPluginClient::new(this.channel.clone());
                    let req = request_with_deadline(
                        v1::NodePrepareResourcesRequest {
                            claims: to_v1_claims(claims),
                        },
                        deadline,
                    );
                    call_with_deadline(deadline, c.node_prepare_resources(req))
                        .await
                        .map(|r| from_v1_response(r.into_inner()))
                }
                DraService::V1Beta1 => {
                    let mut c =
                        v1beta1::dra_plugin_client::DraPluginClient::new(this.channel.clone());
                    let req = request_with_deadline(
                        v1beta1::NodePrepareResourcesRequest {
                            claims: to_v1beta1_claims(claims),
                        },
                        deadline,
                    );
                    call_with_deadline(deadline, c.node_prepare_resources(req))
                        .await
                        .map(|r| from_v1beta1_response(r.into_inner()))
                }
            };
            result.map_err(|s| {
                this.note(&s);
                RpcError::from(s)
            })
        }
        .boxed()
    }

    fn node_unprepare_resources(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Duration,
    ) -> BoxFuture<'static, Result<UnprepareResponse, RpcError>> {
        let this = self.clone();
        async move {
            let result = match this.service {
                DraService::V1 => {
                    let mut c = v1::dra_plugin_client::DraPluginClient::new(this.channel.clone());
                    let req = request_with_deadline(
                        v1::NodeUnprepareResourcesRequest {
                            claims: to_v1_claims(claims),
                        },
                        deadline,
                    );
                    call_with_deadline(deadline, c.node_unprepare_resources(req))
                        .await
                        .map(|r| {
                            r.into_inner()
                                .claims
                                .into_iter()
                                .map(|(k, v)| (k, v.error))
                                .collect()
                        })
                }
                DraService::V1Beta1 => {
                    let mut c =
                        v1beta1::dra_plugin_client::DraPluginClient::new(this.channel.clone());
                    let req = request_with_deadline(
                        v1beta1::NodeUnprepareResourcesRequest {
                            claims: to_v1beta1_claims(claims),
                        },
                        deadline,
                    );
                    call_with_deadline(deadline, c.node_unprepare_resources(req))
                        .await
                        .map(|r| {
                            r.into_inner()
                                .claims
                                .into_iter()
                                .map(|(k, v)| (k, v.error))
                                .collect()
                        })
                }
            };
            result.map_err(|s| {
                this.note(&s);
                RpcError::from(s)
            })
        }
        .boxed()
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    fn watch_health(&self) -> BoxFuture<'static, Result<HealthStream, RpcError>> {
        use devicelet_proto::dra_health::v1alpha1::{
            NodeWatchResourcesRequest, dra_resource_health_client::DraResourceHealthClient,
        };
        use futures::StreamExt;
        let this = self.clone();
        async move {
            // Same channel as prepare/unprepare: one connection per instance (§1.9).
            let mut c = DraResourceHealthClient::new(this.channel.clone());
            let stream = c
                .node_watch_resources(NodeWatchResourcesRequest {})
                .await
                .map_err(|s| {
                    this.note(&s);
                    RpcError::from(s)
                })?
                .into_inner();
            let mapped = stream.map(|item| {
                item.map(|r| r.devices.into_iter().map(health_from_proto).collect())
                    .map_err(RpcError::from)
            });
            Ok(mapped.boxed())
        }
        .boxed()
    }
}
