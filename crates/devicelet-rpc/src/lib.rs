//! devicelet-rpc: the one place that translates between gRPC (and the HTTP control API) and the
//! node core (`devicelet-node`) and managers: the v1beta1 Registration server on `kubelet.sock`,
//! the tonic device-plugin and DRA driver clients, the plugin watcher on `plugins_registry` (with the device
//! plugin and DRA handlers), stale-socket cleanup, the PodResources API, the control API on
//! `R/devicelet/devicelet.sock`, the `/metrics` endpoint, and the [`Daemon`] that wires them
//! for one root directory. Servers decode, call the node, encode; they decide nothing.

pub mod cleanup;
pub mod control;
pub mod convert;
pub mod daemon;
pub mod dra_client;
pub mod dra_handler;
pub mod error;
pub mod metrics;
pub mod plugin_client;
pub mod plugin_watcher;
pub mod podresources;
pub mod registration;
pub mod root_guard;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
pub mod transport;
pub mod ui;

pub use control::{ControlClient, ControlState};
pub use daemon::{Daemon, DaemonConfig, RootPaths, check_root};
pub use devicelet_metrics::Metrics;
pub use dra_client::{GrpcDraClient, GrpcDraDialer};
pub use dra_handler::DraHandler;
pub use error::{ControlError, RpcError};
pub use metrics::{DEFAULT_METRICS_ADDRESS, MetricsServer};
pub use plugin_client::{TonicDevicePluginClient, TonicPluginDialer};
pub use plugin_watcher::{DevicePluginHandler, HandlerError, PluginHandler, PluginWatcher};
pub use podresources::{PodResourcesService, TokenBucket};
pub use registration::RegistrationService;
