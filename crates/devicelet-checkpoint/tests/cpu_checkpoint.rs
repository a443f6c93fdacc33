//! `cpu_manager_state` vectors. The checksums are the ones in upstream
//! `pkg/kubelet/cm/cpumanager/state/state_checkpoint_test.go` (`TestCheckpointStateRestore`);
//! the hashed texts and the re-marshalled JSON were printed by a throw-away Go program using the
//! vendored go-spew and `encoding/json` (not committed).

use std::collections::BTreeMap;

use devicelet_checkpoint::DecodeError;
use devicelet_checkpoint::cpu::{self, CpuCheckpointEntries, CpuChecksumStatus};
use devicelet_checkpoint::cpuset::CpuSet;

#[test]
fn upstream_restore_vectors_verify() {
    // (file content, format is v1?, checksum)
    let cases: [(&str, bool, u64); 6] = [
        (
            r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}"#,
            false,
            354_655_845,
        ),
        (
            r#"{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": {"container1": "4-6", "container2": "1-3"}}, "checksum": 3610638499}"#,
            false,
            3_610_638_499,
        ),
        (
            r#"{"policyName": "other", "defaultCPUSet": "1-3", "entries": {}, "checksum": 1394507217}"#,
            false,
            1_394_507_217,
        ),
        (
            r#"{"policyName": "none", "defaultCPUSet": "1.3", "entries": {}, "checksum": 3021697696}"#,
            false,
            3_021_697_696,
        ),
        (
            r#"{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}"#,
            true,
            1_694_838_852,
        ),
        (
            r#"{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"containerID1": "4-6", "containerID2": "1-3"}, "checksum": 3680390589}"#,
            true,
            3_680_390_589,
        ),
    ];
    for (file, v1, sum) in cases {
        let cp = cpu::decode(file.as_bytes()).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(cp.checksum, sum);
        assert_eq!(cp.checksum_status, CpuChecksumStatus::Verified);
        assert_eq!(
            matches!(cp.entries, CpuCheckpointEntries::V1(_)),
            v1,
            "{file}"
        );
    }
    // The kubelet rejects "1.3" and "asd" only when parsing the cpuset, after the checksum passed.
    let cp = cpu::decode(
        br#"{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": {"container1": "4-6", "container2": "asd"}}, "checksum": 962272150}"#,
    )
    .expect("checksum verifies");
    let CpuCheckpointEntries::V2(Some(entries)) = cp.entries else {
        panic!("v2 entries expected");
    };
    let bad = entries["pod"].as_ref().expect("containers")["container2"].clone();
    assert_eq!(
        CpuSet::parse(&bad).map_err(|e| e.to_string()),
        Err(r#"strconv.Atoi: parsing "asd": invalid syntax"#.to_string())
    );
}

#[test]
fn wrong_checksum_and_bad_json_are_typed() {
    match cpu::decode(
        br#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 1337}"#,
    ) {
        Err(DecodeError::ChecksumMismatch {
            stored: 1337,
            computed,
            ..
        }) => assert_eq!(computed, 354_655_845),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        cpu::decode(b"{"),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn zero_checksum_is_accepted_unverified_like_the_kubelet() {
    let cp = cpu::decode(br#"{"policyName":"none","defaultCpuSet":"0-7","checksum":0}"#)
        .expect("accepted");
    assert_eq!(cp.checksum_status, CpuChecksumStatus::NotPresent);
}

#[test]
fn encoder_matches_go_output_byte_for_byte() {
    let entries = BTreeMap::from([(
        "pod".to_string(),
        BTreeMap::from([
            ("container1".to_string(), "4-6".to_string()),
            ("container2".to_string(), "1-3".to_string()),
        ]),
    )]);
    assert_eq!(
        String::from_utf8(cpu::encode("none", "1-3", &entries)).expect("utf8"),
        r#"{"policyName":"none","defaultCpuSet":"1-3","entries":{"pod":{"container1":"4-6","container2":"1-3"}},"checksum":3610638499}"#
    );
    // Empty entries are omitted but hashed as an empty map.
    assert_eq!(
        String::from_utf8(cpu::encode("none", "4-6", &BTreeMap::new())).expect("utf8"),
        r#"{"policyName":"none","defaultCpuSet":"4-6","checksum":354655845}"#
    );
    // HTML escaping, empty cpuset values; Go printed exactly this (checksum 352301725).
    let entries = BTreeMap::from([(
        "p<1>".to_string(),
        BTreeMap::from([
            ("c&".to_string(), "4-6".to_string()),
            ("z".to_string(), String::new()),
        ]),
    )]);
    let ours = cpu::encode("static", "0,2-3", &entries);
    assert_eq!(
        String::from_utf8(ours.clone()).expect("utf8"),
        r#"{"policyName":"static","defaultCpuSet":"0,2-3","entries":{"p\u003c1\u003e":{"c\u0026":"4-6","z":""}},"checksum":352301725}"#
    );
    assert_eq!(
        cpu::decode(&ours).expect("round trip").checksum_status,
        CpuChecksumStatus::Verified
    );
}

#[test]
fn null_inner_and_outer_maps_hash_as_nil() {
    // Go hashed this content (with "q":null) to 3787567279, printing this text.
    let text = cpu::spew_text(
        "static",
        "0,2-3",
        &CpuCheckpointEntries::V2(Some(BTreeMap::from([
            (
                "p<1>".to_string(),
                Some(BTreeMap::from([
                    ("c&".to_string(), "4-6".to_string()),
                    ("z".to_string(), String::new()),
                ])),
            ),
            ("q".to_string(), None),
        ]))),
    );
    assert_eq!(
        text,
        "(*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)0,2-3 Entries:(map[string]map[string]string)map[p<1>:map[c&:4-6 z:] q:<nil>] Checksum:(checksum.Checksum)0}"
    );
    assert_eq!(
        cpu::checksum(
            "static",
            "0,2-3",
            &CpuCheckpointEntries::V2(Some(BTreeMap::from([
                (
                    "p<1>".to_string(),
                    Some(BTreeMap::from([
                        ("c&".to_string(), "4-6".to_string()),
                        ("z".to_string(), String::new())
                    ])),
                ),
                ("q".to_string(), None),
            ])))
        ),
        3_787_567_279
    );
    let nil_text = cpu::spew_text("none", "", &CpuCheckpointEntries::V2(None));
    assert!(nil_text.contains("Entries:(map[string]map[string]string)<nil>"));
    assert_eq!(
        cpu::checksum("none", "", &CpuCheckpointEntries::V2(None)),
        3_278_619_453
    );
}
