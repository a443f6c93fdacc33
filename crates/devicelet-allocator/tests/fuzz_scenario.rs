//! Short, fixed-size fuzzing of the scenario reader and runner: arbitrary bytes and mutated
//! corpus files must give a clear error or an outcome, never a panic or a hang.
//!
//! Case counts scale with `DEVICELET_SCENARIO_FUZZ_CASES` (default 128 per property); CI runs a
//! longer pass (see `.ci/run`), `fuzz/` has the coverage-guided cargo-fuzz targets.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use devicelet_allocator::scenario::{parse_scenario, run_scenario};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("DEVICELET_SCENARIO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

fn corpus_file(name: &str) -> Vec<u8> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/conformance/allocator/cases"
    ))
    .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("missing corpus file {}: {e}", p.display()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_scenario(&bytes);
    }

    #[test]
    fn mutated_corpus_scenarios_parse_or_fail_cleanly_and_run_bounded(
        file in prop::sample::select(vec![
            "161-allow-multiple-allocations-with-partitionable-device.json",
            "072-prioritized-list-subrequests-with-constraints-ref-parent-request.json",
            "093-partitionable-devices-per-device-node-selection-node-selector.json",
            "145-consumable-capacity-multi-allocatable-device-with-allocated-capacity-use-remaining.json",
        ]),
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(b"0123456789-.:{}[]\",ab xGiKmn".to_vec())), 1..4),
    ) {
        let mut bytes = corpus_file(file);
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if let Ok(mut s) = parse_scenario(&bytes) {
            s.step_budget = Some(100_000);
            let start = Instant::now();
            let o = run_scenario(&s);
            prop_assert_eq!(o.per_node.len(), s.nodes.len());
            prop_assert!(start.elapsed() < Duration::from_secs(10));
        }
    }
}
