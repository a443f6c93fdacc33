//! The structured allocator (Kubernetes 1.36 "incubating" variant), following
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`
//! with `pools_incubating.go`, `constraint.go` and `consumable_capacity.go` beside it (spec
//! `structured-allocator.md` §2).
//!
//! [`Allocator::new`] prepares the inputs once per pod (slice partition, interning of device IDs,
//! parsed quantities, compiled node selectors). [`Allocator::allocate`] then runs for one node:
//! pool gathering (§2.2), per-request setup (§2.3), the depth-first first-fit search in Go's exact
//! visiting order (§2.4-§2.12) and result construction (§2.13).
//!
//! Selector results (CEL) are cached per allocator for each (slice device, selector set) pair,
//! errors included, and an error is only raised when the search reaches that pair, as in Go
//! (§2.5). The per-device node check is node-dependent and is never cached across nodes.
//!
//! One file per stage, in the order a call runs them: `snapshot` and `allocated` (inputs
//! prepared once), `pools` (gather), `setup` (request set-up, with the `request` data and the
//! `selectors`), the checks (`capacity`, `constraints`, `taints`, `counters`), `search` and
//! `results`. This file owns the types they share (the allocator, prepared slices and devices,
//! pools); the stage files use it and each other without cycles (the checks use nothing but
//! this file; `results` is the only user of `search`).

mod allocated;
mod capacity;
mod constraints;
mod counters;
mod pools;
mod request;
mod results;
mod search;
mod selectors;
mod setup;
mod snapshot;
mod taints;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceClass, DeviceTaint, ResourceClaim, ResourceSlice,
};

use crate::fasthash::FastMap;
use crate::nodesel::NodeMatchSpec;
use crate::quantity::Quantity;
use crate::selector::SelectorCache;
use crate::types::{AllocError, AllocateOptions, AllocatedState, ErrorClass, Features, Semantics};

pub use allocated::AllocatedIndex;
pub(crate) use capacity::capacity_fits;
pub(crate) use constraints::lookup_attribute;
use counters::AvailableCounters;
use search::{Location, Search, Stop};
use setup::SetupCache;
pub use snapshot::ClusterSnapshot;
pub(crate) use taints::taint_blocks;

/// `resourceapi.AllocationResultsMaxSize`.
pub const ALLOCATION_RESULTS_MAX_SIZE: i64 = 32;

type Result<T, E = AllocError> = std::result::Result<T, E>;

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
type GatherKey = (bool, Vec<u32>);

/// The allocator for one set of inputs (one pod in the scheduler).
pub struct Allocator<'a> {
    pub(crate) features: Features,
    pub(crate) semantics: Semantics,
    pub(crate) snap: Arc<ClusterSnapshot<'a>>,
    allocated: Arc<AllocatedIndex>,
    available_counters: Mutex<FastMap<u32, Arc<AvailableCounters<'a>>>>,
    /// Request setup (§2.3) of the claims of the first call, reused by later calls with the
    /// same claims when it cannot depend on the node (no All-mode request reached).
    setup_cache: OnceLock<SetupCache<'a>>,
    invocations: AtomicU64,
}

impl std::fmt::Debug for Allocator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("features", &self.features)
            .field("semantics", &self.semantics)
            .field("slices", &self.snap.slices.len())
            .finish_non_exhaustive()
    }
}

/// Statistics of an allocator (Go: `GetStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Number of search steps (Go's `allocateOne` invocations) over all calls.
    pub allocate_one_invocations: u64,
}

fn parse_q(s: &str, what: impl Fn() -> String) -> Result<Quantity> {
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

impl<'a> Allocator<'a> {
    /// Prepares an allocator (Go: `NewAllocator`) over a fresh [`ClusterSnapshot`].
    pub fn new(
        features: Features,
        semantics: Semantics,
        allocated: &AllocatedState,
        classes: &'a [DeviceClass],
        slices: &'a [ResourceSlice],
        selectors: Arc<SelectorCache>,
    ) -> Self {
        Self::with_snapshot(
            Arc::new(ClusterSnapshot::new(classes, slices, selectors)),
            features,
            semantics,
            allocated,
        )
    }

    /// Prepares an allocator for one pod over a shared snapshot: only the allocated state is
    /// indexed here (O(allocated devices)).
    pub fn with_snapshot(
        snap: Arc<ClusterSnapshot<'a>>,
        features: Features,
        semantics: Semantics,
        allocated: &AllocatedState,
    ) -> Self {
        let index = Arc::new(AllocatedIndex::new(&snap, allocated));
        Self::with_index(snap, features, semantics, index)
    }

    /// Prepares an allocator for one pod over a shared snapshot and an allocated state that the
    /// caller keeps indexed across pods (O(1); Go's scheduler keeps an incremental tracker too).
    pub fn with_index(
        snap: Arc<ClusterSnapshot<'a>>,
        features: Features,
        semantics: Semantics,
        allocated: Arc<AllocatedIndex>,
    ) -> Self {
        Allocator {
            features,
            semantics,
            snap,
            allocated,
            available_counters: Mutex::new(FastMap::default()),
            setup_cache: OnceLock::new(),
            invocations: AtomicU64::new(0),
        }
    }

    /// Search statistics so far.
    pub fn stats(&self) -> Stats {
        Stats {
            allocate_one_invocations: self.invocations.load(Ordering::Relaxed),
        }
    }

    /// Allocates all claims together on `node` (Go: `Allocate`).
    ///
    /// `Ok(Some(results))` holds one result per claim; `Ok(None)` means the claims do not fit on
    /// this node; errors carry Go's text and a class ([`ErrorClass::InvalidPools`] is the
    /// per-node "invalid resource pools were encountered", [`ErrorClass::Timeout`] a step budget
    /// or deadline overrun, anything else is fatal).
    pub fn allocate(
        &self,
        node: &Node,
        claims: &[&'a ResourceClaim],
        options: &AllocateOptions,
    ) -> Result<Option<Vec<AllocationResult>>> {
        if let Some(e) = &self.snap.setup_error {
            return Err(e.clone());
        }
        let pools = self.gather_pools(node)?;
        let setup = self.setup_cached(node, claims, &pools)?;
        let mut search = Search::new(self, node, &pools, claims, &setup.claims, options);
        let start = Location::default();
        let outcome = search.allocate_one(0, 0, 0, 0, false, start);
        self.invocations.fetch_add(search.steps, Ordering::Relaxed);
        match outcome {
            Err(Stop::Fatal(e)) => Err(*e),
            // A max-size signal escaping claim 0 is treated as "no solution" (unreachable in practice).
            Err(Stop::MaxSize) | Ok(false) => {
                if pools.iter().any(|p| p.invalid) {
                    return Err(AllocError::new(
                        ErrorClass::InvalidPools,
                        "invalid resource pools were encountered",
                    ));
                }
                Ok(None)
            }
            Ok(true) => search.build_results().map(Some),
        }
    }

    pub(crate) fn class(&self, name: &str) -> Option<&'a DeviceClass> {
        self.snap.classes.get(name).copied()
    }

    pub(crate) fn is_allocated_exclusive(&self, gid: u32) -> bool {
        self.allocated.exclusive.contains(gid)
    }

    pub(crate) fn committed_capacity(&self, gid: u32) -> Option<&BTreeMap<String, i128>> {
        self.allocated.capacity.get(&gid)
    }
}
