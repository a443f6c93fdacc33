//! Packing partitions (issue 38): after a churn of small partition requests on one node's
//! partitionable GPUs, how many whole GPUs are still free for a job that needs one — upstream's
//! device order (slice order) against `pack_partitions` (partitions of GPUs already in use
//! first). Both see the same seeded sequence of requests and releases.
//!
//!     cargo bench -p devicelet-allocator --bench partitions
//!     PARTITIONS_GPUS=16 PARTITIONS_STEPS=4000 PARTITIONS_SEEDS=20 cargo bench -p devicelet-allocator --bench partitions

use std::sync::Arc;

use devicelet_allocator::scenario::parse_scenario;
use devicelet_allocator::{
    AllocateOptions, AllocatedState, Allocator, CelFeatures, Features, SelectorCache, Semantics,
};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One node with `gpus` GPUs of 4 memory units, each offered whole and as 4 quarters, and a
/// quarter claim and a whole-GPU claim. The devices are listed per GPU (each whole GPU before
/// its quarters), or with `by_profile` per partition profile (every whole GPU, then every
/// GPU's first quarter, ...), as drivers that list by profile do.
fn scenario(gpus: usize, by_profile: bool) -> String {
    let mut text = String::from(
        "features: {PartitionableDevices: true}\n\
         nodes: [{metadata: {name: node-1}}]\n\
         deviceClasses:\n\
         - metadata: {name: gpu}\n  spec: {selectors: [{cel: {expression: 'device.driver == \"gpu.example.com\"'}}]}\n\
         resourceSlices:\n\
         - metadata: {name: counters}\n  spec:\n    driver: gpu.example.com\n    nodeName: node-1\n    \
         pool: {name: node-1, generation: 1, resourceSliceCount: 2}\n    sharedCounters:\n",
    );
    for g in 0..gpus {
        text.push_str(&format!(
            "    - {{name: gpu-{g}, counters: {{memory: {{value: \"4\"}}}}}}\n"
        ));
    }
    text.push_str(
        "- metadata: {name: devices}\n  spec:\n    driver: gpu.example.com\n    nodeName: node-1\n    \
         pool: {name: node-1, generation: 1, resourceSliceCount: 2}\n    devices:\n",
    );
    let whole = |g: usize| {
        format!(
            "    - {{name: gpu-{g}, attributes: {{size: {{string: whole}}}}, consumesCounters: [{{counterSet: gpu-{g}, counters: {{memory: {{value: \"4\"}}}}}}]}}\n"
        )
    };
    let quarter = |g: usize, q: usize| {
        format!(
            "    - {{name: gpu-{g}-q{q}, attributes: {{size: {{string: quarter}}}}, consumesCounters: [{{counterSet: gpu-{g}, counters: {{memory: {{value: \"1\"}}}}}}]}}\n"
        )
    };
    if by_profile {
        // Every whole GPU, then the first quarter of each GPU, then the second, ...
        for g in 0..gpus {
            text.push_str(&whole(g));
        }
        for q in 0..4 {
            for g in 0..gpus {
                text.push_str(&quarter(g, q));
            }
        }
    } else {
        for g in 0..gpus {
            text.push_str(&whole(g));
            for q in 0..4 {
                text.push_str(&quarter(g, q));
            }
        }
    }
    text.push_str("claims:\n");
    for size in ["quarter", "whole"] {
        text.push_str(&format!(
            "- metadata: {{name: {size}}}\n  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: gpu, allocationMode: ExactCount, count: 1, selectors: [{{cel: {{expression: 'device.attributes[\"gpu.example.com\"].size == \"{size}\"'}}}}]}}}}]}}}}\n"
        ));
    }
    text
}

