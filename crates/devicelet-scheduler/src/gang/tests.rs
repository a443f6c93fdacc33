//! The group cycle on a real allocator over real API objects: all or nothing, the greedy order
//! that upstream gets wrong (kubernetes#138765: device choices, node choices), shared claims,
//! topology domains.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use devicelet_allocator::AllocateOptions;
use k8s_openapi::api::core::v1::{Node, Pod, PodResourceClaim, PodSchedulingGroup, PodSpec};
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, DeviceClass, DeviceClassSpec, DeviceCounterConsumption, ResourceClaim,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Policy;
use super::search::{GroupProblem, MemberInput, MemberResult, Topology, Verdict, schedule_group};
use crate::cache::ClusterCache;
use crate::cycle::{CycleInputs, with_engine};
use crate::testing::*;

fn member(name: &str, claim: &str) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            scheduling_group: Some(PodSchedulingGroup {
                pod_group_name: Some("g".into()),
            }),
            resource_claims: Some(vec![PodResourceClaim {
                name: "gpu".into(),
                resource_claim_name: Some(claim.into()),
                ..PodResourceClaim::default()
            }]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

/// A cluster: nodes with their slices, and the claims.
struct Cluster {
    cache: ClusterCache,
}

impl Cluster {
    fn new(nodes: Vec<Node>, slices: Vec<ResourceSlice>, claims: Vec<ResourceClaim>) -> Self {
        Cluster {
            cache: cache_with(nodes, slices, claims),
        }
    }

    /// Runs the group cycle for `pods` in this order.
    fn schedule(
        &mut self,
        pods: &[Pod],
        policy: Policy,
        topology: Option<&str>,
    ) -> super::search::GroupOutcome {
        let members: Vec<MemberInput> = pods
            .iter()
            .map(|p| MemberInput {
                pod: Arc::new(p.clone()),
                inputs: CycleInputs::read(p, &self.cache, Duration::from_secs(600)),
            })
            .collect();
        let problem = GroupProblem {
            policy,
            scheduled: 0,
            topology: topology.map(|k| Topology {
                key: k.to_owned(),
                scheduled_nodes: Vec::new(),
            }),
            deadline: Instant::now() + Duration::from_secs(5),
        };
        let options = AllocateOptions::unbounded();
        with_engine(
            &mut self.cache,
            options,
            &crate::config::Profile::named("devicelet-scheduler"),
            |engine, _| schedule_group(engine, &members, &problem),
        )
    }
}

fn placed_devices(outcome: &super::search::GroupOutcome) -> Vec<(String, Vec<String>)> {
    outcome
        .members
        .iter()
        .map(|m| match m {
            MemberResult::Placed(p) => (
                p.node.clone(),
                p.allocations
                    .iter()
                    .flat_map(|(_, a)| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                    .map(|r| r.device.clone())
                    .collect(),
            ),
            MemberResult::NotPlaced { .. } => ("-".into(), Vec::new()),
        })
        .collect()
}

#[test]
fn b_l5_a_prioritized_list_choice_of_an_earlier_member_is_revisited() {
    // One node, a big and a small GPU. The first member prefers big but takes small; the
    // second needs big. Upstream's greedy pass gives the first member big and fails the group.
    let mut c = Cluster::new(
        vec![node("n1", "8", &[])],
        vec![slice(
            "n1",
            vec![device("big-0", "big"), device("small-0", "small")],
            None,
        )],
        vec![
            claim("c1", first_available(&["big", "small"])),
            claim("c2", exact(1, Some("big"))),
        ],
    );
    let pods = [member("m1", "c1"), member("m2", "c2")];
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert_eq!(out.verdict, Verdict::Placed);
    assert_eq!(
        placed_devices(&out),
        vec![
            ("n1".to_owned(), vec!["small-0".to_owned()]),
            ("n1".to_owned(), vec!["big-0".to_owned()])
        ]
    );
}

#[test]
fn b_l5_partitions_of_one_gpu_are_repacked_for_the_whole_group() {
    // kubernetes#138765's shape: a GPU with 2 memory slices offered whole or as two halves;
    // both members prefer the whole GPU, and the greedy order gives it to the first.
    let counters = vec![CounterSet {
        name: "gpu-0-counters".into(),
        counters: BTreeMap::from([(
            "memory".to_owned(),
            Counter {
                value: Quantity("2".into()),
            },
        )]),
    }];
    let consume = |n: &str| {
        Some(vec![DeviceCounterConsumption {
            counter_set: "gpu-0-counters".into(),
            counters: BTreeMap::from([(
                "memory".to_owned(),
                Counter {
                    value: Quantity(n.into()),
                },
            )]),
        }])
    };
    let mut whole = device("gpu-0", "whole");
    whole.consumes_counters = consume("2");
    let mut half_a = device("gpu-0-half-a", "half");
    half_a.consumes_counters = consume("1");
    let mut half_b = device("gpu-0-half-b", "half");
    half_b.consumes_counters = consume("1");
    // Counters live in their own slice of the pool (a slice holds counters or devices).
    let mut devices = slice("n1", vec![whole, half_a, half_b], None);
    devices.spec.pool.resource_slice_count = 2;
    let mut counter_slice = slice("n1", Vec::new(), Some(counters));
    counter_slice.spec.devices = None;
    counter_slice.spec.pool.resource_slice_count = 2;
    counter_slice.metadata.name = Some("n1-counters".into());
    let mut c = Cluster::new(
        vec![node("n1", "8", &[])],
        vec![devices, counter_slice],
        vec![
            claim("c1", first_available(&["whole", "half"])),
            claim("c2", first_available(&["whole", "half"])),
        ],
    );
    let pods = [member("m1", "c1"), member("m2", "c2")];
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert_eq!(out.verdict, Verdict::Placed, "{out:?}");
    let devices = placed_devices(&out);
    assert!(
        devices
            .iter()
            .all(|(n, d)| n == "n1" && d.len() == 1 && d[0].contains("half"))
    );
}

#[test]
fn a_l1_an_earlier_member_moves_to_another_node_to_make_room() {
    // n1 (more CPU, so LeastAllocated prefers it) has 2 GPUs, n2 has 1. m1 needs one GPU, m2
    // two on one node: greedy puts m1 on n1 and leaves m2 nowhere.
    let mut c = Cluster::new(
        vec![node("n1", "64", &[]), node("n2", "2", &[])],
        vec![
            slice("n1", vec![device("a", "big"), device("b", "big")], None),
            slice("n2", vec![device("c", "big")], None),
        ],
        vec![claim("c1", exact(1, None)), claim("c2", exact(2, None))],
    );
    let pods = [member("m1", "c1"), member("m2", "c2")];
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert_eq!(out.verdict, Verdict::Placed, "{out:?}");
    let devices = placed_devices(&out);
    assert_eq!(devices[0].0, "n2");
    assert_eq!(devices[1].0, "n1");
}

#[test]
fn w23_a_gang_short_of_devices_places_nobody_and_says_who_fell_short() {
    let mut c = Cluster::new(
        vec![node("n1", "8", &[])],
        vec![slice(
            "n1",
            vec![device("a", "big"), device("b", "big")],
            None,
        )],
        vec![
            claim("c1", exact(1, None)),
            claim("c2", exact(1, None)),
            claim("c3", exact(1, None)),
        ],
    );
    let pods = [member("m1", "c1"), member("m2", "c2"), member("m3", "c3")];
    let out = c.schedule(&pods, Policy::Gang { min_count: 3 }, None);
    assert_eq!(out.placed(), 0);
    let Verdict::Unschedulable(message) = &out.verdict else {
        panic!("{:?}", out.verdict)
    };
    assert!(
        message.starts_with("2/3 pods schedulable: pod ns/m3: 0/1 nodes are available"),
        "{message}"
    );
    // With minCount 2 the two that fit are placed and the third fails on its own.
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert_eq!(out.verdict, Verdict::Placed);
    assert_eq!(out.placed(), 2);
    assert!(matches!(
        &out.members[2],
        MemberResult::NotPlaced { fit: Some(_), .. }
    ));
}

#[test]
fn b_l1_members_sharing_a_claim_share_one_allocation() {
    let mut c = Cluster::new(
        vec![node("n1", "8", &[]), node("n2", "8", &[])],
        vec![
            slice("n1", vec![device("a", "big")], None),
            slice("n2", vec![device("b", "big")], None),
        ],
        vec![claim("shared", exact(1, None))],
    );
    let pods = [member("m1", "shared"), member("m2", "shared")];
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert_eq!(out.verdict, Verdict::Placed);
    let (MemberResult::Placed(p1), MemberResult::Placed(p2)) = (&out.members[0], &out.members[1])
    else {
        panic!("{out:?}")
    };
    assert_eq!(p1.allocations.len(), 1, "the first member allocates");
    assert!(p2.allocations.is_empty(), "the second reuses it");
    // B-L2: the reused allocation's node selector keeps the second member on that node.
    assert_eq!(p1.node, p2.node);
}

#[test]
fn w68_topology_domains_pack_the_group_into_one_rack() {
    let mut nodes = Vec::new();
    let mut slices = Vec::new();
    for (n, r) in [("n1", "r1"), ("n2", "r1"), ("n3", "r2"), ("n4", "r2")] {
        nodes.push(node(n, "8", &[("rack", r)]));
        slices.push(slice(
            n,
            vec![
                device(&format!("{n}-a"), "big"),
                device(&format!("{n}-b"), "big"),
            ],
            None,
        ));
    }
    let claims: Vec<ResourceClaim> = (0..5)
        .map(|i| claim(&format!("c{i}"), exact(1, None)))
        .collect();
    let mut c = Cluster::new(nodes, slices, claims);
    let pods: Vec<Pod> = (0..4)
        .map(|i| member(&format!("m{i}"), &format!("c{i}")))
        .collect();
    let out = c.schedule(&pods, Policy::Gang { min_count: 4 }, Some("rack"));
    assert_eq!(out.verdict, Verdict::Placed, "{out:?}");
    let domain = out.domain.clone().expect("a domain");
    let rack_nodes: &[&str] = if domain == "r1" {
        &["n1", "n2"]
    } else {
        &["n3", "n4"]
    };
    for (n, _) in placed_devices(&out) {
        assert!(rack_nodes.contains(&n.as_str()), "{n} outside {domain}");
    }
    // Five members fit in no rack: the message names the key and the best domain.
    let pods: Vec<Pod> = (0..5)
        .map(|i| member(&format!("m{i}"), &format!("c{i}")))
        .collect();
    let out = c.schedule(&pods, Policy::Gang { min_count: 5 }, Some("rack"));
    let Verdict::Unschedulable(message) = &out.verdict else {
        panic!("{:?}", out.verdict)
    };
    assert!(
        message.starts_with(
            "0/2 placements are available, first placement status: rack=r1: 4/5 pods schedulable"
        ),
        "{message}"
    );
    // Each other domain says how far it got.
    assert!(
        message.contains("; other placements: rack=r2: 4/5 pods schedulable"),
        "{message}"
    );
    assert_eq!(out.placed(), 0);
}

/// W71: a domain's placement score is MostAllocated over the profile's resources and weights,
/// not cpu and memory alone: a GPU-packing profile prefers the domain whose GPUs are fuller.
#[test]
fn w71_placement_score_uses_the_configured_resources() {
    use crate::cache::NodeEntry;
    use crate::filters::NodeUsage;
    let entry = |cpu_used: i128, gpus: i128, gpus_used: i128| NodeEntry {
        node: Arc::new(Node::default()),
        allocatable: Arc::new(BTreeMap::from([
            ("cpu".to_owned(), 8_000_000_000),
            ("example.com/gpu".to_owned(), gpus),
        ])),
        usage: Arc::new(NodeUsage {
            requested: BTreeMap::from([("example.com/gpu".to_owned(), gpus_used)]),
            non_zero_cpu: cpu_used,
            ..NodeUsage::default()
        }),
        images: Arc::default(),
    };
    // Rack a: CPUs half used, GPUs a quarter; rack b: CPUs a quarter, GPUs all.
    let rack_a = [entry(4_000_000_000, 4, 1)];
    let rack_b = [entry(2_000_000_000, 4, 4)];
    let cpu = [("cpu".to_owned(), 1)];
    let gpu = [("example.com/gpu".to_owned(), 1)];
    assert!(
        super::search::most_allocated(&rack_a, &cpu) > super::search::most_allocated(&rack_b, &cpu)
    );
    assert_eq!(super::search::most_allocated(&rack_b, &gpu), 100);
    assert_eq!(super::search::most_allocated(&rack_a, &gpu), 25);
    // Weights: GPUs 3, cpu 1 → (100*3 + 25*1)/4 for rack b.
    let both = [("example.com/gpu".to_owned(), 3), ("cpu".to_owned(), 1)];
    assert_eq!(super::search::most_allocated(&rack_b, &both), 81);
}

#[test]
fn basic_groups_place_every_member_that_fits() {
    let mut c = Cluster::new(
        vec![node("n1", "8", &[])],
        vec![slice("n1", vec![device("a", "big")], None)],
        vec![claim("c1", exact(1, None)), claim("c2", exact(1, None))],
    );
    let pods = [member("m1", "c1"), member("m2", "c2")];
    let out = c.schedule(&pods, Policy::Basic, None);
    assert_eq!(out.verdict, Verdict::Placed);
    assert_eq!(out.placed(), 1);
}

#[test]
fn w41_w52_a_pod_group_claim_is_allocated_once_and_reserved_for_the_group() {
    use k8s_openapi::api::core::v1::{PodResourceClaimStatus, PodStatus};
    use k8s_openapi::api::scheduling::v1alpha2::PodGroupResourceClaim;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    // The resourceclaim controller made one claim for PodGroup g from the template, and pointed
    // every member's status at it (W43, W46).
    let mut shared = claim("g-gpu-x", exact(1, None));
    shared.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "scheduling.k8s.io/v1alpha2".into(),
        kind: "PodGroup".into(),
        name: "g".into(),
        uid: "uid-g".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    let mut c = Cluster::new(
        vec![node("n1", "8", &[]), node("n2", "8", &[])],
        vec![
            slice("n1", vec![device("a", "big")], None),
            slice("n2", vec![device("b", "big")], None),
        ],
        vec![shared],
    );
    let mut group = super::policy_tests::gang("g", 3);
    group.spec.resource_claims = Some(vec![PodGroupResourceClaim {
        name: "gpu".into(),
        resource_claim_template_name: Some("t".into()),
        resource_claim_name: None,
    }]);
    c.cache.upsert_pod_group(group);
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            let mut p = member(&format!("m{i}"), "unused");
            if let Some(spec) = p.spec.as_mut() {
                spec.resource_claims = Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_template_name: Some("t".into()),
                    ..PodResourceClaim::default()
                }]);
            }
            p.status = Some(PodStatus {
                resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                    name: "gpu".into(),
                    resource_claim_name: Some("g-gpu-x".into()),
                }]),
                ..PodStatus::default()
            });
            p
        })
        .collect();
    let out = c.schedule(&pods, Policy::Gang { min_count: 3 }, None);
    assert_eq!(out.verdict, Verdict::Placed, "{out:?}");
    let allocating: usize = out
        .members
        .iter()
        .map(|m| match m {
            MemberResult::Placed(p) => p.allocations.len(),
            MemberResult::NotPlaced { .. } => 0,
        })
        .sum();
    assert_eq!(allocating, 1, "one allocation for the whole group");
    let nodes: std::collections::BTreeSet<String> =
        placed_devices(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes.len(), 1, "every member on the claim's node");
    // The reservation names the PodGroup; any member matches it by the group's name (W50).
    let entry = crate::dra::group_consumer(&pods[0], "g-gpu-x", &c.cache).expect("a group claim");
    assert_eq!(
        (
            entry.api_group.as_deref(),
            entry.resource.as_str(),
            entry.name.as_str(),
            entry.uid.as_str()
        ),
        (Some("scheduling.k8s.io"), "podgroups", "g", "uid-g")
    );
    let mut reserved = claim("g-gpu-x", exact(1, None));
    reserved.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        reserved_for: Some(vec![entry.clone()]),
        ..Default::default()
    });
    assert!(crate::dra::is_reserved_for(
        &reserved,
        "uid-m2",
        Some(&entry)
    ));
    assert!(!crate::dra::is_reserved_for(&reserved, "uid-m2", None));
    // A pod claim that is not the group's (another name) is reserved for the pod.
    assert!(crate::dra::group_consumer(&pods[0], "other", &c.cache).is_none());
}

