//! Runs every case of the shared conformance corpus (`shared/conformance/allocator/cases`,
//! the upstream allocator unit-test table exported as scenario files) and compares the outcome
//! with the corpus README's rules. New case files are picked up automatically.

use std::path::PathBuf;

use devicelet_allocator::scenario::{compare_outcome, parse_scenario, run_scenario};

fn cases_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/conformance/allocator/cases"
    ))
}

#[test]
fn conformance_corpus_matches_go_incubating_allocator() {
    let dir = cases_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => panic!(
            "conformance corpus not found at {} ({e}); expected the shared/ folder beside the repository",
            dir.display()
        ),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "json" || x == "yaml" || x == "yml")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no case files in {}", dir.display());
    let mut passed = 0;
    let mut failed = Vec::new();
    let mut warnings = 0;
    for file in &files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let bytes = std::fs::read(file).unwrap();
        let scenario = match parse_scenario(&bytes) {
            Ok(s) => s,
            Err(e) => {
                failed.push(format!("{name}: cannot parse: {e}"));
                continue;
            }
        };
        let Some(expect) = scenario.expect.clone() else {
            failed.push(format!("{name}: no expect field"));
            continue;
        };
        let outcome = run_scenario(&scenario);
        let cmp = compare_outcome(&expect, &outcome);
        warnings += cmp.warnings.len();
        for w in &cmp.warnings {
            eprintln!("warning: {name}: {w}");
        }
        if cmp.passed() {
            passed += 1;
        } else {
            failed.push(format!("{name}:\n    {}", cmp.mismatches.join("\n    ")));
        }
    }
    println!("conformance warnings (informational): {warnings}");
    println!("conformance: {passed} passed, {} failed", failed.len());
    if !failed.is_empty() {
        panic!(
            "{} conformance case(s) failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
}
