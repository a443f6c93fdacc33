//! Error types of the selector compiler and evaluator.
//!
//! The wording follows `DRA/cel/compile.go` and cel-go where the conformance corpus or the
//! upstream tests look at the text: "compilation failed: ERROR: <input>:L:C: ...",
//! "must evaluate to bool or the unknown type, not T", "no such key: x",
//! "CEL result of type T could not be converted to bool", "attribute X: ...",
//! "operation cancelled: actual cost limit exceeded". The allocator adds its own prefix
//! (`class NAME: selector #i: CEL compile error: ...`), as Go does.

use std::time::Duration;

/// A selector that cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelCompileError {
    /// Syntax errors, undeclared references, unknown fields: cel-go's "compilation failed"
    /// class. The text after the prefix is a cel-go style issue list.
    #[error("compilation failed: {0}")]
    Compilation(String),
    /// cel-go type-checks the expression but fails to plan it: a conversion of a constant
    /// that cannot succeed (`int("x")`, `bool(dyn(1))`), a constant null / list / map
    /// index key, an invalid constant regular expression.
    #[error("program instantiation failed: {0}")]
    ProgramInstantiation(String),
    /// The expression is statically known not to produce a bool.
    #[error("must evaluate to bool or the unknown type, not {0}")]
    ResultType(String),
    /// The expression is longer than Kubernetes allows for a selector.
    #[error("compilation failed: expression is {length} bytes long, the limit is {limit} bytes")]
    TooLong {
        /// Length of the rejected expression in bytes.
        length: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The expression nests deeper than the evaluator's safe recursion depth.
    #[error("compilation failed: expression nesting depth exceeds the limit of {limit}")]
    TooDeep {
        /// The depth limit.
        limit: usize,
    },
    /// The third-party CEL parser panicked on this input (reported, never propagated).
    #[error("compilation failed: internal error in the CEL parser: {0}")]
    Internal(String),
}

/// A selector evaluation that failed. In Kubernetes every such error is fatal for the
/// scheduling attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelEvalError {
    /// A CEL runtime error, in cel-go's wording where we know it ("no such key: x",
    /// "no such overload", "division by zero", ...).
    #[error("{0}")]
    Runtime(String),
    /// An attribute of the device cannot be converted (Go converts every attribute
    /// before evaluating, so this fails any selector on that device).
    #[error("attribute {name}: {reason}")]
    Attribute {
        /// The attribute's (possibly qualified) name as given in the slice.
        name: String,
        /// Why it could not be converted.
        reason: String,
    },
    /// The result was not a bool.
    #[error("CEL result of type {0} could not be converted to bool")]
    NotBool(String),
    /// The runtime cost budget was exhausted.
    #[error("operation cancelled: actual cost limit exceeded")]
    CostLimitExceeded,
    /// The wall-clock deadline of one evaluation expired.
    #[error("operation interrupted: evaluation took longer than {0:?}")]
    Deadline(Duration),
    /// The third-party CEL interpreter panicked (reported, never propagated).
    #[error("internal error in the CEL interpreter: {0}")]
    Internal(String),
}
