//! Resource health (KEP-4680, spec devicemanager.md §2 E1, ecosystem.md A4 row 32) and live
//! views (issue 6): a device turning unhealthy under an admitted pod reaches that container's
//! `allocatedResourcesStatus` in `get pods` (JSON and table), `get pods --watch` streams the
//! change, and `top --once` shows allocation and health per resource.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{EXE, Root, WAIT, cli};
use tokio::io::{AsyncBufReadExt, BufReader};

const GPU: &str = "example.com/gpu";

const POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: default, uid: uid-health}
spec:
  initContainers:
  - name: warmup
    image: registry.invalid/w:1
    resources: {limits: {example.com/gpu: \"1\"}}
  containers:
  - name: app
    image: registry.invalid/app:1
    resources: {limits: {example.com/gpu: \"2\"}}
";

fn health_of(pods: &serde_json::Value) -> Vec<(String, String)> {
    let app = pods["pods"][0]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "app")
        .unwrap();
    let status = app["allocatedResourcesStatus"].as_array().unwrap();
    assert_eq!(status.len(), 1, "{app}");
    assert_eq!(status[0]["name"], GPU);
    status[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["resourceID"].as_str().unwrap().to_owned(),
                r["health"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn e1_device_health_change_reaches_the_pod_status_watch_and_top() {
    let root = Root::new();
    let _serve = root.serve(&["--metrics-address", "off"]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4"]);
    root.wait_counts(GPU, 4, 4).await;
    let manifest = root.path().join("pod.yaml");
    std::fs::write(&manifest, POD).unwrap();
    let (code, _, stderr) = cli(root.path(), &["admit", "-f", manifest.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{stderr}");

    let (code, stdout, stderr) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let pods: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let before = health_of(&pods);
    assert_eq!(before.len(), 2);
    assert!(before.iter().all(|(_, h)| h == "Healthy"), "{before:?}");
    // Init containers carry no status (upstream looks at containerStatuses only).
    let warmup = &pods["pods"][0]["containers"][0];
    assert_eq!(warmup["name"], "warmup");
    assert!(warmup.get("allocatedResourcesStatus").is_none(), "{warmup}");

    // Watch from now on; the first line is the current state.
    let mut watch = tokio::process::Command::new(EXE)
        .args(["get", "pods", "--watch", "-o", "json", "--root-dir"])
        .arg(root.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let next = async |lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>| {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("watch printed nothing")
            .unwrap()
            .expect("watch ended");
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    assert_eq!(health_of(&next(&mut lines).await), before);

    // One of the app's devices turns unhealthy through the plugin's health file.
    let sick = before[1].0.clone();
    std::fs::write(
        root.paths.device_plugins.join("example.com_gpu.health"),
        format!("{sick} Unhealthy\n"),
    )
    .unwrap();
    let changed = health_of(&next(&mut lines).await);
    let want: Vec<(String, String)> = before
        .iter()
        .map(|(id, _)| {
            let h = if *id == sick { "Unhealthy" } else { "Healthy" };
            (id.clone(), h.to_owned())
        })
        .collect();
    assert_eq!(changed, want);

    let (_, table, _) = cli(root.path(), &["get", "pods"]).await;
    assert!(table.contains("HEALTH"), "{table}");
    assert!(table.contains(&format!("Unhealthy: {sick}")), "{table}");

    let (code, top, stderr) = cli(root.path(), &["top", "--once", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let top: serde_json::Value = serde_json::from_str(&top).unwrap();
    let row = &top["resources"][0];
    assert_eq!(row["name"], GPU);
    assert_eq!(row["capacity"], 4);
    assert_eq!(row["allocatable"], 3);
    // Init container's device is reused by the app: 2 devices held.
    assert_eq!(row["allocated"], 2);
    assert_eq!(row["unhealthy"], 1);
    let (_, top_table, _) = cli(root.path(), &["top", "--once"]).await;
    assert!(top_table.contains("[#####.....]  50%"), "{top_table}");

    watch.kill().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), plugin.terminate()).await;
}

/// Issue 18 item 5: a plugin that dies leaves its devices' health `Unknown` in the pod status
/// (the 1.36 kubelet keeps the last reported health; an earlier devicelet said `Unhealthy`),
/// and the plugin coming back reports them `Healthy` again.
#[tokio::test]
async fn a_dead_plugin_leaves_its_devices_unknown_until_it_returns() {
    let root = Root::new();
    let _serve = root.serve(&["--metrics-address", "off"]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4"]);
    root.wait_counts(GPU, 4, 4).await;
    let manifest = root.path().join("pod.yaml");
    std::fs::write(&manifest, POD).unwrap();
    let (code, _, stderr) = cli(root.path(), &["admit", "-f", manifest.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{stderr}");

    plugin.kill().await;
    root.wait_counts(GPU, 4, 0).await;
    let (_, stdout, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    let health = health_of(&serde_json::from_str(&stdout).unwrap());
    assert!(health.iter().all(|(_, h)| h == "Unknown"), "{health:?}");
    let (_, table, _) = cli(root.path(), &["get", "pods"]).await;
    assert!(table.contains("Unknown: "), "{table}");

    let _back = root.example_plugin(&["--resource", GPU, "--devices", "4"]);
    root.wait_counts(GPU, 4, 4).await;
    let (_, stdout, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    let health = health_of(&serde_json::from_str(&stdout).unwrap());
    assert!(health.iter().all(|(_, h)| h == "Healthy"), "{health:?}");
}
