//! CPU topology discovery from a fake sysfs tree: NUMA nodes from `devices/system/node`, sockets
//! and cores from `devices/system/cpu/cpuN/topology`; missing or odd files give typed errors.

use std::fs;
use std::path::Path;

use devicelet_machine::{MachineError, discover, read_cpu_topology, read_numa_topology};

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().expect("has parent")).expect("mkdir");
    fs::write(p, content).expect("write");
}

/// 2 sockets = 2 NUMA nodes, 2 cores each, SMT-2: cpu c on socket c%2... laid out like
/// Linux on a small Intel box: 0-3 first threads, 4-7 siblings; core_id repeats per socket.
fn fake_tree(root: &Path) {
    write(root, "devices/system/node/node0/cpulist", "0-1,4-5\n");
    write(root, "devices/system/node/node0/distance", "10 21\n");
    write(root, "devices/system/node/node1/cpulist", "2-3,6-7\n");
    write(root, "devices/system/node/node1/distance", "21 10\n");
    for cpu in 0..8u32 {
        let socket = (cpu % 4) / 2;
        let core = cpu % 2;
        write(
            root,
            &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
            &format!("{socket}\n"),
        );
        write(
            root,
            &format!("devices/system/cpu/cpu{cpu}/topology/core_id"),
            &format!("{core}\n"),
        );
    }
}

#[test]
fn discovers_sockets_cores_and_numa_nodes_from_sysfs() {
    let dir = tempfile::tempdir().expect("tempdir");
    fake_tree(dir.path());
    let machine = discover(dir.path()).expect("valid tree");
    assert_eq!(machine.numa.node_count(), 2);
    let t = machine.cpus;
    assert_eq!(t.num_cpus(), 8);
    assert_eq!(t.num_sockets(), 2);
    assert_eq!(t.num_cores(), 4, "core_id 0 and 1 repeat on each socket");
    assert_eq!(t.num_numa_nodes(), 2);
    assert_eq!(t.cpus_per_core(), 2);
    let cores: Vec<String> = t.cores().values().map(|c| c.to_string()).collect();
    assert_eq!(cores, vec!["0,4", "1,5", "2,6", "3,7"]);
    // The two readers one by one give the same machine.
    let numa = read_numa_topology(dir.path()).expect("valid nodes");
    let cpus = read_cpu_topology(dir.path(), &numa).expect("valid cpus");
    assert_eq!(cpus.cpus(), t.cpus());
}

#[test]
fn missing_topology_file_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    fake_tree(dir.path());
    fs::remove_file(dir.path().join("devices/system/cpu/cpu5/topology/core_id")).expect("rm");
    let err = discover(dir.path()).expect_err("missing file");
    assert!(
        matches!(err, MachineError::Io { ref path, .. } if path.ends_with("cpu5/topology/core_id")),
        "{err}"
    );
}

#[test]
fn odd_topology_values_are_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    fake_tree(dir.path());
    write(
        dir.path(),
        "devices/system/cpu/cpu3/topology/physical_package_id",
        "-1\n",
    );
    let err = discover(dir.path()).expect_err("negative package id");
    assert!(
        matches!(err, MachineError::BadValue { ref content, .. } if content == "-1\n"),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("bad value \"-1\\n\" in ")
            && err
                .to_string()
                .ends_with("cpu3/topology/physical_package_id"),
        "{err}"
    );
}

#[test]
fn a_cpu_on_two_nodes_or_a_missing_tree_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    fake_tree(dir.path());
    write(
        dir.path(),
        "devices/system/node/node1/cpulist",
        "2-3,6-7,0\n",
    );
    let err = discover(dir.path()).expect_err("cpu 0 twice");
    assert_eq!(err.to_string(), "CPU 0 is listed by NUMA nodes 0 and 1");
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "devices/system/node/node0/cpulist", "0-1\n");
    write(dir.path(), "devices/system/node/node0/distance", "10\n");
    assert!(matches!(
        discover(dir.path()).expect_err("no cpu dir"),
        MachineError::Io { .. }
    ));
    let empty = tempfile::tempdir().expect("tempdir");
    assert!(matches!(
        discover(empty.path()).expect_err("no node directory"),
        MachineError::Io { ref path, .. } if path.ends_with("devices/system/node")
    ));
}
