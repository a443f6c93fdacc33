//! What the scheduler benches share: a cache holding a `devicelet_allocator::workloads`
//! cluster, each node with room for every pod (32 CPUs, 128Gi, 1 000 pods).

use std::collections::BTreeMap;

use devicelet_allocator::workloads::Workload;
use devicelet_scheduler::cache::ClusterCache;
use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A cache with `w`'s classes, slices and nodes.
pub fn cache_of(w: &Workload) -> ClusterCache {
    let mut cache = ClusterCache::new();
    for c in &w.classes {
        cache.upsert_class(c.clone());
    }
    for s in &w.slices {
        cache.upsert_slice(s.clone());
    }
    for n in &w.nodes {
        let mut n = n.clone();
        n.status = Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("32".into())),
                ("memory".to_owned(), Quantity("128Gi".into())),
                ("pods".to_owned(), Quantity("1000".into())),
            ])),
            ..NodeStatus::default()
        });
        cache.upsert_node(n);
    }
    cache
}
