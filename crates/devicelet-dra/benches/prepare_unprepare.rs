//! prepare + unprepare of N pods with 2 claims each (issue 8 "Must show" benchmark), through
//! (a) the in-process fake driver and (b) a real gRPC v1 server on a Unix socket. Each pod's
//! cycle includes the durable checkpoint writes (fsync) in a temp dir. Prints pods/s and the
//! p50/p99 latency of one pod's prepare+unprepare, then runs criterion on a single cycle.
//!
//! `DRA_BENCH_PODS` overrides N (default 1000).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_dra::fake::{FakeDialer, FakeDraDriver, allocated_claim, pod_with_claims};
use devicelet_dra::{
    ClaimCache, DraPluginDialer, DraPluginRegistry, FixedBootId, GrpcDraDialer, InMemoryClaimSource,
};
use devicelet_proto::dra::v1;
use devicelet_transport::{bind_unix_listener, shimmed_incoming};
use k8s_openapi::api::core::v1::Pod;

const DRIVER: &str = "gpu.example.com";

struct EchoDriver;

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for EchoDriver {
    async fn node_prepare_resources(
        &self,
        request: tonic::Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<v1::NodePrepareResourcesResponse>, tonic::Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let device = v1::Device {
                    request_names: vec![],
                    pool_name: "pool".to_owned(),
                    device_name: format!("dev-{}", c.name),
                    cdi_device_ids: vec![format!("{DRIVER}/claim={}", c.uid)],
                    share_id: None,
                };
                (
                    c.uid,
                    v1::NodePrepareResourceResponse {
                        devices: vec![device],
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
        let claims: HashMap<_, _> = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, v1::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(tonic::Response::new(v1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

struct Setup {
    cache: ClaimCache,
    source: InMemoryClaimSource,
    pods: Vec<Pod>,
    _state: tempfile::TempDir,
}

fn setup(dialer: Arc<dyn DraPluginDialer>, endpoint: &Path, n: usize) -> Setup {
    let state = tempfile::tempdir().expect("state dir");
    let registry = DraPluginRegistry::new(dialer);
    registry
        .register(DRIVER, endpoint, &["v1.DRAPlugin".to_owned()])
        .expect("register");
    let cache =
        ClaimCache::open(state.path(), registry, &FixedBootId("bench".into())).expect("open");
    let source = InMemoryClaimSource::new();
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        let uid = format!("pod-{i}");
        let (a, b) = (format!("c{i}-a"), format!("c{i}-b"));
        source.insert(allocated_claim(
            "ns",
            &a,
            &format!("u{i}a"),
            &[DRIVER],
            &[&uid],
        ));
        source.insert(allocated_claim(
            "ns",
            &b,
            &format!("u{i}b"),
            &[DRIVER],
            &[&uid],
        ));
        pods.push(pod_with_claims("ns", &format!("p{i}"), &uid, &[&a, &b]));
    }
    Setup {
        cache,
        source,
        pods,
        _state: state,
    }
}

async fn run(label: &str, s: &Setup) {
    let mut lat = Vec::with_capacity(s.pods.len());
    let start = Instant::now();
    for pod in &s.pods {
        let t = Instant::now();
        s.cache
            .prepare_resources(pod, &s.source)
            .await
            .expect("prepare");
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        s.cache.unprepare_resources(uid).await.expect("unprepare");
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "{label}: {} pods x 2 claims prepare+unprepare in {:.2?}: {:.0} pods/s, p50 {:.2?}, p99 {:.2?}",
        s.pods.len(),
        total,
        s.pods.len() as f64 / total.as_secs_f64(),
        pct(0.50),
        pct(0.99)
    );
}

fn bench(c: &mut Criterion) {
    let n: usize = std::env::var("DRA_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Runtime::new().expect("runtime");

    // (a) in-process fake driver
    let dialer = FakeDialer::new();
    dialer.add(&FakeDraDriver::new(DRIVER));
    let fake = setup(Arc::new(dialer), Path::new("/fake/dra.sock"), n);
    rt.block_on(run("fake driver", &fake));

    // (b) real gRPC v1 server on a Unix socket
    let sock_dir = tempfile::Builder::new()
        .prefix("drab")
        .tempdir_in("/tmp")
        .expect("sock dir");
    let socket = sock_dir.path().join("dra.sock");
    let grpc = rt.block_on(async {
        let listener = bind_unix_listener(&socket).expect("bind");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(EchoDriver))
                .serve_with_incoming(shimmed_incoming(listener)),
        );
        setup(Arc::new(GrpcDraDialer), &socket, n)
    });
    rt.block_on(run("gRPC unix socket", &grpc));

    let mut group = c.benchmark_group("dra");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let pod = &fake.pods[0];
    group.bench_function("fake_prepare_unprepare_one_pod", |b| {
        b.iter(|| {
            rt.block_on(async {
                fake.cache
                    .prepare_resources(pod, &fake.source)
                    .await
                    .expect("prepare");
                fake.cache
                    .unprepare_resources("pod-0")
                    .await
                    .expect("unprepare");
            })
        })
    });
    let gpod = &grpc.pods[0];
    group.bench_function("grpc_prepare_unprepare_one_pod", |b| {
        b.iter(|| {
            rt.block_on(async {
                grpc.cache
                    .prepare_resources(gpod, &grpc.source)
                    .await
                    .expect("prepare");
                grpc.cache
                    .unprepare_resources("pod-0")
                    .await
                    .expect("unprepare");
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
