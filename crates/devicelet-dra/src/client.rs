//! DRA driver clients: the [`DraPluginClient`] / [`DraPluginDialer`] seams and the domain types
//! they speak ([`ClaimRef`], [`PreparedDevice`], [`DeviceHealthReport`], ...).
//!
//! Follows `pkg/kubelet/cm/dra/plugin/dra_plugin.go` (spec dra-kubelet.md §1.2, §1.3, §1.9):
//! one long-lived connection per driver instance, created without blocking on the driver, every
//! call bounded by a deadline. The tonic implementation (v1 and v1beta1 on the wire, wire
//! conversions) is `devicelet_rpc::dra_client`, so this crate carries no gRPC library.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::error::{DraError, RpcCode, RpcError};

/// `supported_versions` entry of a driver serving DRA v1.
pub const V1_DRA_PLUGIN_SERVICE: &str = "v1.DRAPlugin";
/// `supported_versions` entry of a driver serving DRA v1beta1.
pub const V1BETA1_DRA_PLUGIN_SERVICE: &str = "v1beta1.DRAPlugin";
/// Maximum length of a device health message in bytes (the API's limit).
pub const HEALTH_MESSAGE_MAX_LENGTH: usize = 1024;

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
            DraService::V1 => V1_DRA_PLUGIN_SERVICE,
            DraService::V1Beta1 => V1BETA1_DRA_PLUGIN_SERVICE,
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
pub fn grpc_code_name(code: RpcCode) -> &'static str {
    use RpcCode as C;
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
            code: RpcCode::Unimplemented,
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
    let max = HEALTH_MESSAGE_MAX_LENGTH;
    if msg.len() <= max {
        return msg.to_owned();
    }
    let mut n = max - 3;
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    format!("{}...", &msg[..n])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_message_is_cut_to_the_api_limit_like_the_kubelet() {
        // core/v1 ResourceHealthMessageMaxLength; manager.go keeps max-3 bytes and adds "...".
        assert_eq!(HEALTH_MESSAGE_MAX_LENGTH, 1024);
        let exact = "a".repeat(1024);
        assert_eq!(truncate_health_message(&exact), exact);
        let long = "b".repeat(1025);
        let cut = truncate_health_message(&long);
        assert_eq!(cut.len(), 1024);
        assert_eq!(cut, format!("{}...", "b".repeat(1021)));
        // A multi-byte character across the cut is dropped whole, not split.
        let utf8 = format!("{}é{}", "c".repeat(1020), "d".repeat(10));
        let cut = truncate_health_message(&utf8);
        assert_eq!(cut, format!("{}...", "c".repeat(1020)));
        assert!(cut.len() <= 1024);
    }
}
