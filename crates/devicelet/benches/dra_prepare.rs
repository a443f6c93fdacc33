//! DRA prepare+unprepare throughput through the real example driver: `devicelet serve` and
//! `devicelet example-driver` as child processes; each pod has two claims from a
//! ResourceClaimTemplate, so one admission = template claims created + structured allocation
//! + reservation + one batched NodePrepareResources (the driver reads both claims back and
//!   writes two CDI spec files), and one removal = one NodeUnprepareResources + release.
//!
//! Prints pods/s and the p50/p99 of admit+remove per pod.
//! `cargo bench -p devicelet --bench dra_prepare` (DEVICELET_DRA_BENCH_PODS=N, default 1000).
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use devicelet_rpc::{ControlClient, RootPaths};
use tokio::process::{Child, Command};

const EXE: &str = env!("CARGO_BIN_EXE_devicelet");

const OBJECTS: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu}
"#;

fn spawn(root: &std::path::Path, args: &[&str]) -> Child {
    Command::new(EXE)
        .args(args)
        .arg("--root-dir")
        .arg(root)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn pod(i: usize) -> bytes::Bytes {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("bench-{i}"), "namespace": "default", "uid": format!("uid-{i}")},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "one-gpu"},
                {"name": "b", "resourceClaimTemplateName": "one-gpu"}
            ],
            "containers": [{"name": "ctr", "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}]
        }
    }))
    .unwrap()
    .into()
}

#[tokio::main]
async fn main() {
    let pods: usize = std::env::var("DEVICELET_DRA_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::Builder::new()
        .prefix("dl-bench-")
        .tempdir_in("/tmp")
        .unwrap();
    let paths = RootPaths::new(dir.path());
    let control = ControlClient::new(&paths.control_socket);
    let _serve = spawn(dir.path(), &["serve"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while control.resources().await.is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cdi = dir.path().join("cdi");
    let _driver = spawn(
        dir.path(),
        &[
            "example-driver",
            "--name",
            "gpu.example.com",
            "--devices",
            "4",
            "--cdi-dir",
            cdi.to_str().unwrap(),
        ],
    );
    loop {
        let dra: devicelet_node::dra::DraSnapshot = control.get_json("/v1/dra").await.unwrap();
        if dra.published_slices.contains_key("gpu.example.com") {
            break;
        }
        assert!(Instant::now() < deadline, "driver did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(OBJECTS)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    control.apply(&docs).await.unwrap();

    let mut latencies = Vec::with_capacity(pods);
    let start = Instant::now();
    for i in 0..pods {
        let t = Instant::now();
        let admitted = control.admit(pod(i)).await.unwrap();
        assert_eq!(admitted.containers[0].claims.len(), 2);
        control.remove(&admitted.pod.uid).await.unwrap();
        latencies.push(t.elapsed());
    }
    let total = start.elapsed();
    assert_eq!(
        std::fs::read_dir(&cdi).unwrap().count(),
        0,
        "every CDI spec removed"
    );
    latencies.sort();
    let pct = |p: f64| {
        let idx = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[idx]
    };
    println!(
        "dra prepare+unprepare: {pods} pods x 2 claims in {:.2}s = {:.1} pods/s; per pod (admit+remove) p50 {:.2} ms, p99 {:.2} ms",
        total.as_secs_f64(),
        pods as f64 / total.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
}
