//! Cost of applying one `ListAndWatch` snapshot of 10 000 devices through
//! [`DeviceManager::apply_device_update`] (the `genericDeviceUpdateCallback` equivalent:
//! dedup, index build, change count, swap under the lock, change notification), with one
//! device's health different from the previous snapshot each time. Prints the median.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use devicelet_devicemanager::{
    ContainerAllocateResponse, Device, DeviceManager, DeviceManagerConfig, DevicePluginClient,
    DevicePluginOptions, DeviceUpdateStream, EndpointId, Health, PluginDialer, PluginError,
    PreferredAllocationRequest, RegisterRequest, SystemClock,
};
use futures::FutureExt;
use futures::future::BoxFuture;

const DEVICES: usize = 10_000;
const RESOURCE: &str = "example.com/gpu";

/// A plugin whose stream never yields: the benchmark feeds snapshots directly.
struct SilentPlugin;

impl DevicePluginClient for SilentPlugin {
    fn get_device_plugin_options(&self) -> BoxFuture<'_, Result<DevicePluginOptions, PluginError>> {
        futures::future::ready(Ok(DevicePluginOptions::default())).boxed()
    }
    fn list_and_watch(&self) -> BoxFuture<'_, Result<DeviceUpdateStream, PluginError>> {
        futures::future::ready(Ok(futures::stream::StreamExt::boxed(
            futures::stream::pending(),
        )))
        .boxed()
    }
    fn allocate(
        &self,
        _: Vec<Vec<String>>,
    ) -> BoxFuture<'_, Result<Vec<ContainerAllocateResponse>, PluginError>> {
        futures::future::ready(Ok(vec![])).boxed()
    }
    fn get_preferred_allocation(
        &self,
        _: Vec<PreferredAllocationRequest>,
    ) -> BoxFuture<'_, Result<Vec<Vec<String>>, PluginError>> {
        futures::future::ready(Ok(vec![])).boxed()
    }
    fn pre_start_container(&self, _: Vec<String>) -> BoxFuture<'_, Result<(), PluginError>> {
        futures::future::ready(Ok(())).boxed()
    }
}

struct SilentDialer;

impl PluginDialer for SilentDialer {
    fn dial(
        &self,
        _: &Path,
    ) -> BoxFuture<'static, Result<Arc<dyn DevicePluginClient>, PluginError>> {
        futures::future::ready(Ok(Arc::new(SilentPlugin) as Arc<dyn DevicePluginClient>)).boxed()
    }
}

fn snapshot(unhealthy: usize) -> Vec<Device> {
    (0..DEVICES)
        .map(|i| {
            let health = if i == unhealthy {
                Health::Unhealthy
            } else {
                Health::Healthy
            };
            Device::healthy(format!("gpu-{i:05}"))
                .on_numa([(i % 4) as i64])
                .with_health(health)
        })
        .collect()
}

fn setup(runtime: &tokio::runtime::Runtime) -> (DeviceManager, EndpointId) {
    let manager = DeviceManager::new(
        DeviceManagerConfig::new("/dp"),
        Arc::new(SilentDialer),
        Arc::new(SystemClock),
    );
    let id = runtime
        .block_on(manager.register(&RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "gpu.sock".into(),
            resource_name: RESOURCE.into(),
        }))
        .expect("registration with the silent plugin succeeds");
    manager.apply_device_update(RESOURCE, id, snapshot(DEVICES));
    (manager, id)
}

fn bench_update(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (manager, id) = setup(&runtime);
    let mut flip = 0usize;
    c.bench_function("list_and_watch_update_10000_devices", |b| {
        b.iter_batched(
            || {
                flip = (flip + 1) % DEVICES;
                snapshot(flip)
            },
            |incoming| manager.apply_device_update(RESOURCE, id, incoming),
            BatchSize::LargeInput,
        )
    });

    let mut times: Vec<Duration> = (0..101)
        .map(|i| {
            let incoming = snapshot(i);
            let start = Instant::now();
            let summary = manager.apply_device_update(RESOURCE, id, incoming);
            let elapsed = start.elapsed();
            assert_eq!(summary.map(|s| s.devices), Some(DEVICES));
            elapsed
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "FIGURE list_and_watch_update devices={DEVICES} median={median:?} per_device={:?}",
        median / DEVICES as u32
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = bench_update
}
criterion_main!(benches);
