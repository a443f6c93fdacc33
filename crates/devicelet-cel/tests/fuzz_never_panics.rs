//! Property tests ("fuzzing"): random expression strings never panic the compiler or the
//! evaluator, and always finish within the time bound. Panics inside the third-party
//! `cel` crate are caught at our boundary and reported as `Internal` errors; this test
//! counts them (they are not failures, escaping panics are).
//!
//! Case counts scale with `DEVICELET_CEL_FUZZ_CASES` (default 400 per property), so CI can
//! run a short fixed-time pass and a developer a long one.

mod common;

use std::time::{Duration, Instant};

use common::*;
use devicelet_cel::{CelCompileError, CelEvalError, CelOptions, SelectorCompiler};
use proptest::prelude::*;

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

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn fuzz_arbitrary_strings_never_panic(expr in "\\PC{0,120}") {
        let compiler = SelectorCompiler::with_cache_capacity(CelOptions::default(), 4);
        let mut internal = 0;
        check(&compiler, &expr, &mut internal);
    }

    #[test]
    fn fuzz_token_soup_never_panics(tokens in proptest::collection::vec(proptest::sample::select(TOKENS), 1..40)) {
        let compiler = SelectorCompiler::with_cache_capacity(
            CelOptions { enable_consumable_capacity: true, enable_list_type_attributes: true, ..CelOptions::default() },
            4,
        );
        let expr = tokens.concat();
        let spaced = tokens.join(" ");
        let mut internal = 0;
        check(&compiler, &expr, &mut internal);
        check(&compiler, &spaced, &mut internal);
    }
}
