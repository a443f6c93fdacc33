//! The restart snapshot (`device-allocations.snapshot`, `devicelet_checkpoint::snapshot`):
//! restoring from it gives exactly what restoring from the kubelet file and the whole journal
//! gives, and every kind of mismatch (kubelet file changed, journal changed, bad magic, bad
//! version, truncated, checksum) makes the store ignore it, say why, and read the files.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use devicelet_checkpoint::snapshot::{self, SNAPSHOT_HEADER_LEN, SNAPSHOT_MAGIC};
use devicelet_checkpoint::state::{Change, ContainerRecord, PodRecord};
use devicelet_checkpoint::store::{
    DeviceStore, RecoveredState, SnapshotUse, StoreOptions, StorePaths,
};
use proptest::prelude::*;

fn manual() -> StoreOptions {
    StoreOptions {
        background_compaction: false,
        ..StoreOptions::default()
    }
}

fn paths(dir: &Path) -> StorePaths {
    StorePaths::new(&dir.join("device-plugins"), &dir.join("devicelet"))
}

fn add(
    pod: usize,
    container: usize,
    resource: usize,
    devices: &[(i64, usize)],
    resp: &[u8],
) -> Change {
    let mut by_numa: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (numa, d) in devices {
        by_numa.entry(*numa).or_default().push(format!("dev-{d}"));
    }
    Change::AddContainer {
        pod_uid: format!("pod-{pod}"),
        container: format!("c{container}"),
        resource: format!("example.com/r{resource}"),
        device_ids_by_numa: by_numa,
        alloc_resp: resp.to_vec(),
    }
}

fn set_pod(pod: usize, containers: usize, cpus: bool, numa: bool) -> Change {
    Change::SetPod {
        pod_uid: format!("pod-{pod}"),
        record: PodRecord {
            namespace: "default".into(),
            name: format!("name-{pod}"),
            containers: (0..containers)
                .map(|c| ContainerRecord {
                    name: format!("c{c}"),
                    kind: if c == 0 { "init" } else { "app" }.into(),
                    limits: [("example.com/r0".to_owned(), c as u64 + 1)].into(),
                    devices: [("example.com/r0".to_owned(), vec![format!("dev-{c}")])].into(),
                    cpus: cpus.then(|| format!("{c}-{}", c + 1)),
                    numa_affinity: numa.then(|| vec![c % 2]),
                })
                .collect(),
        },
    }
}

/// One generated change.
fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (
            0..12usize,
            0..3usize,
            0..2usize,
            proptest::collection::vec((-1..2i64, 0..20usize), 0..4),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(p, c, r, d, resp)| add(p, c, r, &d, &resp)),
        2 => (0..12usize, 0..3usize, any::<bool>(), any::<bool>())
            .prop_map(|(p, n, cpus, numa)| set_pod(p, n, cpus, numa)),
        1 => (0..12usize).prop_map(|p| Change::RemovePod {
            pod_uid: format!("pod-{p}")
        }),
        1 => (0..2usize, proptest::collection::vec(0..20usize, 0..4)).prop_map(|(r, d)| {
            Change::SetRegistered {
                resource: format!("example.com/r{r}"),
                device_ids: d.into_iter().map(|d| format!("dev-{d}")).collect(),
            }
        }),
        1 => (0..2usize).prop_map(|r| Change::RemoveRegistered {
            resource: format!("example.com/r{r}")
        }),
    ]
}

/// Commits `before`, compacts (which writes the snapshot), commits `after` and stops without
/// compacting again (a crash image when `after` is not empty).
fn build(dir: &Path, before: &[Vec<Change>], after: &[Vec<Change>]) {
    let (store, _) = DeviceStore::open_with(paths(dir), manual()).expect("open");
    for batch in before {
        store.commit(batch).expect("commit");
    }
    store.compact().expect("compact");
    for batch in after {
        store.commit(batch).expect("commit");
    }
    drop(store);
}

