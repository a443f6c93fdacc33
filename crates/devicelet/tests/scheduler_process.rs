//! `devicelet scheduler` as a process (issue 39): SIGTERM stops it while its caches cannot fill
//! (an unreachable API server must not keep a rollout waiting for the whole grace period), and
//! `--metrics-address off` is accepted as `serve` accepts it; `/readyz` says not ready while
//! `/healthz` says alive.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Root;

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
        took < Duration::from_secs(3),
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
