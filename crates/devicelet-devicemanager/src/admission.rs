//! Device allocation for one container at admission time, following `Allocate` and
//! `allocateContainerResources` in `pkg/kubelet/cm/devicemanager/manager.go` (spec §2 C1-C5,
//! §1.10): resources in name order, preconditions, picking with reuse and NUMA affinity,
//! `GetPreferredAllocation` when offered, one `Allocate` RPC per (container, resource).
//!
//! Differences from upstream, on purpose:
//! * `Allocate` and `GetPreferredAllocation` have a deadline (`allocate_timeout`).
//! * A failure leaves nothing behind: resources already allocated for this container in this
//!   call are dropped and the reservations released (upstream keeps them until GC, spec §7
//!   item 10).
//! * The manager lock is never held across an RPC; picked devices are reserved before the
//!   `Allocate` RPC, so concurrent admissions never get the same device.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use devicelet_topology::NumaMask;
use tracing::{debug, info};

use crate::allocation::{AllocationError, DevicePicker, has_topology};
use crate::error::{EndpointError, PluginError};
use crate::manager::DeviceManager;
use crate::pod_devices::{
    Needed, PodAllocations, ResourceAllocation, ResourceHealth, RunContainerOptions,
    check_preconditions, merge_responses,
};
use crate::types::{ContainerAllocateResponse, Health};

/// How a container takes part in the init-container reuse pool (C1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// Regular init container: its devices become reusable by later containers.
    Init,
    /// Restartable init container (`restartPolicy: Always`): keeps its devices.
    Sidecar,
    /// App container.
    App,
}

/// One container to allocate devices for.
#[derive(Debug, Clone)]
pub struct ContainerRequest {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub container: String,
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// Integer limits per resource (the kubelet reads limits only, rounded up).
    pub limits: BTreeMap<String, u64>,
    /// The topology hint's NUMA mask, if any.
    pub affinity: Option<NumaMask>,
}

/// Why a container could not get its devices.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// Picking failed (shortage, unhealthy, changed request, ...).
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// The plugin is gone (`unknown Device Plugin`, or a stopped endpoint).
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// `GetPreferredAllocation` failed.
    #[error("device plugin GetPreferredAllocation rpc failed with err: {source}")]
    Preferred {
        /// Resource.
        resource: String,
        /// RPC error.
        source: PluginError,
    },
    /// `Allocate` failed or answered nothing usable.
    #[error("device plugin Allocate rpc for {resource} failed with err: {source}")]
    Allocate {
        /// Resource.
        resource: String,
        /// RPC error.
        source: PluginError,
    },
    /// `PreStartContainer` failed, timed out, or there is nothing cached to send.
    #[error("device plugin PreStartContainer rpc failed with err: {source}")]
    PreStart {
        /// Resource.
        resource: String,
        /// RPC error.
        source: PluginError,
    },
    /// The device manager is stopped.
    #[error("device manager is stopped")]
    Stopped,
}

/// `KubeletPreStartContainerRPCTimeoutInSecs`.
pub const PRE_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Devices given to a container, per resource.
pub type ContainerDevices = BTreeMap<String, Vec<String>>;

impl DeviceManager {
    /// Allocates the container's device-plugin resources (resources no plugin knows are
    /// skipped, as the kubelet does; the caller rejects unknown extended resources earlier).
    /// Returns the devices per resource; on error nothing of this call remains.
    pub async fn allocate_container(
        &self,
        request: &ContainerRequest,
    ) -> Result<ContainerDevices, AdmissionError> {
        let mut done: Vec<(String, Vec<String>)> = Vec::new();
        let result = self.allocate_resources(request, &mut done).await;
        let mut state = self.inner.lock();
        match result {
            Ok(devices) => {
                state.reuse.select_pod(&request.pod_uid);
                for (resource, ids) in &devices {
                    match request.kind {
                        ContainerKind::Init => state.reuse.add(resource, ids),
                        ContainerKind::Sidecar | ContainerKind::App => {
                            state.reuse.remove(resource, ids)
                        }
                    }
                }
                drop(state);
                self.inner.notify();
                Ok(devices)
            }
            Err(err) => {
                for (resource, _) in &done {
                    state.pod_devices.remove_resource(
                        &request.pod_uid,
                        &request.container,
                        resource,
                    );
                }
                for (resource, ids) in &done {
                    state.release(&request.pod_uid, resource, ids);
                }
                Err(err)
            }
        }
    }

