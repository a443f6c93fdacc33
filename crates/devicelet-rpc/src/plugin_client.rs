//! The tonic implementation of the manager's plugin seam: [`TonicPluginDialer`] dials a plugin
//! socket like `dm/plugin/v1beta1/client.go` (`:authority` = `localhost`, 10 s dial timeout) and
//! [`TonicDevicePluginClient`] issues the v1beta1 `DevicePlugin` RPCs.
//!
//! Answers are bounded in size ([`MAX_LIST_AND_WATCH_MESSAGE_BYTES`], [`MAX_ANSWER_BYTES`]) and
//! the devices and NUMA node entries of a `ListAndWatch` message are counted before it is
//! decoded ([`validation::MAX_DEVICES_PER_RESOURCE`],
//! [`validation::MAX_NUMA_NODES_PER_SNAPSHOT`]): protobuf encodes an empty device in 2 bytes,
//! so a 64 MiB message could otherwise decode into some 33 million devices (~2.4 GB).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use devicelet_devicemanager::{
    ContainerAllocateResponse, DevicePluginClient, DevicePluginOptions, DeviceUpdateStream,
    PluginDialer, PluginError, PreferredAllocationRequest, validation,
};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient as PbClient;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

use crate::convert;
use crate::transport;

/// Largest `ListAndWatch` message we accept. Upstream keeps gRPC's 4 MiB default, and a larger
/// snapshot breaks the stream (looks like a disconnect, spec §1.9); 100 000 devices with
/// topology are about 3-4 MiB, so we allow 64 MiB: the most devices we accept
/// ([`validation::MAX_DEVICES_PER_RESOURCE`]) with IDs of 200 bytes.
pub const MAX_LIST_AND_WATCH_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Largest answer to the unary calls (`Allocate`, `GetPreferredAllocation`,
/// `GetDevicePluginOptions`): gRPC's 4 MiB default, the kubelet's own limit, so every plugin
/// that works with the kubelet fits. An `Allocate` answer is kept per container in memory, in
/// the journal and in the checkpoint; real ones are a few KB (envs, mounts, CDI names).
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

const LIST_AND_WATCH_PATH: &str = "/v1beta1.DevicePlugin/ListAndWatch";

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
            // The transport error names the socket.
            let channel = transport::dial(&socket, timeout)
                .await
                .map_err(|e| PluginError::Connect(error_chain(&e)))?;
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
    /// `ListAndWatch` goes through [`ListAndWatchCodec`], which the generated client cannot use.
    streams: tonic::client::Grpc<Channel>,
}

impl TonicDevicePluginClient {
    /// Wraps a connected channel.
    pub fn new(channel: Channel) -> Self {
        TonicDevicePluginClient {
            client: PbClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES),
            streams: tonic::client::Grpc::new(channel)
                .max_decoding_message_size(MAX_LIST_AND_WATCH_MESSAGE_BYTES),
        }
    }
}

/// A failed call → [`PluginError`]; an answer beyond the message-size bound (tonic checks the
/// length prefix before it reads the message) becomes [`PluginError::OverLimit`] naming it.
fn call_error(status: Status, what: &str, limit: usize) -> PluginError {
    if status.code() == tonic::Code::OutOfRange
        && let Some(found) = oversized_length(status.message())
    {
        return PluginError::OverLimit {
            what: what.to_owned(),
            found,
            limit,
            unit: "bytes",
        };
    }
    convert::plugin_error_from_status(status)
}

/// The length in tonic's "decoded message length too large: found N bytes, ..." status.
fn oversized_length(message: &str) -> Option<usize> {
    let rest = message
        .split_once("decoded message length too large: found ")?
        .1;
    rest.split_once(' ')?.0.parse().ok()
}

/// One decoded `ListAndWatch` message, or the error for one beyond a count bound.
enum Snapshot {
    Devices(pb::ListAndWatchResponse),
    OverLimit(PluginError),
}

/// Encodes `Empty` and decodes `ListAndWatchResponse` after counting its devices.
#[derive(Debug, Clone, Copy, Default)]
struct ListAndWatchCodec;

impl Codec for ListAndWatchCodec {
    type Encode = pb::Empty;
    type Decode = Snapshot;
    type Encoder = ListAndWatchCodec;
    type Decoder = ListAndWatchCodec;

    fn encoder(&mut self) -> Self::Encoder {
        ListAndWatchCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        ListAndWatchCodec
    }
}

impl Encoder for ListAndWatchCodec {
    type Item = pb::Empty;
    type Error = Status;

    fn encode(&mut self, item: pb::Empty, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding ListAndWatch request: {e}")))
    }
}

impl Decoder for ListAndWatchCodec {
    type Item = Snapshot;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Snapshot>, Status> {
        // The buffer holds exactly one whole message, in one contiguous chunk.
        let counts = count_entries(src.chunk());
        let over = if counts.devices > validation::MAX_DEVICES_PER_RESOURCE {
            Some(validation::too_many_devices(counts.devices))
        } else if counts.numa_nodes > validation::MAX_NUMA_NODES_PER_SNAPSHOT {
            Some(validation::too_many_numa_nodes(counts.numa_nodes))
        } else {
            None
        };
        if let Some(err) = over {
            src.advance(src.remaining());
            return Ok(Some(Snapshot::OverLimit(err)));
        }
        pb::ListAndWatchResponse::decode(src)
            .map(|m| Some(Snapshot::Devices(m)))
            .map_err(|e| Status::internal(format!("decoding ListAndWatch message: {e}")))
    }
}

/// Entries of an encoded `ListAndWatchResponse`, counted without decoding it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    /// `devices` (field 1).
    devices: usize,
    /// `devices[].topology.nodes` (fields 1 / 3 / 1).
    numa_nodes: usize,
}

