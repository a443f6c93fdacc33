//! Errors of the CRI runtime.

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong talking to the container runtime or preparing a container.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// `--container-runtime-endpoint` is not usable.
    #[error("container runtime endpoint {endpoint:?}: {why}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// Why it cannot be used.
        why: String,
    },
    /// The runtime's socket could not be dialed.
    #[error("cannot reach the container runtime at {}: {source}", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// The dial error.
        source: devicelet_transport::TransportError,
    },
    /// A CRI call failed.
    #[error("CRI {call}: {} ({:?})", status.message(), status.code())]
    Call {
        /// The CRI method.
        call: &'static str,
        /// The runtime's answer.
        status: tonic::Status,
    },
    /// A CRI call took longer than its deadline.
    #[error("CRI {call}: no answer within {after:?}")]
    Timeout {
        /// The CRI method.
        call: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The runtime answered something devicelet cannot use.
    #[error("CRI {call}: {why}")]
    Malformed {
        /// The CRI method.
        call: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The container cannot be configured (the kubelet's `CreateContainerConfigError`).
    #[error("{0}")]
    Config(String),
    /// A CDI device name cannot be resolved or its spec is invalid.
    #[error("CDI: {0}")]
    Cdi(String),
    /// devicelet's own record of the pods it runs cannot be read or written.
    #[error("runtime state {}: {why}", path.display())]
    State {
        /// The file or directory.
        path: PathBuf,
        /// What happened.
        why: String,
    },
    /// The node gave no settings for a container (it is not admitted, a plugin failed).
    #[error("container settings: {0}")]
    Settings(String),
    /// A volume's contents (configMap, secret, token, downward API) cannot be read or
    /// written.
    #[error("volume {volume:?}: {why}")]
    Volume {
        /// The pod's volume.
        volume: String,
        /// Why.
        why: String,
    },
}

impl RuntimeError {
    /// The kubelet's waiting reason for a container that could not be created because of this.
    pub fn waiting_reason(&self) -> &'static str {
        match self {
            RuntimeError::Config(_)
            | RuntimeError::Cdi(_)
            | RuntimeError::Settings(_)
            | RuntimeError::Volume { .. } => "CreateContainerConfigError",
            _ => "CreateContainerError",
        }
    }
}