/// xorshift64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Runs the churn; returns (whole GPUs free at the end, whole-GPU requests refused during the
/// churn, quarter requests refused).
fn churn(text: &str, gpus: usize, steps: usize, seed: u64, pack: bool) -> (usize, usize, usize) {
    let s = parse_scenario(text.as_bytes()).expect("valid scenario");
    let features = Features::kubernetes_1_36_defaults();
    let selectors = Arc::new(SelectorCache::new(CelFeatures {
        enable_consumable_capacity: features.consumable_capacity,
        enable_list_type_attributes: features.list_type_attributes,
    }));
    let quarter: &ResourceClaim = &s.claims[0];
    let whole: &ResourceClaim = &s.claims[1];
    let options = AllocateOptions {
        pack_partitions: pack,
        ..AllocateOptions::unbounded()
    };
    let mut rng = Rng(seed);
    // Held allocations, each with how many quarters it takes.
    let mut held: Vec<(AllocationResult, usize)> = Vec::new();
    let (mut whole_refused, mut quarter_refused) = (0, 0);
    let capacity = gpus * 4;
    // One allocation call for `claim` with the held devices in use.
    let allocate = |held: &[(AllocationResult, usize)], claim: &ResourceClaim| {
        let mut state = AllocatedState::default();
        for (a, _) in held {
            for r in a.devices.iter().flat_map(|d| d.results.iter().flatten()) {
                state.add_result(r, false).expect("valid result");
            }
        }
        let allocator = Allocator::new(
            features,
            Semantics::Fixed,
            &state,
            &s.device_classes,
            &s.resource_slices,
            selectors.clone(),
        );
        allocator.allocate(&s.nodes[0], &[claim], &options)
    };
    for _ in 0..steps {
        let in_use: usize = held.iter().map(|(_, q)| q).sum();
        // Keep utilisation around 60 %: allocate below it, release above it (some noise).
        let grow = in_use * 100 < capacity * 50 + (rng.next() % (capacity as u64 * 20)) as usize;
        if grow || held.is_empty() {
            // One job in ten wants a whole GPU.
            let (claim, quarters) = if rng.next().is_multiple_of(10) {
                (whole, 4)
            } else {
                (quarter, 1)
            };
            match allocate(&held, claim) {
                Ok(Some(mut results)) => held.push((results.remove(0), quarters)),
                Ok(None) if quarters == 4 => whole_refused += 1,
                Ok(None) => quarter_refused += 1,
                Err(e) => panic!("allocation failed: {e}"),
            }
        } else {
            let i = (rng.next() % held.len() as u64) as usize;
            held.swap_remove(i);
        }
    }
    // Whole GPUs still free: ask for them one by one.
    let mut free = 0;
    while let Ok(Some(mut results)) = allocate(&held, whole) {
        held.push((results.remove(0), 4));
        free += 1;
    }
    (free, whole_refused, quarter_refused)
}

fn main() {
    let gpus = env("PARTITIONS_GPUS", 8);
    let steps = env("PARTITIONS_STEPS", 2000);
    let seeds = env("PARTITIONS_SEEDS", 10);
    println!(
        "partitions: 1 node, {gpus} GPUs x (1 whole | 4 quarters), {steps} steps of churn at ~60 % \
         (1 job in 10 wants a whole GPU), {seeds} seeds"
    );
    for (by_profile, pack) in [(false, false), (false, true), (true, false), (true, true)] {
        let text = scenario(gpus, by_profile);
        let (mut free, mut whole_refused, mut quarter_refused) = (0, 0, 0);
        for seed in 0..seeds as u64 {
            let (f, w, q) = churn(&text, gpus, steps, 0x9e37_79b9_7f4a_7c15 ^ (seed + 1), pack);
            free += f;
            whole_refused += w;
            quarter_refused += q;
        }
        let n = seeds as f64;
        println!(
            "  {:<22} {:<29} whole GPUs free at the end {:>5.2} of {gpus}; whole-GPU jobs refused {:>6.1}, quarter jobs refused {:>6.1} (mean per seed)",
            if by_profile {
                "listed by profile,"
            } else {
                "listed per GPU,"
            },
            if pack {
                "packPartitions: true"
            } else {
                "upstream order (slice order)"
            },
            free as f64 / n,
            whole_refused as f64 / n,
            quarter_refused as f64 / n,
        );
    }
}