    async fn allocate_resources(
        &self,
        request: &ContainerRequest,
        done: &mut Vec<(String, Vec<String>)>,
    ) -> Result<ContainerDevices, AdmissionError> {
        let mut devices = ContainerDevices::new();
        for (resource, &required) in &request.limits {
            let required = usize::try_from(required).unwrap_or(usize::MAX);
            // Pick and reserve; only a GetPreferredAllocation RPC runs without the lock, and
            // if another admission took a device meanwhile the pick is redone.
            let mut attempts = 0;
            let chosen = loop {
                let Some(plan) = self.plan(request, resource, required)? else {
                    break None;
                };
                match plan {
                    Plan::Keep(ids) => {
                        devices.insert(resource.clone(), ids);
                        break None;
                    }
                    Plan::Reserved(ids) => break Some(ids),
                    Plan::AskPreferred(picker) => {
                        let ids = self.finish_pick(resource, picker).await?;
                        if self.try_reserve(resource, &ids) {
                            break Some(ids);
                        }
                        attempts += 1;
                        if attempts >= 3 {
                            return Err(AllocationError::AllocatedLess {
                                requested: required,
                                got: 0,
                            }
                            .into());
                        }
                    }
                }
            };
            let Some(chosen) = chosen else { continue };
            let (client, numa) = {
                let state = self.inner.lock();
                let entry = state.resources.get(resource);
                let client = entry.and_then(|e| {
                    e.endpoint
                        .client
                        .clone()
                        .filter(|_| e.endpoint.stopped_at.is_none())
                });
                (
                    client,
                    per_numa(entry.and_then(|e| e.devices.as_ref()), &chosen),
                )
            };
            done.push((resource.clone(), chosen.clone()));
            let Some(client) = client else {
                return Err(EndpointError::Stopped {
                    resource: resource.clone(),
                }
                .into());
            };
            let response = self.call_allocate(&*client, resource, &chosen).await?;
            self.record(request, resource, &chosen, numa, response);
            info!(resource = %resource, pod_uid = %request.pod_uid, container = %request.container,
                devices = ?chosen, "devices allocated");
            devices.insert(resource.clone(), chosen);
        }
        Ok(devices)
    }

