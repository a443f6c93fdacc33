//! The pod-group cycle as the scheduling loop runs it (`schedule_one_podgroup.go` →
//! `scheduleOnePodGroup`, `submitPodGroupAlgorithmResult`): pull the group's queued members
//! (W11), read their inputs under one cache lock (W16), search ([`super::search`]), then either
//! reserve every placed member for real and start their binding cycles, meeting at the
//! [`GroupBarrier`] (W22), or fail every member together and park them until an event can help
//! (W23, A-L3 fixed: no retry loop on an idle scheduler). The `PodGroupScheduled` condition is
//! written after every cycle (W34).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use k8s_openapi::jiff::Timestamp;
use tokio::runtime::Handle;
use tracing::{debug, info, warn};

use crate::binder::Binder;
use crate::cache::ClusterCache;
use crate::cycle::{CycleInputs, Engine};
use crate::framework::Plugin;
use crate::gang::barrier::GroupBarrier;
use crate::gang::post_filter::{self, PostFilterAction};
use crate::gang::search::{
    GroupOutcome, GroupProblem, MemberInput, MemberResult, Topology, Verdict, schedule_group,
};
use crate::gang::status::{self, GroupCondition};
use crate::gang::{GroupKey, Policy, topology_key, unsupported_fields};
use crate::metrics::AttemptResult;
use crate::preemption::PreemptionInputs;
use crate::preemption::actuate;
use crate::preemption::group::{GroupVerdict, group_priority, preempt_group};
use crate::queue::QueuedPod;
use crate::report::FailureReason;
use crate::shared::Shared;

/// The search's own time limit; the DRA filter timeout, when shorter, bounds it.
pub const GROUP_SEARCH_LIMIT: Duration = Duration::from_secs(3);

