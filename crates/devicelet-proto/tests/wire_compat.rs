//! Wire-compatibility checks against the Kubernetes 1.36 protobuf field numbers
//! (spec `devicemanager.md` §1.2, §5.2; `dra-kubelet.md` §1.2–§1.5). Each test encodes a message
//! with prost and compares the exact bytes (tag byte = field number << 3 | wire type), so a
//! renumbered or retyped field fails here, and decodes bytes written the way Go's protobuf
//! encoder writes them.

use devicelet_proto::deviceplugin::v1beta1 as dp;
use devicelet_proto::dra::v1 as dra_v1;
use devicelet_proto::dra::v1beta1 as dra_v1beta1;
use devicelet_proto::dra_health::v1alpha1 as health;
use devicelet_proto::pluginregistration::v1 as reg;
use devicelet_proto::podresources::v1 as pr_v1;
use prost::Message;

/// Length-delimited field: tag, length, payload.
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![
        (field << 3) | 2,
        u8::try_from(payload.len()).expect("short test payload"),
    ];
    out.extend_from_slice(payload);
    out
}

/// Varint field with a value below 128.
fn varint(field: u8, value: u8) -> Vec<u8> {
    vec![field << 3, value]
}

#[test]
fn register_request_uses_fields_1_to_4() {
    let msg = dp::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "gpu.sock".into(),
        resource_name: "example.com/gpu".into(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }),
    };
    let expected = [
        ld(1, b"v1beta1"),
        ld(2, b"gpu.sock"),
        ld(3, b"example.com/gpu"),
        ld(4, &[varint(1, 1), varint(2, 1)].concat()),
    ]
    .concat();
    assert_eq!(msg.encode_to_vec(), expected);
    assert_eq!(
        dp::RegisterRequest::decode(expected.as_slice()).expect("valid bytes"),
        msg
    );
}

#[test]
fn list_and_watch_device_with_numa_topology_matches_go_encoding() {
    let msg = dp::ListAndWatchResponse {
        devices: vec![dp::Device {
            id: "dev-0".into(),
            health: "Healthy".into(),
            topology: Some(dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: 1 }],
            }),
        }],
    };
    let node = varint(1, 1);
    let topology = ld(1, &node);
    let device = [ld(1, b"dev-0"), ld(2, b"Healthy"), ld(3, &topology)].concat();
    let expected = ld(1, &device);
    assert_eq!(msg.encode_to_vec(), expected);
}

#[test]
fn preferred_allocation_request_allocation_size_is_field_3_varint() {
    let msg = dp::ContainerPreferredAllocationRequest {
        available_device_i_ds: vec!["a".into()],
        must_include_device_i_ds: vec!["b".into()],
        allocation_size: 2,
    };
    let expected = [ld(1, b"a"), ld(2, b"b"), varint(3, 2)].concat();
    assert_eq!(msg.encode_to_vec(), expected);
}

#[test]
fn container_allocate_response_cdi_devices_is_field_5() {
    let msg = dp::ContainerAllocateResponse {
        envs: [("K".to_owned(), "V".to_owned())].into_iter().collect(),
        mounts: vec![dp::Mount {
            container_path: "/c".into(),
            host_path: "/h".into(),
            read_only: true,
        }],
        devices: vec![dp::DeviceSpec {
            container_path: "/dev/x".into(),
            host_path: "/dev/y".into(),
            permissions: "rw".into(),
        }],
        annotations: Default::default(),
        cdi_devices: vec![dp::CdiDevice {
            name: "vendor.com/gpu=gpu0".into(),
        }],
    };
    let expected = [
        ld(1, &[ld(1, b"K"), ld(2, b"V")].concat()),
        ld(2, &[ld(1, b"/c"), ld(2, b"/h"), varint(3, 1)].concat()),
        ld(
            3,
            &[ld(1, b"/dev/x"), ld(2, b"/dev/y"), ld(3, b"rw")].concat(),
        ),
        ld(5, &ld(1, b"vendor.com/gpu=gpu0")),
    ]
    .concat();
    assert_eq!(msg.encode_to_vec(), expected);
}

#[test]
fn plugin_info_supported_versions_is_field_4() {
    let msg = reg::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "gpu.example.com".into(),
        endpoint: "/p/dra.sock".into(),
        supported_versions: vec!["v1.DRAPlugin".into()],
    };
    let expected = [
        ld(1, b"DRAPlugin"),
        ld(2, b"gpu.example.com"),
        ld(3, b"/p/dra.sock"),
        ld(4, b"v1.DRAPlugin"),
    ]
    .concat();
    assert_eq!(msg.encode_to_vec(), expected);
    let status = reg::RegistrationStatus {
        plugin_registered: true,
        error: "e".into(),
    };
    assert_eq!(status.encode_to_vec(), [varint(1, 1), ld(2, b"e")].concat());
}