    /// Preconditions and the first picking steps under the lock. `None`: not a device-plugin
    /// resource.
    fn plan(
        &self,
        request: &ContainerRequest,
        resource: &str,
        required: usize,
    ) -> Result<Option<Plan>, AdmissionError> {
        let mut state = self.inner.lock();
        let known = state
            .resources
            .get(resource)
            .is_some_and(|e| e.devices.is_some())
            || state.allocated.contains_key(resource);
        if !known {
            return Ok(None);
        }
        state.reuse.select_pod(&request.pod_uid);
        let already: Option<Vec<String>> = state
            .pod_devices
            .get(&request.pod_uid, &request.container, resource)
            .map(|a| a.device_ids.clone());
        let set = state
            .resources
            .get(resource)
            .and_then(|e| e.devices.as_ref());
        let is_healthy = |id: &str| {
            set.and_then(|s| s.get(id))
                .is_some_and(|d| d.health == Health::Healthy)
        };
        let health = set.map(|s| ResourceHealth {
            healthy_count: s.healthy_count(),
            is_healthy: &is_healthy,
        });
        let needed = check_preconditions(
            &request.pod_uid,
            &request.container,
            resource,
            required,
            already.as_deref(),
            false,
            health,
        )?;
        match needed {
            Needed::Nothing => Ok(Some(Plan::Keep(already.unwrap_or_default()))),
            Needed::Pick(_) => {
                let Some(set) = set else {
                    return Err(AllocationError::Unregistered {
                        resource: resource.to_owned(),
                    }
                    .into());
                };
                let reserved = state.allocated.get(resource);
                let preferred = state
                    .resources
                    .get(resource)
                    .and_then(|e| e.endpoint.options)
                    .is_some_and(|o| o.get_preferred_allocation_available);
                // Without a NUMA hint, reusable devices or a plugin preference, the kubelet's
                // order reduces to "the first free healthy devices in plugin order"; take them
                // without building the full free list, the affinity split and the preferred
                // request (each O(all devices of the resource), allocating every ID).
                if request.affinity.is_none()
                    && !preferred
                    && state.reuse.reusable(resource).is_empty()
                {
                    // Devices before the hint are all taken or unhealthy; the picks are the
                    // first free ones after it, so everything up to the last pick is taken next.
                    let start = set.free_hint();
                    let mut next_hint = start;
                    let chosen: Vec<String> = set.devices()[start..]
                        .iter()
                        .enumerate()
                        .filter(|(_, d)| {
                            d.health == Health::Healthy
                                && reserved.is_none_or(|r| !r.contains(&d.id))
                        })
                        .take(required)
                        .map(|(i, d)| {
                            next_hint = start + i + 1;
                            d.id.clone()
                        })
                        .collect();
                    if chosen.len() == required {
                        reserve(&mut state, resource, &chosen);
                        if let Some(d) = state
                            .resources
                            .get_mut(resource)
                            .and_then(|e| e.devices.as_mut())
                        {
                            d.set_free_hint(next_hint);
                        }
                        return Ok(Some(Plan::Reserved(chosen)));
                    }
                    // Too few: the full path below reports the exact counts.
                }
                let free: Vec<_> = set
                    .devices()
                    .iter()
                    .filter(|d| {
                        d.health == Health::Healthy && reserved.is_none_or(|r| !r.contains(&d.id))
                    })
                    .collect();
                let reusable = state.reuse.reusable(resource).to_vec();
                let picker = DevicePicker::new(
                    resource,
                    required,
                    &reusable,
                    &free,
                    request.affinity,
                    has_topology(set.devices()),
                )?;
                if preferred && picker.preferred_request().is_some() {
                    return Ok(Some(Plan::AskPreferred(picker)));
                }
                let chosen = picker.finish(None)?;
                reserve(&mut state, resource, &chosen);
                Ok(Some(Plan::Reserved(chosen)))
            }
        }
    }

    async fn finish_pick(
        &self,
        resource: &str,
        picker: DevicePicker,
    ) -> Result<Vec<String>, AdmissionError> {
        let answer = match picker.preferred_request() {
            None => None,
            Some(preferred_request) => {
                let (client, _) = self.endpoint_client(resource)?;
                let timeout = self.inner.config.allocate_timeout;
                match tokio::time::timeout(
                    timeout,
                    client.get_preferred_allocation(vec![preferred_request]),
                )
                .await
                {
                    Ok(Ok(mut answers)) => (!answers.is_empty()).then(|| answers.swap_remove(0)),
                    Ok(Err(source)) => {
                        return Err(AdmissionError::Preferred {
                            resource: resource.to_owned(),
                            source,
                        });
                    }
                    Err(_) => {
                        return Err(AdmissionError::Preferred {
                            resource: resource.to_owned(),
                            source: PluginError::DeadlineExceeded(timeout),
                        });
                    }
                }
            }
        };
        Ok(picker.finish(answer.as_deref())?)
    }

    /// Reserves `chosen` unless another admission took one of them (reused devices of this
    /// pod's init containers are shared on purpose).
    fn try_reserve(&self, resource: &str, chosen: &[String]) -> bool {
        let mut state = self.inner.lock();
        let reusable: HashSet<String> = state.reuse.reusable(resource).iter().cloned().collect();
        let taken = state.allocated.get(resource).is_some_and(|r| {
            chosen
                .iter()
                .any(|id| r.contains(id) && !reusable.contains(id))
        });
        if taken {
            debug!(
                resource,
                "device taken concurrently during GetPreferredAllocation; picking again"
            );
            return false;
        }
        reserve(&mut state, resource, chosen);
        true
    }

    /// One `Allocate` RPC for one container's devices, with the allocate deadline.
    async fn call_allocate(
        &self,
        client: &dyn crate::plugin::DevicePluginClient,
        resource: &str,
        ids: &[String],
    ) -> Result<ContainerAllocateResponse, AdmissionError> {
        let fail = |source| AdmissionError::Allocate {
            resource: resource.to_owned(),
            source,
        };
        let timeout = self.inner.config.allocate_timeout;
        match tokio::time::timeout(timeout, client.allocate(vec![ids.to_vec()])).await {
            Ok(Ok(mut responses)) if !responses.is_empty() => Ok(responses.swap_remove(0)),
            Ok(Ok(_)) => Err(fail(PluginError::InvalidResponse(
                "no containers return in allocation response".into(),
            ))),
            Ok(Err(source)) => Err(fail(source)),
            Err(_) => Err(fail(PluginError::DeadlineExceeded(timeout))),
        }
    }

