//! The inventory view served by the control API and printed by `devicelet get resources`.
//! JSON keys follow the DESIGN.md contract:
//! `{"resources":[{"name","capacity","allocatable","inactive","devices":[{"id","health","numaNodes"}]}]}`;
//! `endpoint` is an extra, optional key describing the plugin connection.

use serde::{Deserialize, Serialize};

/// Every device-plugin resource the manager knows about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourcesSnapshot {
    /// Resources sorted by name.
    pub resources: Vec<ResourceView>,
}

impl ResourcesSnapshot {
    /// Looks a resource up by name.
    pub fn resource(&self, name: &str) -> Option<&ResourceView> {
        self.resources.iter().find(|r| r.name == name)
    }
}

/// One resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceView {
    /// Extended resource name.
    pub name: String,
    /// Number of devices (healthy and unhealthy), as `GetCapacity` reports.
    pub capacity: u64,
    /// Number of healthy devices while the plugin is connected; 0 once it disconnected.
    pub allocatable: u64,
    /// Devices held by admitted containers or reserved by an admission in progress (an extra
    /// key beyond DESIGN.md's; absent in older answers, hence the default).
    #[serde(default)]
    pub allocated: u64,
    /// The plugin stayed away past the grace period: the resource is reported with capacity 0
    /// (the kubelet's "deleted" list, which the node status keeps at 0).
    pub inactive: bool,
    /// Devices in plugin order.
    pub devices: Vec<DeviceView>,
    /// The plugin connection, absent for inactive resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointView>,
}

/// One device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceView {
    /// Device ID.
    pub id: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    /// NUMA nodes from the device's topology (empty when none).
    pub numa_nodes: Vec<i64>,
}

/// Where a resource's plugin is and whether it is connected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    /// `Serving` (stream open), `Stopped` (disconnected, inside the grace period) or
    /// `Restored` (known from a checkpoint, plugin not back yet).
    pub state: String,
    /// The plugin socket dialed.
    pub socket: String,
    /// From `GetDevicePluginOptions`.
    pub pre_start_required: bool,
    /// From `GetDevicePluginOptions`.
    pub get_preferred_allocation_available: bool,
    /// Seconds left before a stopped endpoint's resource becomes inactive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_remaining_seconds: Option<u64>,
}
