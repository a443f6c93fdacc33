//! Property tests. Equivalence: the fast merge and the compact device hints give exactly the
//! kubelet's results, checked against `reference` (the literal, exponential kubelet algorithm)
//! on random machines of up to 8 NUMA nodes. Behaviour: a merged hint is what one hint per list
//! produces; single-numa-node never admits a multi-node affinity; best-effort always admits;
//! restricted admits exactly the preferred merges; the result does not depend on provider or
//! resource order; 16- and 64-node merges with generated hints finish fast.

use devicelet_topology::merge::{
    TieBreak, merge_providers, merge_single_numa_node, with_full_search_only,
};
use devicelet_topology::reference;
use devicelet_topology::{
    DeviceNuma, NumaMask, ProviderHints, ResourceHints, TopologyHint, device_hints,
};
use std::time::{Duration, Instant};

use devicelet_topology::{Policy, PolicyName, PolicyOptions};
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
        let full = with_full_search_only(|| merge_providers(&hints, machine, tie));
        prop_assert_eq!(full, slow, "full search only, tie {:?}", tie);
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

fn full_mask(nodes: usize) -> NumaMask {
    NumaMask::from_bits(if nodes >= 64 {
        u64::MAX
    } else {
        (1u64 << nodes) - 1
    })
}

fn policy(name: PolicyName, nodes: usize) -> Policy {
    let opts = PolicyOptions {
        max_allowable_numa_nodes: 64,
        ..PolicyOptions::default()
    };
    Policy::new(name, opts, full_mask(nodes), None).expect("valid policy")
}

/// Does some combination (one hint per flattened list) merge to exactly `hint`?
fn produced_by_some_combination(
    lists: &[Vec<TopologyHint>],
    default: NumaMask,
    hint: TopologyHint,
) -> bool {
    struct Acc {
        mask: NumaMask,
        preferred: bool,
        first: Option<NumaMask>,
    }
    fn walk(lists: &[Vec<TopologyHint>], i: usize, acc: Acc, want: TopologyHint) -> bool {
        if i == lists.len() {
            return TopologyHint::new(acc.mask, acc.preferred) == want;
        }
        lists[i].iter().any(|h| {
            let next = match h.affinity {
                Some(a) => Acc {
                    mask: acc.mask.and(a),
                    first: acc.first.or(Some(a)),
                    preferred: acc.preferred && h.preferred && acc.first.is_none_or(|f| f == a),
                },
                None => Acc {
                    mask: acc.mask,
                    first: acc.first,
                    preferred: acc.preferred && h.preferred,
                },
            };
            walk(lists, i + 1, next, want)
        })
    }
    walk(
        lists,
        0,
        Acc {
            mask: default,
            preferred: true,
            first: None,
        },
        hint,
    )
}

fn any_non_empty_combination(lists: &[Vec<TopologyHint>], default: NumaMask) -> bool {
    fn walk(lists: &[Vec<TopologyHint>], i: usize, mask: NumaMask) -> bool {
        if mask.is_empty() {
            return false;
        }
        i == lists.len()
            || lists[i]
                .iter()
                .any(|h| walk(lists, i + 1, mask.and(h.affinity.unwrap_or(mask))))
    }
    walk(lists, 0, default)
}

/// Same providers with resources renamed (changes map order) and providers reversed.
fn reordered(p: &[Vec<Res>]) -> Vec<Vec<Res>> {
    let mut q: Vec<Vec<Res>> = p
        .iter()
        .map(|r| r.iter().rev().cloned().collect())
        .collect();
    q.reverse();
    q
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn merged_hint_is_the_and_of_one_hint_per_provider(
        (nodes, p) in (1usize..=5).prop_flat_map(|n| (Just(n), providers(n, 4, 2)))
    ) {
        let machine = full_mask(nodes);
        let hints = materialize(&p, machine);
        let lists = reference::flatten_explicit(&hints);
        let got = merge_providers(&hints, machine, TieBreak::Narrowest);
        if any_non_empty_combination(&lists, machine) {
            prop_assert!(produced_by_some_combination(&lists, machine, got), "{:?} not produced by any combination", got);
        } else {
            prop_assert_eq!(got, TopologyHint::new(machine, false));
        }
    }

    #[test]
    fn policies_admit_as_specified_up_to_16_nodes(
        (nodes, p) in (1usize..=16).prop_flat_map(|n| (Just(n), providers(n, 6, 4)))
    ) {
        let machine = full_mask(nodes);
        let hints = materialize(&p, machine);
        let (be, be_admit) = policy(PolicyName::BestEffort, nodes).merge(&hints);
        prop_assert!(be_admit, "best-effort always admits");
        let (re, re_admit) = policy(PolicyName::Restricted, nodes).merge(&hints);
        prop_assert_eq!(re, be, "restricted merges like best-effort");
        prop_assert_eq!(re_admit, re.preferred, "restricted admits exactly the preferred merges");
        let (sn, sn_admit) = policy(PolicyName::SingleNumaNode, nodes).merge(&hints);
        prop_assert_eq!(sn_admit, sn.preferred);
        if sn_admit {
            prop_assert!(sn.affinity.is_none_or(|m| m.count() == 1), "single-numa-node admitted {:?}", sn);
        }
        if sn.affinity.is_none() && sn_admit && nodes > 1 {
            // Only "nobody cares" merges become nil on a multi-node machine: every list must
            // have offered a preferred nil hint.
            let lists = reference::flatten_explicit(&hints);
            prop_assert!(lists.iter().all(|l| l.contains(&TopologyHint::any(true))));
        }
    }

    #[test]
    fn result_does_not_depend_on_provider_or_resource_order(
        (nodes, p, d) in (1usize..=16).prop_flat_map(|n| (Just(n), providers(n, 6, 4), distances(n)))
    ) {
        let machine = full_mask(nodes);
        let a = materialize(&p, machine);
        let b = materialize(&reordered(&p), machine);
        for tie in [TieBreak::Narrowest, TieBreak::Closest(&d)] {
            prop_assert_eq!(merge_providers(&a, machine, tie), merge_providers(&b, machine, tie));
        }
        prop_assert_eq!(merge_single_numa_node(&a, machine), merge_single_numa_node(&b, machine));
    }
}

