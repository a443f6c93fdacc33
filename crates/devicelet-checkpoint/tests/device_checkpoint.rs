//! Test vectors for `kubelet_internal_checkpoint` (spec/devicemanager.md §3.6).
//!
//! Every "Go re-marshal" string below was produced by a throw-away Go program that declares the
//! kubelet's checkpoint types (`checkpoint.checkpointData`, `PodDevicesEntry`, `DevicesPerNUMA`),
//! decodes the vector's `Data` with `encoding/json`, hashes it with go-spew
//! (`github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc`, the version Kubernetes
//! vendors) configured as `k8s.io/utils/dump.ForHash`, and prints `json.Marshal` of the result
//! (Go 1.26.8). The program is not committed.

use devicelet_checkpoint::DecodeError;
use devicelet_checkpoint::device::{
    self, DeviceCheckpointData, DeviceCheckpointFormat, checksum, decode, decode_strict, encode,
    spew_text,
};

const PREFIX: &str = "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)";

struct Vector {
    data: &'static str,
    /// The hashed text with the common prefix replaced by `…`, as in the spec table.
    text: &'static str,
    checksum: u32,
    /// `json.Marshal` of the decoded checkpoint by Go.
    go_json: &'static str,
}

const EXAMPLE_DATA: &str = r#"{"PodDeviceEntries":[{"PodUID":"5d9c1f8e-0000-4000-8000-000000000001","ContainerName":"ctr","ResourceName":"example.com/gpu","DeviceIDs":{"-1":["gpu-9"],"0":["gpu-0","gpu-1"]},"AllocResp":"CgoKA0ZPTxIDYmFyGhgKCC9kZXYvZm9vEggvZGV2L2ZvbxoCcncqEgoQdmVuZG9yLmNvbS9kZXY9MQ=="}],"RegisteredDevices":{"example.com/gpu":["gpu-0","gpu-1","gpu-2","gpu-9"],"example.com/nic":["nic-a"]}}"#;

const VECTORS: [Vector; 7] = [
    Vector {
        data: r#"{"PodDeviceEntries":null,"RegisteredDevices":{}}"#,
        text: "…<nil> RegisteredDevices:(map[string][]string)map[]}",
        checksum: 3_467_439_661,
        go_json: r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3467439661}"#,
    },
    Vector {
        data: r#"{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/gpu":[]}}"#,
        text: "…<nil> RegisteredDevices:(map[string][]string)map[example.com/gpu:[]]}",
        checksum: 2_838_580_107,
        go_json: r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/gpu":[]}},"Checksum":2838580107}"#,
    },
    Vector {
        data: EXAMPLE_DATA,
        text: "…[{PodUID:(string)5d9c1f8e-0000-4000-8000-000000000001 ContainerName:(string)ctr ResourceName:(string)example.com/gpu DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[gpu-9] 0:[gpu-0 gpu-1]] AllocResp:([]uint8)[10 10 10 3 70 79 79 18 3 98 97 114 26 24 10 8 47 100 101 118 47 102 111 111 18 8 47 100 101 118 47 102 111 111 26 2 114 119 42 18 10 16 118 101 110 100 111 114 46 99 111 109 47 100 101 118 61 49]}] RegisteredDevices:(map[string][]string)map[example.com/gpu:[gpu-0 gpu-1 gpu-2 gpu-9] example.com/nic:[nic-a]]}",
        checksum: 1_389_290_435,
        go_json: r#"{"Data":{"PodDeviceEntries":[{"PodUID":"5d9c1f8e-0000-4000-8000-000000000001","ContainerName":"ctr","ResourceName":"example.com/gpu","DeviceIDs":{"-1":["gpu-9"],"0":["gpu-0","gpu-1"]},"AllocResp":"CgoKA0ZPTxIDYmFyGhgKCC9kZXYvZm9vEggvZGV2L2ZvbxoCcncqEgoQdmVuZG9yLmNvbS9kZXY9MQ=="}],"RegisteredDevices":{"example.com/gpu":["gpu-0","gpu-1","gpu-2","gpu-9"],"example.com/nic":["nic-a"]}},"Checksum":1389290435}"#,
    },
    Vector {
        data: r#"{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":null,"AllocResp":null}],"RegisteredDevices":null}"#,
        text: "…[{PodUID:(string)p ContainerName:(string)c ResourceName:(string)r DeviceIDs:(checkpoint.DevicesPerNUMA)<nil> AllocResp:([]uint8)<nil>}] RegisteredDevices:(map[string][]string)<nil>}",
        checksum: 2_629_760_702,
        go_json: r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":null,"AllocResp":null}],"RegisteredDevices":null},"Checksum":2629760702}"#,
    },
    Vector {
        data: r#"{"PodDeviceEntries":[],"RegisteredDevices":{}}"#,
        text: "…[] RegisteredDevices:(map[string][]string)map[]}",
        checksum: 2_932_075_448,
        go_json: r#"{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":2932075448}"#,
    },
    Vector {
        data: r#"{"registereddevices":{"r":null}}"#,
        text: "…[] RegisteredDevices:(map[string][]string)map[r:<nil>]}",
        checksum: 1_035_705_531,
        go_json: r#"{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{"r":null}},"Checksum":1035705531}"#,
    },
    Vector {
        data: r#"{"PodDeviceEntries":[{"PodUID":"p","DeviceIDs":{"10":["a"],"2":["b"],"-1":[]},"AllocResp":""}]}"#,
        text: "…[{PodUID:(string)p ContainerName:(string) ResourceName:(string) DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[] 2:[b] 10:[a]] AllocResp:([]uint8)[]}] RegisteredDevices:(map[string][]string)map[]}",
        checksum: 706_136_368,
        go_json: r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"","ResourceName":"","DeviceIDs":{"-1":[],"10":["a"],"2":["b"]},"AllocResp":""}],"RegisteredDevices":{}},"Checksum":706136368}"#,
    },
];