/// Opens a copy of `dir` (so the open's own writes do not change the original).
fn open_copy(dir: &Path, with_snapshot: bool) -> RecoveredState {
    let copy = tempfile::tempdir().expect("tempdir");
    let from = paths(dir);
    let to = paths(copy.path());
    for (a, b) in [
        (&from.kubelet_file, &to.kubelet_file),
        (&from.journal, &to.journal),
        (&from.snapshot, &to.snapshot),
    ] {
        if a.exists() && (with_snapshot || a != &from.snapshot) {
            fs::create_dir_all(b.parent().expect("parent")).expect("mkdir");
            fs::copy(a, b).expect("copy");
        }
    }
    let (_store, recovered) = DeviceStore::open_with(to, manual()).expect("open");
    recovered
}

fn same_restore(a: &RecoveredState, b: &RecoveredState) {
    assert_eq!(a.state, b.state);
    assert_eq!(a.kubelet_file, b.kubelet_file);
    assert_eq!(a.records_replayed, b.records_replayed);
    assert_eq!(a.journal_created, b.journal_created);
    assert_eq!(a.torn_tail, b.torn_tail);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// From the snapshot or from the kubelet file and the whole journal: the same state, the
    /// same kubelet-file origin, the same number of records replayed.
    #[test]
    fn restore_from_snapshot_equals_restore_from_the_kubelet_file(
        before in proptest::collection::vec(proptest::collection::vec(change(), 1..4), 0..12),
        after in proptest::collection::vec(proptest::collection::vec(change(), 1..4), 0..6),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        build(dir.path(), &before, &after);
        let p = paths(dir.path());
        let from_files = open_copy(dir.path(), false);
        prop_assert_eq!(&from_files.snapshot, &SnapshotUse::Absent);
        if p.snapshot.exists() {
            let from_snapshot = open_copy(dir.path(), true);
            prop_assert_eq!(&from_snapshot.snapshot, &SnapshotUse::Used);
            same_restore(&from_snapshot, &from_files);
        } else {
            // No compaction ran: nothing had been committed.
            prop_assert!(before.is_empty());
        }
    }
}

/// A node with a snapshot: pods compacted, then more commits (a crash image).
fn node() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let before: Vec<Vec<Change>> = (0..20)
        .map(|p| {
            vec![
                add(p, 0, 0, &[(0, p)], b"resp"),
                set_pod(p, 1, p % 2 == 0, true),
            ]
        })
        .collect();
    let after = vec![vec![add(30, 0, 1, &[(1, 30)], b"late")]];
    build(dir.path(), &before, &after);
    assert!(paths(dir.path()).snapshot.exists());
    dir
}

/// Damages the node's files with `damage`, opens, and checks that the snapshot was ignored for
/// a reason containing `why` and that the state is what the files hold.
fn ignored_because(damage: impl FnOnce(&StorePaths), why: &str) {
    let dir = node();
    let p = paths(dir.path());
    damage(&p);
    let from_files = open_copy(dir.path(), false);
    let recovered = open_copy(dir.path(), true);
    match &recovered.snapshot {
        SnapshotUse::Ignored { reason } => {
            assert!(
                reason.contains(why),
                "reason {reason:?} does not say {why:?}"
            )
        }
        other => panic!("snapshot not ignored ({why}): {other:?}"),
    }
    same_restore(&recovered, &from_files);
}

fn rewrite(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = fs::read(path).expect("read");
    f(&mut bytes);
    fs::write(path, bytes).expect("write");
}

#[test]
fn the_snapshot_is_used_when_nothing_changed() {
    let dir = node();
    let recovered = open_copy(dir.path(), true);
    assert_eq!(recovered.snapshot, SnapshotUse::Used);
    assert_eq!(recovered.records_replayed, 1);
    assert_eq!(recovered.state.pod_records.len(), 20);
    assert_eq!(recovered.state.entry_count(), 21);
}

