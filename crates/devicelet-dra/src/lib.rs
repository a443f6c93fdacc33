//! devicelet-dra: the kubelet's Dynamic Resource Allocation manager, testable without a cluster.
//!
//! Follows `pkg/kubelet/cm/dra/` of Kubernetes 1.36 (spec dra-kubelet.md §1–§3, §6; ecosystem.md
//! A7, A8) with upstream bugs E1–E4 fixed:
//! - [`DraPluginRegistry`]: driver instances registered by the plugin watcher (version choice,
//!   several instances per driver, newest connected wins, idempotent deregistration).
//! - [`DraPluginClient`] / [`DraPluginDialer`]: one connection per driver instance, in domain
//!   types ([`ClaimRef`], [`PreparedDevice`], [`DeviceHealthReport`]; errors carry an
//!   [`RpcCode`]). This crate has no gRPC library: the tonic implementation (v1 and v1beta1 on
//!   the wire) is `devicelet_rpc::GrpcDraDialer`.
//! - [`ClaimCache`]: prepare/unprepare of a pod's claims, reference-counted by pod UID, batched
//!   per driver, persisted in `R/dra_manager_state` (kubelet format) before success is reported.
//! - [`ClaimSource`] / [`InMemoryClaimSource`]: where claims are read from; [`SliceSource`]:
//!   where the node's published ResourceSlices are listed in cluster mode.
//! - [`pod`]: claim name resolution and per-container claim/request references.
//! - `fake` (feature `test-utils`): in-process fake driver and object builders for tests and
//!   benches.
//!
//! Wiring (the daemon in `devicelet-rpc` owns this; neither its `PluginHandler` nor its dialer is
//! a dependency here, so that crate may depend on this one):
//!
//! ```ignore
//! struct DraHandler(devicelet_dra::DraPluginRegistry);
//! impl devicelet_rpc::plugin_watcher::PluginHandler for DraHandler {
//!     fn validate(&self, n: &str, ep: &Path, v: &[String]) -> Result<(), HandlerError> {
//!         Ok(self.0.validate(n, ep, v)?)
//!     }
//!     fn register(&self, n: String, ep: PathBuf, v: Vec<String>)
//!         -> BoxFuture<'static, Result<(), HandlerError>> {
//!         let result = self.0.register(&n, &ep, &v).map(|_| ()).map_err(HandlerError::from);
//!         futures::future::ready(result).boxed()
//!     }
//!     fn deregister(&self, n: &str, ep: &Path) { self.0.deregister(n, ep) }
//! }
//! let registry = DraPluginRegistry::new(Arc::new(devicelet_rpc::GrpcDraDialer));
//! watcher.add_handler("DRAPlugin", Arc::new(DraHandler(registry.clone())));
//! let claims = ClaimCache::open(root_dir, registry, &ProcBootId::default())?;
//! // admit/sandbox: claims.prepare_resources(&pod, &source).await?
//! // container start: claims.container_cdi_devices(&pod, &container)? -> CRI cdiDevices
//! // pod terminated: claims.unprepare_resources(pod_uid).await (retry until Ok)
//! // every 60 s: claims.reconcile_orphans(&active_pod_uids).await
//! // terminal phase only when !claims.pod_might_need_to_unprepare(pod_uid)
//! ```

pub mod boot;
pub mod claim_cache;
pub mod client;
pub mod error;
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
pub mod pod;
pub mod registry;
pub mod source;

pub use boot::{BootIdSource, FixedBootId, ProcBootId};
pub use claim_cache::{CachedClaim, ClaimCache, PrepareTimings};
pub use client::{
    ClaimPrepareResult, ClaimRef, DeviceHealthReport, DraPluginClient, DraPluginDialer, DraService,
    HEALTH_MESSAGE_MAX_LENGTH, HealthStatus, HealthStream, PrepareResponse, PreparedDevice,
    UnprepareResponse, V1_DRA_PLUGIN_SERVICE, V1BETA1_DRA_PLUGIN_SERVICE, grpc_code_name,
    truncate_health_message,
};
pub use error::{DraError, RpcCode, RpcError, VersionError};
pub use registry::{DRA_RPC_TIMEOUT, DraPluginInstance, DraPluginRegistry, choose_service};
pub use source::{ClaimSource, ClaimSourceError, InMemoryClaimSource, SliceSource};
