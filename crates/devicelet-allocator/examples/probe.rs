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
}
