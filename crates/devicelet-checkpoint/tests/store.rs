//! DeviceStore durability, crash recovery and corruption handling, on real files.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use devicelet_checkpoint::DecodeError;
use devicelet_checkpoint::device;
use devicelet_checkpoint::journal::{self, JournalRecord, encode_record};
use devicelet_checkpoint::state::{Change, DeviceState};
use devicelet_checkpoint::store::{
    Corruption, DeviceStore, KubeletFileOrigin, RecoverAction, StoreError, StoreOptions,
    StorePaths, recover,
};

struct Root {
    _dir: tempfile::TempDir,
    kubelet_dir: PathBuf,
    journal_dir: PathBuf,
}

impl Root {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubelet_dir = dir.path().join("device-plugins");
        let journal_dir = dir.path().join("devicelet");
        Root {
            _dir: dir,
            kubelet_dir,
            journal_dir,
        }
    }
    fn paths(&self) -> StorePaths {
        StorePaths::new(&self.kubelet_dir, &self.journal_dir)
    }
    fn open(
        &self,
    ) -> Result<(DeviceStore, devicelet_checkpoint::store::RecoveredState), StoreError> {
        DeviceStore::open_with(self.paths(), manual())
    }
}

fn manual() -> StoreOptions {
    StoreOptions {
        background_compaction: false,
        ..StoreOptions::default()
    }
}

fn add(pod: &str, container: &str, devices: &[&str]) -> Change {
    Change::AddContainer {
        pod_uid: pod.into(),
        container: container.into(),
        resource: "example.com/gpu".into(),
        device_ids_by_numa: BTreeMap::from([(0, devices.iter().map(|d| d.to_string()).collect())]),
        alloc_resp: vec![10, 3, b'a', b'b', b'c'],
    }
}

fn state_after(changes: &[Change]) -> DeviceState {
    let mut s = DeviceState::default();
    for c in changes {
        s.apply(c);
    }
    s
}

fn entries_in_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn committed_changes_survive_reopen_and_close_writes_a_kubelet_readable_file() {
    let root = Root::new();
    let changes = vec![
        Change::SetRegistered {
            resource: "example.com/gpu".into(),
            device_ids: vec!["gpu-0".into(), "gpu-1".into()],
        },
        add("pod-a", "c1", &["gpu-0"]),
        add("pod-b", "c1", &["gpu-1"]),
        Change::RemovePod {
            pod_uid: "pod-a".into(),
        },
    ];
    {
        let (store, recovered) = root.open().expect("fresh open");
        assert!(recovered.journal_created);
        assert_eq!(recovered.kubelet_file, KubeletFileOrigin::Missing);
        for c in &changes {
            store.commit(std::slice::from_ref(c)).expect("commit");
        }
        assert_eq!(store.snapshot(), state_after(&changes));
        // Crash (no clean shutdown): the kubelet file was never written.
    }
    assert!(!root.paths().kubelet_file.exists());
    let (store, recovered) = root.open().expect("reopen");
    assert_eq!(*recovered.state, state_after(&changes));
    assert_eq!(recovered.records_replayed, 4);
    store.close().expect("clean shutdown compacts");

    let bytes = fs::read(root.paths().kubelet_file).expect("kubelet file exists");
    let decoded = device::decode(&bytes).expect("the kubelet file verifies");
    assert_eq!(
        DeviceState::from_checkpoint(&decoded.data),
        state_after(&changes)
    );
    let (_store, recovered) = root.open().expect("reopen after compaction");
    assert_eq!(recovered.records_replayed, 0);
    assert_eq!(*recovered.state, state_after(&changes));
}

