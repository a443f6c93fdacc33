//! Public entry points: [`SelectorCompiler`] (compile with cache) and [`CompiledSelector`]
//! (evaluate against a device).
//!
//! Follows `DRA/cel/compile.go` (`GetCompiler`, `CompileCELExpression`, `DeviceMatches`)
//! and `DRA/cel/cache.go`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_cel::cel::{ExecutionError, Value};

use crate::cache::LruCache;
use crate::compile::{self, BIG_STACK_SIZE, Compiled, INLINE_EVAL_DEPTH, panic_message};
use crate::cost::{BUDGET_EXHAUSTED_MARKER, BudgetScope, EVALUATION_DEADLINE, Exhaustion};
use crate::device::{DeviceResolver, DeviceView, validate_attributes};
use crate::env::Env;
use crate::error::{CelCompileError, CelEvalError};
use crate::fastpath::{Fast, Outcome};
use crate::program::Program;

/// Default number of compiled selectors kept per compiler.
pub const DEFAULT_CACHE_CAPACITY: usize = 1024;

/// The CEL feature set of a compiler (Go's `cel.Features` plus the cost limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CelOptions {
    /// Declares `device.allowMultipleAllocations` (DRAConsumableCapacity).
    pub enable_consumable_capacity: bool,
    /// Accepts list-valued attributes and declares `includes()` (DRAListTypeAttributes).
    pub enable_list_type_attributes: bool,
    /// Runtime cost limit of one evaluation, in cost units (see `cost.rs` for the model).
    pub cost_limit: u64,
}

impl Default for CelOptions {
    fn default() -> Self {
        CelOptions {
            enable_consumable_capacity: false,
            enable_list_type_attributes: false,
            cost_limit: crate::CEL_SELECTOR_EXPRESSION_MAX_COST,
        }
    }
}

/// Compiles selectors for one feature set and caches the results. `Send + Sync`: share
/// one per feature set (like Go's `GetCompiler`).
pub struct SelectorCompiler {
    options: CelOptions,
    env: Arc<Env>,
    deadline: Duration,
    cache: Mutex<LruCache<CompiledSelector>>,
}

impl std::fmt::Debug for SelectorCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectorCompiler")
            .field("options", &self.options)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl SelectorCompiler {
    /// A compiler with the default cache size and evaluation deadline.
    pub fn new(options: CelOptions) -> Self {
        Self::with_cache_capacity(options, DEFAULT_CACHE_CAPACITY)
    }

    /// A compiler that keeps at most `capacity` compiled selectors.
    pub fn with_cache_capacity(options: CelOptions, capacity: usize) -> Self {
        SelectorCompiler {
            options,
            env: Env::new(options.enable_list_type_attributes),
            deadline: EVALUATION_DEADLINE,
            cache: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// Sets the wall-clock deadline of one evaluation (default [`EVALUATION_DEADLINE`]).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The options this compiler was built with.
    pub fn options(&self) -> CelOptions {
        self.options
    }

    /// Number of compiled selectors currently cached.
    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Compiles `expression`, or returns the cached result of an earlier successful
    /// compilation. Errors are not cached.
    pub fn compile(&self, expression: &str) -> Result<Arc<CompiledSelector>, CelCompileError> {
        if let Ok(mut cache) = self.cache.lock()
            && let Some(hit) = cache.get(expression)
        {
            return Ok(hit);
        }
        let Compiled { program, fast } = compile::compile(
            expression,
            &self.env,
            self.options.enable_consumable_capacity,
        )?;
        let compiled = Arc::new(CompiledSelector {
            expression: expression.to_string(),
            program,
            fast,
            env: self.env.clone(),
            options: self.options,
            deadline: self.deadline,
        });
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(expression.to_string(), compiled.clone());
        }
        Ok(compiled)
    }
}

/// A compiled selector. Cheap to share (`Arc`), `Send + Sync`.
pub struct CompiledSelector {
    expression: String,
    program: Program,
    /// The native evaluator for the common selector shapes, if the whole expression has
    /// one of them.
    fast: Option<Fast>,
    env: Arc<Env>,
    options: CelOptions,
    deadline: Duration,
}

impl std::fmt::Debug for CompiledSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledSelector")
            .field("expression", &self.expression)
            .finish_non_exhaustive()
    }
}