#[test]
fn members_of_one_shape_with_claims_allocated_on_different_nodes_go_to_their_own_nodes() {
    use k8s_openapi::api::core::v1::{PodResourceClaimStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    // Template claims written by an earlier cycle whose binding failed: every member has the
    // same spec, but its claim is on its own node (what the shape does not show).
    let allocated = |name: &str, pod_uid: &str, node: &str, device: &str| {
        let mut c = allocated_claim(name, node, device);
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod_uid.trim_start_matches("uid-").into(),
            uid: pod_uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        c
    };
    let mut c = Cluster::new(
        vec![node("n1", "8", &[]), node("n2", "8", &[])],
        vec![
            slice("n1", vec![device("a", "big")], None),
            slice("n2", vec![device("b", "big")], None),
        ],
        vec![
            allocated("m1-gpu", "uid-m1", "n1", "a"),
            allocated("m2-gpu", "uid-m2", "n2", "b"),
        ],
    );
    let pods: Vec<Pod> = ["m1", "m2"]
        .iter()
        .map(|m| {
            let mut p = member(m, "unused");
            if let Some(spec) = p.spec.as_mut() {
                spec.resource_claims = Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_template_name: Some("t".into()),
                    ..PodResourceClaim::default()
                }]);
            }
            p.status = Some(PodStatus {
                resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                    name: "gpu".into(),
                    resource_claim_name: Some(format!("{m}-gpu")),
                }]),
                ..PodStatus::default()
            });
            p
        })
        .collect();
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert_eq!(out.verdict, Verdict::Placed, "{out:?}");
    let nodes: Vec<String> = placed_devices(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes, vec!["n1".to_owned(), "n2".to_owned()]);
}