/// Runs one pod-group cycle for `popped` (a member of `key`) and its queued siblings. The
/// caller holds `cache`, which is released before the search.
#[allow(clippy::too_many_arguments)]
pub fn run_group_cycle(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    engine: &mut Engine<'_>,
    cache: std::sync::MutexGuard<'_, ClusterCache>,
    popped: QueuedPod,
    key: GroupKey,
    search_limit: Duration,
    consumable_capacity: bool,
) {
    let started = Instant::now();
    let group_name = format!("{}/{}", key.0, key.1);
    let Some(group) = cache.pod_group(&key.0, &key.1) else {
        // Deleted since PreEnqueue let the pod through: it waits for the group again.
        drop(cache);
        let message = format!(
            "waiting for pods's pod group {:?} to appear in scheduling queue",
            key.1
        );
        fail_members(
            shared,
            binder,
            handle,
            vec![popped],
            BTreeSet::from([Plugin::GangScheduling]),
            BTreeSet::new(),
            &message,
        );
        return;
    };
    let mut members = vec![popped];
    members.extend(shared.queue().take_group(&key.0, &key.1));
    // W15: members being deleted or already assumed leave the cycle.
    members.retain(|qp| {
        let deleting = qp.pod.metadata.deletion_timestamp.is_some();
        let drop_it = deleting || cache.is_assigned(&qp.uid);
        if drop_it {
            shared.queue().delete(&qp.uid);
        }
        if deleting {
            skip_deleting(binder, handle, &qp.pod);
        }
        !drop_it
    });
    if members.is_empty() {
        return;
    }
    // W12: priority (descending), then the first attempt (ascending).
    members.sort_by(|a, b| {
        b.priority()
            .cmp(&a.priority())
            .then_with(|| a.initial.cmp(&b.initial))
    });
    let refused = unsupported_fields(&group);
    if !refused.is_empty() {
        drop(cache);
        let message = format!(
            "pod group {group_name}: {}",
            crate::filters::unsupported::message(&shared.name, &refused)
        );
        write_condition(
            binder,
            handle,
            &group,
            GroupCondition::Unschedulable(message.clone()),
        );
        fail_members(
            shared,
            binder,
            handle,
            members,
            BTreeSet::from([Plugin::Unsupported]),
            BTreeSet::new(),
            &message,
        );
        return;
    }
    // W14: a group's members must share one scheduler (one profile); otherwise every member
    // fails with upstream's error and backs off. Members for another scheduler count towards
    // the group (W7), so without this the group would wait forever without a word.
    let schedulers = cache.group_scheduler_names(&key);
    if let [first, second, ..] = schedulers.as_slice() {
        drop(cache);
        let message = format!(
            "all pods in a single pod group should have the same .spec.schedulerName set, got: {first:?} and {second:?}"
        );
        shared.metrics_of(&members[0].pod).podgroup_attempt(
            AttemptResult::Error,
            started.elapsed(),
            Duration::ZERO,
        );
        error_members(binder, handle, shared, &group, members, &message);
        return;
    }
    let policy = Policy::of(&group);
    let scheduled = cache.group_scheduled_count(&key);
    if let Policy::Gang { min_count } = policy
        && (cache.group_pod_count(&key) < min_count || members.len() + scheduled < min_count)
    {
        // Members left since PreEnqueue let these through, or some are still gated (their
        // claims are being created): no cycle can reach the quorum yet. As gated pods (W8)
        // they wait quietly, without a condition or an event; a new member, or the next one
        // let through, pulls them back in.
        drop(cache);
        debug!(podgroup = %group_name, ready = members.len(), scheduled, min_count, "pod group waits for gated members");
        let now = Instant::now();
        let mut queue = shared.queue();
        for qp in members {
            queue.unschedulable(
                qp,
                BTreeSet::from([Plugin::GangScheduling]),
                BTreeSet::new(),
                now,
            );
        }
        return;
    }
    let inputs: Vec<MemberInput> = members
        .iter()
        .map(|qp| MemberInput {
            pod: qp.pod.clone(),
            inputs: CycleInputs::read(&qp.pod, &cache, shared.binding_timeout),
        })
        .collect();
    let topology = topology_key(&group).map(|k| Topology {
        key: k.to_owned(),
        scheduled_nodes: cache.group_nodes(&key),
    });
    drop(cache);
    let problem = GroupProblem {
        policy,
        scheduled,
        topology,
        deadline: Instant::now() + search_limit,
    };
    let searched = Instant::now();
    let outcome = schedule_group(engine, &inputs, &problem);
    let algorithm = searched.elapsed();
    shared.metrics.algorithm(algorithm);
    debug!(podgroup = %group_name, members = members.len(), states = outcome.states, placed = outcome.placed(), ?algorithm, "pod group cycle");
    let metrics = shared.metrics_of(&members[0].pod);
    match &outcome.verdict {
        Verdict::Placed => {
            metrics.podgroup_attempt(AttemptResult::Scheduled, started.elapsed(), algorithm);
            write_condition(binder, handle, &group, GroupCondition::Scheduled);
            commit(
                shared,
                binder,
                handle,
                members,
                outcome,
                &problem,
                &group_name,
                started,
            );
        }
        Verdict::Unschedulable(reason) => {
            // W95: workload-aware preemption, a dry run; victims are evicted only when it
            // finds some, never while simulating (A-L2).
            let preemption = group_preemption(
                shared,
                engine,
                &key,
                &group,
                &inputs,
                &problem,
                consumable_capacity,
            );
            let preemption_note = match preemption {
                Some(GroupVerdict::Preempt {
                    victims,
                    placements,
                    ..
                }) => {
                    metrics.podgroup_attempt(
                        AttemptResult::WaitingOnPreemption,
                        started.elapsed(),
                        algorithm,
                    );
                    wait_for_preemption(
                        shared,
                        binder,
                        handle,
                        &group,
                        members,
                        &outcome,
                        victims,
                        placements,
                        &group_name,
                    );
                    return;
                }
                Some(GroupVerdict::StillWaiting(note)) => Some(note),
                Some(GroupVerdict::Fail(note)) => {
                    // W23: not waiting on preemption, so nominations from an earlier one end
                    // and their holds go (they would keep room from pods of lower priority for
                    // a group that no longer fits).
                    clear_nominations(shared, binder, handle, &members);
                    Some(note)
                }
                None => None,
            };
            let reason = match preemption_note {
                Some(note) => format!("{reason}; {note}"),
                None => reason.clone(),
            };
            metrics.podgroup_attempt(AttemptResult::Unschedulable, started.elapsed(), algorithm);
            info!(podgroup = %group_name, members = members.len(), %reason, "pod group unschedulable");
            write_condition(
                binder,
                handle,
                &group,
                GroupCondition::Unschedulable(reason.clone()),
            );
            let action = {
                let cache = shared.cache();
                post_filter::choose(
                    &group,
                    &outcome.members,
                    cache.group_scheduled_count(&key),
                    &cache,
                )
            };
            // The members' own messages say what their PostFilter did (W56); W55 is the group's.
            let mut message = format!("pod group {group_name} is unschedulable: {reason}");
            if let PostFilterAction::UnreservePodGroup { .. } = action {
                message = format!("{message}. {}", action.message());
            }
            run_post_filter(binder, handle, action, &group_name);
            fail_members(
                shared,
                binder,
                handle,
                members,
                outcome.plugins(),
                outcome.claim_names(),
                &message,
            );
        }
        Verdict::Error(e) => {
            metrics.podgroup_attempt(AttemptResult::Error, started.elapsed(), algorithm);
            error_members(binder, handle, shared, &group, members, e);
        }
    }
}

