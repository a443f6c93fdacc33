//! prepare + unprepare of N pods with 2 claims each (issue 8 "Must show" benchmark) through the
//! in-process fake driver: the claim cache alone. Each pod's cycle includes the durable
//! checkpoint writes (fsync) in a temp dir. Prints pods/s and the p50/p99 latency of one pod's
//! prepare+unprepare, then runs criterion on a single cycle. The same workload over a real gRPC
//! v1 server is `cargo bench -p devicelet-rpc --bench dra_prepare_unprepare`.
//!
//! `DRA_BENCH_PODS` overrides N (default 1000).

use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_dra::fake::{FakeDialer, FakeDraDriver, two_claim_pods};
use devicelet_dra::{ClaimCache, DraPluginRegistry, FixedBootId, InMemoryClaimSource};

#[path = "../../../testsupport/dra_bench.rs"]
mod dra_bench;

const DRIVER: &str = "gpu.example.com";

fn bench(c: &mut Criterion) {
    let n = dra_bench::bench_pods();
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
    dra_bench::measure(
        c,
        &rt,
        "fake driver",
        "fake_prepare_unprepare_one_pod",
        &cache,
        &source,
        &pods,
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
