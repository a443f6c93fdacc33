//! The measuring half of the DRA prepare+unprepare benchmarks, shared by
//! `devicelet-dra/benches/prepare_unprepare.rs` (fake driver) and
//! `devicelet-rpc/benches/dra_prepare_unprepare.rs` (real gRPC driver) through `#[path]`: the
//! same figure line and criterion cycle, whatever the driver behind the claim cache.

use std::time::Duration;

use criterion::Criterion;
use devicelet_dra::fake::prepare_unprepare_each;
use devicelet_dra::{ClaimCache, InMemoryClaimSource};
use k8s_openapi::api::core::v1::Pod;

/// Pods per run: `DRA_BENCH_PODS`, default 1000.
pub fn bench_pods() -> usize {
    std::env::var("DRA_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Prints `<label>: <pods/s, p50, p99>` over `pods`, then runs criterion on one pod's cycle
/// as `dra/<bench_name>`.
pub fn measure(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    label: &str,
    bench_name: &str,
    cache: &ClaimCache,
    source: &InMemoryClaimSource,
    pods: &[Pod],
) {
    let figure = rt
        .block_on(prepare_unprepare_each(cache, source, pods))
        .expect("prepare+unprepare");
    println!("{label}: {figure}");

    let mut group = c.benchmark_group("dra");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let pod = &pods[0];
    group.bench_function(bench_name, |b| {
        b.iter(|| {
            rt.block_on(async {
                cache.prepare_resources(pod, source).await.expect("prepare");
                cache.unprepare_resources("pod-0").await.expect("unprepare");
            })
        })
    });
    group.finish();
}
