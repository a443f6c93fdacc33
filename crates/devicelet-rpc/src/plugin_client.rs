//! The tonic implementation of the manager's plugin seam: [`TonicPluginDialer`] dials a plugin
//! socket like `dm/plugin/v1beta1/client.go` (`:authority` = `localhost`, 10 s dial timeout) and
//! [`TonicDevicePluginClient`] issues the v1beta1 `DevicePlugin` RPCs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use devicelet_devicemanager::{
    ContainerAllocateResponse, DevicePluginClient, DevicePluginOptions, DeviceUpdateStream,
    PluginDialer, PluginError, PreferredAllocationRequest,
};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient as PbClient;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tonic::transport::Channel;

use crate::convert;
use crate::transport;

/// Largest `ListAndWatch` message we accept. Upstream keeps gRPC's 4 MiB default, and a larger
/// snapshot breaks the stream (looks like a disconnect, spec §1.9); 100 000 devices with
/// topology are about 3-4 MiB, so we allow 64 MiB (roughly two million devices).
pub const MAX_LIST_AND_WATCH_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Dials device plugins over Unix sockets.
#[derive(Debug, Clone)]
pub struct TonicPluginDialer {
    connect_timeout: Duration,
}

impl TonicPluginDialer {
    /// A dialer with the given connect timeout (the kubelet uses 10 s).
    pub fn new(connect_timeout: Duration) -> Self {
        TonicPluginDialer { connect_timeout }
    }
}

impl PluginDialer for TonicPluginDialer {
    fn dial(
        &self,
        socket: &Path,
    ) -> BoxFuture<'static, Result<Arc<dyn DevicePluginClient>, PluginError>> {
        let socket = socket.to_path_buf();
        let timeout = self.connect_timeout;
        async move {
            let channel = transport::dial(&socket, timeout).await.map_err(|e| {
                PluginError::Connect(format!("{}: {}", socket.display(), error_chain(&e)))
            })?;
            Ok(Arc::new(TonicDevicePluginClient::new(channel)) as Arc<dyn DevicePluginClient>)
        }
        .boxed()
    }
}

/// Renders an error with its sources ("a: b: c"); tonic's top-level messages are terse.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// A connected v1beta1 device plugin.
#[derive(Debug, Clone)]
pub struct TonicDevicePluginClient {
    client: PbClient<Channel>,
}

impl TonicDevicePluginClient {
    /// Wraps a connected channel.
    pub fn new(channel: Channel) -> Self {
        TonicDevicePluginClient {
            client: PbClient::new(channel)
                .max_decoding_message_size(MAX_LIST_AND_WATCH_MESSAGE_BYTES),
        }
    }
}

impl DevicePluginClient for TonicDevicePluginClient {
    fn get_device_plugin_options(&self) -> BoxFuture<'_, Result<DevicePluginOptions, PluginError>> {
        let mut client = self.client.clone();
        async move {
            let response = client
                .get_device_plugin_options(pb::Empty {})
                .await
                .map_err(convert::plugin_error_from_status)?;
            Ok(convert::options_from_proto(response.into_inner()))
        }
        .boxed()
    }

    fn list_and_watch(&self) -> BoxFuture<'_, Result<DeviceUpdateStream, PluginError>> {
        let mut client = self.client.clone();
        async move {
            let stream = client
                .list_and_watch(pb::Empty {})
                .await
                .map_err(convert::plugin_error_from_status)?
                .into_inner();
            let updates = stream.map(|message| {
                message
                    .map(|m| {
                        m.devices
                            .into_iter()
                            .map(convert::device_from_proto)
                            .collect()
                    })
                    .map_err(convert::plugin_error_from_status)
            });
            Ok(updates.boxed())
        }
        .boxed()
    }

    fn allocate(
        &self,
        container_device_ids: Vec<Vec<String>>,
    ) -> BoxFuture<'_, Result<Vec<ContainerAllocateResponse>, PluginError>> {
        let mut client = self.client.clone();
        async move {
            let request = pb::AllocateRequest {
                container_requests: container_device_ids
                    .into_iter()
                    .map(|devices_ids| pb::ContainerAllocateRequest { devices_ids })
                    .collect(),
            };
            let response = client
                .allocate(request)
                .await
                .map_err(convert::plugin_error_from_status)?;
            Ok(response
                .into_inner()
                .container_responses
                .into_iter()
                .map(convert::allocate_response_from_proto)
                .collect())
        }
        .boxed()
    }

    fn get_preferred_allocation(
        &self,
        requests: Vec<PreferredAllocationRequest>,
    ) -> BoxFuture<'_, Result<Vec<Vec<String>>, PluginError>> {
        let mut client = self.client.clone();
        async move {
            let request = pb::PreferredAllocationRequest {
                container_requests: requests
                    .into_iter()
                    .map(convert::preferred_request_to_proto)
                    .collect(),
            };
            let response = client
                .get_preferred_allocation(request)
                .await
                .map_err(convert::plugin_error_from_status)?;
            Ok(response
                .into_inner()
                .container_responses
                .into_iter()
                .map(|r| r.device_i_ds)
                .collect())
        }
        .boxed()
    }

    fn pre_start_container(
        &self,
        device_ids: Vec<String>,
    ) -> BoxFuture<'_, Result<(), PluginError>> {
        let mut client = self.client.clone();
        async move {
            client
                .pre_start_container(pb::PreStartContainerRequest {
                    devices_ids: device_ids,
                })
                .await
                .map_err(convert::plugin_error_from_status)?;
            Ok(())
        }
        .boxed()
    }
}