#[test]
fn dra_v1_device_share_id_is_optional_field_5() {
    let device = dra_v1::Device {
        request_names: vec!["req".into()],
        pool_name: "pool".into(),
        device_name: "dev".into(),
        cdi_device_ids: vec!["v.com/c=d".into()],
        share_id: Some(String::new()),
    };
    // proto3 `optional`: an explicitly set empty string is still on the wire.
    let expected = [
        ld(1, b"req"),
        ld(2, b"pool"),
        ld(3, b"dev"),
        ld(4, b"v.com/c=d"),
        ld(5, b""),
    ]
    .concat();
    assert_eq!(device.encode_to_vec(), expected);
    // A v1beta1 reader skips field 5 (it has no share_id).
    let old = dra_v1beta1::Device::decode(expected.as_slice()).expect("valid bytes");
    assert_eq!(old.device_name, "dev");
}

#[test]
fn dra_prepare_response_is_a_map_keyed_by_claim_uid() {
    let msg = dra_v1::NodePrepareResourcesResponse {
        claims: [(
            "uid-1".to_owned(),
            dra_v1::NodePrepareResourceResponse {
                devices: vec![],
                error: "boom".into(),
            },
        )]
        .into_iter()
        .collect(),
    };
    let entry = [ld(1, b"uid-1"), ld(2, &ld(2, b"boom"))].concat();
    assert_eq!(msg.encode_to_vec(), ld(1, &entry));
    let claim = dra_v1::Claim {
        namespace: "ns".into(),
        uid: "u".into(),
        name: "n".into(),
    };
    assert_eq!(
        claim.encode_to_vec(),
        [ld(1, b"ns"), ld(2, b"u"), ld(3, b"n")].concat()
    );
}

#[test]
fn dra_health_device_health_enum_is_field_2_and_message_field_5() {
    let msg = health::DeviceHealth {
        device: Some(health::DeviceIdentifier {
            pool_name: "p".into(),
            device_name: "d".into(),
        }),
        health: health::HealthStatus::Unhealthy as i32,
        last_updated_time: 7,
        health_check_timeout_seconds: 9,
        message: "m".into(),
    };
    let expected = [
        ld(1, &[ld(1, b"p"), ld(2, b"d")].concat()),
        varint(2, 2),
        varint(3, 7),
        varint(4, 9),
        ld(5, b"m"),
    ]
    .concat();
    assert_eq!(msg.encode_to_vec(), expected);
}

#[test]
fn podresources_dynamic_resource_leaves_field_1_free() {
    let msg = pr_v1::DynamicResource {
        claim_name: "c".into(),
        claim_namespace: "ns".into(),
        claim_resources: vec![pr_v1::ClaimResource {
            cdi_devices: vec![pr_v1::CdiDevice { name: "x".into() }],
            driver_name: "drv".into(),
            pool_name: "p".into(),
            device_name: "d".into(),
            share_id: None,
        }],
    };
    let claim_resource = [ld(1, &ld(1, b"x")), ld(2, b"drv"), ld(3, b"p"), ld(4, b"d")].concat();
    let expected = [ld(2, b"c"), ld(3, b"ns"), ld(4, &claim_resource)].concat();
    assert_eq!(msg.encode_to_vec(), expected);
}

#[test]
fn podresources_allocatable_response_packs_cpu_ids_in_field_2() {
    let msg = pr_v1::AllocatableResourcesResponse {
        devices: vec![pr_v1::ContainerDevices {
            resource_name: "r/x".into(),
            device_ids: vec!["d".into()],
            topology: Some(pr_v1::TopologyInfo {
                nodes: vec![pr_v1::NumaNode { id: 0 }],
            }),
        }],
        cpu_ids: vec![1, 2],
        memory: vec![pr_v1::ContainerMemory {
            memory_type: "memory".into(),
            size: 5,
            topology: None,
        }],
    };
    // NUMA node 0 is the default value, so NUMANode{ID:0} encodes as an empty message.
    let devices = [ld(1, b"r/x"), ld(2, b"d"), ld(3, &ld(1, b""))].concat();
    let expected = [
        ld(1, &devices),
        ld(2, &[1, 2]), // proto3 packs repeated int64
        ld(3, &[ld(1, b"memory"), varint(2, 5)].concat()),
    ]
    .concat();
    assert_eq!(msg.encode_to_vec(), expected);
}
