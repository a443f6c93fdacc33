//! devicelet-cel: a Kubernetes-compatible CEL environment for DRA device selectors.
//!
//! Follows `staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go` and `cache.go`
//! (Kubernetes v1.36, spec `structured-allocator.md` §3): one variable `device` with
//! `driver`, `attributes[domain][id]`, `capacity[domain][id]` and (with consumable
//! capacity) `allowMultipleAllocations`; the Kubernetes extension libraries (through
//! `kube-cel`); `cel.bind`; a bounded compile cache; and a cost guard that keeps a
//! hostile selector from stalling allocation.
//!
//! Parsing and evaluation are done by the `cel` crate, in the version `kube-cel` 0.8 is
//! built against (0.13; kube-cel's API takes a `cel::Context`, so the workspace's cel 0.15
//! cannot be mixed in). What the crates lack is added here, around them: a static check
//! that turns undeclared references and unknown fields into compile errors, a type
//! checker with cel-go's overloads for the DRA environment (`check.rs`), an AST
//! rewrite that resolves `device.*` lookups lazily (no per-device maps on the common
//! paths), the "unknown domain is an empty map" rule, `cel.bind`, cel-go's semantics
//! where the crate differs, a native fast path for the common selector shapes, and the
//! cost accounting.
//!
//! ```
//! use devicelet_cel::{CelOptions, DeviceView, SelectorCompiler};
//! let compiler = SelectorCompiler::new(CelOptions::default());
//! let selector = compiler.compile(r#"device.driver == "gpu.example.com""#).unwrap();
//! let device = DeviceView { driver: "gpu.example.com", attributes: None, capacity: None,
//!                           allow_multiple_allocations: None };
//! assert!(selector.matches(&device).unwrap());
//! ```
//!
//! # Supported
//! * `device.driver`, `device.attributes[D][id]` / `.id` (int, bool, string, version as
//!   `kubernetes.Semver`; with list-type attributes, lists of those and `includes()`),
//!   `device.capacity[D][id]` as `kubernetes.Quantity`, `device.allowMultipleAllocations`
//!   (declared only with consumable capacity); unqualified names in the driver's domain;
//!   unknown domains as empty maps (also for computed keys and `[?D]`); "no such key" for
//!   unknown ids; every attribute checked before evaluation, as Go converts them all.
//! * Standard library and macros (`has`, `all`, `exists`, `exists_one`, `map` with 2 and 3
//!   arguments, `filter`, `size`, `contains`, `startsWith`, `endsWith`, `matches`,
//!   conversions, timestamps, durations), optional types (`?.`, `[?]`, `optional.*`,
//!   `orValue`, `hasValue`, `value`), `cel.bind`.
//! * Kubernetes libraries: quantity, semver (build metadata ignored in comparisons, as
//!   blang/semver does), regex (`find`, `findAll`), lists (`isSorted`, `sum`, `min`, `max`,
//!   `indexOf`, `lastIndexOf`, and cel-go lists `slice`, `flatten`, `distinct`, `range`,
//!   `reverse`, `sort`, `first`, `last`), sets, strings v2 (`charAt`, `format`, `indexOf`,
//!   `join`, `lastIndexOf`, `lowerAscii`, `quote`, `replace`, `split`, `substring`, `trim`,
//!   `upperAscii`), ip / cidr, url, named formats, `jsonpatch.escapeKey`.
//! * cel-go semantics the crate lacks: heterogeneous numeric equality at run time
//!   (`dyn(1) == 1.0`, attribute values; `1 == 1.0` itself is a compile error), ordering across numeric types, n-ary `&&`/`||` reporting the first error,
//!   `x.?f` on a missing key, field selection on a non-map as an error, double negation.
//! * Errors in cel-go / Kubernetes wording (see [`CelCompileError`], [`CelEvalError`]).
//!
//! # Not supported (compile errors, or documented differences)
//! * Two-variable comprehensions (`all(k, v, ...)`, `transformList`, `transformMap`,
//!   `transformMapEntry`) and `sortBy`: the parser of the `cel` crate has no such macros.
//! * `type()` and type identifiers (`int`, `string` as values); message construction.
//! * Complete static type checking: `check.rs` knows the operators, conversions,
//!   string, regex, quantity and semver functions, literals (homogeneous aggregates),
//!   macros and `cel.bind`, and rejects what cel-go rejects there ("found no matching
//!   overload ...", "expected type ...", "must evaluate to bool ..."; parity with Go is
//!   checked by `interop/cel/run.sh`). Other library functions and optionals are
//!   unchecked (typed "unknown", accepted), so a mismatch there is a runtime error.
//!   cel-go's literal validators (duration, timestamp, `matches` patterns) and the
//!   errors of its program planner (constant conversions such as `bool("s")`, constant
//!   null / list / map index keys, invalid constant regexes: "program instantiation
//!   failed: ...") are reproduced too.
//! * Go's cost *estimation* (disabled in the scheduler anyway) and Go's exact cost
//!   figures; our runtime cost model is documented in `cost.rs` and stops the same hostile
//!   expressions with the same error text.
//!
//! # Cost guard and bounds
//! Expressions are limited to [`MAX_EXPRESSION_LENGTH`] bytes and [`MAX_AST_DEPTH`]
//! nesting levels (parsing runs on a large-stack thread; deeper-than-usual expressions are
//! evaluated on one too). At run time, comprehension iterations, value construction and
//! the amplifying functions are charged against `cost_limit` (default 1e6 units, Go's
//! `CELSelectorExpressionMaxCost`), no single value may exceed [`MAX_VALUE_UNITS`], and a
//! wall-clock deadline ([`EVALUATION_DEADLINE`]) is checked every 16 metered steps. In an
//! optimised build the hostile expressions of the test suite are stopped within 3 to
//! 300 ms (compile-time rejections within 30 ms; `benches/selectors.rs` prints the
//! figures), and no evaluation can outlast the deadline by more than 16 metered steps
//! of at most one maximal value copy each.

mod cache;
mod check;
mod compile;
mod cost;
mod device;
mod env;
mod error;
mod fastpath;
mod functions;
mod program;
mod selector;

pub use cost::{
    COMPREHENSION_ITERATION_COST, EVALUATION_DEADLINE, MAX_AST_DEPTH, MAX_EXPRESSION_LENGTH,
    MAX_VALUE_UNITS,
};
pub use device::DeviceView;
pub use error::{CelCompileError, CelEvalError};
pub use selector::{CelOptions, CompiledSelector, DEFAULT_CACHE_CAPACITY, SelectorCompiler};

/// Kubernetes' `resourceapi.CELSelectorExpressionMaxCost`: the default runtime cost limit
/// of one selector evaluation.
pub const CEL_SELECTOR_EXPRESSION_MAX_COST: u64 = 1_000_000;

/// Kubernetes' `resourceapi.CELSelectorExpressionMaxLength` (10 Ki bytes).
pub const CEL_SELECTOR_EXPRESSION_MAX_LENGTH: usize = 10 * 1024;

/// Kubernetes' `resourceapi.ResourceSliceMaxAttributeValuesPerDevice`: `includes()` refuses
/// longer lists.
pub const MAX_INCLUDES_LIST_LENGTH: usize = 48;
