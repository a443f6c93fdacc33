//! Bad registrations and odd ListAndWatch input against a real `devicelet serve`: each gets a
//! clear error or defined handling, and other plugins keep working.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Root;
use common::test_plugin::{TestPlugin, TestPluginConfig, device, register};

const GPU: &str = "example.com/gpu";

#[tokio::test]
async fn wrong_version_invalid_name_and_escaping_endpoints_are_refused_others_keep_working() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let good = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    root.wait_counts(GPU, 2, 2).await;

    let sock = root.paths.device_plugins.join("bad.sock");
    let plugin = TestPlugin::start(
        &sock,
        TestPluginConfig {
            devices: vec![device("x", "Healthy", None)],
            ..Default::default()
        },
    );
    let kubelet = &root.paths.kubelet_socket;

    let err = register(kubelet, "v1alpha1", "bad.sock", "example.com/bad")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unknown);
    assert_eq!(
        err.message(),
        "requested API version \"v1alpha1\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
    );

    let err = register(kubelet, "v1beta1", "bad.sock", "bad-name")
        .await
        .unwrap_err();
    assert_eq!(err.message(), "the ResourceName \"bad-name\" is invalid");
    let err = register(kubelet, "v1beta1", "bad.sock", "kubernetes.io/gpu")
        .await
        .unwrap_err();
    assert!(err.message().contains("is invalid"), "{}", err.message());

    for endpoint in ["../x", "/abs/bad.sock", ""] {
        let err = register(kubelet, "v1beta1", endpoint, "example.com/bad")
            .await
            .unwrap_err();
        assert!(
            err.message().contains("invalid endpoint"),
            "{endpoint}: {}",
            err.message()
        );
    }
    // A socket nobody listens on: a dial error naming the path.
    let err = register(kubelet, "v1beta1", "nobody.sock", "example.com/bad")
        .await
        .unwrap_err();
    assert!(
        err.message().contains("failed to dial device plugin")
            && err.message().contains("nobody.sock"),
        "{}",
        err.message()
    );

    let snapshot = root.control().resources().await.unwrap();
    assert!(snapshot.resource("example.com/bad").is_none());
    assert!(snapshot.resource("bad-name").is_none());

    // The example plugin with an invalid name exits 1 with the reason.
    let (code, log) = root
        .example_plugin(&[
            "--resource",
            GPU,
            "--register-resource",
            "gpu",
            "--socket-name",
            "x.sock",
        ])
        .wait_exit()
        .await;
    assert_eq!(code, 1);
    assert!(
        log.contains("the ResourceName \\\"gpu\\\" is invalid")
            || log.contains("the ResourceName \"gpu\" is invalid"),
        "{log}"
    );

    // The good plugin was never disturbed; the valid registration of the test plugin works.
    register(kubelet, "v1beta1", "bad.sock", "example.com/ok")
        .await
        .unwrap();
    root.wait_counts("example.com/ok", 1, 1).await;
    root.wait_counts(GPU, 2, 2).await;
    plugin.stop().await;
    assert_eq!(good.terminate().await, 0);
}

#[tokio::test]
async fn plugin_that_never_answers_options_gets_a_deadline_error_and_blocks_nobody() {
    let root = Root::new();
    let _serve = root.serve(&["--plugin-options-timeout", "1s"]).await;
    let sock = root.paths.device_plugins.join("hang.sock");
    let hang = TestPlugin::start(
        &sock,
        TestPluginConfig {
            hang_options: true,
            ..Default::default()
        },
    );
    let kubelet = root.paths.kubelet_socket.clone();
    let started = Instant::now();
    let hanging = tokio::spawn(async move {
        register(&kubelet, "v1beta1", "hang.sock", "example.com/hang").await
    });

    // While that registration waits, another plugin registers and becomes visible.
    let good = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    root.wait_counts(GPU, 2, 2).await;

    let err = hanging.await.unwrap().unwrap_err();
    let waited = started.elapsed();
    assert!(
        err.message()
            .contains("failed to get device plugin options"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("no answer within 1s"),
        "{}",
        err.message()
    );
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
    assert!(
        root.control()
            .resources()
            .await
            .unwrap()
            .resource("example.com/hang")
            .is_none()
    );
    hang.stop().await;
    assert_eq!(good.terminate().await, 0);
}

#[tokio::test]
async fn list_and_watch_with_duplicate_and_empty_ids_counts_each_id_once() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let sock = root.paths.device_plugins.join("dup.sock");
    let plugin = TestPlugin::start(
        &sock,
        TestPluginConfig {
            devices: vec![
                device("a", "Healthy", Some(0)),
                device("b", "Healthy", Some(0)),
                device("a", "Unhealthy", Some(1)),
                device("", "Healthy", None),
                device("c", "healthy", None),
            ],
            ..Default::default()
        },
    );
    register(
        &root.paths.kubelet_socket,
        "v1beta1",
        "dup.sock",
        "example.com/dup",
    )
    .await
    .unwrap();
    // a (last entry: Unhealthy), b Healthy, c "healthy" is not exactly "Healthy".
    let view = root.wait_counts("example.com/dup", 3, 1).await;
    let a = view.devices.iter().find(|d| d.id == "a").unwrap();
    assert_eq!(
        (a.health.as_str(), a.numa_nodes.as_slice()),
        ("Unhealthy", &[1][..])
    );

    // An empty list keeps the resource registered with 0/0.
    plugin.set_devices(vec![]);
    root.wait_counts("example.com/dup", 0, 0).await;
    plugin.stop().await;
}

#[tokio::test]
async fn list_and_watch_with_100000_devices_is_applied() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let big = root.example_plugin(&[
        "--resource",
        "example.com/big",
        "--devices",
        "100000",
        "--numa-nodes",
        "4",
    ]);
    let small = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    let view = root.wait_counts("example.com/big", 100_000, 100_000).await;
    assert_eq!(view.devices.len(), 100_000);
    assert_eq!(view.devices[99_999].numa_nodes, vec![3]);
    root.wait_counts(GPU, 2, 2).await;
    // A health flip on a huge list is applied too.
    std::fs::write(
        root.paths.device_plugins.join("example.com_big.health"),
        "big-42 Unhealthy\n",
    )
    .unwrap();
    root.wait_counts("example.com/big", 100_000, 99_999).await;
    assert_eq!(big.terminate().await, 0);
    assert_eq!(small.terminate().await, 0);
}

// `devicelet scheduler --binding-timeout` below kube-scheduler's minimum is refused before any
// connection is made, with the flag named.
#[test]
fn scheduler_binding_timeout_below_one_second_is_refused() {
    let out = std::process::Command::new(common::EXE)
        .args([
            "scheduler",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--binding-timeout",
            "500ms",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--binding-timeout must be at least 1s"),
        "{stderr}"
    );
}