#[test]
fn a_changed_kubelet_file_is_noticed() {
    // Same content, another layout (the kubelet's own writer would indent differently).
    ignored_because(
        |p| {
            rewrite(&p.kubelet_file, |b| {
                let text = String::from_utf8(b.clone()).expect("utf-8");
                let value: serde_json::Value = serde_json::from_str(&text).expect("json");
                *b = serde_json::to_vec_pretty(&value).expect("json");
            })
        },
        "kubelet checkpoint changed",
    );
    // Same length, one byte changed (the store would then refuse the file for its kubelet
    // checksum, so this is checked on the snapshot alone).
    let dir = node();
    let p = paths(dir.path());
    let file = fs::read(&p.snapshot).expect("snapshot");
    let (header, _) = snapshot::parse_header(&file).expect("header");
    let mut kubelet = fs::read(&p.kubelet_file).expect("kubelet file");
    let journal = fs::read(&p.journal).expect("journal");
    snapshot::check_sources(&header, Some(&kubelet), &journal).expect("matches");
    kubelet[10] ^= 1;
    assert_eq!(
        snapshot::check_sources(&header, Some(&kubelet), &journal),
        Err(snapshot::SnapshotMismatch::KubeletFileChanged(
            "its hash differs"
        ))
    );
    assert_eq!(
        snapshot::check_sources(&header, None, &journal),
        Err(snapshot::SnapshotMismatch::KubeletFileChanged("it is gone"))
    );
}

#[test]
fn a_changed_journal_is_noticed() {
    // A journal that does not start with what the snapshot covers: a fresh one for the same
    // kubelet file.
    let dir = node();
    let p = paths(dir.path());
    let other = tempfile::tempdir().expect("tempdir");
    let q = paths(other.path());
    fs::create_dir_all(q.kubelet_file.parent().expect("parent")).expect("mkdir");
    fs::copy(&p.kubelet_file, &q.kubelet_file).expect("copy");
    drop(DeviceStore::open_with(q.clone(), manual()).expect("open"));
    let prefix_len = {
        let bytes = fs::read(&p.snapshot).expect("snapshot");
        snapshot::parse_header(&bytes)
            .expect("header")
            .0
            .journal_prefix_len
    };
    let other_journal = fs::read(&q.journal).expect("journal");
    assert!(other_journal.len() < prefix_len as usize);
    ignored_because(
        |p| fs::write(&p.journal, &other_journal).expect("write"),
        "device journal changed",
    );
}

#[test]
fn bad_magic_version_truncation_and_checksums_are_noticed() {
    ignored_because(
        |p| rewrite(&p.snapshot, |b| b[0..8].copy_from_slice(b"NOTASNAP")),
        "foreign magic",
    );
    ignored_because(
        |p| {
            rewrite(&p.snapshot, |b| {
                b[8..12].copy_from_slice(&7u32.to_le_bytes())
            })
        },
        "version 7",
    );
    ignored_because(
        |p| rewrite(&p.snapshot, |b| b.truncate(SNAPSHOT_HEADER_LEN - 1)),
        "truncated",
    );
    ignored_because(
        |p| rewrite(&p.snapshot, |b| b.truncate(b.len() - 1)),
        "truncated",
    );
    ignored_because(|p| rewrite(&p.snapshot, |b| b[20] ^= 1), "header checksum");
    ignored_because(
        |p| {
            rewrite(&p.snapshot, |b| {
                let last = b.len() - 1;
                b[last] ^= 1;
            })
        },
        "body checksum",
    );
    // Another program's file of the right name.
    ignored_because(
        |p| fs::write(&p.snapshot, b"hello").expect("write"),
        "truncated",
    );
    assert_eq!(&SNAPSHOT_MAGIC, b"DVLTSNAP");
}

#[test]
fn a_snapshot_is_written_at_clean_shutdown_and_a_restart_uses_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = DeviceStore::open_with(paths(dir.path()), manual()).expect("open");
    store
        .commit(&[add(1, 0, 0, &[(0, 1)], b"r"), set_pod(1, 1, false, false)])
        .expect("commit");
    store.close().expect("close");
    let (_store, recovered) = DeviceStore::open_with(paths(dir.path()), manual()).expect("reopen");
    assert_eq!(recovered.snapshot, SnapshotUse::Used);
    assert_eq!(recovered.records_replayed, 0);
    assert_eq!(recovered.state.pod_records.len(), 1);
}
