//! The structured allocator (Kubernetes 1.36 "incubating" variant), following
//! `k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`,
//! `pools_incubating.go`, `constraint.go` and `consumable_capacity.go` (spec
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceAttribute, DeviceClass, DeviceRequestAllocationResult, DeviceSelector, DeviceTaint,
    DeviceToleration, ResourceClaim, ResourceSlice,
};

use crate::fasthash::FastMap;
use crate::nodesel::NodeMatchSpec;
use crate::quantity::{Quantity, QuantityFormat};
use crate::selector::{SelectorCache, evaluate};
use crate::types::{AllocError, AllocateOptions, AllocatedState, ErrorClass, Features, Semantics};

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

type CounterTable<'a> = Vec<(&'a str, Vec<(&'a str, i128)>)>;

/// Available counters of one pool (Go: `availableCounters`), by name (for `explain`) and
/// flattened in the same order with interned IDs (for the search).
#[derive(Debug)]
pub(crate) struct AvailableCounters<'a> {
    pub table: CounterTable<'a>,
    /// (Fixed ID, GoCompat ID, available) per counter, in `table` order.
    ids: Vec<(u32, u32, i128)>,
}

/// Interned counter names. A counter is (driver, pool, set, counter) under Fixed semantics and
/// (pool, set, counter) under GoCompat (Go keys counter state by pool name only, bug #23), so an
/// ID comparison is exactly the by-name lookup Go does in the pool's counter table.
#[derive(Default)]
struct CounterIds<'a> {
    fixed: FastMap<(&'a str, &'a str, &'a str, &'a str), u32>,
    compat: FastMap<(&'a str, &'a str, &'a str), u32>,
}

impl<'a> CounterIds<'a> {
    fn get(&mut self, driver: &'a str, pool: &'a str, set: &'a str, name: &'a str) -> (u32, u32) {
        let next = self.fixed.len() as u32;
        let f = *self.fixed.entry((driver, pool, set, name)).or_insert(next);
        let next = self.compat.len() as u32;
        let c = *self.compat.entry((pool, set, name)).or_insert(next);
        (f, c)
    }
}

/// Counter consumption of the devices being allocated in one pool (one counter key): per
/// counter (available, used), and how many counters are above their limit, so the check of
/// all counters of the pool that Go does per candidate is one comparison.
#[derive(Debug)]
struct CounterUse {
    /// Available minus used per counter of the pool, in table order.
    slack: Vec<i128>,
    /// Counter ID (Fixed or GoCompat, per the allocator's semantics) minus `base` maps to
    /// position plus one (0: not a counter of this pool). A pool's IDs are interned together,
    /// so this is small; pools whose IDs are spread out use `index` instead.
    dense: Vec<u32>,
    base: u32,
    index: FastMap<u32, u32>,
    over: usize,
}

impl CounterUse {
    fn new(available: &AvailableCounters<'_>, compat: bool) -> Self {
        let id = |&(f, c, _): &(u32, u32, i128)| if compat { c } else { f };
        let slack: Vec<i128> = available.ids.iter().map(|&(_, _, a)| a).collect();
        let lo = available.ids.iter().map(id).min().unwrap_or(0);
        let hi = available.ids.iter().map(id).max().unwrap_or(0);
        let mut dense = Vec::new();
        let mut index = FastMap::default();
        if (hi - lo) as usize <= 4 * slack.len() + 64 {
            dense = vec![0; (hi - lo) as usize + 1];
        }
        // Counter names are unique in a valid pool; keep the first like a by-name lookup.
        for (i, x) in available.ids.iter().enumerate() {
            match dense.get_mut((id(x) - lo) as usize) {
                Some(p) if *p == 0 => *p = i as u32 + 1,
                Some(_) => {}
                None => {
                    index.entry(id(x)).or_insert(i as u32);
                }
            }
        }
        let over = slack.iter().filter(|s| **s < 0).count();
        CounterUse {
            slack,
            dense,
            base: lo,
            index,
            over,
        }
    }

    /// Adds `delta` to one counter's use. Counters the pool does not offer are not checked
    /// (Go ranges over the available ones).
    #[inline]
    fn change(&mut self, id: u32, delta: i128) {
        let pos = if self.dense.is_empty() {
            self.index.get(&id).map(|&p| p as usize)
        } else {
            self.dense
                .get(id.wrapping_sub(self.base) as usize)
                .and_then(|&p| (p as usize).checked_sub(1))
        };
        if let Some(slack) = pos.and_then(|p| self.slack.get_mut(p)) {
            let was = usize::from(*slack < 0);
            *slack -= delta;
            self.over = self.over + usize::from(*slack < 0) - was;
        }
    }
}

/// The prepared, immutable view of the cluster's classes and slices, shared by the allocators of
/// many pods (Go rebuilds all of this for every pod and node). It also caches the outcome of
/// every selector expression on every device it has been evaluated on: a device's attributes
/// cannot change inside a snapshot, and outcomes (errors included) are only reported when the
/// search reaches the (device, request) pair, so the caching does not change results (§2.5).
pub struct ClusterSnapshot<'a> {
    pub(crate) classes: FastMap<&'a str, &'a DeviceClass>,
    pub(crate) slices: Vec<SliceData<'a>>,
    on_node: FastMap<&'a str, Vec<u32>>,
    by_pool: FastMap<(&'a str, &'a str), Vec<u32>>,
    /// Per slice, its pool's rank in (driver, pool name) order.
    pool_rank: Vec<u32>,
    /// Per slice, the rank of its pool name alone (GoCompat counter key, bug #23).
    pool_name_rank: Vec<u32>,
    /// Gathered pools per set of relevant slices (Go redoes this for every node and pod; the
    /// result depends only on which slices are relevant, not on the node itself).
    gathered: Mutex<FastMap<GatherKey, Arc<Vec<Pool<'a>>>>>,
    /// The same, lock-free, for the common views "one node-dependent relevant slice" (per
    /// slice) and "none", per PartitionableDevices gate (`[off, on]`).
    gathered_single: Vec<[OnceLock<Arc<Vec<Pool<'a>>>>; 2]>,
    gathered_static: [OnceLock<Arc<Vec<Pool<'a>>>>; 2],
    /// Per gate, the shared slices relevant on every node (counter slices, `allNodes`), and
    /// those whose relevance depends on the node (node selector, per-device selection), both
    /// in input order. Other shared slices are relevant on no node.
    shared_static: [Vec<u32>; 2],
    shared_dynamic: [Vec<u32>; 2],
    gids: FastMap<(&'a str, &'a str, &'a str), u32>,
    instances: u32,
    setup_error: Option<AllocError>,
    selectors: Arc<SelectorCache>,
    exprs: Mutex<HashMap<String, Arc<ExprSlot>>>,
}

impl std::fmt::Debug for ClusterSnapshot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSnapshot")
            .field("slices", &self.slices.len())
            .field("devices", &self.instances)
            .finish_non_exhaustive()
    }
}

/// Why a selector did not produce a boolean.
#[derive(Clone, Debug)]
pub(crate) enum ExprError {
    Compile(String),
    Runtime(String),
}

/// One compiled selector expression and its outcome per device instance
/// (0 = not evaluated, 1 = false, 2 = true, 3 = runtime error kept in `errors`).
pub(crate) struct ExprSlot {
    program: std::result::Result<Arc<devicelet_cel::CompiledSelector>, String>,
    results: Vec<AtomicU8>,
    errors: Mutex<HashMap<u32, String>>,
}

impl ExprSlot {
    pub(crate) fn eval(
        &self,
        instance: u32,
        driver: &str,
        dev: &Device,
    ) -> std::result::Result<bool, ExprError> {
        let program = self
            .program
            .as_ref()
            .map_err(|e| ExprError::Compile(e.clone()))?;
        let slot = self.results.get(instance as usize);
        match slot.map(|s| s.load(AtomicOrdering::Relaxed)) {
            Some(1) => return Ok(false),
            Some(2) => return Ok(true),
            Some(3) => {
                if let Some(e) = self
                    .errors
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&instance).cloned())
                {
                    return Err(ExprError::Runtime(e));
                }
            }
            _ => {}
        }
        let r = evaluate(program, driver, dev);
        if let Some(slot) = slot {
            match &r {
                Ok(b) => slot.store(if *b { 2 } else { 1 }, AtomicOrdering::Relaxed),
                Err(e) => {
                    if let Ok(mut m) = self.errors.lock() {
                        m.insert(instance, e.clone());
                    }
                    slot.store(3, AtomicOrdering::Relaxed);
                }
            }
        }
        r.map_err(ExprError::Runtime)
    }
}

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

/// A node-independent request setup: the claims it was made for (by address: they are
/// borrowed for the allocator's lifetime, so equal addresses are the same unchanged objects)
/// and its outcome, error included (setup errors are returned before any search step).
struct SetupCache<'a> {
    claims: Vec<usize>,
    outcome: Result<Arc<Setup<'a>>>,
}

/// The per-call request setup: one entry per claim.
pub(crate) struct Setup<'a> {
    pub claims: Vec<ClaimRequests<'a>>,
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