    /// Spec §2 D1 `needsReAllocate`, for the one way a container can lack its runtime settings
    /// here: an entry restored from a checkpoint whose cached `Allocate` answer did not decode.
    /// The kubelet drops such an entry at restore and re-allocates at start, possibly other
    /// devices; devicelet kept the entry (who owns the devices is known) and asks the plugin
    /// again for the same devices. Returns whether any answer was replaced (the caller makes
    /// it durable).
    pub async fn refresh_lost_responses(
        &self,
        pod_uid: &str,
        container: &str,
        limits: &BTreeMap<String, u64>,
    ) -> Result<bool, AdmissionError> {
        let mut refreshed = false;
        for (resource, _) in limits.iter().filter(|(_, limit)| **limit > 0) {
            let lost = self
                .inner
                .lock()
                .pod_devices
                .get(pod_uid, container, resource)
                .filter(|a| a.response.is_none())
                .map(|a| a.device_ids.clone());
            let Some(ids) = lost else { continue };
            let (client, _) = self.endpoint_client(resource)?;
            let response = self.call_allocate(&*client, resource, &ids).await?;
            let mut state = self.inner.lock();
            if let Some(allocation) = state
                .pod_devices
                .get_mut(pod_uid, container, resource)
                .filter(|a| a.device_ids == ids)
            {
                allocation.response = response.into();
                refreshed = true;
                info!(resource = %resource, pod_uid = %pod_uid, container = %container,
                    devices = ?ids, "runtime settings lost with the checkpoint asked for again");
            }
        }
        Ok(refreshed)
    }

    fn record(
        &self,
        request: &ContainerRequest,
        resource: &str,
        chosen: &[String],
        devices_per_numa: BTreeMap<i64, Vec<String>>,
        response: ContainerAllocateResponse,
    ) {
        let mut state = self.inner.lock();
        state.pod_devices.insert(
            &request.pod_uid,
            &request.container,
            resource,
            ResourceAllocation {
                device_ids: chosen.to_vec(),
                devices_per_numa,
                response: response.into(),
            },
        );
    }

    /// Runtime settings for a container start (`GetDeviceRunContainerOptions`, spec §2 D1):
    /// `PreStartContainer` first (30 s deadline) for every resource with a non-zero limit
    /// whose plugin asked for it, then the merged cached `Allocate` answers. `None` when the
    /// container holds no devices.
    pub async fn run_container_options(
        &self,
        pod_uid: &str,
        container: &str,
        limits: &BTreeMap<String, u64>,
    ) -> Result<Option<RunContainerOptions>, AdmissionError> {
        let held = self.container_allocations(pod_uid, container);
        for (resource, &limit) in limits {
            if limit == 0 {
                continue;
            }
            let pre_start = {
                let state = self.inner.lock();
                state.resources.get(resource).map(|e| {
                    (
                        e.endpoint.options.is_some_and(|o| o.pre_start_required),
                        e.endpoint
                            .client
                            .clone()
                            .filter(|_| e.endpoint.stopped_at.is_none()),
                    )
                })
            };
            let Some((true, client)) = pre_start else {
                continue;
            };
            let Some(ids) = held.get(resource).map(|a| a.device_ids.clone()) else {
                return Err(AdmissionError::PreStart {
                    resource: resource.clone(),
                    source: PluginError::InvalidResponse(format!(
                        "no devices found allocated in local cache for pod {pod_uid}, container {container}, resource {resource}"
                    )),
                });
            };
            let Some(client) = client else {
                return Err(EndpointError::Stopped {
                    resource: resource.clone(),
                }
                .into());
            };
            match tokio::time::timeout(PRE_START_TIMEOUT, client.pre_start_container(ids)).await {
                Ok(Ok(())) => {}
                Ok(Err(source)) => {
                    return Err(AdmissionError::PreStart {
                        resource: resource.clone(),
                        source,
                    });
                }
                Err(_) => {
                    return Err(AdmissionError::PreStart {
                        resource: resource.clone(),
                        source: PluginError::DeadlineExceeded(PRE_START_TIMEOUT),
                    });
                }
            }
        }
        if held.is_empty() {
            return Ok(None);
        }
        Ok(Some(merge_responses(held.iter().filter_map(
            |(resource, a)| a.response.get().map(|r| (resource.as_str(), r)),
        ))))
    }

