//! prepare + unprepare of N pods with 2 claims each (issue 8 "Must show" benchmark) through the
//! in-process fake driver: the claim cache alone. Each pod's cycle includes the durable
//! checkpoint writes (fsync) in a temp dir. Prints pods/s and the p50/p99 latency of one pod's
//! prepare+unprepare, then runs criterion on a single cycle. The same workload over a real gRPC
//! v1 server is `cargo bench -p devicelet-rpc --bench dra_prepare_unprepare`.
//!
//! `DRA_BENCH_PODS` overrides N (default 1000).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_dra::fake::{FakeDialer, FakeDraDriver, prepare_unprepare_each, two_claim_pods};
use devicelet_dra::{ClaimCache, DraPluginRegistry, FixedBootId, InMemoryClaimSource};

const DRIVER: &str = "gpu.example.com";

fn bench(c: &mut Criterion) {
    let n: usize = std::env::var("DRA_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Runtime::new().expect("runtime");

    let dialer = FakeDialer::new();
    dialer.add(&FakeDraDriver::new(DRIVER));
    let state = tempfile::tempdir().expect("state dir");
    let registry = DraPluginRegistry::new(Arc::new(dialer));
    registry
        .register(
            DRIVER,
            Path::new("/fake/dra.sock"),
            &["v1.DRAPlugin".to_owned()],
        )
        .expect("register");
    let cache =
        ClaimCache::open(state.path(), registry, &FixedBootId("bench".into())).expect("open");
    let source = InMemoryClaimSource::new();
    let pods = two_claim_pods(&source, DRIVER, n);
    let figure = rt
        .block_on(prepare_unprepare_each(&cache, &source, &pods))
        .expect("prepare+unprepare");
    println!("fake driver: {figure}");

    let mut group = c.benchmark_group("dra");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let pod = &pods[0];
    group.bench_function("fake_prepare_unprepare_one_pod", |b| {
        b.iter(|| {
            rt.block_on(async {
                cache
                    .prepare_resources(pod, &source)
                    .await
                    .expect("prepare");
                cache.unprepare_resources("pod-0").await.expect("unprepare");
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
