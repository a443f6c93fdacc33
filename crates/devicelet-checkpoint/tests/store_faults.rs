//! Full-disk handling (real tmpfs) and a randomized crash/recovery property test.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use devicelet_checkpoint::device;
use devicelet_checkpoint::state::{Change, DeviceState};
use devicelet_checkpoint::store::{DeviceStore, StoreOptions, StorePaths};
use proptest::prelude::*;

fn manual() -> StoreOptions {
    StoreOptions {
        background_compaction: false,
        ..StoreOptions::default()
    }
}

fn add(pod: &str, container: &str, device: &str, payload: usize) -> Change {
    Change::AddContainer {
        pod_uid: pod.into(),
        container: container.into(),
        resource: "example.com/gpu".into(),
        device_ids_by_numa: BTreeMap::from([(0, vec![device.to_string()])]),
        alloc_resp: vec![7; payload],
    }
}

struct Tmpfs<'a> {
    dir: &'a Path,
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir).status();
    }
}

#[test]
fn a2_12_full_disk_fails_the_commit_and_keeps_the_previous_state_intact() {
    let outer = tempfile::tempdir().expect("tempdir");
    let mnt = outer.path().join("small");
    fs::create_dir(&mnt).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&mnt)
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            println!(
                "SKIPPED: cannot mount a 64k tmpfs ({}); run as root to exercise ENOSPC",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            println!("SKIPPED: cannot run mount ({e})");
            return;
        }
    }
    let _guard = Tmpfs { dir: &mnt };
    let paths = StorePaths::new(&mnt.join("device-plugins"), &mnt.join("devicelet"));

    let mut acknowledged = DeviceState::default();
    let (store, _) = DeviceStore::open_with(paths.clone(), manual()).expect("open");
    // A first compaction so there is a kubelet file to protect.
    store
        .commit(&[add("pod-0", "c", "d-0", 64)])
        .expect("first commit");
    acknowledged.apply(&add("pod-0", "c", "d-0", 64));
    store.compact().expect("compaction fits");
    let kubelet_before = fs::read(&paths.kubelet_file).expect("kubelet file");

    let mut failure = None;
    for i in 1..10_000 {
        let change = add(&format!("pod-{i}"), "c", &format!("d-{i}"), 512);
        let journal_before = fs::metadata(&paths.journal).expect("stat").len();
        match store.commit(std::slice::from_ref(&change)) {
            Ok(()) => acknowledged.apply(&change),
            Err(e) => {
                assert_eq!(
                    fs::metadata(&paths.journal).expect("stat").len(),
                    journal_before,
                    "the failed append was rolled back"
                );
                failure = Some(e);
                break;
            }
        }
    }
    let err = failure.expect("the 64k disk fills up");
    assert!(err.is_disk_full(), "expected ENOSPC, got {err}");
    assert!(!err.ownership_unknown());
    assert_eq!(
        store.snapshot(),
        acknowledged,
        "in-memory state has only acknowledged commits"
    );

    // Compaction cannot fit either: it fails and the kubelet file stays as it was.
    let compaction = store.compact();
    assert!(compaction.is_err(), "compaction on a full disk must fail");
    assert_eq!(
        fs::read(&paths.kubelet_file).expect("kubelet file"),
        kubelet_before
    );
    assert!(device::decode(&kubelet_before).is_ok());
    drop(store);

    let (_store, recovered) =
        DeviceStore::open_with(paths, manual()).expect("reopen on the full disk");
    assert_eq!(
        *recovered.state, acknowledged,
        "nothing acknowledged is lost"
    );
}

#[derive(Debug, Clone)]
enum Step {
    Commit(Vec<Change>),
    Compact,
}

