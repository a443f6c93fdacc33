//! IO seam between the device manager and device plugins: the calls the kubelet makes on a
//! plugin (`dm/plugin/v1beta1/client.go`, `dm/endpoint.go`) as object-safe traits, so the
//! manager is tested with fakes and `devicelet-rpc` provides the tonic implementation.

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::error::PluginError;
use crate::types::{
    ContainerAllocateResponse, Device, DevicePluginOptions, PreferredAllocationRequest,
};

/// The stream of full device snapshots a plugin sends on `ListAndWatch`.
pub type DeviceUpdateStream = BoxStream<'static, Result<Vec<Device>, PluginError>>;

/// A connected device plugin.
pub trait DevicePluginClient: Send + Sync + 'static {
    /// `GetDevicePluginOptions`.
    fn get_device_plugin_options(&self) -> BoxFuture<'_, Result<DevicePluginOptions, PluginError>>;
    /// Opens the long-lived `ListAndWatch` stream.
    fn list_and_watch(&self) -> BoxFuture<'_, Result<DeviceUpdateStream, PluginError>>;
    /// `Allocate` with one entry per container; returns one response per container.
    fn allocate(
        &self,
        container_device_ids: Vec<Vec<String>>,
    ) -> BoxFuture<'_, Result<Vec<ContainerAllocateResponse>, PluginError>>;
    /// `GetPreferredAllocation`; returns the preferred device IDs per container.
    fn get_preferred_allocation(
        &self,
        requests: Vec<PreferredAllocationRequest>,
    ) -> BoxFuture<'_, Result<Vec<Vec<String>>, PluginError>>;
    /// `PreStartContainer` with all device IDs the container holds.
    fn pre_start_container(
        &self,
        device_ids: Vec<String>,
    ) -> BoxFuture<'_, Result<(), PluginError>>;
}

/// Connects to a plugin socket.
pub trait PluginDialer: Send + Sync + 'static {
    /// Dials the plugin listening on `socket`.
    fn dial(
        &self,
        socket: &Path,
    ) -> BoxFuture<'static, Result<Arc<dyn DevicePluginClient>, PluginError>>;
}
