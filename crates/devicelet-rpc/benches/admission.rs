//! Admits 5 000 pods one after another (one `example.com/gpu` device each) through
//! [`PodAdmitter`] against a device plugin served over real gRPC on a Unix socket (the
//! `Allocate` RPC of every pod crosses the socket). Prints pods/s and the p99 admission
//! latency over the first and the last 500 pods. In-memory path: no checkpoint is written.

use std::pin::Pin;
use std::time::{Duration, Instant};

use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use devicelet_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use devicelet_rpc::{Daemon, DaemonConfig, PodAdmitter, transport};
use futures::Stream;
use k8s_openapi::api::core::v1::Pod;
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

const PODS: usize = 5_000;
const RESOURCE: &str = "example.com/gpu";

struct Plugin;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }
    type ListAndWatchStream =
        Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;
    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = (0..PODS)
            .map(|i| pb::Device {
                id: format!("gpu-{i}"),
                health: "Healthy".into(),
                topology: Some(pb::TopologyInfo {
                    nodes: vec![pb::NumaNode { id: (i % 2) as i64 }],
                }),
            })
            .collect();
        let first = futures::stream::iter([Ok(pb::ListAndWatchResponse { devices })]);
        Ok(Response::new(Box::pin(futures::StreamExt::chain(
            first,
            futures::stream::pending(),
        ))))
    }
    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| pb::ContainerAllocateResponse {
                envs: [("EXAMPLE_DEVICES".to_owned(), c.devices_ids.join(","))].into(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }
    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": format!("uid-{i}")},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {RESOURCE: "1"}}}]}
    }))
    .expect("valid pod")
}

fn p99(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let root = tempfile::Builder::new().prefix("dl-adm-").tempdir_in("/tmp").expect("temp root");
        let daemon = Daemon::start(DaemonConfig::new(root.path())).await.expect("daemon");
        let socket = daemon.paths().device_plugins.join("gpu.sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(Plugin))
                .serve_with_incoming(transport::incoming(listener)),
        );
        let channel = transport::dial(&daemon.paths().kubelet_socket, Duration::from_secs(5))
            .await
            .expect("dial");
        RegistrationClient::new(channel)
            .register(pb::RegisterRequest {
                version: "v1beta1".into(),
                endpoint: "gpu.sock".into(),
                resource_name: RESOURCE.into(),
                options: None,
            })
            .await
            .expect("register");
        let mut changes = daemon.manager().subscribe();
        while daemon.manager().capacity().capacity.get(RESOURCE) != Some(&(PODS as u64)) {
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }

        let admitter = PodAdmitter::new(daemon.manager().clone());
        let pods: Vec<Pod> = (0..PODS).map(pod).collect();
        let mut latencies = Vec::with_capacity(PODS);
        let start = Instant::now();
        for pod in &pods {
            let t = Instant::now();
            admitter.admit(pod).await.expect("admitted");
            latencies.push(t.elapsed());
        }
        let total = start.elapsed();
        println!(
            "FIGURE admission pods={PODS} pods_per_s={:.0} p99_first500={:?} p99_last500={:?} total={total:?}",
            PODS as f64 / total.as_secs_f64(),
            p99(&latencies[..500]),
            p99(&latencies[PODS - 500..]),
        );
        let _ = daemon.shutdown().await;
    });
}
