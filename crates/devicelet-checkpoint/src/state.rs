//! devicelet's in-memory view of device allocations, and the changes the journal records.
//!
//! The shape mirrors the kubelet's `podDevices` (`pkg/kubelet/cm/devicemanager/pod_devices.go`):
//! pod UID → container name → resource name → (device IDs per NUMA node, cached
//! `ContainerAllocateResponse` bytes), plus the registered resources that the checkpoint keeps
//! (`RegisteredDevices`). Every [`Change`] overwrites or deletes keys, so replaying a journal is
//! deterministic and a replay of already-applied changes is harmless.
//!
//! The kubelet format has no pod names and no containers without devices, so devicelet also keeps
//! one [`PodRecord`] per admitted pod ([`DeviceState::pod_records`]). Those live only in the
//! journal (a compaction starts the new journal with a snapshot of them), never in the kubelet
//! file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::device::{DeviceCheckpointData, PodDevicesEntry};

/// Devices held by one container for one resource.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ContainerDevices {
    /// Device IDs per NUMA node (`-1` = no topology). A device on several nodes is listed under each.
    pub device_ids_by_numa: BTreeMap<i64, Vec<String>>,
    /// Protobuf bytes of the plugin's `ContainerAllocateResponse`.
    #[serde(with = "serde_base64")]
    pub alloc_resp: Vec<u8>,
}

/// One container of an admitted pod as devicelet's admitter sees it (not in the kubelet format).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// Container name.
    pub name: String,
    /// `init`, `sidecar` or `app`.
    pub kind: String,
    /// Device-plugin limits (integer counts) per resource, kept for `start`.
    #[serde(default)]
    pub limits: BTreeMap<String, u64>,
    /// Device IDs per resource, in allocation order.
    #[serde(default)]
    pub devices: BTreeMap<String, Vec<String>>,
    /// Exclusive CPUs as admitted (static CPU manager policy), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// NUMA nodes the container was aligned to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_affinity: Option<Vec<usize>>,
}

/// An admitted pod: identity and containers in admission order (devicelet's own state).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PodRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Containers in admission order (init containers first).
    #[serde(default)]
    pub containers: Vec<ContainerRecord>,
}

/// One durable change to the allocation state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// A container was given devices of one resource (replaces an earlier entry for the same key).
    AddContainer {
        /// Pod UID.
        pod_uid: String,
        /// Container name.
        container: String,
        /// Extended resource name.
        resource: String,
        /// Device IDs per NUMA node.
        device_ids_by_numa: BTreeMap<i64, Vec<String>>,
        /// `ContainerAllocateResponse` protobuf bytes.
        #[serde(with = "serde_base64")]
        alloc_resp: Vec<u8>,
    },
    /// A pod was admitted (devicelet's own record; replaces an earlier one for the same UID).
    SetPod {
        /// Pod UID.
        pod_uid: String,
        /// The pod.
        record: PodRecord,
    },
    /// The pod is gone; all its allocations are freed.
    RemovePod {
        /// Pod UID.
        pod_uid: String,
    },
    /// A resource is registered with these (healthy) device IDs.
    SetRegistered {
        /// Extended resource name.
        resource: String,
        /// Device IDs.
        device_ids: Vec<String>,
    },
    /// A resource is no longer registered (its plugin's grace period ended).
    RemoveRegistered {
        /// Extended resource name.
        resource: String,
    },
}

/// Why the store refuses a [`Change`] (or a batch of them) before writing anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidChange {
    /// A field that names something (pod UID, container, resource) is empty.
    #[error("{0} must not be empty")]
    EmptyField(&'static str),
    /// The batch would make a journal record larger than recovery accepts.
    #[error("commit batch of {bytes} bytes exceeds the journal record limit of {limit} bytes")]
    BatchTooLarge {
        /// Encoded size of the batch.
        bytes: usize,
        /// The journal's payload limit.
        limit: u32,
    },
}

impl Change {
    /// Checks the fields that must not be empty.
    pub fn validate(&self) -> Result<(), InvalidChange> {
        let empty = |field: &'static str| Err(InvalidChange::EmptyField(field));
        match self {
            Change::AddContainer {
                pod_uid,
                container,
                resource,
                ..
            } => {
                if pod_uid.is_empty() {
                    return empty("AddContainer.pod_uid");
                }
                if container.is_empty() {
                    return empty("AddContainer.container");
                }
                if resource.is_empty() {
                    return empty("AddContainer.resource");
                }
                Ok(())
            }
            Change::RemovePod { pod_uid } | Change::SetPod { pod_uid, .. }
                if pod_uid.is_empty() =>
            {
                empty("pod_uid")
            }
            Change::SetRegistered { resource, .. } | Change::RemoveRegistered { resource }
                if resource.is_empty() =>
            {
                empty("resource")
            }
            _ => Ok(()),
        }
    }
}

/// All allocations and registered resources.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeviceState {
    /// pod UID → container → resource → devices.
    pub pods: BTreeMap<String, BTreeMap<String, BTreeMap<String, ContainerDevices>>>,
    /// Registered resource → device IDs (on restore only the names matter, spec §3.4).
    pub registered: BTreeMap<String, Vec<String>>,
    /// devicelet's record of each admitted pod (journal only; not in the kubelet file).
    #[serde(default)]
    pub pod_records: BTreeMap<String, PodRecord>,
}

