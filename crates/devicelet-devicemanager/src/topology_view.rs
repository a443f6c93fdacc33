//! What the device manager's topology hints read from its state, after
//! `pkg/kubelet/cm/devicemanager/topology_hints.go` (`GetTopologyHints`, `GetPodTopologyHints`,
//! spec devicemanager.md §4.7): every device of a resource with its NUMA nodes, the healthy
//! devices nobody holds, the pod's init-container reuse pool, and what the container (or the
//! whole pod) already holds. Hint generation itself is pure code in `devicelet-topology`; this
//! only takes one consistent copy under the manager's lock.

use std::collections::BTreeSet;

use crate::manager::DeviceManager;
use crate::types::Health;

/// One resource as the hint generator sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceTopologyView {
    /// Every device of the resource (healthy or not, held or not) with its reported NUMA
    /// nodes (`None`: no `TopologyInfo`).
    pub devices: Vec<(String, Option<Vec<i64>>)>,
    /// Healthy devices not given out or reserved (`healthyDevices − allocatedDevices`).
    pub free: Vec<String>,
    /// The pod's reusable init-container devices (empty unless asked for).
    pub reusable: Vec<String>,
    /// Devices the given containers already hold (the restart path of §4.7 step 3.2).
    pub held: Vec<String>,
}

impl DeviceManager {
    /// The view of `resource` for hints about `containers` of pod `pod_uid`: one container for
    /// the container scope (with `with_reuse`), every container of the pod for the pod scope
    /// (no reuse pool, as upstream). `None` when no plugin has sent devices for the resource.
    pub fn topology_view(
        &self,
        pod_uid: &str,
        containers: &[&str],
        resource: &str,
        with_reuse: bool,
    ) -> Option<ResourceTopologyView> {
        let state = self.inner.lock();
        let set = state.resources.get(resource)?.devices.as_ref()?;
        let taken = state.allocated.get(resource);
        let devices = set
            .devices()
            .iter()
            .map(|d| (d.id.clone(), d.numa_nodes.clone()))
            .collect();
        let free = set
            .devices()
            .iter()
            .filter(|d| d.health == Health::Healthy && taken.is_none_or(|t| !t.contains(&d.id)))
            .map(|d| d.id.clone())
            .collect();
        let reusable = if with_reuse {
            // The pool holds one pod at a time; another pod's pool is no pool for this one.
            let mut pool = state.reuse.clone();
            pool.select_pod(pod_uid);
            pool.reusable(resource).to_vec()
        } else {
            Vec::new()
        };
        let mut held = BTreeSet::new();
        for container in containers {
            if let Some(a) = state.pod_devices.get(pod_uid, container, resource) {
                held.extend(a.device_ids.iter().cloned());
            }
        }
        Some(ResourceTopologyView {
            devices,
            free,
            reusable,
            held: held.into_iter().collect(),
        })
    }
}
