//! End-to-end: the real tonic client ([`GrpcDraDialer`]) against tiny in-test DRA servers on Unix
//! sockets in a short temp dir (spec dra-kubelet.md §1.2, §1.3, §1.9): lazy connection
//! (registration before the driver listens), deadlines sent on the wire, v1 and v1beta1, and
//! reconnection after a driver restart on the same socket.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devicelet_dra::fake::{allocated_claim, pod_with_claims};
use devicelet_dra::{ClaimCache, DraPluginRegistry, FixedBootId, InMemoryClaimSource};
use devicelet_proto::dra::{v1, v1beta1};
use devicelet_rpc::GrpcDraDialer;
use devicelet_transport::{bind_unix_listener, shimmed_incoming};
use tokio::sync::oneshot;

/// (method, claim uids, grpc-timeout header present)
type Call = (&'static str, Vec<String>, bool);

#[derive(Clone, Default)]
struct Recorder {
    /// (method, claim uids, grpc-timeout header present)
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Recorder {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for Recorder {
    async fn node_prepare_resources(
        &self,
        request: tonic::Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<v1::NodePrepareResourcesResponse>, tonic::Status> {
        let has_deadline = request.metadata().get("grpc-timeout").is_some();
        let req = request.into_inner();
        self.calls.lock().expect("lock").push((
            "prepare",
            req.claims.iter().map(|c| c.uid.clone()).collect(),
            has_deadline,
        ));
        let claims = req
            .claims
            .into_iter()
            .map(|c| {
                (
                    c.uid.clone(),
                    v1::NodePrepareResourceResponse {
                        devices: vec![v1::Device {
                            request_names: vec!["req".to_owned()],
                            pool_name: "node-1".to_owned(),
                            device_name: format!("gpu-{}", c.name),
                            cdi_device_ids: vec![format!("example.com/gpu={}", c.uid)],
                            share_id: Some("share-1".to_owned()),
                        }],
                        error: String::new(),
                    },
                )
            })
            .collect();
        Ok(tonic::Response::new(v1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: tonic::Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<v1::NodeUnprepareResourcesResponse>, tonic::Status> {
        let has_deadline = request.metadata().get("grpc-timeout").is_some();
        let req = request.into_inner();
        self.calls.lock().expect("lock").push((
            "unprepare",
            req.claims.iter().map(|c| c.uid.clone()).collect(),
            has_deadline,
        ));
        let claims: HashMap<_, _> = req
            .claims
            .into_iter()
            .map(|c| (c.uid, v1::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(tonic::Response::new(v1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for Recorder {
    async fn node_prepare_resources(
        &self,
        request: tonic::Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<v1beta1::NodePrepareResourcesResponse>, tonic::Status> {
        let req = request.into_inner();
        self.calls.lock().expect("lock").push((
            "prepare-v1beta1",
            req.claims.iter().map(|c| c.uid.clone()).collect(),
            true,
        ));
        let claims = req
            .claims
            .into_iter()
            .map(|c| {
                (
                    c.uid.clone(),
                    v1beta1::NodePrepareResourceResponse {
                        devices: vec![v1beta1::Device {
                            request_names: vec![],
                            pool_name: "node-1".to_owned(),
                            device_name: "gpu-0".to_owned(),
                            cdi_device_ids: vec![format!("example.com/gpu={}", c.uid)],
                        }],
                        error: String::new(),
                    },
                )
            })
            .collect();
        Ok(tonic::Response::new(
            v1beta1::NodePrepareResourcesResponse { claims },
        ))
    }

    async fn node_unprepare_resources(
        &self,
        request: tonic::Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<v1beta1::NodeUnprepareResourcesResponse>, tonic::Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, v1beta1::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(tonic::Response::new(
            v1beta1::NodeUnprepareResourcesResponse { claims },
        ))
    }
}

/// Serves `recorder` on `socket` (v1 only, or v1beta1 only) until the sender is dropped/fired.
fn serve(socket: &Path, recorder: Recorder, v1beta1_only: bool) -> oneshot::Sender<()> {
    let listener = bind_unix_listener(socket).expect("bind");
    let (stop, stopped) = oneshot::channel::<()>();
    let mut builder = tonic::transport::Server::builder();
    let router = if v1beta1_only {
        builder.add_service(v1beta1::dra_plugin_server::DraPluginServer::new(recorder))
    } else {
        builder.add_service(v1::dra_plugin_server::DraPluginServer::new(recorder))
    };
    tokio::spawn(
        router.serve_with_incoming_shutdown(shimmed_incoming(listener), async {
            let _ = stopped.await;
        }),
    );
    stop
}

fn short_tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dra")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

#[tokio::test]
async fn s1_9_v1_registered_before_listening_prepares_and_unprepares_over_grpc() {
    let sock_dir = short_tmp();
    let state = tempfile::tempdir().expect("state");
    let socket: PathBuf = sock_dir.path().join("dra.sock");
    let registry =
        DraPluginRegistry::with_call_timeout(Arc::new(GrpcDraDialer), Duration::from_secs(5));
    // Registration succeeds although nothing listens yet.
    registry
        .register(
            "gpu.example.com",
            &socket,
            &["v1.DRAPlugin".to_owned(), "v1beta1.DRAPlugin".to_owned()],
        )
        .expect("register");
    let recorder = Recorder::default();
    let _stop = serve(&socket, recorder.clone(), false);
    let cache =
        ClaimCache::open(state.path(), registry.clone(), &FixedBootId("b".into())).expect("open");
    let source = InMemoryClaimSource::new();
    source.insert(allocated_claim(
        "ns",
        "c1",
        "uid-1",
        &["gpu.example.com"],
        &["pod-a"],
    ));
    source.insert(allocated_claim(
        "ns",
        "c2",
        "uid-2",
        &["gpu.example.com"],
        &["pod-a"],
    ));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c1", "c2"]);
    cache
        .prepare_resources(&pod, &source)
        .await
        .expect("prepare over gRPC");
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    assert_eq!(
        cache.container_cdi_devices(&pod, container).expect("cdi"),
        vec!["example.com/gpu=uid-1", "example.com/gpu=uid-2"]
    );
    let c1 = cache.get("ns", "c1").expect("cached");
    assert_eq!(
        c1.drivers["gpu.example.com"][0].share_id.as_deref(),
        Some("share-1")
    );
    assert!(
        registry
            .get("gpu.example.com")
            .expect("get")
            .client
            .is_connected()
    );
    cache
        .unprepare_resources("pod-a")
        .await
        .expect("unprepare over gRPC");
    let calls = recorder.calls();
    assert_eq!(calls.len(), 2, "one batched call each: {calls:?}");
    assert_eq!(calls[0].0, "prepare");
    let mut uids = calls[0].1.clone();
    uids.sort();
    assert_eq!(uids, vec!["uid-1", "uid-2"]);
    assert!(calls.iter().all(|c| c.2), "grpc-timeout sent on every call");
    assert_eq!(calls[1].0, "unprepare");
    assert!(cache.claims().is_empty());
}

#[tokio::test]
async fn s1_3_v1beta1_driver_works_and_never_reports_share_id() {
    let sock_dir = short_tmp();
    let state = tempfile::tempdir().expect("state");
    let socket = sock_dir.path().join("b.sock");
    let recorder = Recorder::default();
    let _stop = serve(&socket, recorder.clone(), true);
    let registry =
        DraPluginRegistry::with_call_timeout(Arc::new(GrpcDraDialer), Duration::from_secs(5));
    registry
        .register(
            "old.example.com",
            &socket,
            &["v1beta1.DRAPlugin".to_owned()],
        )
        .expect("register");
    let cache = ClaimCache::open(state.path(), registry, &FixedBootId("b".into())).expect("open");
    let source = InMemoryClaimSource::new();
    source.insert(allocated_claim(
        "ns",
        "c",
        "uid-c",
        &["old.example.com"],
        &["pod-a"],
    ));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    cache
        .prepare_resources(&pod, &source)
        .await
        .expect("prepare");
    let c = cache.get("ns", "c").expect("cached");
    assert_eq!(c.drivers["old.example.com"][0].share_id, None);
    assert_eq!(recorder.calls()[0].0, "prepare-v1beta1");
}

#[tokio::test]
async fn s1_3_service_mismatch_is_a_grpc_error() {
    let sock_dir = short_tmp();
    let state = tempfile::tempdir().expect("state");
    let socket = sock_dir.path().join("m.sock");
    let _stop = serve(&socket, Recorder::default(), true);
    let registry =
        DraPluginRegistry::with_call_timeout(Arc::new(GrpcDraDialer), Duration::from_secs(5));
    registry
        .register("liar.example.com", &socket, &["v1.DRAPlugin".to_owned()])
        .expect("register");
    let cache = ClaimCache::open(state.path(), registry, &FixedBootId("b".into())).expect("open");
    let source = InMemoryClaimSource::new();
    source.insert(allocated_claim(
        "ns",
        "c",
        "uid-c",
        &["liar.example.com"],
        &["pod-a"],
    ));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    let err = cache
        .prepare_resources(&pod, &source)
        .await
        .expect_err("unimplemented");
    assert!(err.to_string().contains("Unimplemented"), "{err}");
}

#[tokio::test]
async fn s1_12_driver_restart_on_the_same_socket_reconnects() {
    let sock_dir = short_tmp();
    let state = tempfile::tempdir().expect("state");
    let socket = sock_dir.path().join("r.sock");
    let registry =
        DraPluginRegistry::with_call_timeout(Arc::new(GrpcDraDialer), Duration::from_secs(2));
    registry
        .register("gpu.example.com", &socket, &["v1.DRAPlugin".to_owned()])
        .expect("register");
    let cache = ClaimCache::open(state.path(), registry, &FixedBootId("b".into())).expect("open");
    let source = InMemoryClaimSource::new();
    source.insert(allocated_claim(
        "ns",
        "c",
        "uid-c",
        &["gpu.example.com"],
        &["pod-a", "pod-b"],
    ));
    let a = pod_with_claims("ns", "a", "pod-a", &["c"]);
    // Driver not up yet: the prepare fails with a transport error, the pod stays recorded.
    let err = cache
        .prepare_resources(&a, &source)
        .await
        .expect_err("nobody listens");
    assert!(err.is_driver_unavailable(), "{err}");
    let first = Recorder::default();
    let stop = serve(&socket, first.clone(), false);
    cache
        .prepare_resources(&a, &source)
        .await
        .expect("driver up");
    // Driver restarts: old server gone, a new one on the same path.
    let _ = stop.send(());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = Recorder::default();
    let _stop2 = serve(&socket, second.clone(), false);
    let mut last = None;
    for _ in 0..50 {
        match cache.unprepare_resources("pod-a").await {
            Ok(()) => {
                last = None;
                break;
            }
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, None, "unprepare through the new server");
    assert_eq!(second.calls().len(), 1);
    assert_eq!(second.calls()[0].0, "unprepare");
}

struct HealthServer;

#[tonic::async_trait]
impl devicelet_proto::dra_health::v1alpha1::dra_resource_health_server::DraResourceHealth
    for HealthServer
{
    type NodeWatchResourcesStream = futures::stream::BoxStream<
        'static,
        Result<devicelet_proto::dra_health::v1alpha1::NodeWatchResourcesResponse, tonic::Status>,
    >;

    async fn node_watch_resources(
        &self,
        _request: tonic::Request<devicelet_proto::dra_health::v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<tonic::Response<Self::NodeWatchResourcesStream>, tonic::Status> {
        use devicelet_proto::dra_health::v1alpha1 as h;
        let msg = h::NodeWatchResourcesResponse {
            devices: vec![h::DeviceHealth {
                device: Some(h::DeviceIdentifier {
                    pool_name: "node-1".to_owned(),
                    device_name: "gpu-0".to_owned(),
                }),
                health: h::HealthStatus::Unhealthy as i32,
                last_updated_time: 0,
                health_check_timeout_seconds: 0,
                message: "é".repeat(600),
            }],
        };
        let s = futures::stream::iter(vec![Ok(msg)]);
        Ok(tonic::Response::new(Box::pin(s)))
    }
}

#[tokio::test]
async fn s1_10_health_stream_on_the_instance_connection() {
    use futures::StreamExt;
    let sock_dir = short_tmp();
    let socket = sock_dir.path().join("h.sock");
    let listener = bind_unix_listener(&socket).expect("bind");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::dra_plugin_server::DraPluginServer::new(Recorder::default()))
            .add_service(
                devicelet_proto::dra_health::v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                    HealthServer,
                ),
            )
            .serve_with_incoming(shimmed_incoming(listener)),
    );
    let registry = DraPluginRegistry::new(Arc::new(GrpcDraDialer));
    registry
        .register("gpu.example.com", &socket, &["v1.DRAPlugin".to_owned()])
        .expect("register");
    let inst = registry.get("gpu.example.com").expect("get");
    let mut stream = inst.client.watch_health().await.expect("stream");
    let devices = stream.next().await.expect("one message").expect("ok");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].health, devicelet_dra::HealthStatus::Unhealthy);
    assert_eq!(devices[0].timeout, Duration::from_secs(30), "0 → default");
    assert!(devices[0].message.len() <= 1024);
    assert!(
        devices[0].message.ends_with("..."),
        "truncated at a char boundary"
    );
    assert!(stream.next().await.is_none(), "EOF");
}