#[test]
fn truncating_the_journal_at_every_offset_of_the_last_record_recovers_exactly_the_acknowledged_prefix()
 {
    let root = Root::new();
    let acknowledged = vec![add("pod-a", "c", &["gpu-0"]), add("pod-b", "c", &["gpu-1"])];
    let in_flight = add("pod-c", "c", &["gpu-2"]);
    let (before, full) = {
        let (store, _) = root.open().expect("open");
        for c in &acknowledged {
            store.commit(std::slice::from_ref(c)).expect("commit");
        }
        let before = fs::read(&root.paths().journal).expect("journal");
        store
            .commit(std::slice::from_ref(&in_flight))
            .expect("commit");
        (before, fs::read(&root.paths().journal).expect("journal"))
    };
    assert!(full.len() > before.len());
    for cut in before.len()..full.len() {
        fs::write(root.paths().journal, &full[..cut]).expect("write truncated journal");
        let (store, recovered) = root.open().unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(
            *recovered.state,
            state_after(&acknowledged),
            "cut at byte {cut}"
        );
        assert_eq!(recovered.torn_tail.is_some(), cut > before.len());
        drop(store);
        // The torn tail was cut off, so the next append starts on a record boundary.
        assert_eq!(fs::read(root.paths().journal).expect("journal"), before);
    }
    fs::write(root.paths().journal, &full).expect("restore");
    let (_s, recovered) = root.open().expect("open full");
    assert_eq!(
        *recovered.state,
        state_after(&[acknowledged, vec![in_flight]].concat())
    );
}

#[test]
fn a_flipped_byte_in_the_journal_quarantines_it_and_recovery_needs_the_operator() {
    let root = Root::new();
    {
        let (store, _) = root.open().expect("open");
        store
            .commit(&[add("pod-a", "c", &["gpu-0"])])
            .expect("commit");
        store
            .commit(&[add("pod-b", "c", &["gpu-1"])])
            .expect("commit");
    }
    let mut bytes = fs::read(root.paths().journal).expect("journal");
    let mid = journal::HEADER_LEN + 20;
    bytes[mid] ^= 0x40;
    fs::write(root.paths().journal, &bytes).expect("damage");

    let err = root.open().expect_err("damaged journal is refused");
    assert!(err.ownership_unknown(), "{err}");
    let StoreError::Corrupt {
        moved_to, cause, ..
    } = &err
    else {
        panic!("expected Corrupt, got {err}");
    };
    assert!(
        matches!(
            cause,
            Corruption::Journal(journal::JournalError::CorruptRecord { .. })
        ),
        "{cause}"
    );
    let moved = moved_to.clone().expect("moved aside");
    assert_eq!(
        fs::read(&moved).expect("evidence kept"),
        bytes,
        "evidence is kept byte for byte"
    );
    assert!(
        moved
            .file_name()
            .expect("name")
            .to_string_lossy()
            .contains(".corrupt-")
    );

    // Until the operator acts, every open refuses (no silent fresh start).
    let again = root.open().expect_err("still quarantined");
    assert!(matches!(again, StoreError::Quarantined { .. }), "{again}");
    assert!(again.ownership_unknown());

    let report = recover(&root.paths(), RecoverAction::StartEmpty).expect("recover");
    assert!(report.cleared_quarantine);
    let (_s, recovered) = root.open().expect("open after recovery");
    assert_eq!(*recovered.state, DeviceState::default());
    assert!(moved.exists(), "recovery never deletes evidence");
}

