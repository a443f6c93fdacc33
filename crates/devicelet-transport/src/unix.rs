//! Unix-socket listener and dialer for gRPC (spec/ecosystem.md §C1, spec/devicemanager.md §1.11).
//!
//! Serving: [`bind_unix_listener`] prepares the path the way the kubelet does for
//! `kubelet.sock` (parent directory created, stale socket removed) but refuses to delete a file
//! that is not a socket; [`shimmed_incoming`] wraps every accepted stream in [`AuthorityShim`].
//!
//! Dialing: [`dial_unix`] uses a custom connector with the URI `http://localhost`, so the
//! `:authority` we send is `localhost`, as the kubelet sends to plugins since
//! kubernetes/kubernetes#112597 (grpc-go convention; C-core servers reject other schemes,
//! project-akri/akri#497). The channel has no per-request timeout because ListAndWatch-style
//! streams live for hours; unary calls get their deadline from `call_with_deadline`.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{MAX_SOCKET_PATH_LEN, TransportError};
use crate::shim::AuthorityShim;

fn check_path_len(path: &Path) -> Result<(), TransportError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_LEN {
        return Err(TransportError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    Ok(())
}

/// Binds a Unix listener at `path`: checks the `sun_path` limit, creates the parent directory
/// if missing, removes a stale socket left by an earlier run, and refuses to remove anything that
/// is not a socket.
pub fn bind_unix_listener(path: &Path) -> Result<UnixListener, TransportError> {
    if prepare_socket_path(path)? {
        std::fs::remove_file(path).map_err(|source| TransportError::RemoveStale {
            path: path.to_path_buf(),
            source,
        })?;
    }
    UnixListener::bind(path).map_err(|source| TransportError::Bind {
        path: path.to_path_buf(),
        source,
    })
}

/// Like [`bind_unix_listener`], but the socket appears at `path` atomically, as the kubelet's
/// `CreateListener` (`cri-client/pkg/util/util_unix.go`) does for `pod-resources/kubelet.sock`:
/// bound under a temporary name in the same directory, then renamed over `path`. A client
/// never finds the path missing (a stale socket is replaced by the rename, not unlinked first)
/// nor a socket nobody listens on yet.
pub fn bind_unix_listener_atomic(path: &Path) -> Result<UnixListener, TransportError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    prepare_socket_path(path)?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{}-{n}.tmp", std::process::id()));
    if check_path_len(&tmp).is_err() {
        // No room for a temporary name within sun_path: bind in place instead.
        return bind_unix_listener(path);
    }
    // A leftover of an earlier process with the same PID; ours are renamed away at once.
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|source| TransportError::Bind {
        path: tmp.clone(),
        source,
    })?;
    if let Err(source) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(TransportError::Rename {
            from: tmp,
            to: path.to_path_buf(),
            source,
        });
    }
    Ok(listener)
}

/// Checks the length, creates the parent directory, and refuses a non-socket at `path`;
/// `true` when a (stale) socket is there.
fn prepare_socket_path(path: &Path) -> Result<bool, TransportError> {
    check_path_len(path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| TransportError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => Ok(true),
        Ok(_) => Err(TransportError::NotASocket {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(TransportError::Stat {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Pause after a failed `accept()` before the next one.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The accepted connections of `listener`, each wrapped in an [`AuthorityShim`], for
/// `tonic::transport::Server::builder()...serve_with_incoming_shutdown(shimmed_incoming(l), signal)`.
///
/// tonic logs an accept error and immediately asks for the next connection; with a persistent
/// error such as EMFILE (out of file descriptors) that would spin a core, so an error is
/// reported only after a short pause.
pub fn shimmed_incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<AuthorityShim<UnixStream>>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = match listener.accept().await {
            Ok((stream, _addr)) => Ok(AuthorityShim::new(stream)),
            Err(e) => {
                tracing::warn!(error = %e, "accepting a Unix socket connection failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                Err(e)
            }
        };
        Some((next, listener))
    })
}

/// Dials the gRPC server at the Unix socket `path`. Fails if the connection is not up within
/// `connect_timeout`. Requests on the channel have no timeout of their own.
pub async fn dial_unix(path: &Path, connect_timeout: Duration) -> Result<Channel, TransportError> {
    check_path_len(path)?;
    let socket: PathBuf = path.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move {
            let stream = UnixStream::connect(&socket).await?;
            Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(connect_timeout);
    // The outer timeout also covers the HTTP/2 handshake, which connect_timeout does not.
    match tokio::time::timeout(connect_timeout, endpoint.connect_with_connector(connector)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(connect_error(path, source)),
        Err(_) => Err(TransportError::ConnectTimeout {
            path: path.to_path_buf(),
            timeout: connect_timeout,
        }),
    }
}

/// Names the two causes a bare errno hides: EACCES (permissions of the socket or a directory
/// above it) and ECONNREFUSED from a path that is not a socket at all (a plugin's socket
/// replaced by a regular file or a directory refuses like a socket nobody listens on).
fn connect_error(path: &Path, source: tonic::transport::Error) -> TransportError {
    let path = path.to_path_buf();
    match io_error_kind(&source) {
        Some(io::ErrorKind::PermissionDenied) => TransportError::ConnectPermission { path, source },
        Some(io::ErrorKind::ConnectionRefused) => match std::fs::metadata(&path) {
            Ok(meta) if !meta.file_type().is_socket() => TransportError::ConnectNotASocket {
                kind: file_kind(&meta.file_type()),
                path,
            },
            _ => TransportError::Connect { path, source },
        },
        _ => TransportError::Connect { path, source },
    }
}

/// The kind of the first `io::Error` in `err`'s source chain.
fn io_error_kind(err: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        current = e.source();
    }
    None
}

/// "a regular file", "a directory", ... for error messages.
pub fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a Unix socket"
    } else {
        "a device or other special file"
    }
}
