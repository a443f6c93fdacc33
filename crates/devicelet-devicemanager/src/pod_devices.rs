//! Allocation bookkeeping of admitted pods, following `dm/pod_devices.go` (`podDevices`,
//! `devices()`), the init-container reuse pool of `Allocate` (`dm/manager.go`, spec §2 C1),
//! garbage collection of inactive pods (`UpdateAllocatedDevices`, C7) and the preconditions of
//! `devicesToAllocate` (C3). Pure state; the manager adds locking, RPCs and persistence.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use crate::allocation::AllocationError;
use tracing::warn;

use crate::cached_response::CachedResponse;
use crate::types::{ContainerAllocateResponse, DeviceSpec, Mount};

/// What the runtime must inject into a container (DESIGN.md `start` JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunContainerOptions {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Mounts, unique by container path.
    pub mounts: Vec<Mount>,
    /// Device nodes, unique by container path.
    pub devices: Vec<DeviceSpec>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// CDI device names, deduplicated.
    pub cdi_devices: Vec<String>,
    /// The container's CPU set (`cpuset.cpus`) under the static CPU manager policy: its
    /// exclusive CPUs, else the shared pool. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpuset_cpus: Option<String>,
    /// The container's memory nodes (`cpuset.mems`) under the Static memory manager policy:
    /// the NUMA nodes of its memory blocks, comma-separated as the kubelet writes them.
    /// Absent when its memory is not pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpuset_mems: Option<String>,
}

/// Merges cached `Allocate` answers (spec §2 D2): first value wins for env and annotation
/// keys and for mount and device container paths (conflicts are logged and dropped); CDI
/// names are deduplicated. Upstream visits resources in random map order; we use the order
/// given (resource name order), one valid instance of it.
pub fn merge_responses<'a>(
    responses: impl IntoIterator<Item = (&'a str, &'a ContainerAllocateResponse)>,
) -> RunContainerOptions {
    let mut merged = RunContainerOptions::default();
    for (resource, response) in responses {
        for (key, value) in &response.envs {
            match merged.envs.get(key) {
                Some(existing) if existing != value => {
                    warn!(resource, key = %key, kept = %existing, dropped = %value, "environment variable conflict");
                }
                Some(_) => {}
                None => {
                    merged.envs.insert(key.clone(), value.clone());
                }
            }
        }
        for (key, value) in &response.annotations {
            match merged.annotations.get(key) {
                Some(existing) if existing != value => {
                    warn!(resource, key = %key, kept = %existing, dropped = %value, "annotation conflict");
                }
                Some(_) => {}
                None => {
                    merged.annotations.insert(key.clone(), value.clone());
                }
            }
        }
        for mount in &response.mounts {
            match merged
                .mounts
                .iter()
                .find(|m| m.container_path == mount.container_path)
            {
                Some(existing) if existing.host_path != mount.host_path => {
                    warn!(resource, path = %mount.container_path, "mount conflict; keeping the first");
                }
                Some(_) => {}
                None => merged.mounts.push(mount.clone()),
            }
        }
        for device in &response.devices {
            match merged
                .devices
                .iter()
                .find(|d| d.container_path == device.container_path)
            {
                Some(existing) if existing.host_path != device.host_path => {
                    warn!(resource, path = %device.container_path, "device node conflict; keeping the first");
                }
                Some(_) => {}
                None => merged.devices.push(device.clone()),
            }
        }
        for name in &response.cdi_devices {
            if !merged.cdi_devices.contains(name) {
                merged.cdi_devices.push(name.clone());
            }
        }
    }
    merged
}

/// What one container holds of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAllocation {
    /// Device IDs, in allocation order.
    pub device_ids: Vec<String>,
    /// Device IDs per NUMA node at allocation time; `-1` for devices without topology.
    pub devices_per_numa: BTreeMap<i64, Vec<String>>,
    /// The plugin's `Allocate` answer for this container (`container_responses[0]`); after a
    /// restart, the checkpoint's bytes until first used.
    pub response: CachedResponse,
}

/// What one pod holds: container → resource → allocation.
pub type PodAllocations = BTreeMap<String, BTreeMap<String, ResourceAllocation>>;

/// pod UID → container → resource → allocation.
///
/// Each pod's allocations sit behind an `Arc`, so a reader (the PodResources API building a
/// `List` of thousands of pods) can take a pod under the Device Manager's lock by bumping a
/// reference count and build its answer after releasing it; a write copies a pod's map only
/// while such a reader still holds it. Building under the lock let a low-priority reader,
/// preempted inside it, hold up admissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDevices {
    pods: BTreeMap<String, Arc<PodAllocations>>,
}

