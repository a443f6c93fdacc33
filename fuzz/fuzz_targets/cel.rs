//! Fuzz target: the CEL selector layer (spec `structured-allocator.md` §3) as the allocator
//! uses it: compile an arbitrary expression in Kubernetes' DRA environment and evaluate it on a
//! scheduler_perf device. Errors are fine; a panic, or an evaluation the cost limit does not
//! stop, is a finding.
#![no_main]

use std::sync::OnceLock;

use devicelet_allocator::selector::{CelFeatures, SelectorCache, evaluate};
use devicelet_allocator::workloads::{DRIVER, perf_device};
use k8s_openapi::api::resource::v1::Device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    let Ok(expr) = std::str::from_utf8(data) else {
        return;
    };
    let device = DEVICE.get_or_init(|| perf_device(3));
    let cache = SelectorCache::new(CelFeatures {
        enable_consumable_capacity: true,
        enable_list_type_attributes: true,
    });
    if let Ok(program) = cache.get_or_compile(expr) {
        let _ = evaluate(&program, DRIVER, device);
    }
});

