//! Unix-socket gRPC plumbing used by every server and client in this crate, kept behind two
//! functions so the shared `devicelet-transport` crate (HTTP/2 `:authority` shim for Go
//! clients, spec devicemanager.md §1.11) can replace the bodies in one place.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Accepted connections of a Unix-socket gRPC server.
pub fn incoming(listener: UnixListener) -> UnixListenerStream {
    UnixListenerStream::new(listener)
}

/// Dials a Unix-socket gRPC server with `:authority` = `localhost`, as the kubelet does
/// (k8s PR #112597).
pub async fn dial(
    path: &Path,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(connect_timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
