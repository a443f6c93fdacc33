//! devicelet-devicemanager: the kubelet device manager's plugin registry and device inventory
//! (`pkg/kubelet/cm/devicemanager`), with IO behind traits ([`PluginDialer`],
//! [`DevicePluginClient`], [`Clock`]) so it runs against fakes in tests and against tonic in
//! `devicelet-rpc`.

pub mod admission;
pub mod allocation;
pub mod cached_response;
pub mod clock;
pub mod error;
pub mod inventory;
pub mod manager;
mod metered;
pub mod plugin;
pub mod pod_devices;
pub mod snapshot;
pub mod topology_view;
pub mod types;
pub mod validation;

#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;

pub use admission::{
    AdmissionError, ContainerDevices, ContainerKind, ContainerRequest, PRE_START_TIMEOUT,
};
pub use allocation::{AffinitySplit, AllocationError, DevicePicker, filter_by_affinity};
pub use cached_response::{CachedResponse, ResponseDecoder};
pub use clock::{Clock, FakeClock, SystemClock};
pub use devicelet_metrics::Metrics;
pub use error::{EndpointError, PluginError, RegistrationError};
pub use inventory::{ResourceDevices, UpdateSummary};
pub use manager::{
    CapacityReport, DEFAULT_ALLOCATE_TIMEOUT, DEFAULT_DIAL_TIMEOUT, DEFAULT_ENDPOINT_GRACE_PERIOD,
    DEFAULT_OPTIONS_TIMEOUT, DeviceManager, DeviceManagerConfig, EndpointId, RegistrationSource,
};
pub use plugin::{DevicePluginClient, DeviceUpdateStream, PluginDialer};
pub use pod_devices::{
    Needed, PodAllocations, PodDevices, ResourceAllocation, ResourceHealth, ReusePool,
    RunContainerOptions, check_preconditions, merge_responses,
};
pub use snapshot::{DeviceView, EndpointView, ResourceView, ResourcesSnapshot};
pub use topology_view::ResourceTopologyView;
pub use types::{
    ContainerAllocateResponse, DEVICE_PLUGIN_API_VERSION, Device, DevicePluginOptions, DeviceSpec,
    HEALTHY, Health, Mount, PreferredAllocationRequest, RegisterRequest, UNHEALTHY,
};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod admission_tests;