fn change_strategy() -> impl Strategy<Value = Change> {
    let pod = (0u8..6).prop_map(|p| format!("pod-{p}"));
    prop_oneof![
        4 => (pod.clone(), 0u8..3, 0u8..8, 0usize..40).prop_map(|(p, c, d, n)| add(&p, &format!("c{c}"), &format!("gpu-{d}"), n)),
        1 => pod.prop_map(|p| Change::RemovePod { pod_uid: p }),
        1 => (0u8..3, proptest::collection::vec(0u8..8, 0..4)).prop_map(|(r, ids)| Change::SetRegistered {
            resource: format!("example.com/r{r}"),
            device_ids: ids.into_iter().map(|i| format!("dev-{i}")).collect(),
        }),
        1 => (0u8..3).prop_map(|r| Change::RemoveRegistered { resource: format!("example.com/r{r}") }),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => proptest::collection::vec(change_strategy(), 1..4).prop_map(Step::Commit),
        1 => Just(Step::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random commits and compactions, then a crash that tears the in-flight record at a random
    /// byte: recovery yields exactly the state after the last acknowledged commit.
    #[test]
    fn recovered_state_equals_the_last_acknowledged_state(
        steps in proptest::collection::vec(step_strategy(), 1..12),
        in_flight in proptest::collection::vec(change_strategy(), 1..3),
        cut_fraction in 0.0f64..1.0,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = StorePaths::new(&dir.path().join("device-plugins"), &dir.path().join("devicelet"));
        let mut acknowledged = DeviceState::default();
        let (journal_before, journal_after) = {
            let (store, _) = DeviceStore::open_with(paths.clone(), manual()).expect("open");
            for step in &steps {
                match step {
                    Step::Commit(changes) => {
                        store.commit(changes).expect("commit");
                        for c in changes {
                            acknowledged.apply(c);
                        }
                    }
                    Step::Compact => {
                        store.compact().expect("compact");
                    }
                }
                prop_assert_eq!(&store.snapshot(), &acknowledged);
            }
            let before = fs::read(&paths.journal).expect("journal");
            store.commit(&in_flight).expect("in-flight commit");
            (before, fs::read(&paths.journal).expect("journal"))
        };
        // Crash: the in-flight record is torn at a random byte (possibly not written at all).
        let torn = journal_before.len() + ((journal_after.len() - journal_before.len()) as f64 * cut_fraction) as usize;
        fs::write(&paths.journal, &journal_after[..torn]).expect("tear");
        let (store, recovered) = DeviceStore::open_with(paths.clone(), manual()).expect("recover");
        prop_assert_eq!(&*recovered.state, &acknowledged);
        // And a clean shutdown after recovery writes a kubelet file with the same state.
        store.close().expect("close");
        if let Ok(bytes) = fs::read(&paths.kubelet_file) {
            let decoded = device::decode(&bytes).expect("kubelet file verifies");
            prop_assert_eq!(DeviceState::from_checkpoint(&decoded.data), acknowledged);
        }
    }
}

/// Files in a directory, sorted, without the `*.corrupt-*` evidence.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn fault_store() -> (tempfile::TempDir, StorePaths, DeviceStore, DeviceState) {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = StorePaths::new(
        &dir.path().join("device-plugins"),
        &dir.path().join("devicelet"),
    );
    let (store, _) = DeviceStore::open_with(paths.clone(), manual()).expect("open");
    let mut acknowledged = DeviceState::default();
    for i in 0..2 {
        let change = add(&format!("pod-{i}"), "c", &format!("d-{i}"), 32);
        store
            .commit(std::slice::from_ref(&change))
            .expect("commit before the fault");
        acknowledged.apply(&change);
    }
    store.compact().expect("compaction before the fault");
    let change = add("pod-2", "c", "d-2", 32);
    store
        .commit(std::slice::from_ref(&change))
        .expect("commit before the fault");
    acknowledged.apply(&change);
    (dir, paths, store, acknowledged)
}