#[test]
fn an_empty_kubelet_file_is_corruption_not_a_fresh_start() {
    let root = Root::new();
    fs::create_dir_all(&root.kubelet_dir).expect("mkdir");
    fs::write(root.paths().kubelet_file, b"").expect("empty file");
    let err = root.open().expect_err("empty file refused");
    match &err {
        StoreError::Corrupt {
            cause: Corruption::Checkpoint(DecodeError::Empty),
            moved_to: Some(_),
            ..
        } => {}
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn an_empty_journal_is_corruption() {
    let root = Root::new();
    fs::create_dir_all(&root.journal_dir).expect("mkdir");
    fs::write(root.paths().journal, b"").expect("empty journal");
    let err = root.open().expect_err("refused");
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                cause: Corruption::Journal(journal::JournalError::Empty),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_directory_in_place_of_the_kubelet_file_is_moved_aside() {
    let root = Root::new();
    let path = root.paths().kubelet_file;
    fs::create_dir_all(path.join("sub")).expect("mkdir");
    let err = root.open().expect_err("refused");
    let StoreError::Corrupt {
        cause: Corruption::NotARegularFile("directory"),
        moved_to: Some(moved),
        ..
    } = &err
    else {
        panic!("unexpected {err}");
    };
    assert!(moved.join("sub").is_dir());
    assert!(!path.exists());
}

#[test]
fn a_truncated_or_bad_checksum_kubelet_file_is_quarantined_with_a_typed_cause() {
    for (name, damage) in [
        (
            "truncated",
            (|b: &mut Vec<u8>| b.truncate(b.len() / 2)) as fn(&mut Vec<u8>),
        ),
        ("wrong checksum", |b: &mut Vec<u8>| {
            let text = String::from_utf8(b.clone()).expect("utf8");
            let i = text.rfind("\"Checksum\":").expect("key") + 11;
            b[i] = if b[i] == b'1' { b'2' } else { b'1' };
        }),
    ] {
        let root = Root::new();
        {
            let (store, _) = root.open().expect("open");
            store
                .commit(&[add("pod-a", "c", &["gpu-0"])])
                .expect("commit");
            store.close().expect("close");
        }
        let mut bytes = fs::read(root.paths().kubelet_file).expect("file");
        damage(&mut bytes);
        fs::write(root.paths().kubelet_file, &bytes).expect("write");
        let err = root.open().expect_err(name);
        match (&err, name) {
            (
                StoreError::Corrupt {
                    cause: Corruption::Checkpoint(DecodeError::Truncated { .. }),
                    ..
                },
                "truncated",
            )
            | (
                StoreError::Corrupt {
                    cause: Corruption::Checkpoint(DecodeError::ChecksumMismatch { .. }),
                    ..
                },
                "wrong checksum",
            ) => {}
            _ => panic!("{name}: unexpected {err}"),
        }
        // Operator puts a good copy back and imports it.
        fs::write(
            root.paths().kubelet_file,
            device::encode(&state_after(&[add("pod-a", "c", &["gpu-0"])]).to_checkpoint()),
        )
        .expect("restore");
        let report = recover(&root.paths(), RecoverAction::ImportKubeletFile).expect("import");
        assert_eq!(report.imported_entries, Some(1));
        let (_s, recovered) = root.open().expect("open");
        assert_eq!(
            *recovered.state,
            state_after(&[add("pod-a", "c", &["gpu-0"])])
        );
    }
}

#[test]
fn an_unknown_journal_version_is_refused_and_left_in_place() {
    let root = Root::new();
    fs::create_dir_all(&root.journal_dir).expect("mkdir");
    let header = journal::JournalHeader {
        version: 99,
        flags: 0,
        base: journal::NO_BASE,
        first_seq: 1,
    };
    fs::write(root.paths().journal, header.encode()).expect("write");
    let err = root.open().expect_err("refused");
    assert!(
        matches!(err, StoreError::UnknownJournalVersion { found: 99, .. }),
        "{err}"
    );
    assert!(err.ownership_unknown());
    assert!(root.paths().journal.exists(), "not damaged, so not moved");
    assert_eq!(
        entries_in_dir(&root.journal_dir),
        vec!["device-allocations.journal".to_string()]
    );
}

#[test]
fn a_kubelet_file_replaced_behind_our_back_does_not_mix_with_the_journal() {
    let root = Root::new();
    {
        let (store, _) = root.open().expect("open");
        store
            .commit(&[add("pod-a", "c", &["gpu-0"])])
            .expect("commit");
    }
    // Someone (e.g. a kubelet) writes a different checkpoint.
    let other = state_after(&[add("pod-z", "c", &["gpu-0"])]);
    fs::write(
        root.paths().kubelet_file,
        device::encode(&other.to_checkpoint()),
    )
    .expect("write");
    let err = root.open().expect_err("refused");
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                cause: Corruption::BaseMismatch { .. },
                ..
            }
        ),
        "{err}"
    );
    // Taking the kubelet's file as the truth is the explicit way out.
    recover(&root.paths(), RecoverAction::ImportKubeletFile).expect("import");
    let (_s, recovered) = root.open().expect("open");
    assert_eq!(*recovered.state, other);
}