impl<'a> ClusterSnapshot<'a> {
    /// Prepares classes and slices once (slice partition, interned device IDs, parsed
    /// quantities, compiled node selectors). Malformed quantities are reported by every later
    /// allocation call as [`ErrorClass::InvalidInput`].
    pub fn new(
        classes: &'a [DeviceClass],
        slices: &'a [ResourceSlice],
        selectors: Arc<SelectorCache>,
    ) -> Self {
        let mut setup_error = None;
        let mut class_map = FastMap::default();
        for class in classes {
            if let Some(name) = class.metadata.name.as_deref() {
                class_map.entry(name).or_insert(class);
            }
        }
        let mut gids: FastMap<(&'a str, &'a str, &'a str), u32> = FastMap::default();
        let mut slice_data = Vec::with_capacity(slices.len());
        let mut on_node: FastMap<&'a str, Vec<u32>> = FastMap::default();
        let mut shared = Vec::new();
        let mut by_pool: FastMap<(&'a str, &'a str), Vec<u32>> = FastMap::default();
        let mut instance = 0u32;
        let mut counter_ids = CounterIds::default();
        for (si, slice) in slices.iter().enumerate() {
            let spec = &slice.spec;
            let name = slice.metadata.name.as_deref().unwrap_or("");
            let (driver, pool) = (spec.driver.as_str(), spec.pool.name.as_str());
            let mut shared_counters = Vec::new();
            let mut shared_counter_ids = Vec::new();
            for set in spec.shared_counters.iter().flatten() {
                let mut counters = Vec::new();
                let mut ids = Vec::new();
                for (cname, c) in &set.counters {
                    match parse_q(&c.value.0, || {
                        format!("slice {name}: counter set {} counter {cname}", set.name)
                    }) {
                        Ok(q) => {
                            counters.push((cname.as_str(), q.nanos()));
                            ids.push(counter_ids.get(driver, pool, &set.name, cname));
                        }
                        Err(e) => {
                            setup_error.get_or_insert(e);
                        }
                    }
                }
                shared_counters.push((set.name.as_str(), counters));
                shared_counter_ids.push(ids);
            }
            let has_shared_counters = spec.shared_counters.as_ref().is_some_and(|s| !s.is_empty());
            let mut devices = Vec::new();
            for dev in spec.devices.iter().flatten() {
                let key = (
                    spec.driver.as_str(),
                    spec.pool.name.as_str(),
                    dev.name.as_str(),
                );
                let next = gids.len() as u32;
                let gid = *gids.entry(key).or_insert(next);
                let mut consumes = Vec::new();
                let mut consumed_ids = Vec::new();
                for cc in dev.consumes_counters.iter().flatten() {
                    let mut counters = Vec::new();
                    for (cname, c) in &cc.counters {
                        match parse_q(&c.value.0, || {
                            format!("slice {name}: device {}: counter {cname}", dev.name)
                        }) {
                            Ok(q) => {
                                let (f, c) = counter_ids.get(driver, pool, &cc.counter_set, cname);
                                consumed_ids.push((f, c, q.nanos()));
                                counters.push((cname.as_str(), q.nanos()));
                            }
                            Err(e) => {
                                setup_error.get_or_insert(e);
                            }
                        }
                    }
                    consumes.push((cc.counter_set.as_str(), counters));
                }
                let mut capacity = Vec::new();
                for (cname, cap) in dev.capacity.iter().flatten() {
                    let what = || format!("slice {name}: device {}: capacity {cname}", dev.name);
                    let parsed = (|| -> Result<CapacityData> {
                        let value = parse_q(&cap.value.0, what)?;
                        let mut data = CapacityData {
                            value,
                            default: None,
                            valid_values: None,
                            range: None,
                            has_policy: false,
                        };
                        if let Some(p) = &cap.request_policy {
                            data.has_policy = true;
                            if let Some(d) = &p.default {
                                data.default = Some(parse_q(&d.0, what)?);
                            }
                            if let Some(vv) = &p.valid_values {
                                let mut vals = Vec::new();
                                for v in vv {
                                    vals.push(parse_q(&v.0, what)?);
                                }
                                data.valid_values = Some(vals);
                            }
                            if let Some(r) = &p.valid_range {
                                let min = parse_q(&r.min.0, what)?;
                                let max =
                                    r.max.as_ref().map(|m| parse_q(&m.0, what)).transpose()?;
                                let step =
                                    r.step.as_ref().map(|m| parse_q(&m.0, what)).transpose()?;
                                data.range = Some((min, max, step));
                            }
                        }
                        Ok(data)
                    })();
                    match parsed {
                        Ok(d) => capacity.push((cname.as_str(), d)),
                        Err(e) => {
                            setup_error.get_or_insert(e);
                        }
                    }
                }
                devices.push(DeviceData {
                    raw: dev,
                    gid,
                    instance,
                    node: NodeMatchSpec::new(
                        dev.node_name.as_deref(),
                        dev.all_nodes,
                        dev.node_selector.as_ref(),
                    ),
                    consumes,
                    counter_ids: consumed_ids,
                    capacity,
                    allow_multi: dev.allow_multiple_allocations == Some(true),
                    has_binding_conditions: dev
                        .binding_conditions
                        .as_ref()
                        .is_some_and(|b| !b.is_empty()),
                    binds_to_node: dev.binds_to_node == Some(true),
                    taints: dev.taints.as_deref().unwrap_or(&[]),
                });
                instance = instance.wrapping_add(1);
            }
            let node_name = spec.node_name.as_deref().filter(|n| !n.is_empty());
            match node_name {
                Some(n) if !has_shared_counters => on_node.entry(n).or_default().push(si as u32),
                _ => shared.push(si as u32),
            }
            by_pool
                .entry((spec.driver.as_str(), spec.pool.name.as_str()))
                .or_default()
                .push(si as u32);
            let mut seen_names = HashSet::new();
            let duplicate_device = devices
                .iter()
                .find(|d| !seen_names.insert(d.raw.name.as_str()))
                .map(|d| d.raw.name.clone());
            let slice_has_binding_conditions = devices.iter().any(|d| d.has_binding_conditions);
            slice_data.push(SliceData {
                raw: slice,
                name,
                driver: spec.driver.as_str(),
                pool: spec.pool.name.as_str(),
                generation: spec.pool.generation,
                slice_count: spec.pool.resource_slice_count,
                node: NodeMatchSpec::new(
                    spec.node_name.as_deref(),
                    spec.all_nodes,
                    spec.node_selector.as_ref(),
                ),
                per_device: spec.per_device_node_selection,
                shared_counters,
                shared_counter_ids,
                has_shared_counters,
                devices,
                duplicate_device,
                has_binding_conditions: slice_has_binding_conditions,
            });
        }
        let mut pool_keys: Vec<(&'a str, &'a str)> = by_pool.keys().copied().collect();
        pool_keys.sort_unstable();
        let rank: FastMap<(&'a str, &'a str), u32> = pool_keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, i as u32))
            .collect();
        let pool_rank = slice_data
            .iter()
            .map(|s| rank.get(&(s.driver, s.pool)).copied().unwrap_or(0))
            .collect();
        let mut pool_names: Vec<&'a str> = pool_keys.iter().map(|(_, p)| *p).collect();
        pool_names.sort_unstable();
        pool_names.dedup();
        let pool_name_rank = slice_data
            .iter()
            .map(|s| pool_names.binary_search(&s.pool).unwrap_or(0) as u32)
            .collect();
        let gathered_single = slice_data
            .iter()
            .map(|_| [OnceLock::new(), OnceLock::new()])
            .collect();
        let mut shared_static: [Vec<u32>; 2] = Default::default();
        let mut shared_dynamic: [Vec<u32>; 2] = Default::default();
        for pd in [false, true] {
            for &si in &shared {
                let s: &SliceData<'_> = &slice_data[si as usize];
                if !pd && (s.per_device.is_some() || s.has_shared_counters) {
                    continue;
                }
                if s.has_shared_counters || matches!(s.node, NodeMatchSpec::All) {
                    shared_static[usize::from(pd)].push(si);
                } else if s.node.is_set() || s.per_device == Some(true) {
                    shared_dynamic[usize::from(pd)].push(si);
                }
            }
        }
        ClusterSnapshot {
            classes: class_map,
            pool_rank,
            pool_name_rank,
            gathered: Mutex::new(FastMap::default()),
            gathered_single,
            gathered_static: [OnceLock::new(), OnceLock::new()],
            shared_static,
            shared_dynamic,
            slices: slice_data,
            on_node,
            by_pool,
            gids,
            instances: instance,
            setup_error,
            selectors,
            exprs: Mutex::new(HashMap::new()),
        }
    }

    /// The interned ID of a device of this snapshot.
    pub(crate) fn gid(&self, driver: &str, pool: &str, device: &str) -> Option<u32> {
        self.gids.get(&(driver, pool, device)).copied()
    }

    /// The compiled selector and its per-device outcomes for one expression text.
    pub(crate) fn expr(&self, expression: &str) -> Arc<ExprSlot> {
        if let Some(e) = self
            .exprs
            .lock()
            .ok()
            .and_then(|m| m.get(expression).cloned())
        {
            return e;
        }
        let slot = Arc::new(ExprSlot {
            program: self.selectors.get_or_compile(expression),
            results: (0..self.instances).map(|_| AtomicU8::new(0)).collect(),
            errors: Mutex::new(HashMap::new()),
        });
        if let Ok(mut m) = self.exprs.lock() {
            return Arc::clone(m.entry(expression.to_string()).or_insert(slot));
        }
        slot
    }
}

/// The allocated state of the other claims, with device IDs interned against one
/// [`ClusterSnapshot`] (devices the snapshot does not know cannot be candidates and are
/// dropped). Build it once with [`AllocatedIndex::new`] and keep it current with
/// [`AllocatedIndex::add_result`], so that a new allocator per pod costs O(1) instead of
/// re-hashing every allocated device ID.
#[derive(Clone, Debug, Default)]
pub struct AllocatedIndex {
    /// Exclusively allocated devices.
    exclusive: GidSet,
    /// Devices with any allocation (exclusive, share or consumed capacity).
    any: GidSet,
    /// Summed consumed capacity of the shares of each device, in nano-units.
    capacity: FastMap<u32, BTreeMap<String, i128>>,
}

/// A set of interned device IDs as a bitset (IDs are dense; the in-use test runs for every
/// candidate device).
#[derive(Clone, Debug, Default)]
struct GidSet {
    words: Vec<u64>,
}

impl GidSet {
    fn insert(&mut self, gid: u32) {
        let w = (gid / 64) as usize;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (gid % 64);
    }

    #[inline]
    fn contains(&self, gid: u32) -> bool {
        self.words
            .get((gid / 64) as usize)
            .is_some_and(|w| w & (1 << (gid % 64)) != 0)
    }
}

impl AllocatedIndex {
    /// Indexes `state` against `snap` (O(allocated devices)).
    pub fn new(snap: &ClusterSnapshot<'_>, state: &AllocatedState) -> Self {
        let mut index = AllocatedIndex::default();
        for id in &state.devices {
            if let Some(g) = snap.gid(&id.driver, &id.pool, &id.device) {
                index.exclusive.insert(g);
                index.any.insert(g);
            }
        }
        for (id, _) in &state.shared_devices {
            if let Some(g) = snap.gid(&id.driver, &id.pool, &id.device) {
                index.any.insert(g);
            }
        }
        for (id, caps) in &state.consumed_capacity {
            if let Some(g) = snap.gid(&id.driver, &id.pool, &id.device) {
                index.any.insert(g);
                let m: BTreeMap<String, i128> =
                    caps.iter().map(|(k, v)| (k.clone(), v.nanos())).collect();
                index.capacity.insert(g, m);
            }
        }
        index
    }

