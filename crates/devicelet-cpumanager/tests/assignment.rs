//! takeByTopology cases mirrored from upstream `cpu_assignment_test.go`
//! (`commonTakeByTopologyTestCases`, `TestTakeByTopologyNUMAPacked`).

mod common;

use common::{dual_socket_ht, dual_socket_multi_numa_ht, set, single_socket_ht};
use devicelet_cpumanager::{CpuTopology, TakeError, take_by_topology};

fn check(name: &str, topo: &CpuTopology, avail: &str, n: usize, want: &str) {
    let got = take_by_topology(topo, &set(avail), n)
        .unwrap_or_else(|e| panic!("{name}: unexpected error {e}"));
    assert!(got.same_as(&set(want)), "{name}: got {got}, want {want}");
}

#[test]
fn take_more_cpus_than_are_available_from_single_socket_with_ht() {
    let err = take_by_topology(&single_socket_ht(), &set("0,2,4,6"), 5)
        .expect_err("only 4 CPUs are free");
    assert_eq!(
        err,
        TakeError::NotEnough {
            requested: 5,
            available: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "not enough cpus available to satisfy request: requested=5, available=4"
    );
}

#[test]
fn take_by_topology_single_socket_ht_cases() {
    let t = single_socket_ht();
    check("take zero cpus", &t, "0-7", 0, "");
    check("take one cpu", &t, "0-7", 1, "0");
    check("take one cpu, some cpus are taken", &t, "1,3,5-7", 1, "6");
    check("take two cpus (a whole core)", &t, "0-7", 2, "0,4");
    check("take all cpus", &t, "0-7", 8, "0-7");
    check(
        "take two cpus, only one core totally free",
        &t,
        "0-3,6",
        2,
        "2,6",
    );
}

#[test]
fn take_by_topology_dual_socket_ht_cases() {
    let t = dual_socket_ht();
    check("take one cpu - core from socket 0", &t, "1-5,7-11", 1, "2");
    check("take a socket of cpus", &t, "0-11", 6, "0,2,4,6,8,10");
    check(
        "take three cpus: a core then the fullest socket",
        &t,
        "0-11",
        3,
        "0,2,6",
    );
    check(
        "allocate 4 full cores with 3 from the first NUMA node and 1 from the second",
        &t,
        "0-11",
        8,
        "0,6,2,8,4,10,1,7",
    );
}

#[test]
fn take_by_topology_multi_numa_per_socket_cases() {
    let t = dual_socket_multi_numa_ht();
    check("take a socket", &t, "0-79", 40, "0-19,40-59");
    check("take a NUMA node", &t, "0-79", 20, "0-9,40-49");
    check(
        "take a NUMA node with 1 NUMA node already taken",
        &t,
        "10-39,50-79",
        20,
        "10-19,50-59",
    );
    check(
        "take a socket and a NUMA node",
        &t,
        "0-79",
        60,
        "0-29,40-69",
    );
    check(
        "take a socket and a NUMA node, a core taken",
        &t,
        "1-39,41-79",
        60,
        "10-39,50-79",
    );
    check(
        "allocate 32 full cores: 3 NUMA nodes filled, 2 cores from the fourth",
        &t,
        "0-79",
        64,
        "0-29,40-69,30,31,70,71",
    );
}

#[test]
fn cpus_unknown_to_the_topology_are_never_taken() {
    let t = single_socket_ht();
    let err = take_by_topology(&t, &set("6-7,100-110"), 3).expect_err("only 2 known CPUs");
    assert!(matches!(err, TakeError::NotEnough { requested: 3, .. }));
    check("known ones only", &t, "6-7,100-110", 2, "6-7");
}
