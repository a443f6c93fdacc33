//! `devicelet explain` on a large cluster (issue 19: "explain over 500 nodes' worth of slices
//! answers in under 1 s"): the part after the API reads, i.e. the conversion of the listed
//! objects into the allocator's inputs, the allocation on every candidate node and the
//! explanation of every node where the claims do not fit.
//!
//! Cluster: `EXPLAIN_BENCH_NODES` nodes (default 500), each with one ResourceSlice of 8 GPUs
//! (4 attributes, 2 NUMA nodes), half of every node's GPUs allocated to other claims. Two pods:
//! one whose claim fits (allocatable on every node) and one that fits nowhere (a selector no
//! device meets plus a matchAttribute pair: every node is explained).
//!
//!     cargo bench -p devicelet-kube --bench explain

use std::time::{Duration, Instant};

use devicelet_kube::explain::{ExplainOptions, Target, explain};
use devicelet_kube::snapshot::{ClusterState, ScenarioOptions, scenario_value, to_scenario};
use serde_json::json;

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("bench fixture")
}

fn cluster(nodes: usize) -> ClusterState {
    let driver = "gpu.example.com";
    let mut state = ClusterState {
        device_classes: vec![from(json!({
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}
        }))],
        taint_rules: Some(Vec::new()),
        ..ClusterState::default()
    };
    for n in 0..nodes {
        let node = format!("node-{n:04}");
        state.nodes.push(from(json!({
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}
        })));
        let devices: Vec<_> = (0..8)
            .map(|d| {
                json!({"name": format!("gpu-{d}"), "attributes": {
                    "model": {"string": "a100"},
                    "numa": {"int": d / 4},
                    "memory": {"int": 80},
                    "driverVersion": {"version": "1.2.3"},
                }})
            })
            .collect();
        state.resource_slices.push(from(json!({
            "metadata": {"name": format!("{node}-gpu")},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        })));
        // Half the node's GPUs are in use: one claim per device.
        for d in [0, 1, 4, 5] {
            state.claims.push(from(json!({
                "metadata": {"name": format!("held-{node}-{d}"), "namespace": "busy"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
                "status": {
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": driver, "pool": node, "device": format!("gpu-{d}")}
                    ]}},
                    "reservedFor": [{"resource": "pods", "name": format!("runner-{node}-{d}"), "uid": "u"}]
                }
            })));
        }
    }
    state.claims.push(from(json!({
        "metadata": {"name": "fits", "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}}]}}
    })));
    state.claims.push(from(json!({
        "metadata": {"name": "never", "namespace": "team"},
        "spec": {"devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": "gpu",
                    "selectors": [{"cel": {"expression": format!("device.attributes[\"{driver}\"].memory >= 80")}}]}},
                {"name": "b", "exactly": {"deviceClassName": "gpu", "count": 3,
                    "selectors": [{"cel": {"expression": format!("device.attributes[\"{driver}\"].model == \"h100\"")}}]}}
            ],
            "constraints": [{"requests": ["a", "b"], "matchAttribute": format!("{driver}/numa")}]
        }}
    })));
    for (pod, claim) in [("fits", "fits"), ("never", "never")] {
        state.pods.push(from(json!({
            "metadata": {"name": pod, "namespace": "team"},
            "spec": {"containers": [{"name": "main"}], "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": "Pending"}
        })));
    }
    state
}

fn measure(what: &str, runs: usize, mut f: impl FnMut() -> String) -> Duration {
    let mut times = Vec::with_capacity(runs);
    let mut last = String::new();
    for _ in 0..runs {
        let t = Instant::now();
        last = f();
        times.push(t.elapsed());
    }
    times.sort();
    let median = times[runs / 2];
    println!(
        "{what}: median {:.1} ms, max {:.1} ms over {runs} runs ({last})",
        median.as_secs_f64() * 1e3,
        times[runs - 1].as_secs_f64() * 1e3
    );
    median
}

fn main() {
    let nodes: usize = std::env::var("EXPLAIN_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let runs = 5;
    let state = cluster(nodes);
    println!(
        "cluster: {nodes} nodes, {} ResourceSlices, {} devices, {} allocated claims",
        state.resource_slices.len(),
        nodes * 8,
        state.claims.len() - 2
    );
    let options = ExplainOptions::default();
    let pod = |name: &str| Target::Pod {
        namespace: "team".into(),
        name: name.into(),
    };
    let fits = measure("explain pod/fits (allocatable)", runs, || {
        let r = explain(&state, &pod("fits"), &options).expect("explained");
        assert!(
            r.summary
                .starts_with(&format!("allocatable on {nodes} of {nodes}"))
        );
        format!("{} nodes allocatable", nodes)
    });
    let never = measure("explain pod/never (every node explained)", runs, || {
        let r = explain(&state, &pod("never"), &options).expect("explained");
        assert!(r.summary.contains("cannot be allocated"), "{}", r.summary);
        assert_eq!(
            r.nodes.iter().filter(|n| n.explanation.is_some()).count(),
            nodes
        );
        format!("{} nodes explained", r.nodes.len())
    });
    measure("snapshot conversion (to_scenario + encode)", runs, || {
        let s = to_scenario(&state, &ScenarioOptions::default());
        let v = scenario_value(&s).expect("encode");
        format!("{} bytes of JSON", v.to_string().len())
    });
    let worst = fits.max(never);
    println!(
        "explain over {nodes} nodes: {:.0} ms (target < 1 s): {}",
        worst.as_secs_f64() * 1e3,
        if worst < Duration::from_secs(1) {
            "MET"
        } else {
            "NOT MET"
        }
    );
}