    /// Adds one allocation result exactly like [`AllocatedState::add_result`] does.
    pub fn add_result(
        &mut self,
        snap: &ClusterSnapshot<'_>,
        result: &DeviceRequestAllocationResult,
        consumable_capacity: bool,
    ) -> std::result::Result<(), crate::quantity::QuantityError> {
        if result.admin_access == Some(true) {
            return Ok(());
        }
        let Some(g) = snap.gid(&result.driver, &result.pool, &result.device) else {
            return Ok(());
        };
        match (&result.share_id, consumable_capacity) {
            (Some(_), true) => {
                if let Some(cc) = &result.consumed_capacity {
                    let mut parsed = Vec::with_capacity(cc.len());
                    for (name, q) in cc {
                        parsed.push((name, Quantity::parse(&q.0)?.nanos()));
                    }
                    let entry = self.capacity.entry(g).or_default();
                    for (name, v) in parsed {
                        *entry.entry(name.clone()).or_insert(0) += v;
                    }
                }
                self.any.insert(g);
            }
            _ => {
                self.exclusive.insert(g);
                self.any.insert(g);
            }
        }
        Ok(())
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

    // ---------------------------------------------------------------- pools (§2.2)

    pub(crate) fn gather_pools(&self, node: &Node) -> Result<Arc<Vec<Pool<'a>>>> {
        let node_name = node.metadata.name.as_deref().unwrap_or("");
        let pd = self.features.partitionable_devices;
        let pdi = usize::from(pd);
        let on_node = self
            .snap
            .on_node
            .get(node_name)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // Only the relevance of node-local slices and of shared slices with a node selector or
        // per-device selection depends on the node; the other shared slices are relevant on
        // every node or on none (`ClusterSnapshot::shared_static`). These are evaluated in Go's
        // candidate order, so the first node-selector parse error is Go's.
        let mut first: Option<u32> = None;
        let mut more: Vec<u32> = Vec::new();
        let mut local = 0;
        for (i, &si) in on_node
            .iter()
            .chain(self.snap.shared_dynamic[pdi].iter())
            .enumerate()
        {
            if self.slice_relevant(si, node, pd)? {
                if first.is_none() {
                    first = Some(si);
                } else {
                    more.push(si);
                }
                if i < on_node.len() {
                    local += 1;
                }
            }
        }
        // The result depends only on the relevant slices; the static ones are fixed per gate,
        // so the node-dependent ones are the cache key.
        let Some(first) = first else {
            let cell = &self.snap.gathered_static[pdi];
            if let Some(p) = cell.get() {
                return Ok(Arc::clone(p));
            }
            let pools = self.build_gathered(&[], 0);
            return Ok(Arc::clone(cell.get_or_init(|| pools)));
        };
        if more.is_empty() {
            let cell = &self.snap.gathered_single[first as usize][pdi];
            if let Some(p) = cell.get() {
                return Ok(Arc::clone(p));
            }
            let pools = self.build_gathered(&[first], local);
            return Ok(Arc::clone(cell.get_or_init(|| pools)));
        }
        more.insert(0, first);
        let key: GatherKey = (pd, more);
        if let Some(p) = self
            .snap
            .gathered
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(p);
        }
        let pools = self.build_gathered(&key.1, local);
        if let Ok(mut m) = self.snap.gathered.lock() {
            m.insert(key, Arc::clone(&pools));
        }
        Ok(pools)
    }

    /// Whether slice `si` is relevant for `node` (`pools_incubating.go:63-101`).
    fn slice_relevant(&self, si: u32, node: &Node, pd: bool) -> Result<bool> {
        let s = &self.snap.slices[si as usize];
        if !pd && (s.per_device.is_some() || s.has_shared_counters) {
            return Ok(false);
        }
        if s.has_shared_counters {
            return Ok(true);
        }
        if s.node.is_set() {
            return s.node.matches(node).map_err(|e| {
                AllocError::new(
                    ErrorClass::NodeSelectorParse,
                    format!(
                        "gather pool information: failed to perform node selection for slice {}: failed to parse node selector {e}",
                        s.name
                    ),
                )
            });
        }
        if s.per_device == Some(true) {
            for d in &s.devices {
                let m = d.node.matches(node).map_err(|e| {
                    AllocError::new(
                        ErrorClass::NodeSelectorParse,
                        format!(
                            "gather pool information: failed to perform node selection for device {} in slice {}: failed to parse node selector {e}",
                            d.raw.name, s.name
                        ),
                    )
                })?;
                if m {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Builds the pools of one node view (§2.2) from its node-dependent relevant slices
    /// (`dynamic`, in candidate order, the first `local` of them node-local) and the static
    /// relevant shared slices.
    fn build_gathered(&self, dynamic: &[u32], local: usize) -> Arc<Vec<Pool<'a>>> {
        let pd = self.features.partitionable_devices;
        let (on_node, dyn_shared) = dynamic.split_at(local.min(dynamic.len()));
        // Candidate order: node-local slices, then shared slices in input order (both lists of
        // shared slices are ascending subsequences of `shared`).
        let stat = &self.snap.shared_static[usize::from(pd)];
        let mut relevant = Vec::with_capacity(dynamic.len() + stat.len());
        relevant.extend_from_slice(on_node);
        let (mut a, mut b) = (0, 0);
        while a < stat.len() || b < dyn_shared.len() {
            if b >= dyn_shared.len() || (a < stat.len() && stat[a] < dyn_shared[b]) {
                relevant.push(stat[a]);
                a += 1;
            } else {
                relevant.push(dyn_shared[b]);
                b += 1;
            }
        }
        // Per pool, the slices of the highest generation seen, in candidate order (`addSlice`).
        let mut index: FastMap<u32, usize> = FastMap::default();
        let mut collected: Vec<(u32, Vec<u32>)> = Vec::new();
        for si in relevant {
            let key = self.snap.pool_rank[si as usize];
            let generation = self.snap.slices[si as usize].generation;
            match index.get(&key) {
                None => {
                    index.insert(key, collected.len());
                    collected.push((key, vec![si]));
                }
                Some(&pi) => {
                    let list = &mut collected[pi].1;
                    let current = self.snap.slices[list[0] as usize].generation;
                    if generation < current {
                        continue;
                    }
                    if generation > current {
                        list.clear();
                    }
                    list.push(si);
                }
            }
        }
        let mut pools = Vec::with_capacity(collected.len());
        for (_, visible) in &collected {
            let visible = visible.clone();
            let first = &self.snap.slices[visible[0] as usize];
            let (driver, pool_name) = (first.driver, first.pool);
            let generation = first.generation;
            let count = first.slice_count;
            let mut extra = Vec::new();
            if visible.len() as i64 != count {
                let all = self
                    .snap
                    .by_pool
                    .get(&(driver, pool_name))
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                if all
                    .iter()
                    .any(|&i| self.snap.slices[i as usize].generation > generation)
                {
                    // Obsolete: a newer generation exists elsewhere. Dropped silently.
                    continue;
                }
                let same: Vec<u32> = all
                    .iter()
                    .copied()
                    .filter(|&i| self.snap.slices[i as usize].generation == generation)
                    .collect();
                if same.len() as i64 != count {
                    pools.push(Pool {
                        driver,
                        name: pool_name,
                        key_fixed: self.snap.pool_rank[visible[0] as usize],
                        key_compat: self.snap.pool_name_rank[visible[0] as usize],
                        incomplete: true,
                        invalid: false,
                        invalid_reason: String::new(),
                        device_slices: Vec::new(),
                        not_visible: Vec::new(),
                        counter_sets: Vec::new(),
                        binding_last: false,
                    });
                    continue;
                }
                let seen: HashSet<&str> = visible
                    .iter()
                    .map(|&i| self.snap.slices[i as usize].name)
                    .collect();
                extra = same
                    .into_iter()
                    .filter(|&i| !seen.contains(self.snap.slices[i as usize].name))
                    .collect();
            }
            pools.push(self.build_pool(driver, pool_name, visible, extra));
        }
        pools.sort_by(|a, b| {
            (a.binding_last, a.driver, a.name).cmp(&(b.binding_last, b.driver, b.name))
        });
        Arc::new(pools)
    }

    fn build_pool(
        &self,
        driver: &'a str,
        name: &'a str,
        mut visible: Vec<u32>,
        extra: Vec<u32>,
    ) -> Pool<'a> {
        let pd = self.features.partitionable_devices;
        let first = visible[0];
        visible.sort_by(|&a, &b| {
            self.snap.slices[a as usize]
                .name
                .cmp(self.snap.slices[b as usize].name)
        });
        let mut device_slices = Vec::new();
        let mut counter_slices = Vec::new();
        for &si in &visible {
            if pd && self.snap.slices[si as usize].has_shared_counters {
                counter_slices.push(si);
            } else {
                device_slices.push(si);
            }
        }
        let mut invalid_reason = String::new();
        if device_slices.len() == 1 {
            // Duplicates inside one slice are known from the snapshot.
            if let Some(dup) = &self.snap.slices[device_slices[0] as usize].duplicate_device {
                invalid_reason = format!("duplicate device name {dup}");
            }
        } else {
            let mut names = HashSet::new();
            'dup: for &si in &device_slices {
                for d in &self.snap.slices[si as usize].devices {
                    if !names.insert(d.raw.name.as_str()) {
                        invalid_reason = format!("duplicate device name {}", d.raw.name);
                        break 'dup;
                    }
                }
            }
        }
        let mut counter_sets: Vec<(u32, u32)> = Vec::new();
        if pd {
            for &si in &counter_slices {
                for (k, (set, _)) in self.snap.slices[si as usize]
                    .shared_counters
                    .iter()
                    .enumerate()
                {
                    if counter_sets.iter().any(|&(s2, k2)| {
                        self.snap.slices[s2 as usize].shared_counters[k2 as usize].0 == *set
                    }) && invalid_reason.is_empty()
                    {
                        invalid_reason = format!("duplicate counter set name {set}");
                    }
                    counter_sets.push((si, k as u32));
                }
            }
        }
        let mut not_visible = Vec::new();
        for &si in &extra {
            if pd && self.snap.slices[si as usize].has_shared_counters {
                continue;
            }
            not_visible.push(si);
        }
        if pd && invalid_reason.is_empty() {
            'refs: for &si in device_slices.iter().chain(not_visible.iter()) {
                for d in &self.snap.slices[si as usize].devices {
                    for (set, counters) in &d.consumes {
                        let known = counter_sets
                            .iter()
                            .map(|&(s2, k2)| {
                                &self.snap.slices[s2 as usize].shared_counters[k2 as usize]
                            })
                            .find(|(n, _)| n == set)
                            .map(|(_, c)| c);
                        let Some(known) = known else {
                            invalid_reason = format!(
                                "device {} references unknown counter set {set}",
                                d.raw.name
                            );
                            break 'refs;
                        };
                        for (c, _) in counters {
                            if !known.iter().any(|(k, _)| k == c) {
                                invalid_reason = format!(
                                    "device {} references unknown counter {c} in counter set {set}",
                                    d.raw.name
                                );
                                break 'refs;
                            }
                        }
                    }
                }
            }
        }
        // An invalid pool is a placeholder without devices in Go, so binding conditions of its
        // devices cannot move it to the end: it keeps its (driver, pool) place, which decides
        // which pool an All-mode request reports first.
        let binding_last = invalid_reason.is_empty()
            && device_slices
                .iter()
                .any(|&si| self.snap.slices[si as usize].has_binding_conditions);
        Pool {
            driver,
            name,
            key_fixed: self.snap.pool_rank[first as usize],
            key_compat: self.snap.pool_name_rank[first as usize],
            incomplete: false,
            invalid: !invalid_reason.is_empty(),
            invalid_reason,
            device_slices,
            not_visible,
            counter_sets,
            binding_last,
        }
    }

    // ---------------------------------------------------------------- setup (§2.3)

    /// The request setup for `claims` on `node`, from the cache when the claims are those of
    /// the cached setup (the outcome, error included, is then the same on every node).
    fn setup_cached(
        &self,
        node: &Node,
        claims: &[&'a ResourceClaim],
        pools: &[Pool<'a>],
    ) -> Result<Arc<Setup<'a>>> {
        let same_claims = |cached: &[usize]| {
            cached.len() == claims.len()
                && cached
                    .iter()
                    .zip(claims)
                    .all(|(&a, c)| a == std::ptr::from_ref::<ResourceClaim>(c) as usize)
        };
        if let Some(c) = self.setup_cache.get()
            && same_claims(&c.claims)
        {
            return c.outcome.clone();
        }
        let mut node_dependent = false;
        let outcome = self
            .setup(node, claims, pools, &mut node_dependent)
            .map(Arc::new);
        if !node_dependent && self.setup_cache.get().is_none() {
            let _ = self.setup_cache.set(SetupCache {
                claims: claims
                    .iter()
                    .map(|c| std::ptr::from_ref::<ResourceClaim>(c) as usize)
                    .collect(),
                outcome: outcome.clone(),
            });
        }
        outcome
    }

    /// Go's per-claim, per-request setup. `node_dependent` is set once an All-mode request is
    /// reached: from there on the outcome depends on the node's pools.
    fn setup(
        &self,
        node: &Node,
        claims: &[&'a ResourceClaim],
        pools: &[Pool<'a>],
        node_dependent: &mut bool,
    ) -> Result<Setup<'a>> {
        let f = self.features;
        let mut out = Vec::with_capacity(claims.len());
        let mut cons_start = 0;
        for (ci, claim) in claims.iter().enumerate() {
            let cref = claim_ref(claim);
            let devices = claim.spec.devices.as_ref();
            let requests = devices.and_then(|d| d.requests.as_deref()).unwrap_or(&[]);
            let mut slots = Vec::with_capacity(requests.len());
            let mut min_devices: i64 = 0;
            for (ri, request) in requests.iter().enumerate() {
                let subs = request.first_available.as_deref().unwrap_or(&[]);
                let has_sub = !subs.is_empty();
                if !f.prioritized_list && has_sub {
                    return Err(AllocError::new(
                        ErrorClass::FeatureDisabled,
                        format!(
                            "claim {cref}, request {}: has subrequests, but the DRAPrioritizedList feature is disabled",
                            request.name
                        ),
                    ));
                }
                if !f.consumable_capacity {
                    if request
                        .exactly
                        .as_ref()
                        .is_some_and(|e| e.capacity.is_some())
                    {
                        return Err(AllocError::new(
                            ErrorClass::FeatureDisabled,
                            format!(
                                "claim {cref}, request {}: has capacity requests, but the DRAConsumableCapacity feature is disabled",
                                request.name
                            ),
                        ));
                    }
                    for sub in subs {
                        if sub.capacity.is_some() {
                            return Err(AllocError::new(
                                ErrorClass::FeatureDisabled,
                                format!(
                                    "claim {cref}, subrequest {}: has capacity requests, but the DRAConsumableCapacity feature is disabled",
                                    sub.name
                                ),
                            ));
                        }
                    }
                }
                if has_sub {
                    let mut datas = Vec::with_capacity(subs.len());
                    let mut min = i64::MAX;
                    for (si, sub) in subs.iter().enumerate() {
                        let acc = RequestAccess {
                            name: &sub.name,
                            parent: Some(&request.name),
                            class_name: &sub.device_class_name,
                            mode: sub.allocation_mode.as_deref().unwrap_or(""),
                            count: sub.count.unwrap_or(0),
                            admin: None,
                            selectors: sub.selectors.as_deref().unwrap_or(&[]),
                            tolerations: sub.tolerations.as_deref(),
                            capacity: sub.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                        };
                        let d = self.validate_request(
                            node,
                            &cref,
                            (ci, ri, si),
                            acc,
                            pools,
                            node_dependent,
                        )?;
                        min = min.min(d.num_devices);
                        datas.push(d);
                    }
                    min_devices = min_devices.saturating_add(min);
                    slots.push(RequestSlot::Sub(datas));
                } else if let Some(exact) = &request.exactly {
                    let acc = RequestAccess {
                        name: &request.name,
                        parent: None,
                        class_name: &exact.device_class_name,
                        mode: exact.allocation_mode.as_deref().unwrap_or(""),
                        count: exact.count.unwrap_or(0),
                        admin: exact.admin_access,
                        selectors: exact.selectors.as_deref().unwrap_or(&[]),
                        tolerations: exact.tolerations.as_deref(),
                        capacity: exact.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                    };
                    let d = self.validate_request(
                        node,
                        &cref,
                        (ci, ri, 0),
                        acc,
                        pools,
                        node_dependent,
                    )?;
                    min_devices = min_devices.saturating_add(d.num_devices);
                    slots.push(RequestSlot::Plain(d));
                } else {
                    // Go would dereference nil here; the scheduler filters such claims out.
                    return Err(AllocError::new(
                        ErrorClass::UnknownRequestType,
                        format!(
                            "claim {cref}, request {}: unknown request type (neither exactly nor firstAvailable is set)",
                            request.name
                        ),
                    ));
                }
            }
            if min_devices > ALLOCATION_RESULTS_MAX_SIZE {
                return Err(AllocError::new(
                    ErrorClass::ClaimLimit,
                    format!(
                        "claim {cref}: number of requested devices {min_devices} exceeds the claim limit of {ALLOCATION_RESULTS_MAX_SIZE}"
                    ),
                ));
            }
            let mut constraints = Vec::new();
            for (i, c) in devices
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or(&[])
                .iter()
                .enumerate()
            {
                let names: Arc<[&'a str]> =
                    c.requests.iter().flatten().map(String::as_str).collect();
                if let Some(m) = &c.match_attribute {
                    constraints.push(Constraint::Match {
                        names,
                        attr: m.as_str(),
                        first: None,
                        count: 0,
                    });
                } else if let Some(d) = &c.distinct_attribute {
                    constraints.push(Constraint::Distinct {
                        names,
                        attr: d.as_str(),
                        by_request: Vec::new(),
                        stack: Vec::new(),
                    });
                } else {
                    return Err(AllocError::new(
                        ErrorClass::EmptyConstraint,
                        format!(
                            "claim {cref}, constraint #{i}: empty constraint (unsupported constraint type?)"
                        ),
                    ));
                }
            }
            let cons = (cons_start, cons_start + constraints.len());
            cons_start = cons.1;
            out.push(ClaimRequests {
                cref,
                slots,
                constraints,
                cons,
            });
        }
        Ok(Setup { claims: out })
    }

    fn validate_request(
        &self,
        node: &Node,
        cref: &str,
        (ci, ri, si): (usize, usize, usize),
        acc: RequestAccess<'a>,
        pools: &[Pool<'a>],
        node_dependent: &mut bool,
    ) -> Result<RequestData<'a>> {
        for (i, sel) in acc.selectors.iter().enumerate() {
            if sel.cel.is_none() {
                return Err(AllocError::new(
                    ErrorClass::EmptySelector,
                    format!(
                        "claim {cref}, request {}, selector #{i}: CEL expression empty (unsupported selector type?)",
                        acc.name
                    ),
                ));
            }
        }
        if !self.features.admin_access && acc.admin.is_some() {
            return Err(AllocError::new(
                ErrorClass::FeatureDisabled,
                format!(
                    "claim {cref}, request {}: admin access is requested, but the feature is disabled",
                    acc.name
                ),
            ));
        }
        if acc.class_name.is_empty() {
            return Err(AllocError::new(
                ErrorClass::MissingClassName,
                format!(
                    "claim {cref}, request {}: missing device class name (unsupported request type?)",
                    acc.name
                ),
            ));
        }
        let Some(class) = self.snap.classes.get(acc.class_name).copied() else {
            return Err(AllocError::new(
                ErrorClass::UnknownClass,
                format!(
                    "claim {cref}, request {}: could not retrieve device class {}: deviceclass.resource.k8s.io \"{}\" not found",
                    acc.name, acc.class_name, acc.class_name
                ),
            ));
        };
        let mut capacity_requests = None;
        if let Some(reqs) = acc.capacity {
            let mut v = Vec::new();
            for (k, q) in reqs {
                v.push((
                    k.as_str(),
                    parse_q(&q.0, || {
                        format!("claim {cref}, request {}: capacity {k}", acc.name)
                    })?,
                ));
            }
            capacity_requests = Some(v);
        }
        let expr_of = |sel: &DeviceSelector| {
            self.snap.expr(
                sel.cel
                    .as_ref()
                    .map(|c| c.expression.as_str())
                    .unwrap_or(""),
            )
        };
        let class_exprs = class.spec.selectors.iter().flatten().map(expr_of).collect();
        let request_exprs = acc.selectors.iter().map(expr_of).collect();
        let mut data = RequestData {
            claim: ci,
            request: ri,
            sub: si,
            name: acc.name,
            parent: acc.parent,
            class,
            all_mode: false,
            num_devices: 0,
            admin: acc.admin == Some(true),
            tolerations: acc.tolerations,
            capacity_requests,
            all_devices: Vec::new(),
            class_exprs,
            request_exprs,
        };
        match acc.mode {
            "ExactCount" => data.num_devices = acc.count,
            "All" => {
                *node_dependent = true;
                data.all_mode = true;
                for (pi, pool) in pools.iter().enumerate() {
                    if pool.incomplete {
                        return Err(AllocError::new(
                            ErrorClass::AllModeIncompletePool,
                            format!(
                                "claim {cref}, request {}: asks for all devices, but resource pool {}/{} is currently being updated",
                                acc.name, pool.driver, pool.name
                            ),
                        ));
                    }
                    if pool.invalid {
                        return Err(AllocError::new(
                            ErrorClass::AllModeInvalidPool,
                            format!(
                                "claim {cref}, request {}: asks for all devices, but resource pool {}/{} is currently invalid",
                                acc.name, pool.driver, pool.name
                            ),
                        ));
                    }
                    for &sl in &pool.device_slices {
                        for (di, dev) in self.snap.slices[sl as usize].devices.iter().enumerate() {
                            if !self.is_selectable(node, cref, &data, sl, dev)? {
                                continue;
                            }
                            if self.features.consumable_capacity {
                                let empty = BTreeMap::new();
                                let committed =
                                    self.allocated.capacity.get(&dev.gid).unwrap_or(&empty);
                                match capacity_fits(
                                    committed,
                                    data.capacity_requests.as_deref(),
                                    dev,
                                    None,
                                ) {
                                    Ok(true) => {}
                                    _ => continue,
                                }
                            }
                            data.all_devices.push(Candidate {
                                pool: pi as u32,
                                slice: sl,
                                device: di as u32,
                            });
                        }
                    }
                }
                data.num_devices = data.all_devices.len() as i64;
            }
            other => {
                return Err(AllocError::new(
                    ErrorClass::UnknownMode,
                    format!(
                        "claim {cref}, request {}: unsupported count mode {other}",
                        acc.name
                    ),
                ));
            }
        }
        Ok(data)
    }

    // ---------------------------------------------------------------- selectors (§2.5)

    #[inline]
    pub(crate) fn is_selectable(
        &self,
        node: &Node,
        cref: &str,
        req: &RequestData<'a>,
        slice: u32,
        dev: &DeviceData<'a>,
    ) -> Result<bool> {
        if !self.features.device_binding_and_status && dev.has_binding_conditions {
            return Ok(false);
        }
        let s = &self.snap.slices[slice as usize];
        if !self.selectors_match(cref, req, s.driver, dev)? {
            return Ok(false);
        }
        if s.per_device == Some(true) {
            return dev.node.matches(node).map_err(|e| {
                AllocError::new(
                    ErrorClass::NodeSelectorParse,
                    format!("failed to parse node selector {e}"),
                )
            });
        }
        Ok(true)
    }

    /// Evaluates the class selectors, then the request selectors (first false wins).
    pub(crate) fn selectors_match(
        &self,
        cref: &str,
        req: &RequestData<'a>,
        driver: &str,
        dev: &DeviceData<'a>,
    ) -> Result<bool> {
        for (i, e) in req.class_exprs.iter().enumerate() {
            let prefix = || {
                format!(
                    "class {}: selector #{i}",
                    req.class.metadata.name.as_deref().unwrap_or("")
                )
            };
            if !selector_outcome(e.eval(dev.instance, driver, dev.raw), prefix)? {
                return Ok(false);
            }
        }
        for (i, e) in req.request_exprs.iter().enumerate() {
            let prefix = || format!("claim {cref}: selector #{i}");
            if !selector_outcome(e.eval(dev.instance, driver, dev.raw), prefix)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Evaluates one expression on one device (through the snapshot's outcome cache).
    pub(crate) fn eval_selector(
        &self,
        expr: &str,
        driver: &str,
        dev: &DeviceData<'a>,
        prefix: impl Fn() -> String,
    ) -> Result<bool> {
        selector_outcome(
            self.snap.expr(expr).eval(dev.instance, driver, dev.raw),
            prefix,
        )
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

    /// Available counters of a pool, computed once per allocator (Go: `availableCounters`).
    pub(crate) fn available_counters(&self, pool: &Pool<'a>) -> Arc<AvailableCounters<'a>> {
        let key = self.counter_key(pool);
        if let Some(t) = self
            .available_counters
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return t;
        }
        let mut table: CounterTable<'a> = pool
            .counter_sets
            .iter()
            .map(|&(si, k)| self.snap.slices[si as usize].shared_counters[k as usize].clone())
            .collect();
        for &si in pool.device_slices.iter().chain(pool.not_visible.iter()) {
            for d in &self.snap.slices[si as usize].devices {
                if !self.allocated.any.contains(d.gid) {
                    continue;
                }
                for (set, counters) in &d.consumes {
                    let Some((_, avail)) = table.iter_mut().find(|(n, _)| n == set) else {
                        continue;
                    };
                    for (c, v) in counters {
                        if let Some((_, a)) = avail.iter_mut().find(|(n, _)| n == c) {
                            *a -= v;
                        }
                    }
                }
            }
        }
        let ids = pool
            .counter_sets
            .iter()
            .flat_map(|&(si, k)| {
                self.snap.slices[si as usize].shared_counter_ids[k as usize].iter()
            })
            .zip(table.iter().flat_map(|(_, c)| c.iter()))
            .map(|(&(f, c), &(_, avail))| (f, c, avail))
            .collect();
        let t = Arc::new(AvailableCounters { table, ids });
        if let Ok(mut m) = self.available_counters.lock() {
            return Arc::clone(m.entry(key).or_insert(t));
        }
        t
    }

    /// Upstream bug (#140434): Go keys counter state by pool name only, so two drivers with
    /// the same pool name share counters. We key by (driver, pool) unless GoCompat is selected.
    fn counter_key(&self, pool: &Pool<'a>) -> u32 {
        match self.semantics {
            Semantics::GoCompat => pool.key_compat,
            Semantics::Fixed => pool.key_fixed,
        }
    }
}

fn selector_outcome(
    r: std::result::Result<bool, ExprError>,
    prefix: impl Fn() -> String,
) -> Result<bool> {
    r.map_err(|e| match e {
        ExprError::Compile(m) => AllocError::new(
            ErrorClass::CELCompile,
            format!("{}: CEL compile error: {m}", prefix()),
        ),
        ExprError::Runtime(m) => AllocError::new(
            ErrorClass::CELRuntime,
            format!("{}: CEL runtime error: {m}", prefix()),
        ),
    })
}

// -------------------------------------------------------------------- capacity (§2.9)

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a > 0) == (b > 0)) {
        q + 1
    } else {
        q
    }
}

/// Amount of one capacity consumed by a request (Go: `calculateConsumedCapacity`).
pub(crate) fn consumed_amount(requested: Option<&Quantity>, cap: &CapacityData) -> Quantity {
    let Some(req) = requested else {
        return cap.default.unwrap_or(cap.value);
    };
    if !cap.has_policy {
        return *req;
    }
    if let Some((min, _max, step)) = &cap.range {
        if req < min {
            return *min;
        }
        let Some(step) = step else { return *req };
        let step_v = step.value_ceil();
        if step_v <= 0 {
            return *req;
        }
        let min_v = min.value_ceil();
        let added = req.value_ceil() - min_v;
        let n = ceil_div(added, step_v);
        let val = min_v.saturating_add(step_v.saturating_mul(n));
        return Quantity::from_nanos(val.saturating_mul(1_000_000_000), QuantityFormat::BinarySI);
    }
    if let Some(values) = &cap.valid_values
        && let Some(v) = values.iter().find(|v| *v >= req)
    {
        return *v;
    }
    *req
}

/// Go: `violatesPolicy`.
fn violates_policy(consumed: &Quantity, cap: &CapacityData) -> bool {
    if !cap.has_policy {
        return false;
    }
    if cap.default.as_ref() == Some(consumed) {
        return false;
    }
    if let Some((min, max, step)) = &cap.range {
        if max.as_ref().is_some_and(|m| consumed > m) {
            return true;
        }
        if let Some(step) = step {
            let s = step.value_ceil();
            if s > 0 && (consumed.value_ceil() - min.value_ceil()) % s != 0 {
                return true;
            }
        }
        return false;
    }
    if let Some(values) = &cap.valid_values {
        return !values.iter().any(|v| v == consumed);
    }
    false
}

/// Go: `CmpRequestOverCapacity`. `Err(())` means the request names a capacity the device lacks
/// (callers skip the device silently).
pub(crate) fn capacity_fits(
    committed: &BTreeMap<String, i128>,
    requests: Option<&[(&str, Quantity)]>,
    dev: &DeviceData<'_>,
    allocating: Option<&BTreeMap<&str, i128>>,
) -> Result<bool, ()> {
    if let Some(reqs) = requests {
        for (name, _) in reqs {
            if !dev.capacity.iter().any(|(n, _)| n == name) {
                return Err(());
            }
        }
    }
    for (name, cap) in &dev.capacity {
        let requested = requests
            .and_then(|r| r.iter().find(|(n, _)| n == name))
            .map(|(_, q)| q);
        let consumed = consumed_amount(requested, cap);
        if violates_policy(&consumed, cap) {
            return Ok(false);
        }
        let total = committed.get(*name).copied().unwrap_or(0)
            + consumed.nanos()
            + allocating.and_then(|a| a.get(name)).copied().unwrap_or(0);
        if total > cap.value.nanos() {
            return Ok(false);
        }
    }
    Ok(true)
}

// -------------------------------------------------------------------- request data

struct RequestAccess<'a> {
    name: &'a str,
    parent: Option<&'a str>,
    class_name: &'a str,
    mode: &'a str,
    count: i64,
    admin: Option<bool>,
    selectors: &'a [DeviceSelector],
    tolerations: Option<&'a [DeviceToleration]>,
    capacity: Option<&'a BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
}

/// A device position: pool index (in the node's pool list), slice index (global), device index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub pool: u32,
    pub slice: u32,
    pub device: u32,
}

/// One request or subrequest after setup (Go: `requestData`).
pub(crate) struct RequestData<'a> {
    pub claim: usize,
    pub request: usize,
    pub sub: usize,
    pub name: &'a str,
    pub parent: Option<&'a str>,
    pub class: &'a DeviceClass,
    pub all_mode: bool,
    pub num_devices: i64,
    pub admin: bool,
    pub tolerations: Option<&'a [DeviceToleration]>,
    pub capacity_requests: Option<Vec<(&'a str, Quantity)>>,
    pub all_devices: Vec<Candidate>,
    pub class_exprs: Vec<Arc<ExprSlot>>,
    pub request_exprs: Vec<Arc<ExprSlot>>,
}

impl<'a> RequestData<'a> {
    pub(crate) fn full_name(&self) -> String {
        match self.parent {
            Some(p) => format!("{p}/{}", self.name),
            None => self.name.to_string(),
        }
    }
    fn base_name(&self) -> &'a str {
        self.parent.unwrap_or(self.name)
    }
    fn sub_name(&self) -> Option<&'a str> {
        self.parent.map(|_| self.name)
    }
}

