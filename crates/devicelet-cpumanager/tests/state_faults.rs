//! Write faults on `cpu_manager_state` (ecosystem A2 row 12 for the CPU manager's file): EIO
//! and ENOSPC injected through `devicelet_checkpoint::fault`, and a real full disk (a small
//! tmpfs, when run as root). An allocation that cannot be written is refused and leaves memory
//! and the file as they were; a failed admission rolled back on the failing disk leaves no
//! exclusive CPUs behind; once the fault is gone, allocation works and the file reloads.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{dual_socket_ht, gu_pod, pod, static_manager};
use devicelet_checkpoint::fault::{EIO, ENOSPC, Fault, Op};
use devicelet_cpumanager::{CpuManager, CpuManagerError, QosClass};
use devicelet_topology::TopologyHint;

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn allocate(m: &CpuManager, uid: &str, millis: i64) -> Result<(), CpuManagerError> {
    let p = gu_pod(uid, millis);
    m.register_pod(&p);
    m.allocate_container(&p.spec, &p.spec.containers[0], &TopologyHint::default())
}

#[test]
fn a2_12_eio_and_enospc_on_cpu_manager_state_refuse_the_allocation_and_keep_the_file() {
    for (op, errno) in [
        (Op::Write, ENOSPC),
        (Op::Write, EIO),
        (Op::Fsync, EIO),
        (Op::Fsync, ENOSPC),
        (Op::Rename, EIO),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = static_manager(dual_socket_ht(), 1, dir.path());
        allocate(&m, "a", 2000).expect("fits");
        let file = dir.path().join("cpu_manager_state");
        let file_before = fs::read(&file).expect("state file");
        let state_before = m.state();

        let fault = Fault::arm(dir.path(), op, errno);
        let err = allocate(&m, "b", 3000).expect_err("the write fails");
        assert_eq!(fault.hits(), 1, "{op:?}");
        assert!(
            matches!(err, CpuManagerError::Write { .. }),
            "{op:?}: {err}"
        );
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{op:?}: the error names the file: {err}"
        );
        assert_eq!(m.state(), state_before, "{op:?}: nothing only in memory");
        assert_eq!(fs::read(&file).expect("state file"), file_before, "{op:?}");
        assert_eq!(listing(dir.path()), vec!["cpu_manager_state"], "{op:?}");
        drop(fault);

        allocate(&m, "b", 3000).expect("allocation works once the fault is gone");
        let reloaded = static_manager(dual_socket_ht(), 1, dir.path());
        assert_eq!(reloaded.state(), m.state(), "{op:?}");
        assert_eq!(m.state().get("b", "c").map(|s| s.len()), Some(3));
    }
}

/// The directory fsync fails after the rename: the allocation is refused and memory unchanged;
/// the file may already hold it (an over-reservation), and the next write makes them agree.
#[test]
fn a2_12_a_failed_directory_fsync_refuses_the_allocation_and_the_next_write_agrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let before = m.state();
    let fault = Fault::arm(dir.path(), Op::SyncDir, EIO);
    allocate(&m, "a", 2000).expect_err("dir fsync fails");
    assert_eq!(m.state(), before);
    drop(fault);
    allocate(&m, "b", 2000).expect("works again");
    let reloaded = static_manager(dual_socket_ht(), 1, dir.path());
    assert_eq!(reloaded.state(), m.state());
    assert!(!reloaded.state().assignments.contains_key("a"));
}

/// A pod whose second container cannot be written is rolled back (`remove_pod`) while the disk
/// still fails: its first container's CPUs must not stay held. Before the fix they stayed in
/// memory and in the file for good, and a later pod that needed them was refused.
#[test]
fn a2_12_a_failed_admission_on_a_failing_disk_leaves_no_exclusive_cpus_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = pod(
        "failed",
        QosClass::Guaranteed,
        &[],
        &[("c1", 2000), ("c2", 2000)],
    );
    m.register_pod(&p);
    let hint = TopologyHint::default();
    m.allocate_container(&p.spec, &p.spec.containers[0], &hint)
        .expect("first container fits");
    let fault = Fault::arm(dir.path(), Op::Fsync, EIO);
    m.allocate_container(&p.spec, &p.spec.containers[1], &hint)
        .expect_err("second container cannot be written");
    let err = m
        .remove_pod("failed")
        .expect_err("the rollback cannot be written either");
    assert!(matches!(err, CpuManagerError::Write { .. }), "{err}");
    assert!(m.state().assignments.is_empty(), "{:?}", m.state());
    assert_eq!(m.default_cpu_set().to_string(), "0-11");
    drop(fault);

    // Every CPU but the reserved one is available again, and the file agrees once written.
    allocate(&m, "next", 11_000).expect("the failed pod's CPUs are free");
    let reloaded = static_manager(dual_socket_ht(), 1, dir.path());
    assert_eq!(reloaded.state(), m.state());
    assert!(!reloaded.state().assignments.contains_key("failed"));
}

