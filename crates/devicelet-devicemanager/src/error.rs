//! Typed errors of the device manager. Registration errors keep the kubelet's message texts
//! (`dm/plugin/v1beta1/server.go`, `handler.go`) so plugin authors see what they would see with a
//! real kubelet; our extra checks (endpoint, deadlines) name the cause in the same style.

use std::path::PathBuf;
use std::time::Duration;

/// Why a `Register` (or plugin-watcher registration) was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// `RegisterRequest.version` is not `v1beta1`.
    #[error(
        "requested API version \"{version}\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
    )]
    UnsupportedVersion {
        /// The version the plugin sent.
        version: String,
    },
    /// The plugin-watcher `PluginInfo.supported_versions` does not contain `v1beta1`.
    #[error("manager version, v1beta1, is not among plugin supported versions {versions:?}")]
    NoSupportedVersion {
        /// The versions the plugin listed.
        versions: Vec<String>,
    },
    /// The resource name is not an extended resource name.
    #[error("the ResourceName \"{resource}\" is invalid")]
    InvalidResourceName {
        /// The name the plugin sent.
        resource: String,
    },
    /// The endpoint is not a plain file name inside the device-plugin directory.
    #[error("invalid endpoint {endpoint:?} for device plugin: {reason}")]
    InvalidEndpoint {
        /// The endpoint the plugin sent.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Dialing the plugin's socket failed or timed out.
    #[error("failed to dial device plugin at {}: {source}", path.display())]
    Dial {
        /// The socket dialed.
        path: PathBuf,
        /// The transport error.
        source: PluginError,
    },
    /// `GetDevicePluginOptions` failed or did not answer in time.
    #[error("failed to get device plugin options from {resource}: {source}")]
    Options {
        /// The resource registering.
        resource: String,
        /// The RPC error.
        source: PluginError,
    },
    /// The manager was stopped.
    #[error("device manager is stopped")]
    ManagerStopped,
}

/// An error talking to a device plugin, independent of the transport used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PluginError {
    /// Connecting to the plugin's socket failed.
    #[error("connect failed: {0}")]
    Connect(String),
    /// The plugin did not answer within the deadline.
    #[error("no answer within {0:?}")]
    DeadlineExceeded(Duration),
    /// The plugin answered with an RPC error.
    #[error("rpc error: code = {code} desc = {message}")]
    Rpc {
        /// gRPC status code name.
        code: String,
        /// gRPC status message.
        message: String,
    },
    /// The plugin answered with a response the kubelet cannot use.
    #[error("invalid response: {0}")]
    InvalidResponse(String),
    /// The plugin sent more than devicelet accepts: a message, a device list or a device ID
    /// beyond one of the bounds in [`crate::validation`].
    #[error("{what} has {found} {unit}, more than devicelet's limit of {limit}")]
    OverLimit {
        /// What was too large, for the reader ("ListAndWatch snapshot", "Allocate answer").
        what: String,
        /// Its size.
        found: usize,
        /// The bound.
        limit: usize,
        /// The unit of `found` and `limit` ("devices", "bytes").
        unit: &'static str,
    },
}

/// An error of an operation on a registered endpoint (allocation time).
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// No plugin ever registered this resource (or it was removed after its grace period).
    #[error("no device plugin registered for resource {resource}")]
    NotRegistered {
        /// The resource asked for.
        resource: String,
    },
    /// The plugin disconnected; kubelet text: `endpoint ... has been stopped`.
    #[error("endpoint for resource {resource} has been stopped")]
    Stopped {
        /// The resource asked for.
        resource: String,
    },
}
