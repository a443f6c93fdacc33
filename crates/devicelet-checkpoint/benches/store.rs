//! Benchmarks for the durable device store (`cargo bench -p devicelet-checkpoint`).
//!
//! * `commit/one_admission/N` — latency of one durable admission record with N pods already in
//!   the store (must not grow with N; the kubelet's whole-file rewrite does).
//! * `compact/10000_containers` — folding the journal into the kubelet file.
//! * `open/10000_containers` — recovery (kubelet file + 500 journal records) to ready.
//!
//! First, `snapshot_open_profile` prints the median time of `DeviceStore::open` with 10 000
//! containers and their pod records, with and without the restart snapshot (`SNAPSHOT_OPEN`
//! lines; runs alternate), after a clean stop and from a crash image with 2 000 more pods in the
//! journal. `STORE_BENCH_SNAPSHOT_ONLY=1` prints only that.
//!
//! Before the criterion runs, a direct latency profile (p50/p99 over 500 commits at each N) is
//! printed, since the admission target is stated in percentiles.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use devicelet_checkpoint::device;
use devicelet_checkpoint::state::{Change, DeviceState};
use devicelet_checkpoint::store::{DeviceStore, StoreOptions, StorePaths};

fn admission(i: usize) -> Change {
    Change::AddContainer {
        pod_uid: format!("5d9c1f8e-0000-4000-8000-{i:012}"),
        container: "ctr".into(),
        resource: "example.com/gpu".into(),
        device_ids_by_numa: BTreeMap::from([(
            i64::try_from(i % 2).unwrap_or(0),
            vec![format!("gpu-{}", i % 64)],
        )]),
        // A typical ContainerAllocateResponse: a few envs, one device node, one CDI name.
        alloc_resp: vec![0x2a; 96],
    }
}

/// A root whose kubelet file already holds `n` admitted pods.
fn prepared(root: &Path, n: usize) -> StorePaths {
    let paths = StorePaths::new(&root.join("device-plugins"), &root.join("devicelet"));
    std::fs::create_dir_all(root.join("device-plugins")).expect("mkdir");
    let mut state = DeviceState::default();
    state.apply(&Change::SetRegistered {
        resource: "example.com/gpu".into(),
        device_ids: (0..64).map(|i| format!("gpu-{i}")).collect(),
    });
    for i in 0..n {
        state.apply(&admission(i));
    }
    std::fs::write(&paths.kubelet_file, device::encode(&state.to_checkpoint())).expect("write");
    paths
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// CPU time of the calling thread (Linux `schedstat`), to separate our cost from fsync waits.
fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace()
        .next()?
        .parse()
        .ok()
        .map(Duration::from_nanos)
}

fn latency_profile() {
    println!("\n== commit latency profile (500 durable commits each, background compaction on) ==");
    for n in [0usize, 1_000, 5_000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = prepared(dir.path(), n);
        let (store, _) = DeviceStore::open_with(paths, StoreOptions::default()).expect("open");
        let mut samples = Vec::with_capacity(500);
        let cpu_before = thread_cpu();
        for i in 0..500 {
            let change = admission(1_000_000 + i);
            let t = Instant::now();
            store.commit(std::slice::from_ref(&change)).expect("commit");
            samples.push(t.elapsed());
        }
        let cpu = thread_cpu().zip(cpu_before).map(|(a, b)| (a - b) / 500);
        samples.sort();
        println!(
            "N={n:>5} pods: p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}  CPU per commit {}",
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            samples[samples.len() - 1],
            cpu.map_or_else(|| "n/a".to_string(), |d| format!("{d:.1?}"))
        );
    }
}

fn group_commit_profile() {
    println!("\n== group commit: 8 threads x 250 durable commits, 5000 pods already admitted ==");
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = prepared(dir.path(), 5_000);
    let (store, _) = DeviceStore::open_with(paths, StoreOptions::default()).expect("open");
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..8usize {
            let store = &store;
            s.spawn(move || {
                for i in 0..250usize {
                    store
                        .commit(&[admission(3_000_000 + t * 1_000 + i)])
                        .expect("commit");
                }
            });
        }
    });
    let elapsed = started.elapsed();
    let stats = store.stats();
    println!(
        "{} commits in {:.1?} = {:.0} commits/s with {} journal fsyncs ({:.1} commits per fsync)",
        stats.commits,
        elapsed,
        stats.commits as f64 / elapsed.as_secs_f64(),
        stats.journal_syncs,
        stats.commits as f64 / stats.journal_syncs.max(1) as f64
    );
}

fn pod_record(i: usize) -> Change {
    Change::SetPod {
        pod_uid: format!("5d9c1f8e-0000-4000-8000-{i:012}"),
        record: devicelet_checkpoint::state::PodRecord {
            namespace: "default".into(),
            name: format!("pod-{i}"),
            containers: vec![devicelet_checkpoint::state::ContainerRecord {
                name: "ctr".into(),
                kind: "app".into(),
                limits: BTreeMap::from([("example.com/gpu".to_owned(), 1)]),
                devices: BTreeMap::from([(
                    "example.com/gpu".to_owned(),
                    vec![format!("gpu-{}", i % 64)],
                )]),
                cpus: None,
                numa_affinity: None,
            }],
        },
    }
}

