//! The prepared, immutable view of classes and slices shared by the allocators of many pods,
//! with the selector outcome cache; the input side of `NewAllocator` in
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`
//! (spec `structured-allocator.md` §2.1).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceSlice};

use super::data::{CapacityData, DeviceData, GatherKey, Pool, Result, SliceData, parse_q};
use crate::fasthash::FastMap;
use crate::nodesel::NodeMatchSpec;
use crate::selector::{SelectorCache, evaluate};
use crate::types::AllocError;

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

/// The prepared, immutable view of the cluster's classes and slices, shared by the allocators of
/// many pods (Go rebuilds all of this for every pod and node). It also caches the outcome of
/// every selector expression on every device it has been evaluated on: a device's attributes
/// cannot change inside a snapshot, and outcomes (errors included) are only reported when the
/// search reaches the (device, request) pair, so the caching does not change results (§2.5).
pub struct ClusterSnapshot<'a> {
    pub(crate) classes: FastMap<&'a str, &'a DeviceClass>,
    pub(crate) slices: Vec<SliceData<'a>>,
    pub(super) on_node: FastMap<&'a str, Vec<u32>>,
    pub(super) by_pool: FastMap<(&'a str, &'a str), Vec<u32>>,
    /// Per slice, its pool's rank in (driver, pool name) order.
    pub(super) pool_rank: Vec<u32>,
    /// Per slice, the rank of its pool name alone (GoCompat counter key, bug #23).
    pub(super) pool_name_rank: Vec<u32>,
    /// Gathered pools per set of relevant slices (Go redoes this for every node and pod; the
    /// result depends only on which slices are relevant, not on the node itself).
    pub(super) gathered: Mutex<FastMap<GatherKey, Arc<Vec<Pool<'a>>>>>,
    /// The same, lock-free, for the common views "one node-dependent relevant slice" (per
    /// slice) and "none", per PartitionableDevices gate (`[off, on]`).
    pub(super) gathered_single: Vec<[OnceLock<Arc<Vec<Pool<'a>>>>; 2]>,
    pub(super) gathered_static: [OnceLock<Arc<Vec<Pool<'a>>>>; 2],
    /// Per gate, the shared slices relevant on every node (counter slices, `allNodes`), and
    /// those whose relevance depends on the node (node selector, per-device selection), both
    /// in input order. Other shared slices are relevant on no node.
    pub(super) shared_static: [Vec<u32>; 2],
    pub(super) shared_dynamic: [Vec<u32>; 2],
    pub(super) gids: FastMap<(&'a str, &'a str, &'a str), u32>,
    pub(super) instances: u32,
    pub(super) setup_error: Option<AllocError>,
    pub(super) selectors: Arc<SelectorCache>,
    pub(super) exprs: Mutex<HashMap<String, Arc<ExprSlot>>>,
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
    Compile(devicelet_cel::CelCompileError),
    Runtime(devicelet_cel::CelEvalError),
}

/// One compiled selector expression and its outcome per device instance
/// (0 = not evaluated, 1 = false, 2 = true, 3 = runtime error kept in `errors`).
pub(crate) struct ExprSlot {
    program:
        std::result::Result<Arc<devicelet_cel::CompiledSelector>, devicelet_cel::CelCompileError>,
    results: Vec<AtomicU8>,
    errors: Mutex<HashMap<u32, devicelet_cel::CelEvalError>>,
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

impl<'a> ClusterSnapshot<'a> {
    /// Prepares classes and slices once (slice partition, interned device IDs, parsed
    /// quantities, compiled node selectors). Malformed quantities are reported by every later
    /// allocation call as [`ErrorClass::InvalidInput`](crate::types::ErrorClass::InvalidInput).
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
                    numa: numa_mask(dev),
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

/// The standard attribute naming a device's NUMA node(s) (KEP-6072; an int, or a list of ints
/// with KEP-5491's list-type attributes).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// The NUMA nodes `dev` names in [`NUMA_NODE_ATTRIBUTE`] as a bit mask (ids 0-63); 0 when it
/// names none in that range (the device is then on no particular NUMA node).
pub fn numa_mask(dev: &k8s_openapi::api::resource::v1::Device) -> u64 {
    let Some(attr) = dev
        .attributes
        .as_ref()
        .and_then(|a| a.get(NUMA_NODE_ATTRIBUTE))
    else {
        return 0;
    };
    attr.int
        .iter()
        .chain(attr.ints.iter().flatten())
        .filter(|&&n| (0..64).contains(&n))
        .fold(0u64, |m, &n| m | (1u64 << n))
}
