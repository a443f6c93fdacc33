//! The allocator itself: the inputs prepared once per pod (snapshot, allocated state,
//! features) and the caches kept across calls (available counters, request setup), as held by
//! Go's `Allocator` in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`
//! (`NewAllocator`, `GetStats`, the `availableCounters` cache). The stages add their methods in
//! their own files; this file names only the data they share (`data`, `snapshot`,
//! `allocated`, `request`) and the counter table of `counters`, none of which names it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use super::allocated::AllocatedIndex;
use super::counters::AvailableCounters;
use super::data::{Pool, Result};
use super::request::Setup;
use super::snapshot::ClusterSnapshot;
use crate::fasthash::FastMap;
use crate::selector::SelectorCache;
use crate::types::{AllocatedState, Features, Semantics};

/// The allocator for one set of inputs (one pod in the scheduler).
pub struct Allocator<'a> {
    pub(crate) features: Features,
    pub(crate) semantics: Semantics,
    pub(crate) snap: Arc<ClusterSnapshot<'a>>,
    pub(super) allocated: Arc<AllocatedIndex>,
    pub(super) available_counters: Mutex<FastMap<u32, Arc<AvailableCounters<'a>>>>,
    /// Request setup (§2.3) of the claims of the first call, reused by later calls with the
    /// same claims when it cannot depend on the node (no All-mode request reached).
    pub(super) setup_cache: OnceLock<SetupCache<'a>>,
    pub(super) invocations: AtomicU64,
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

/// A node-independent request setup: the claims it was made for (by address: they are
/// borrowed for the allocator's lifetime, so equal addresses are the same unchanged objects)
/// and its outcome, error included (setup errors are returned before any search step).
pub(super) struct SetupCache<'a> {
    pub(super) claims: Vec<usize>,
    pub(super) outcome: Result<Arc<Setup<'a>>>,
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
        let t = Arc::new(AvailableCounters::new(&self.snap, &self.allocated, pool));
        if let Ok(mut m) = self.available_counters.lock() {
            return Arc::clone(m.entry(key).or_insert(t));
        }
        t
    }

    /// Upstream bug (#140434): Go keys counter state by pool name only, so two drivers with
    /// the same pool name share counters. We key by (driver, pool) unless GoCompat is selected.
    pub(super) fn counter_key(&self, pool: &Pool<'a>) -> u32 {
        match self.semantics {
            Semantics::GoCompat => pool.key_compat,
            Semantics::Fixed => pool.key_fixed,
        }
    }
}
