//! Fuzz target: the `AllocationScenario` reader (spec `structured-allocator.md` §5.1) and, for
//! inputs it accepts, a bounded run of the allocator. Any panic or hang is a finding; the run is
//! bounded by a small step budget and deadline, as `devicelet allocate` bounds hostile input.
#![no_main]

use devicelet_allocator::scenario::{parse_scenario, run_scenario};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut s) = parse_scenario(data) else {
        return;
    };
    s.step_budget = Some(s.step_budget.unwrap_or(10_000).min(10_000));
    s.timeout_seconds = Some(0.5);
    let o = run_scenario(&s);
    assert!(o.per_node.len() <= s.nodes.len());
});
