//! PodResources under load (issue 6): a [`Daemon`] as `devicelet serve` runs it (durable
//! admitter: every admission is fsync'd to the journal before it returns; device plugin over
//! real gRPC on a Unix socket) holding 5 000 admitted containers. 50 concurrent clients, each on
//! its own gRPC connection to a PodResources socket, call v1 `List` in a bounded loop while pods
//! are admitted one after another. Prints List calls/s and p50/p99, admission p50/p99 before,
//! during and after the load, and a verdict, so "admission latency is unaffected" is a figure,
//! not a claim.
//!
//! Overlap: the "during" admissions start only once every client has had a `List` answered,
//! and clients keep calling (at least `DEVICELET_LOAD_CALLS` times each) until the last of those
//! admissions has returned, so every admission measured "during" ran with all 50 clients active.
//! The clients run on their own runtime (their own threads), as separate agent processes would;
//! sharing the daemon's runtime would charge their response decoding to the daemon.
//!
//! The PodResources service is the daemon's, over the daemon's admitter, on a second socket
//! without the kubelet's 100 QPS limit (which would refuse almost every call; the limit itself is
//! covered by `tests/podresources.rs`).
//!
//! `DEVICELET_LOAD_PIN=1` separates the load generator from the node under test, as load tests
//! usually do: the daemon (its runtime, the PodResources thread, the plugin, the admitting
//! thread) runs on CPU 0 and the 50 clients on CPU 1, so what is measured is what serving the
//! calls costs the daemon, not what decoding ~1 MB answers 100+ times a second costs the
//! clients. Without it everything shares both CPUs (the worst case on a 2-core machine).
//!
//! Sizes: `DEVICELET_LOAD_CONTAINERS` (5000), `DEVICELET_LOAD_CLIENTS` (50),
//! `DEVICELET_LOAD_CALLS` minimum calls per client (20), `DEVICELET_LOAD_ADMISSIONS` per phase
//! (1000). Verdict: admission under load is "unaffected" when its p50 and p99 are each within
//! `DEVICELET_LOAD_TOLERANCE` (2.0) times those of the two quiet phases (before and after the
//! load) taken together.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use devicelet_node::PodAdmitter;
use devicelet_proto::podresources::v1;
use devicelet_rpc::test_utils::{StaticDevicePlugin, register_and_wait};
use devicelet_rpc::{Daemon, DaemonConfig, PodResourcesService, transport};
use k8s_openapi::api::core::v1::Pod;

// The `devicelet` binary's allocator, so the figures are the daemon's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RESOURCE: &str = "example.com/gpu";
/// Concurrent submitters while filling the node (group commit shares their fsyncs).
const FILL_CLIENTS: usize = 32;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(prefix: &str, i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("{prefix}-{i}"), "namespace": "load", "uid": format!("{prefix}-uid-{i}")},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {RESOURCE: "1"}}}]}
    }))
    .expect("valid pod")
}