/// Median `DeviceStore::open` with and without the snapshot (see the module docs).
fn snapshot_open_profile() {
    const PODS: usize = 10_000;
    const LATE: usize = 2_000;
    let manual = || StoreOptions {
        background_compaction: false,
        ..StoreOptions::default()
    };
    let root = tempfile::tempdir().expect("tempdir");
    let paths = StorePaths::new(
        &root.path().join("device-plugins"),
        &root.path().join("devicelet"),
    );
    let commit_range = |store: &DeviceStore, range: std::ops::Range<usize>| {
        let ids: Vec<usize> = range.collect();
        for chunk in ids.chunks(100) {
            let batch: Vec<Change> = chunk
                .iter()
                .flat_map(|i| [admission(*i), pod_record(*i)])
                .collect();
            store.commit(&batch).expect("commit");
        }
    };
    let (store, _) = DeviceStore::open_with(paths.clone(), manual()).expect("open");
    commit_range(&store, 0..PODS);
    store.compact().expect("compact");
    let clean = tempfile::tempdir().expect("tempdir");
    let copy = |from: &Path, to: &Path| {
        for (dir, file) in [
            ("device-plugins", device::DEVICE_CHECKPOINT_FILE),
            ("devicelet", devicelet_checkpoint::store::JOURNAL_FILE),
            ("devicelet", devicelet_checkpoint::snapshot::SNAPSHOT_FILE),
        ] {
            std::fs::create_dir_all(to.join(dir)).expect("mkdir");
            std::fs::copy(from.join(dir).join(file), to.join(dir).join(file)).expect("copy");
        }
    };
    copy(root.path(), clean.path());
    commit_range(&store, PODS..PODS + LATE);
    drop(store);
    for (what, image) in [("clean", clean.path()), ("crash", root.path())] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..7 {
            for use_snapshot in [true, false] {
                let run = tempfile::tempdir().expect("tempdir");
                copy(image, run.path());
                let p = StorePaths::new(
                    &run.path().join("device-plugins"),
                    &run.path().join("devicelet"),
                );
                if !use_snapshot {
                    std::fs::remove_file(&p.snapshot).expect("remove snapshot");
                }
                let t = Instant::now();
                let (_store, recovered) = DeviceStore::open_with(p, manual()).expect("open");
                let took = t.elapsed();
                assert!(recovered.state.pod_records.len() >= PODS);
                if use_snapshot {
                    with.push(took);
                } else {
                    without.push(took);
                }
            }
        }
        with.sort();
        without.sort();
        println!(
            "SNAPSHOT_OPEN {what} containers={} with_snapshot_median_ms={:.1} without_snapshot_median_ms={:.1}",
            if what == "clean" { PODS } else { PODS + LATE },
            with[3].as_secs_f64() * 1000.0,
            without[3].as_secs_f64() * 1000.0
        );
    }
}

fn commit_bench(c: &mut Criterion) {
    snapshot_open_profile();
    if std::env::var_os("STORE_BENCH_SNAPSHOT_ONLY").is_some() {
        std::process::exit(0);
    }
    latency_profile();
    group_commit_profile();
    let mut group = c.benchmark_group("commit");
    group
        .sample_size(50)
        .measurement_time(Duration::from_secs(4));
    for n in [0usize, 1_000, 5_000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = prepared(dir.path(), n);
        let (store, _) = DeviceStore::open_with(paths, StoreOptions::default()).expect("open");
        let mut next = 1_000_000usize;
        group.bench_with_input(BenchmarkId::new("one_admission", n), &n, |b, _| {
            b.iter(|| {
                next += 1;
                store.commit(&[admission(next)]).expect("commit");
            });
        });
    }
    group.finish();
}

fn compact_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("compact");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(6));
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = prepared(dir.path(), 10_000);
    let (store, _) = DeviceStore::open_with(
        paths,
        StoreOptions {
            background_compaction: false,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let mut next = 1_000_000usize;
    group.bench_function("10000_containers", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                next += 1;
                store.commit(&[admission(next)]).expect("commit");
                let t = Instant::now();
                assert!(store.compact().expect("compact"));
                total += t.elapsed();
            }
            total
        });
    });
    group.finish();
}

fn open_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("open");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(6));
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = prepared(dir.path(), 10_000);
    {
        // 500 admissions in the journal on top of the kubelet file, as after a crash.
        let (store, _) = DeviceStore::open_with(
            paths.clone(),
            StoreOptions {
                background_compaction: false,
                ..StoreOptions::default()
            },
        )
        .expect("open");
        for i in 0..500 {
            store.commit(&[admission(2_000_000 + i)]).expect("commit");
        }
    }
    let (_, recovered) =
        DeviceStore::open_with(paths.clone(), StoreOptions::default()).expect("open");
    println!(
        "\n== recovery: {} containers, {} journal records replayed, open took {:.1?} ==",
        recovered.state.entry_count(),
        recovered.records_replayed,
        recovered.open_duration
    );
    group.bench_function("10000_containers", |b| {
        b.iter(|| {
            let (store, recovered) =
                DeviceStore::open_with(paths.clone(), StoreOptions::default()).expect("open");
            assert_eq!(recovered.state.entry_count(), 10_500);
            drop(store);
        });
    });
    group.finish();
}

criterion_group!(benches, commit_bench, compact_bench, open_bench);
criterion_main!(benches);