    /// Frees a pod's devices (`devicelet remove`); returns whether it held any.
    pub fn remove_pod(&self, pod_uid: &str) -> bool {
        let mut state = self.inner.lock();
        let removed = state.forget_pod(pod_uid);
        drop(state);
        if removed {
            self.inner.notify();
        }
        removed
    }

    /// Keeps only `active` pods (`UpdateAllocatedDevices`, C7); returns the UIDs freed.
    pub fn retain_active_pods(&self, active: &HashSet<String>) -> Vec<String> {
        let mut state = self.inner.lock();
        let removed: Vec<String> = state
            .pod_devices
            .pod_uids()
            .filter(|uid| !active.contains(*uid))
            .map(str::to_owned)
            .collect();
        for uid in &removed {
            state.forget_pod(uid);
        }
        drop(state);
        if !removed.is_empty() {
            self.inner.notify();
        }
        removed
    }

    /// Puts allocations read from a checkpoint back (spec §3.4): no RPC is made, the devices
    /// count as allocated and the cached responses serve `start`. Unlike the kubelet, an entry
    /// whose cached response could not be decoded (`response: None`) still holds its devices:
    /// who owns them is known, only the runtime settings are lost.
    pub fn restore_allocations<I>(&self, entries: I)
    where
        I: IntoIterator<Item = (String, String, String, ResourceAllocation)>,
    {
        let mut state = self.inner.lock();
        for (pod_uid, container, resource, allocation) in entries {
            let allocated = match state.allocated.get_mut(&resource) {
                Some(set) => set,
                None => state.allocated.entry(resource.clone()).or_default(),
            };
            allocated.extend(allocation.device_ids.iter().cloned());
            state
                .pod_devices
                .insert_owned(pod_uid, container, resource, allocation);
        }
        drop(state);
        self.inner.notify();
    }

    /// Pod UIDs holding devices.
    pub fn pods_with_devices(&self) -> Vec<String> {
        self.inner
            .lock()
            .pod_devices
            .pod_uids()
            .map(str::to_owned)
            .collect()
    }

    /// What a pod holds, shared (see [`PodDevices`]): the lock is held only to take a
    /// reference, so readers building large answers never hold up admissions.
    pub fn pod_allocations(&self, pod_uid: &str) -> Option<Arc<PodAllocations>> {
        self.inner.lock().pod_devices.pod_shared(pod_uid)
    }

    /// Devices and cached `Allocate` answers a container holds.
    pub fn container_allocations(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> BTreeMap<String, ResourceAllocation> {
        self.inner
            .lock()
            .pod_devices
            .container(pod_uid, container)
            .cloned()
            .unwrap_or_default()
    }
}

enum Plan {
    /// The container already holds its devices (restart path): no RPC.
    Keep(Vec<String>),
    /// Devices picked and reserved.
    Reserved(Vec<String>),
    /// Picking needs the plugin's preference first.
    AskPreferred(DevicePicker),
}

fn reserve(state: &mut crate::manager::State, resource: &str, chosen: &[String]) {
    state
        .allocated
        .entry(resource.to_owned())
        .or_default()
        .extend(chosen.iter().cloned());
}

/// `DevicesPerNUMA`: each device under each of its NUMA IDs, or `-1` without topology
/// (topology as known at allocation time; a device missing from the list counts as none,
/// where Go would dereference nil, spec §7 item 17).
fn per_numa(
    set: Option<&crate::inventory::ResourceDevices>,
    chosen: &[String],
) -> BTreeMap<i64, Vec<String>> {
    let mut map: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for id in chosen {
        let nodes = set
            .and_then(|s| s.get(id))
            .and_then(|d| d.numa_nodes.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| vec![-1]);
        for node in nodes {
            map.entry(node).or_default().push(id.clone());
        }
    }
    map
}
