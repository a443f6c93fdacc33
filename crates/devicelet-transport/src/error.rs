//! Errors of the transport helpers (binding, dialing).

use std::path::PathBuf;

/// Longest socket path Linux accepts: `sun_path` is 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH_LEN: usize = 107;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(
        "socket path {path:?} is {len} bytes long; Unix socket paths are limited to {MAX_SOCKET_PATH_LEN} bytes (sun_path)"
    )]
    SocketPathTooLong { path: PathBuf, len: usize },
    #[error("cannot create socket directory {dir:?}: {source}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to replace {path:?}: it exists and is not a Unix socket")]
    NotASocket { path: PathBuf },
    #[error("cannot remove stale socket {path:?}: {source}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot inspect socket path {path:?}: {source}")]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind Unix socket {path:?}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot move socket {from:?} into place at {to:?}: {source}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to Unix socket {path:?}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error(
        "cannot connect to Unix socket {path:?}: permission denied (connecting needs write permission on the socket and search permission on its directories)"
    )]
    ConnectPermission {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect to {path:?}: it is {kind}, not a Unix socket")]
    ConnectNotASocket { path: PathBuf, kind: &'static str },
    #[error("connecting to Unix socket {path:?} timed out after {timeout:?}")]
    ConnectTimeout {
        path: PathBuf,
        timeout: std::time::Duration,
    },
}
