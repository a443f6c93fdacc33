//! Cost of applying one `ListAndWatch` snapshot of 10 000 devices to the inventory
//! (`genericDeviceUpdateCallback` equivalent): dedup + index build + change count.
//! Prints the median time per update.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_devicemanager::{Device, Health, ResourceDevices};

const DEVICES: usize = 10_000;

fn snapshot(flip: usize) -> Vec<Device> {
    (0..DEVICES)
        .map(|i| {
            let health = if i % 100 == flip % 100 {
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

fn bench_update(c: &mut Criterion) {
    let (previous, _) = ResourceDevices::from_snapshot(snapshot(0));
    let previous = Arc::new(previous);
    c.bench_function("list_and_watch_update_10000_devices", |b| {
        b.iter_batched(
            || snapshot(1),
            |incoming| {
                let (set, _) = ResourceDevices::from_snapshot(incoming);
                std::hint::black_box(set.count_changes_from(&previous))
            },
            criterion::BatchSize::LargeInput,
        )
    });

    // Print the figure the benchmark is judged by: median of 51 timed updates.
    let mut times: Vec<Duration> = (0..51)
        .map(|_| {
            let incoming = snapshot(1);
            let start = Instant::now();
            let (set, _) = ResourceDevices::from_snapshot(incoming);
            std::hint::black_box(set.count_changes_from(&previous));
            start.elapsed()
        })
        .collect();
    times.sort();
    println!(
        "FIGURE list_and_watch_update devices={DEVICES} median={:?} per_device={:?}",
        times[times.len() / 2],
        times[times.len() / 2] / DEVICES as u32
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = bench_update
}
criterion_main!(benches);
