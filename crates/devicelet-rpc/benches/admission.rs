//! Admits 5 000 pods (one `example.com/gpu` device each) through the daemon's durable
//! [`PodAdmitter`] against a device plugin served over real gRPC on a Unix socket (the
//! `Allocate` RPC of every pod crosses the socket; every admission is fsync'd to the journal
//! before it returns). `CLIENTS` concurrent clients submit pods in order (group commit shares
//! fsyncs between them; `ADMISSION_BENCH_CLIENTS=1` gives one-after-another). Prints pods/s and
//! the p99 admission latency over the first and the last 500 pods, for `ADMISSION_BENCH_ROUNDS`
//! (default 3) rounds that alternate the durable path and the in-memory path (no durability) on
//! the same manager, each round's pods removed after it, and the ratio of the two medians; then
//! admits 10 000 containers, stops the daemon and
//! prints the time a restart takes until it is ready (control socket answers, state restored),
//! median of `ADMISSION_BENCH_RESTART_RUNS` restarts (in this process; with `DEVICELET_BIN` set,
//! also of the real binary). `ADMISSION_BENCH_RESTART_ONLY=1` skips the admission figures.
//!
//! `ADMISSION_BENCH_CPU_POLICY=static` measures the static CPU manager instead: the daemon runs
//! `cpuManagerPolicy: static` (reserved CPU 0) on a described machine of 2 NUMA nodes with
//! [`STATIC_CPUS_PER_NODE`] CPUs each, and admits [`STATIC_PODS`] Guaranteed pods (one CPU and
//! one device each), so every admission takes an exclusive CPU and changes `cpu_manager_state`.
//! Only the durable admission figures are printed.
//!
//! `ADMISSION_BENCH_CPU_POLICY=aligned` measures a GPU node's full resource managers (issue 26):
//! `topologyManagerPolicy: single-numa-node`, the static CPU manager and the Static memory
//! manager on a described machine of [`ALIGNED_NUMA_NODES`] NUMA nodes, with devices spread over
//! all of them; [`ALIGNED_PODS`] Guaranteed pods each take one device, one exclusive CPU and
//! 64Mi of memory from one NUMA node, so every admission merges three providers' hints and
//! writes `cpu_manager_state`, `memory_manager_state` and the journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use devicelet_node::PodAdmitter;
use devicelet_rpc::test_utils::{StaticDevicePlugin, register_and_wait};
use devicelet_rpc::{Daemon, DaemonConfig};
use k8s_openapi::api::core::v1::Pod;

// The `devicelet` binary's allocator, so the figures are the daemon's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PODS: usize = 5_000;
const DEVICES: usize = RESTART_CONTAINERS;
const RESTART_CONTAINERS: usize = 10_000;
const RESOURCE: &str = "example.com/gpu";
/// Pods of the static-CPU-policy run: one exclusive CPU each.
const STATIC_PODS: usize = 2_000;
/// 2 × 1 025 CPUs: every pod gets one besides the reserved CPU 0.
const STATIC_CPUS_PER_NODE: u32 = 1_025;

/// NUMA nodes of the aligned run.
const ALIGNED_NUMA_NODES: usize = 8;
/// Pods of the aligned run.
const ALIGNED_PODS: usize = 2_000;

/// `ADMISSION_BENCH_CPU_POLICY=aligned`: device + CPU + memory on one of 8 NUMA nodes.
fn aligned_policy() -> bool {
    std::env::var("ADMISSION_BENCH_CPU_POLICY").is_ok_and(|v| v == "aligned")
}