/// W95: DefaultPreemption for the group when the profile has it; without, upstream's note.
fn group_preemption(
    shared: &Arc<Shared>,
    engine: &mut Engine<'_>,
    key: &GroupKey,
    group: &Arc<PodGroup>,
    members: &[MemberInput],
    problem: &GroupProblem,
    consumable_capacity: bool,
) -> Option<GroupVerdict> {
    let first = members.first()?;
    if engine.profile_of(&first.pod).preemption.is_none() {
        return Some(GroupVerdict::Fail(
            "default preemption plugin is not registered, workload aware preemption is disabled"
                .to_owned(),
        ));
    }
    shared.metrics_of(&first.pod).preemption_attempt();
    let inputs = PreemptionInputs::read(&shared.cache(), &first.pod, consumable_capacity);
    Some(preempt_group(engine, key, group, members, problem, &inputs))
}

/// W24: the group waits for its victims: each member placed by the dry run is nominated to its
/// node (its devices held there from pods of lower priority than the group, W92), the victims
/// are evicted in a task of their own, and every member waits unschedulable with `pod group is
/// waiting for preemption to complete` until their deletion wakes it.
#[allow(clippy::too_many_arguments)]
fn wait_for_preemption(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    group: &Arc<PodGroup>,
    members: Vec<QueuedPod>,
    outcome: &GroupOutcome,
    victims: Vec<Arc<k8s_openapi::api::core::v1::Pod>>,
    placements: Vec<(
        usize,
        String,
        Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult>,
    )>,
    group_name: &str,
) {
    let message = format!(
        "pod group {group_name} is unschedulable: pod group is waiting for preemption to complete ({} victim(s))",
        victims.len()
    );
    info!(podgroup = %group_name, victims = victims.len(), "pod group preempts");
    shared
        .metrics_of(&members[0].pod)
        .preemption_victims(victims.len());
    write_condition(
        binder,
        handle,
        group,
        GroupCondition::Unschedulable(message.clone()),
    );
    let priority = group_priority(group, members.iter().map(|qp| &*qp.pod));
    let mut nominations = Vec::new();
    {
        let mut cache = shared.cache();
        for (i, node, devices) in placements {
            if let Some(qp) = members.get(i) {
                cache.nominate_with_priority(&qp.pod, &node, devices, priority);
                nominations.push(((*qp.pod).clone(), node));
            }
        }
    }
    let client = binder.client().clone();
    let reporter = binder.reporter().clone();
    let group_object = (**group).clone();
    let name = group_name.to_owned();
    binder.spawn(handle, async move {
        match actuate::actuate_group(client, reporter, group_object, nominations, victims).await {
            Ok(n) => debug!(podgroup = %name, victims = n, "pod group preemption"),
            Err(e) => warn!(podgroup = %name, error = %e, "pod group preemption failed"),
        }
    });
    fail_members(
        shared,
        binder,
        handle,
        members,
        outcome.plugins(),
        outcome.claim_names(),
        &message,
    );
}

/// Clears the members' nominations: in the cache at once, in their status when it has one.
fn clear_nominations(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    members: &[QueuedPod],
) {
    let mut cache = shared.cache();
    for qp in members {
        let nominated_in_status = qp
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if cache.nomination(&qp.uid).is_none() && !nominated_in_status {
            continue;
        }
        cache.clear_nomination(&qp.uid);
        if nominated_in_status {
            let client = binder.client().clone();
            let pod = qp.pod.clone();
            binder.spawn(handle, async move {
                if let Err(e) = actuate::set_nomination(&client, &pod, None).await {
                    debug!(error = %e, "nomination not cleared");
                }
            });
        }
    }
}

