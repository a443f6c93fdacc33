//! Hint generation + merge per admission at 2, 8, 16 and 64 NUMA nodes, 8 devices per node,
//! three providers (gpu, nic, fpga device resources), requests of 1, 2 and a node's worth (8).
//!
//! Scenarios:
//! * `free`: every device free; the merge finds a preferred single node.
//! * `fragmented`: one free device per node and resource, so requests above 1 cannot be met on
//!   one node, no preferred merge exists and the non-preferred search runs.
//!
//! `kubelet` rows run the literal kubelet algorithm (`reference`) where it can finish (2 nodes,
//! and 8 nodes for single-device requests); above that it enumerates 2^n masks per resource
//! and the cross product of three such lists.
//!
//! Run: `CARGO_TARGET_DIR=... cargo bench -p devicelet-topology --bench hints`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use devicelet_topology::merge::TieBreak;
use devicelet_topology::{
    DeviceNuma, NumaMask, Policy, PolicyName, PolicyOptions, ProviderHints, device_hints, reference,
};

const PER_NODE: usize = 8;
const RESOURCES: [&str; 3] = ["gpu", "nic", "fpga"];

struct Machine {
    mask: NumaMask,
    devices: Vec<DeviceNuma>,
    free: Vec<String>,
}

fn machine(nodes: usize, fragmented: bool) -> Machine {
    let mask = NumaMask::from_bits(if nodes == 64 {
        u64::MAX
    } else {
        (1u64 << nodes) - 1
    });
    let mut devices = vec![];
    let mut free = vec![];
    for n in 0..nodes {
        for d in 0..PER_NODE {
            let id = format!("dev-{n}-{d}");
            if !fragmented || d == 0 {
                free.push(id.clone());
            }
            devices.push(DeviceNuma::new(id, Some(vec![n as i64])));
        }
    }
    Machine {
        mask,
        devices,
        free,
    }
}

fn admission(m: &Machine, request: usize, policy: &Policy) -> bool {
    let free: Vec<&str> = m.free.iter().map(String::as_str).collect();
    let providers: Vec<ProviderHints> = RESOURCES
        .iter()
        .map(|r| {
            let hints = device_hints(&m.devices, &free, &[], request, m.mask).hints;
            ProviderHints::from([(r.to_string(), hints)])
        })
        .collect();
    policy.merge(&providers).1
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    group.sample_size(20);
    for fragmented in [false, true] {
        let scenario = if fragmented { "fragmented" } else { "free" };
        for nodes in [2usize, 8, 16, 64] {
            let m = machine(nodes, fragmented);
            let opts = PolicyOptions {
                max_allowable_numa_nodes: 64,
                ..PolicyOptions::default()
            };
            let policy =
                Policy::new(PolicyName::BestEffort, opts, m.mask, None).expect("valid policy");
            for request in [1usize, 2, PER_NODE] {
                let id = BenchmarkId::new(format!("{scenario}/devicelet/request-{request}"), nodes);
                group.bench_function(id, |b| {
                    b.iter(|| admission(black_box(&m), request, &policy))
                });
                let kubelet_feasible = nodes <= 2 || (nodes <= 8 && request == 1 && !fragmented);
                if kubelet_feasible {
                    let id =
                        BenchmarkId::new(format!("{scenario}/kubelet/request-{request}"), nodes);
                    group.bench_function(id, |b| {
                        b.iter(|| {
                            let free: Vec<&str> = m.free.iter().map(String::as_str).collect();
                            let providers: Vec<ProviderHints> = RESOURCES
                                .iter()
                                .map(|r| {
                                    let hints =
                                        device_hints(&m.devices, &free, &[], request, m.mask).hints;
                                    ProviderHints::from([(r.to_string(), hints)])
                                })
                                .collect();
                            reference::merge_providers(
                                black_box(&providers),
                                m.mask,
                                TieBreak::Narrowest,
                            )
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
