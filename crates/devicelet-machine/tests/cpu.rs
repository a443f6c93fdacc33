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

/// One socket, one NUMA node, 4 cores × 2 threads (cpu c and c+4 are siblings). Each CPU gets
/// L1d/L1i/L2 private caches and an L3 shared by `l3_cores` cores (ids 10, 11, ...); cores
/// listed in `no_cache` have no `cache` directory.
fn cache_tree(root: &Path, l3_cores: u32, no_cache: &[u32]) {
    write(root, "devices/system/node/node0/cpulist", "0-7\n");
    write(root, "devices/system/node/node0/distance", "10\n");
    for cpu in 0..8u32 {
        let core = cpu % 4;
        let topo = format!("devices/system/cpu/cpu{cpu}/topology");
        write(root, &format!("{topo}/physical_package_id"), "3\n");
        write(root, &format!("{topo}/core_id"), &format!("{core}\n"));
        if no_cache.contains(&core) {
            continue;
        }
        let siblings = (1u32 << core) | (1u32 << (core + 4));
        let group = core / l3_cores;
        let mut l3_mask = 0u32;
        for c in 0..4u32 {
            if c / l3_cores == group {
                l3_mask |= (1 << c) | (1 << (c + 4));
            }
        }
        let caches = [
            (1, "Data", 32, core, siblings),
            (1, "Instruction", 32, core, siblings),
            (2, "Unified", 1024, core, siblings),
            (3, "Unified", 32768, 10 + group, l3_mask),
        ];
        for (k, (level, kind, size, id, mask)) in caches.iter().enumerate() {
            let dir = format!("devices/system/cpu/cpu{cpu}/cache/index{k}");
            write(root, &format!("{dir}/level"), &format!("{level}\n"));
            write(root, &format!("{dir}/type"), &format!("{kind}\n"));
            write(root, &format!("{dir}/size"), &format!("{size}K\n"));
            write(root, &format!("{dir}/id"), &format!("{id}\n"));
            write(
                root,
                &format!("{dir}/shared_cpu_map"),
                &format!("{mask:08x}\n"),
            );
        }
        // Not a cache index: cadvisor skips names without the `index` prefix.
        write(
            root,
            &format!("devices/system/cpu/cpu{cpu}/cache/uevent"),
            "\n",
        );
    }
}

fn uncore_ids(root: &Path) -> Vec<u32> {
    let t = discover(root).expect("valid tree").cpus;
    t.cpus().iter().map(|c| c.uncore_cache).collect()
}

#[test]
fn an_l3_shared_by_part_of_a_node_is_the_uncore_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    cache_tree(dir.path(), 2, &[]);
    assert_eq!(uncore_ids(dir.path()), vec![10, 10, 11, 11, 10, 10, 11, 11]);
    let t = discover(dir.path()).expect("valid").cpus;
    assert_eq!(t.num_uncore_caches(), 2);
    assert_eq!(t.cpus_per_uncore_cache(), 4);
    assert_eq!(t.uncore_caches()[&11].to_string(), "2-3,6-7");
}

#[test]
fn a_node_wide_l3_or_no_cache_information_falls_back_to_the_socket_id() {
    // The L3 spans all 8 CPUs of the node: cadvisor files it as a node cache.
    let dir = tempfile::tempdir().expect("tempdir");
    cache_tree(dir.path(), 4, &[]);
    assert_eq!(uncore_ids(dir.path()), vec![3; 8]);
    // No cache directories at all (the older fake tree).
    let dir = tempfile::tempdir().expect("tempdir");
    fake_tree(dir.path());
    let t = discover(dir.path()).expect("valid").cpus;
    let ids: Vec<u32> = t.cpus().iter().map(|c| c.uncore_cache).collect();
    let sockets: Vec<u32> = t.cpus().iter().map(|c| c.socket).collect();
    assert_eq!(ids, sockets);
}

#[test]
fn an_unreadable_cache_ends_the_nodes_cache_scan_as_in_cadvisor() {
    // Core 1 has no cache directory: cores 0 keeps its L3, cores 1..3 (scanned after it)
    // get the socket id.
    let dir = tempfile::tempdir().expect("tempdir");
    cache_tree(dir.path(), 2, &[1]);
    assert_eq!(uncore_ids(dir.path()), vec![10, 3, 3, 3, 10, 3, 3, 3]);
}

#[test]
fn a_core_is_named_by_its_lowest_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    cache_tree(dir.path(), 2, &[]);
    let t = discover(dir.path()).expect("valid").cpus;
    let names: Vec<u32> = t.cores().keys().copied().collect();
    assert_eq!(names, vec![0, 1, 2, 3]);
    assert_eq!(t.info(6).map(|i| i.core), Some(2));
}