pub(crate) enum RequestSlot<'a> {
    Plain(RequestData<'a>),
    Sub(Vec<RequestData<'a>>),
}

impl<'a> RequestSlot<'a> {
    pub(crate) fn get(&self, sub: usize) -> Option<&RequestData<'a>> {
        match self {
            RequestSlot::Plain(d) => Some(d),
            RequestSlot::Sub(v) => v.get(sub),
        }
    }
}

pub(crate) struct ClaimRequests<'a> {
    /// The claim as Go prints it (klog.KObj).
    pub cref: String,
    pub slots: Vec<RequestSlot<'a>>,
    pub constraints: Vec<Constraint<'a>>,
    /// This claim's range in the search's flat list of constraint states.
    pub cons: (usize, usize),
}

// -------------------------------------------------------------------- constraints (§2.7)

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttrValue<'a> {
    Int(i64),
    Bool(bool),
    Str(&'a str),
    Version(&'a str),
    Unknown,
}

impl<'a> AttrValue<'a> {
    fn of(a: &'a DeviceAttribute) -> AttrValue<'a> {
        if let Some(s) = &a.string {
            AttrValue::Str(s)
        } else if let Some(i) = a.int {
            AttrValue::Int(i)
        } else if let Some(b) = a.bool {
            AttrValue::Bool(b)
        } else if let Some(v) = &a.version {
            AttrValue::Version(v)
        } else {
            AttrValue::Unknown
        }
    }
}

/// Go: `lookupAttribute`: full name, then the bare id when the domain is the driver.
pub(crate) fn lookup_attribute<'a>(
    dev: &'a Device,
    driver: &str,
    name: &str,
) -> Option<AttrValue<'a>> {
    let attrs = dev.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(AttrValue::of(a));
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attrs.get(id).map(AttrValue::of)
}