fn percentile(samples: &[Duration], pct: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[(sorted.len() * pct / 100).min(sorted.len().saturating_sub(1))]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Admits `count` fresh pods one after another; returns their latencies.
async fn admit_phase(admitter: &PodAdmitter, prefix: &str, count: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(count);
    for i in 0..count {
        let pod = pod(prefix, i);
        let t = Instant::now();
        admitter.admit(&pod).await.expect("admitted");
        latencies.push(t.elapsed());
    }
    latencies
}

/// Fills the node with `count` pods from `FILL_CLIENTS` concurrent submitters.
async fn fill(admitter: &Arc<PodAdmitter>, count: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..FILL_CLIENTS)
        .map(|_| {
            let (admitter, next) = (admitter.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    admitter.admit(&pod("base", i)).await.expect("admitted");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("fill task");
    }
}

/// What one client saw.
struct ClientRun {
    latencies: Vec<Duration>,
    listed: usize,
    /// When its first `List` was answered / when it stopped, from the load start.
    first_answer: Duration,
    done: Duration,
}

const DAEMON_CPU: usize = 0;
const CLIENT_CPU: usize = 1;

fn pin_current_thread(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
}

fn main() {
    let containers = env_or("DEVICELET_LOAD_CONTAINERS", 5_000usize);
    let clients = env_or("DEVICELET_LOAD_CLIENTS", 50usize);
    let min_calls = env_or("DEVICELET_LOAD_CALLS", 20usize).max(1);
    let admissions = env_or("DEVICELET_LOAD_ADMISSIONS", 1000usize);
    let tolerance = env_or("DEVICELET_LOAD_TOLERANCE", 2.0f64);
    let pin = std::env::var_os("DEVICELET_LOAD_PIN").is_some_and(|v| v == "1");
    if pin {
        // Threads inherit the affinity of the thread that starts them: everything the daemon
        // starts (blocking pool, PodResources thread) stays on CPU 0.
        pin_current_thread(DAEMON_CPU);
    }
    // The daemon's runtime, sized as `devicelet serve` sizes it on this 2-core machine.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            if pin {
                pin_current_thread(CLIENT_CPU);
            }
        })
        .build()
        .expect("client runtime");
    println!(
        "podresources_load: {}",
        if pin {
            "daemon on CPU 0, clients on CPU 1 (DEVICELET_LOAD_PIN=1)"
        } else {
            "daemon and clients share every CPU"
        }
    );
    runtime.block_on(async {
        let root = tempfile::Builder::new()
            .prefix("dl-prl-")
            .tempdir_in("/tmp")
            .expect("temp root");
        let mut config = DaemonConfig::new(root.path());
        config.plugin_watcher = false;
        let daemon = Daemon::start(config).await.expect("daemon");
        let total_devices = containers + 3 * admissions;
        let plugin_socket = daemon.paths().device_plugins.join("gpu.sock");
        StaticDevicePlugin::healthy("gpu", total_devices)
            .serve(&plugin_socket)
            .expect("serve plugin");
        register_and_wait(
            &daemon,
            "gpu.sock",
            RESOURCE,
            total_devices as u64,
            Duration::from_secs(60),
        )
        .await
        .expect("register the plugin");

        // The daemon's durable admitter.
        let admitter = daemon.pods().clone();
        let fill_start = Instant::now();
        fill(&admitter, containers).await;
        let fill_took = fill_start.elapsed();
        eprintln!("podresources_load: {containers} containers admitted in {fill_took:.2?}");

        let pr_socket = root.path().join("pr-load.sock");
        let listener = transport::bind(&pr_socket).expect("bind");
        let service = PodResourcesService::with_rate_limit(admitter.clone(), u32::MAX, u32::MAX);
        // Served as the daemon serves it: its own runtime, one thread at nice 19.
        let _server = service
            .serve_isolated(listener, pr_socket.clone(), std::future::pending())
            .expect("serve PodResources");

        let quiet = admit_phase(&admitter, "quiet", admissions).await;

        let answered = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let load_start = Instant::now();
        let mut tasks = Vec::with_capacity(clients);
        for _ in 0..clients {
            let (answered, stop, pr_socket) = (answered.clone(), stop.clone(), pr_socket.clone());
            tasks.push(client_runtime.spawn(async move {
                let channel = transport::dial(&pr_socket, Duration::from_secs(5))
                    .await
                    .expect("dial");
                let mut client =
                    v1::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                        .max_decoding_message_size(64 << 20);
                let mut run = ClientRun {
                    latencies: Vec::with_capacity(min_calls),
                    listed: 0,
                    first_answer: Duration::ZERO,
                    done: Duration::ZERO,
                };
                // Bounded: at least `min_calls`, then until the admissions under load are done.
                while run.latencies.len() < min_calls || !stop.load(Ordering::Acquire) {
                    let t = Instant::now();
                    let answer = client
                        .list(v1::ListPodResourcesRequest {})
                        .await
                        .expect("List");
                    run.latencies.push(t.elapsed());
                    run.listed = answer.into_inner().pod_resources.len();
                    if run.latencies.len() == 1 {
                        run.first_answer = load_start.elapsed();
                        answered.fetch_add(1, Ordering::AcqRel);
                    }
                }
                run.done = load_start.elapsed();
                run
            }));
        }
        // Every client is connected and has been answered once: the load is on.
        while answered.load(Ordering::Acquire) < clients {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let admit_from = load_start.elapsed();
        eprintln!("podresources_load: {clients} clients answered; admitting under load");
        let loaded = admit_phase(&admitter, "loaded", admissions).await;
        let admit_to = load_start.elapsed();
        stop.store(true, Ordering::Release);
        let mut runs = Vec::with_capacity(clients);
        for task in tasks {
            runs.push(task.await.expect("client task"));
        }
        let load_wall = load_start.elapsed();
        let after = admit_phase(&admitter, "after", admissions).await;

        let all_active_from = runs.iter().map(|r| r.first_answer).max().unwrap_or_default();
        let all_active_to = runs.iter().map(|r| r.done).min().unwrap_or_default();
        assert!(
            all_active_from <= admit_from && admit_to <= all_active_to,
            "admissions {admit_from:?}..{admit_to:?} not inside full load {all_active_from:?}..{all_active_to:?}"
        );
        let list_latencies: Vec<Duration> =
            runs.iter().flat_map(|r| r.latencies.iter().copied()).collect();
        let min_listed = runs.iter().map(|r| r.listed).min().unwrap_or_default();
        assert!(min_listed >= containers, "a List saw only {min_listed} pods");

        println!(
            "FIGURE podresources_load containers={containers} clients={clients} calls={} list_calls_per_s={:.0} list_p50_ms={:.1} list_p99_ms={:.1} load_wall={load_wall:.2?} fill_{containers}_durable={fill_took:.2?}",
            list_latencies.len(),
            list_latencies.len() as f64 / load_wall.as_secs_f64(),
            ms(percentile(&list_latencies, 50)),
            ms(percentile(&list_latencies, 99)),
        );
        println!(
            "FIGURE admission_latency pods_per_phase={admissions} before_p50_ms={:.2} before_p99_ms={:.2} during_p50_ms={:.2} during_p99_ms={:.2} after_p50_ms={:.2} after_p99_ms={:.2}",
            ms(percentile(&quiet, 50)),
            ms(percentile(&quiet, 99)),
            ms(percentile(&loaded, 50)),
            ms(percentile(&loaded, 99)),
            ms(percentile(&after, 50)),
            ms(percentile(&after, 99)),
        );
        println!(
            "OVERLAP all {clients} clients calling List from +{:.0}ms to +{:.0}ms; the {admissions} admissions under load ran from +{:.0}ms to +{:.0}ms (fully inside)",
            ms(all_active_from),
            ms(all_active_to),
            ms(admit_from),
            ms(admit_to),
        );
        // The reference is both quiet phases, before and after the load (A-B-A): one quiet
        // phase's p99 alone moved between 0.8 and 4.4 ms from run to run on this VM.
        let quiet_both: Vec<Duration> = quiet.iter().chain(after.iter()).copied().collect();
        let ratio_p50 = ms(percentile(&loaded, 50)) / ms(percentile(&quiet_both, 50));
        let ratio_p99 = ms(percentile(&loaded, 99)) / ms(percentile(&quiet_both, 99));
        let unaffected = ratio_p50 <= tolerance && ratio_p99 <= tolerance;
        println!(
            "VERDICT admission latency under List load is {} (during / quiet before+after: p50 {:.2}/{:.2} ms x{ratio_p50:.2}, p99 {:.2}/{:.2} ms x{ratio_p99:.2}; tolerance x{tolerance:.1})",
            if unaffected { "UNAFFECTED" } else { "AFFECTED" },
            ms(percentile(&loaded, 50)),
            ms(percentile(&quiet_both, 50)),
            ms(percentile(&loaded, 99)),
            ms(percentile(&quiet_both, 99)),
        );
        daemon.shutdown().await.expect("clean stop");
    });
    client_runtime.shutdown_background();
}