#[test]
fn w55_w56_a_group_held_by_an_old_allocation_lets_it_go() {
    use super::post_filter::{self, PostFilterAction};
    use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
    use k8s_openapi::api::scheduling::v1alpha2::PodGroupResourceClaim;
    // The PodGroup's claim was allocated on n1 in an earlier cycle, and n1 has since been
    // cordoned: no member can run where the claim is.
    let mut cordoned = node("n1", "8", &[]);
    cordoned.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    let cluster = |reserved: bool| {
        let mut held = allocated_claim("g-gpu", "n1", "a");
        if reserved && let Some(s) = held.status.as_mut() {
            s.reserved_for = Some(vec![ResourceClaimConsumerReference {
                api_group: Some("scheduling.k8s.io".into()),
                resource: "podgroups".into(),
                name: "g".into(),
                uid: "uid-g".into(),
            }]);
        }
        let mut c = Cluster::new(
            vec![cordoned.clone(), node("n2", "8", &[])],
            vec![
                slice("n1", vec![device("a", "big")], None),
                slice("n2", vec![device("b", "big")], None),
            ],
            vec![held],
        );
        let mut group = super::policy_tests::gang("g", 2);
        group.metadata.uid = Some("uid-g".into());
        group.spec.resource_claims = Some(vec![PodGroupResourceClaim {
            name: "gpu".into(),
            resource_claim_name: Some("g-gpu".into()),
            resource_claim_template_name: None,
        }]);
        c.cache.upsert_pod_group(group.clone());
        (c, group)
    };
    let pods = [member("m1", "g-gpu"), member("m2", "g-gpu")];

    // W56: reserved by nobody, it is deallocated (once, though both members name it).
    let (mut c, group) = cluster(false);
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert!(matches!(out.verdict, Verdict::Unschedulable(_)), "{out:?}");
    match post_filter::choose(&group, &out.members, 0, &c.cache) {
        PostFilterAction::Deallocate(claims) => {
            let names: Vec<_> = claims.iter().map(|c| c.metadata.name.clone()).collect();
            assert_eq!(names, vec![Some("g-gpu".to_owned())]);
        }
        other => panic!("want a deallocation, got {other:?}"),
    }

    // W55: still reserved for the PodGroup, which has no member assumed or bound: the entry
    // goes (the next cycle deallocates).
    let (mut c, group) = cluster(true);
    let out = c.schedule(&pods, Policy::Gang { min_count: 2 }, None);
    assert!(matches!(out.verdict, Verdict::Unschedulable(_)), "{out:?}");
    let action = post_filter::choose(&group, &out.members, 0, &c.cache);
    match &action {
        PostFilterAction::UnreservePodGroup { claim, group_uid } => {
            assert_eq!(claim.metadata.name.as_deref(), Some("g-gpu"));
            assert_eq!(group_uid, "uid-g");
        }
        other => panic!("want the PodGroup unreserved, got {other:?}"),
    }
    assert_eq!(action.message(), "ResourceClaim unreserved for PodGroup");
    // A member is running with it: the reservation stays.
    assert!(matches!(
        post_filter::choose(&group, &out.members, 1, &c.cache),
        PostFilterAction::Nothing
    ));
}

