//! Allocator throughput on the scheduler_perf-shaped workloads of spec
//! `structured-allocator.md` §4.4-§4.5 (generators in `devicelet_allocator::workloads`).
//!
//! Each workload prints one `allocations/s` line (pods per second of allocator time: a new
//! allocator plus one allocation call per node, like PreFilter + Filter) and then runs under
//! criterion. Run with `cargo bench -p devicelet-allocator --bench allocator`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use devicelet_allocator::workloads::Workload;

/// Runs `f` repeatedly for about `budget` and prints the rate.
fn report(name: &str, unit_per_call: u64, budget: Duration, mut f: impl FnMut() -> usize) {
    let start = Instant::now();
    let mut calls = 0u64;
    let mut check = 0usize;
    while start.elapsed() < budget || calls == 0 {
        check = check.wrapping_add(f());
        calls += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{name}: {:.1} allocations/s ({} pods in {:.2}s, check {check})",
        (calls * unit_per_call) as f64 / secs,
        calls * unit_per_call,
        secs
    );
}

fn steady_state(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_state_500nodes_x10");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for permille in [0usize, 500, 998] {
        let w = Workload::steady_state(500, 10, permille);
        let cache = w.snapshot();
        assert!(
            w.schedule_pod_all_nodes(&cache) > 0,
            "{}: some node must fit",
            w.name
        );
        report(&w.name, 1, Duration::from_secs(1), || {
            w.schedule_pod_all_nodes(&cache)
        });
        group.bench_function(format!("{permille}permille"), |b| {
            b.iter(|| black_box(w.schedule_pod_all_nodes(&cache)))
        });
    }
    group.finish();
}

fn fill_up(c: &mut Criterion) {
    let base = Workload::steady_state(500, 10, 0);
    let cache = base.snapshot();
    assert_eq!(base.fill_up(5000, &cache), 5000);
    report(
        "fill_up_5000pods_500nodes",
        5000,
        Duration::from_secs(1),
        || base.fill_up(5000, &cache),
    );
    let mut group = c.benchmark_group("fill_up");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(5000));
    group.bench_function("5000pods_500nodes", |b| {
        b.iter(|| black_box(base.fill_up(5000, &cache)))
    });
    group.finish();
}

fn partitionable(c: &mut Criterion) {
    let w = Workload::partitionable(10, 200);
    let cache = w.snapshot();
    assert_eq!(w.schedule_pod_all_nodes(&cache), 10);
    report(&w.name, 1, Duration::from_secs(1), || {
        w.schedule_pod_all_nodes(&cache)
    });
    let mut group = c.benchmark_group("partitionable");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    group.bench_function("200pools_10nodes", |b| {
        b.iter(|| black_box(w.schedule_pod_all_nodes(&cache)))
    });
    group.finish();
}

fn cel_heavy(c: &mut Criterion) {
    let w = Workload::cel_heavy(500, 10);
    let cache = w.snapshot();
    assert_eq!(w.schedule_pod_all_nodes(&cache), 500);
    report(&w.name, 1, Duration::from_secs(1), || {
        w.schedule_pod_all_nodes(&cache)
    });
    let mut group = c.benchmark_group("cel_heavy");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    group.bench_function("500nodes_x10", |b| {
        b.iter(|| black_box(w.schedule_pod_all_nodes(&cache)))
    });
    group.finish();
}

fn backtracking(c: &mut Criterion) {
    let mut group = c.benchmark_group("backtracking");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    for count in [5i64, 6, 7, 8] {
        let w = Workload::backtracking(count);
        let cache = w.snapshot();
        report(&w.name, 1, Duration::from_millis(500), || {
            w.schedule_pod_all_nodes(&cache)
        });
        group.bench_function(format!("count{count}"), |b| {
            b.iter(|| black_box(w.schedule_pod_all_nodes(&cache)))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    steady_state,
    fill_up,
    partitionable,
    cel_heavy,
    backtracking
);
criterion_main!(benches);
