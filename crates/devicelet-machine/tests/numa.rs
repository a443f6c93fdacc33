//! NUMA discovery from fake sysfs trees: nodes, CPUs and distances from `devices/system/node`;
//! missing or odd files and invalid layouts give typed errors naming them.

use std::collections::BTreeMap;
use std::fs;

use devicelet_machine::{MachineError, read_numa_topology};
use devicelet_topology::{DiscoveryError, NumaMask, TopologyManager};

fn fake_sysfs(nodes: &[(&str, &str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("devices/system/node");
    fs::create_dir_all(&base).expect("mkdir");
    // Non-node entries that real sysfs has must be ignored.
    fs::write(base.join("online"), "0-1\n").expect("write");
    fs::create_dir_all(base.join("power")).expect("mkdir");
    for (name, cpulist, distance) in nodes {
        let d = base.join(name);
        fs::create_dir_all(&d).expect("mkdir");
        if !cpulist.is_empty() {
            fs::write(d.join("cpulist"), cpulist).expect("write");
        }
        if !distance.is_empty() {
            fs::write(d.join("distance"), distance).expect("write");
        }
    }
    dir
}

#[test]
fn sysfs_two_nodes_are_read() {
    let t = fake_sysfs(&[
        ("node0", "0-3,8\n", "10 21\n"),
        ("node1", "4-7\n", "21 10\n"),
    ]);
    let topo = read_numa_topology(t.path()).expect("valid tree");
    assert_eq!(topo.node_count(), 2);
    assert_eq!(topo.nodes[0].cpus, vec![0, 1, 2, 3, 8]);
    assert_eq!(topo.distances, Some(vec![vec![10, 21], vec![21, 10]]));
    assert_eq!(topo.default_mask(), NumaMask::from_bits(0b11));
    assert_eq!(topo.node_of_cpu(8), Some(0));
}

#[test]
fn sysfs_missing_cpulist_is_an_io_error() {
    let t = fake_sysfs(&[("node0", "", "10\n")]);
    let err = read_numa_topology(t.path()).expect_err("missing file");
    assert!(matches!(err, MachineError::Io { .. }), "{err}");
    assert!(err.to_string().contains("cpulist"), "{err}");
}

#[test]
fn sysfs_missing_root_is_an_io_error() {
    let t = tempfile::tempdir().expect("tempdir");
    assert!(matches!(
        read_numa_topology(t.path()),
        Err(MachineError::Io { .. })
    ));
}

#[test]
fn sysfs_odd_cpulist_is_rejected() {
    for bad in ["0-", "a-b", "3-1", "1,,2"] {
        let t = fake_sysfs(&[("node0", bad, "10\n")]);
        let err = read_numa_topology(t.path()).expect_err("bad cpulist");
        assert!(
            matches!(err, MachineError::BadCpuList { .. }),
            "{bad}: {err}"
        );
    }
    let t = fake_sysfs(&[("node0", "0-\n", "10\n")]);
    let err = read_numa_topology(t.path()).expect_err("bad cpulist");
    let file = t.path().join("devices/system/node/node0/cpulist");
    assert_eq!(
        err.to_string(),
        format!(
            "bad cpulist \"0-\\n\" in {}: \"0-\" is not a CPU or range",
            file.display()
        )
    );
}

#[test]
fn sysfs_odd_distance_is_rejected() {
    let t = fake_sysfs(&[("node0", "0", "10 x\n"), ("node1", "1", "20 10\n")]);
    assert!(matches!(
        read_numa_topology(t.path()),
        Err(MachineError::Numa(DiscoveryError::BadDistance {
            node: 0,
            ..
        }))
    ));
    let t = fake_sysfs(&[("node0", "0", "10\n"), ("node1", "1", "20 10\n")]);
    let err = read_numa_topology(t.path()).expect_err("short row");
    assert!(
        matches!(
            err,
            MachineError::Numa(DiscoveryError::BadDistance { node: 0, .. })
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "bad distance row for NUMA node 0: 1 entries for 2 nodes"
    );
}

#[test]
fn sysfs_non_contiguous_node_ids_are_rejected() {
    let t = fake_sysfs(&[("node0", "0", "10 20\n"), ("node2", "1", "20 10\n")]);
    let err = read_numa_topology(t.path()).expect_err("hole in ids");
    assert!(
        matches!(err, MachineError::Numa(DiscoveryError::NonContiguousNodeIds { ref found }) if found == &vec![0, 2]),
        "{err}"
    );
    // Refused for the hole, before the missing files of the tree are looked at.
    let t = fake_sysfs(&[("node1", "", "")]);
    assert!(matches!(
        read_numa_topology(t.path()),
        Err(MachineError::Numa(
            DiscoveryError::NonContiguousNodeIds { .. }
        ))
    ));
}

#[test]
fn sysfs_bad_node_name_and_empty_tree_are_rejected() {
    let t = fake_sysfs(&[("nodeX", "0", "10\n")]);
    assert!(matches!(
        read_numa_topology(t.path()),
        Err(MachineError::BadNodeName(_))
    ));
    let t = fake_sysfs(&[]);
    let err = read_numa_topology(t.path()).expect_err("no nodes");
    assert!(matches!(err, MachineError::NoNodes(_)), "{err}");
    assert!(err.to_string().starts_with("no NUMA nodes found under "));
}

#[test]
fn sysfs_cpu_on_two_nodes_is_rejected() {
    let t = fake_sysfs(&[("node0", "0-1", "10 20\n"), ("node1", "1-2", "20 10\n")]);
    assert!(matches!(
        read_numa_topology(t.path()),
        Err(MachineError::Numa(DiscoveryError::DuplicateCpu {
            cpu: 1,
            ..
        }))
    ));
}

#[test]
fn sysfs_memory_only_node_has_no_cpus() {
    let t = fake_sysfs(&[("node0", "0-1", "10 20\n"), ("node1", "\n", "20 10\n")]);
    let topo = read_numa_topology(t.path()).expect("valid");
    assert!(topo.nodes[1].cpus.is_empty());
}

#[test]
fn topology_from_sysfs_feeds_the_manager() {
    let t = fake_sysfs(&[("node0", "0-3\n", "10 21\n"), ("node1", "4-7\n", "21 10\n")]);
    let topo = read_numa_topology(t.path()).expect("valid tree");
    let opts: BTreeMap<String, String> =
        BTreeMap::from([("prefer-closest-numa-nodes".into(), "True".into())]);
    let m = TopologyManager::new(&topo, "best-effort", "pod", &opts).expect("distances present");
    assert!(m.policy().options().prefer_closest_numa_nodes);
    assert_eq!(m.policy().default_mask(), NumaMask::from_bits(0b11));
}