fn file_with(data: &str, sum: u64) -> Vec<u8> {
    format!("{{\"Data\":{data},\"Checksum\":{sum}}}").into_bytes()
}

#[test]
fn s3_6_all_seven_vectors_verify_hash_text_checksum_and_reencode_byte_identically() {
    for (i, v) in VECTORS.iter().enumerate() {
        let decoded = decode(&file_with(v.data, u64::from(v.checksum)))
            .unwrap_or_else(|e| panic!("vector {}: decode failed: {e}", i + 1));
        assert_eq!(decoded.format, DeviceCheckpointFormat::V2);
        let expected_text = v.text.replacen('…', PREFIX, 1);
        assert_eq!(
            spew_text(&decoded.data),
            expected_text,
            "vector {} hash text",
            i + 1
        );
        assert_eq!(
            checksum(&decoded.data),
            v.checksum,
            "vector {} checksum",
            i + 1
        );
        assert_eq!(decoded.checksum, v.checksum);
        let ours = encode(&decoded.data);
        assert_eq!(
            String::from_utf8_lossy(&ours),
            v.go_json,
            "vector {} encoding",
            i + 1
        );
    }
}

#[test]
fn s3_2_real_example_is_reproduced_byte_for_byte_from_typed_values() {
    use devicelet_checkpoint::device::PodDevicesEntry;
    use std::collections::BTreeMap;
    let alloc = devicelet_checkpoint::base64::decode(
        "CgoKA0ZPTxIDYmFyGhgKCC9kZXYvZm9vEggvZGV2L2ZvbxoCcncqEgoQdmVuZG9yLmNvbS9kZXY9MQ==",
    )
    .expect("valid base64");
    let data = DeviceCheckpointData {
        pod_device_entries: Some(vec![PodDevicesEntry {
            pod_uid: "5d9c1f8e-0000-4000-8000-000000000001".into(),
            container_name: "ctr".into(),
            resource_name: "example.com/gpu".into(),
            device_ids: Some(BTreeMap::from([
                (0, Some(vec!["gpu-0".into(), "gpu-1".into()])),
                (-1, Some(vec!["gpu-9".into()])),
            ])),
            alloc_resp: Some(alloc),
        }]),
        registered_devices: Some(BTreeMap::from([
            (
                "example.com/gpu".to_string(),
                Some(vec![
                    "gpu-0".into(),
                    "gpu-1".into(),
                    "gpu-2".into(),
                    "gpu-9".into(),
                ]),
            ),
            ("example.com/nic".to_string(), Some(vec!["nic-a".into()])),
        ])),
    };
    assert_eq!(String::from_utf8_lossy(&encode(&data)), VECTORS[2].go_json);
}