/// An app container that reuses its init container's CPUs (`cpusToReuse`) and cannot be
/// written is undone without handing those CPUs to the shared pool: the init container still
/// holds them, so memory must be exactly as before the failed allocation.
#[test]
fn a2_12_a_failed_write_of_a_container_reusing_init_cpus_keeps_them_with_the_init_container() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    let p = pod(
        "reuse",
        QosClass::Guaranteed,
        &[("init", 2000)],
        &[("app", 2000)],
    );
    m.register_pod(&p);
    let hint = TopologyHint::default();
    m.allocate_container(&p.spec, &p.spec.init_containers[0], &hint)
        .expect("init container fits");
    let before = m.state();
    let fault = Fault::arm(dir.path(), Op::Fsync, EIO);
    m.allocate_container(&p.spec, &p.spec.containers[0], &hint)
        .expect_err("the app container cannot be written");
    drop(fault);
    assert_eq!(
        m.state(),
        before,
        "memory is as before the failed allocation"
    );
    let shared = m.default_cpu_set();
    let init_cpus = &before.assignments["reuse"]["init"];
    assert!(
        !init_cpus.iter().any(|cpu| shared.contains(cpu)),
        "the init container's CPUs {init_cpus} are not in the shared pool {shared}"
    );
}

struct Tmpfs<'a>(&'a Path);

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

/// A real full disk (64 KiB tmpfs, filled up): refused with ENOSPC, the file intact, no
/// temporary file; freeing space makes allocation work.
#[test]
fn a2_12_real_full_disk_refuses_the_cpu_allocation_until_space_is_freed() {
    let outer = tempfile::tempdir().expect("tempdir");
    let mnt = outer.path().join("small");
    fs::create_dir(&mnt).expect("mkdir");
    match Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&mnt)
        .output()
    {
        Ok(out) if out.status.success() => {}
        other => {
            println!("SKIPPED: cannot mount a 64k tmpfs ({other:?}); run as root");
            return;
        }
    }
    let _guard = Tmpfs(&mnt);
    let m = static_manager(dual_socket_ht(), 1, &mnt);
    allocate(&m, "a", 2000).expect("fits");
    let file = mnt.join("cpu_manager_state");
    let before = fs::read(&file).expect("state file");
    let filler = mnt.join("filler");
    let chunk = vec![0u8; 4096];
    {
        use std::io::Write;
        let mut f = fs::File::create(&filler).expect("filler");
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let err = allocate(&m, "b", 2000).expect_err("disk full");
    assert!(err.to_string().contains("No space left"), "{err}");
    assert_eq!(fs::read(&file).expect("state file"), before);
    assert_eq!(listing(&mnt), vec!["cpu_manager_state", "filler"]);
    assert!(!m.state().assignments.contains_key("b"));
    fs::remove_file(&filler).expect("free space");
    allocate(&m, "b", 2000).expect("works after space is freed");
    assert_eq!(static_manager(dual_socket_ht(), 1, &mnt).state(), m.state());
}

/// Exclusive CPUs of a pod devicelet never acknowledged (a crash after `cpu_manager_state` was
/// written and before the admission was durable, or a rollback that could not be written)
/// are freed once the active pods are known (the kubelet's `removeStaleState`); the file
/// agrees.
#[test]
fn a2_18_cpus_of_pods_that_are_not_active_are_freed_once_the_active_pods_are_known() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let m = static_manager(dual_socket_ht(), 1, dir.path());
        allocate(&m, "kept", 2000).expect("fits");
        allocate(&m, "never-acknowledged", 4000).expect("fits");
    }
    // Restart: both come back from the file.
    let m = static_manager(dual_socket_ht(), 1, dir.path());
    assert_eq!(m.state().assignments.len(), 2);
    let freed = m.retain_pods(|uid| uid == "kept").expect("write");
    assert_eq!(freed, vec!["never-acknowledged"]);
    assert!(m.state().get("kept", "c").is_some());
    assert_eq!(m.available_cpus().len(), 11 - 2);
    assert_eq!(
        static_manager(dual_socket_ht(), 1, dir.path()).state(),
        m.state()
    );
    assert!(
        m.retain_pods(|uid| uid == "kept")
            .expect("no-op")
            .is_empty()
    );
}
