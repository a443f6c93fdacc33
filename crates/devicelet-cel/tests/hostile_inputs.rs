//! Hostile selectors: each must end with a clear error within a bounded time, never hang,
//! never overflow the stack, never exhaust memory. The bounds asserted here are generous
//! because tests run unoptimised on a shared machine; the release figures are in the
//! crate's report (`cost.rs` documents the model).

mod common;

use std::time::{Duration, Instant};

use common::TestDevice;
use devicelet_cel::{CelCompileError, CelEvalError, CelOptions, SelectorCompiler};

/// Upper bound for compiling any hostile expression (unoptimised build).
const COMPILE_BOUND: Duration = Duration::from_secs(10);
/// Upper bound for evaluating any hostile expression: the evaluation deadline plus slack.
const EVAL_BOUND: Duration = Duration::from_secs(4);

fn compiler() -> SelectorCompiler {
    SelectorCompiler::new(CelOptions::default())
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

fn assert_compile_rejected(expr: &str, what: &str) -> CelCompileError {
    let (result, took) = timed(|| compiler().compile(expr));
    assert!(took < COMPILE_BOUND, "{what}: compile took {took:?}");
    match result {
        Ok(_) => panic!("{what}: compiled, expected a compile error"),
        Err(e) => e,
    }
}

/// Evaluates on a thread with a 2 MiB stack (tokio's default for worker threads) so that
/// a stack overflow would show up as a failure instead of passing on a big test stack.
fn assert_eval_stopped(expr: &str, what: &str) -> CelEvalError {
    let expr = expr.to_string();
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            let selector = compiler().compile(&expr).map_err(|e| e.to_string())?;
            let device = TestDevice::new("dra.example.com");
            let (result, took) = timed(|| selector.matches(&device.view()));
            Ok::<_, String>((result, took))
        })
        .expect("spawn evaluation thread");
    let (result, took) = handle
        .join()
        .expect("evaluation thread panicked")
        .unwrap_or_else(|e| panic!("{what}: compile error {e}"));
    eprintln!("{what}: stopped after {took:?}");
    assert!(took < EVAL_BOUND, "{what}: evaluation took {took:?}");
    match result {
        Ok(v) => panic!("{what}: evaluated to {v}, expected the cost guard to stop it"),
        Err(e) => {
            assert!(
                matches!(
                    e,
                    CelEvalError::CostLimitExceeded | CelEvalError::Deadline(_)
                ),
                "{what}: expected cost limit or deadline, got {e}"
            );
            e
        }
    }
}

#[test]
fn hostile_100kb_expression_is_rejected_for_length() {
    let expr = format!("device.driver == \"{}\"", "a".repeat(100 * 1024));
    let e = assert_compile_rejected(&expr, "100 KiB expression");
    assert!(matches!(e, CelCompileError::TooLong { .. }), "{e}");
    assert!(e.to_string().contains("limit is 10240 bytes"), "{e}");
}

#[test]
fn hostile_deeply_nested_parentheses_are_a_compile_error() {
    let depth = 5000;
    let expr = format!("{}true{}", "(".repeat(depth), ")".repeat(depth));
    let e = assert_compile_rejected(&expr, "5000 nested parentheses");
    assert!(
        e.to_string().starts_with(
            "compilation failed: ERROR: <input>:1:1: expression recursion limit exceeded"
        ),
        "{e}"
    );
}

#[test]
fn hostile_long_operator_chains_and_unary_runs_are_a_compile_error() {
    let sum = format!("{} == 1", vec!["1"; 3000].join(" + "));
    let e = assert_compile_rejected(&sum, "3000-term sum");
    assert!(e.to_string().starts_with("compilation failed"), "{e}");
    // A run of negations folds to at most one `!` in the parser: accepted, and quick.
    let (nots, took) = timed(|| compiler().compile(&format!("{}true", "!".repeat(9000))));
    assert!(took < COMPILE_BOUND, "9000 negations took {took:?}");
    let nots = nots.expect("9000 negations compile");
    assert_eq!(nots.matches(&TestDevice::new("d").view()), Ok(true));
    let members = format!("device{} == 1", ".a".repeat(4000));
    let e = assert_compile_rejected(&members, "4000 member selections");
    assert!(e.to_string().starts_with("compilation failed"), "{e}");
}