#[test]
fn importing_a_kubelet_checkpoint_on_first_start_takes_it_over() {
    let root = Root::new();
    fs::create_dir_all(&root.kubelet_dir).expect("mkdir");
    // The spec's real example (§3.2), as a kubelet wrote it.
    let kubelet = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"5d9c1f8e-0000-4000-8000-000000000001","ContainerName":"ctr","ResourceName":"example.com/gpu","DeviceIDs":{"-1":["gpu-9"],"0":["gpu-0","gpu-1"]},"AllocResp":"CgoKA0ZPTxIDYmFyGhgKCC9kZXYvZm9vEggvZGV2L2ZvbxoCcncqEgoQdmVuZG9yLmNvbS9kZXY9MQ=="}],"RegisteredDevices":{"example.com/gpu":["gpu-0","gpu-1","gpu-2","gpu-9"],"example.com/nic":["nic-a"]}},"Checksum":1389290435}"#;
    fs::write(root.paths().kubelet_file, kubelet).expect("write");
    let (store, recovered) = root.open().expect("open");
    assert!(matches!(
        recovered.kubelet_file,
        KubeletFileOrigin::Loaded { entries: 1, .. }
    ));
    let held = recovered
        .state
        .get(
            "5d9c1f8e-0000-4000-8000-000000000001",
            "ctr",
            "example.com/gpu",
        )
        .expect("allocation restored");
    assert_eq!(
        held.device_ids_by_numa.get(&-1),
        Some(&vec!["gpu-9".to_string()])
    );
    assert_eq!(recovered.state.registered.len(), 2);
    store
        .commit(&[add("pod-new", "c", &["gpu-2"])])
        .expect("commit");
    store.close().expect("close");
    let decoded =
        device::decode(&fs::read(root.paths().kubelet_file).expect("read")).expect("verifies");
    assert_eq!(decoded.data.pod_device_entries.map(|e| e.len()), Some(2));
}

#[test]
fn a_crash_at_any_compaction_step_recovers_the_same_state() {
    let changes = [add("pod-a", "c", &["gpu-0"]), add("pod-b", "c", &["gpu-1"])];
    let expected = state_after(&changes);
    // Crash after the marker but before/after the kubelet file was replaced, before the journal
    // was rotated: rebuild those on-disk states from the journal format.
    for kubelet_file_replaced in [false, true] {
        let root = Root::new();
        let old_journal = {
            let (store, _) = root.open().expect("open");
            store.commit(&changes[..1]).expect("commit");
            store.compact().expect("compact");
            store.commit(&changes[1..]).expect("commit");
            fs::read(root.paths().journal).expect("journal")
        };
        let old_kubelet = fs::read(root.paths().kubelet_file).expect("kubelet");
        let parsed = journal::parse(&old_journal).expect("parse");
        let new_sum = device::checksum(&expected.to_checkpoint());
        let mut crashed = old_journal.clone();
        crashed.extend(
            encode_record(&JournalRecord::CompactionStarted {
                seq: parsed.next_seq(),
                kubelet_checksum: u64::from(new_sum),
            })
            .expect("encode"),
        );
        fs::write(root.paths().journal, &crashed).expect("write journal");
        if kubelet_file_replaced {
            fs::write(
                root.paths().kubelet_file,
                device::encode(&expected.to_checkpoint()),
            )
            .expect("write");
        } else {
            fs::write(root.paths().kubelet_file, &old_kubelet).expect("write");
        }
        let (store, recovered) = root.open().expect("recovers");
        assert_eq!(
            *recovered.state, expected,
            "kubelet file replaced: {kubelet_file_replaced}"
        );
        assert_eq!(
            recovered.records_replayed,
            u64::from(!kubelet_file_replaced)
        );
        store.close().expect("close");
        let (_s, again) = root.open().expect("reopen");
        assert_eq!(*again.state, expected);
    }
}

