//! Errors of the gRPC / control layer.

use std::path::PathBuf;

/// Errors of the daemon wiring, servers and control client.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The container runtime could not be reached or its pods not adopted.
    #[error("container runtime: {0}")]
    Runtime(#[from] devicelet_runtime::RuntimeError),
    /// A filesystem or socket operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Binding a Unix socket failed (path too long, not a socket, permissions, ...).
    #[error(transparent)]
    Bind(#[from] devicelet_transport::TransportError),
    /// The Topology Manager / CPU manager configuration or state is unusable.
    #[error(transparent)]
    Alignment(#[from] devicelet_node::alignment::AlignmentError),
    /// A live process (another devicelet, a kubelet) serves this root directory's sockets.
    #[error(
        "{} is already serving {}: {holder}. Nothing of it was touched. Stop it, use another \
         --root-dir, or pass --force to take its sockets over (its device plugins then register \
         with devicelet)",
        if *devicelet { "another devicelet" } else { "a kubelet or another agent" },
        root.display()
    )]
    RootInUse {
        /// The root directory.
        root: PathBuf,
        /// The socket that answered and who serves it.
        holder: crate::root_guard::SocketHolder,
        /// The control socket answered: the holder is a devicelet.
        devicelet: bool,
    },
    /// The root directory was removed or replaced while the daemon ran (`rm -rf R`): its
    /// sockets and state files are gone, so nothing can reach the daemon and nothing it writes
    /// would be found after a restart.
    #[error(
        "root directory {} was {what} while devicelet was running: its sockets and state files are gone; stopping (started again, devicelet sets up a fresh root)",
        path.display()
    )]
    RootGone {
        /// The root directory.
        path: PathBuf,
        /// "removed" or "replaced by another directory".
        what: &'static str,
    },
    /// A gRPC server failed.
    #[error("gRPC server on {} failed: {message}", path.display())]
    Server {
        /// The socket served.
        path: PathBuf,
        /// The transport error.
        message: String,
    },
    /// The `--metrics-address` could not be bound.
    #[error("cannot bind metrics address {address}: {source}")]
    MetricsBind {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The metrics HTTP server failed.
    #[error("metrics server on {address} failed: {message}")]
    MetricsServe {
        /// The address served.
        address: String,
        /// The server error.
        message: String,
    },
    /// The `--ui-address` could not be bound.
    #[error("cannot bind the page's address {address}: {source}")]
    UiBind {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The page's HTTP server failed.
    #[error("page server on {address} failed: {message}")]
    UiServe {
        /// The address served.
        address: String,
        /// The server error.
        message: String,
    },
    /// The plugin watcher could not watch its directory (e.g. inotify limits).
    #[error("cannot watch {}: {message}", path.display())]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The notify error.
        message: String,
    },
}

/// Errors of [`crate::control::ControlClient`].
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing listens on the control socket.
    #[error("devicelet is not running for this root: cannot connect to {} ({source}); start it with `devicelet serve --root-dir <R>`", path.display())]
    NotRunning {
        /// The control socket.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// HTTP exchange failed.
    #[error("control API request {path} failed: {message}")]
    Http {
        /// Request path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The daemon answered with an error status.
    #[error("control API {path} answered {status}: {body}")]
    Status {
        /// Request path.
        path: String,
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
    /// The daemon refused a pod: the kubelet's reason and message (what a user reads); the
    /// daemon's detail is logged at debug level.
    #[error("{reason}: {message}")]
    Rejected {
        /// CamelCase reason (`UnexpectedAdmissionError`, `TopologyAffinityError`).
        reason: String,
        /// The kubelet's message.
        message: String,
        /// The daemon's own error text.
        detail: String,
    },
    /// The body was not the expected JSON.
    #[error("control API {path} returned invalid JSON: {source}")]
    Json {
        /// Request path.
        path: String,
        /// Parse error.
        source: serde_json::Error,
    },
}