/// Keys of length-delimited fields 1 and 3 (protobuf: number << 3 | wire type 2).
const FIELD_1_BYTES: u64 = 1 << 3 | 2;
const FIELD_3_BYTES: u64 = 3 << 3 | 2;

fn count_entries(message: &[u8]) -> Counts {
    let mut counts = Counts::default();
    for_each_field(message, |key, device| {
        if key == FIELD_1_BYTES {
            counts.devices += 1;
            for_each_field(device, |key, topology| {
                if key == FIELD_3_BYTES {
                    for_each_field(topology, |key, _| {
                        if key == FIELD_1_BYTES {
                            counts.numa_nodes += 1;
                        }
                    });
                }
            });
        }
    });
    counts
}

/// Calls `f` with the key of every field of an encoded message and, for a length-delimited
/// field, its bytes (empty for other wire types); stops at the first malformed field (the
/// decoder then reports it).
fn for_each_field(mut bytes: &[u8], mut f: impl FnMut(u64, &[u8])) {
    use prost::encoding::decode_varint;
    while bytes.has_remaining() {
        let Ok(key) = decode_varint(&mut bytes) else {
            return;
        };
        let (skip, delimited) = match key & 7 {
            0 => match decode_varint(&mut bytes) {
                Ok(_) => (0, false),
                Err(_) => return,
            },
            1 => (8, false),
            2 => match decode_varint(&mut bytes).map(usize::try_from) {
                Ok(Ok(len)) => (len, true),
                _ => return,
            },
            5 => (4, false),
            _ => return,
        };
        let (Some(value), Some(rest)) = (bytes.get(..skip), bytes.get(skip..)) else {
            return;
        };
        f(key, if delimited { value } else { &[] });
        bytes = rest;
    }
}

impl DevicePluginClient for TonicDevicePluginClient {
    fn get_device_plugin_options(&self) -> BoxFuture<'_, Result<DevicePluginOptions, PluginError>> {
        let mut client = self.client.clone();
        async move {
            let response = client
                .get_device_plugin_options(pb::Empty {})
                .await
                .map_err(|s| call_error(s, "GetDevicePluginOptions answer", MAX_ANSWER_BYTES))?;
            Ok(convert::options_from_proto(response.into_inner()))
        }
        .boxed()
    }

    fn list_and_watch(&self) -> BoxFuture<'_, Result<DeviceUpdateStream, PluginError>> {
        let mut grpc = self.streams.clone();
        async move {
            grpc.ready()
                .await
                .map_err(|e| PluginError::Connect(error_chain(&e)))?;
            let path = http::uri::PathAndQuery::from_static(LIST_AND_WATCH_PATH);
            let stream = grpc
                .server_streaming(tonic::Request::new(pb::Empty {}), path, ListAndWatchCodec)
                .await
                .map_err(convert::plugin_error_from_status)?
                .into_inner();
            let updates = stream.map(|message| match message {
                Ok(Snapshot::Devices(m)) => Ok(m
                    .devices
                    .into_iter()
                    .map(convert::device_from_proto)
                    .collect()),
                Ok(Snapshot::OverLimit(err)) => Err(err),
                Err(status) => Err(call_error(
                    status,
                    "ListAndWatch message",
                    MAX_LIST_AND_WATCH_MESSAGE_BYTES,
                )),
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
                .map_err(|s| call_error(s, "Allocate answer", MAX_ANSWER_BYTES))?;
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
                .map_err(|s| call_error(s, "GetPreferredAllocation answer", MAX_ANSWER_BYTES))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_counted_without_decoding() {
        let message = pb::ListAndWatchResponse {
            devices: vec![
                pb::Device::default(),
                pb::Device {
                    id: "gpu-0".into(),
                    health: "Healthy".into(),
                    topology: Some(pb::TopologyInfo {
                        nodes: vec![pb::NumaNode { id: 1 }],
                    }),
                },
                pb::Device::default(),
            ],
        };
        let counts = |bytes: &[u8]| {
            let c = count_entries(bytes);
            (c.devices, c.numa_nodes)
        };
        assert_eq!(counts(&message.encode_to_vec()), (3, 1));
        assert_eq!(counts(&[]), (0, 0));
        // Truncated or malformed input stops the count; the decoder reports the error.
        let bytes = message.encode_to_vec();
        assert_eq!(counts(&bytes[..bytes.len() - 1]), (2, 1));
        assert_eq!(counts(&[0x0b, 0x0c]), (0, 0));
        // Unknown fields are skipped, not counted.
        assert_eq!(counts(&[0x10, 0x96, 0x01, 0x0a, 0x00]), (1, 0));
        // Many NUMA entries in one device (each empty NumaNode is 2 bytes).
        let wide = pb::ListAndWatchResponse {
            devices: vec![pb::Device {
                topology: Some(pb::TopologyInfo {
                    nodes: vec![pb::NumaNode::default(); 5000],
                }),
                ..Default::default()
            }],
        };
        assert_eq!(counts(&wide.encode_to_vec()), (1, 5000));
    }

    #[test]
    fn an_oversized_answer_names_the_call_and_the_bound() {
        let status = Status::out_of_range(
            "Error, decoded message length too large: found 104857605 bytes, the limit is: 4194304 bytes",
        );
        let err = call_error(status, "Allocate answer", MAX_ANSWER_BYTES);
        assert_eq!(
            err.to_string(),
            "Allocate answer has 104857605 bytes, more than devicelet's limit of 4194304"
        );
        let other = call_error(Status::out_of_range("index 7"), "Allocate answer", 1);
        assert!(matches!(other, PluginError::Rpc { .. }), "{other}");
    }
}