impl PodDevices {
    /// Records (replaces) what a container holds of a resource.
    pub fn insert(
        &mut self,
        pod_uid: &str,
        container: &str,
        resource: &str,
        allocation: ResourceAllocation,
    ) {
        self.insert_owned(
            pod_uid.to_owned(),
            container.to_owned(),
            resource.to_owned(),
            allocation,
        );
    }

    /// Like [`PodDevices::insert`] with owned keys (restart restores every entry this way).
    pub fn insert_owned(
        &mut self,
        pod_uid: String,
        container: String,
        resource: String,
        allocation: ResourceAllocation,
    ) {
        Arc::make_mut(self.pods.entry(pod_uid).or_default())
            .entry(container)
            .or_default()
            .insert(resource, allocation);
    }

    /// What a container holds of a resource.
    pub fn get(
        &self,
        pod_uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<&ResourceAllocation> {
        self.pods.get(pod_uid)?.get(container)?.get(resource)
    }

    /// What a container holds of a resource, to update in place.
    pub fn get_mut(
        &mut self,
        pod_uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<&mut ResourceAllocation> {
        Arc::make_mut(self.pods.get_mut(pod_uid)?)
            .get_mut(container)?
            .get_mut(resource)
    }

    /// Every resource a container holds.
    pub fn container(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Option<&BTreeMap<String, ResourceAllocation>> {
        self.pods.get(pod_uid)?.get(container)
    }

    /// Pod UIDs with allocations.
    pub fn pod_uids(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    /// True when the pod has an entry.
    pub fn has_pod(&self, pod_uid: &str) -> bool {
        self.pods.contains_key(pod_uid)
    }

    /// Drops what a container holds of one resource (rollback of a failed admission).
    pub fn remove_resource(&mut self, pod_uid: &str, container: &str, resource: &str) {
        if let Some(pod) = self.pods.get_mut(pod_uid) {
            let containers = Arc::make_mut(pod);
            if let Some(resources) = containers.get_mut(container) {
                resources.remove(resource);
                if resources.is_empty() {
                    containers.remove(container);
                }
            }
            if containers.is_empty() {
                self.pods.remove(pod_uid);
            }
        }
    }

    /// Forgets a pod; returns whether it had an entry.
    pub fn remove_pod(&mut self, pod_uid: &str) -> bool {
        self.take_pod(pod_uid).is_some()
    }

    /// Forgets a pod and returns what it held (container → resource → allocation).
    pub fn take_pod(&mut self, pod_uid: &str) -> Option<PodAllocations> {
        self.pods.remove(pod_uid).map(Arc::unwrap_or_clone)
    }

    /// Keeps only `active` pods (`UpdateAllocatedDevices`); returns the UIDs removed.
    pub fn retain_active(&mut self, active: &HashSet<String>) -> Vec<String> {
        let removed: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !active.contains(*uid))
            .cloned()
            .collect();
        for uid in &removed {
            self.pods.remove(uid);
        }
        removed
    }

    /// Every (container, resource, allocation) of a pod.
    pub fn pod(&self, pod_uid: &str) -> Option<&PodAllocations> {
        self.pods.get(pod_uid).map(Arc::as_ref)
    }

    /// A pod's allocations, shared: cheap to take under a lock and read after releasing it.
    pub fn pod_shared(&self, pod_uid: &str) -> Option<Arc<PodAllocations>> {
        self.pods.get(pod_uid).cloned()
    }

    /// `allocatedDevices` rebuilt from the entries (C8): a key for every resource that appears,
    /// devices only from entries with a cached response.
    pub fn allocated_devices(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut allocated: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for containers in self.pods.values() {
            for resources in containers.values() {
                for (resource, allocation) in resources {
                    let set = allocated.entry(resource.clone()).or_default();
                    if allocation.response.is_some() {
                        set.extend(allocation.device_ids.iter().cloned());
                    }
                }
            }
        }
        allocated
    }
}

/// The init-container reuse pool (C1): devices of regular init containers that later
/// containers of the *same* pod take first. Holds one pod at a time, in memory only.
#[derive(Debug, Clone, Default)]
pub struct ReusePool {
    pod_uid: Option<String>,
    devices: BTreeMap<String, Vec<String>>,
}

impl ReusePool {
    /// Switches to `pod_uid`, dropping another pod's pool.
    pub fn select_pod(&mut self, pod_uid: &str) {
        if self.pod_uid.as_deref() != Some(pod_uid) {
            self.pod_uid = Some(pod_uid.to_owned());
            self.devices.clear();
        }
    }

    /// Devices of `resource` available for reuse, in the order they were added.
    pub fn reusable(&self, resource: &str) -> &[String] {
        self.devices.get(resource).map_or(&[], Vec::as_slice)
    }

    /// A regular init container finished allocating: its devices join the pool (set union).
    pub fn add(&mut self, resource: &str, device_ids: &[String]) {
        let pool = self.devices.entry(resource.to_owned()).or_default();
        for id in device_ids {
            if !pool.contains(id) {
                pool.push(id.clone());
            }
        }
    }

    /// A sidecar or app container took devices: they leave the pool.
    pub fn remove(&mut self, resource: &str, device_ids: &[String]) {
        if let Some(pool) = self.devices.get_mut(resource) {
            pool.retain(|id| !device_ids.contains(id));
        }
    }
}

/// What `devicesToAllocate` must do after its preconditions (C3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    /// Nothing to allocate and no RPC (container restart, or kubelet-restart shortcut).
    Nothing,
    /// Pick this many devices.
    Pick(usize),
}

/// The resource's device state as the preconditions see it.
#[derive(Clone, Copy)]
pub struct ResourceHealth<'a> {
    /// Healthy device count.
    pub healthy_count: usize,
    /// Whether a device ID is currently healthy.
    pub is_healthy: &'a dyn Fn(&str) -> bool,
}

/// C3 steps 1-6 in the kubelet's order. `health` is `None` for a resource no plugin has
/// sent devices for; `already_running` is the kubelet-restart shortcut (step 2).
pub fn check_preconditions(
    pod_uid: &str,
    container: &str,
    resource: &str,
    required: usize,
    already: Option<&[String]>,
    already_running: bool,
    health: Option<ResourceHealth<'_>>,
) -> Result<Needed, AllocationError> {
    let had = already.map_or(0, <[String]>::len);
    if already.is_some() && had != required {
        return Err(AllocationError::ChangedRequest {
            pod_uid: pod_uid.to_owned(),
            container: container.to_owned(),
            resource: resource.to_owned(),
            had,
            required,
        });
    }
    if already_running {
        return Ok(Needed::Nothing);
    }
    let Some(health) = health else {
        return Err(AllocationError::Unregistered {
            resource: resource.to_owned(),
        });
    };
    if health.healthy_count == 0 {
        return Err(AllocationError::NoHealthyDevices {
            resource: resource.to_owned(),
        });
    }
    if let Some(ids) = already
        && !ids.iter().all(|id| (health.is_healthy)(id))
    {
        return Err(AllocationError::PreviouslyAllocatedUnhealthy {
            resource: resource.to_owned(),
        });
    }
    let needed = required - had.min(required);
    Ok(if needed == 0 {
        Needed::Nothing
    } else {
        Needed::Pick(needed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn alloc(list: &[&str], with_response: bool) -> ResourceAllocation {
        ResourceAllocation {
            device_ids: ids(list),
            devices_per_numa: BTreeMap::new(),
            response: with_response
                .then(ContainerAllocateResponse::default)
                .into(),
        }
    }

    #[test]
    fn d2_merge_first_value_wins_and_cdi_names_are_deduplicated() {
        let mut a = ContainerAllocateResponse::default();
        a.envs.insert("K".into(), "a".into());
        a.annotations.insert("ann".into(), "a".into());
        a.mounts.push(Mount {
            container_path: "/m".into(),
            host_path: "/ha".into(),
            read_only: true,
        });
        a.devices.push(DeviceSpec {
            container_path: "/dev/x".into(),
            host_path: "/dev/a".into(),
            permissions: "rw".into(),
        });
        a.cdi_devices = vec!["v.com/c=a".into(), "v.com/c=shared".into()];
        let mut b = ContainerAllocateResponse::default();
        b.envs.insert("K".into(), "b".into());
        b.envs.insert("L".into(), "b".into());
        b.annotations.insert("ann".into(), "b".into());
        b.mounts.push(Mount {
            container_path: "/m".into(),
            host_path: "/hb".into(),
            read_only: false,
        });
        b.devices.push(DeviceSpec {
            container_path: "/dev/x".into(),
            host_path: "/dev/b".into(),
            permissions: "r".into(),
        });
        b.cdi_devices = vec!["v.com/c=shared".into(), "v.com/c=b".into()];
        let merged = merge_responses([("r1", &a), ("r2", &b)]);
        assert_eq!(merged.envs["K"], "a");
        assert_eq!(merged.envs["L"], "b");
        assert_eq!(merged.annotations["ann"], "a");
        assert_eq!(merged.mounts.len(), 1);
        assert_eq!(merged.mounts[0].host_path, "/ha");
        assert_eq!(merged.devices.len(), 1);
        assert_eq!(merged.devices[0].host_path, "/dev/a");
        assert_eq!(
            merged.cdi_devices,
            ["v.com/c=a", "v.com/c=shared", "v.com/c=b"]
        );
        let json = serde_json::to_value(&merged).unwrap();
        assert_eq!(json["mounts"][0]["containerPath"], "/m");
        assert_eq!(json["cdiDevices"][2], "v.com/c=b");
    }

    #[test]
    fn c8_allocated_devices_has_keys_for_all_resources_devices_only_with_response() {
        let mut pods = PodDevices::default();
        pods.insert("p1", "c1", "r1", alloc(&["a", "b"], true));
        pods.insert("p2", "c1", "r1", alloc(&["c"], true));
        pods.insert("p2", "c2", "r2", alloc(&["z"], false));
        let allocated = pods.allocated_devices();
        assert_eq!(
            allocated["r1"],
            ["a", "b", "c"].map(String::from).into_iter().collect()
        );
        assert!(allocated["r2"].is_empty());
    }

    #[test]
    fn c7_retain_active_removes_inactive_pods() {
        let mut pods = PodDevices::default();
        pods.insert("p1", "c", "r", alloc(&["a"], true));
        pods.insert("p2", "c", "r", alloc(&["b"], true));
        let active: HashSet<String> = ["p2".to_owned()].into();
        assert_eq!(pods.retain_active(&active), ids(&["p1"]));
        assert_eq!(
            pods.allocated_devices()["r"],
            ["b".to_owned()].into_iter().collect()
        );
    }

    #[test]
    fn c1_reuse_pool_holds_one_pod_init_adds_app_and_sidecar_remove() {
        let mut pool = ReusePool::default();
        pool.select_pod("p1");
        pool.add("r", &ids(&["a"]));
        pool.add("r", &ids(&["a", "b"]));
        assert_eq!(pool.reusable("r"), ids(&["a", "b"]));
        pool.remove("r", &ids(&["a"]));
        assert_eq!(pool.reusable("r"), ids(&["b"]));
        pool.select_pod("p1");
        assert_eq!(pool.reusable("r"), ids(&["b"]));
        pool.select_pod("p2");
        assert!(pool.reusable("r").is_empty());
    }

    #[test]
    fn c3_preconditions_run_in_kubelet_order() {
        let healthy = |id: &str| id != "bad";
        let health = Some(ResourceHealth {
            healthy_count: 2,
            is_healthy: &healthy,
        });
        let none_healthy = Some(ResourceHealth {
            healthy_count: 0,
            is_healthy: &healthy,
        });
        // Step 1 before everything.
        let had = ids(&["a"]);
        assert!(matches!(
            check_preconditions("u", "c", "r", 2, Some(&had), true, None),
            Err(AllocationError::ChangedRequest {
                had: 1,
                required: 2,
                ..
            })
        ));
        // Step 2: running container after a restart skips health checks.
        assert_eq!(
            check_preconditions("u", "c", "r", 1, None, true, None),
            Ok(Needed::Nothing)
        );
        // Step 3.
        assert!(matches!(
            check_preconditions("u", "c", "r", 1, None, false, None),
            Err(AllocationError::Unregistered { .. })
        ));
        // Step 4, even for a zero request (§7 item 7).
        assert!(matches!(
            check_preconditions("u", "c", "r", 0, None, false, none_healthy),
            Err(AllocationError::NoHealthyDevices { .. })
        ));
        // Step 5.
        let bad = ids(&["bad"]);
        assert!(matches!(
            check_preconditions("u", "c", "r", 1, Some(&bad), false, health),
            Err(AllocationError::PreviouslyAllocatedUnhealthy { .. })
        ));
        // Step 6: already holds all it needs → no RPC.
        assert_eq!(
            check_preconditions("u", "c", "r", 1, Some(&had), false, health),
            Ok(Needed::Nothing)
        );
        assert_eq!(
            check_preconditions("u", "c", "r", 3, None, false, health),
            Ok(Needed::Pick(3))
        );
        assert_eq!(
            check_preconditions("u", "c", "r", 0, None, false, health),
            Ok(Needed::Nothing)
        );
    }
}
