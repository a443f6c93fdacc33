//! `devicelet scheduler` as a process (issue 39): SIGTERM stops it while its caches cannot fill
//! (an unreachable API server must not keep a rollout waiting for the whole grace period), and
//! `--metrics-address off` is accepted as `serve` accepts it; `/readyz` says not ready while
//! `/healthz` says alive. The secure port: TLS, probes without credentials, 401 for the rest
//! without a token the API server accepts; plain HTTP only on loopback.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Root, free_address};

/// The status code of `GET path` on `address`, over a plain HTTP/1.1 connection.
fn status_of(address: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// A kubeconfig for an API server that does not answer (a port bound and released).
fn unreachable_kubeconfig(root: &Root) -> std::path::PathBuf {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let kubeconfig = root.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  \
             user:\n    token: t\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n\
             current-context: x\n"
        ),
    )
    .unwrap();
    kubeconfig
}

#[tokio::test]
async fn sigterm_stops_a_scheduler_whose_api_server_is_unreachable() {
    let root = Root::new();
    let kubeconfig = unreachable_kubeconfig(&root);
    let mut proc = root.spawn(
        "scheduler",
        &[
            "scheduler",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--metrics-address",
            "off",
        ],
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        proc.child.try_wait().unwrap().is_none(),
        "the scheduler exited on its own:\n{}",
        proc.log()
    );
    let log = proc.log.clone();
    let asked = Instant::now();
    let code = proc.terminate().await;
    let took = asked.elapsed();
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert_eq!(code, 0, "{log}");
    assert!(
        took < Duration::from_secs(2),
        "SIGTERM before the caches synced took {took:?}:\n{log}"
    );
    assert!(log.contains("stopped before the caches synced"), "{log}");
}

#[tokio::test]
async fn readyz_says_not_ready_while_the_caches_cannot_fill() {
    let root = Root::new();
    let kubeconfig = unreachable_kubeconfig(&root);
    let metrics_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let metrics = format!("127.0.0.1:{metrics_port}");
    let proc = root.spawn(
        "scheduler",
        &[
            "scheduler",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--metrics-address",
            &metrics,
        ],
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Alive, but not ready: the caches cannot fill.
    assert_eq!(status_of(&metrics, "/healthz"), 200, "{}", proc.log());
    assert_eq!(status_of(&metrics, "/readyz"), 503, "{}", proc.log());
    proc.terminate().await;
}

/// The status code of `GET path` on `https://address` by curl (self-signed certificate
/// accepted), with `token` as bearer token.
fn secure_status_of(address: &str, path: &str, token: Option<&str>) -> u16 {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sk",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
    ]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd
        .arg(format!("https://{address}{path}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test]
async fn the_secure_port_serves_probes_to_anyone_and_metrics_to_no_one_unauthenticated() {
    let root = Root::new();
    let kubeconfig = unreachable_kubeconfig(&root);
    let secure = free_address();
    let proc = root.spawn(
        "scheduler",
        &[
            "scheduler",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--secure-address",
            &secure,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while secure_status_of(&secure, "/livez", None) != 200 {
        assert!(Instant::now() < deadline, "no TLS /livez:\n{}", proc.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(secure_status_of(&secure, "/healthz", None), 200);
    assert_eq!(
        secure_status_of(&secure, "/readyz", None),
        503,
        "{}",
        proc.log()
    );
    assert_eq!(
        secure_status_of(&secure, "/metrics", None),
        401,
        "{}",
        proc.log()
    );
    assert_eq!(secure_status_of(&secure, "/debug/snapshot", None), 401);
    // The API server cannot review the token: nobody is authenticated on a guess.
    assert_eq!(
        secure_status_of(&secure, "/metrics", Some("some-token")),
        401
    );
    // Plain HTTP on the secure port is refused by the TLS handshake.
    let mut stream = std::net::TcpStream::connect(&secure).unwrap();
    use std::io::{Read, Write};
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(
        !answer.contains("# HELP"),
        "metrics served without TLS: {answer}"
    );
    proc.terminate().await;
}

#[tokio::test]
async fn plain_metrics_are_refused_off_loopback() {
    let root = Root::new();
    let kubeconfig = unreachable_kubeconfig(&root);
    let (code, _, err) = common::cli(
        root.path(),
        &[
            "scheduler",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--metrics-address",
            "0.0.0.0:0",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("loopback") && err.contains("--secure-address"),
        "{err}"
    );
}
