//! Unix-socket gRPC plumbing used by every server and client devicelet runs, delegating to the
//! shared `devicelet-transport` crate: servers accept connections through its HTTP/2
//! `:authority` shim, so Go clients that send the socket path as `:authority` (spec
//! devicemanager.md §1.11) are accepted; clients dial with `:authority` = `localhost`, as the
//! kubelet does (k8s PR #112597).

use std::io;
use std::path::Path;
use std::time::Duration;

use devicelet_transport::{AuthorityShim, TransportError};
use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::Channel;

/// Accepted connections of a Unix-socket gRPC server, behind the `:authority` shim.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<AuthorityShim<UnixStream>>> {
    devicelet_transport::shimmed_incoming(listener)
}

/// Binds a Unix listener (path length checked, stale socket replaced, non-sockets refused).
pub fn bind(path: &Path) -> Result<UnixListener, TransportError> {
    devicelet_transport::bind_unix_listener(path)
}

/// Binds a Unix listener that appears at `path` atomically (temporary name, then rename), as
/// the kubelet creates `pod-resources/kubelet.sock` (spec devicemanager.md §5.1).
pub fn bind_atomic(path: &Path) -> Result<UnixListener, TransportError> {
    devicelet_transport::bind_unix_listener_atomic(path)
}

/// Dials a Unix-socket gRPC server with `:authority` = `localhost`.
pub async fn dial(path: &Path, connect_timeout: Duration) -> Result<Channel, TransportError> {
    devicelet_transport::dial_unix(path, connect_timeout).await
}
