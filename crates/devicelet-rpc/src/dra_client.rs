//! The tonic implementation of the DRA manager's driver seam: [`GrpcDraDialer`] creates one
//! lazily connecting channel per driver instance and [`GrpcDraClient`] speaks
//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, `...v1beta1.DRAPlugin` and
//! `v1alpha1.DRAResourceHealth` on it, converting wire messages into devicelet-dra's domain
//! types ([`ClaimRef`], [`PreparedDevice`], [`DeviceHealthReport`]).
//!
//! Follows `pkg/kubelet/cm/dra/plugin/dra_plugin.go` and `dra/v1beta1/conversion.go`
//! (spec dra-kubelet.md §1.2, §1.3, §1.9): the channel is created without a blocking dial
//! (registration succeeds even if nothing listens yet), every call carries a deadline (45 s by
//! default) that is also enforced locally, and the channel reconnects by itself after the driver
//! restarts. A v1beta1 driver never reports a ShareID.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::debug;

use devicelet_dra::{
    ClaimPrepareResult, ClaimRef, DeviceHealthReport, DraError, DraPluginClient, DraPluginDialer,
    DraService, HealthStatus, HealthStream, PrepareResponse, PreparedDevice, RpcCode, RpcError,
    UnprepareResponse, truncate_health_message,
};
use devicelet_proto::dra::{v1, v1beta1};
use devicelet_transport::{call_with_deadline, request_with_deadline};
use futures::FutureExt;
use futures::future::BoxFuture;
use tonic::transport::{Channel, Endpoint, Uri};

/// tonic's status code as devicelet-dra's (the same 17 gRPC codes).
pub fn rpc_code(code: tonic::Code) -> RpcCode {
    use tonic::Code as C;
    match code {
        C::Ok => RpcCode::Ok,
        C::Cancelled => RpcCode::Cancelled,
        C::Unknown => RpcCode::Unknown,
        C::InvalidArgument => RpcCode::InvalidArgument,
        C::DeadlineExceeded => RpcCode::DeadlineExceeded,
        C::NotFound => RpcCode::NotFound,
        C::AlreadyExists => RpcCode::AlreadyExists,
        C::PermissionDenied => RpcCode::PermissionDenied,
        C::ResourceExhausted => RpcCode::ResourceExhausted,
        C::FailedPrecondition => RpcCode::FailedPrecondition,
        C::Aborted => RpcCode::Aborted,
        C::OutOfRange => RpcCode::OutOfRange,
        C::Unimplemented => RpcCode::Unimplemented,
        C::Internal => RpcCode::Internal,
        C::Unavailable => RpcCode::Unavailable,
        C::DataLoss => RpcCode::DataLoss,
        C::Unauthenticated => RpcCode::Unauthenticated,
    }
}

/// A tonic status as the DRA manager's RPC error (code and message kept).
pub fn rpc_error(status: tonic::Status) -> RpcError {
    RpcError {
        code: rpc_code(status.code()),
        message: status.message().to_owned(),
    }
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
                        .map(|r| {
                            // The driver's raw answer (CDI ids, device metadata) for `-v`.
                            debug!(answer = ?r.get_ref(), "NodePrepareResources answered");
                            from_v1_response(r.into_inner())
                        })
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
                        .map(|r| {
                            debug!(answer = ?r.get_ref(), "NodePrepareResources answered");
                            from_v1beta1_response(r.into_inner())
                        })
                }
            };
            result.map_err(|s| {
                this.note(&s);
                rpc_error(s)
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
                            debug!(answer = ?r.get_ref(), "NodeUnprepareResources answered");
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
                            debug!(answer = ?r.get_ref(), "NodeUnprepareResources answered");
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
                rpc_error(s)
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
                    rpc_error(s)
                })?
                .into_inner();
            let mapped = stream.map(|item| {
                item.map(|r| r.devices.into_iter().map(health_from_proto).collect())
                    .map_err(rpc_error)
            });
            Ok(mapped.boxed())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes' texts must stay tonic's: `RpcError`'s message prints `{code:?}` and operators
    /// and tests match on it.
    #[test]
    fn rpc_code_debug_and_display_texts_are_tonics() {
        for (n, ours) in RpcCode::ALL.into_iter().enumerate() {
            let theirs = tonic::Code::from(i32::try_from(n).expect("small"));
            assert_eq!(rpc_code(theirs), ours);
            assert_eq!(ours as i32, theirs as i32);
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
            assert_eq!(ours.to_string(), theirs.to_string());
        }
    }

    #[test]
    fn rpc_error_keeps_code_and_message() {
        let e = rpc_error(tonic::Status::unavailable("connection refused"));
        assert_eq!(e.code, RpcCode::Unavailable);
        assert_eq!(
            e.to_string(),
            "rpc error: code = Unavailable desc = connection refused"
        );
    }
}
