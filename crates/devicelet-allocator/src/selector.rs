//! CEL device selectors for the allocator: a compile cache keyed by expression text
//! (like `k8s.io/dynamic-resource-allocation/cel/cache.go`) over the `devicelet-cel` engine,
//! and the evaluation of one compiled selector on one device (`DeviceMatches` in
//! `dynamic-resource-allocation/cel/compile.go`).
//!
//! Unlike the scheduler's 10-entry LRU, the cache keeps every expression it has compiled for the
//! lifetime of the [`SelectorCache`]: the set of distinct selector texts in a cluster is small.
//! As in Go, failed compilations are not cached; they are recompiled on each use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use devicelet_cel::{
    CelCompileError, CelEvalError, CelOptions, CompiledSelector, DeviceView, SelectorCompiler,
};
use k8s_openapi::api::resource::v1::Device;

/// Kubernetes' per-evaluation CEL cost limit (`resourceapi.CELSelectorExpressionMaxCost`).
pub const CEL_SELECTOR_MAX_COST: u64 = 1_000_000;

/// CEL environment switches (scenario field `cel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CelFeatures {
    /// Declares `device.allowMultipleAllocations`.
    pub enable_consumable_capacity: bool,
    /// List-typed attributes and `includes()`.
    pub enable_list_type_attributes: bool,
}

/// A shared, thread-safe cache of compiled selectors.
pub struct SelectorCache {
    compiler: SelectorCompiler,
    compiled: Mutex<HashMap<String, Arc<CompiledSelector>>>,
}

impl std::fmt::Debug for SelectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectorCache").finish_non_exhaustive()
    }
}

impl SelectorCache {
    /// A cache for one CEL environment.
    pub fn new(features: CelFeatures) -> Self {
        SelectorCache {
            compiler: SelectorCompiler::new(CelOptions {
                enable_consumable_capacity: features.enable_consumable_capacity,
                enable_list_type_attributes: features.enable_list_type_attributes,
                cost_limit: CEL_SELECTOR_MAX_COST,
            }),
            compiled: Mutex::new(HashMap::new()),
        }
    }

    /// Compiles (or returns the cached) program.
    pub fn get_or_compile(
        &self,
        expression: &str,
    ) -> Result<Arc<CompiledSelector>, CelCompileError> {
        if let Ok(map) = self.compiled.lock()
            && let Some(p) = map.get(expression)
        {
            return Ok(Arc::clone(p));
        }
        let program = self.compiler.compile(expression)?;
        if let Ok(mut map) = self.compiled.lock() {
            map.insert(expression.to_string(), Arc::clone(&program));
        }
        Ok(program)
    }
}

/// Evaluates one selector on one device.
pub fn evaluate(
    program: &CompiledSelector,
    driver: &str,
    device: &Device,
) -> Result<bool, CelEvalError> {
    let view = DeviceView {
        driver,
        attributes: device.attributes.as_ref(),
        capacity: device.capacity.as_ref(),
        allow_multiple_allocations: device.allow_multiple_allocations,
    };
    program.matches(&view)
}