pub(crate) enum Constraint<'a> {
    Match {
        names: Arc<[&'a str]>,
        attr: &'a str,
        first: Option<AttrValue<'a>>,
        count: usize,
    },
    Distinct {
        names: Arc<[&'a str]>,
        attr: &'a str,
        /// GoCompat: values keyed by base request name (upstream bug #140438).
        by_request: Vec<(String, AttrValue<'a>)>,
        /// Fixed: one value per allocated device, in allocation order.
        stack: Vec<AttrValue<'a>>,
    },
}

fn applies(names: &[&str], base: &str, sub: Option<&str>) -> bool {
    if names.is_empty() {
        return true;
    }
    if names.contains(&base) {
        return true;
    }
    match sub {
        Some(s) => names.iter().any(|n| {
            n.len() == base.len() + 1 + s.len()
                && n.starts_with(base)
                && n.ends_with(s)
                && n.as_bytes()[base.len()] == b'/'
        }),
        None => false,
    }
}

/// Whether a candidate value collides with one stored value (Go: `matchesAttribute`).
///
/// Versions compare as exact strings, so `1.2.3` and `1.2.3+build.7` are distinct (spec §7
/// #28). §7 does not list this as an upstream bug, so Fixed semantics compare the same way.
/// A stored value of another type never collides; a candidate of unknown type (e.g. a list
/// attribute under incubating) collides with any stored value.
fn collides(existing: &AttrValue<'_>, candidate: &AttrValue<'_>) -> bool {
    match (existing, candidate) {
        (_, AttrValue::Unknown) => true,
        (AttrValue::Str(a), AttrValue::Str(b)) => a == b,
        (AttrValue::Int(a), AttrValue::Int(b)) => a == b,
        (AttrValue::Bool(a), AttrValue::Bool(b)) => a == b,
        (AttrValue::Version(a), AttrValue::Version(b)) => a == b,
        _ => false,
    }
}

/// A candidate is distinct when it collides with none of the stored values (an empty set
/// accepts anything, like Go's loop over an empty map).
fn all_distinct<'x>(
    mut values: impl Iterator<Item = &'x AttrValue<'x>>,
    candidate: &AttrValue<'_>,
) -> bool {
    !values.any(|existing| collides(existing, candidate))
}

impl<'a> Constraint<'a> {
    fn add(
        &mut self,
        semantics: Semantics,
        base: &str,
        sub: Option<&str>,
        dev: &'a Device,
        driver: &str,
    ) -> bool {
        match self {
            Constraint::Match {
                names,
                attr,
                first,
                count,
            } => {
                if !applies(names, base, sub) {
                    return true;
                }
                let Some(v) = lookup_attribute(dev, driver, attr) else {
                    return false;
                };
                if *count == 0 {
                    *first = Some(v);
                    *count = 1;
                    return true;
                }
                let same = match (first.as_ref(), &v) {
                    (Some(AttrValue::Str(a)), AttrValue::Str(b)) => a == b,
                    (Some(AttrValue::Int(a)), AttrValue::Int(b)) => a == b,
                    (Some(AttrValue::Bool(a)), AttrValue::Bool(b)) => a == b,
                    // Versions compare as exact strings: build metadata counts (spec §7 #28; not a
                    // listed bug, so Fixed semantics compare the same way).
                    (Some(AttrValue::Version(a)), AttrValue::Version(b)) => a == b,
                    _ => false,
                };
                if same {
                    *count += 1;
                }
                same
            }
            Constraint::Distinct {
                names,
                attr,
                by_request,
                stack,
            } => {
                if !applies(names, base, sub) {
                    return true;
                }
                let Some(v) = lookup_attribute(dev, driver, attr) else {
                    return false;
                };
                match semantics {
                    Semantics::GoCompat => {
                        if !all_distinct(by_request.iter().map(|(_, v)| v), &v) {
                            return false;
                        }
                        if let Some(e) = by_request.iter_mut().find(|(n, _)| n == base) {
                            e.1 = v;
                        } else {
                            by_request.push((base.to_string(), v));
                        }
                        true
                    }
                    Semantics::Fixed => {
                        if !all_distinct(stack.iter(), &v) {
                            return false;
                        }
                        stack.push(v);
                        true
                    }
                }
            }
        }
    }

    fn remove(&mut self, semantics: Semantics, base: &str, sub: Option<&str>) {
        match self {
            Constraint::Match { names, count, .. } => {
                if applies(names, base, sub) {
                    *count = count.saturating_sub(1);
                }
            }
            Constraint::Distinct {
                names,
                by_request,
                stack,
                ..
            } => {
                if !applies(names, base, sub) {
                    return;
                }
                match semantics {
                    Semantics::GoCompat => by_request.retain(|(n, _)| n != base),
                    Semantics::Fixed => {
                        stack.pop();
                    }
                }
            }
        }
    }
}

// -------------------------------------------------------------------- taints (§2.11)

fn tolerates(t: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
        && e != taint.effect
    {
        return false;
    }
    if let Some(k) = t.key.as_deref().filter(|k| !k.is_empty())
        && k != taint.key
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "Exists" => true,
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

pub(crate) fn taint_blocks(
    taints: &[DeviceTaint],
    tolerations: Option<&[DeviceToleration]>,
) -> bool {
    taints.iter().any(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations
                .unwrap_or(&[])
                .iter()
                .any(|t| tolerates(t, taint))
    })
}

// -------------------------------------------------------------------- search (§2.4)

#[derive(Clone, Copy, Debug, Default)]
struct Location {
    pool: usize,
    slice: usize,
    device: usize,
}

/// Why the search stops early. Boxed so that the search's results fit in registers.
enum Stop {
    MaxSize,
    Fatal(Box<AllocError>),
}

impl From<AllocError> for Stop {
    fn from(e: AllocError) -> Self {
        Stop::Fatal(Box::new(e))
    }
}

struct DeviceResult<'a> {
    req: &'a str,
    parent: Option<&'a str>,
    claim: usize,
    request: usize,
    sub: usize,
    cand: Candidate,
    share_id: Option<String>,
    consumed: Option<BTreeMap<&'a str, Quantity>>,
    admin: bool,
}

