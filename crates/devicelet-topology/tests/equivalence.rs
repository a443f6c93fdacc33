//! Property tests: the fast merge and the compact device hints give exactly the kubelet's
//! results, checked against `reference` (the literal, exponential kubelet algorithm) on random
//! machines of up to 8 NUMA nodes.

use devicelet_topology::merge::{TieBreak, merge_providers, merge_single_numa_node};
use devicelet_topology::reference;
use devicelet_topology::{
    DeviceNuma, NumaMask, ProviderHints, ResourceHints, TopologyHint, device_hints,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct DeviceSetup {
    topologies: Vec<Option<Vec<i64>>>,
    available: Vec<usize>,
    reusable: Vec<usize>,
    request: usize,
}

fn device_setup(nodes: usize) -> impl Strategy<Value = DeviceSetup> {
    // Ids up to `nodes` inclusive: `nodes` itself is a node the machine lacks.
    let topo = prop_oneof![
        1 => Just(None),
        1 => Just(Some(vec![])),
        8 => prop::collection::vec(0..=(nodes as i64), 1..=2).prop_map(Some),
    ];
    prop::collection::vec(topo, 1..=8).prop_flat_map(|topologies| {
        let n = topologies.len();
        (
            Just(topologies),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(0u8..10, n),
            0usize..=5,
        )
            .prop_map(|(topologies, avail, reuse, request)| {
                let available = (0..avail.len()).filter(|&i| avail[i]).collect();
                // Reusable devices are rare and usually not also available.
                let reusable = (0..reuse.len())
                    .filter(|&i| reuse[i] == 0 && !avail[i])
                    .collect();
                DeviceSetup {
                    topologies,
                    available,
                    reusable,
                    request,
                }
            })
    })
}

fn build_family(setup: &DeviceSetup, machine: NumaMask) -> ResourceHints {
    let all: Vec<DeviceNuma> = setup
        .topologies
        .iter()
        .enumerate()
        .map(|(i, t)| DeviceNuma::new(format!("dev{i}"), t.clone()))
        .collect();
    let ids: Vec<String> = (0..all.len()).map(|i| format!("dev{i}")).collect();
    let available: Vec<&str> = setup.available.iter().map(|&i| ids[i].as_str()).collect();
    let reusable: Vec<&str> = setup.reusable.iter().map(|&i| ids[i].as_str()).collect();
    device_hints(&all, &available, &reusable, setup.request, machine).hints
}

fn explicit_hints(nodes: usize) -> impl Strategy<Value = Vec<TopologyHint>> {
    // Masks may carry one bit beyond the machine, which the default mask cuts away.
    let limit = 1u64 << (nodes + 1);
    let hint =
        (prop::option::weighted(0.85, 1..limit), any::<bool>()).prop_map(|(m, preferred)| {
            TopologyHint {
                affinity: m.map(NumaMask::from_bits),
                preferred,
            }
        });
    prop::collection::vec(hint, 0..=4)
}

#[derive(Clone, Debug)]
enum Res {
    NoPref,
    Explicit(Vec<TopologyHint>),
    Devices(DeviceSetup),
}

fn resource(nodes: usize, family_weight: u32) -> impl Strategy<Value = Res> {
    prop_oneof![
        1 => Just(Res::NoPref),
        4 => explicit_hints(nodes).prop_map(Res::Explicit),
        family_weight => device_setup(nodes).prop_map(Res::Devices),
    ]
}

fn providers(
    nodes: usize,
    max_lists: usize,
    family_weight: u32,
) -> impl Strategy<Value = Vec<Vec<Res>>> {
    prop::collection::vec(
        prop::collection::vec(resource(nodes, family_weight), 0..=2),
        0..=3,
    )
    .prop_filter("bounded reference cost", move |p| {
        p.iter().map(|r| r.len().max(1)).sum::<usize>() <= max_lists
    })
}

fn distances(nodes: usize) -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(11u32..=14, nodes * nodes).prop_map(move |v| {
        let mut d = vec![vec![0u32; nodes]; nodes];
        for i in 0..nodes {
            for j in 0..nodes {
                // Symmetric, 10 on the diagonal, few distinct values so ties happen.
                d[i][j] = if i == j {
                    10
                } else {
                    v[i.min(j) * nodes + i.max(j)] * 2
                };
            }
        }
        d
    })
}