/// The aligned run (see the module docs).
async fn aligned_run(clients: usize) {
    let root = tempfile::Builder::new()
        .prefix("dl-adm-aligned-")
        .tempdir_in("/tmp")
        .expect("temp root");
    let mut config = DaemonConfig::new(root.path());
    let a = &mut config.alignment;
    a.topology_manager_policy = "single-numa-node".into();
    a.cpu_manager_policy = "static".into();
    a.reserved_system_cpus = Some("0".into());
    a.memory_manager_policy = "Static".into();
    a.kube_reserved = [("memory".to_owned(), "924Mi".to_owned())].into();
    a.reserved_memory = vec![devicelet_node::alignment::MemoryReservation {
        numa_node: 0,
        limits: [("memory".to_owned(), "1Gi".to_owned())].into(),
    }];
    // One spare CPU per node beyond the pods' share (CPU 0 is reserved).
    let cpus_per_node = (ALIGNED_PODS / ALIGNED_NUMA_NODES + 1) as u32;
    a.devicelet.machine = Some(devicelet_topology::MachineConfig::uniform(
        ALIGNED_NUMA_NODES,
        cpus_per_node,
    ));
    a.devicelet.memory = Some(devicelet_node::alignment::DescribedMemory {
        per_node: "64Gi".into(),
        hugepages_per_node: Default::default(),
    });
    let devices = (0..ALIGNED_PODS)
        .map(|i| {
            devicelet_rpc::test_utils::device(
                &format!("gpu-{i}"),
                "Healthy",
                Some(vec![(i % ALIGNED_NUMA_NODES) as i64]),
            )
        })
        .collect();
    let daemon = start_with_plugin(config, StaticDevicePlugin::new(devices), ALIGNED_PODS).await;
    let pods: Arc<Vec<Pod>> = Arc::new((0..ALIGNED_PODS).map(guaranteed_pod).collect());
    let admitter = daemon.pods().clone();
    let (latencies, total) = admit_all(admitter.clone(), pods, 0..ALIGNED_PODS, clients).await;
    report(
        "admission_durable_aligned_8numa",
        &latencies,
        total,
        clients,
    );
    let alignment = admitter.alignment();
    let pinned = alignment
        .memory_manager()
        .expect("memory manager")
        .assignments()
        .len();
    assert_eq!(pinned, ALIGNED_PODS, "every pod's memory pinned");
    println!(
        "FIGURE admission_durable_aligned_8numa_state numa_nodes={ALIGNED_NUMA_NODES} memory_pinned_pods={pinned} exclusive_cpu_pods={}",
        alignment
            .cpu_manager()
            .expect("CPU manager")
            .state()
            .assignments
            .len()
    );
    daemon.shutdown().await.expect("clean stop");
}

/// `ADMISSION_BENCH_CPU_POLICY=static`: the static CPU manager variant.
fn static_cpu_policy() -> bool {
    std::env::var("ADMISSION_BENCH_CPU_POLICY").is_ok_and(|v| v == "static")
}

/// A Guaranteed pod (requests = limits, integer CPU) with the one device.
fn guaranteed_pod(i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": format!("uid-{i}")},
        "spec": {"containers": [{"name": "app", "resources": {
            "limits": {RESOURCE: "1", "cpu": "1", "memory": "64Mi"},
            "requests": {RESOURCE: "1", "cpu": "1", "memory": "64Mi"}
        }}]}
    }))
    .expect("valid pod")
}

/// A daemon started with `config`, with `devices` GPUs served over real gRPC (on NUMA nodes 0
/// and 1; `Allocate` answers EXAMPLE_DEVICES=<ids>) and registered.
async fn start_with_gpus(config: DaemonConfig, devices: usize) -> Daemon {
    start_with_plugin(config, StaticDevicePlugin::healthy("gpu", devices), devices).await
}

/// A daemon started with `config` and `plugin` (its `devices` GPUs) served over real gRPC and
/// registered; `Allocate` answers EXAMPLE_DEVICES=<ids>.
async fn start_with_plugin(
    config: DaemonConfig,
    plugin: StaticDevicePlugin,
    devices: usize,
) -> Daemon {
    let daemon = Daemon::start(config).await.expect("daemon");
    plugin
        .with_device_envs()
        .serve(&daemon.paths().device_plugins.join("gpu.sock"))
        .expect("serve plugin");
    register_and_wait(
        &daemon,
        "gpu.sock",
        RESOURCE,
        devices as u64,
        Duration::from_secs(60),
    )
    .await
    .expect("register the plugin");
    daemon
}

/// The static-CPU-policy run (see the module docs).
async fn static_cpu_run(clients: usize) {
    let root = tempfile::Builder::new()
        .prefix("dl-adm-cpu-")
        .tempdir_in("/tmp")
        .expect("temp root");
    let mut config = DaemonConfig::new(root.path());
    config.alignment.cpu_manager_policy = "static".into();
    config.alignment.reserved_system_cpus = Some("0".into());
    config.alignment.devicelet.machine = Some(devicelet_topology::MachineConfig::uniform(
        2,
        STATIC_CPUS_PER_NODE,
    ));
    let daemon = start_with_gpus(config, STATIC_PODS).await;
    let pods: Arc<Vec<Pod>> = Arc::new((0..STATIC_PODS).map(guaranteed_pod).collect());
    let admitter = daemon.pods().clone();
    let (latencies, total) = admit_all(admitter.clone(), pods, 0..STATIC_PODS, clients).await;
    report("admission_durable_static_cpu", &latencies, total, clients);
    let status = admitter.durable().status();
    let cpus = admitter
        .alignment()
        .cpu_manager()
        .expect("static CPU manager")
        .state();
    assert_eq!(cpus.assignments.len(), STATIC_PODS, "every pod pinned");
    println!(
        "FIGURE admission_durable_static_cpu_fsyncs commits={} journal_syncs={} exclusive_pods={} cpus={}",
        status.commits,
        status.journal_syncs,
        cpus.assignments.len(),
        2 * STATIC_CPUS_PER_NODE,
    );
    daemon.shutdown().await.expect("clean stop");
}

