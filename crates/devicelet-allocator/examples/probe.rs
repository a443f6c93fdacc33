//! Timing probe for the steady-state workload: allocator construction vs. allocation calls.
use std::sync::Arc;
use std::time::Instant;

use devicelet_allocator::workloads::Workload;
use devicelet_allocator::{AllocateOptions, Allocator, Semantics};

fn main() {
    for (label, w) in [
        ("driver selector", Workload::steady_state(500, 10, 0)),
        (
            "no selector",
            Workload::steady_state_with_class(500, 10, 0, &[]),
        ),
    ] {
        let snap = w.snapshot();
        let claims: Vec<_> = w.claims.iter().collect();
        let t = Instant::now();
        let n = 20;
        for _ in 0..n {
            let a = Allocator::with_snapshot(
                Arc::clone(&snap),
                w.features,
                Semantics::GoCompat,
                &w.allocated,
            );
            std::hint::black_box(&a);
        }
        let new_ms = t.elapsed().as_secs_f64() * 1000.0 / n as f64;
        let a = Allocator::with_snapshot(
            Arc::clone(&snap),
            w.features,
            Semantics::GoCompat,
            &w.allocated,
        );
        let t = Instant::now();
        for node in &w.nodes {
            std::hint::black_box(a.allocate(node, &claims, &AllocateOptions::default()).ok());
        }
        let first = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        for node in &w.nodes {
            std::hint::black_box(a.allocate(node, &claims, &AllocateOptions::default()).ok());
        }
        let second = t.elapsed().as_secs_f64() * 1000.0;
        println!(
            "{label}: new {new_ms:.2} ms, 500 allocate (cold cache) {first:.2} ms, (warm) {second:.2} ms"
        );
    }
    // Exponential case of spec §4.2: 40 equivalent devices, count 10, then an impossible
    // request; the default step budget stops it.
    let devs: Vec<String> = (0..40).map(|i| format!("{{name: d{i}}}")).collect();
    let text = format!(
        "nodes: [{{metadata: {{name: n}}}}]\ndeviceClasses:\n- {{metadata: {{name: a}}, spec: {{selectors: [{{cel: {{expression: 'device.driver == \"x\"'}}}}]}}}}\n- {{metadata: {{name: b}}, spec: {{selectors: [{{cel: {{expression: 'device.driver == \"y\"'}}}}]}}}}\nresourceSlices: [{{metadata: {{name: s}}, spec: {{driver: x, nodeName: n, pool: {{name: p, generation: 1, resourceSliceCount: 1}}, devices: [{}]}}}}]\nclaims: [{{metadata: {{name: c}}, spec: {{devices: {{requests: [{{name: many, exactly: {{deviceClassName: a, count: 10}}}}, {{name: none, exactly: {{deviceClassName: b}}}}]}}}}}}]\n",
        devs.join(", ")
    );
    let s = match devicelet_allocator::scenario::parse_scenario(text.as_bytes()) {
        Ok(s) => s,
        Err(e) => {
            println!("probe scenario does not parse: {e}");
            return;
        }
    };
    let t = Instant::now();
    let o = devicelet_allocator::scenario::run_scenario(&s);
    println!(
        "exponential case: {:?} after {} steps in {:.2} s ({})",
        o.per_node[0].outcome,
        o.per_node[0]
            .stats
            .map(|s| s.allocate_one_invocations)
            .unwrap_or(0),
        t.elapsed().as_secs_f64(),
        o.per_node[0].error
    );
}
