//! DefaultPreemption's dry run on the real filters and allocator: victims chosen by priority,
//! start time and PodDisruptionBudgets, the candidate criteria, devices freed by victims'
//! claims (W107), and what is never a victim.

use std::collections::BTreeMap;
use std::time::Duration;

use devicelet_allocator::AllocateOptions;
use k8s_openapi::api::core::v1::{
    Container, Pod, PodResourceClaim, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

use super::*;
use crate::cache::ClusterCache;
use crate::cycle::{Decision, with_engine};
use crate::testing::*;

/// A pod asking for `cpu`, with `priority`, started `started` seconds after the epoch when
/// bound to `node`, using claim `claim` when given.
fn pod(name: &str, priority: i32, cpu: &str, node: Option<&str>, claim: Option<&str>) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            priority: Some(priority),
            node_name: node.map(str::to_owned),
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity(cpu.into()))])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            resource_claims: claim.map(|c| {
                vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_name: Some(c.into()),
                    ..PodResourceClaim::default()
                }]
            }),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
            ..PodStatus::default()
        }),
        ..Pod::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

fn started(mut p: Pod, seconds: i64) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).start_time = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap(),
    ));
    p
}

fn labelled(mut p: Pod, app: &str) -> Pod {
    p.metadata.labels = Some(BTreeMap::from([("app".to_owned(), app.to_owned())]));
    p
}

/// `claim` allocated on `node`'s `device` and reserved by `pods`.
fn held(claim: &str, node: &str, device: &str, pods: &[&str]) -> ResourceClaim {
    let mut c = allocated_claim(claim, node, device);
    c.status.as_mut().unwrap().reserved_for = Some(
        pods.iter()
            .map(|p| ResourceClaimConsumerReference {
                resource: "pods".into(),
                name: (*p).into(),
                uid: format!("uid-{p}"),
                api_group: None,
            })
            .collect(),
    );
    c
}

/// Schedules `preemptor` (which must fit nowhere), then runs preemption for it.
fn preempt_for(cache: &mut ClusterCache, preemptor: &Pod) -> (FitError, Verdict) {
    let options = AllocateOptions::unbounded();
    let profile = crate::config::Profile::named("devicelet-scheduler");
    with_engine(cache, options, &profile, |engine, cache| {
        let timeout = Duration::from_secs(600);
        let fit = match engine.schedule(preemptor, CycleInputs::read(preemptor, cache, timeout)) {
            Decision::Unschedulable { fit, .. } => fit,
            d => panic!("the preemptor fits: {d:?}"),
        };
        let cycle = CycleInputs::read(preemptor, cache, timeout);
        let inputs = PreemptionInputs::read(cache, preemptor, true);
        let verdict = preempt(
            engine,
            preemptor,
            &cycle,
            &fit,
            &inputs,
            crate::config::PreemptionArgs::default(),
        );
        (fit, verdict)
    })
}

fn victims(verdict: &Verdict) -> (String, Vec<String>) {
    match verdict {
        Verdict::Nominate(c) => (
            c.node.clone(),
            c.victims
                .iter()
                .map(|v| v.metadata.name.clone().unwrap_or_default())
                .collect(),
        ),
        Verdict::Fail { message, .. } => panic!("no candidate: {message}"),
    }
}

#[test]
fn w82_w83_the_least_important_pod_goes_and_higher_priorities_stay() {
    let mut cache = cache_with(
        vec![node("n1", "4", &[]), node("n2", "4", &[])],
        Vec::new(),
        Vec::new(),
    );
    // n1: two low-priority pods; the one started last is the less important.
    cache.upsert_pod(&started(pod("old", 10, "2", Some("n1"), None), 100));
    cache.upsert_pod(&started(pod("new", 10, "2", Some("n1"), None), 200));
    // n2: a pod above the preemptor.
    cache.upsert_pod(&pod("vip", 100, "4", Some("n2"), None));
    let (fit, verdict) = preempt_for(&mut cache, &pod("p", 50, "2", None, None));
    assert_eq!(
        fit.message(),
        "0/2 nodes are available: 2 Insufficient cpu. no new claims to deallocate"
    );
    assert_eq!(victims(&verdict), ("n1".to_owned(), vec!["new".to_owned()]));
}