/// EIO or ENOSPC on the journal append or its fsync: the commit fails naming the journal, the
/// half-written record is cut off, memory holds only acknowledged commits, and once the fault
/// is gone commits work and a restart recovers exactly what was acknowledged.
#[test]
fn a2_12_eio_and_enospc_on_journal_append_or_fsync_fail_the_commit_and_roll_it_back() {
    use devicelet_checkpoint::fault::{EIO, ENOSPC, Fault, Op};
    for (op, errno) in [
        (Op::Fsync, EIO),
        (Op::Fsync, ENOSPC),
        (Op::Write, EIO),
        (Op::Write, ENOSPC),
    ] {
        let (dir, paths, store, mut acknowledged) = fault_store();
        let journal_before = fs::read(&paths.journal).expect("journal");
        let kubelet_before = fs::read(&paths.kubelet_file).expect("kubelet file");
        let fault = Fault::arm(&paths.journal, op, errno);
        let err = store
            .commit(&[add("pod-x", "c", "d-x", 32)])
            .expect_err("the fault fails the commit");
        assert_eq!(fault.hits(), 1, "{op:?}");
        let text = err.to_string();
        assert!(
            text.contains(&paths.journal.display().to_string()),
            "{op:?}: the error names the journal: {text}"
        );
        assert_eq!(err.is_disk_full(), errno == ENOSPC, "{op:?}: {text}");
        assert!(!err.ownership_unknown(), "{op:?}");
        assert_eq!(
            store.snapshot(),
            acknowledged,
            "{op:?}: memory is not ahead"
        );
        assert_eq!(
            fs::read(&paths.journal).expect("journal"),
            journal_before,
            "{op:?}: the failed record is cut off"
        );
        assert_eq!(
            fs::read(&paths.kubelet_file).expect("kubelet file"),
            kubelet_before
        );
        drop(fault);

        let change = add("pod-y", "c", "d-y", 32);
        store
            .commit(std::slice::from_ref(&change))
            .expect("commit after the fault");
        acknowledged.apply(&change);
        drop(store);
        assert_eq!(
            listing(paths.journal.parent().expect("dir")),
            vec!["device-allocations.journal", "device-allocations.snapshot"],
            "no temporary file is left behind"
        );
        let (_store, recovered) = DeviceStore::open_with(paths, manual()).expect("reopen");
        assert_eq!(*recovered.state, acknowledged, "{op:?}");
        assert!(recovered.torn_tail.is_none(), "{op:?}");
        drop(dir);
    }
}

/// The append fails and so does truncating back: the store refuses every later commit
/// (poisoned) rather than appending after a half-written record, and a restart drops the torn
/// record and recovers exactly what was acknowledged.
#[test]
fn a2_12_a_failed_rollback_poisons_the_store_and_restart_recovers_the_acknowledged_state() {
    use devicelet_checkpoint::fault::{EIO, ENOSPC, Fault, Op};
    use devicelet_checkpoint::store::StoreError;
    let (_dir, paths, store, acknowledged) = fault_store();
    // A full disk writes half the record before it fails.
    let write = Fault::arm(&paths.journal, Op::Write, ENOSPC);
    let truncate = Fault::arm(&paths.journal, Op::Truncate, EIO);
    store
        .commit(&[add("pod-x", "c", "d-x", 32)])
        .expect_err("append fails");
    drop((write, truncate));
    let err = store
        .commit(&[add("pod-y", "c", "d-y", 32)])
        .expect_err("poisoned");
    assert!(matches!(err, StoreError::Poisoned(_)), "{err}");
    assert!(err.to_string().contains("truncating back failed"), "{err}");
    assert!(
        store.compact().is_err(),
        "no compaction over a torn journal"
    );
    assert_eq!(store.snapshot(), acknowledged);
    drop(store);
    let (store, recovered) = DeviceStore::open_with(paths, manual()).expect("reopen");
    assert_eq!(*recovered.state, acknowledged);
    assert!(recovered.torn_tail.is_some(), "the half record was dropped");
    store
        .commit(&[add("pod-z", "c", "d-z", 32)])
        .expect("commits work after the restart");
}

