//! Device bin-packing (issue 38): how many nodes stay whole for an 8-GPU job once a cluster is
//! filled with smaller GPU jobs, one at a time through the real scheduling engine, under the
//! default profile (GPU-blind: cpu and memory only), LeastAllocated over the GPUs' DeviceClass
//! (spread) and MostAllocated over it (packed; spec W117 plus devicelet's counting of claims).
//!
//!     cargo bench -p devicelet-scheduler --bench packing
//!     PACKING_NODES=200 PACKING_FILL=90 cargo bench -p devicelet-scheduler --bench packing

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use devicelet_allocator::workloads::Workload;
use devicelet_allocator::{AllocateOptions, MonotonicClock};
use devicelet_scheduler::config::{Profile, ScoringStrategy, StrategyKind};
use devicelet_scheduler::cycle::{CycleInputs, Decision, with_engine};
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSpec};
use k8s_openapi::api::resource::v1::ResourceClaimStatus;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DEVICES: usize = 8;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The same job sizes for every profile: 1, 2 or 4 GPUs (5:3:2), from a fixed seed.
fn job_sizes(n: usize) -> Vec<i64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 10 {
                0..=4 => 1,
                5..=7 => 2,
                _ => 4,
            }
        })
        .collect()
}

/// Fills the cluster to `fill` % of its GPUs with `sizes` under `profile`; returns the nodes
/// with every GPU still free and the jobs placed.
fn fill_cluster(nodes: usize, fill: usize, sizes: &[i64], profile: &Profile) -> (usize, usize) {
    let w = Workload::steady_state(nodes, DEVICES, 0);
    let mut cache = common::cache_of(&w);
    let total = nodes * DEVICES;
    let mut used = 0usize;
    let mut per_node: HashMap<String, usize> = HashMap::new();
    let mut placed = 0;
    for (j, &size) in sizes.iter().enumerate() {
        if used * 100 >= total * fill {
            break;
        }
        let name = format!("job-{j}");
        let mut claim = w.claims[0].clone();
        claim.metadata.name = Some(name.clone());
        claim.metadata.uid = Some(format!("uid-claim-{name}"));
        claim.metadata.resource_version = Some("1".into());
        if let Some(r) = claim
            .spec
            .devices
            .as_mut()
            .and_then(|d| d.requests.as_mut())
            .and_then(|r| r.first_mut())
            .and_then(|r| r.exactly.as_mut())
        {
            r.count = Some(size);
        }
        cache.upsert_claim(claim);
        let mut pod = Pod {
            spec: Some(PodSpec {
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_name: Some(name.clone()),
                    ..PodResourceClaim::default()
                }]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        pod.metadata.name = Some(name.clone());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some(format!("uid-pod-{name}"));
        let options = AllocateOptions::with_time_limit(
            Duration::from_secs(10),
            Arc::new(MonotonicClock::start()),
        );
        let decision = with_engine(&mut cache, options, profile, |engine, cache| {
            let inputs = CycleInputs::read(&pod, cache, Duration::from_secs(600));
            engine.schedule(&pod, inputs)
        });
        let Decision::Place(p) = decision else {
            continue;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for (claim, allocation) in p.allocating() {
            let mut c = claim.clone();
            c.status
                .get_or_insert_with(ResourceClaimStatus::default)
                .allocation = Some(allocation.clone());
            cache.add_pending(&uid, c);
        }
        cache.assume_pod(&pod, &p.node);
        used += size as usize;
        *per_node.entry(p.node.clone()).or_default() += size as usize;
        placed += 1;
    }
    let whole = nodes - per_node.values().filter(|&&n| n > 0).count();
    (whole, placed)
}

fn main() {
    let nodes = env("PACKING_NODES", 64);
    let fill = env("PACKING_FILL", 75);
    let sizes = job_sizes(nodes * DEVICES);
    let class_resource = "deviceclass.resource.kubernetes.io/test-class".to_owned();
    let over_class = |kind: StrategyKind| {
        let mut p = Profile::named("bench");
        p.scoring = ScoringStrategy {
            kind,
            resources: vec![
                ("cpu".to_owned(), 1),
                ("memory".to_owned(), 1),
                (class_resource.clone(), 1),
            ],
        };
        p
    };
    println!(
        "{nodes} nodes x {DEVICES} GPUs filled to {fill} % with jobs of 1, 2 or 4 GPUs (one claim each), \
         nodes left whole for an 8-GPU job:"
    );
    for (label, profile) in [
        ("default profile (cpu, memory)", Profile::named("bench")),
        (
            "LeastAllocated over the class",
            over_class(StrategyKind::LeastAllocated),
        ),
        (
            "MostAllocated over the class",
            over_class(StrategyKind::MostAllocated),
        ),
    ] {
        let (whole, placed) = fill_cluster(nodes, fill, &sizes, &profile);
        println!(
            "  {label:32} {whole:4} of {nodes} nodes whole ({} %), {placed} jobs placed",
            whole * 100 / nodes
        );
    }
}