#[test]
fn w82_no_lower_priority_pod_no_candidate_and_the_message_counts_why() {
    let mut cache = cache_with(
        vec![node("n1", "4", &[]), node("n2", "4", &[])],
        Vec::new(),
        Vec::new(),
    );
    cache.upsert_pod(&pod("a", 100, "4", Some("n1"), None));
    cache.upsert_pod(&pod("b", 100, "4", Some("n2"), None));
    let p = pod("p", 100, "2", None, None);
    let (fit, verdict) = preempt_for(&mut cache, &p);
    // The shortcut taken when the cache holds no pod of lower priority says the same.
    assert_eq!(cache.lowest_priority(), Some(100));
    assert_eq!(
        format!("{:?}", without_victims(&p, &fit)),
        format!("{verdict:?}")
    );
    match verdict {
        Verdict::Fail {
            message,
            clear_nomination,
        } => {
            assert_eq!(
                message,
                "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
            );
            assert!(!clear_nomination);
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn w79_preemption_policy_never_is_not_eligible() {
    let mut cache = cache_with(vec![node("n1", "4", &[])], Vec::new(), Vec::new());
    cache.upsert_pod(&pod("low", 0, "4", Some("n1"), None));
    let mut p = pod("p", 50, "2", None, None);
    p.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    let (_, verdict) = preempt_for(&mut cache, &p);
    assert!(
        matches!(&verdict, Verdict::Fail { message, .. } if message == "preemption: not eligible due to preemptionPolicy=Never."),
        "{verdict:?}"
    );
}

#[test]
fn w79_a_victim_still_terminating_on_the_nominated_node_stops_a_second_preemption() {
    let mut cache = cache_with(vec![node("n1", "4", &[])], Vec::new(), Vec::new());
    let mut victim = pod("low", 0, "4", Some("n1"), None);
    victim.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    victim
        .status
        .as_mut()
        .unwrap()
        .conditions
        .get_or_insert_with(Vec::new)
        .push(k8s_openapi::api::core::v1::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some(actuate::PREEMPTION_BY_SCHEDULER.into()),
            ..Default::default()
        });
    cache.upsert_pod(&victim);
    let p = pod("p", 50, "2", None, None);
    cache.nominate(&p, "n1");
    let (_, verdict) = preempt_for(&mut cache, &p);
    assert!(
        matches!(&verdict, Verdict::Fail { message, .. } if message == "preemption: not eligible due to a terminating pod on the nominated node."),
        "{verdict:?}"
    );
}

#[test]
fn w83_pods_a_budget_protects_are_reprieved_first() {
    let mut cache = cache_with(vec![node("n1", "4", &[])], Vec::new(), Vec::new());
    // Without the budget the later-started "db" pod would go.
    cache.upsert_pod(&labelled(
        started(pod("web", 10, "2", Some("n1"), None), 100),
        "web",
    ));
    cache.upsert_pod(&labelled(
        started(pod("db", 10, "2", Some("n1"), None), 200),
        "db",
    ));
    let mut budget = PodDisruptionBudget {
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_owned(), "db".to_owned())])),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            disruptions_allowed: Some(0),
            ..PodDisruptionBudgetStatus::default()
        }),
        ..PodDisruptionBudget::default()
    };
    budget.metadata.namespace = Some("ns".into());
    budget.metadata.name = Some("db".into());
    let p = pod("p", 50, "2", None, None);
    let (_, before) = preempt_for(&mut cache, &p);
    assert_eq!(victims(&before).1, ["db"]);
    cache.upsert_pdb(budget);
    let (_, after) = preempt_for(&mut cache, &p);
    assert_eq!(victims(&after).1, ["web"]);
    let Verdict::Nominate(c) = after else {
        unreachable!()
    };
    assert_eq!(c.pdb_violations, 0);
}

