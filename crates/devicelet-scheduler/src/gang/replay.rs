//! A group scenario replayed offline (`devicelet allocate -f` on a scheduler's
//! `/debug/snapshot` with `podGroups`): each PodGroup's cycle in the order listed, on one cache,
//! each group's placed members kept (their devices taken) before the next group is tried: the
//! decisions `devicelet scheduler` would make for those groups, one after another.
//!
//! As in [`super::explain`], the scenario holds the DRA state, the nodes' allocatable resources
//! and the groups' own members: other pods' CPU and memory are not in it and do not count.
//! Pods outside groups are the allocator's (`pods`, `mode: schedule`).

use std::time::Duration;

use devicelet_allocator::scenario::AllocationScenario;
use devicelet_kube::snapshot::ClusterState;

use crate::gang::explain::{GroupReport, build_cache, run_group_offline};

/// Replays `scenario.pod_groups`; one report per group, in order.
pub fn replay_groups(scenario: &AllocationScenario, time_limit: Duration) -> Vec<GroupReport> {
    let groups = &scenario.pod_groups;
    let state = ClusterState {
        device_classes: scenario.device_classes.clone(),
        resource_slices: scenario.resource_slices.clone(),
        claims: scenario
            .allocated
            .claims
            .iter()
            .chain(&groups.claims)
            .cloned()
            .collect(),
        nodes: scenario.nodes.clone(),
        ..ClusterState::default()
    };
    let mut cache = build_cache(&state, &groups.groups, &groups.pods);
    let mut reports = Vec::new();
    for group in &groups.groups {
        let (report, placed) = run_group_offline(&mut cache, group, &groups.pods, time_limit);
        for (pod, placement) in placed {
            super::assume_member(&mut cache, &pod, &placement);
        }
        reports.push(report);
    }
    reports
}