/// `ADMISSION_BENCH_ROUNDS` (default 3): alternating durable and in-memory rounds.
fn rounds() -> usize {
    std::env::var("ADMISSION_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}

fn clients() -> usize {
    std::env::var("ADMISSION_BENCH_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// Admits `pods[range]` with `clients` concurrent clients taking pods in order; returns the
/// latency of each pod (by index) and the wall time.
async fn admit_all(
    admitter: Arc<PodAdmitter>,
    pods: Arc<Vec<Pod>>,
    range: std::ops::Range<usize>,
    clients: usize,
) -> (Vec<Duration>, Duration) {
    let next = Arc::new(AtomicUsize::new(range.start));
    let latencies = Arc::new(std::sync::Mutex::new(vec![Duration::ZERO; range.len()]));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (admitter, pods, next, latencies) = (
                admitter.clone(),
                pods.clone(),
                next.clone(),
                latencies.clone(),
            );
            let (first, end) = (range.start, range.end);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return;
                    }
                    let t = Instant::now();
                    admitter.admit(&pods[i]).await.expect("admitted");
                    latencies.lock().expect("lock")[i - first] = t.elapsed();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
    let total = start.elapsed();
    let latencies = std::mem::take(&mut *latencies.lock().expect("lock"));
    (latencies, total)
}

fn report(what: &str, latencies: &[Duration], total: Duration, clients: usize) {
    let n = latencies.len();
    println!(
        "FIGURE {what} pods={n} clients={clients} pods_per_s={:.0} p99_first500={:?} p99_last500={:?} total={total:?}",
        n as f64 / total.as_secs_f64(),
        p99(&latencies[..500]),
        p99(&latencies[n - 500..]),
    );
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
        if static_cpu_policy() {
            return static_cpu_run(clients()).await;
        }
        if aligned_policy() {
            return aligned_run(clients()).await;
        }
        let root = tempfile::Builder::new()
            .prefix("dl-adm-")
            .tempdir_in("/tmp")
            .expect("temp root");
        let daemon = start_with_gpus(DaemonConfig::new(root.path()), DEVICES).await;

        let clients = clients();
        let rounds = rounds();
        // Pods of the timed rounds, then those that fill the node for the restart.
        let timed = 2 * rounds * PODS;
        let pods: Arc<Vec<Pod>> = Arc::new((0..timed + RESTART_CONTAINERS).map(pod).collect());
        let durable = daemon.pods().clone();
        if restart_only() {
            let _ = admit_all(durable, pods, timed..timed + RESTART_CONTAINERS, clients).await;
            return measure_restarts(daemon, root.path()).await;
        }
        // Durable and in-memory rounds alternate on the same manager (each round's pods removed
        // after it), so neither path gets the warm-up or the quieter half of the run.
        let memory = Arc::new(PodAdmitter::new(daemon.manager().clone()));
        let (mut durable_rates, mut memory_rates) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let first = 2 * round * PODS;
            let (latencies, total) =
                admit_all(durable.clone(), pods.clone(), first..first + PODS, clients).await;
            report("admission_durable", &latencies, total, clients);
            durable_rates.push(PODS as f64 / total.as_secs_f64());
            for i in first..first + PODS {
                durable.remove(&format!("uid-{i}")).await.expect("durable removal");
            }
            let first = first + PODS;
            let (latencies, total) =
                admit_all(memory.clone(), pods.clone(), first..first + PODS, clients).await;
            report("admission_in_memory", &latencies, total, clients);
            memory_rates.push(PODS as f64 / total.as_secs_f64());
            for i in first..first + PODS {
                daemon.manager().remove_pod(&format!("uid-{i}"));
            }
        }
        let status = durable.durable().status();
        println!(
            "FIGURE admission_durable_fsyncs commits={} journal_syncs={} compactions={}",
            status.commits, status.journal_syncs, status.compactions
        );
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (d, m) = (median(&mut durable_rates), median(&mut memory_rates));
        println!(
            "FIGURE admission_durable_vs_in_memory rounds={rounds} durable_median_pods_per_s={d:.0} in_memory_median_pods_per_s={m:.0} ratio={:.2}",
            d / m
        );

        // Restart with RESTART_CONTAINERS admitted containers.
        let (_, _) = admit_all(durable, pods, timed..timed + RESTART_CONTAINERS, clients).await;
        measure_restarts(daemon, root.path()).await;
    });
}

/// `ADMISSION_BENCH_RESTART_ONLY=1`: only fill the node and measure restarts.
fn restart_only() -> bool {
    std::env::var_os("ADMISSION_BENCH_RESTART_ONLY").is_some()
}