fn materialize(p: &[Vec<Res>], machine: NumaMask) -> Vec<ProviderHints> {
    p.iter()
        .map(|resources| {
            resources
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let hints = match r {
                        Res::NoPref => ResourceHints::NoPreference,
                        Res::Explicit(h) => ResourceHints::Hints(h.clone()),
                        Res::Devices(s) => build_family(s, machine),
                    };
                    (format!("res{i}"), hints)
                })
                .collect()
        })
        .collect()
}

fn check_all_policies(nodes: usize, p: &[Vec<Res>], d: &[Vec<u32>]) -> Result<(), TestCaseError> {
    let machine = NumaMask::from_bits((1u64 << nodes) - 1);
    let hints = materialize(p, machine);
    for tie in [TieBreak::Narrowest, TieBreak::Closest(d)] {
        let fast = merge_providers(&hints, machine, tie);
        let slow = reference::merge_providers(&hints, machine, tie);
        prop_assert_eq!(fast, slow, "best-effort/restricted merge, tie {:?}", tie);
    }
    prop_assert_eq!(
        merge_single_numa_node(&hints, machine),
        reference::merge_single_numa_node(&hints, machine),
        "single-numa-node merge"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn fast_merge_equals_kubelet_merge_up_to_5_nodes(
        (nodes, p, d) in (1usize..=5).prop_flat_map(|n| (Just(n), providers(n, 4, 3), distances(n)))
    ) {
        check_all_policies(nodes, &p, &d)?;
    }

    #[test]
    fn fast_merge_equals_kubelet_merge_explicit_only_up_to_8_nodes(
        (nodes, p, d) in (6usize..=8).prop_flat_map(|n| (Just(n), providers(n, 5, 0), distances(n)))
    ) {
        check_all_policies(nodes, &p, &d)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    #[test]
    fn fast_merge_equals_kubelet_merge_with_devices_on_8_nodes(
        (nodes, p, d) in (6usize..=8).prop_flat_map(|n| (Just(n), providers(n, 2, 6), distances(n)))
    ) {
        check_all_policies(nodes, &p, &d)?;
    }

    #[test]
    fn device_family_lists_exactly_the_kubelet_hints(
        (nodes, setup) in (1usize..=8).prop_flat_map(|n| (Just(n), device_setup(n)))
    ) {
        let machine = NumaMask::from_bits((1u64 << nodes) - 1);
        // The reference iterates the nodes the devices use (unknown ids dropped), or all.
        let mut used: Vec<usize> = setup
            .topologies
            .iter()
            .flatten()
            .flatten()
            .filter_map(|&n| usize::try_from(n).ok().filter(|&n| n < nodes))
            .collect();
        used.sort_unstable();
        used.dedup();
        if used.is_empty() {
            used = (0..nodes).collect();
        }
        let ref_devices: Vec<reference::RefDevice> = setup
            .topologies
            .iter()
            .map(|t| t.as_ref().map(|ids| ids.iter().filter_map(|&n| usize::try_from(n).ok()).collect()))
            .collect();
        let expected = reference::generate_device_hints(&used, &ref_devices, &setup.available, &setup.reusable, setup.request);
        let got = match build_family(&setup, machine) {
            ResourceHints::Family(f) => f.to_hints(20).map_err(|e| TestCaseError::fail(e.to_string()))?,
            ResourceHints::Hints(h) => h,
            ResourceHints::NoPreference => return Err(TestCaseError::fail("device_hints never says no preference")),
        };
        prop_assert_eq!(got, expected);
    }
}
