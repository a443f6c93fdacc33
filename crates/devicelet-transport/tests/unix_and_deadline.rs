//! Listener, dialer and deadline helpers on real Unix sockets (spec/ecosystem.md §C1, A5).

mod common;

use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use common::*;
use devicelet_transport::{
    MAX_SOCKET_PATH_LEN, TransportError, bind_unix_listener, bind_unix_listener_atomic,
    call_with_deadline, dial_unix, request_with_deadline,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn c1_tonic_client_through_dial_unix_reaches_a_shimmed_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "plugin.sock", true).await;
    let channel = dial_unix(&server.path, Duration::from_secs(2))
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    for _ in 0..3 {
        let reply = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(reply.into_inner().status(), ServingStatus::Serving);
    }
    assert_eq!(server.seen.lock().unwrap().requests, 3);
    drop(client);
    server.stop().await;
}

/// The kubelet sends `:authority = localhost` to plugins (kubernetes/kubernetes#112597); so do
/// we. Checked on the wire with a raw HTTP/2 server that decodes the request headers.
#[tokio::test]
async fn c1_dial_unix_sends_localhost_authority_and_http_scheme() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.sock");
    let listener = bind_unix_listener(&path).unwrap();
    let client_path = path.clone();
    let client = tokio::spawn(async move {
        let channel = dial_unix(&client_path, Duration::from_secs(2))
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        // The raw server never answers; only the request headers matter here.
        let _ = call_with_deadline(
            Duration::from_secs(3),
            client.check(HealthCheckRequest {
                service: String::new(),
            }),
        )
        .await;
    });
    let (mut conn, _) = listener.accept().await.unwrap();
    let mut preface = [0u8; 24];
    conn.read_exact(&mut preface).await.unwrap();
    assert_eq!(&preface[..], PREFACE);
    conn.write_all(&frame(TYPE_SETTINGS, 0, 0, &[]))
        .await
        .unwrap();
    let mut decoder = devicelet_transport::hpack::Decoder::new(4096);
    let fields = loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.unwrap();
        if head[3] == TYPE_HEADERS {
            assert_ne!(head[4] & END_HEADERS, 0, "small block fits one frame");
            break decoder.decode(&payload, 1 << 20).unwrap();
        }
    };
    let get = |name: &str| {
        fields
            .iter()
            .find(|f| f.name.as_ref() == name.as_bytes())
            .map(|f| String::from_utf8_lossy(&f.value).into_owned())
    };
    assert_eq!(get(":authority").as_deref(), Some("localhost"));
    assert_eq!(get(":scheme").as_deref(), Some("http"));
    assert_eq!(
        get(":path").as_deref(),
        Some("/grpc.health.v1.Health/Check")
    );
    drop(conn);
    client.await.unwrap();
}

#[tokio::test]
async fn c1_dial_unix_to_a_missing_socket_fails_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = dial_unix(&path, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransportError::Connect { .. }),
        "unexpected {err:?}"
    );
    assert!(err.to_string().contains("absent.sock"), "{err}");
}

#[tokio::test]
async fn a3_dial_unix_to_a_regular_file_or_directory_names_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"").unwrap();
    let sub = dir.path().join("dir.sock");
    std::fs::create_dir(&sub).unwrap();
    for (path, kind) in [(&file, "a regular file"), (&sub, "a directory")] {
        let err = dial_unix(path, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(
            matches!(err, TransportError::ConnectNotASocket { .. }),
            "unexpected {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("it is {kind}, not a Unix socket"))
                && text.contains(&*path.to_string_lossy()),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a5_request_with_deadline_sends_grpc_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "plugin.sock", true).await;
    let channel = dial_unix(&server.path, Duration::from_secs(2))
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let deadline = Duration::from_secs(5);
    let request = request_with_deadline(
        HealthCheckRequest {
            service: String::new(),
        },
        deadline,
    );
    let reply = call_with_deadline(deadline, client.check(request))
        .await
        .unwrap();
    assert_eq!(reply.into_inner().status(), ServingStatus::Serving);
    let seen = server.seen.lock().unwrap().grpc_timeout.clone();
    // tonic encodes 5 s as microseconds or milliseconds; either way a grpc-timeout arrived.
    let value = seen.expect("server saw grpc-timeout");
    assert!(
        value.ends_with('u') || value.ends_with('m') || value.ends_with('S'),
        "{value}"
    );
    drop(client);
    server.stop().await;
}

/// A peer that is SIGSTOPped looks like this: the kernel completes `connect()` from the listen
/// backlog, writes land in the socket buffer, and nothing is ever read or answered.
#[tokio::test]
async fn a5_call_with_deadline_against_a_stopped_peer_returns_deadline_exceeded_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stopped.sock");
    let _listener = bind_unix_listener(&path).unwrap(); // never accepts
    let deadline = Duration::from_millis(300);
    let started = Instant::now();
    let result = async {
        let channel = dial_unix(&path, Duration::from_secs(2))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut client = HealthClient::new(channel);
        client
            .check(request_with_deadline(
                HealthCheckRequest {
                    service: String::new(),
                },
                deadline,
            ))
            .await
    };
    let status = call_with_deadline(deadline, result).await.unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("300ms"), "{}", status.message());
    assert!(elapsed >= deadline, "{elapsed:?}");
    assert!(elapsed < deadline + Duration::from_secs(1), "{elapsed:?}");
}

