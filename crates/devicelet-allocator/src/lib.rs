//! devicelet-allocator: the DRA structured-parameters allocator of Kubernetes 1.36
//! (`k8s.io/dynamic-resource-allocation/structured`, variant "incubating"), pure and synchronous.
//!
//! * [`Allocator`]: the allocator proper (spec `structured-allocator.md` §2), over
//!   `resource.k8s.io/v1` types from k8s-openapi.
//! * [`scenario`]: the `AllocationScenario` / `AllocationOutcome` harness format (spec §5), the
//!   corpus comparison rules and a table renderer for the CLI.
//! * [`explain`]: why no device fits, per request and node.
//! * [`quantity`]: exact Kubernetes quantity arithmetic.
//! * [`omitempty`]: Go's `omitempty` for the objects devicelet writes (no `""` or `[]` where
//!   the API server prints nothing).
//! * `workloads` (feature `test-utils`, for benches and tests): generators of the
//!   scheduler_perf-shaped benchmark workloads (spec §4.4-§4.5).

pub mod allocator;
pub mod explain;
mod fasthash;
pub mod nodesel;
pub mod omitempty;
/// Exact quantities live in their own crate (shared with the CPU manager).
pub use devicelet_quantity as quantity;
pub mod scenario;
pub mod selector;
pub mod types;
#[cfg(any(test, feature = "test-utils"))]
pub mod workloads;

pub use allocator::{
    ALLOCATION_RESULTS_MAX_SIZE, AllocatedIndex, Allocator, ClassTotals, ClusterSnapshot,
    NUMA_NODE_ATTRIBUTE, Stats, numa_mask,
};
pub use quantity::{Quantity, QuantityError, QuantityFormat};
pub use selector::{CelFeatures, SelectorCache};
pub use types::{
    AllocError, AllocateOptions, AllocatedState, Clock, DEFAULT_STEP_BUDGET, DeviceId, ErrorClass,
    Features, MonotonicClock, RandomShareIds, SCHEDULER_FILTER_TIMEOUT, SeededShareIds, Semantics,
    ShareIdSource, TIME_CHECK_INTERVAL, TimeLimit,
};
