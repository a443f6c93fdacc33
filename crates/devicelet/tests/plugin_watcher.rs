//! Device plugins registering through `R/plugins_registry` (spec devicemanager.md §1.8).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Root;
use common::test_plugin::{TestPlugin, TestPluginConfig, device};
use devicelet_proto::pluginregistration::v1 as reg;

async fn wait_status(plugin: &TestPlugin) -> reg::RegistrationStatus {
    for _ in 0..200 {
        if let Some(status) = plugin.statuses.lock().unwrap().first().cloned() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no NotifyRegistrationStatus received");
}

#[tokio::test]
async fn s1_8_plugin_watcher_registers_device_plugin_and_deregisters_on_socket_removal() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let sock = root.paths.plugins_registry.join("pw.sock");
    // Empty endpoint: the registration socket also serves the DevicePlugin API.
    let plugin = TestPlugin::start(
        &sock,
        TestPluginConfig {
            devices: vec![
                device("p0", "Healthy", Some(0)),
                device("p1", "Healthy", Some(0)),
            ],
            info: Some(reg::PluginInfo {
                r#type: "DevicePlugin".into(),
                name: "example.com/pw".into(),
                endpoint: String::new(),
                supported_versions: vec!["v1beta1".into()],
            }),
            ..Default::default()
        },
    );
    let view = root.wait_counts("example.com/pw", 2, 2).await;
    assert_eq!(view.endpoint.unwrap().socket, sock.display().to_string());
    let status = wait_status(&plugin).await;
    assert!(status.plugin_registered, "{status:?}");

    // Removing the registration socket deregisters: devices go unhealthy, grace starts.
    std::fs::remove_file(&sock).unwrap();
    root.wait_for("deregistration", |s| {
        s.resource("example.com/pw").is_some_and(|r| {
            r.allocatable == 0 && r.endpoint.as_ref().is_some_and(|e| e.state == "Stopped")
        })
    })
    .await;
    plugin.stop().await;
}

#[tokio::test]
async fn s1_8_plugin_watcher_reports_validation_failures_and_unknown_types() {
    let root = Root::new();
    // A socket that exists before the daemon starts is found by the initial listing.
    std::fs::create_dir_all(&root.paths.plugins_registry).unwrap();
    let bad_name = TestPlugin::start(
        &root.paths.plugins_registry.join("bad.sock"),
        TestPluginConfig {
            info: Some(reg::PluginInfo {
                r#type: "DevicePlugin".into(),
                name: "not-extended".into(),
                endpoint: String::new(),
                supported_versions: vec!["v1beta1".into()],
            }),
            ..Default::default()
        },
    );
    let _serve = root.serve(&[]).await;
    let unknown = TestPlugin::start(
        &root.paths.plugins_registry.join("csi.sock"),
        TestPluginConfig {
            info: Some(reg::PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "csi.example.com".into(),
                endpoint: String::new(),
                supported_versions: vec!["1.0.0".into()],
            }),
            ..Default::default()
        },
    );
    let status = wait_status(&bad_name).await;
    assert!(!status.plugin_registered);
    assert!(
        status.error.contains("plugin validation failed") && status.error.contains("not-extended"),
        "{}",
        status.error
    );
    let status = wait_status(&unknown).await;
    assert!(!status.plugin_registered);
    assert!(
        status
            .error
            .contains("no handler registered for plugin type: CSIPlugin"),
        "{}",
        status.error
    );
    assert!(
        root.control()
            .resources()
            .await
            .unwrap()
            .resources
            .is_empty()
    );
    bad_name.stop().await;
    unknown.stop().await;
}
