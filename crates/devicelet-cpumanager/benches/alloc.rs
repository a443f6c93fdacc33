//! Allocate + release of 1 000 Guaranteed containers (1-4 exclusive CPUs each, in waves that
//! fill the machine) on a 2-socket, 128-CPU machine (2 × 32 cores × 2 threads, 2 NUMA nodes),
//! with the real `cpu_manager_state` written (atomic + fsync) after every change, with and
//! without container-scope hint generation + a NUMA hint; and `takeByTopology` alone (no
//! manager, no file). Prints ops/s.
//!
//! Run: `CARGO_TARGET_DIR=... cargo bench -p devicelet-cpumanager --bench alloc`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use devicelet_cpumanager::{
    CpuBits, CpuMachineConfig, CpuManager, CpuManagerConfig, PodCpuInfo, QosClass, ReservedCpus,
    take_by_topology,
};
use devicelet_topology::{ContainerSpec, HintProvider, NumaMask, PodSpec, TopologyHint};

const CONTAINERS: usize = 1000;

fn machine() -> devicelet_cpumanager::CpuTopology {
    CpuMachineConfig {
        sockets: 2,
        cores_per_socket: 32,
        threads_per_core: 2,
        numa_nodes: 2,
        cores_per_uncore_cache: None,
    }
    .to_topology()
    .expect("valid machine")
}

fn pods() -> Vec<PodCpuInfo> {
    (0..CONTAINERS)
        .map(|i| {
            let cpus = 1 + (i % 4) as i64;
            PodCpuInfo {
                spec: PodSpec {
                    uid: format!("pod-{i}"),
                    namespace: "bench".into(),
                    name: format!("pod-{i}"),
                    init_containers: vec![],
                    containers: vec![ContainerSpec {
                        name: "c".into(),
                        limits: [("cpu".to_string(), cpus * 1000)].into_iter().collect(),
                        restartable: false,
                    }],
                },
                qos: QosClass::Guaranteed,
                cpu_requests_millis: [("c".to_string(), cpus * 1000)].into_iter().collect(),
                pod_level: None,
                equivalent_guaranteed: Default::default(),
            }
        })
        .collect()
}

/// One pass: allocate containers until the machine is nearly full, release them, repeat
/// until all 1 000 have been allocated and released. Returns the number of operations.
fn run(m: &CpuManager, pods: &[PodCpuInfo], with_hints: bool) -> usize {
    let mut live: Vec<&PodCpuInfo> = vec![];
    let mut ops = 0;
    for (i, p) in pods.iter().enumerate() {
        m.register_pod(p);
        let c = &p.spec.containers[0];
        let hint = if with_hints {
            black_box(m.get_topology_hints(&p.spec, c));
            TopologyHint::new(NumaMask::from_bits(1 << (i % 2)), true)
        } else {
            TopologyHint::default()
        };
        if m.available_cpus().len() < 4 {
            for q in live.drain(..) {
                m.remove_pod(&q.spec.uid).expect("release");
                ops += 1;
            }
        }
        m.allocate_container(&p.spec, c, &hint).expect("fits");
        ops += 1;
        live.push(p);
    }
    for q in live.drain(..) {
        m.remove_pod(&q.spec.uid).expect("release");
        ops += 1;
    }
    ops
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = CpuManagerConfig {
        policy: "static".into(),
        reserved: ReservedCpus::List("0,64".into()),
        policy_options: BTreeMap::new(),
        feature_gates: devicelet_topology::FeatureGates::default(),
        topology_manager_policy: "none".into(),
    };
    let m = CpuManager::new(machine(), &cfg, dir.path()).expect("starts");
    let pods = pods();
    for with_hints in [false, true] {
        let start = Instant::now();
        let ops = run(&m, &pods, with_hints);
        let secs = start.elapsed().as_secs_f64();
        println!(
            "cpumanager 128 CPUs, {CONTAINERS} containers{}: {ops} allocate+release ops in {:.1} ms = {:.0} ops/s (checkpoint fsync per op)",
            if with_hints {
                " + hints + NUMA hint"
            } else {
                ""
            },
            secs * 1e3,
            ops as f64 / secs
        );
    }
    // The same workload without the manager and its file: takeByTopology on a free set.
    let topo = machine();
    let start = Instant::now();
    let mut ops = 0;
    for _ in 0..10 {
        let mut free = topo.all_cpus().clone();
        let mut held: Vec<CpuBits> = vec![];
        for i in 0..CONTAINERS {
            if free.len() < 4 {
                for h in held.drain(..) {
                    free = free.union(&h);
                    ops += 1;
                }
            }
            let got = take_by_topology(&topo, &free, 1 + i % 4).expect("fits");
            free = free.difference(&got);
            held.push(got);
            ops += 1;
        }
        ops += held.len();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "takeByTopology only, 128 CPUs: {ops} take+release ops in {:.1} ms = {:.0} ops/s",
        secs * 1e3,
        ops as f64 / secs
    );

    let mut g = c.benchmark_group("cpumanager_128cpu");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("allocate_release_1000_containers", |b| {
        b.iter(|| run(&m, &pods, false))
    });
    g.bench_function("allocate_release_1000_containers_with_hints", |b| {
        b.iter(|| run(&m, &pods, true))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
