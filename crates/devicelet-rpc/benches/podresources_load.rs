//! PodResources under load (issue 6): 50 concurrent clients, each on its own gRPC connection
//! to a real Unix socket, call v1 `List` in a bounded loop on a node with 5 000 admitted
//! containers, while pods keep being admitted. Prints List calls/s and p50/p99, and the
//! admission p50/p99 before and during the load, so "admission latency is unaffected" is a
//! figure, not a claim.
//!
//! The devices come from the device manager's in-process fake plugin (`test-utils`), so the
//! admission latency measured is devicelet's own path (locks shared with `List`), not a
//! plugin's. The server runs without the kubelet's 100 QPS limit, which would otherwise refuse
//! almost every call; the limit itself is covered by `tests/podresources.rs`.
//!
//! Sizes: `DEVICELET_LOAD_CONTAINERS` (5000), `DEVICELET_LOAD_CLIENTS` (50),
//! `DEVICELET_LOAD_CALLS` per client (20), `DEVICELET_LOAD_ADMISSIONS` per phase (200).

use std::sync::Arc;
use std::time::{Duration, Instant};

use devicelet_devicemanager::test_utils::{FakeDialer, FakePlugin};
use devicelet_devicemanager::{
    Device, DeviceManager, DeviceManagerConfig, DevicePluginOptions, RegistrationSource,
    SystemClock,
};
use devicelet_proto::podresources::v1;
use devicelet_rpc::{PodAdmitter, PodResourcesService, transport};
use k8s_openapi::api::core::v1::Pod;

const RESOURCE: &str = "example.com/gpu";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(prefix: &str, i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("{prefix}-{i}"), "namespace": "load", "uid": format!("{prefix}-uid-{i}")},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {RESOURCE: "1"}}}]}
    }))
    .expect("valid pod")
}

fn percentile(samples: &[Duration], pct: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[(sorted.len() * pct / 100).min(sorted.len().saturating_sub(1))]
}

/// Admits `count` fresh pods one after another; returns their latencies.
async fn admit_phase(admitter: &PodAdmitter, prefix: &str, count: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(count);
    for i in 0..count {
        let pod = pod(prefix, i);
        let t = Instant::now();
        admitter.admit(&pod).await.expect("admitted");
        latencies.push(t.elapsed());
    }
    latencies
}

fn main() {
    let containers = env_or("DEVICELET_LOAD_CONTAINERS", 5_000);
    let clients = env_or("DEVICELET_LOAD_CLIENTS", 50);
    let calls = env_or("DEVICELET_LOAD_CALLS", 20);
    let admissions = env_or("DEVICELET_LOAD_ADMISSIONS", 200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let root = tempfile::Builder::new()
            .prefix("dl-prl-")
            .tempdir_in("/tmp")
            .expect("temp root");
        let dialer = FakeDialer::new();
        let plugin = FakePlugin::new(DevicePluginOptions::default());
        let socket = root.path().join("gpu.sock");
        dialer.add(&socket, plugin.clone());
        let manager = DeviceManager::new(
            DeviceManagerConfig::new(root.path()),
            Arc::new(dialer),
            Arc::new(SystemClock),
        );
        manager
            .connect_plugin(RESOURCE, socket, RegistrationSource::KubeletSocket)
            .await
            .expect("plugin connected");
        let total_devices = containers + 3 * admissions;
        plugin.send(
            (0..total_devices)
                .map(|i| Device::healthy(format!("gpu-{i}")).on_numa([(i % 2) as i64]))
                .collect(),
        );
        let mut changes = manager.subscribe();
        while manager.capacity().capacity.get(RESOURCE) != Some(&(total_devices as u64)) {
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }

        let admitter = Arc::new(PodAdmitter::new(manager.clone()));
        let fill = Instant::now();
        admit_phase(&admitter, "base", containers).await;
        let fill = fill.elapsed();

        let pr_socket = root.path().join("pod-resources.sock");
        let listener = transport::bind(&pr_socket).expect("bind");
        let service = PodResourcesService::with_rate_limit(admitter.clone(), u32::MAX, u32::MAX);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service.v1_server())
                .serve_with_incoming(transport::incoming(listener)),
        );

        let quiet = admit_phase(&admitter, "quiet", admissions).await;

        let mut tasks = Vec::with_capacity(clients);
        let load_start = Instant::now();
        for _ in 0..clients {
            let channel = transport::dial(&pr_socket, Duration::from_secs(5))
                .await
                .expect("dial");
            tasks.push(tokio::spawn(async move {
                let mut client = v1::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                    .max_decoding_message_size(64 << 20);
                let mut latencies = Vec::with_capacity(calls);
                let mut listed = 0;
                for _ in 0..calls {
                    let t = Instant::now();
                    let answer = client
                        .list(v1::ListPodResourcesRequest {})
                        .await
                        .expect("List");
                    latencies.push(t.elapsed());
                    listed = answer.into_inner().pod_resources.len();
                }
                (latencies, listed)
            }));
        }
        let loaded = admit_phase(&admitter, "loaded", admissions).await;
        let admit_done = load_start.elapsed();
        let mut list_latencies = Vec::with_capacity(clients * calls);
        let mut last_listed = 0;
        for task in tasks {
            let (latencies, listed) = task.await.expect("client task");
            list_latencies.extend(latencies);
            last_listed = listed;
        }
        let load = load_start.elapsed();
        let after = admit_phase(&admitter, "after", admissions).await;
        assert!(last_listed >= containers, "List saw {last_listed} pods");

        println!(
            "FIGURE podresources_load containers={containers} clients={clients} calls={} list_calls_per_s={:.0} list_p50={:?} list_p99={:?} load_wall={load:?}",
            list_latencies.len(),
            list_latencies.len() as f64 / load.as_secs_f64(),
            percentile(&list_latencies, 50),
            percentile(&list_latencies, 99),
        );
        println!(
            "FIGURE admission_latency pods_per_phase={admissions} quiet_p50={:?} quiet_p99={:?} under_load_p50={:?} under_load_p99={:?} (admitted within {admit_done:?} of load start) after_p50={:?} after_p99={:?} fill_{containers}={fill:?}",
            percentile(&quiet, 50),
            percentile(&quiet, 99),
            percentile(&loaded, 50),
            percentile(&loaded, 99),
            percentile(&after, 50),
            percentile(&after, 99),
        );
    });
}