/// What a successful `allocate_device` must undo on backtrack, besides what its result record
/// (`Search::results[results_len]`) says. Small, so that it is returned in registers.
#[derive(Clone, Copy)]
struct Undo {
    results_len: u32,
    multi: bool,
    created_capacity_entry: bool,
    paid_counters: bool,
}

struct Search<'r, 'a> {
    alloc: &'r Allocator<'a>,
    node: &'r Node,
    pools: &'r [Pool<'a>],
    claims: &'r [&'a ResourceClaim],
    requests: &'r [ClaimRequests<'a>],
    /// Constraint states of all claims, claim `c` at `requests[c].cons`.
    constraints: Vec<Constraint<'a>>,
    /// (claim, request, subrequest) chosen for requests with subrequests, in success order.
    selected: Vec<(usize, usize, usize)>,
    /// Exclusive allocations of this attempt as (device, claim) pairs (Go: `allocating`). At
    /// most 32 per claim, so a scan beats hashing.
    allocating: Vec<(u32, u32)>,
    allocating_capacity: FastMap<u32, BTreeMap<&'a str, i128>>,
    /// Counter state per counter key (Go: `consumedCounters`), located through
    /// `counter_keys`; `last_counter_key` short-cuts the usual single pool.
    consumed_counters: Vec<CounterUse>,
    counter_keys: FastMap<u32, usize>,
    last_counter_key: Option<(u32, usize)>,
    /// Results of all claims in allocation order (the search finishes a claim before the next
    /// one and backtracks in reverse, so each claim's results are contiguous).
    results: Vec<DeviceResult<'a>>,
    /// Where the current claim's results start in `results`.
    claim_base: usize,
    steps: u64,
    budget: u64,
    deadline: Option<Instant>,
}