#[test]
fn hostile_nesting_just_under_the_limit_evaluates_on_a_small_stack() {
    // 40 nested parenthesised additions and 40 nested lists: accepted and evaluated on a
    // 2 MiB stack without overflow.
    let expr = format!("{}1{} == 41", "(1 + ".repeat(40), ")".repeat(40));
    let lists = format!("size({}1{}) == 1", "[".repeat(40), "]".repeat(40));
    for e in [expr, lists] {
        let handle = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || {
                let s = compiler()
                    .compile(&e)
                    .map_err(|err| format!("{e}: {err}"))?;
                s.matches(&TestDevice::new("d").view())
                    .map_err(|err| format!("{e}: {err}"))
            })
            .expect("spawn");
        assert_eq!(handle.join().expect("no stack overflow"), Ok(true));
    }
}

#[test]
fn hostile_nested_comprehensions_hit_the_cost_limit() {
    let ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
    let vars = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut expr = "a + b + c + d + e + f + g + h > 0".to_string();
    for v in vars.iter().rev() {
        expr = format!("{ten}.all({v}, {expr})");
    }
    assert_eval_stopped(&expr, "10^8 nested all()");
    let mut maps = "[x, y, z]".to_string();
    for v in ["z", "y", "x"] {
        maps = format!("lists.range(1000).map({v}, {maps})");
    }
    assert_eval_stopped(&format!("size({maps}) > 0"), "10^9 nested map()");
}

#[test]
fn hostile_exponential_strings_hit_the_cost_limit() {
    // Each bind doubles the string: 2^40 bytes if unchecked.
    let mut expr = "size(s40) > 0".to_string();
    for i in (1..=40).rev() {
        expr = format!("cel.bind(s{i}, s{} + s{}, {expr})", i - 1, i - 1);
    }
    let expr = format!("cel.bind(s0, \"{}\", {expr})", "x".repeat(64));
    assert_eval_stopped(&expr, "doubling strings");
}

#[test]
fn hostile_replace_and_range_amplification_is_refused_before_allocating() {
    let mut expr = "size(r10) > 0".to_string();
    for i in (1..=10).rev() {
        expr = format!(
            "cel.bind(r{i}, r{}.replace(\"\", r{}), {expr})",
            i - 1,
            i - 1
        );
    }
    let expr = format!("cel.bind(r0, \"{}\", {expr})", "y".repeat(100));
    assert_eval_stopped(&expr, "replace amplification");
    assert_eval_stopped(
        "size(lists.range(9223372036854775807)) > 0",
        "lists.range(i64::MAX)",
    );
}

#[test]
fn hostile_shared_sublists_are_counted_as_trees() {
    // Each level holds ten references to the previous one: 10^9 elements when flattened
    // or compared, although only a few hundred values exist.
    let mut expr = "l9.flatten().size() > 0 && l9 == l9".to_string();
    for i in (1..=9).rev() {
        let refs = vec![format!("l{}", i - 1); 10].join(", ");
        expr = format!("cel.bind(l{i}, [{refs}], {expr})");
    }
    let expr = format!("cel.bind(l0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], {expr})");
    assert_eval_stopped(&expr, "shared sub-lists");
}

