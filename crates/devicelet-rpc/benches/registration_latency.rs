//! Registration-to-visible latency over real gRPC: a [`Daemon`] on a temporary root and two
//! device plugins (8 and 9 devices) served by tonic on Unix sockets in the same process. One
//! iteration = `Register` of `example.com/bench` on `kubelet.sock` (dial back,
//! `GetDevicePluginOptions`, open `ListAndWatch`) until the new plugin's devices are visible
//! through the control API (`GET /v1/resources`, what `devicelet get resources` calls).
//! Iterations alternate between the two plugins, so each one is a re-registration replacing
//! the previous endpoint and the inventory stays one resource. Prints median and p95.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use devicelet_rpc::test_utils::StaticDevicePlugin;
use devicelet_rpc::{ControlClient, Daemon, DaemonConfig, transport};

const RESOURCE: &str = "example.com/bench";

struct Setup {
    _root: tempfile::TempDir,
    daemon: Daemon,
    control: ControlClient,
    next: usize,
}

async fn setup() -> Setup {
    let root = tempfile::Builder::new()
        .prefix("dl-bench-")
        .tempdir_in("/tmp")
        .expect("temp root");
    let daemon = Daemon::start(DaemonConfig::new(root.path()))
        .await
        .expect("daemon starts");
    for devices in [8, 9] {
        let socket = daemon
            .paths()
            .device_plugins
            .join(format!("bench{devices}.sock"));
        StaticDevicePlugin::healthy("dev", devices)
            .serve(&socket)
            .expect("serve plugin");
    }
    let control = ControlClient::new(&daemon.paths().control_socket);
    Setup {
        _root: root,
        daemon,
        control,
        next: 0,
    }
}

/// One (re-)registration, until the new plugin's devices are visible in `GET /v1/resources`.
async fn register_until_visible(setup: &mut Setup) -> Duration {
    setup.next += 1;
    let devices: u64 = if setup.next.is_multiple_of(2) { 8 } else { 9 };
    let endpoint = format!("bench{devices}.sock");
    let mut changes = setup.daemon.manager().subscribe();
    let start = Instant::now();
    let channel = transport::dial(&setup.daemon.paths().kubelet_socket, Duration::from_secs(5))
        .await
        .expect("dial kubelet.sock");
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint.clone(),
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await
        .expect("register");
    loop {
        let visible = setup.daemon.manager().capacity().capacity.get(RESOURCE) == Some(&devices);
        if visible {
            let snapshot = setup.control.resources().await.expect("control API");
            let shown = snapshot.resource(RESOURCE).is_some_and(|r| {
                r.capacity == devices
                    && r.endpoint
                        .as_ref()
                        .is_some_and(|e| e.socket.ends_with(&endpoint))
            });
            if shown {
                return start.elapsed();
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), changes.changed()).await;
    }
}

fn bench_registration(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut setup = runtime.block_on(setup());
    c.bench_function("registration_to_visible", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += register_until_visible(&mut setup).await;
                }
                total
            })
        })
    });

    let mut samples: Vec<Duration> = runtime.block_on(async {
        let mut samples = Vec::new();
        for _ in 0..200 {
            samples.push(register_until_visible(&mut setup).await);
        }
        samples
    });
    samples.sort();
    println!(
        "FIGURE registration_to_visible median={:?} p95={:?} (n={}, {} registrations in total)",
        samples[samples.len() / 2],
        samples[samples.len() * 95 / 100],
        samples.len(),
        setup.next
    );
    runtime.block_on(async move {
        let _ = setup.daemon.shutdown().await;
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(4));
    targets = bench_registration
}
criterion_main!(benches);
