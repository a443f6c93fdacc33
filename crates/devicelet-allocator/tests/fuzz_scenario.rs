//! Short, fixed-size fuzzing of the scenario reader and runner: arbitrary bytes and mutated
//! corpus files must give a clear error or an outcome, never a panic or a hang.
//!
//! Case counts scale with `DEVICELET_SCENARIO_FUZZ_CASES` (default 128 per property);
//! `DEVICELET_FUZZ_SECONDS=N` adds a fixed-time pass of N seconds per property (CI runs one);
//! `fuzz/` has the coverage-guided cargo-fuzz targets.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use devicelet_allocator::scenario::{parse_scenario, run_scenario};
use proptest::prelude::*;
use timed_fuzz::fuzz_for;

#[path = "../../../testsupport/timed_fuzz.rs"]
mod timed_fuzz;

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

const MUTATED_FILES: [&str; 4] = [
    "161-allow-multiple-allocations-with-partitionable-device.json",
    "072-prioritized-list-subrequests-with-constraints-ref-parent-request.json",
    "093-partitionable-devices-per-device-node-selection-node-selector.json",
    "145-consumable-capacity-multi-allocatable-device-with-allocated-capacity-use-remaining.json",
];

type Edits = Vec<(prop::sample::Index, u8)>;

fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..512)
}

/// A corpus file and up to three bytes overwritten with characters that matter to JSON and
/// quantities.
fn mutated_corpus() -> impl Strategy<Value = (&'static str, Edits)> {
    let bytes = prop::sample::select(b"0123456789-.:{}[]\",ab xGiKmn".to_vec());
    (
        prop::sample::select(MUTATED_FILES.to_vec()),
        prop::collection::vec((any::<prop::sample::Index>(), bytes), 1..4),
    )
}

fn bytes_never_panic(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let _ = parse_scenario(&bytes);
    Ok(())
}

fn mutated_scenario_parses_or_fails_cleanly_and_runs_bounded(
    (file, edits): (&'static str, Edits),
) -> Result<(), TestCaseError> {
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
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in arbitrary_bytes()) {
        bytes_never_panic(bytes)?;
    }

    #[test]
    fn mutated_corpus_scenarios_parse_or_fail_cleanly_and_run_bounded(input in mutated_corpus()) {
        mutated_scenario_parses_or_fails_cleanly_and_runs_bounded(input)?;
    }
}

// The fixed-time pass CI runs (`DEVICELET_FUZZ_SECONDS`); without it these return at once.
#[test]
fn fuzz_for_a_fixed_time_arbitrary_bytes() {
    fuzz_for("scenario bytes", arbitrary_bytes(), bytes_never_panic);
}

#[test]
fn fuzz_for_a_fixed_time_mutated_corpus() {
    fuzz_for(
        "mutated corpus scenarios",
        mutated_corpus(),
        mutated_scenario_parses_or_fails_cleanly_and_runs_bounded,
    );
}
