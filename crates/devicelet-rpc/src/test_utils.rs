//! An in-process v1beta1 device plugin for tests and benches (feature `test-utils`): a fixed
//! device list sent once on `ListAndWatch` (the stream then stays open, like a real plugin),
//! and an `Allocate` that answers one response per container, optionally with
//! `EXAMPLE_DEVICES=<ids>` as the built-in example plugin does. Serve it with
//! [`StaticDevicePlugin::serve`] on a Unix socket and register it on `kubelet.sock` with
//! [`register_and_wait`].

use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use devicelet_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::daemon::Daemon;
use crate::error::RpcError;
use crate::transport;

/// Registers the plugin serving `endpoint` (a socket name in the daemon's device-plugin
/// directory) for `resource` on the daemon's `kubelet.sock`, then waits up to `wait` until the
/// Device Manager counts `capacity` devices of `resource`.
pub async fn register_and_wait(
    daemon: &Daemon,
    endpoint: &str,
    resource: &str,
    capacity: u64,
    wait: Duration,
) -> Result<(), RpcError> {
    let socket = &daemon.paths().kubelet_socket;
    let failed = |message: String| RpcError::Server {
        path: socket.clone(),
        message,
    };
    let channel = transport::dial(socket, Duration::from_secs(5)).await?;
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        })
        .await
        .map_err(|status| failed(format!("Register {resource}: {status}")))?;
    let manager = daemon.manager();
    let mut changes = manager.subscribe();
    let reached = tokio::time::timeout(wait, async {
        while manager.capacity().capacity.get(resource) != Some(&capacity) {
            if changes.changed().await.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    match reached {
        Ok(true) => Ok(()),
        Ok(false) => Err(failed("the Device Manager stopped".into())),
        Err(_) => Err(failed(format!(
            "{resource} did not reach {capacity} devices within {wait:?}"
        ))),
    }
}

/// A device plugin with a fixed device list.
#[derive(Debug, Clone, Default)]
pub struct StaticDevicePlugin {
    devices: Vec<pb::Device>,
    device_envs: bool,
}

/// A `pb::Device`; `numa: None` sends no topology, `Some(vec![])` an empty one.
pub fn device(id: &str, health: &str, numa: Option<Vec<i64>>) -> pb::Device {
    pb::Device {
        id: id.into(),
        health: health.into(),
        topology: numa.map(|nodes| pb::TopologyInfo {
            nodes: nodes.into_iter().map(|id| pb::NumaNode { id }).collect(),
        }),
    }
}

impl StaticDevicePlugin {
    /// A plugin advertising `devices`.
    pub fn new(devices: Vec<pb::Device>) -> Self {
        StaticDevicePlugin {
            devices,
            device_envs: false,
        }
    }

    /// `count` healthy devices `<prefix>-<i>`, alternating between NUMA nodes 0 and 1.
    pub fn healthy(prefix: &str, count: usize) -> Self {
        Self::new(
            (0..count)
                .map(|i| {
                    device(
                        &format!("{prefix}-{i}"),
                        "Healthy",
                        Some(vec![(i % 2) as i64]),
                    )
                })
                .collect(),
        )
    }

    /// `Allocate` answers carry `EXAMPLE_DEVICES=<ids>` per container.
    pub fn with_device_envs(mut self) -> Self {
        self.device_envs = true;
        self
    }

    /// Serves the plugin on a new socket at `socket` until the task is dropped.
    pub fn serve(
        self,
        socket: &Path,
    ) -> Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>, RpcError> {
        let listener = transport::bind(socket)?;
        Ok(tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(self))
                .serve_with_incoming(transport::incoming(listener)),
        ))
    }
}

#[tonic::async_trait]
impl DevicePlugin for StaticDevicePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    type ListAndWatchStream =
        Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let first = futures::stream::iter([Ok(pb::ListAndWatchResponse {
            devices: self.devices.clone(),
        })]);
        Ok(Response::new(Box::pin(futures::StreamExt::chain(
            first,
            futures::stream::pending(),
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| pb::ContainerAllocateResponse {
                envs: if self.device_envs {
                    [("EXAMPLE_DEVICES".to_owned(), c.devices_ids.join(","))].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}
