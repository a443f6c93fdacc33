//! Property tests ("fuzzing"): random expression strings never panic the compiler or the
//! evaluator, and always finish within the time bound. Panics inside the third-party
//! `cel` crate are caught at our boundary and reported as `Internal` errors; this test
//! counts them (they are not failures, escaping panics are).
//!
//! Case counts scale with `DEVICELET_CEL_FUZZ_CASES` (default 400 per property);
//! `DEVICELET_FUZZ_SECONDS=N` adds a fixed-time pass of N seconds per property (CI runs one).

mod common;
#[path = "../../../testsupport/timed_fuzz.rs"]
mod timed_fuzz;

use std::time::{Duration, Instant};

use common::*;
use devicelet_cel::{CelCompileError, CelEvalError, CelOptions, SelectorCompiler};
use proptest::prelude::*;
use timed_fuzz::fuzz_for;

fn cases() -> u32 {
    std::env::var("DEVICELET_CEL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// Tokens that make random strings look like selectors often enough to reach the
/// checker, the rewrite and the evaluator, not just the lexer.
const TOKENS: &[&str] = &[
    "device",
    ".",
    "driver",
    "attributes",
    "capacity",
    "allowMultipleAllocations",
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    "?",
    "\"dra.example.com\"",
    "\"model\"",
    "'x'",
    "model",
    "memory",
    "cores",
    "v",
    "1",
    "0",
    "-1",
    "2.5",
    "1u",
    "true",
    "false",
    "null",
    "b'ab'",
    "r'\\d'",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "&&",
    "||",
    "!",
    "-",
    "+",
    "*",
    "/",
    "%",
    "in",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "x",
    "y",
    "cel",
    "bind",
    "quantity",
    "semver",
    "compareTo",
    "isGreaterThan",
    "size",
    "matches",
    "find",
    "split",
    "join",
    "replace",
    "lists",
    "range",
    "sets",
    "contains",
    "optional",
    "of",
    "none",
    "orValue",
    ".?",
    "[?",
    "includes",
    "format",
    "ip",
    "cidr",
    "url",
    "int",
    "string",
    "\"10Gi\"",
    "\"1.2.3\"",
    "Foo",
    " ",
    "\n",
];

fn device() -> TestDevice {
    TestDevice::new("dra.example.com")
        .attr("model", string("a100"))
        .attr("cores", int(8))
        .attr("v", version("1.2.3"))
        .attr("other.example.com/flag", boolean(true))
        .cap("memory", "80Gi")
}

fn check(compiler: &SelectorCompiler, expr: &str, internal: &mut usize) {
    let start = Instant::now();
    match compiler.compile(expr) {
        Ok(selector) => {
            let d = device();
            if let Err(CelEvalError::Internal(_)) = selector.matches(&d.view()) {
                *internal += 1;
            }
        }
        Err(CelCompileError::Internal(_)) => *internal += 1,
        Err(_) => {}
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "{expr:?} took {took:?}");
}

fn arbitrary_strings() -> impl Strategy<Value = String> {
    "\\PC{0,120}"
}

fn token_soup() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::collection::vec(proptest::sample::select(TOKENS), 1..40)
}

fn arbitrary_string_never_panics(expr: String) -> Result<(), TestCaseError> {
    let compiler = SelectorCompiler::with_cache_capacity(CelOptions::default(), 4);
    let mut internal = 0;
    check(&compiler, &expr, &mut internal);
    Ok(())
}

fn token_soup_never_panics(tokens: Vec<&'static str>) -> Result<(), TestCaseError> {
    let compiler = SelectorCompiler::with_cache_capacity(
        CelOptions {
            enable_consumable_capacity: true,
            enable_list_type_attributes: true,
            ..CelOptions::default()
        },
        4,
    );
    let mut internal = 0;
    check(&compiler, &tokens.concat(), &mut internal);
    check(&compiler, &tokens.join(" "), &mut internal);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn fuzz_arbitrary_strings_never_panic(expr in arbitrary_strings()) {
        arbitrary_string_never_panics(expr)?;
    }

    #[test]
    fn fuzz_token_soup_never_panics(tokens in token_soup()) {
        token_soup_never_panics(tokens)?;
    }
}

// The fixed-time pass CI runs (`DEVICELET_FUZZ_SECONDS`); without it these return at once.
#[test]
fn fuzz_for_a_fixed_time_arbitrary_strings() {
    fuzz_for(
        "arbitrary strings",
        arbitrary_strings(),
        arbitrary_string_never_panics,
    );
}

#[test]
fn fuzz_for_a_fixed_time_token_soup() {
    fuzz_for("token soup", token_soup(), token_soup_never_panics);
}