/// 8 devices per node on 64 nodes, a random share of them taken, three resources.
fn busy_machine_64() -> impl Strategy<Value = Vec<(Vec<usize>, usize)>> {
    // Per resource: free devices per node (0..=8 for each of 64 nodes) and a request.
    let resource = (
        prop::collection::vec(
            prop_oneof![3 => Just(0usize), 1 => 1usize..=8, 1 => Just(8usize)],
            64,
        ),
        prop_oneof![3 => 1usize..=16, 1 => 17usize..=64],
    );
    prop::collection::vec(resource, 3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn sixty_four_node_merges_finish_fast_and_stay_consistent(resources in busy_machine_64()) {
        let machine = full_mask(64);
        let mut provider_hints = vec![];
        for (r, (free_per_node, request)) in resources.iter().enumerate() {
            let mut all = vec![];
            let mut free = vec![];
            for (node, &f) in free_per_node.iter().enumerate() {
                for d in 0..8 {
                    let id = format!("r{r}-n{node}-d{d}");
                    if d < f {
                        free.push(id.clone());
                    }
                    all.push(DeviceNuma::new(id, Some(vec![node as i64])));
                }
            }
            let free_refs: Vec<&str> = free.iter().map(String::as_str).collect();
            let hints = devicelet_topology::resource_hints(&all, &free_refs, &[], &[], *request, machine).hints;
            provider_hints.push(ProviderHints::from([(format!("res{r}"), hints)]));
        }
        let started = Instant::now();
        let (hint, _) = policy(PolicyName::BestEffort, 64).merge(&provider_hints);
        let (single, single_admit) = policy(PolicyName::SingleNumaNode, 64).merge(&provider_hints);
        // Closest on a machine of 8 sockets with 8 nodes each.
        let groups: Vec<Vec<u32>> = (0..64u32)
            .map(|i| {
                (0..64u32)
                    .map(|j| if i == j { 10 } else if i / 8 == j / 8 { 12 } else { 20 + (i / 8).abs_diff(j / 8) })
                    .collect()
            })
            .collect();
        let opts = PolicyOptions { max_allowable_numa_nodes: 64, prefer_closest_numa_nodes: true };
        let closest = Policy::new(PolicyName::BestEffort, opts, machine, Some(groups)).expect("valid");
        let (near, _) = closest.merge(&provider_hints);
        prop_assert_eq!(near.preferred, hint.preferred, "closest only breaks ties");
        prop_assert_eq!(near.affinity.map(|m| m.count()), hint.affinity.map(|m| m.count()));
        let took = started.elapsed();
        let budget = Duration::from_millis(if cfg!(debug_assertions) { 10_000 } else { 500 });
        prop_assert!(took < budget, "64-node merge took {:?}", took);
        if hint.preferred {
            let m = hint.affinity.unwrap_or(machine);
            for p in &provider_hints {
                for h in p.values() {
                    if let ResourceHints::Family(f) = h {
                        prop_assert!(f.contains_preferred(m), "preferred merge {:?} is preferred by every list", m);
                    }
                }
            }
        }
        if single_admit {
            prop_assert!(single.affinity.is_some_and(|m| m.count() == 1));
        }
    }
}

/// A resource with devices on every node (0..=3 per node, some taken, some spanning two
/// nodes, an occasional reusable one): universes cover the machine, so the non-preferred
/// search over several generated lists does real work.
fn dense_devices(nodes: usize) -> impl Strategy<Value = DeviceSetup> {
    (
        prop::collection::vec((0usize..=3, 0usize..=3), nodes),
        prop::collection::vec((0..nodes as i64, 0..nodes as i64), 0..=2),
        prop::option::weighted(0.2, 0..nodes as i64),
        1usize..=5,
    )
        .prop_map(move |(per_node, spanning, reusable, request)| {
            let mut topologies = vec![];
            let mut available = vec![];
            for (node, (count, taken)) in per_node.into_iter().enumerate() {
                for d in 0..count {
                    if d >= taken {
                        available.push(topologies.len());
                    }
                    topologies.push(Some(vec![node as i64]));
                }
            }
            for (a, b) in spanning {
                available.push(topologies.len());
                topologies.push(Some(vec![a, b]));
            }
            let mut reusable_idx = vec![];
            if let Some(n) = reusable {
                reusable_idx.push(topologies.len());
                topologies.push(Some(vec![n]));
            }
            DeviceSetup {
                topologies,
                available,
                reusable: reusable_idx,
                request,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn fast_merge_equals_kubelet_merge_with_dense_device_lists(
        (nodes, setups, extra, d) in (2usize..=5).prop_flat_map(|n| (
            Just(n),
            prop::collection::vec(dense_devices(n), 2..=3),
            prop::option::of(explicit_hints(n)),
            distances(n),
        ))
    ) {
        let mut p: Vec<Vec<Res>> = setups.into_iter().map(|s| vec![Res::Devices(s)]).collect();
        if let Some(h) = extra {
            p.push(vec![Res::Explicit(h)]);
        }
        check_all_policies(nodes, &p, &d)?;
    }
}
