//! Hostile device data (issue 18 item 3): device IDs from a plugin are data, not terminal input.
//! smarter-device-manager names its devices "\x00", "\x01", ...: the table output shows them as
//! visible escapes, JSON keeps them exact, and another plugin keeps being served.
#![allow(clippy::unwrap_used)]

mod common;

use common::test_plugin::{TestPlugin, TestPluginConfig, device, register};
use common::{Root, cli};

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
