//! prepare + unprepare of N pods with 2 claims each (issue 8 "Must show" benchmark) through the
//! real tonic client ([`GrpcDraDialer`]) and a gRPC v1 server on a Unix socket. Each pod's cycle
//! includes the durable checkpoint writes (fsync) in a temp dir. Prints pods/s and the p50/p99
//! latency of one pod's prepare+unprepare, then runs criterion on a single cycle. The same
//! workload with the in-process fake driver is `cargo bench -p devicelet-dra --bench
//! prepare_unprepare`.
//!
//! `DRA_BENCH_PODS` overrides N (default 1000).

use std::collections::HashMap;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_dra::fake::two_claim_pods;
use devicelet_dra::{ClaimCache, DraPluginRegistry, FixedBootId, InMemoryClaimSource};
use devicelet_proto::dra::v1;
use devicelet_rpc::GrpcDraDialer;
use devicelet_transport::{bind_unix_listener, shimmed_incoming};

#[path = "../../../testsupport/dra_bench.rs"]
mod dra_bench;

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

fn bench(c: &mut Criterion) {
    let n = dra_bench::bench_pods();
    let rt = tokio::runtime::Runtime::new().expect("runtime");

    let sock_dir = tempfile::Builder::new()
        .prefix("drab")
        .tempdir_in("/tmp")
        .expect("sock dir");
    let socket = sock_dir.path().join("dra.sock");
    let state = tempfile::tempdir().expect("state dir");
    let (cache, source, pods) = rt.block_on(async {
        let listener = bind_unix_listener(&socket).expect("bind");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(EchoDriver))
                .serve_with_incoming(shimmed_incoming(listener)),
        );
        let registry = DraPluginRegistry::new(Arc::new(GrpcDraDialer));
        registry
            .register(DRIVER, &socket, &["v1.DRAPlugin".to_owned()])
            .expect("register");
        let cache =
            ClaimCache::open(state.path(), registry, &FixedBootId("bench".into())).expect("open");
        let source = InMemoryClaimSource::new();
        let pods = two_claim_pods(&source, DRIVER, n);
        (cache, source, pods)
    });
    dra_bench::measure(
        c,
        &rt,
        "gRPC unix socket",
        "grpc_prepare_unprepare_one_pod",
        &cache,
        &source,
        &pods,
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