impl DeviceState {
    /// Applies one change.
    pub fn apply(&mut self, change: &Change) {
        self.apply_owned(change.clone());
    }

    /// Like [`DeviceState::apply`], moving the change's contents into the state (replay at
    /// restart builds the whole state this way, without a second copy).
    pub fn apply_owned(&mut self, change: Change) {
        match change {
            Change::AddContainer {
                pod_uid,
                container,
                resource,
                device_ids_by_numa,
                alloc_resp,
            } => {
                let devices = ContainerDevices {
                    device_ids_by_numa,
                    alloc_resp,
                };
                let containers = self.pods.entry(pod_uid).or_default();
                containers
                    .entry(container)
                    .or_default()
                    .insert(resource, devices);
            }
            Change::SetPod { pod_uid, record } => {
                self.pod_records.insert(pod_uid, record);
            }
            Change::RemovePod { pod_uid } => {
                self.pods.remove(&pod_uid);
                self.pod_records.remove(&pod_uid);
            }
            Change::SetRegistered {
                resource,
                device_ids,
            } => {
                self.registered.insert(resource, device_ids);
            }
            Change::RemoveRegistered { resource } => {
                self.registered.remove(&resource);
            }
        }
    }

    /// Applies only the part of `change` that the kubelet file does not hold (pod records). Used
    /// for journal records already folded into the kubelet file.
    pub fn apply_records_only(&mut self, change: Change) {
        match change {
            Change::SetPod { .. } => self.apply_owned(change),
            Change::RemovePod { pod_uid } => {
                self.pod_records.remove(&pod_uid);
            }
            _ => {}
        }
    }

    /// The pod records as changes (what a new journal starts with after a compaction).
    pub fn pod_record_changes(&self) -> Vec<Change> {
        self.pod_records
            .iter()
            .map(|(uid, record)| Change::SetPod {
                pod_uid: uid.clone(),
                record: record.clone(),
            })
            .collect()
    }

    /// Number of (pod, container, resource) entries — one checkpoint entry each.
    pub fn entry_count(&self) -> usize {
        self.pods
            .values()
            .map(|containers| containers.values().map(|r| r.len()).sum::<usize>())
            .sum()
    }

    /// The allocation of one container for one resource.
    pub fn get(&self, pod_uid: &str, container: &str, resource: &str) -> Option<&ContainerDevices> {
        self.pods.get(pod_uid)?.get(container)?.get(resource)
    }

    /// Builds the state from a decoded kubelet checkpoint, as the kubelet's `readCheckpoint`
    /// does: a nil list becomes empty, a missing `AllocResp` becomes empty bytes, later duplicates
    /// of the same key win.
    pub fn from_checkpoint(data: &DeviceCheckpointData) -> Self {
        let mut state = DeviceState::default();
        for e in data.pod_device_entries.iter().flatten() {
            let by_numa = e
                .device_ids
                .iter()
                .flatten()
                .map(|(numa, ids)| (*numa, ids.clone().unwrap_or_default()))
                .collect();
            state.apply(&Change::AddContainer {
                pod_uid: e.pod_uid.clone(),
                container: e.container_name.clone(),
                resource: e.resource_name.clone(),
                device_ids_by_numa: by_numa,
                alloc_resp: e.alloc_resp.clone().unwrap_or_default(),
            });
        }
        for (res, ids) in data.registered_devices.iter().flatten() {
            state
                .registered
                .insert(res.clone(), ids.clone().unwrap_or_default());
        }
        state
    }

    /// Like [`DeviceState::from_checkpoint`], consuming the data (no copies).
    pub fn from_checkpoint_owned(data: DeviceCheckpointData) -> Self {
        let mut state = DeviceState::default();
        for e in data.pod_device_entries.into_iter().flatten() {
            let devices = ContainerDevices {
                device_ids_by_numa: e
                    .device_ids
                    .into_iter()
                    .flatten()
                    .map(|(numa, ids)| (numa, ids.unwrap_or_default()))
                    .collect(),
                alloc_resp: e.alloc_resp.unwrap_or_default(),
            };
            state
                .pods
                .entry(e.pod_uid)
                .or_default()
                .entry(e.container_name)
                .or_default()
                .insert(e.resource_name, devices);
        }
        for (res, ids) in data.registered_devices.into_iter().flatten() {
            state.registered.insert(res, ids.unwrap_or_default());
        }
        state
    }

    /// The kubelet checkpoint for this state. Like the kubelet, no entries is written as `null`
    /// and the registered map is always an object.
    pub fn to_checkpoint(&self) -> DeviceCheckpointData {
        let mut entries = Vec::with_capacity(self.entry_count());
        for (pod, containers) in &self.pods {
            for (container, resources) in containers {
                for (resource, devices) in resources {
                    entries.push(PodDevicesEntry {
                        pod_uid: pod.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: Some(
                            devices
                                .device_ids_by_numa
                                .iter()
                                .map(|(k, v)| (*k, Some(v.clone())))
                                .collect(),
                        ),
                        alloc_resp: Some(devices.alloc_resp.clone()),
                    });
                }
            }
        }
        DeviceCheckpointData {
            pod_device_entries: if entries.is_empty() {
                None
            } else {
                Some(entries)
            },
            registered_devices: Some(
                self.registered
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .collect(),
            ),
        }
    }
}

/// serde adapter: bytes as a base64 string.
pub(crate) mod serde_base64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::base64::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        crate::base64::decode(&text).map_err(serde::de::Error::custom)
    }
}
