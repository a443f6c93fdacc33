//! The data the stages share: the slices and devices prepared once per allocator, a node's
//! pools (Go: `Pool` in `structured/internal/incubating/pools_incubating.go`), the claim limit
//! and the small helpers of `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`
//! that every stage uses. It names no other file of the allocator, so every stage can use it.

use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceClaim, ResourceSlice};

use crate::nodesel::NodeMatchSpec;
use crate::quantity::Quantity;
use crate::types::{AllocError, ErrorClass};

/// `resourceapi.AllocationResultsMaxSize`.
pub const ALLOCATION_RESULTS_MAX_SIZE: i64 = 32;

pub(super) type Result<T, E = AllocError> = std::result::Result<T, E>;

/// Parsed consumable capacity of one device capacity entry.
#[derive(Clone, Debug)]
pub(crate) struct CapacityData {
    pub value: Quantity,
    pub default: Option<Quantity>,
    pub valid_values: Option<Vec<Quantity>>,
    /// (min, max, step)
    pub range: Option<(Quantity, Option<Quantity>, Option<Quantity>)>,
    pub has_policy: bool,
}

/// One device of one slice, prepared once per allocator.
pub(crate) struct DeviceData<'a> {
    pub raw: &'a Device,
    /// Interned (driver, pool, device).
    pub gid: u32,
    /// Unique per (slice, device index); key of the selector cache.
    pub instance: u32,
    pub node: NodeMatchSpec,
    pub consumes: Vec<(&'a str, Vec<(&'a str, i128)>)>,
    /// `consumes` flattened with interned counter IDs: (ID under Fixed semantics, ID under
    /// GoCompat semantics, amount). See [`CounterIds`].
    pub counter_ids: Vec<(u32, u32, i128)>,
    pub capacity: Vec<(&'a str, CapacityData)>,
    pub allow_multi: bool,
    pub has_binding_conditions: bool,
    pub binds_to_node: bool,
    pub taints: &'a [DeviceTaint],
    /// NUMA nodes from `resource.kubernetes.io/numaNode`, as bits; 0 for none.
    pub numa: u64,
}

/// One slice, prepared once per allocator.
pub(crate) struct SliceData<'a> {
    pub raw: &'a ResourceSlice,
    pub name: &'a str,
    pub driver: &'a str,
    pub pool: &'a str,
    pub generation: i64,
    pub slice_count: i64,
    pub node: NodeMatchSpec,
    pub per_device: Option<bool>,
    pub shared_counters: Vec<(&'a str, Vec<(&'a str, i128)>)>,
    /// Interned IDs of `shared_counters`, same shape: (Fixed ID, GoCompat ID).
    pub shared_counter_ids: Vec<Vec<(u32, u32)>>,
    pub has_shared_counters: bool,
    pub devices: Vec<DeviceData<'a>>,
    /// First device name that occurs twice in this slice.
    pub duplicate_device: Option<String>,
    /// Any device with non-empty binding conditions.
    pub has_binding_conditions: bool,
}

/// A pool as seen from one node (Go: `Pool` after `GatherPools`).
#[derive(Debug)]
pub(crate) struct Pool<'a> {
    pub driver: &'a str,
    pub name: &'a str,
    /// Interned counter-state keys: (driver, pool) and pool name alone (GoCompat, bug #23).
    pub key_fixed: u32,
    pub key_compat: u32,
    pub incomplete: bool,
    pub invalid: bool,
    pub invalid_reason: String,
    /// Visible device slices, sorted by name (indices into `Allocator::slices`).
    pub device_slices: Vec<u32>,
    /// Slices of the same generation that do not target this node (counter accounting only).
    pub not_visible: Vec<u32>,
    /// Counter sets of the visible counter slices: (slice index, set index).
    pub counter_sets: Vec<(u32, u32)>,
    pub binding_last: bool,
}

/// The relevant slices of a node whose relevance depends on the node (see
/// `Allocator::gather_pools`), plus the PartitionableDevices gate.
pub(super) type GatherKey = (bool, Vec<u32>);

pub(super) fn parse_q(s: &str, what: impl Fn() -> String) -> Result<Quantity> {
    Quantity::parse(s)
        .map_err(|e| AllocError::new(ErrorClass::InvalidInput, format!("{}: {e}", what())))
}

/// klog.KObj formatting: "namespace/name" or "name".
pub(crate) fn claim_ref(claim: &ResourceClaim) -> String {
    let name = claim.metadata.name.as_deref().unwrap_or("");
    match claim.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}
