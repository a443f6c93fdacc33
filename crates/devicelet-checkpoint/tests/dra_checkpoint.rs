//! `dra_manager_state` vectors. Spec vectors (dra-kubelet.md §3.1) were cross-checked with an
//! independent computation: a throw-away Go program running `crc32.ChecksumIEEE` and
//! `json.Marshal` of the kubelet's envelope struct (not committed); it printed exactly the
//! envelopes asserted below. The older-layout files are upstream's
//! `pkg/kubelet/cm/dra/state/checkpointer_test.go` fixtures.

use std::collections::{BTreeMap, BTreeSet};

use devicelet_checkpoint::DecodeError;
use devicelet_checkpoint::dra::{self, ClaimInfoState, DraDevice, DraLayout, DriverState};
use devicelet_checkpoint::hash::crc32_ieee;

fn example(share_id: Option<&str>) -> ClaimInfoState {
    ClaimInfoState {
        claim_uid: "067798be-454e-4be4-9047-1aa06aea63f7".into(),
        claim_name: "example".into(),
        namespace: "default".into(),
        pod_uids: Some(BTreeSet::from([
            "139cdb46-f989-4f17-9561-ca10cfb509a6".to_string()
        ])),
        driver_state: Some(BTreeMap::from([(
            "test-driver.cdi.k8s.io".to_string(),
            DriverState {
                devices: Some(vec![DraDevice {
                    pool_name: "worker-1".into(),
                    device_name: "dev-1".into(),
                    share_id: share_id.map(str::to_string),
                    request_names: Some(vec!["test request".into()]),
                    cdi_device_ids: Some(vec!["example.com/example=cdi-example".into()]),
                }]),
            },
        )])),
    }
}

#[test]
fn spec_3_1_vectors_reproduce_the_checksums() {
    let cases: [(Option<Vec<ClaimInfoState>>, u32); 4] = [
        (Some(vec![example(None)]), 2_570_581_864),
        (
            Some(vec![example(Some("aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"))]),
            736_302_156,
        ),
        (None, 4_010_664_294),
        (Some(vec![]), 2_361_995_144),
    ];
    for (claims, sum) in cases {
        let data = dra::encode_data(claims.as_deref());
        assert_eq!(crc32_ieee(data.as_bytes()), sum, "{data}");
        let file = dra::encode(claims.as_deref());
        let decoded = dra::decode(&file).expect("verifies");
        assert_eq!(decoded.checksum, sum);
        assert_eq!(decoded.claims, claims);
        assert_eq!(decoded.layout, DraLayout::ClaimInfoStateList);
        assert!(dra::decode_strict(&file).is_ok());
    }
}

#[test]
fn envelope_bytes_match_go_json_marshal() {
    assert_eq!(
        String::from_utf8(dra::encode(None)).expect("utf8"),
        r#"{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":null}","Checksum":4010664294}"#
    );
    assert_eq!(
        String::from_utf8(dra::encode(Some(&[example(None)]))).expect("utf8"),
        r#"{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"ShareID\":null,\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":2570581864}"#
    );
}

#[test]
fn html_characters_in_the_data_string_are_escaped_like_go() {
    let claim = ClaimInfoState {
        claim_name: "a<b>&c".into(),
        ..ClaimInfoState::default()
    };
    let file = String::from_utf8(dra::encode(Some(&[claim]))).expect("utf8");
    // Inner JSON escapes `<` as \u003c; the envelope then escapes that backslash.
    assert!(file.contains(r#"a\\u003cb\\u003e\\u0026c"#), "{file}");
    assert!(dra::decode(file.as_bytes()).is_ok());
}

#[test]
fn upstream_fixtures_of_older_layouts_verify() {
    let entries_layout = r#"{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"Entries\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":1597924435}"#;
    let cp = dra::decode(entries_layout.as_bytes()).expect("verifies");
    assert_eq!(cp.layout, DraLayout::LegacyEntries);
    assert_eq!(cp.claims.as_ref().map(Vec::len), Some(1));

    let no_share_id = r#"{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example-1\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}},{\"ClaimUID\":\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\",\"ClaimName\":\"example-2\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-2\",\"RequestNames\":null,\"CDIDeviceIDs\":null}]}}}]}","Checksum":1582256999}"#;
    let cp = dra::decode(no_share_id.as_bytes()).expect("verifies");
    let claims = cp.claims.expect("claims");
    assert_eq!(claims.len(), 2);
    let dev2 = &claims[1].driver_state.as_ref().expect("drivers")["test-driver.cdi.k8s.io"]
        .devices
        .as_ref()
        .expect("devices")[0];
    assert_eq!(dev2.request_names, None);
    assert_eq!(dev2.share_id, None);

    // Upstream's "incorrect-checksum" fixture.
    let corrupted = no_share_id
        .replace("ClaimInfoStateList", "Entries")
        .replace("1582256999", "2930258365");
    assert!(matches!(
        dra::decode(corrupted.as_bytes()),
        Err(DecodeError::ChecksumMismatch {
            algorithm: "crc32-ieee",
            ..
        })
    ));
    assert!(matches!(
        dra::decode(b"{"),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn strict_decoding_names_an_unknown_version() {
    let data = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v9","ClaimInfoStateList":null}"#;
    let file = format!(
        "{{\"Data\":{},\"Checksum\":{}}}",
        serde_json::to_string(data).expect("json"),
        crc32_ieee(data.as_bytes())
    );
    let lenient = dra::decode(file.as_bytes()).expect("the kubelet never checks the version");
    assert_eq!(lenient.api_version, "checkpoint.dra.kubelet.k8s.io/v9");
    match dra::decode_strict(file.as_bytes()) {
        Err(DecodeError::UnknownVersion { found, .. }) => assert!(found.contains("/v9")),
        other => panic!("unexpected {other:?}"),
    }
}
