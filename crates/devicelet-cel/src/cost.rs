//! Runtime cost guard for selector evaluation.
//!
//! Kubernetes limits one selector evaluation to `CELSelectorExpressionMaxCost` (1e6) cost
//! units, tracked by cel-go's cost estimator (`DRA/cel/compile.go`, k/k PR #128101). The
//! `cel` crate has no cost accounting, so we meter the places where work can grow beyond
//! the size of the expression itself. Everything else runs at most once per AST node, and
//! the AST is bounded by [`MAX_EXPRESSION_LENGTH`] and [`MAX_AST_DEPTH`].
//!
//! Metered (the compiler rewrites the AST so that these go through our functions):
//! * every comprehension iteration (`all`, `exists`, `exists_one`, `map`, `filter`):
//!   [`COMPREHENSION_ITERATION_COST`] units;
//! * every non-constant element of a list or map literal, the literal itself, and every
//!   comprehension result: its size counted as a tree (shared sub-lists count each time
//!   they appear), one unit per element and one per 16 bytes of string; no single value
//!   may exceed [`MAX_VALUE_UNITS`] (the `cel` crate deep-copies values, so value size is
//!   also copy cost);
//! * `+` on strings and lists: the size of both operands (a `map()` / `filter()` result
//!   grows by `+` each iteration, so long ones are charged their real quadratic cost);
//! * the amplifying functions `replace` and `lists.range`: checked *before* they allocate.
//!
//! Exceeding the budget gives cel-go's error "operation cancelled: actual cost limit
//! exceeded". The budget is sticky: once exceeded, the evaluation fails even if `||`
//! would have absorbed the error. A wall-clock deadline ([`EVALUATION_DEADLINE`]) is
//! checked on every metered step, as a second line of defence.
//!
//! Bound: with the default budget of 1e6 units one evaluation performs at most ~1.4e5
//! comprehension iterations (a minimal loop body weighs 6 units), and no value exceeds
//! [`MAX_VALUE_UNITS`]. Measured in an optimised build on a loaded 2-core machine: 10^8
//! nested `all()` iterations stop after 0.3 s, a 2^40-byte doubling string after 18 ms,
//! 10^9 elements through shared sub-lists after 60 ms (`benches/selectors.rs`).

use std::cell::Cell;
use std::time::{Duration, Instant};

use kube_cel::cel::ExecutionError;

/// Maximum expression length in bytes (Kubernetes' `CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_LENGTH: usize = crate::CEL_SELECTOR_EXPRESSION_MAX_LENGTH;

/// Maximum nesting depth of the parsed expression. Deeper expressions are rejected at
/// compile time, which bounds the native recursion of the tree-walking interpreter.
pub const MAX_AST_DEPTH: usize = 96;

/// Fixed cost units charged per comprehension iteration, on top of the body's node count.
pub const COMPREHENSION_ITERATION_COST: u64 = 1;

/// Wall-clock deadline of one evaluation.
pub const EVALUATION_DEADLINE: Duration = Duration::from_secs(1);

/// How many metered steps pass between two reads of the clock.
const CLOCK_CHECK_INTERVAL: u32 = 16;

/// Largest value (in cost units, counted as a tree) one evaluation may create. The `cel`
/// crate (0.13) deep-copies lists and maps whenever a value crosses a variable or a
/// function call, so the size of a value is also the cost of each such copy; this cap
/// keeps one copy to a few milliseconds, so that the deadline check between metered steps
/// stays effective.
pub const MAX_VALUE_UNITS: u64 = 100_000;

/// Marker message of the error raised inside the interpreter when the budget runs out;
/// the evaluator maps it to [`crate::CelEvalError::CostLimitExceeded`].
pub(crate) const BUDGET_EXHAUSTED_MARKER: &str = "@dra: cost budget exhausted";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exhaustion {
    None,
    Cost,
    Deadline,
}