#[test]
fn a_commit_group_is_one_record_and_one_fsync_and_an_invalid_commit_fails_alone() {
    let root = Root::new();
    let (store, _) = root.open().expect("open");
    let results = store.commit_group(vec![
        vec![add("pod-a", "c", &["d-a"])],
        vec![add("", "c", &["d-x"])],
        vec![add("pod-b", "c", &["d-b"]), add("pod-b", "d", &["d-c"])],
    ]);
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    let err = results[1].as_ref().expect_err("empty pod UID");
    assert!(err.to_string().contains("pod_uid"), "{err}");
    let stats = store.stats();
    assert_eq!(stats.commits, 2, "the valid commits");
    assert_eq!(stats.journal_syncs, 1, "one fsync for the group");
    drop(store);
    let (_s, recovered) = root.open().expect("reopen");
    let pods: Vec<&String> = recovered.state.pods.keys().collect();
    assert_eq!(pods, ["pod-a", "pod-b"]);
}

#[test]
fn concurrent_commits_are_all_durable_and_share_fsyncs() {
    let root = Root::new();
    let (store, _) = root.open().expect("open");
    let threads = 8;
    let per_thread = 25;
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = &store;
            s.spawn(move || {
                for i in 0..per_thread {
                    store
                        .commit(&[add(&format!("pod-{t}-{i}"), "c", &[&format!("d-{t}-{i}")])])
                        .expect("commit");
                }
            });
        }
    });
    let stats = store.stats();
    assert_eq!(stats.commits, threads * per_thread);
    assert!(stats.journal_syncs <= stats.commits);
    drop(store);
    let (_s, recovered) = root.open().expect("reopen");
    assert_eq!(recovered.state.pods.len() as u64, threads * per_thread);
}