#[test]
fn a_snapshot_with_pod_groups_replays_group_by_group() {
    use devicelet_kube::snapshot::{ClusterState, ScenarioOptions, scenario_value, to_scenario};
    // Two nodes with one device each: room for one group of two.
    let mut pods = Vec::new();
    let mut claims = Vec::new();
    for (group, m) in [("g", "g-0"), ("g", "g-1"), ("h", "h-0"), ("h", "h-1")] {
        let mut p = member(m, &format!("{m}-gpu"));
        if let Some(spec) = p.spec.as_mut() {
            spec.scheduling_group = Some(PodSchedulingGroup {
                pod_group_name: Some(group.into()),
            });
        }
        pods.push(p);
        claims.push(claim(&format!("{m}-gpu"), exact(1, None)));
    }
    let mut class = DeviceClass {
        spec: DeviceClassSpec {
            selectors: selector(&format!("device.driver == \"{DRIVER}\"")),
            ..DeviceClassSpec::default()
        },
        ..DeviceClass::default()
    };
    class.metadata.name = Some("gpu".into());
    let state = ClusterState {
        device_classes: vec![class],
        resource_slices: vec![
            slice("n1", vec![device("a", "big")], None),
            slice("n2", vec![device("b", "big")], None),
        ],
        claims,
        nodes: vec![node("n1", "8", &[]), node("n2", "8", &[])],
        pods,
        pod_groups: vec![
            super::policy_tests::gang("g", 2),
            super::policy_tests::gang("h", 2),
        ],
        ..ClusterState::default()
    };
    let scenario = to_scenario(
        &state,
        &ScenarioOptions {
            name: "replay".into(),
            redact_config: false,
        },
    );
    assert!(
        scenario.pods.is_empty(),
        "members are the groups', not the allocator's"
    );
    // Through the file format and back.
    let text = serde_json::to_string(&scenario_value(&scenario).expect("value")).expect("json");
    let parsed = devicelet_allocator::scenario::parse_scenario(text.as_bytes()).expect("parses");
    assert_eq!(parsed.pod_groups.groups.len(), 2);
    assert_eq!(parsed.pod_groups.pods.len(), 4);
    assert_eq!(parsed.pod_groups.claims.len(), 4);
    let reports = super::replay::replay_groups(&parsed, Duration::from_secs(5));
    let verdicts: Vec<(&str, &str)> = reports
        .iter()
        .map(|r| (r.group.as_str(), r.verdict.as_str()))
        .collect();
    assert_eq!(verdicts[0], ("ns/g", "would place 2 member(s)"));
    assert_eq!(verdicts[1].0, "ns/h");
    assert!(
        verdicts[1].1.starts_with("unschedulable: "),
        "h finds g's devices taken: {verdicts:?}"
    );
}

