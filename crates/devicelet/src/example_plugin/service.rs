//! The example plugin's v1beta1 `DevicePlugin` service, in the manner of the kubelet's test
//! stub (`dm/plugin/v1beta1/stub.go`): `ListAndWatch` sends the full list now and on every
//! change; `Allocate` returns env, annotations and CDI names; `GetPreferredAllocation` packs
//! devices onto one NUMA node when it can; `PreStartContainer` is logged.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;

use devicelet_devicemanager::{Device, DevicePluginOptions};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use devicelet_rpc::convert;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};
use tracing::info;

/// The service for one server session; `session_end` ends open streams so the server can stop.
#[derive(Debug, Clone)]
pub struct ExampleDevicePlugin {
    /// Resource advertised.
    pub resource: String,
    /// Options reported by `GetDevicePluginOptions`.
    pub options: DevicePluginOptions,
    /// The current device list.
    pub devices: watch::Receiver<Vec<Device>>,
    /// Turns true when the session ends.
    pub session_end: watch::Receiver<bool>,
    /// Host device node each allocated device gets as `/dev/example-<ID>`.
    pub device_node: Option<String>,
    /// Host directory mounted read-only at `/run/example`.
    pub mount_dir: Option<String>,
}

type ListAndWatchStream =
    Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

impl ExampleDevicePlugin {
    fn known_ids(&self) -> HashMap<String, Option<i64>> {
        self.devices
            .borrow()
            .iter()
            .map(|d| {
                (
                    d.id.clone(),
                    d.numa_nodes.as_ref().and_then(|n| n.first().copied()),
                )
            })
            .collect()
    }
}

#[tonic::async_trait]
impl DevicePlugin for ExampleDevicePlugin {
    async fn get_device_plugin_options(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions {
            pre_start_required: self.options.pre_start_required,
            get_preferred_allocation_available: self.options.get_preferred_allocation_available,
        }))
    }

    type ListAndWatchStream = ListAndWatchStream;

    async fn list_and_watch(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut end = self.session_end.clone();
        let ended = async move {
            let _ = end.wait_for(|ended| *ended).await;
        };
        let stream = WatchStream::new(self.devices.clone())
            .map(|devices| {
                Ok(pb::ListAndWatchResponse {
                    devices: devices.iter().map(convert::device_to_proto).collect(),
                })
            })
            .take_until(ended);
        info!(resource = %self.resource, "ListAndWatch opened");
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let numa_of = self.known_ids();
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| pb::ContainerPreferredAllocationResponse {
                device_i_ds: prefer_numa_packed(&r, &numa_of),
            })
            .collect();
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let known = self.known_ids();
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            if let Some(unknown) = container
                .devices_ids
                .iter()
                .find(|id| !known.contains_key(*id))
            {
                return Err(Status::invalid_argument(format!(
                    "unknown device {unknown} for resource {}",
                    self.resource
                )));
            }
            let ids = container.devices_ids.join(",");
            info!(resource = %self.resource, devices = %ids, "Allocate");
            let envs: HashMap<String, String> =
                HashMap::from([("EXAMPLE_DEVICES".to_owned(), ids.clone())]);
            let annotations: HashMap<String, String> =
                HashMap::from([(format!("{}.devices", self.resource), ids)]);
            let devices = match &self.device_node {
                Some(host) => container
                    .devices_ids
                    .iter()
                    .map(|id| pb::DeviceSpec {
                        container_path: format!("/dev/example-{id}"),
                        host_path: host.clone(),
                        permissions: "rw".to_owned(),
                    })
                    .collect(),
                None => Vec::new(),
            };
            let mounts = match &self.mount_dir {
                Some(host) if !container.devices_ids.is_empty() => vec![pb::Mount {
                    container_path: "/run/example".to_owned(),
                    host_path: host.clone(),
                    read_only: true,
                }],
                _ => Vec::new(),
            };
            container_responses.push(pb::ContainerAllocateResponse {
                envs,
                annotations,
                devices,
                mounts,
                cdi_devices: container
                    .devices_ids
                    .iter()
                    .map(|id| pb::CdiDevice {
                        name: format!("{}={id}", self.resource),
                    })
                    .collect(),
            });
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        info!(resource = %self.resource, devices = ?request.into_inner().devices_ids, "PreStartContainer");
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// Must-include devices first, then the rest from the NUMA node with the most available
/// devices (ties: lowest node), then from other nodes.
fn prefer_numa_packed(
    request: &pb::ContainerPreferredAllocationRequest,
    numa_of: &HashMap<String, Option<i64>>,
) -> Vec<String> {
    let size = usize::try_from(request.allocation_size).unwrap_or(0);
    let mut chosen: Vec<String> = request
        .must_include_device_i_ds
        .iter()
        .take(size)
        .cloned()
        .collect();
    let mut by_node: BTreeMap<i64, Vec<&String>> = BTreeMap::new();
    for id in &request.available_device_i_ds {
        if !chosen.contains(id) {
            let node = numa_of.get(id).copied().flatten().unwrap_or(-1);
            by_node.entry(node).or_default().push(id);
        }
    }
    let mut nodes: Vec<(i64, Vec<&String>)> = by_node.into_iter().collect();
    nodes.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    for (_, ids) in nodes {
        for id in ids {
            if chosen.len() >= size {
                return chosen;
            }
            chosen.push(id.clone());
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_allocation_packs_one_numa_node() {
        let numa_of: HashMap<String, Option<i64>> =
            [("a", 0), ("b", 1), ("c", 1), ("d", 0), ("e", 1)]
                .into_iter()
                .map(|(id, n)| (id.to_owned(), Some(n)))
                .collect();
        let request = pb::ContainerPreferredAllocationRequest {
            available_device_i_ds: ["a", "b", "c", "d", "e"].map(String::from).to_vec(),
            must_include_device_i_ds: vec![],
            allocation_size: 2,
        };
        assert_eq!(prefer_numa_packed(&request, &numa_of), ["b", "c"]);
        let request = pb::ContainerPreferredAllocationRequest {
            must_include_device_i_ds: vec!["a".into()],
            ..request
        };
        assert_eq!(prefer_numa_packed(&request, &numa_of), ["a", "b"]);
    }
}
