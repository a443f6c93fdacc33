//! Container-scope memory hint generation (`GetTopologyHints`) for a Guaranteed container of
//! 4 GiB memory + 2 GiB of 1Gi hugepages, on machines of 8 and 64 NUMA nodes (32 GiB and 4 1Gi
//! pages each, 1 GiB reserved per node), with a quarter of the nodes already holding
//! single-NUMA allocations. At 8 nodes the list is the kubelet's full one (255 masks
//! examined); at 64 nodes, where the kubelet would examine 2^64 masks, the bounded
//! enumeration of `policy::calculate_hints` runs. Prints hint generations per second.
//!
//! Run: `cargo bench -p devicelet-memorymanager --bench hints`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_cpumanager::{PodCpuInfo, QosClass};
use devicelet_memorymanager::{MemoryManager, MemoryManagerConfig, MemoryTopology, ReservedMemory};
use devicelet_topology::{ContainerSpec, NumaMask, PodSpec, TopologyHint};

const GI: u64 = 1 << 30;

fn pod(uid: &str, mem: u64, hp: u64) -> PodCpuInfo {
    let mut limits = BTreeMap::from([("memory".to_string(), mem as i64)]);
    if hp > 0 {
        limits.insert("hugepages-1Gi".into(), hp as i64);
    }
    PodCpuInfo {
        spec: PodSpec {
            uid: uid.into(),
            namespace: "bench".into(),
            name: uid.into(),
            init_containers: vec![],
            containers: vec![ContainerSpec {
                name: "c".into(),
                limits,
                restartable: false,
            }],
        },
        qos: QosClass::Guaranteed,
        cpu_requests_millis: BTreeMap::new(),
        pod_level: None,
        equivalent_guaranteed: Default::default(),
    }
}

fn manager(nodes: usize, dir: &std::path::Path) -> MemoryManager {
    let t = MemoryTopology::uniform(nodes, 32 * GI, &[(GI, 4)]).expect("topology");
    let config = MemoryManagerConfig {
        policy: "Static".into(),
        reserved_memory: (0..nodes as i64)
            .map(|n| ReservedMemory {
                numa_node: n,
                limits: BTreeMap::from([("memory".to_string(), "1Gi".to_string())]),
            })
            .collect(),
        node_allocatable_reservation: BTreeMap::from([(
            "memory".to_string(),
            (nodes as i64) << 30,
        )]),
    };
    let m = MemoryManager::new(t, &config, dir).expect("manager");
    for n in 0..nodes / 4 {
        let p = pod(&format!("busy-{n}"), 8 * GI, GI);
        m.register_pod(&p);
        let hint = TopologyHint::new(NumaMask::from_bits(1 << n), true);
        m.assign_container(&p.spec, &p.spec.containers[0], &hint)
            .expect("fits");
    }
    m
}

fn bench(c: &mut Criterion) {
    for nodes in [8usize, 64] {
        let dir = tempfile::tempdir().expect("tmp");
        let m = manager(nodes, dir.path());
        let p = pod("new", 4 * GI, 2 * GI);
        m.register_pod(&p);
        let container = &p.spec.containers[0];
        let hints = m.container_hints(&p.spec, container);
        let listed = match hints.get("memory") {
            Some(devicelet_topology::ResourceHints::Hints(v)) => v.len(),
            _ => 0,
        };
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_secs(2) {
            black_box(m.container_hints(&p.spec, container));
            n += 1;
        }
        let per_sec = n as f64 / start.elapsed().as_secs_f64();
        println!(
            "memory hints, {nodes} NUMA nodes: {per_sec:.0} generations/s ({:.1} us each, {listed} hints listed)",
            1e6 / per_sec
        );
        c.bench_function(&format!("memory_hints_{nodes}_numa"), |b| {
            b.iter(|| black_box(m.container_hints(&p.spec, container)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