#[test]
fn w86_fewest_victims_then_lowest_priority_then_the_smallest_name() {
    let mut cache = cache_with(
        vec![
            node("a", "4", &[]),
            node("b", "4", &[]),
            node("c", "4", &[]),
            node("d", "4", &[]),
        ],
        Vec::new(),
        Vec::new(),
    );
    // a: two victims needed; b: one victim of priority 20; c and d: one victim of priority 10.
    cache.upsert_pod(&pod("a1", 10, "2", Some("a"), None));
    cache.upsert_pod(&pod("a2", 10, "2", Some("a"), None));
    cache.upsert_pod(&pod("b1", 20, "4", Some("b"), None));
    cache.upsert_pod(&pod("c1", 10, "4", Some("c"), None));
    cache.upsert_pod(&pod("d1", 10, "4", Some("d"), None));
    let (_, verdict) = preempt_for(&mut cache, &pod("p", 50, "4", None, None));
    assert_eq!(victims(&verdict), ("c".to_owned(), vec!["c1".to_owned()]));
}

#[test]
fn w107_a_gpu_held_by_a_lower_priority_pod_is_freed_by_evicting_it() {
    let mut cache = cache_with(
        vec![node("n1", "8", &[]), node("n2", "8", &[])],
        vec![
            slice("n1", vec![device("gpu-0", "big")], None),
            slice("n2", vec![device("gpu-0", "big")], None),
        ],
        vec![
            held("low-claim", "n1", "gpu-0", &["low"]),
            // n2's GPU is shared with a pod of higher priority: evicting "mid" frees nothing.
            held("shared-claim", "n2", "gpu-0", &["mid", "vip"]),
            claim("want", exact(1, None)),
        ],
    );
    cache.upsert_pod(&pod("low", 10, "1", Some("n1"), Some("low-claim")));
    cache.upsert_pod(&pod("mid", 10, "1", Some("n2"), Some("shared-claim")));
    cache.upsert_pod(&pod("vip", 100, "1", Some("n2"), Some("shared-claim")));
    let p = pod("p", 50, "1", None, Some("want"));
    let (fit, verdict) = preempt_for(&mut cache, &p);
    assert!(
        fit.message().contains("cannot allocate all claims"),
        "{}",
        fit.message()
    );
    assert_eq!(victims(&verdict), ("n1".to_owned(), vec!["low".to_owned()]));
    // W92 for devices: once the victim and its claim are gone, the GPU is held for the
    // preemptor; a pod of lower priority does not get it, the preemptor does.
    let Verdict::Nominate(c) = verdict else {
        unreachable!()
    };
    assert_eq!(c.devices.len(), 1);
    cache.nominate_holding(&p, &c.node, c.devices);
    cache.remove_pod("uid-low");
    cache.remove_claim("ns", "low-claim");
    cache.upsert_claim(claim("other-claim", exact(1, None)));
    let other = pod("other", 20, "1", None, Some("other-claim"));
    let options = || AllocateOptions::unbounded();
    let profile = crate::config::Profile::named("devicelet-scheduler");
    let timeout = Duration::from_secs(600);
    let decided = with_engine(&mut cache, options(), &profile, |engine, cache| {
        engine.schedule(&other, CycleInputs::read(&other, cache, timeout))
    });
    assert!(
        matches!(decided, Decision::Unschedulable { .. }),
        "a lower-priority pod took the held GPU: {decided:?}"
    );
    let decided = with_engine(&mut cache, options(), &profile, |engine, cache| {
        engine.schedule(&p, CycleInputs::read(&p, cache, timeout))
    });
    assert!(
        matches!(&decided, Decision::Place(pl) if pl.node == "n1"),
        "{decided:?}"
    );
}

#[test]
fn w107_devices_never_freed_fail_with_the_dra_reason() {
    let mut cache = cache_with(
        vec![node("n1", "8", &[])],
        vec![slice("n1", vec![device("gpu-0", "big")], None)],
        vec![
            held("shared-claim", "n1", "gpu-0", &["mid", "vip"]),
            claim("want", exact(1, None)),
        ],
    );
    cache.upsert_pod(&pod("mid", 10, "1", Some("n1"), Some("shared-claim")));
    cache.upsert_pod(&pod("vip", 100, "1", Some("n1"), Some("shared-claim")));
    let (_, verdict) = preempt_for(&mut cache, &pod("p", 50, "1", None, Some("want")));
    assert!(
        matches!(&verdict, Verdict::Fail { message, .. }
            if message == "preemption: 0/1 nodes are available: 1 cannot allocate all claims."),
        "{verdict:?}"
    );
}

