//! Rows of part A of `../shared/spec/ecosystem.md` that no other test reproduced, through real
//! `devicelet serve` and plugin processes (cited in `docs/reliability.md`; each test is named
//! after its row).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::test_plugin::{TestPlugin, TestPluginConfig, device, register};
use common::{Root, WAIT, cli};
use devicelet_proto::pluginregistration::v1 as reg;
use devicelet_proto::podresources::v1;
use serde_json::Value;

const GPU: &str = "example.com/gpu";

fn write(root: &Root, name: &str, text: &str) -> String {
    let path = root.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn one_gpu_pod(root: &Root, uid: &str) -> String {
    write(
        root,
        &format!("{uid}.yaml"),
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{uid}, namespace: default, uid: {uid}}}\nspec:\n  containers:\n  - name: main\n    resources: {{limits: {{{GPU}: \"1\"}}}}\n"
        ),
    )
}

/// Container name → the devices per resource, from an `admit -o json` answer.
fn devices_per_container(admitted: &Value) -> BTreeMap<String, Value> {
    admitted["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_owned(), c["devices"].clone()))
        .collect()
}

async fn admitted_uids(root: &Root) -> BTreeSet<String> {
    let (code, out, err) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let pods: Value = serde_json::from_str(&out).unwrap();
    pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"]["uid"].as_str().unwrap().to_owned())
        .collect()
}

/// A1.2 (k/k#124345, #138446): init containers that used devices have finished, so the
/// kubelet's "already running" bypass misses them and a restart runs `Allocate` for them again,
/// which fails while the plugin is not back. devicelet restores the whole pod: with the plugin
/// gone, admitting the pod again after a crash gives every container (init, sidecar, app) the
/// same devices, and `start` answers from the stored responses.
#[tokio::test]
async fn a1_2_init_container_devices_are_not_allocated_again_after_a_restart_without_the_plugin() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4", "--numa-nodes", "2"]);
    root.wait_counts(GPU, 4, 4).await;
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/pods/gpu-training.yaml"
    ))
    .unwrap()
    .replace("namespace: default", "namespace: default\n  uid: uid-init");
    let file = write(&root, "pod.yaml", &manifest);
    let (code, out, err) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let before = devices_per_container(&serde_json::from_str(&out).unwrap());
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["log-shipper", "trainer", "warmup"]
    );
    assert!(
        before.values().all(|d| d[GPU].as_array().is_some()),
        "{before:?}"
    );
    let mut starts = BTreeMap::new();
    for name in before.keys() {
        let (code, out, err) = cli(root.path(), &["start", "uid-init", name, "-o", "json"]).await;
        assert_eq!(code, 0, "{err}");
        starts.insert(name.clone(), out);
    }

    // Crash with the plugin gone: any `Allocate` now fails.
    plugin.kill().await;
    serve.kill().await;
    let serve = root.serve(&[]).await;
    let gpu = root.control().resources().await.unwrap();
    assert_eq!(gpu.resource(GPU).map(|r| r.allocatable), Some(0));

    let (code, out, err) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
    assert_eq!(
        code, 0,
        "re-admission must not call the absent plugin: {err}"
    );
    assert_eq!(
        devices_per_container(&serde_json::from_str(&out).unwrap()),
        before
    );
    for (name, before) in &starts {
        let (code, out, err) = cli(root.path(), &["start", "uid-init", name, "-o", "json"]).await;
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(&out, before, "{name}");
    }
    assert_eq!(serve.terminate().await, 0);
}