thread_local! {
    static REMAINING: Cell<u64> = const { Cell::new(u64::MAX) };
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static STEPS: Cell<u32> = const { Cell::new(0) };
    static EXHAUSTED: Cell<Exhaustion> = const { Cell::new(Exhaustion::None) };
}

/// The budget of the evaluation running on this thread. Installed by [`BudgetScope::enter`]
/// and removed when the scope is dropped (also on unwinding).
pub(crate) struct BudgetScope {
    previous_remaining: u64,
    previous_deadline: Option<Instant>,
    previous_exhausted: Exhaustion,
}

impl BudgetScope {
    pub(crate) fn enter(limit: u64, deadline: Duration) -> Self {
        let scope = BudgetScope {
            previous_remaining: REMAINING.with(Cell::get),
            previous_deadline: DEADLINE.with(Cell::get),
            previous_exhausted: EXHAUSTED.with(Cell::get),
        };
        REMAINING.with(|r| r.set(limit));
        DEADLINE.with(|d| d.set(Instant::now().checked_add(deadline)));
        EXHAUSTED.with(|e| e.set(Exhaustion::None));
        STEPS.with(|s| s.set(0));
        scope
    }

    /// What, if anything, ran out during this evaluation.
    pub(crate) fn exhaustion(&self) -> Exhaustion {
        EXHAUSTED.with(Cell::get)
    }
}

impl Drop for BudgetScope {
    fn drop(&mut self) {
        REMAINING.with(|r| r.set(self.previous_remaining));
        DEADLINE.with(|d| d.set(self.previous_deadline));
        EXHAUSTED.with(|e| e.set(self.previous_exhausted));
    }
}

fn exhausted_error() -> ExecutionError {
    ExecutionError::function_error("@dra", BUDGET_EXHAUSTED_MARKER)
}

/// Units still available in the current evaluation.
pub(crate) fn remaining() -> u64 {
    REMAINING.with(Cell::get)
}

/// Charges `units` to the current evaluation; fails once the budget or the deadline is
/// exhausted (and keeps failing: the state is sticky).
pub(crate) fn charge(units: u64) -> Result<(), ExecutionError> {
    if EXHAUSTED.with(Cell::get) != Exhaustion::None {
        return Err(exhausted_error());
    }
    let left = REMAINING.with(Cell::get);
    if units > left {
        REMAINING.with(|r| r.set(0));
        EXHAUSTED.with(|e| e.set(Exhaustion::Cost));
        return Err(exhausted_error());
    }
    REMAINING.with(|r| r.set(left - units));
    let steps = STEPS.with(|s| {
        let n = s.get().wrapping_add(1);
        s.set(n);
        n
    });
    if steps.is_multiple_of(CLOCK_CHECK_INTERVAL)
        && let Some(deadline) = DEADLINE.with(Cell::get)
        && Instant::now() >= deadline
    {
        EXHAUSTED.with(|e| e.set(Exhaustion::Deadline));
        return Err(exhausted_error());
    }
    Ok(())
}

/// Fails (and marks the evaluation) once the wall-clock deadline has passed; for long
/// loops inside one metered step.
pub(crate) fn check_deadline() -> Result<(), ExecutionError> {
    if let Some(deadline) = DEADLINE.with(Cell::get)
        && Instant::now() >= deadline
    {
        EXHAUSTED.with(|e| e.set(Exhaustion::Deadline));
        return Err(exhausted_error());
    }
    Ok(())
}

/// Charges a value of `units` units, refusing values above [`MAX_VALUE_UNITS`].
pub(crate) fn charge_value(units: u64) -> Result<(), ExecutionError> {
    if units > MAX_VALUE_UNITS {
        EXHAUSTED.with(|e| e.set(Exhaustion::Cost));
        return Err(exhausted_error());
    }
    charge(units)
}

/// Cost units for a string of `bytes` bytes.
pub(crate) fn string_units(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(16)
}
