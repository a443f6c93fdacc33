//! devicelet-cel: a Kubernetes-compatible CEL environment for DRA device selectors.
//!
//! Follows `staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go` and `cache.go`
//! (Kubernetes v1.36, spec `structured-allocator.md` §3): one variable `device` with
//! `driver`, `attributes[domain][id]`, `capacity[domain][id]` and (with consumable
//! capacity) `allowMultipleAllocations`; the Kubernetes extension libraries (through
//! `kube-cel`); `cel.bind`; a bounded compile cache; and a cost guard that keeps a
//! hostile selector from stalling allocation.
//!
//! Parsing and evaluation are done by the `cel` crate (the version `kube-cel` is built
//! against). What the crate lacks is added here, around it: a static check that turns
//! undeclared references and unknown fields into compile errors, an AST rewrite that
//! resolves `device.*` lookups lazily (no per-device maps on the common paths), the
//! "unknown domain is an empty map" rule, `cel.bind`, and the cost accounting.
//!
//! ```
//! use devicelet_cel::{CelOptions, DeviceView, SelectorCompiler};
//! let compiler = SelectorCompiler::new(CelOptions::default());
//! let selector = compiler.compile(r#"device.driver == "gpu.example.com""#).unwrap();
//! let device = DeviceView { driver: "gpu.example.com", attributes: None, capacity: None,
//!                           allow_multiple_allocations: None };
//! assert!(selector.matches(&device).unwrap());
//! ```

mod cache;
mod compile;
mod cost;
mod device;
mod env;
mod error;
mod fastpath;
mod functions;
mod selector;

pub use cost::{
    COMPREHENSION_ITERATION_COST, EVALUATION_DEADLINE, MAX_AST_DEPTH, MAX_EXPRESSION_LENGTH,
    MAX_VALUE_UNITS,
};
pub use device::DeviceView;
pub use error::{CelCompileError, CelEvalError};
pub use selector::{CelOptions, CompiledSelector, SelectorCompiler};

/// Kubernetes' `resourceapi.CELSelectorExpressionMaxCost`: the default runtime cost limit
/// of one selector evaluation.
pub const CEL_SELECTOR_EXPRESSION_MAX_COST: u64 = 1_000_000;

/// Kubernetes' `resourceapi.CELSelectorExpressionMaxLength` (10 Ki bytes).
pub const CEL_SELECTOR_EXPRESSION_MAX_LENGTH: usize = 10 * 1024;

/// Kubernetes' `resourceapi.ResourceSliceMaxAttributeValuesPerDevice`: `includes()` refuses
/// longer lists.
pub const MAX_INCLUDES_LIST_LENGTH: usize = 48;