/// A1.7 (k/k#119248): a device plugin restarting while pods are being admitted. Every
/// admission racing the restart either gets its own device or fails leaving nothing reserved;
/// once the plugin is back, admitting the failed pods again fills exactly the free devices.
#[tokio::test]
async fn a1_7_plugin_restart_during_an_admission_burst_leaves_no_partial_or_double_allocation() {
    const DEVICES: usize = 6;
    const PODS: usize = 12;
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let devices = DEVICES.to_string();
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", &devices]);
    root.wait_counts(GPU, DEVICES as u64, DEVICES as u64).await;
    let files: Vec<(String, String)> = (0..PODS)
        .map(|i| {
            let uid = format!("burst-{i:02}");
            let file = one_gpu_pod(&root, &uid);
            (uid, file)
        })
        .collect();

    let burst: Vec<_> = files
        .iter()
        .map(|(uid, file)| {
            let root = root.path().to_path_buf();
            let (uid, file) = (uid.clone(), file.clone());
            tokio::spawn(async move {
                let (code, out, err) = cli(&root, &["admit", "-f", &file, "-o", "json"]).await;
                (uid, code, out, err)
            })
        })
        .collect();
    // The plugin dies in the middle of the burst (once the first pods are in) and a new
    // instance registers.
    let control = root.control();
    let deadline = tokio::time::Instant::now() + WAIT;
    while control.pods().await.map_or(0, |p| p.pods.len()) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no admission got through"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    plugin.kill().await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", &devices]);

    let mut held = BTreeMap::new();
    let mut refused = Vec::new();
    for task in burst {
        let (uid, code, out, err) = task.await.unwrap();
        match code {
            0 => {
                let v: Value = serde_json::from_str(&out).unwrap();
                let ids = v["containers"][0]["devices"][GPU].as_array().unwrap();
                assert_eq!(ids.len(), 1, "{out}");
                let id = ids[0].as_str().unwrap().to_owned();
                if let Some(other) = held.insert(id.clone(), uid.clone()) {
                    panic!("{id} given to {other} and {uid}");
                }
            }
            1 => refused.push((uid, err)),
            other => panic!("{uid}: exit {other}: {err}"),
        }
    }
    assert!(held.len() <= DEVICES, "{held:?}");
    assert_eq!(
        admitted_uids(&root).await,
        held.values().cloned().collect::<BTreeSet<_>>(),
        "refused admissions leave no pod behind"
    );

    // The plugin is back: refused pods are admitted until the devices run out, each on a
    // device nobody holds; the rest are refused for lack of devices, not for the restart.
    root.wait_counts(GPU, DEVICES as u64, DEVICES as u64).await;
    for (uid, _) in &refused {
        let file = &files.iter().find(|(u, _)| u == uid).unwrap().1;
        let (code, out, err) = cli(root.path(), &["admit", "-f", file, "-o", "json"]).await;
        if held.len() < DEVICES {
            assert_eq!(code, 0, "{uid}: {err}");
            let v: Value = serde_json::from_str(&out).unwrap();
            let id = v["containers"][0]["devices"][GPU][0]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(!held.contains_key(&id), "{id} given twice");
            held.insert(id, uid.clone());
        } else {
            assert_eq!(code, 1);
            assert!(
                err.contains("Requested: 1, Available: 0"),
                "{uid} refused for another reason: {err}"
            );
        }
    }
    assert_eq!(held.len(), DEVICES, "every device is used once: {held:?}");
    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
}

/// (pod, container, device) → the NUMA nodes PodResources `List` reports for it.
async fn pod_resources_topology(root: &Root) -> BTreeMap<(String, String, String), Vec<i64>> {
    let channel =
        devicelet_rpc::transport::dial(&root.paths.pod_resources_socket, Duration::from_secs(5))
            .await
            .unwrap();
    let list = v1::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut topology = BTreeMap::new();
    for pod in list.pod_resources {
        for container in pod.containers {
            for devices in container.devices {
                let nodes: Vec<i64> = devices
                    .topology
                    .map(|t| t.nodes.iter().map(|n| n.id).collect())
                    .unwrap_or_default();
                for id in devices.device_ids {
                    topology.insert(
                        (pod.name.clone(), container.name.clone(), id),
                        nodes.clone(),
                    );
                }
            }
        }
    }
    topology
}

/// A2.14 (k/k#102552): the NUMA placement of allocated devices must survive a restart while
/// the plugin is slow to come back. The checkpoint records each device under its NUMA node,
/// so after a crash with the plugin gone PodResources reports the same topology for every
/// admitted device, and the pod is admitted again on the same devices.
#[tokio::test]
async fn a2_14_restored_devices_keep_their_numa_nodes_while_the_plugin_is_absent() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4", "--numa-nodes", "2"]);
    root.wait_counts(GPU, 4, 4).await;
    let mut admitted = BTreeMap::new();
    for uid in ["numa-a", "numa-b"] {
        let file = write(
            &root,
            &format!("{uid}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, namespace: default, uid: {uid}}}\nspec:\n  containers:\n  - name: main\n    resources: {{limits: {{{GPU}: \"2\"}}}}\n"
            ),
        );
        let (code, out, err) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
        assert_eq!(code, 0, "{err}");
        admitted.insert(file, out);
    }
    let before = pod_resources_topology(&root).await;
    assert_eq!(before.len(), 4, "{before:?}");
    let nodes: BTreeSet<i64> = before.values().flatten().copied().collect();
    assert_eq!(
        nodes,
        BTreeSet::from([0, 1]),
        "devices on both nodes: {before:?}"
    );

    plugin.kill().await;
    serve.kill().await;
    let serve = root.serve(&[]).await;
    assert_eq!(
        root.control()
            .resources()
            .await
            .unwrap()
            .resource(GPU)
            .map(|r| r.allocatable),
        Some(0),
        "the plugin is not back"
    );
    assert_eq!(pod_resources_topology(&root).await, before);
    for (file, out) in &admitted {
        let (code, again, err) = cli(root.path(), &["admit", "-f", file, "-o", "json"]).await;
        assert_eq!(code, 0, "{err}");
        let first: Value = serde_json::from_str(out).unwrap();
        let again: Value = serde_json::from_str(&again).unwrap();
        assert_eq!(devices_per_container(&again), devices_per_container(&first));
    }
    assert_eq!(serve.terminate().await, 0);
}