#[test]
fn d_l3_a_pod_group_evicted_as_a_unit_goes_whole_or_not_at_all() {
    use k8s_openapi::api::core::v1::PodSchedulingGroup;
    use k8s_openapi::api::scheduling::v1alpha2::{PodGroup, PodGroupSpec};
    let mut cache = cache_with(
        vec![node("n1", "4", &[]), node("n2", "4", &[])],
        Vec::new(),
        Vec::new(),
    );
    let mut group = PodGroup {
        spec: PodGroupSpec {
            disruption_mode: Some("PodGroup".into()),
            ..PodGroupSpec::default()
        },
        ..PodGroup::default()
    };
    group.metadata.namespace = Some("ns".into());
    group.metadata.name = Some("g".into());
    cache.upsert_pod_group(group);
    for (name, node) in [("m1", "n1"), ("m2", "n2")] {
        let mut m = pod(name, 10, "4", Some(node), None);
        m.spec.as_mut().unwrap().scheduling_group = Some(PodSchedulingGroup {
            pod_group_name: Some("g".into()),
        });
        cache.upsert_pod(&m);
    }
    let (_, verdict) = preempt_for(&mut cache, &pod("p", 50, "4", None, None));
    let (node, mut names) = victims(&verdict);
    names.sort();
    assert_eq!(names, ["m1", "m2"], "the whole group, on {node}");
}

#[test]
fn w92_a_nominated_pod_of_higher_priority_holds_its_node_for_lower_ones() {
    let mut cache = cache_with(vec![node("n1", "4", &[])], Vec::new(), Vec::new());
    let high = pod("high", 100, "3", None, None);
    cache.nominate(&high, "n1");
    let low = pod("low", 10, "2", None, None);
    assert_eq!(cache.node_entries_for(&low)[0].usage.pods, 1);
    let higher = pod("higher", 200, "2", None, None);
    assert_eq!(cache.node_entries_for(&higher)[0].usage.pods, 0);
    // An update that does not carry the nomination yet keeps it; one read back from
    // status.nominatedNodeName makes one.
    cache.upsert_pod(&high);
    assert_eq!(
        cache.nomination("uid-high").map(|n| n.node.as_str()),
        Some("n1")
    );
    let mut other = pod("other", 100, "1", None, None);
    other.status.as_mut().unwrap().nominated_node_name = Some("n1".into());
    cache.upsert_pod(&other);
    assert_eq!(cache.node_entries_for(&low)[0].usage.pods, 2);
    // Bound: the nomination is gone.
    cache.upsert_pod(&pod("high", 100, "3", Some("n1"), None));
    assert!(cache.nomination("uid-high").is_none());
}

/// Workload-aware preemption (W94-W98) for the group `members`, which must not fit as the
/// cluster is.
fn preempt_group_for(
    cache: &mut ClusterCache,
    members: &[Pod],
    priority: i32,
    topology: Option<&str>,
) -> group::GroupVerdict {
    use crate::gang::search::{GroupProblem, MemberInput, Topology, Verdict as Search};
    let options = AllocateOptions::unbounded();
    let profile = crate::config::Profile::named("devicelet-scheduler");
    let group: k8s_openapi::api::scheduling::v1alpha2::PodGroup =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "g", "namespace": "ns", "uid": "uid-g"},
            "spec": {"priority": priority, "schedulingPolicy": {"gang": {"minCount": members.len()}}},
        }))
        .unwrap();
    with_engine(cache, options, &profile, |engine, cache| {
        let timeout = Duration::from_secs(600);
        let inputs: Vec<MemberInput> = members
            .iter()
            .map(|p| MemberInput {
                pod: std::sync::Arc::new(p.clone()),
                inputs: CycleInputs::read(p, cache, timeout),
            })
            .collect();
        let problem = GroupProblem {
            policy: crate::gang::Policy::Gang {
                min_count: members.len(),
            },
            scheduled: 0,
            topology: topology.map(|k| Topology {
                key: k.to_owned(),
                scheduled_nodes: Vec::new(),
            }),
            deadline: std::time::Instant::now() + Duration::from_secs(5),
        };
        let searched = crate::gang::search::schedule_group(engine, &inputs, &problem);
        assert_ne!(searched.verdict, Search::Placed, "the group fits as it is");
        let preemption = PreemptionInputs::read(cache, &members[0], true);
        group::preempt_group(
            engine,
            &("ns".to_owned(), "g".to_owned()),
            &group,
            &inputs,
            &problem,
            &preemption,
        )
    })
}