#[test]
fn hostile_expensive_upstream_case_reports_gos_error_text() {
    let expr = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))";
    let compiler =
        SelectorCompiler::new(CelOptions::default()).with_deadline(Duration::from_secs(60));
    let s = compiler.compile(expr).expect("compiles");
    let (result, took) = timed(|| s.matches(&TestDevice::new("d").view()));
    assert_eq!(result, Err(CelEvalError::CostLimitExceeded));
    assert_eq!(
        CelEvalError::CostLimitExceeded.to_string(),
        "operation cancelled: actual cost limit exceeded"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn cost_limit_is_sticky_even_when_an_or_would_absorb_the_error() {
    let ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
    let inner = format!(
        "{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, {ten}.all(e, {ten}.all(f, a > 0))))))"
    );
    let compiler =
        SelectorCompiler::new(CelOptions::default()).with_deadline(Duration::from_secs(60));
    let s = compiler
        .compile(&format!("{inner} || true"))
        .expect("compiles");
    assert_eq!(
        s.matches(&TestDevice::new("d").view()),
        Err(CelEvalError::CostLimitExceeded)
    );
}

#[test]
fn a_small_cost_limit_is_respected_and_a_large_one_allows_the_work() {
    let expr = "lists.range(100).all(x, x >= 0)";
    let tight = SelectorCompiler::new(CelOptions {
        cost_limit: 50,
        ..CelOptions::default()
    });
    let s = tight.compile(expr).expect("compiles");
    assert_eq!(
        s.matches(&TestDevice::new("d").view()),
        Err(CelEvalError::CostLimitExceeded)
    );
    let roomy = compiler();
    let s = roomy.compile(expr).expect("compiles");
    assert_eq!(s.matches(&TestDevice::new("d").view()), Ok(true));
}

#[test]
fn the_wall_clock_deadline_stops_an_evaluation() {
    let compiler = SelectorCompiler::new(CelOptions {
        cost_limit: u64::MAX,
        ..CelOptions::default()
    })
    .with_deadline(Duration::from_millis(50));
    let s = compiler
        .compile("lists.range(100000).all(x, lists.range(100).all(y, x + y >= 0))")
        .expect("compiles");
    let (result, took) = timed(|| s.matches(&TestDevice::new("d").view()));
    assert_eq!(
        result,
        Err(CelEvalError::Deadline(Duration::from_millis(50)))
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[test]
fn hostile_literals_repeating_a_large_value_stop_early() {
    // l holds 90 000 elements (under the per-value cap); a literal repeating it 2 000 times
    // would deep-copy 1.8e8 elements if the elements were not metered one by one.
    let refs = vec!["l"; 2000].join(", ");
    let expr = format!("cel.bind(l, lists.range(90000), size([{refs}]) > 0)");
    assert_eval_stopped(&expr, "literal repeating a large list");
    let map_refs = (0..1000)
        .map(|i| format!("{i}: l"))
        .collect::<Vec<_>>()
        .join(", ");
    let expr = format!("cel.bind(l, lists.range(90000), size({{{map_refs}}}) > 0)");
    assert_eval_stopped(&expr, "map literal repeating a large list");
}

#[test]
fn hostile_values_above_the_size_cap_are_refused() {
    assert_eval_stopped("size(lists.range(200000)) > 0", "200 000-element list");
    assert_eval_stopped(
        "cel.bind(l, lists.range(60000), size(l + l) > 0)",
        "120 000-element concatenation",
    );
}

#[test]
fn hostile_large_values_touched_in_every_iteration_hit_the_deadline_or_budget() {
    assert_eval_stopped(
        "cel.bind(l, lists.range(90000), lists.range(90000).all(x, size(l) > 0))",
        "large value copied per iteration",
    );
    // map() grows its result with `+` every iteration: quadratic work, charged as such.
    assert_eval_stopped("lists.range(20000).map(x, x).size() > 0", "long map()");
}

#[test]
fn ordinary_list_work_fits_the_budget() {
    let c = compiler();
    let d = TestDevice::new("d");
    for expr in [
        "lists.range(500).map(x, x * 2).size() == 500",
        "lists.range(1000).filter(x, x % 2 == 0).size() == 500",
        "lists.range(64).all(x, lists.range(64).exists(y, y == x))",
        r#"["a", "b", "c"].map(s, s + s).join("") == "aabbcc""#,
    ] {
        assert_eq!(
            c.compile(expr).expect(expr).matches(&d.view()),
            Ok(true),
            "{expr}"
        );
    }
}