async fn first_status(plugin: &TestPlugin) -> reg::RegistrationStatus {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = plugin.statuses.lock().unwrap().first().cloned() {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no NotifyRegistrationStatus received"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn registry_plugin(root: &Root, socket: &str, endpoint: &std::path::Path) -> TestPlugin {
    TestPlugin::start(
        &root.paths.plugins_registry.join(socket),
        TestPluginConfig {
            info: Some(reg::PluginInfo {
                r#type: "DevicePlugin".into(),
                name: "example.com/late".into(),
                endpoint: endpoint.display().to_string(),
                supported_versions: vec!["v1beta1".into()],
            }),
            ..Default::default()
        },
    )
}

/// A3.22 (k/k#73371, PR #71440): a failed registration was never retried, and concurrent
/// create/remove events of a socket raced. A plugin whose device-plugin endpoint is not
/// listening yet fails its first registration (and is told so); it is registered without any
/// action once the endpoint listens. A storm of removed and re-created registration sockets
/// then ends with the last socket registered and serving.
#[tokio::test]
async fn a3_22_a_failed_registration_is_retried_and_a_create_remove_storm_ends_registered() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let endpoint = root.path().join("late.sock");
    let registration = registry_plugin(&root, "late-reg.sock", &endpoint);
    let status = first_status(&registration).await;
    assert!(!status.plugin_registered, "{status:?}");
    assert!(!status.error.is_empty(), "{status:?}");

    // The plugin's endpoint comes up later; nobody touches the registration socket.
    let device_plugin = TestPlugin::start(
        &endpoint,
        TestPluginConfig {
            devices: vec![
                device("late-0", "Healthy", None),
                device("late-1", "Healthy", None),
            ],
            ..Default::default()
        },
    );
    root.wait_counts("example.com/late", 2, 2).await;
    assert!(
        registration
            .statuses
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.plugin_registered),
        "the retry's success is reported to the plugin"
    );

    // Storm: the registration socket is removed and re-created (dead sockets in between).
    let path = registration.socket.clone();
    registration.stop().await;
    for _ in 0..50 {
        let _ = std::fs::remove_file(&path);
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let last = registry_plugin(&root, "late-reg.sock", &endpoint);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !last
        .statuses
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.plugin_registered)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the last socket was never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let view = root
        .wait_for("the last socket's registration serving", |s| {
            s.resource("example.com/late").is_some_and(|r| {
                r.allocatable == 2 && r.endpoint.as_ref().is_some_and(|e| e.state == "Serving")
            })
        })
        .await;
    assert_eq!(view.resource("example.com/late").unwrap().capacity, 2);
    last.stop().await;
    device_plugin.stop().await;
}

/// A3.25 (bottlerocket-os/bottlerocket#4250): readiness was signalled before `kubelet.sock`
/// existed, so plugins failed to register. devicelet's readiness signal is its control socket
/// answering; at that moment `kubelet.sock` accepts a plugin's registration.
#[tokio::test]
async fn a3_25_kubelet_sock_accepts_registrations_as_soon_as_the_control_socket_answers() {
    for _ in 0..5 {
        let root = Root::new();
        let serve = root.spawn("serve", &["serve"]);
        let control = root.control();
        let deadline = tokio::time::Instant::now() + WAIT;
        while control.resources().await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "serve did not come up:\n{}",
                serve.log()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // First thing after readiness: a plugin connects to kubelet.sock and registers.
        std::os::unix::net::UnixStream::connect(&root.paths.kubelet_socket)
            .unwrap_or_else(|e| panic!("kubelet.sock not accepting at readiness: {e}"));
        let plugin = TestPlugin::start(
            &root.paths.device_plugins.join("ready.sock"),
            TestPluginConfig {
                devices: vec![device("r0", "Healthy", None)],
                ..Default::default()
            },
        );
        register(
            &root.paths.kubelet_socket,
            "v1beta1",
            "ready.sock",
            "example.com/ready",
        )
        .await
        .unwrap();
        root.wait_counts("example.com/ready", 1, 1).await;
        plugin.stop().await;
        assert_eq!(serve.terminate().await, 0);
    }
}