impl<'r, 'a> Search<'r, 'a> {
    fn new(
        alloc: &'r Allocator<'a>,
        node: &'r Node,
        pools: &'r [Pool<'a>],
        claims: &'r [&'a ResourceClaim],
        requests: &'r [ClaimRequests<'a>],
        options: &AllocateOptions,
    ) -> Self {
        let constraints = requests
            .iter()
            .flat_map(|c| c.constraints.iter())
            .map(|k| match k {
                Constraint::Match { names, attr, .. } => Constraint::Match {
                    names: Arc::clone(names),
                    attr,
                    first: None,
                    count: 0,
                },
                Constraint::Distinct { names, attr, .. } => Constraint::Distinct {
                    names: Arc::clone(names),
                    attr,
                    by_request: Vec::new(),
                    stack: Vec::new(),
                },
            })
            .collect();
        Search {
            alloc,
            node,
            pools,
            claims,
            requests,
            constraints,
            selected: Vec::new(),
            allocating: Vec::new(),
            allocating_capacity: FastMap::default(),
            consumed_counters: Vec::new(),
            counter_keys: FastMap::default(),
            last_counter_key: None,
            results: Vec::new(),
            claim_base: 0,
            steps: 0,
            budget: options.step_budget,
            deadline: options.deadline,
        }
    }

    fn device(&self, c: Candidate) -> &'r DeviceData<'a> {
        &self.alloc.snap.slices[c.slice as usize].devices[c.device as usize]
    }

    #[inline]
    fn in_use(&self, gid: u32) -> bool {
        self.alloc.allocated.exclusive.contains(gid)
            || self.allocating.iter().any(|&(g, _)| g == gid)
    }

    #[inline]
    fn allocating_for_claim(&self, gid: u32, claim: usize) -> bool {
        self.allocating
            .iter()
            .any(|&(g, c)| g == gid && c as usize == claim)
    }

    #[inline]
    fn capacity_ok(&self, req: &RequestData<'a>, dev: &DeviceData<'a>) -> Result<bool, ()> {
        if dev.capacity.is_empty() {
            // What `capacity_fits` answers without any capacity to compare.
            return match req.capacity_requests.as_deref() {
                Some(r) if !r.is_empty() => Err(()),
                _ => Ok(true),
            };
        }
        self.capacity_ok_slow(req, dev)
    }

    fn capacity_ok_slow(&self, req: &RequestData<'a>, dev: &DeviceData<'a>) -> Result<bool, ()> {
        let empty = BTreeMap::new();
        let committed = self
            .alloc
            .allocated
            .capacity
            .get(&dev.gid)
            .unwrap_or(&empty);
        capacity_fits(
            committed,
            req.capacity_requests.as_deref(),
            dev,
            self.allocating_capacity.get(&dev.gid),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn allocate_one(
        &mut self,
        c: usize,
        r: usize,
        s: usize,
        k: i64,
        in_sub: bool,
        start: Location,
    ) -> Result<bool, Stop> {
        self.steps += 1;
        if self.steps > self.budget {
            return Err(Stop::from(AllocError::new(
                ErrorClass::Timeout,
                format!(
                    "filter operation aborted: allocation step budget of {} search steps exceeded",
                    self.budget
                ),
            )));
        }
        if self.steps.is_multiple_of(1024)
            && let Some(d) = self.deadline
            && Instant::now() >= d
        {
            return Err(Stop::from(AllocError::new(
                ErrorClass::Timeout,
                "filter operation aborted: context deadline exceeded",
            )));
        }
        if c >= self.claims.len() {
            return Ok(true);
        }
        let claim_reqs = &self.requests[c];
        if r >= claim_reqs.slots.len() {
            let base = std::mem::replace(&mut self.claim_base, self.results.len());
            let next = self.allocate_one(c + 1, 0, 0, 0, false, Location::default());
            self.claim_base = base;
            return match next {
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        }
        let slot = &claim_reqs.slots[r];
        if let (RequestSlot::Sub(subs), false) = (slot, in_sub) {
            let mut all_exceeded = true;
            for si in 0..subs.len() {
                match self.allocate_one(c, r, si, 0, true, Location::default()) {
                    Err(Stop::MaxSize) => continue,
                    Err(e) => return Err(e),
                    Ok(true) => {
                        self.selected.push((c, r, si));
                        return Ok(true);
                    }
                    Ok(false) => all_exceeded = false,
                }
            }
            return if all_exceeded {
                Err(Stop::MaxSize)
            } else {
                Ok(false)
            };
        }
        let Some(req) = slot.get(s) else {
            return Ok(false);
        };
        if req.all_mode && req.all_devices.is_empty() {
            return Ok(false);
        }
        if k >= req.num_devices {
            return self.allocate_one(c, r + 1, 0, 0, false, Location::default());
        }
        let after = (self.results.len() - self.claim_base) as i64 + req.num_devices - k;
        if after > ALLOCATION_RESULTS_MAX_SIZE {
            return Err(Stop::MaxSize);
        }
        if req.all_mode {
            let cand = req.all_devices[k as usize];
            let Some(undo) = self.allocate_device(req, cand, true)? else {
                return Ok(false);
            };
            let done = self.allocate_one(c, r, s, k + 1, in_sub, Location::default());
            match done {
                Ok(true) => Ok(true),
                other => {
                    self.rollback(undo);
                    other
                }
            }
        } else {
            for pi in start.pool..self.pools.len() {
                let pool = &self.pools[pi];
                if pool.incomplete || pool.invalid {
                    continue;
                }
                let slice_start = if pi == start.pool { start.slice } else { 0 };
                for sli in slice_start..pool.device_slices.len() {
                    let sl = pool.device_slices[sli];
                    let devices = &self.alloc.snap.slices[sl as usize].devices;
                    let dev_start = if pi == start.pool && sli == start.slice {
                        start.device
                    } else {
                        0
                    };
                    for (di, dev) in devices.iter().enumerate().skip(dev_start) {
                        if req.admin {
                            if self.allocating_for_claim(dev.gid, c) {
                                continue;
                            }
                        } else if self.in_use(dev.gid) {
                            continue;
                        }
                        if !self.alloc.is_selectable(
                            self.node,
                            &self.requests[c].cref,
                            req,
                            sl,
                            dev,
                        )? {
                            continue;
                        }
                        if self.alloc.features.consumable_capacity
                            && self.capacity_ok(req, dev) != Ok(true)
                        {
                            continue;
                        }
                        let cand = Candidate {
                            pool: pi as u32,
                            slice: sl,
                            device: di as u32,
                        };
                        let Some(undo) = self.allocate_device(req, cand, false)? else {
                            continue;
                        };
                        let next = Location {
                            pool: pi,
                            slice: sli,
                            device: di + 1,
                        };
                        match self.allocate_one(c, r, s, k + 1, in_sub, next) {
                            Ok(true) => return Ok(true),
                            Ok(false) => self.rollback(undo),
                            Err(e) => {
                                self.rollback(undo);
                                return Err(e);
                            }
                        }
                    }
                }
            }
            Ok(false)
        }
    }

    /// Go: `allocateDevice`. `Ok(None)` = rejected.
    fn allocate_device(
        &mut self,
        req: &RequestData<'a>,
        cand: Candidate,
        must: bool,
    ) -> Result<Option<Undo>, Stop> {
        let f = self.alloc.features;
        let compat = self.alloc.semantics == Semantics::GoCompat;
        let dev = self.device(cand);
        let c = req.claim;
        let multi = f.consumable_capacity && dev.allow_multi;
        if !multi && req.admin && self.allocating_for_claim(dev.gid, c) {
            return Ok(None);
        }
        if !req.admin && self.in_use(dev.gid) {
            return Ok(None);
        }
        if !f.partitionable_devices && !dev.consumes.is_empty() {
            return Ok(None);
        }
        let skip_counters = multi
            && (self.alloc.allocated.capacity.contains_key(&dev.gid)
                || self.allocating_capacity.contains_key(&dev.gid));
        let mut paid_counters = false;
        if !skip_counters && !dev.consumes.is_empty() {
            if !self.reserve_counters(cand) {
                return Ok(None);
            }
            paid_counters = true;
        }
        let base = req.base_name();
        let sub = req.sub_name();
        if f.device_taints && !dev.taints.is_empty() && taint_blocks(dev.taints, req.tolerations) {
            // Upstream bug (#140436): Go keeps the counters reserved above; we release them.
            if paid_counters && !compat {
                self.release_counters(cand);
            }
            return Ok(None);
        }
        let driver = self.alloc.snap.slices[cand.slice as usize].driver;
        let semantics = self.alloc.semantics;
        let (cons_start, cons_end) = self.requests[c].cons;
        for i in cons_start..cons_end {
            if !self.constraints[i].add(semantics, base, sub, dev.raw, driver) {
                if must {
                    return Err(Stop::from(AllocError::new(
                        ErrorClass::ConstraintMust,
                        format!(
                            "claim {}, request {}: cannot add device {}/{}/{} because a claim constraint would not be satisfied",
                            self.requests[c].cref,
                            req.name,
                            driver,
                            self.alloc.snap.slices[cand.slice as usize].pool,
                            dev.raw.name
                        ),
                    )));
                }
                for e in cons_start..i {
                    self.constraints[e].remove(semantics, base, sub);
                }
                // Upstream bug (#140436): counters leak here in Go; we release them.
                if paid_counters && !compat {
                    self.release_counters(cand);
                }
                return Ok(None);
            }
        }
        // Go also creates an empty entry for shared devices; only non-empty ones matter.
        if !multi {
            self.allocating.push((dev.gid, c as u32));
        }
        let mut consumed = None;
        let mut share_id = None;
        let mut created_capacity_entry = false;
        if f.consumable_capacity {
            if self.capacity_ok(req, dev) != Ok(true) {
                // Go rejects here without undoing the steps above (only reachable in All mode).
                if !compat {
                    for e in cons_start..cons_end {
                        self.constraints[e].remove(semantics, base, sub);
                    }
                    self.unallocate(dev.gid, c);
                    if paid_counters {
                        self.release_counters(cand);
                    }
                }
                return Ok(None);
            }
            if multi {
                let mut amounts = Vec::with_capacity(dev.capacity.len());
                for (name, cap) in &dev.capacity {
                    let requested = req
                        .capacity_requests
                        .as_ref()
                        .and_then(|r| r.iter().find(|(n, _)| n == name))
                        .map(|(_, q)| q);
                    amounts.push((*name, consumed_amount(requested, cap)));
                }
                share_id = Some(uuid::Uuid::new_v4().to_string());
                created_capacity_entry = !self.allocating_capacity.contains_key(&dev.gid);
                let entry = self.allocating_capacity.entry(dev.gid).or_default();
                for (name, q) in &amounts {
                    *entry.entry(name).or_insert(0) += q.nanos();
                }
                consumed = Some(amounts);
            }
        }
        let results_len = self.results.len() as u32;
        let consumed_map = consumed
            .filter(|a| !a.is_empty())
            .map(|a| a.into_iter().collect::<BTreeMap<_, _>>());
        self.results.push(DeviceResult {
            req: req.name,
            parent: req.parent,
            claim: c,
            request: req.request,
            sub: req.sub,
            cand,
            share_id,
            consumed: consumed_map,
            admin: req.admin,
        });
        Ok(Some(Undo {
            results_len,
            multi,
            created_capacity_entry,
            paid_counters,
        }))
    }

    fn rollback(&mut self, undo: Undo) {
        let compat = self.alloc.semantics == Semantics::GoCompat;
        let semantics = self.alloc.semantics;
        let at = undo.results_len as usize;
        let Some(r) = self.results.get(at) else {
            return;
        };
        let (claim, cand) = (r.claim, r.cand);
        let (base, sub) = (r.parent.unwrap_or(r.req), r.parent.map(|_| r.req));
        let gid = self.device(cand).gid;
        let (cons_start, cons_end) = self.requests[claim].cons;
        for con in &mut self.constraints[cons_start..cons_end] {
            con.remove(semantics, base, sub);
        }
        self.unallocate(gid, claim);
        if undo.multi {
            // The record holds the consumed amounts when there are any.
            match &self.results[at].consumed {
                Some(amounts) => {
                    if let Some(entry) = self.allocating_capacity.get_mut(&gid) {
                        for (name, q) in amounts {
                            if let Some(x) = entry.get_mut(name) {
                                *x -= q.nanos();
                            }
                        }
                        if entry.values().all(|v| *v == 0) {
                            self.allocating_capacity.remove(&gid);
                        }
                    }
                }
                None => {
                    // Go never removes the empty entry (spec §7 #26); with the fix below
                    // (counters released) the stale entry would skip counters, so drop it.
                    if !compat && undo.created_capacity_entry {
                        self.allocating_capacity.remove(&gid);
                    }
                }
            }
            // Upstream bug (#140436): Go does not release a share's counters on rollback.
            if !compat && undo.paid_counters {
                self.release_counters(cand);
            }
        } else if self.alloc.features.partitionable_devices && undo.paid_counters {
            self.release_counters(cand);
        }
        self.results.truncate(at);
    }

    /// Removes the latest exclusive allocation of `gid` for `claim`, if any.
    fn unallocate(&mut self, gid: u32, claim: usize) {
        if let Some(pos) = self
            .allocating
            .iter()
            .rposition(|&(g, c)| g == gid && c as usize == claim)
        {
            self.allocating.remove(pos);
        }
    }

    /// The counter state of a pool's counter key, created on first use.
    #[inline]
    fn counter_use(&mut self, pool: &Pool<'a>) -> usize {
        let key = self.alloc.counter_key(pool);
        if let Some((k, i)) = self.last_counter_key
            && k == key
        {
            return i;
        }
        self.counter_use_slow(pool, key)
    }

    fn counter_use_slow(&mut self, pool: &Pool<'a>, key: u32) -> usize {
        let i = match self.counter_keys.get(&key) {
            Some(&i) => i,
            None => {
                let compat = self.alloc.semantics == Semantics::GoCompat;
                let available = self.alloc.available_counters(pool);
                self.consumed_counters
                    .push(CounterUse::new(&available, compat));
                let i = self.consumed_counters.len() - 1;
                self.counter_keys.insert(key, i);
                i
            }
        };
        self.last_counter_key = Some((key, i));
        i
    }

    /// Go: `checkAvailableCounters`.
    fn reserve_counters(&mut self, cand: Candidate) -> bool {
        let pool = &self.pools[cand.pool as usize];
        let i = self.counter_use(pool);
        let compat = self.alloc.semantics == Semantics::GoCompat;
        let dev = self.device(cand);
        let usage = &mut self.consumed_counters[i];
        for &(fixed, go, v) in &dev.counter_ids {
            usage.change(if compat { go } else { fixed }, v);
        }
        // Go checks every counter of the pool after adding the device's consumption
        // (`checkAvailableCounters`); `over` counts the counters above their limit.
        if usage.over > 0 {
            for &(fixed, go, v) in &dev.counter_ids {
                usage.change(if compat { go } else { fixed }, -v);
            }
            return false;
        }
        true
    }

    fn release_counters(&mut self, cand: Candidate) {
        let pool = &self.pools[cand.pool as usize];
        let i = self.counter_use(pool);
        let compat = self.alloc.semantics == Semantics::GoCompat;
        let dev = self.device(cand);
        let usage = &mut self.consumed_counters[i];
        for &(fixed, go, v) in &dev.counter_ids {
            usage.change(if compat { go } else { fixed }, -v);
        }
    }

    // ---------------------------------------------------------------- results (§2.13)

    fn build_results(&self) -> Result<Vec<AllocationResult>> {
        let f = self.alloc.features;
        let node_name = self.node.metadata.name.as_deref().unwrap_or("");
        let mut out = Vec::with_capacity(self.claims.len());
        for (ci, claim) in self.claims.iter().enumerate() {
            let mine = self.claim_results(ci);
            let mut results = Vec::with_capacity(mine.len());
            for r in mine {
                let dev = self.device(r.cand);
                let slice = &self.alloc.snap.slices[r.cand.slice as usize];
                let req = self.requests[ci].slots[r.request].get(r.sub);
                results.push(DeviceRequestAllocationResult {
                    request: match r.parent {
                        Some(p) => format!("{p}/{}", r.req),
                        None => r.req.to_string(),
                    },
                    driver: slice.driver.to_string(),
                    pool: slice.pool.to_string(),
                    device: dev.raw.name.clone(),
                    admin_access: r.admin.then_some(true),
                    tolerations: req
                        .and_then(|q| q.tolerations)
                        .map(<[DeviceToleration]>::to_vec),
                    share_id: r.share_id.clone(),
                    consumed_capacity: r
                        .consumed
                        .as_ref()
                        .map(|m| m.iter().map(|(k, v)| (k.to_string(), v.to_k8s())).collect()),
                    binding_conditions: if f.device_binding_and_status {
                        dev.raw.binding_conditions.clone()
                    } else {
                        None
                    },
                    binding_failure_conditions: if f.device_binding_and_status {
                        dev.raw.binding_failure_conditions.clone()
                    } else {
                        None
                    },
                });
            }
            let config = self.build_config(ci, claim);
            let node_selector = self.node_selector(ci, node_name).map_err(|e| {
                AllocError::new(
                    ErrorClass::NodeSelectorTerms,
                    format!(
                        "create NodeSelector for claim {}: {e}",
                        claim.metadata.name.as_deref().unwrap_or("")
                    ),
                )
            })?;
            out.push(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    config,
                    results: Some(results),
                }),
                node_selector,
            });
        }
        Ok(out)
    }

    /// The results of claim `ci` (contiguous, see `results`).
    fn claim_results(&self, ci: usize) -> &[DeviceResult<'a>] {
        let start = self.results.partition_point(|r| r.claim < ci);
        let end = self.results.partition_point(|r| r.claim <= ci);
        &self.results[start..end]
    }

    fn selected_data(&self, ci: usize, ri: usize) -> Option<&RequestData<'a>> {
        let sub = self
            .selected
            .iter()
            .find(|&&(c, r, _)| c == ci && r == ri)
            .map_or(0, |&(_, _, s)| s);
        self.requests[ci].slots[ri].get(sub)
    }

    fn build_config(
        &self,
        ci: usize,
        claim: &ResourceClaim,
    ) -> Option<Vec<DeviceAllocationConfiguration>> {
        let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut class_ranges: HashMap<&str, (usize, usize)> = HashMap::new();
        let requests = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.requests.as_deref())
            .unwrap_or(&[]);
        for ri in 0..requests.len() {
            let Some(data) = self.selected_data(ci, ri) else {
                continue;
            };
            let class_name = data.class.metadata.name.as_deref().unwrap_or("");
            if let Some(&(start, end)) = class_ranges.get(class_name) {
                for c in &mut config[start..end] {
                    c.requests
                        .get_or_insert_with(Vec::new)
                        .push(data.full_name());
                }
                continue;
            }
            let start = config.len();
            for cc in data.class.spec.config.iter().flatten() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".to_string(),
                    requests: Some(vec![data.full_name()]),
                    opaque: cc.opaque.clone(),
                });
            }
            class_ranges.insert(class_name, (start, config.len()));
        }
        let claim_configs = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.config.as_deref())
            .unwrap_or(&[]);
        for cc in claim_configs {
            let names = cc.requests.as_deref().unwrap_or(&[]);
            let emit = |config: &mut Vec<DeviceAllocationConfiguration>| {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".to_string(),
                    requests: cc.requests.clone(),
                    opaque: cc.opaque.clone(),
                })
            };
            if names.is_empty() {
                emit(&mut config);
                continue;
            }
            for (ri, request) in requests.iter().enumerate() {
                if names.contains(&request.name) {
                    emit(&mut config);
                    continue;
                }
                let Some(data) = self.selected_data(ci, ri) else {
                    continue;
                };
                if data.parent.is_none() {
                    continue;
                }
                if names.iter().any(|n| *n == data.full_name()) {
                    emit(&mut config);
                }
            }
        }
        if config.is_empty() {
            None
        } else {
            Some(config)
        }
    }

    fn node_selector(&self, ci: usize, node_name: &str) -> Result<Option<NodeSelector>, String> {
        let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
        let mut exprs: Vec<NodeSelectorRequirement> = Vec::new();
        for r in self.claim_results(ci) {
            let dev = self.device(r.cand);
            let slice = &self.alloc.snap.slices[r.cand.slice as usize];
            let (name, sel) = if slice.per_device == Some(true) {
                (dev.raw.node_name.as_ref(), dev.raw.node_selector.as_ref())
            } else {
                (
                    slice.raw.spec.node_name.as_ref(),
                    slice.raw.spec.node_selector.as_ref(),
                )
            };
            if name.is_some() || dev.binds_to_node {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: None,
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".to_string(),
                            operator: "In".to_string(),
                            values: Some(vec![node_name.to_string()]),
                        }]),
                    }],
                }));
            }
            if let Some(sel) = sel {
                match sel.node_selector_terms.len() {
                    0 => {}
                    1 => {
                        let t = &sel.node_selector_terms[0];
                        merge_requirements(t.match_fields.as_deref().unwrap_or(&[]), &mut fields);
                        merge_requirements(
                            t.match_expressions.as_deref().unwrap_or(&[]),
                            &mut exprs,
                        );
                    }
                    n => {
                        return Err(format!(
                            "unsupported ResourceSlice.NodeSelector with {n} terms"
                        ));
                    }
                }
            }
        }
        if fields.is_empty() && exprs.is_empty() {
            return Ok(None);
        }
        Ok(Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: if exprs.is_empty() { None } else { Some(exprs) },
                match_fields: if fields.is_empty() {
                    None
                } else {
                    Some(fields)
                },
            }],
        }))
    }
}

fn merge_requirements(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for r in from {
        let values: HashSet<&String> = r.values.iter().flatten().collect();
        let present = to.iter().any(|e| {
            e.key == r.key
                && e.operator == r.operator
                && e.values.iter().flatten().collect::<HashSet<_>>() == values
        });
        if !present {
            to.push(r.clone());
        }
    }
}