#[test]
fn members_keep_their_per_host_anti_affinity_among_themselves() {
    use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodAntiAffinity};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let apart = |name: &str, claim: &str| {
        let mut p = member(name, claim);
        p.metadata.labels = Some(BTreeMap::from([("job".to_owned(), "train".to_owned())]));
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                    label_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "job".to_owned(),
                            "train".to_owned(),
                        )])),
                        ..LabelSelector::default()
                    }),
                    topology_key: "kubernetes.io/hostname".into(),
                    ..PodAffinityTerm::default()
                }]),
                ..PodAntiAffinity::default()
            }),
            ..Affinity::default()
        });
        p
    };
    let host = |n: &str| node(n, "8", &[("kubernetes.io/hostname", n)]);
    let two_gpus = |n: &str| slice(n, vec![device("a", "big"), device("b", "big")], None);
    let claims = || {
        vec![
            claim("c1", exact(1, None)),
            claim("c2", exact(1, None)),
            claim("c3", exact(1, None)),
        ]
    };
    let pods = [apart("m1", "c1"), apart("m2", "c2"), apart("m3", "c3")];
    // Devices for two members a node, but each member keeps a node of its own.
    let mut c = Cluster::new(
        vec![host("n1"), host("n2"), host("n3")],
        vec![two_gpus("n1"), two_gpus("n2"), two_gpus("n3")],
        claims(),
    );
    let out = c.schedule(&pods, Policy::Gang { min_count: 3 }, None);
    assert_eq!(out.verdict, Verdict::Placed, "{out:?}");
    let nodes: std::collections::BTreeSet<String> =
        placed_devices(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    // Two nodes for three members that keep apart: nobody is placed.
    let mut c = Cluster::new(
        vec![host("n1"), host("n2")],
        vec![two_gpus("n1"), two_gpus("n2")],
        claims(),
    );
    let out = c.schedule(&pods, Policy::Gang { min_count: 3 }, None);
    assert_eq!(out.placed(), 0);
    let Verdict::Unschedulable(message) = &out.verdict else {
        panic!("{:?}", out.verdict)
    };
    assert!(
        message.contains("didn't match pod anti-affinity rules"),
        "{message}"
    );
}
