//! Issue #3 bad input at the CLI level: a plugin whose `Allocate` answers fewer container
//! responses than asked or bytes that are not protobuf, and a 10 000-container manifest. Each
//! gives a clear error and leaves no partial allocation (spec devicemanager.md §1.10, §7).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::test_plugin::{AllocateMode, TestPlugin, TestPluginConfig, device, register};
use common::{Root, cli};

const GOOD: &str = "example.com/good";

fn manifest(root: &Root, name: &str, containers: &[(String, Option<(&str, u32)>)]) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  uid: uid-{name}\nspec:\n  containers:\n"
    );
    for (c, limit) in containers {
        yaml.push_str(&format!("  - name: {c}\n"));
        if let Some((resource, n)) = limit {
            yaml.push_str(&format!(
                "    resources:\n      limits:\n        {resource}: \"{n}\"\n"
            ));
        }
    }
    let path = root.path().join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

async fn plugin(root: &Root, resource: &str, mode: AllocateMode) -> TestPlugin {
    let sock_name = format!("{}.sock", resource.replace('/', "_"));
    let plugin = TestPlugin::start(
        &root.paths.device_plugins.join(&sock_name),
        TestPluginConfig {
            devices: (0..2)
                .map(|i| device(&format!("d{i}"), "Healthy", None))
                .collect(),
            allocate: mode,
            ..Default::default()
        },
    );
    register(&root.paths.kubelet_socket, "v1beta1", &sock_name, resource)
        .await
        .unwrap();
    root.wait_counts(resource, 2, 2).await;
    plugin
}

async fn pod_count(root: &Root) -> usize {
    let (code, out, err) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["pods"].as_array().unwrap().len()
}

#[tokio::test]
async fn c5_short_or_garbage_allocate_answers_fail_admission_and_free_every_device() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let _good = plugin(&root, GOOD, AllocateMode::Echo).await;
    for (resource, mode, expect) in [
        (
            "example.com/short",
            AllocateMode::Short,
            "no containers return in allocation response",
        ),
        ("example.com/garbage", AllocateMode::Garbage, "decode"),
    ] {
        let _bad = plugin(&root, resource, mode).await;
        // The first container gets both good devices, the second then fails on the bad plugin.
        let file = manifest(
            &root,
            &format!("pod-{}", mode_name(mode)),
            &[
                ("first".into(), Some((GOOD, 2))),
                ("second".into(), Some((resource, 1))),
            ],
        );
        let (code, _, err) = cli(root.path(), &["admit", "-f", &file]).await;
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("Allocate"), "{err}");
        assert!(err.contains(resource), "{err}");
        assert!(err.to_lowercase().contains(expect), "{err}");
        assert!(err.contains("\"second\""), "{err}");
        assert_eq!(pod_count(&root).await, 0, "nothing admitted");
        // No partial allocation survives: both good devices are free again.
        let file = manifest(
            &root,
            &format!("after-{}", mode_name(mode)),
            &[("only".into(), Some((GOOD, 2)))],
        );
        let (code, _, err) = cli(root.path(), &["admit", "-f", &file]).await;
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = cli(
            root.path(),
            &["remove", &format!("uid-after-{}", mode_name(mode))],
        )
        .await;
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(serve.terminate().await, 0);
}

fn mode_name(mode: AllocateMode) -> &'static str {
    match mode {
        AllocateMode::Short => "short",
        AllocateMode::Garbage => "garbage",
        AllocateMode::Echo => "echo",
        AllocateMode::Unimplemented => "unimplemented",
        AllocateMode::BigEnv(_) => "big-env",
    }
}

#[tokio::test]
async fn c1_ten_thousand_containers_fail_clearly_when_devices_run_out_and_succeed_without_devices()
{
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let _good = plugin(&root, GOOD, AllocateMode::Echo).await;
    // 10 000 containers asking one device each, two devices exist: a clear rejection naming
    // the container and the counts, nothing left allocated.
    let many: Vec<(String, Option<(&str, u32)>)> = (0..10_000)
        .map(|i| (format!("c{i}"), Some((GOOD, 1))))
        .collect();
    let file = manifest(&root, "huge", &many);
    let (code, _, err) = cli(root.path(), &["admit", "-f", &file]).await;
    assert_eq!(code, 1);
    assert!(err.contains("\"c2\""), "{err}");
    assert!(err.contains(GOOD), "{err}");
    assert_eq!(pod_count(&root).await, 0);
    let file = manifest(&root, "two", &[("x".into(), Some((GOOD, 2)))]);
    let (code, _, err) = cli(root.path(), &["admit", "-f", &file]).await;
    assert_eq!(code, 0, "no device may stay reserved: {err}");

    // 10 000 containers without devices: admitted, in bounded time, durably.
    let plain: Vec<(String, Option<(&str, u32)>)> =
        (0..10_000).map(|i| (format!("p{i}"), None)).collect();
    let file = manifest(&root, "plain", &plain);
    let started = std::time::Instant::now();
    let (code, out, err) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["containers"].as_array().unwrap().len(), 10_000);
    serve.kill().await;
    let serve = root.serve(&[]).await;
    assert_eq!(pod_count(&root).await, 2, "both pods survive a crash");
    assert_eq!(serve.terminate().await, 0);
}
