//! The inter-pod plugins' cost per decision (issue 38), in scheduler_perf's shapes:
//! - TopologySpreading: nodes in 3 zones, pods already there, then pods with a zone
//!   `topologySpreadConstraints` (maxSkew 1, DoNotSchedule) placed one after another, each
//!   assumed before the next (as the scheduling loop does);
//! - SchedulingPodAntiAffinity: pods with required per-host anti-affinity on their own label,
//!   each on a node of its own.
//!
//! Prints each shape's decision p50 and p99 and checks the outcome (the skew holds; no two
//! anti-affinity pods share a node).
//!
//!     cargo bench -p devicelet-scheduler --bench inter_pod
//!     INTER_POD_NODES=5000 cargo bench -p devicelet-scheduler --bench inter_pod

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use devicelet_allocator::workloads::Workload;
use devicelet_allocator::{AllocateOptions, MonotonicClock};
use devicelet_scheduler::cache::ClusterCache;
use devicelet_scheduler::config::Profile;
use devicelet_scheduler::cycle::{CycleInputs, Decision, with_engine};
use k8s_openapi::api::core::v1::{
    Affinity, Pod, PodAffinityTerm, PodAntiAffinity, PodSpec, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ZONE: &str = "topology.kubernetes.io/zone";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn selector(app: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
        ..LabelSelector::default()
    })
}

fn pod(name: &str, app: &str, spec: PodSpec) -> Pod {
    let mut p = Pod {
        spec: Some(spec),
        ..Pod::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.labels = Some(BTreeMap::from([("app".to_owned(), app.to_owned())]));
    p
}

/// `nodes` nodes, each labelled with its hostname and one of 3 zones.
fn cluster(nodes: usize) -> (ClusterCache, Vec<String>) {
    let w = Workload::steady_state(nodes, 1, 0);
    let mut cache = common::cache_of(&w);
    let mut names = Vec::new();
    for (i, entry) in cache.node_entries().into_iter().enumerate() {
        let mut n = (*entry.node).clone();
        let name = n.metadata.name.clone().unwrap_or_default();
        let labels = n.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(ZONE.to_owned(), format!("zone-{}", i % 3));
        labels.insert("kubernetes.io/hostname".to_owned(), name.clone());
        cache.upsert_node(n);
        names.push(name);
    }
    (cache, names)
}

/// Places `pods` one after another, each assumed where it went: the decision times and nodes.
fn place(cache: &mut ClusterCache, pods: &[Pod]) -> (Vec<Duration>, Vec<String>) {
    let profile = Profile::named("bench");
    let mut times = Vec::new();
    let mut placed = Vec::new();
    for p in pods {
        let options = AllocateOptions::with_time_limit(
            Duration::from_secs(10),
            Arc::new(MonotonicClock::start()),
        );
        // The engine is rebuilt for each pod (the cache changes); only the cycle is timed.
        let (took, decision) = with_engine(cache, options, &profile, |engine, cache| {
            let t = Instant::now();
            let inputs = CycleInputs::read(p, cache, Duration::from_secs(600));
            let d = engine.schedule(p, inputs);
            (t.elapsed(), d)
        });
        let Decision::Place(placement) = decision else {
            panic!(
                "{} not placed: {decision:?}",
                p.metadata.name.as_deref().unwrap_or("")
            );
        };
        cache.assume_pod(p, &placement.node);
        times.push(took);
        placed.push(placement.node);
    }
    (times, placed)
}

fn percentiles(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let at = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e3;
    (at(0.5), at(0.99))
}

fn main() {
    let nodes = env("INTER_POD_NODES", 1000);
    // TopologySpreading: as many pods already there as nodes, then as many spread pods.
    let (mut cache, names) = cluster(nodes);
    for i in 0..nodes {
        let mut p = pod(&format!("init-{i}"), "web", PodSpec::default());
        p.spec.get_or_insert_with(Default::default).node_name =
            Some(names[(i * 7) % nodes].clone());
        cache.upsert_pod(&p);
    }
    let spread: Vec<Pod> = (0..nodes)
        .map(|i| {
            pod(
                &format!("spread-{i}"),
                "web",
                PodSpec {
                    topology_spread_constraints: Some(vec![TopologySpreadConstraint {
                        max_skew: 1,
                        topology_key: ZONE.into(),
                        when_unsatisfiable: "DoNotSchedule".into(),
                        label_selector: selector("web"),
                        ..TopologySpreadConstraint::default()
                    }]),
                    ..PodSpec::default()
                },
            )
        })
        .collect();
    let (times, placed) = place(&mut cache, &spread);
    // Pods of the label per zone, those already there included: the skew holds at the end.
    let zone_of: BTreeMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i % 3))
        .collect();
    let mut per_zone = [0usize; 3];
    for i in 0..nodes {
        per_zone[zone_of[names[(i * 7) % nodes].as_str()]] += 1;
    }
    for n in &placed {
        per_zone[zone_of[n.as_str()]] += 1;
    }
    let skew = per_zone.iter().max().unwrap_or(&0) - per_zone.iter().min().unwrap_or(&0);
    assert!(skew <= 1, "zones {per_zone:?}");
    let (p50, p99) = percentiles(times);
    println!(
        "TopologySpreading, {nodes} nodes in 3 zones, {nodes} pods there, {nodes} pods with a zone constraint \
         (maxSkew 1): decision p50 {p50:.2} ms, p99 {p99:.2} ms; pods of the label per zone {per_zone:?}"
    );
    // SchedulingPodAntiAffinity: half the nodes' worth of pods, each keeping off the others.
    let (mut cache, _) = cluster(nodes);
    let count = nodes / 2;
    let anti: Vec<Pod> = (0..count)
        .map(|i| {
            pod(
                &format!("anti-{i}"),
                "anti",
                PodSpec {
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            required_during_scheduling_ignored_during_execution: Some(vec![
                                PodAffinityTerm {
                                    label_selector: selector("anti"),
                                    topology_key: "kubernetes.io/hostname".into(),
                                    ..PodAffinityTerm::default()
                                },
                            ]),
                            ..PodAntiAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    ..PodSpec::default()
                },
            )
        })
        .collect();
    let (times, placed) = place(&mut cache, &anti);
    let distinct: std::collections::BTreeSet<&String> = placed.iter().collect();
    assert_eq!(
        distinct.len(),
        placed.len(),
        "two anti-affinity pods share a node"
    );
    let (p50, p99) = percentiles(times);
    println!(
        "SchedulingPodAntiAffinity, {nodes} nodes, {count} pods with per-host anti-affinity: decision \
         p50 {p50:.2} ms, p99 {p99:.2} ms; {} nodes used, one pod each",
        distinct.len()
    );
}