impl CompiledSelector {
    /// The source text.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Whether the selector has a native evaluator for its shape (`fastpath.rs`).
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Evaluates with the CEL interpreter only, bypassing the native fast path (used to
    /// check that both agree).
    pub fn matches_interpreted(&self, device: &DeviceView<'_>) -> Result<bool, CelEvalError> {
        validate_attributes(device, &self.env, self.options.enable_list_type_attributes)?;
        self.interpret(device)
    }

    /// Evaluates the selector for `device`. Errors are fatal in Kubernetes' allocator.
    ///
    /// Common selector shapes are answered natively (`fastpath.rs`); everything else, and
    /// every case the native code cannot decide, runs in the CEL interpreter.
    pub fn matches(&self, device: &DeviceView<'_>) -> Result<bool, CelEvalError> {
        validate_attributes(device, &self.env, self.options.enable_list_type_attributes)?;
        if let Some(fast) = &self.fast {
            match fast.eval(device) {
                Outcome::Bool(b) => return Ok(b),
                Outcome::Error(text) => return Err(CelEvalError::Runtime(text)),
                Outcome::Fallback => {}
            }
        }
        self.interpret(device)
    }

    fn interpret(&self, device: &DeviceView<'_>) -> Result<bool, CelEvalError> {
        if self.program.depth > INLINE_EVAL_DEPTH {
            return std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .name("devicelet-cel-eval".into())
                    .stack_size(BIG_STACK_SIZE)
                    .spawn_scoped(scope, || self.evaluate(device))
                    .map_err(|e| {
                        CelEvalError::Internal(format!("cannot start evaluation thread: {e}"))
                    })?
                    .join()
                    .map_err(|panic| CelEvalError::Internal(panic_message(&panic)))?
            });
        }
        self.evaluate(device)
    }

    fn evaluate(&self, device: &DeviceView<'_>) -> Result<bool, CelEvalError> {
        let resolver = DeviceResolver {
            device,
            program: &self.program,
            env: &self.env,
            list_types: self.options.enable_list_type_attributes,
            consumable_capacity: self.options.enable_consumable_capacity,
        };
        let budget = BudgetScope::enter(self.options.cost_limit, self.deadline);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut ctx = self.env.ctx.new_inner_scope();
            ctx.set_variable_resolver(&resolver);
            Value::resolve(&self.program.expr, &ctx)
        }));
        match budget.exhaustion() {
            Exhaustion::Cost => return Err(CelEvalError::CostLimitExceeded),
            Exhaustion::Deadline => return Err(CelEvalError::Deadline(self.deadline)),
            Exhaustion::None => {}
        }
        drop(budget);
        match outcome {
            Err(panic) => Err(CelEvalError::Internal(panic_message(&panic))),
            Ok(Err(e)) => Err(self.runtime_error(e)),
            Ok(Ok(Value::Bool(b))) => Ok(b),
            Ok(Ok(other)) => Err(CelEvalError::NotBool(cel_type_name(&other))),
        }
    }

    /// Maps the `cel` crate's errors to cel-go's wording.
    fn runtime_error(&self, e: ExecutionError) -> CelEvalError {
        let text = match &e {
            ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
            ExecutionError::UndeclaredReference(name) => match self.program.slot_id_for(name) {
                Some(id) => format!("no such key: {id}"),
                None => format!("no such attribute: {name}"),
            },
            ExecutionError::NoSuchOverload
            | ExecutionError::ValuesNotComparable(..)
            | ExecutionError::UnsupportedBinaryOperator(..)
            | ExecutionError::UnsupportedUnaryOperator(..)
            | ExecutionError::UnsupportedTargetType { .. }
            | ExecutionError::NotSupportedAsMethod { .. }
            | ExecutionError::UnsupportedMapIndex(_)
            | ExecutionError::UnsupportedListIndex(_)
            | ExecutionError::UnsupportedIndex(..) => "no such overload".to_string(),
            ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
            ExecutionError::RemainderByZero(_) => "modulus by zero".to_string(),
            ExecutionError::Overflow(..) => "integer overflow".to_string(),
            ExecutionError::IndexOutOfBounds(i) => format!("index out of range: {i:?}"),
            ExecutionError::FunctionError { message, .. } if message == BUDGET_EXHAUSTED_MARKER => {
                return CelEvalError::CostLimitExceeded;
            }
            ExecutionError::FunctionError { function, message } if function.starts_with('@') => {
                message.clone()
            }
            ExecutionError::FunctionError { function, message } => format!("{function}: {message}"),
            other => other.to_string(),
        };
        CelEvalError::Runtime(text)
    }
}

/// cel-go's type name of a value, for "CEL result of type T ...".
fn cel_type_name(v: &Value) -> String {
    match v {
        Value::List(_) => "list".into(),
        Value::Map(_) => "map".into(),
        Value::Function(..) => "function".into(),
        Value::Int(_) => "int".into(),
        Value::UInt(_) => "uint".into(),
        Value::Float(_) => "double".into(),
        Value::String(_) => "string".into(),
        Value::Bytes(_) => "bytes".into(),
        Value::Bool(_) => "bool".into(),
        Value::Duration(_) => "google.protobuf.Duration".into(),
        Value::Timestamp(_) => "google.protobuf.Timestamp".into(),
        Value::Opaque(o) => o.runtime_type_name().to_string(),
        Value::Null => "null_type".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn compiler_and_selector_are_send_and_sync() {
        assert_send_sync::<SelectorCompiler>();
        assert_send_sync::<CompiledSelector>();
        assert_send_sync::<CelCompileError>();
        assert_send_sync::<CelEvalError>();
    }
}