#[tokio::test]
async fn a5_tonic_grpc_timeout_expiry_is_reported_as_deadline_exceeded() {
    // tonic enforces the grpc-timeout it sends but calls it Cancelled; we say DeadlineExceeded.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stopped.sock");
    let _listener = bind_unix_listener(&path).unwrap(); // never accepts
    let channel = dial_unix(&path, Duration::from_secs(2)).await.unwrap();
    let mut client = HealthClient::new(channel);
    let started = Instant::now();
    let request = request_with_deadline(
        HealthCheckRequest {
            service: String::new(),
        },
        Duration::from_millis(100),
    );
    let status = call_with_deadline(Duration::from_secs(5), client.check(request))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("grpc-timeout"),
        "{}",
        status.message()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a5_call_with_deadline_passes_a_fast_result_through() {
    let ok = call_with_deadline(Duration::from_secs(1), async { Ok::<_, tonic::Status>(7) }).await;
    assert_eq!(ok.unwrap(), 7);
    let err = call_with_deadline(Duration::from_secs(1), async {
        Err::<(), _>(tonic::Status::not_found("x"))
    })
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a3_bind_removes_a_stale_socket_and_creates_the_parent_dir() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("device-plugins").join("kubelet.sock");
    let first = bind_unix_listener(&path).unwrap();
    // A previous run died without removing its socket.
    drop(first);
    assert!(
        std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let second = bind_unix_listener(&path).unwrap();
    // The new listener is the live one: a client can connect to it.
    let (client, accepted) = tokio::join!(tokio::net::UnixStream::connect(&path), second.accept());
    client.unwrap();
    accepted.unwrap();
}

/// Spec devicemanager.md §5.1: the PodResources socket is bound under a temporary name and
/// renamed into place; a stale socket is replaced, nothing temporary is left behind.
#[tokio::test]
async fn atomic_bind_renames_into_place_over_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod-resources").join("kubelet.sock");
    drop(bind_unix_listener_atomic(&path).unwrap());
    let stale = std::fs::metadata(&path).unwrap();
    let live = bind_unix_listener_atomic(&path).unwrap();
    let now = std::fs::metadata(&path).unwrap();
    assert!(now.file_type().is_socket());
    // A new inode: the rename replaced the stale socket.
    assert_ne!(
        std::os::unix::fs::MetadataExt::ino(&stale),
        std::os::unix::fs::MetadataExt::ino(&now)
    );
    let (client, accepted) = tokio::join!(tokio::net::UnixStream::connect(&path), live.accept());
    client.unwrap();
    accepted.unwrap();
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("kubelet.sock")]);

    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"important").unwrap();
    let err = bind_unix_listener_atomic(&file).unwrap_err();
    assert!(matches!(err, TransportError::NotASocket { .. }), "{err:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"important");
}

#[tokio::test]
async fn a3_bind_refuses_to_remove_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.sock");
    std::fs::write(&path, b"important").unwrap();
    let err = bind_unix_listener(&path).unwrap_err();
    assert!(matches!(err, TransportError::NotASocket { .. }), "{err:?}");
    assert!(err.to_string().contains("not a Unix socket"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"important");
}

#[tokio::test]
async fn a3_bind_refuses_a_path_over_the_sun_path_limit() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("d".repeat(60)).join("s".repeat(60));
    let err = bind_unix_listener(&long).unwrap_err();
    assert!(
        matches!(err, TransportError::SocketPathTooLong { len, .. } if len > MAX_SOCKET_PATH_LEN),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&"s".repeat(60)) && msg.contains("107"),
        "{msg}"
    );
    // Nothing was created on the way.
    assert!(!dir.path().join("d".repeat(60)).exists());
    // Exactly at the limit is fine.
    let base = dir.path().as_os_str().len() + 1;
    let fits = dir.path().join("x".repeat(MAX_SOCKET_PATH_LEN - base));
    assert_eq!(fits.as_os_str().len(), MAX_SOCKET_PATH_LEN);
    bind_unix_listener(&fits).unwrap();
}
