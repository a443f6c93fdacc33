//! The depth-first first-fit search (spec `structured-allocator.md` §2.4-§2.12), following
//! `allocateOne`, `allocateDevice` and `deallocateDevice` in
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`, in Go's exact visiting order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::capacity::{capacity_fits, consumed_amount};
use super::constraints::Constraint;
use super::counters::CounterUse;
use super::data::{ALLOCATION_RESULTS_MAX_SIZE, DeviceData, Pool, Result};
use super::request::{Candidate, ClaimRequests, RequestData, RequestSlot};
use super::state::Allocator;
use super::taints::taint_blocks;
use crate::fasthash::FastMap;
use crate::quantity::Quantity;
use crate::types::{
    AllocError, AllocateOptions, Clock, ErrorClass, RandomShareIds, Semantics, ShareIdSource,
    TIME_CHECK_INTERVAL,
};

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Location {
    /// With [`AllocateOptions::pack_partitions`]: 0 while partitions of devices in use are
    /// tried, 1 for the rest; always 0 otherwise.
    pub(super) phase: usize,
    pub(super) pool: usize,
    pub(super) slice: usize,
    pub(super) device: usize,
}

/// Why the search stops early. Boxed so that the search's results fit in registers.
pub(super) enum Stop {
    MaxSize,
    Fatal(Box<AllocError>),
}

impl From<AllocError> for Stop {
    fn from(e: AllocError) -> Self {
        Stop::Fatal(Box::new(e))
    }
}

pub(super) struct DeviceResult<'a> {
    pub(super) req: &'a str,
    pub(super) parent: Option<&'a str>,
    pub(super) claim: usize,
    pub(super) request: usize,
    pub(super) sub: usize,
    pub(super) cand: Candidate,
    pub(super) share_id: Option<String>,
    pub(super) consumed: Option<BTreeMap<&'a str, Quantity>>,
    pub(super) admin: bool,
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

pub(super) struct Search<'r, 'a> {
    pub(super) alloc: &'r Allocator<'a>,
    pub(super) node: &'r Node,
    pub(super) pools: &'r [Pool<'a>],
    pub(super) claims: &'r [&'a ResourceClaim],
    pub(super) requests: &'r [ClaimRequests<'a>],
    /// Constraint states of all claims, claim `c` at `requests[c].cons`.
    pub(super) constraints: Vec<Constraint<'a>>,
    /// (claim, request, subrequest) chosen for requests with subrequests, in success order.
    pub(super) selected: Vec<(usize, usize, usize)>,
    /// Exclusive allocations of this attempt as (device, claim) pairs (Go: `allocating`). At
    /// most 32 per claim, so a scan beats hashing.
    pub(super) allocating: Vec<(u32, u32)>,
    pub(super) allocating_capacity: FastMap<u32, BTreeMap<&'a str, i128>>,
    /// Counter state per counter key (Go: `consumedCounters`), located through
    /// `counter_keys`; `last_counter_key` short-cuts the usual single pool.
    pub(super) consumed_counters: Vec<CounterUse>,
    pub(super) counter_keys: FastMap<u32, usize>,
    pub(super) last_counter_key: Option<(u32, usize)>,
    /// Results of all claims in allocation order (the search finishes a claim before the next
    /// one and backtracks in reverse, so each claim's results are contiguous).
    pub(super) results: Vec<DeviceResult<'a>>,
    /// Where the current claim's results start in `results`.
    pub(super) claim_base: usize,
    pub(super) steps: u64,
    pub(super) budget: u64,
    /// The time limit: the clock and the reading at which the call gives up.
    pub(super) deadline: Option<(&'r dyn Clock, Duration)>,
    /// Source of shareIDs (`None`: random UUIDs like Go).
    pub(super) share_ids: Option<&'r dyn ShareIdSource>,
    /// 2 with [`AllocateOptions::pack_partitions`], else 1: the passes over the devices.
    phases: usize,
    /// Per pool index, the counter sets that allocated devices consume (computed on first
    /// use, with `pack_partitions` only).
    used_sets: FastMap<usize, Vec<&'a str>>,
    /// [`AllocateOptions::numa_node`] as a mask; every bit set without it.
    numa_allowed: u64,
}

impl<'r, 'a> Search<'r, 'a> {
    pub(super) fn new(
        alloc: &'r Allocator<'a>,
        node: &'r Node,
        pools: &'r [Pool<'a>],
        claims: &'r [&'a ResourceClaim],
        requests: &'r [ClaimRequests<'a>],
        options: &'r AllocateOptions,
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
            budget: options.step_budget.unwrap_or(u64::MAX),
            deadline: options.time_limit.as_ref().map(|t| {
                let clock: &'r dyn Clock = t.clock.as_ref();
                (clock, clock.now().saturating_add(t.limit))
            }),
            share_ids: options.share_ids.as_deref(),
            phases: if options.pack_partitions { 2 } else { 1 },
            used_sets: FastMap::default(),
            numa_allowed: options
                .numa_node
                .filter(|&n| n < 64)
                .map_or(u64::MAX, |n| 1u64 << n),
        }
    }

    /// Whether `dev` of pool `pi` consumes a counter set that an allocated device consumes too:
    /// a partition of a physical device already in use (tried first when packing).
    fn on_used_counters(&mut self, pi: usize, dev: &DeviceData<'a>) -> bool {
        if dev.consumes.is_empty() {
            return false;
        }
        let alloc = self.alloc;
        let pool = &self.pools[pi];
        let used = self.used_sets.entry(pi).or_insert_with(|| {
            let mut used: Vec<&'a str> = Vec::new();
            for &si in pool.device_slices.iter().chain(pool.not_visible.iter()) {
                for d in &alloc.snap.slices[si as usize].devices {
                    if alloc.allocated.any.contains(d.gid) {
                        for (set, _) in &d.consumes {
                            if !used.contains(set) {
                                used.push(set);
                            }
                        }
                    }
                }
            }
            used
        });
        dev.consumes.iter().any(|(set, _)| used.contains(set))
    }

    pub(super) fn device(&self, c: Candidate) -> &'r DeviceData<'a> {
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
    pub(super) fn allocate_one(
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
        if self.steps.is_multiple_of(TIME_CHECK_INTERVAL)
            && let Some((clock, at)) = self.deadline
            && clock.now() >= at
        {
            // Go's text when the scheduler's Filter context expires; `--explain` names the limit.
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
            for phase in start.phase..self.phases {
                let here = phase == start.phase;
                let pool_start = if here { start.pool } else { 0 };
                for pi in pool_start..self.pools.len() {
                    let pool = &self.pools[pi];
                    if pool.incomplete || pool.invalid {
                        continue;
                    }
                    let slice_start = if here && pi == start.pool {
                        start.slice
                    } else {
                        0
                    };
                    for sli in slice_start..pool.device_slices.len() {
                        let sl = pool.device_slices[sli];
                        let devices = &self.alloc.snap.slices[sl as usize].devices;
                        let dev_start = if here && pi == start.pool && sli == start.slice {
                            start.device
                        } else {
                            0
                        };
                        for (di, dev) in devices.iter().enumerate().skip(dev_start) {
                            // Packing: partitions of devices in use in the first pass, the rest in
                            // the second.
                            if self.phases == 2 && self.on_used_counters(pi, dev) != (phase == 0) {
                                continue;
                            }
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
                                phase,
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
        if dev.numa != 0 && (dev.numa & self.numa_allowed) == 0 {
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
                share_id = Some(match self.share_ids {
                    Some(source) => source.next_share_id(),
                    None => RandomShareIds.next_share_id(),
                });
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
}
