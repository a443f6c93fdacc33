//! Deferred writes of `cpu_manager_state`: admission assigns CPUs in memory
//! ([`CpuManager::assign_container`]) and writes once per pod ([`CpuManager::persist`]) outside
//! its lock. Concurrent persists never let an older state replace a newer one, one write covers
//! every change made before it, a failed write leaves memory consistent and is retried by the
//! next persist, and a persist with nothing new writes nothing.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use common::{dual_socket_ht, dual_socket_multi_numa_ht, gu_pod, pod, static_manager};
use devicelet_checkpoint::fault::{EIO, Fault, Op};
use devicelet_cpumanager::{CheckpointFile, CpuManager, CpuManagerError, CpuState, QosClass};
use devicelet_topology::TopologyHint;

fn assign(m: &CpuManager, uid: &str, millis: i64) {
    let p = gu_pod(uid, millis);
    m.register_pod(&p);
    m.assign_container(&p.spec, &p.spec.containers[0], &TopologyHint::default())
        .expect("fits");
}

fn on_disk(dir: &std::path::Path) -> CpuState {
    CheckpointFile::new(dir, "static")
        .load()
        .expect("readable")
        .expect("exists")
}

/// Every CPU is either shared or owned by exactly one container.
fn assert_consistent(m: &CpuManager) {
    let state = m.state();
    let mut seen = state.default_cpu_set.clone();
    for containers in state.assignments.values() {
        for set in containers.values() {
            assert!(!set.intersects(&seen), "{state:?}");
            seen = seen.union(set);
        }
    }
    assert!(seen.same_as(m.topology().all_cpus()), "{state:?}");
}

#[test]
fn assign_container_changes_memory_only_until_persist_and_one_write_covers_every_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let before = on_disk(dir.path());
    assign(&m, "a", 2000);
    assign(&m, "b", 3000);
    assert_eq!(on_disk(dir.path()), before, "nothing written yet");
    assert!(m.persist().expect("write"), "the first persist writes");
    assert_eq!(on_disk(dir.path()), m.state(), "both pods in one write");
    // The second admission's persist finds its change already on disk.
    let fault = Fault::arm(dir.path(), Op::Write, EIO);
    assert!(!m.persist().expect("nothing to write"));
    assert_eq!(fault.hits(), 0);
}

#[test]
fn persist_with_nothing_changed_does_not_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let fault = Fault::arm(dir.path(), Op::Write, EIO);
    assert!(!m.persist().expect("fresh manager: the file is current"));
    // Neither a pod without exclusive CPUs nor a removal of nothing changes the state.
    let burstable = pod("burstable", QosClass::Burstable, &[], &[("c", 2000)]);
    m.register_pod(&burstable);
    m.assign_container(
        &burstable.spec,
        &burstable.spec.containers[0],
        &TopologyHint::default(),
    )
    .expect("shared pool");
    assert!(!m.persist().expect("no change"));
    m.remove_pod("burstable").expect("nothing to free");
    m.remove_pod("unknown").expect("nothing to free");
    assert!(m.retain_pods(|_| true).expect("nothing stale").is_empty());
    assert_eq!(fault.hits(), 0, "no write was attempted");
    drop(fault);

    // Nor does a re-assignment of a container that already holds its CPUs.
    assign(&m, "a", 2000);
    assert!(m.persist().expect("write"));
    let fault = Fault::arm(dir.path(), Op::Write, EIO);
    assign(&m, "a", 2000);
    assert!(!m.persist().expect("already on disk"));
    assert_eq!(fault.hits(), 0);
}

#[test]
fn a_failed_persist_returns_the_error_keeps_memory_consistent_and_the_next_persist_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    assign(&m, "kept", 2000);
    m.persist().expect("write");
    let file_before = std::fs::read(m.state_file()).expect("state file");

    assign(&m, "failed", 3000);
    let in_memory = m.state();
    let fault = Fault::arm(dir.path(), Op::Fsync, EIO);
    let err = m.persist().expect_err("the fsync fails");
    assert_eq!(fault.hits(), 1);
    assert!(matches!(err, CpuManagerError::Write { .. }), "{err}");
    assert!(err.to_string().contains("cpu_manager_state"), "{err}");
    assert_eq!(
        m.state(),
        in_memory,
        "a failed write changes nothing in memory"
    );
    assert_consistent(&m);
    assert_eq!(
        std::fs::read(m.state_file()).expect("state file"),
        file_before,
        "the file keeps its previous content"
    );

    // The admission is rolled back on the same failing disk: its CPUs are free in memory.
    m.remove_pod("failed")
        .expect_err("the rollback cannot be written either");
    assert!(m.state().get("failed", "c").is_none());
    assert_consistent(&m);
    drop(fault);

    // The file did not get the newest state, so the next persist writes it.
    assert!(m.persist().expect("write works again"));
    assert_eq!(on_disk(dir.path()), m.state());
    assert!(on_disk(dir.path()).get("kept", "c").is_some());
}

#[test]
fn a_failed_persist_not_rolled_back_is_written_by_the_next_persist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    assign(&m, "a", 2000);
    let fault = Fault::arm(dir.path(), Op::Write, EIO);
    m.persist().expect_err("write fails");
    drop(fault);
    assert!(m.persist().expect("retried"));
    assert_eq!(on_disk(dir.path()), m.state());
}

/// Threads assign CPUs and persist concurrently while a reader watches the file: with only
/// allocations, the file's assignments may only grow (an older state written after a newer one
/// would shrink them), and once every persist has returned the file equals memory.
#[test]
fn concurrent_persists_never_let_an_older_state_overwrite_a_newer_one() {
    const THREADS: usize = 6;
    const PODS_PER_THREAD: usize = 12;
    let dir = tempfile::tempdir().expect("tempdir");
    // 80 CPUs, one reserved: room for 72 one-CPU pods. Writers, reader and this thread start
    // together.
    let m = Arc::new(static_manager(dual_socket_multi_numa_ht(), 1, dir.path()));
    let start = Arc::new(Barrier::new(THREADS + 2));
    let done = Arc::new(AtomicBool::new(false));

    let reader = {
        let (dir, done, start) = (dir.path().to_owned(), done.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            let mut last: BTreeSet<String> = BTreeSet::new();
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                let now: BTreeSet<String> = on_disk(&dir).assignments.into_keys().collect();
                assert!(
                    now.is_superset(&last),
                    "an older state replaced a newer one: {last:?} then {now:?}"
                );
                last = now;
                reads += 1;
            }
            reads
        })
    };
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (m, start) = (m.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut wrote = 0;
                for i in 0..PODS_PER_THREAD {
                    let uid = format!("t{t}-p{i}");
                    assign(&m, &uid, 1000);
                    if m.persist().expect("write") {
                        wrote += 1;
                    }
                    // This pod's CPUs are on disk once its persist has returned.
                    assert!(
                        on_disk(m.state_file().parent().expect("dir"))
                            .get(&uid, "c")
                            .is_some()
                    );
                }
                wrote
            })
        })
        .collect();
    start.wait();
    let writes: usize = writers.into_iter().map(|w| w.join().expect("writer")).sum();
    done.store(true, Ordering::SeqCst);
    assert!(reader.join().expect("reader") > 0);

    assert_eq!(m.state().assignments.len(), THREADS * PODS_PER_THREAD);
    assert_eq!(
        on_disk(dir.path()),
        m.state(),
        "the file ends with the newest state"
    );
    assert!(
        (1..=THREADS * PODS_PER_THREAD).contains(&writes),
        "{writes}"
    );
    assert!(!m.persist().expect("nothing left"));
    assert_consistent(&m);
}