#[test]
fn go_html_escaping_control_characters_and_sort_orders_match_go() {
    // Go: json.Marshal escapes <>& and U+2028, uses \b \f short escapes; spew inserts strings raw.
    let data = r#"{"PodDeviceEntries":[{"PodUID":"a<b>&c\u2028 x:y]","ContainerName":"\u0001\b\f\n\t\"\\é","ResourceName":"r","DeviceIDs":{"1":["x y"],"-1":null},"AllocResp":"AAEC/w=="}],"RegisteredDevices":{"b":["2","1"],"a":null,"B":[]}}"#;
    let go_json = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"a\u003cb\u003e\u0026c\u2028 x:y]","ContainerName":"\u0001\b\f\n\t\"\\é","ResourceName":"r","DeviceIDs":{"-1":null,"1":["x y"]},"AllocResp":"AAEC/w=="}],"RegisteredDevices":{"B":[],"a":null,"b":["2","1"]}},"Checksum":3990967929}"#;
    let go_text = "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)a<b>&c\u{2028} x:y] ContainerName:(string)\u{1}\u{8}\u{c}\n\t\"\\é ResourceName:(string)r DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:<nil> 1:[x y]] AllocResp:([]uint8)[0 1 2 255]}] RegisteredDevices:(map[string][]string)map[B:[] a:<nil> b:[2 1]]}";
    let decoded = decode(&file_with(data, 3_990_967_929)).expect("verifies");
    assert_eq!(spew_text(&decoded.data), go_text);
    assert_eq!(String::from_utf8_lossy(&encode(&decoded.data)), go_json);
    // And our own output decodes back to the same data.
    assert_eq!(
        decode(go_json.as_bytes()).expect("round trip").data,
        decoded.data
    );
}

#[test]
fn legacy_pre_1_20_layout_is_verified_with_its_own_checksum_and_moved_to_numa_0() {
    // Checksum from the Go program using checkpointv1.go's algorithm.
    let file = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":["d1","d2"],"AllocResp":"CgA="}],"RegisteredDevices":{"r":["d1","d2"]}},"Checksum":712602274}"#;
    let decoded = decode(file.as_bytes()).expect("legacy layout verifies");
    assert_eq!(decoded.format, DeviceCheckpointFormat::V1Legacy);
    let entries = decoded.data.pod_device_entries.expect("entries");
    assert_eq!(
        entries[0]
            .device_ids
            .as_ref()
            .and_then(|m| m.get(&0))
            .cloned(),
        Some(Some(vec!["d1".to_string(), "d2".to_string()]))
    );
    assert_eq!(entries[0].alloc_resp.as_deref(), Some(&[10u8, 0][..]));
    // With a wrong checksum the legacy file is refused, reporting the v2 shape problem.
    let bad = file.replace("712602274", "712602275");
    assert!(matches!(
        decode(bad.as_bytes()),
        Err(DecodeError::WrongShape { .. })
    ));
}

#[test]
fn decode_errors_say_which_failure_it_is() {
    assert_eq!(decode(b""), Err(DecodeError::Empty));
    let full = VECTORS[2].go_json.as_bytes();
    assert!(matches!(
        decode(&full[..full.len() / 2]),
        Err(DecodeError::Truncated { .. })
    ));
    assert!(matches!(
        decode(b"not json"),
        Err(DecodeError::NotJson { .. })
    ));
    assert!(matches!(
        decode(b"{\"Data\":{}} trailing"),
        Err(DecodeError::NotJson { .. })
    ));
    assert!(matches!(
        decode(b"[1,2]"),
        Err(DecodeError::WrongShape { .. })
    ));
    let wrong_sum = file_with(VECTORS[2].data, 1);
    match decode(&wrong_sum) {
        Err(DecodeError::ChecksumMismatch {
            stored, computed, ..
        }) => {
            assert_eq!(stored, 1);
            assert_eq!(computed, 1_389_290_435);
        }
        other => panic!("expected checksum mismatch, got {other:?}"),
    }
    // A flipped byte inside a string changes the content, so the checksum no longer matches.
    let mut flipped = full.to_vec();
    let pos = VECTORS[2].go_json.find("gpu-9").expect("present") + 4;
    flipped[pos] = b'8';
    assert!(matches!(
        decode(&flipped),
        Err(DecodeError::ChecksumMismatch { .. })
    ));
}

#[test]
fn unknown_fields_are_ignored_like_the_kubelet_but_refused_when_strict() {
    let file = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{},"Extra":1},"Checksum":3467439661,"Version":2}"#;
    let lenient = decode(file.as_bytes()).expect("kubelet ignores unknown keys");
    assert_eq!(
        lenient.unknown_fields,
        vec!["Data.Extra".to_string(), "Version".to_string()]
    );
    match decode_strict(file.as_bytes()) {
        Err(DecodeError::UnknownFields { fields, .. }) => assert_eq!(fields.len(), 2),
        other => panic!("expected unknown fields, got {other:?}"),
    }
}

#[test]
fn missing_checksum_field_reads_as_zero_and_fails_verification() {
    let file = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}}}"#;
    assert!(matches!(
        decode(file.as_bytes()),
        Err(DecodeError::ChecksumMismatch { stored: 0, .. })
    ));
    // `device::DEVICE_CHECKPOINT_FILE` is the name the kubelet uses.
    assert_eq!(
        device::DEVICE_CHECKPOINT_FILE,
        "kubelet_internal_checkpoint"
    );
}