/// W15 (and S11 for a pod alone): a pod being deleted is not scheduled, and says so.
pub fn skip_deleting(binder: &Binder, handle: &Handle, pod: &Arc<k8s_openapi::api::core::v1::Pod>) {
    let pod = pod.clone();
    binder.spawn_with(handle, move |binder| async move {
        let note = format!(
            "skip schedule deleting pod: {}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        binder
            .reporter()
            .event(&pod, "Warning", "FailedScheduling", "Scheduling", &note)
            .await;
    });
}

/// The group's condition and every member say `message` as a scheduler error; the members
/// back off.
fn error_members(
    binder: &Binder,
    handle: &Handle,
    shared: &Arc<Shared>,
    group: &Arc<PodGroup>,
    members: Vec<QueuedPod>,
    message: &str,
) {
    write_condition(
        binder,
        handle,
        group,
        GroupCondition::SchedulerError(message.to_owned()),
    );
    let now = Instant::now();
    for qp in members {
        let pod = qp.pod.clone();
        shared.queue().error(qp, now);
        let message = message.to_owned();
        binder.spawn_with(handle, move |binder| async move {
            binder
                .reporter()
                .failed(&pod, FailureReason::SchedulerError, &message)
                .await;
        });
    }
}

/// W22: the placed members are reserved in the cache (devices in flight, the pod assumed) and
/// handed to binding; the members not placed fail on their own.
#[allow(clippy::too_many_arguments)]
fn commit(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    members: Vec<QueuedPod>,
    outcome: GroupOutcome,
    problem: &GroupProblem,
    group_name: &str,
    started: Instant,
) {
    let placed = outcome.placed();
    let needed = match problem.policy {
        Policy::Basic => 0,
        Policy::Gang { min_count } => min_count.saturating_sub(problem.scheduled),
    };
    let barrier = (needed > 0 && placed > 1).then(|| {
        (
            Arc::new(GroupBarrier::new(placed, placed.saturating_sub(needed))),
            group_name.to_owned(),
        )
    });
    if let Some(domain) = &outcome.domain {
        info!(podgroup = %group_name, placed, %domain, "pod group placed in topology domain");
    }
    let mut to_bind = Vec::new();
    let mut failed = Vec::new();
    {
        let mut cache = shared.cache();
        let mut queue = shared.queue();
        for (qp, result) in members.into_iter().zip(outcome.members) {
            match result {
                MemberResult::Placed(placement) => {
                    super::assume_member(&mut cache, &qp.pod, &placement);
                    queue.done(&qp.uid);
                    to_bind.push((qp, placement));
                }
                MemberResult::NotPlaced {
                    fit, claim_names, ..
                } => {
                    failed.push((qp, fit, claim_names));
                }
            }
        }
    }
    for (qp, placement) in to_bind {
        binder.spawn(
            handle,
            binder
                .clone()
                .bind_member(qp, placement, started, barrier.clone()),
        );
    }
    for (qp, fit, claim_names) in failed {
        let (plugins, message) = match fit {
            Some(f) => (f.plugins(), f.message()),
            None => (
                BTreeSet::from([Plugin::GangScheduling]),
                format!("pod group {group_name}: not placed with the rest of its group"),
            ),
        };
        fail_members(
            shared,
            binder,
            handle,
            vec![qp],
            plugins,
            claim_names,
            &message,
        );
    }
}

/// Writes what the PostFilter chose (W55, W56). The claim's update is the event that brings
/// the members back; a failed write is tried again at the next failure.
fn run_post_filter(binder: &Binder, handle: &Handle, action: PostFilterAction, group_name: &str) {
    let group_name = group_name.to_owned();
    binder.spawn_with(handle, move |binder| async move {
        let result = match &action {
            PostFilterAction::Nothing => return,
            PostFilterAction::Deallocate(claims) => {
                let mut r = Ok(());
                for claim in claims {
                    r = r.and(binder.deallocate(claim).await);
                }
                r
            }
            PostFilterAction::UnreservePodGroup { claim, group_uid } => {
                binder.unreserve_pod_group(claim, group_uid).await
            }
        };
        match result {
            Ok(()) => info!(podgroup = %group_name, "{}", action.message()),
            Err(e) => warn!(podgroup = %group_name, error = %e, "pod group PostFilter failed"),
        }
    });
}

/// Every member in `members` fails with `message` and waits for an event `plugins` care about.
fn fail_members(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    members: Vec<QueuedPod>,
    plugins: BTreeSet<Plugin>,
    claim_names: BTreeSet<(String, String)>,
    message: &str,
) {
    let now = Instant::now();
    for qp in members {
        let pod = qp.pod.clone();
        shared
            .queue()
            .unschedulable(qp, plugins.clone(), claim_names.clone(), now);
        let message = message.to_owned();
        binder.spawn_with(handle, move |binder| async move {
            binder
                .reporter()
                .failed(&pod, FailureReason::Unschedulable, &message)
                .await;
        });
    }
}

fn write_condition(
    binder: &Binder,
    handle: &Handle,
    group: &Arc<PodGroup>,
    outcome: GroupCondition,
) {
    let Some(condition) = status::desired(group, &outcome, Timestamp::now()) else {
        return;
    };
    let client = binder.client().clone();
    let group = group.clone();
    binder.spawn(handle, async move {
        status::write(&client, &group, condition).await
    });
}
