//! Domain types of the device manager, mirroring the messages of the kubelet device plugin API
//! (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto`) without depending on generated
//! protobuf code: the gRPC layer (`devicelet-rpc`) converts at its edge.

use std::collections::BTreeMap;
use std::fmt;

/// The only API version a device plugin may register with (`dpapi/constants.go` `Version`).
pub const DEVICE_PLUGIN_API_VERSION: &str = "v1beta1";
/// Health string that counts as healthy. Every other value (including `""` and `"healthy"`)
/// counts as unhealthy, exactly as `dm/manager.go` does.
pub const HEALTHY: &str = "Healthy";
/// Health string the kubelet API defines for unhealthy devices.
pub const UNHEALTHY: &str = "Unhealthy";

/// Health of one device as the kubelet understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// The plugin sent exactly `"Healthy"`.
    Healthy,
    /// Anything else, or the plugin is gone.
    Unhealthy,
}

impl Health {
    /// Parses a plugin-sent health string with the kubelet's rule: only the exact string
    /// `"Healthy"` is healthy.
    pub fn from_plugin_str(value: &str) -> Self {
        if value == HEALTHY {
            Health::Healthy
        } else {
            Health::Unhealthy
        }
    }

    /// The wire / display spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => HEALTHY,
            Health::Unhealthy => UNHEALTHY,
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One device as advertised by a plugin in a `ListAndWatch` snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Plugin-chosen device ID (not validated by the kubelet; we only reject the empty ID).
    pub id: String,
    /// Health after applying the exact-`"Healthy"` rule.
    pub health: Health,
    /// NUMA nodes from `Device.topology`. `None` means the plugin sent no `TopologyInfo`;
    /// `Some(vec![])` means an empty one. The two differ for topology hints (spec §7 item 18).
    pub numa_nodes: Option<Vec<i64>>,
}

impl Device {
    /// A healthy device without topology.
    pub fn healthy(id: impl Into<String>) -> Self {
        Device {
            id: id.into(),
            health: Health::Healthy,
            numa_nodes: None,
        }
    }

    /// Sets the NUMA nodes (builder style, used by tests and fakes).
    pub fn on_numa(mut self, nodes: impl IntoIterator<Item = i64>) -> Self {
        self.numa_nodes = Some(nodes.into_iter().collect());
        self
    }

    /// Sets the health (builder style).
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }
}

/// Options a plugin reports through `GetDevicePluginOptions`. `RegisterRequest.options` is
/// ignored on purpose, as the kubelet does (spec §1.2, §7 item 2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevicePluginOptions {
    /// The plugin wants `PreStartContainer` before each container start.
    pub pre_start_required: bool,
    /// The plugin answers `GetPreferredAllocation`.
    pub get_preferred_allocation_available: bool,
}

/// A `Register` call as received on `kubelet.sock`, in domain form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterRequest {
    /// API version the plugin speaks; must be `v1beta1`.
    pub version: String,
    /// Socket file name relative to the device-plugin directory.
    pub endpoint: String,
    /// Extended resource name, e.g. `example.com/gpu`.
    pub resource_name: String,
}

/// One container's request in `GetPreferredAllocation`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreferredAllocationRequest {
    /// Devices the kubelet may choose from (includes `must_include`).
    pub available_device_ids: Vec<String>,
    /// Devices that must be part of the answer.
    pub must_include_device_ids: Vec<String>,
    /// How many devices the container needs in total.
    pub allocation_size: i32,
}

/// A mount the runtime must add (`v1beta1.Mount`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A device node the runtime must add (`v1beta1.DeviceSpec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions, any mix of `r`, `w`, `m`, passed through unchanged.
    pub permissions: String,
}

/// What a plugin answers for one container in `Allocate` (`v1beta1.ContainerAllocateResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAllocateResponse {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Mounts.
    pub mounts: Vec<Mount>,
    /// Device nodes.
    pub devices: Vec<DeviceSpec>,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names (`vendor.com/class=name`).
    pub cdi_devices: Vec<String>,
}