#[test]
fn background_compaction_keeps_the_kubelet_file_within_the_lag_bound() {
    let root = Root::new();
    let max_lag = Duration::from_millis(100);
    let (store, _) = DeviceStore::open_with(
        root.paths(),
        StoreOptions {
            max_lag,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    store
        .commit(&[add("pod-a", "c", &["gpu-0"])])
        .expect("commit");
    let acknowledged = Instant::now();
    let deadline = acknowledged + Duration::from_secs(5);
    loop {
        let caught_up = fs::read(root.paths().kubelet_file)
            .ok()
            .and_then(|bytes| device::decode(&bytes).ok())
            .is_some_and(|d| {
                DeviceState::from_checkpoint(&d.data)
                    .get("pod-a", "c", "example.com/gpu")
                    .is_some()
            });
        if caught_up {
            break;
        }
        assert!(Instant::now() < deadline, "kubelet file never caught up");
        std::thread::sleep(Duration::from_millis(5));
    }
    let lag = acknowledged.elapsed();
    // max_lag plus scheduling slack on a loaded 2-core machine.
    assert!(lag < max_lag + Duration::from_millis(900), "lag {lag:?}");
    // The journal rotation finishes just after the file appears.
    while store.stats().compactions == 0 {
        assert!(Instant::now() < deadline, "compaction never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn invalid_changes_are_refused_before_touching_the_journal() {
    let root = Root::new();
    let (store, _) = root.open().expect("open");
    let before = fs::read(root.paths().journal).expect("journal");
    let err = store
        .commit(&[add("", "c", &["x"])])
        .expect_err("empty pod uid");
    assert!(matches!(err, StoreError::InvalidChange(_)));
    assert_eq!(fs::read(root.paths().journal).expect("journal"), before);
}

#[test]
fn the_store_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DeviceStore>();
}

#[test]
fn stats_report_the_kubelet_file_lag_until_compaction() {
    let root = Root::new();
    let (store, _) = root.open().expect("open");
    assert_eq!(store.stats().kubelet_file_lag, None);
    store
        .commit(&[add("pod-a", "c", &["gpu-0"])])
        .expect("commit");
    let stats = store.stats();
    assert!(stats.kubelet_file_lag.is_some());
    assert_eq!(stats.uncompacted_records, 1);
    assert!(store.compact().expect("compact"));
    let stats = store.stats();
    assert_eq!(stats.kubelet_file_lag, None);
    assert_eq!(stats.uncompacted_records, 0);
    assert_eq!(stats.compactions, 1);
    assert!(
        !store.compact().expect("nothing to do"),
        "a second compaction is a no-op"
    );
}

fn set_pod(pod: &str, name: &str) -> Change {
    use devicelet_checkpoint::state::{ContainerRecord, PodRecord};
    Change::SetPod {
        pod_uid: pod.into(),
        record: PodRecord {
            namespace: "default".into(),
            name: name.into(),
            containers: vec![ContainerRecord {
                name: "c".into(),
                kind: "app".into(),
                limits: BTreeMap::from([("example.com/gpu".into(), 1)]),
                devices: BTreeMap::from([("example.com/gpu".into(), vec!["gpu-0".into()])]),
                cpus: Some("2-3".into()),
                numa_affinity: Some(vec![0]),
            }],
        },
    }
}

#[test]
fn pod_records_survive_compactions_and_a_crash_between_compaction_steps() {
    let root = Root::new();
    let changes = [
        set_pod("pod-a", "a"),
        add("pod-a", "c", &["gpu-0"]),
        set_pod("pod-nodev", "no-devices"),
        set_pod("pod-gone", "gone"),
    ];
    let expected = {
        let mut s = state_after(&changes);
        s.apply(&Change::RemovePod {
            pod_uid: "pod-gone".into(),
        });
        s
    };
    let journal_before_rotation = {
        let (store, _) = root.open().expect("open");
        store.commit(&changes).expect("commit");
        store.compact().expect("compact");
        let journal = fs::read(root.paths().journal).expect("journal");
        store
            .commit(&[Change::RemovePod {
                pod_uid: "pod-gone".into(),
            }])
            .expect("commit");
        store.compact().expect("compact twice");
        journal
    };
    let (store, recovered) = root.open().expect("reopen");
    assert_eq!(*recovered.state, expected);
    assert_eq!(recovered.state.pod_records.len(), 2);
    assert_eq!(
        recovered.records_replayed, 0,
        "a pod-record snapshot is not a change"
    );
    store.close().expect("close");

    // Crash after the kubelet file was written but before the journal was rotated: the old
    // journal (with a marker for the file on disk) still yields every pod record.
    let parsed = journal::parse(&journal_before_rotation).expect("parse");
    let on_disk = device::decode(&fs::read(root.paths().kubelet_file).expect("read")).expect("ok");
    let mut crashed = journal_before_rotation.clone();
    crashed.extend(
        encode_record(&JournalRecord::Batch {
            seq: parsed.next_seq(),
            commits: vec![vec![Change::RemovePod {
                pod_uid: "pod-gone".into(),
            }]],
        })
        .expect("encode"),
    );
    crashed.extend(
        encode_record(&JournalRecord::CompactionStarted {
            seq: parsed.next_seq() + 1,
            kubelet_checksum: u64::from(on_disk.checksum),
        })
        .expect("encode"),
    );
    fs::write(root.paths().journal, &crashed).expect("write journal");
    let (_store, recovered) = root.open().expect("recovers");
    assert_eq!(*recovered.state, expected);
}

fn pod_record(containers: &[(&str, &[&str])]) -> Change {
    use devicelet_checkpoint::state::{ContainerRecord, PodRecord};
    Change::SetPod {
        pod_uid: String::new(),
        record: PodRecord {
            namespace: "ns".into(),
            name: "p".into(),
            containers: containers
                .iter()
                .map(|(name, devices)| ContainerRecord {
                    name: (*name).into(),
                    kind: "app".into(),
                    limits: BTreeMap::from([("example.com/gpu".into(), devices.len() as u64)]),
                    devices: BTreeMap::from([(
                        "example.com/gpu".into(),
                        devices.iter().map(|d| d.to_string()).collect(),
                    )]),
                    ..Default::default()
                })
                .collect(),
        },
    }
}

fn with_uid(change: Change, uid: &str) -> Change {
    match change {
        Change::SetPod { record, .. } => Change::SetPod {
            pod_uid: uid.into(),
            record,
        },
        other => other,
    }
}

/// A2 "nothing admitted is lost": the kubelet file is destroyed after a compaction folded pod
/// `old` into it; rebuilding from the journal keeps `old`'s devices (from its pod record, without
/// the cached response) and `new`'s entry with its response, drops the removed pod, and the
/// rebuilt pair opens cleanly.
#[test]
fn rebuild_from_journal_keeps_every_admitted_pod_when_the_kubelet_file_is_lost() {
    let root = Root::new();
    {
        let (store, _) = root.open().expect("open");
        store
            .commit(&[
                with_uid(pod_record(&[("c", &["d0", "d1"])]), "old"),
                add("old", "c", &["d0", "d1"]),
                with_uid(pod_record(&[("c", &["d2"])]), "gone"),
                add("gone", "c", &["d2"]),
            ])
            .expect("commit");
        assert!(store.compact().expect("compact"));
        store
            .commit(&[
                with_uid(pod_record(&[("c", &["d3"])]), "new"),
                add("new", "c", &["d3"]),
            ])
            .expect("commit");
        store
            .commit(&[Change::RemovePod {
                pod_uid: "gone".into(),
            }])
            .expect("commit");
        // Crash: no clean close, so the journal still holds the tail.
    }
    let kubelet_file = root.paths().kubelet_file;
    fs::write(&kubelet_file, b"{ damaged").expect("damage");
    assert!(root.open().is_err(), "damage is found and quarantined");

    let report = recover(&root.paths(), RecoverAction::RebuildFromJournal).expect("rebuild");
    let summary = report.rebuilt.expect("summary");
    assert_eq!(summary.pods, 2);
    assert_eq!(summary.entries, 2);
    assert_eq!(summary.entries_without_response, 1);
    assert!(report.cleared_quarantine);

    let (_store, recovered) = root.open().expect("rebuilt state opens");
    let state = recovered.state;
    assert_eq!(
        state
            .get("old", "c", "example.com/gpu")
            .expect("old kept")
            .device_ids_by_numa,
        BTreeMap::from([(-1, vec!["d0".to_string(), "d1".to_string()])])
    );
    assert!(
        state
            .get("old", "c", "example.com/gpu")
            .expect("old")
            .alloc_resp
            .is_empty()
    );
    assert_eq!(
        state
            .get("new", "c", "example.com/gpu")
            .expect("new kept")
            .alloc_resp,
        vec![10, 3, b'a', b'b', b'c']
    );
    assert!(state.get("gone", "c", "example.com/gpu").is_none());
    assert_eq!(state.pod_records.keys().collect::<Vec<_>>(), ["new", "old"]);
    assert!(state.registered.contains_key("example.com/gpu"));
    // The damaged file and the old journal are kept as evidence.
    let names = entries_in_dir(&root.kubelet_dir);
    assert!(names.iter().any(|n| n.contains(".corrupt-")), "{names:?}");
    let names = entries_in_dir(&root.journal_dir);
    assert!(names.iter().any(|n| n.contains(".replaced-")), "{names:?}");
}
