//! Hostile device data (issue 18 item 3): device IDs from a plugin are data, not terminal input.
//! smarter-device-manager names its devices "\x00", "\x01", ...: the table output shows them as
//! visible escapes, JSON keeps them exact, and another plugin keeps being served.
//!
//! Sizes are bounded: a 64 KB device ID, a million devices, two million NUMA node entries and a
//! 100 MB `ListAndWatch` or `Allocate` answer are refused with an error naming the plugin and
//! the bound, while the example plugin beside them keeps being served. The hostile plugin is the
//! scriptable test plugin (`common::test_plugin`) in the test process on a real Unix socket.
#![allow(clippy::unwrap_used)]

mod common;

use common::test_plugin::{AllocateMode, TestPlugin, TestPluginConfig, device, register};
use common::{Proc, Root, cli};
use devicelet_proto::deviceplugin::v1beta1 as pb;

#[tokio::test]
async fn control_characters_in_device_ids_reach_the_terminal_escaped_and_json_exact() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let ids: Vec<String> = (0u8..10)
        .map(|b| char::from(b).to_string())
        .chain(["\u{1b}[2J".to_owned(), "\u{202e}gpu".to_owned()])
        .collect();
    let resource = "smarter-devices/hostile";
    let sock_name = "hostile.sock";
    let plugin = TestPlugin::start(
        &root.paths.device_plugins.join(sock_name),
        TestPluginConfig {
            devices: ids.iter().map(|id| device(id, "Healthy", None)).collect(),
            ..Default::default()
        },
    );
    register(&root.paths.kubelet_socket, "v1beta1", sock_name, resource)
        .await
        .unwrap();
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    root.wait_counts(resource, ids.len() as u64, ids.len() as u64)
        .await;
    root.wait_counts("example.com/gpu", 2, 2).await;

    let (code, table, stderr) = cli(root.path(), &["get", "resources"]).await;
    assert_eq!(code, 0, "{stderr}");
    let raw: Vec<u8> = table
        .bytes()
        .filter(|b| (*b < 0x20 && *b != b'\n') || *b == 0x7f)
        .collect();
    assert!(raw.is_empty(), "raw control bytes {raw:?} in:\n{table}");
    assert!(
        !table.contains('\u{202e}'),
        "bidi override reached the terminal"
    );
    for shown in ["\\x00", "\\x01", "\\x09", "\\x1b[2J", "\\u{202e}gpu"] {
        assert!(table.contains(shown), "{shown} not shown in:\n{table}");
    }
    assert!(
        table.contains("example.com/gpu"),
        "the other plugin is served:\n{table}"
    );

    let (code, json, _) = cli(root.path(), &["get", "resources", "-o", "json"]).await;
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let hostile = json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == resource)
        .unwrap();
    let mut got: Vec<String> = hostile["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    let mut want = ids.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "JSON keeps the IDs exact");

    plugin.stop().await;
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

/// Serves a test plugin with `config` on `R/device-plugins/NAME.sock` and registers it as
/// `resource`; the plugin is served as long as the returned handle lives.
async fn start_hostile(root: &Root, resource: &str, config: TestPluginConfig) -> TestPlugin {
    let sock_name = format!("{}.sock", resource.replace('/', "_"));
    let plugin = TestPlugin::start(&root.paths.device_plugins.join(&sock_name), config);
    register(&root.paths.kubelet_socket, "v1beta1", &sock_name, resource)
        .await
        .unwrap();
    plugin
}

/// Starts the daemon and the example plugin, registers `hostile` as `resource`, waits until
/// devicelet refused its snapshot (endpoint stopped, nothing allocatable) and checks the log
/// names the resource and `bound`, and the example plugin is still served.
async fn refused_snapshot(
    resource: &str,
    devices: Vec<pb::Device>,
    bound: &str,
) -> (Root, Proc, Proc, TestPlugin) {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    root.wait_counts("example.com/gpu", 2, 2).await;
    let config = TestPluginConfig {
        devices,
        ..Default::default()
    };
    let hostile = start_hostile(&root, resource, config).await;
    root.wait_for(&format!("{resource} refused"), |s| {
        s.resource(resource).is_some_and(|r| {
            r.allocatable == 0 && r.endpoint.as_ref().is_some_and(|e| e.state == "Stopped")
        })
    })
    .await;
    let log = serve.log();
    let line = log
        .lines()
        .find(|l| l.contains("device plugin sent more than devicelet accepts"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        line.contains(resource) && line.contains(bound),
        "the refusal names neither {resource} nor {bound}: {line}"
    );
    root.wait_counts("example.com/gpu", 2, 2).await;
    let (code, table, stderr) = cli(root.path(), &["get", "resources"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(table.contains("example.com/gpu"), "{table}");
    (root, serve, good, hostile)
}

/// Peak resident memory of a process, from `/proc/PID/status`.
fn peak_rss_kib(proc: &Proc) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", proc.child.id().unwrap())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_64_kb_device_id_is_refused_naming_the_plugin_and_the_bound() {
    let id = format!("\u{1b}[2J{}", "x".repeat(64 * 1024));
    let devices = vec![
        device("ok-0", "Healthy", None),
        device(&id, "Healthy", None),
    ];
    let resource = "example.com/long-ids";
    let (root, serve, good, _hostile) =
        refused_snapshot(resource, devices, "more than devicelet's limit of 4096").await;
    let log = serve.log();
    assert!(
        log.contains(r#"device ID "\u{1b}[2Jxxx"#),
        "the ID is shown escaped"
    );
    assert!(!log.contains("\u{1b}[2J"), "a raw escape reached the log");
    let (_, table, _) = cli(root.path(), &["get", "resources"]).await;
    assert!(!table.contains('\u{1b}'), "{table}");
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn a_million_devices_are_refused_before_they_are_decoded() {
    let devices: Vec<pb::Device> = (0..1_000_000)
        .map(|i| device(&format!("d{i}"), "Healthy", None))
        .collect();
    let (_root, serve, good, _hostile) = refused_snapshot(
        "example.com/million",
        devices,
        "ListAndWatch snapshot has 1000000 devices, more than devicelet's limit of 262144",
    )
    .await;
    // Counted in the encoded message (~20 MB), never decoded into a million devices.
    let peak = peak_rss_kib(&serve);
    assert!(
        peak < 120 * 1024,
        "devicelet's peak RSS reached {peak} KiB for a refused message"
    );
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn a_100_mb_list_and_watch_answer_is_refused_naming_the_plugin_and_the_bound() {
    // 102 400 devices with 1 KiB IDs: within the count and ID bounds, over the message bound.
    let devices: Vec<pb::Device> = (0..102_400)
        .map(|i| device(&format!("{i:01024}"), "Healthy", None))
        .collect();
    let (_root, serve, good, _hostile) = refused_snapshot(
        "example.com/huge-list",
        devices,
        "more than devicelet's limit of 67108864",
    )
    .await;
    assert!(
        serve.log().contains("ListAndWatch message has 10"),
        "the size is named"
    );
    let peak = peak_rss_kib(&serve);
    assert!(
        peak < 120 * 1024,
        "devicelet's peak RSS reached {peak} KiB for a refused message"
    );
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn a_100_mb_allocate_answer_refuses_the_pod_and_other_pods_are_admitted() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let good = root.example_plugin(&["--resource", "example.com/gpu", "--devices", "2"]);
    let resource = "example.com/huge-allocate";
    let config = TestPluginConfig {
        devices: vec![device("h0", "Healthy", None)],
        allocate: AllocateMode::BigEnv(100 * 1024 * 1024),
        ..Default::default()
    };
    let _hostile = start_hostile(&root, resource, config).await;
    root.wait_counts(resource, 1, 1).await;
    root.wait_counts("example.com/gpu", 2, 2).await;

    let pod = |name: &str, resource: &str| {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  uid: uid-{name}\nspec:\n  containers:\n  - name: c\n    resources:\n      limits:\n        {resource}: \"1\"\n"
        );
        let path = root.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path.display().to_string()
    };
    let (code, _, err) = cli(root.path(), &["admit", "-f", &pod("big", resource)]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("UnexpectedAdmissionError")
            && err.contains("Allocate answer has")
            && err.contains("more than devicelet's limit of 4194304"),
        "{err}"
    );
    // Nothing half-allocated, and the other plugin's pods are admitted.
    let snapshot = root.control().resources().await.unwrap();
    assert_eq!(snapshot.resource(resource).unwrap().allocated, 0);
    let (code, out, err) = cli(root.path(), &["admit", "-f", &pod("ok", "example.com/gpu")]).await;
    assert_eq!(code, 0, "{out}{err}");
    let peak = peak_rss_kib(&serve);
    assert!(
        peak < 120 * 1024,
        "devicelet's peak RSS reached {peak} KiB for a refused answer"
    );
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

#[tokio::test]
async fn two_million_numa_entries_are_refused_before_they_are_decoded() {
    let wide = pb::Device {
        id: "wide".into(),
        health: "Healthy".into(),
        topology: Some(pb::TopologyInfo {
            nodes: vec![pb::NumaNode { id: 0 }; 2_000_000],
        }),
    };
    let devices = vec![wide];
    let (_root, serve, good, _hostile) = refused_snapshot(
        "example.com/wide",
        devices,
        "ListAndWatch snapshot has 2000000 NUMA node entries, more than devicelet's limit of 1048576",
    )
    .await;
    assert_eq!(good.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}
