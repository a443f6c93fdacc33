//! Bounded LRU cache of compiled selectors, keyed by expression text.
//!
//! Like `DRA/cel/cache.go`: only successful compilations are stored, so a failing
//! expression is compiled (and reported) again on every use. Upstream's scheduler cache
//! holds 10 entries; ours defaults to more because a lookup is cheap and a cluster has
//! more than ten distinct selectors.

use std::collections::HashMap;
use std::sync::Arc;

pub(crate) struct LruCache<V> {
    capacity: usize,
    clock: u64,
    entries: HashMap<String, (u64, Arc<V>)>,
}

impl<V> LruCache<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        LruCache {
            capacity: capacity.max(1),
            clock: 0,
            entries: HashMap::new(),
        }
    }

    pub(crate) fn get(&mut self, key: &str) -> Option<Arc<V>> {
        self.clock += 1;
        let now = self.clock;
        self.entries.get_mut(key).map(|(used, v)| {
            *used = now;
            v.clone()
        })
    }

    pub(crate) fn insert(&mut self, key: String, value: Arc<V>) {
        self.clock += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            // Evicting scans the cache; it only happens on a miss, which compiles anyway.
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (self.clock, value));
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