fn member(name: &str, cpu: &str) -> Pod {
    let mut p = pod(name, 0, cpu, None, None);
    p.spec.as_mut().unwrap().scheduling_group =
        Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
            pod_group_name: Some("g".into()),
        });
    p
}

/// W97, W98: the whole cluster is the domain; every unit below the group's priority is
/// removed, then the most important are reprieved while the group still fits: here only the
/// pod started last goes, and both members are nominated where it was.
#[test]
fn w97_w98_a_group_evicts_the_fewest_least_important_units_in_the_cluster() {
    let mut cache = cache_with(
        vec![node("n1", "4", &[]), node("n2", "4", &[])],
        Vec::new(),
        Vec::new(),
    );
    cache.upsert_pod(&started(pod("a", 0, "2", Some("n1"), None), 100));
    cache.upsert_pod(&started(pod("b", 0, "2", Some("n1"), None), 200));
    cache.upsert_pod(&started(pod("c", 0, "2", Some("n2"), None), 300));
    // Members' own priority is 0: the group's (50) is what counts (W94).
    let members = [member("m0", "2"), member("m1", "2")];
    match preempt_group_for(&mut cache, &members, 50, None) {
        group::GroupVerdict::Preempt {
            victims,
            placements,
            pdb_violations,
        } => {
            let names: Vec<String> = victims
                .iter()
                .map(|v| v.metadata.name.clone().unwrap_or_default())
                .collect();
            assert_eq!(names, ["c"]);
            assert_eq!(pdb_violations, 0);
            let nodes: Vec<&str> = placements.iter().map(|(_, n, _)| n.as_str()).collect();
            assert_eq!(nodes, ["n2", "n2"]);
        }
        v => panic!("{v:?}"),
    }
    // With the group's priority at the victims' own, nothing is below it (W97).
    let verdict = preempt_group_for(&mut cache, &members, 0, None);
    assert!(
        matches!(&verdict, group::GroupVerdict::Fail(m) if m == "preemption: No preemption victims found for incoming preemptor"),
        "{verdict:?}"
    );
}

/// W95, W96: topology constraints and `preemptionPolicy: Never` keep upstream's answers.
#[test]
fn w95_w96_constrained_or_never_groups_do_not_preempt() {
    let mut cache = cache_with(
        vec![node("n1", "4", &[("rack", "r1")])],
        Vec::new(),
        Vec::new(),
    );
    cache.upsert_pod(&pod("low", 0, "4", Some("n1"), None));
    let members = [member("m0", "2"), member("m1", "2")];
    let verdict = preempt_group_for(&mut cache, &members, 50, Some("rack"));
    assert!(
        matches!(&verdict, group::GroupVerdict::Fail(m) if m == group::CONSTRAINED),
        "{verdict:?}"
    );
    let mut never = members.clone();
    never[1].spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    let verdict = preempt_group_for(&mut cache, &never, 50, None);
    assert!(
        matches!(&verdict, group::GroupVerdict::Fail(m) if m == "preemption: not eligible due to preemptionPolicy=Never."),
        "{verdict:?}"
    );
    // Allowed, the one pod in the way goes.
    assert!(matches!(
        preempt_group_for(&mut cache, &members, 50, None),
        group::GroupVerdict::Preempt { .. }
    ));
}
