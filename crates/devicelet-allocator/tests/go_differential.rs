//! Regression tests for mismatches found by the Go differential test (`interop/allocator`,
//! `TestDifferential`): each file in `tests/data/go-diff/` is a shrunk generated scenario whose
//! `expect` field is the outcome of the upstream Go allocator (k8s.io/dynamic-resource-allocation
//! v0.36.2, incubating), compared with the corpus rules (outcome, results in order, error prefix
//! up to the CEL-library text).

use std::path::PathBuf;

use devicelet_allocator::scenario::{
    AllocationScenario, compare_outcome, parse_scenario, run_scenario,
};

fn case(name: &str) -> AllocationScenario {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/go-diff"))
        .join(format!("{name}.json"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_scenario(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs the case under its own semantics (Go-compatible) and, when `fixed_too`, also under the
/// fixed semantics, where Go's behaviour is not an upstream bug listed in spec §7.
fn check(name: &str, fixed_too: bool) {
    let scenario = case(name);
    let Some(expect) = scenario.expect.clone() else {
        panic!("{name}: no expect field");
    };
    let cmp = compare_outcome(&expect, &run_scenario(&scenario));
    assert!(
        cmp.passed(),
        "{name} (GoCompat):\n{}",
        cmp.mismatches.join("\n")
    );
    if fixed_too {
        let mut fixed = scenario;
        fixed.semantics.compat = None;
        let cmp = compare_outcome(&expect, &run_scenario(&fixed));
        assert!(
            cmp.passed(),
            "{name} (Fixed):\n{}",
            cmp.mismatches.join("\n")
        );
    }
}

/// Seeds 1623, 101811: an invalid pool is a device-less placeholder in Go, so a device with
/// binding conditions does not move it behind the other pools; All mode reports the first bad
/// pool in (driver, pool) order, checking incomplete then invalid per pool.
#[test]
fn all_mode_reports_invalid_pool_before_later_incomplete_pool() {
    check("all-mode-invalid-pool-before-incomplete-pool", true);
}

/// Seed 37: a selector that does not type-check is a CEL compile error, raised when the search
/// first reaches a device that passed the class selectors.
#[test]
fn cel_type_error_is_a_lazy_compile_error() {
    check("cel-typecheck-string-eq-int", true);
}

/// Seeds 1783, 101370, 200222: distinctAttribute compares versions as exact strings, so
/// `1.2.3` and `1.2.3+build.7` are distinct (also under the fixed semantics).
#[test]
fn distinct_attribute_versions_compare_as_exact_strings() {
    check("distinct-attribute-version-build-metadata", true);
}

/// matchAttribute compares versions as exact strings too: `1.2.3+build.7` does not match
/// `1.2.3`, so the request skips it (spec §7 #28; also under the fixed semantics).
#[test]
fn match_attribute_versions_compare_as_exact_strings() {
    check("match-version-build-metadata", true);
}

/// distinctAttribute checks a candidate against every stored value: a stored value of another
/// type (int 5) does not end the comparison early, so a later equal string still collides.
#[test]
fn distinct_attribute_checks_all_stored_values_across_types() {
    check("distinct-mixed-types", true);
}
