//! DefaultPreemption's dry run (issue 38): every GPU of the cluster is held by a low-priority
//! pod through its claim; a high-priority pod asking for one GPU fits nowhere, and preemption
//! examines its candidate nodes (max(10 % of the nodes, 100)): per node, one allocator run with
//! every lower-priority pod gone, then one per victim while reprieving. Prints the dry run's
//! p50 and max over several preemptors: the cost a failed cycle adds before the nomination.
//!
//!     cargo bench -p devicelet-scheduler --bench preemption
//!     PREEMPTION_NODES=500 cargo bench -p devicelet-scheduler --bench preemption

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use devicelet_allocator::workloads::Workload;
use devicelet_allocator::{AllocateOptions, MonotonicClock};
use devicelet_scheduler::config::{PreemptionArgs, Profile};
use devicelet_scheduler::cycle::{CycleInputs, Decision, with_engine};
use devicelet_scheduler::preemption::{PreemptionInputs, Verdict, preempt};
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSpec, PodStatus};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DEVICES: usize = 8;

fn pod(name: &str, claim: &str, priority: i32, node: Option<&str>) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            priority: Some(priority),
            node_name: node.map(str::to_owned),
            resource_claims: Some(vec![PodResourceClaim {
                name: "gpu".into(),
                resource_claim_name: Some(claim.into()),
                ..PodResourceClaim::default()
            }]),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
            ..PodStatus::default()
        }),
        ..Pod::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

fn main() {
    let nodes: usize = std::env::var("PREEMPTION_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let w = Workload::steady_state(nodes, DEVICES, 0);
    let mut cache = common::cache_of(&w);
    // Every device held by a priority-0 pod of its own.
    for n in &w.nodes {
        let node = n.metadata.name.clone().unwrap_or_default();
        for d in 0..DEVICES {
            let name = format!("{node}-low-{d}");
            let mut claim = w.claims[0].clone();
            claim.metadata.name = Some(name.clone());
            claim.metadata.uid = Some(format!("uid-claim-{name}"));
            claim.metadata.resource_version = Some("1".into());
            claim.status = Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            request: "req-0".into(),
                            driver: "test-driver.cdi.k8s.io".into(),
                            pool: node.clone(),
                            device: format!("instance-{d}"),
                            ..DeviceRequestAllocationResult::default()
                        }]),
                        config: None,
                    }),
                    ..AllocationResult::default()
                }),
                reserved_for: Some(vec![ResourceClaimConsumerReference {
                    resource: "pods".into(),
                    name: name.clone(),
                    uid: format!("uid-{name}"),
                    api_group: None,
                }]),
                ..ResourceClaimStatus::default()
            });
            cache.upsert_claim(claim);
            cache.upsert_pod(&pod(&name, &name, 0, Some(&node)));
        }
    }
    let profile = Profile::named("bench");
    let mut runs = Vec::new();
    let mut victims = 0;
    for k in 0..10 {
        let name = format!("high-{k}");
        let mut claim = w.claims[0].clone();
        claim.metadata.name = Some(name.clone());
        claim.metadata.uid = Some(format!("uid-claim-{name}"));
        claim.metadata.resource_version = Some("1".into());
        cache.upsert_claim(claim);
        let preemptor = pod(&name, &name, 1000, None);
        let options = AllocateOptions::with_time_limit(
            Duration::from_secs(10),
            Arc::new(MonotonicClock::start()),
        );
        let (took, verdict) = with_engine(&mut cache, options, &profile, |engine, cache| {
            let timeout = Duration::from_secs(600);
            let Decision::Unschedulable { fit, .. } =
                engine.schedule(&preemptor, CycleInputs::read(&preemptor, cache, timeout))
            else {
                panic!("the preemptor fits");
            };
            let t = Instant::now();
            let cycle = CycleInputs::read(&preemptor, cache, timeout);
            let inputs = PreemptionInputs::read(cache, &preemptor, true);
            let verdict = preempt(
                engine,
                &preemptor,
                &cycle,
                &fit,
                &inputs,
                PreemptionArgs::default(),
            );
            (t.elapsed(), verdict)
        });
        match verdict {
            Verdict::Nominate(c) => victims += c.victims.len(),
            Verdict::Fail { message, .. } => panic!("no candidate: {message}"),
        }
        runs.push(took);
    }
    runs.sort();
    println!(
        "preemption dry run, {nodes} nodes x {DEVICES} GPUs all held by low-priority pods, a pod asking 1 GPU: \
         p50 {:.1} ms, max {:.1} ms over {} runs; {} victim(s) each",
        runs[runs.len() / 2].as_secs_f64() * 1e3,
        runs[runs.len() - 1].as_secs_f64() * 1e3,
        runs.len(),
        victims / runs.len()
    );
}
