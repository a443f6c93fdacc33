//! Shared counters (spec `structured-allocator.md` §2.8): the available counters of a pool and
//! the consumption of the devices being allocated, following `availableCounters` and
//! `checkAvailableCounters` in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use super::allocated::AllocatedIndex;
use super::data::Pool;
use super::snapshot::ClusterSnapshot;
use crate::fasthash::FastMap;

type CounterTable<'a> = Vec<(&'a str, Vec<(&'a str, i128)>)>;

/// Available counters of one pool (Go: `availableCounters`), by name (for `explain`) and
/// flattened in the same order with interned IDs (for the search).
#[derive(Debug)]
pub(crate) struct AvailableCounters<'a> {
    pub table: CounterTable<'a>,
    /// (Fixed ID, GoCompat ID, available) per counter, in `table` order.
    pub(super) ids: Vec<(u32, u32, i128)>,
}

/// Counter consumption of the devices being allocated in one pool (one counter key): per
/// counter (available, used), and how many counters are above their limit, so the check of
/// all counters of the pool that Go does per candidate is one comparison.
#[derive(Debug)]
pub(super) struct CounterUse {
    /// Available minus used per counter of the pool, in table order.
    slack: Vec<i128>,
    /// Counter ID (Fixed or GoCompat, per the allocator's semantics) minus `base` maps to
    /// position plus one (0: not a counter of this pool). A pool's IDs are interned together,
    /// so this is small; pools whose IDs are spread out use `index` instead.
    dense: Vec<u32>,
    base: u32,
    index: FastMap<u32, u32>,
    pub(super) over: usize,
}

impl CounterUse {
    pub(super) fn new(available: &AvailableCounters<'_>, compat: bool) -> Self {
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
    pub(super) fn change(&mut self, id: u32, delta: i128) {
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

impl<'a> AvailableCounters<'a> {
    /// The counters of `pool` left by the allocated devices of the other claims (Go:
    /// `availableCounters`); the allocator caches them per counter key.
    pub(super) fn new(
        snap: &ClusterSnapshot<'a>,
        allocated: &AllocatedIndex,
        pool: &Pool<'a>,
    ) -> Self {
        let mut table: CounterTable<'a> = pool
            .counter_sets
            .iter()
            .map(|&(si, k)| snap.slices[si as usize].shared_counters[k as usize].clone())
            .collect();
        for &si in pool.device_slices.iter().chain(pool.not_visible.iter()) {
            for d in &snap.slices[si as usize].devices {
                if !allocated.any.contains(d.gid) {
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
            .flat_map(|&(si, k)| snap.slices[si as usize].shared_counter_ids[k as usize].iter())
            .zip(table.iter().flat_map(|(_, c)| c.iter()))
            .map(|(&(f, c), &(_, avail))| (f, c, avail))
            .collect();
        AvailableCounters { table, ids }
    }
}