/// EIO or ENOSPC while compaction writes the kubelet file or the new journal: compaction fails,
/// the kubelet file and the journal stay valid, no temporary file is left, commits keep working
/// and a later compaction succeeds.
#[test]
fn a2_12_eio_and_enospc_during_compaction_keep_both_files_valid() {
    use devicelet_checkpoint::fault::{EIO, ENOSPC, Fault, Op};
    let cases = [
        ("kubelet", Op::Write, ENOSPC),
        ("kubelet", Op::Fsync, EIO),
        ("kubelet", Op::Rename, EIO),
        ("kubelet", Op::SyncDir, EIO),
        ("journal-marker", Op::Fsync, EIO),
        ("journal-new", Op::Rename, EIO),
    ];
    for (what, op, errno) in cases {
        let (_dir, paths, store, mut acknowledged) = fault_store();
        let kubelet_before = fs::read(&paths.kubelet_file).expect("kubelet file");
        let target = if what == "kubelet" {
            paths.kubelet_file.clone()
        } else {
            paths.journal.clone()
        };
        let fault = Fault::arm(&target, op, errno);
        let err = store.compact().expect_err("compaction fails");
        assert!(fault.hits() >= 1, "{what} {op:?}");
        assert!(
            err.to_string().contains(&target.display().to_string()),
            "{what} {op:?}: the error names the file: {err}"
        );
        assert!(
            store
                .stats()
                .last_compaction_error
                .is_some_and(|e| e == err.to_string()),
            "{what} {op:?}"
        );
        drop(fault);
        let kubelet_now = fs::read(&paths.kubelet_file).expect("kubelet file");
        assert!(device::decode(&kubelet_now).is_ok(), "{what} {op:?}");
        // Only a failure after the kubelet file's rename (its directory fsync, or the new
        // journal) leaves the new file in place; the journal's marker matches it.
        if what != "journal-new" && op != Op::SyncDir {
            assert_eq!(kubelet_now, kubelet_before, "{what} {op:?}");
        }
        for dir in [&paths.kubelet_file, &paths.journal] {
            let dir = dir.parent().expect("dir");
            assert!(
                listing(dir).iter().all(|n| !n.ends_with(".tmp")),
                "{what} {op:?}: {:?}",
                listing(dir)
            );
        }
        assert_eq!(store.snapshot(), acknowledged, "{what} {op:?}");
        let change = add("pod-y", "c", "d-y", 32);
        store
            .commit(std::slice::from_ref(&change))
            .expect("commits keep working");
        acknowledged.apply(&change);
        // A crash now recovers from what is on disk.
        let (_crashed, recovered) =
            DeviceStore::open_with(paths.clone(), manual()).expect("recover after a crash");
        assert_eq!(*recovered.state, acknowledged, "{what} {op:?}");
        drop(_crashed);
        assert!(store.compact().expect("compaction after the fault"));
        drop(store);
        let (_store, recovered) = DeviceStore::open_with(paths, manual()).expect("reopen");
        assert_eq!(*recovered.state, acknowledged, "{what} {op:?}");
    }
}

/// A read-only file system (EROFS: remounted so after an error) refuses the append before any
/// byte is written and refuses the truncation too: nothing needs cutting, so the store stays
/// usable and commits work again once writes do (before, it was poisoned until a restart).
#[test]
fn a2_12_a_read_only_journal_fails_the_commit_without_poisoning_the_store() {
    use devicelet_checkpoint::fault::{EROFS, Fault, Op};
    let (_dir, paths, store, mut acknowledged) = fault_store();
    let journal_before = fs::read(&paths.journal).expect("journal");
    let write = Fault::arm(&paths.journal, Op::Write, EROFS);
    let truncate = Fault::arm(&paths.journal, Op::Truncate, EROFS);
    let err = store
        .commit(&[add("pod-x", "c", "d-x", 32)])
        .expect_err("read-only");
    assert!(err.to_string().contains("Read-only file system"), "{err}");
    assert_eq!(truncate.hits(), 0, "nothing to cut");
    assert_eq!(fs::read(&paths.journal).expect("journal"), journal_before);
    drop((write, truncate));
    let change = add("pod-y", "c", "d-y", 32);
    store
        .commit(std::slice::from_ref(&change))
        .expect("commits work again");
    acknowledged.apply(&change);
    drop(store);
    let (_store, recovered) = DeviceStore::open_with(paths, manual()).expect("reopen");
    assert_eq!(*recovered.state, acknowledged);
}
