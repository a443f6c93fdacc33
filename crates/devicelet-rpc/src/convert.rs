//! The one place that converts between generated v1beta1 protobuf types and the device
//! manager's domain types.

use devicelet_devicemanager::{
    ContainerAllocateResponse, Device, DevicePluginOptions, DeviceSpec, Health, Mount, PluginError,
    PreferredAllocationRequest, RegisterRequest,
};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use prost::Message;

/// `v1beta1.Device` → [`Device`]; health uses the exact-`"Healthy"` rule.
pub fn device_from_proto(device: pb::Device) -> Device {
    Device {
        id: device.id,
        health: Health::from_plugin_str(&device.health),
        numa_nodes: device
            .topology
            .map(|t| t.nodes.into_iter().map(|n| n.id).collect()),
    }
}

/// [`Device`] → `v1beta1.Device` (used by plugins we run).
pub fn device_to_proto(device: &Device) -> pb::Device {
    pb::Device {
        id: device.id.clone(),
        health: device.health.as_str().to_owned(),
        topology: device.numa_nodes.as_ref().map(|nodes| pb::TopologyInfo {
            nodes: nodes.iter().map(|&id| pb::NumaNode { id }).collect(),
        }),
    }
}

/// `v1beta1.DevicePluginOptions` → [`DevicePluginOptions`].
pub fn options_from_proto(options: pb::DevicePluginOptions) -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: options.pre_start_required,
        get_preferred_allocation_available: options.get_preferred_allocation_available,
    }
}

/// `v1beta1.RegisterRequest` → [`RegisterRequest`]; `options` is dropped on purpose (the
/// kubelet ignores it and asks `GetDevicePluginOptions`).
pub fn register_request_from_proto(request: pb::RegisterRequest) -> RegisterRequest {
    RegisterRequest {
        version: request.version,
        endpoint: request.endpoint,
        resource_name: request.resource_name,
    }
}

/// [`PreferredAllocationRequest`] → `v1beta1.ContainerPreferredAllocationRequest`.
pub fn preferred_request_to_proto(
    request: PreferredAllocationRequest,
) -> pb::ContainerPreferredAllocationRequest {
    pb::ContainerPreferredAllocationRequest {
        available_device_i_ds: request.available_device_ids,
        must_include_device_i_ds: request.must_include_device_ids,
        allocation_size: request.allocation_size,
    }
}

/// `v1beta1.ContainerAllocateResponse` → [`ContainerAllocateResponse`] (maps sorted by key).
pub fn allocate_response_from_proto(
    response: pb::ContainerAllocateResponse,
) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: response.envs.into_iter().collect(),
        mounts: response
            .mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: response
            .devices
            .into_iter()
            .map(|d| DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: response.annotations.into_iter().collect(),
        cdi_devices: response.cdi_devices.into_iter().map(|c| c.name).collect(),
    }
}

/// [`ContainerAllocateResponse`] → `v1beta1.ContainerAllocateResponse` (what the checkpoint
/// stores as `AllocResp`, protobuf-encoded).
pub fn allocate_response_to_proto(
    response: &ContainerAllocateResponse,
) -> pb::ContainerAllocateResponse {
    pb::ContainerAllocateResponse {
        envs: response
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        mounts: response
            .mounts
            .iter()
            .map(|m| pb::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: response
            .devices
            .iter()
            .map(|d| pb::DeviceSpec {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        annotations: response
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cdi_devices: response
            .cdi_devices
            .iter()
            .map(|name| pb::CdiDevice { name: name.clone() })
            .collect(),
    }
}

/// A gRPC status from a plugin → [`PluginError`].
pub fn plugin_error_from_status(status: tonic::Status) -> PluginError {
    PluginError::Rpc {
        code: format!("{:?}", status.code()),
        message: status.message().to_owned(),
    }
}

/// The checkpoint's `AllocResp` encoding for the node core: the plugin's
/// `v1beta1.ContainerAllocateResponse` protobuf, as the kubelet stores it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProtoAllocResp;

impl devicelet_node::AllocRespCodec for ProtoAllocResp {
    fn encode(&self, response: &ContainerAllocateResponse) -> Vec<u8> {
        allocate_response_to_proto(response).encode_to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Option<ContainerAllocateResponse> {
        pb::ContainerAllocateResponse::decode(bytes)
            .ok()
            .map(allocate_response_from_proto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nil_and_empty_topology_stay_distinct() {
        let nil = device_from_proto(pb::Device {
            id: "a".into(),
            health: "Healthy".into(),
            topology: None,
        });
        assert_eq!(nil.numa_nodes, None);
        let empty = device_from_proto(pb::Device {
            id: "a".into(),
            health: "healthy".into(),
            topology: Some(pb::TopologyInfo { nodes: vec![] }),
        });
        assert_eq!(empty.numa_nodes, Some(vec![]));
        assert_eq!(empty.health, Health::Unhealthy);
        let round = device_from_proto(device_to_proto(&Device::healthy("x").on_numa([0, 1])));
        assert_eq!(round, Device::healthy("x").on_numa([0, 1]));
    }
}