/// Stops `daemon` (serving `root` with `RESTART_CONTAINERS` admitted containers) and restarts
/// it `ADMISSION_BENCH_RESTART_RUNS` times (default 5) from a clean stop and from a crash image (the state files as they
/// were while it ran, journal not yet folded into the kubelet file); prints every run and the
/// median.
async fn measure_restarts(daemon: Daemon, root: &std::path::Path) {
    let crash = tempfile::Builder::new()
        .prefix("dl-crash-")
        .tempdir_in("/tmp")
        .expect("crash root");
    copy_state(root, crash.path());
    daemon.shutdown().await.expect("clean stop");
    if let Some(binary) = std::env::var_os("DEVICELET_BIN") {
        measure_process_restarts(std::path::Path::new(&binary), root);
    }
    let runs_wanted: usize = std::env::var("ADMISSION_BENCH_RESTART_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    for (what, from) in [
        ("restart_to_ready", root),
        ("restart_after_crash_to_ready", crash.path()),
    ] {
        let mut runs = Vec::new();
        for run in 0..runs_wanted {
            // Every crash run starts from the same image: a restart folds the journal.
            let scratch;
            let dir = if from == root {
                from
            } else {
                scratch = tempfile::Builder::new()
                    .prefix("dl-crash-run-")
                    .tempdir_in("/tmp")
                    .expect("crash run root");
                copy_state(from, scratch.path());
                scratch.path()
            };
            let t = Instant::now();
            let daemon = Daemon::start(DaemonConfig::new(dir))
                .await
                .expect("restart");
            let ready = t.elapsed();
            let restored = daemon.pods().list().pods.len();
            assert_eq!(restored, RESTART_CONTAINERS);
            let status = daemon.pods().durable().status();
            let (open_ms, read_ms) = (status.open_ms, status.read_ms);
            println!(
                "  {what} run {run}: {:.1} ms (state open + restore {open_ms:.1} ms, of which reading the files {read_ms:.1} ms)",
                ready.as_secs_f64() * 1000.0
            );
            runs.push(ready);
            let _ = daemon.shutdown().await;
        }
        runs.sort();
        println!(
            "FIGURE {what} containers={RESTART_CONTAINERS} runs={runs_wanted} median_ms={:.1} min_ms={:.1} max_ms={:.1}",
            runs[runs.len() / 2].as_secs_f64() * 1000.0,
            runs[0].as_secs_f64() * 1000.0,
            runs[runs.len() - 1].as_secs_f64() * 1000.0,
        );
    }
}

/// `DEVICELET_BIN=target/release/devicelet`: also times the real binary, from `exec` of
/// `devicelet serve` on a copy of the stopped node until its control socket accepts a
/// connection (what `devicelet get` needs).
fn measure_process_restarts(binary: &std::path::Path, state: &std::path::Path) {
    let mut runs = Vec::new();
    for run in 0..10 {
        let root = tempfile::Builder::new()
            .prefix("dl-proc-restart-")
            .tempdir_in("/tmp")
            .expect("process restart root");
        copy_state(state, root.path());
        let socket = root.path().join("devicelet").join("devicelet.sock");
        let t = Instant::now();
        let mut child = std::process::Command::new(binary)
            .args(["serve", "--metrics-address", "off", "--root-dir"])
            .arg(root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn devicelet serve");
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(t.elapsed() < Duration::from_secs(30), "not ready in 30 s");
            std::thread::sleep(Duration::from_micros(500));
        }
        let ready = t.elapsed();
        println!(
            "  process_restart_to_ready run {run}: {:.1} ms",
            ready.as_secs_f64() * 1000.0
        );
        runs.push(ready);
        let _ = child.kill();
        let _ = child.wait();
    }
    runs.sort();
    println!(
        "FIGURE process_restart_to_ready containers={RESTART_CONTAINERS} runs={} median_ms={:.1} min_ms={:.1} max_ms={:.1}",
        runs.len(),
        runs[runs.len() / 2].as_secs_f64() * 1000.0,
        runs[0].as_secs_f64() * 1000.0,
        runs[runs.len() - 1].as_secs_f64() * 1000.0,
    );
}

/// Copies the device state files of `from` into `to` (the restart snapshot too, when there is
/// one), as a crash would leave them.
fn copy_state(from: &std::path::Path, to: &std::path::Path) {
    use devicelet_checkpoint::{
        device::DEVICE_CHECKPOINT_FILE, snapshot::SNAPSHOT_FILE, store::JOURNAL_FILE,
    };
    for (dir, file) in [
        ("device-plugins", DEVICE_CHECKPOINT_FILE),
        ("devicelet", JOURNAL_FILE),
        ("devicelet", SNAPSHOT_FILE),
    ] {
        let source = from.join(dir).join(file);
        std::fs::create_dir_all(to.join(dir)).expect("mkdir");
        if source.exists() {
            std::fs::copy(&source, to.join(dir).join(file)).expect("copy state file");
        }
    }
}
