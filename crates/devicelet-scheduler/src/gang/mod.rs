//! Pod groups (`scheduling.k8s.io/v1alpha2` PodGroup, KEP-4671; spec workloads.md part A):
//! a pod joins a group with `spec.schedulingGroup.podGroupName`, and the group's pods are
//! scheduled together in one pod-group cycle. Upstream: `pkg/scheduler/schedule_one_podgroup.go`,
//! `framework/plugins/gangscheduling/gangscheduling.go`, `backend/cache/podgroupstate.go`.
//!
//! - this file: membership, the group's policy, PreEnqueue (W8) and the PodGroup fields this
//!   scheduler refuses rather than ignores; PodGroup claims (part B, W41-W52) are resolved and
//!   reserved for the group in [`crate::dra`] and [`crate::binder`];
//! - [`search`]: the group cycle itself, all or nothing, with bounded backtracking over the
//!   members' node and device choices (A-L1 / B-L5 fixed);
//! - `memo`: which DRA answers the search may keep across members of one shape;
//! - [`run`]: the group cycle in the scheduling loop: pull the members, search, reserve and
//!   bind, or fail them together;
//! - [`barrier`]: the members' binding cycles meet after PreBind, so a short group binds nobody
//!   (A-L5 fixed);
//! - [`explain`]: the group cycle run offline for `devicelet explain podgroup/NAME`;
//! - [`status`]: the `PodGroupScheduled` condition (W34, W35) and its message (A-L4 fixed).

pub mod barrier;
pub mod explain;
mod memo;
pub(crate) mod post_filter;
pub mod replay;
pub mod run;
pub mod search;
pub mod status;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;

use crate::cache::ClusterCache;
use crate::framework::Plugin;
use crate::queue::Gate;

/// A pod group's identity: (namespace, PodGroup name).
pub type GroupKey = (String, String);

/// The group `pod` belongs to (W4), if any.
pub fn group_of(pod: &Pod) -> Option<GroupKey> {
    devicelet_kube::snapshot::group_name(pod).map(|(ns, name)| (ns.to_owned(), name.to_owned()))
}

/// A group's scheduling policy (W2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Members are scheduled together, each placed when it fits.
    Basic,
    /// All or nothing for at least `min_count` members.
    Gang { min_count: usize },
}

impl Policy {
    /// The policy of `group` (a gang with no `minCount` cannot pass validation; it counts as 1).
    pub fn of(group: &PodGroup) -> Self {
        match &group.spec.scheduling_policy.gang {
            Some(g) => Policy::Gang {
                min_count: usize::try_from(g.min_count).unwrap_or(0).max(1),
            },
            None => Policy::Basic,
        }
    }

    /// How many members must be placed for the group to be placed (basic: one).
    pub fn quorum(self) -> usize {
        match self {
            Policy::Basic => 1,
            Policy::Gang { min_count } => min_count,
        }
    }
}

/// The fields of `group` this scheduler would have to ignore to place it, as JSON paths: the
/// pod group is refused, never placed as if they were not there (today: a second topology key,
/// which the API does not allow either).
pub fn unsupported_fields(group: &PodGroup) -> Vec<String> {
    let mut out = Vec::new();
    let topology = group
        .spec
        .scheduling_constraints
        .as_ref()
        .and_then(|c| c.topology.as_ref())
        .map_or(0, Vec::len);
    if topology > 1 {
        // The API allows one entry (W62); more is something this scheduler cannot honour.
        out.push("PodGroup spec.schedulingConstraints.topology (more than one key)".to_owned());
    }
    out
}

/// The topology key all members must share (W62), if any.
pub fn topology_key(group: &PodGroup) -> Option<&str> {
    group
        .spec
        .scheduling_constraints
        .as_ref()?
        .topology
        .as_ref()?
        .first()
        .map(|t| t.key.as_str())
        .filter(|k| !k.is_empty())
}

/// GangScheduling's PreEnqueue (W8): a member waits until its PodGroup exists and, for a gang,
/// until `minCount` members exist. The messages are upstream's, typo included.
pub fn pre_enqueue(pod: &Pod, cache: &ClusterCache) -> Gate {
    let key = group_of(pod)?;
    let Some(group) = cache.pod_group(&key.0, &key.1) else {
        return Some((
            Plugin::GangScheduling,
            format!(
                "waiting for pods's pod group {:?} to appear in scheduling queue",
                key.1
            ),
        ));
    };
    match Policy::of(&group) {
        Policy::Basic => None,
        Policy::Gang { min_count } => (cache.group_pod_count(&key) < min_count).then(|| {
            (
                Plugin::GangScheduling,
                "waiting for minCount pods from a gang to appear in scheduling queue".to_owned(),
            )
        }),
    }
}

/// W22 in the cache: a placed member's new allocations in flight (its devices taken) and the
/// member assumed on its node.
pub(crate) fn assume_member(
    cache: &mut crate::cache::ClusterCache,
    pod: &Pod,
    placement: &crate::cycle::Placement,
) {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    for (claim, allocation) in placement.allocating() {
        let mut c = claim.clone();
        c.status
            .get_or_insert_with(k8s_openapi::api::resource::v1::ResourceClaimStatus::default)
            .allocation = Some(allocation.clone());
        cache.add_pending(uid, c);
    }
    cache.assume_pod(pod, &placement.node);
}

#[cfg(test)]
mod policy_tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSchedulingGroup, PodSpec};
    use k8s_openapi::api::scheduling::v1alpha2::{
        GangSchedulingPolicy, PodGroupSchedulingConstraints, PodGroupSchedulingPolicy,
        PodGroupSpec, TopologyConstraint,
    };

    pub(crate) fn member(uid: &str, group: &str) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                scheduling_group: Some(PodSchedulingGroup {
                    pod_group_name: Some(group.into()),
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(uid.into());
        p.metadata.namespace = Some("ns".into());
        p
    }

    pub(crate) fn gang(name: &str, min_count: i32) -> PodGroup {
        let mut g = PodGroup {
            spec: PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy {
                    gang: Some(GangSchedulingPolicy { min_count }),
                    basic: None,
                },
                ..PodGroupSpec::default()
            },
            ..PodGroup::default()
        };
        g.metadata.name = Some(name.into());
        g.metadata.namespace = Some("ns".into());
        g.metadata.uid = Some(format!("uid-{name}"));
        g
    }

    #[test]
    fn w8_members_wait_for_the_group_and_for_min_count() {
        let mut cache = ClusterCache::new();
        let a = member("a", "g");
        assert_eq!(
            pre_enqueue(&a, &cache).map(|g| g.1),
            Some("waiting for pods's pod group \"g\" to appear in scheduling queue".into())
        );
        cache.upsert_pod_group(gang("g", 2));
        cache.upsert_pod(&a);
        assert_eq!(
            pre_enqueue(&a, &cache).map(|g| g.1),
            Some("waiting for minCount pods from a gang to appear in scheduling queue".into())
        );
        cache.upsert_pod(&member("b", "g"));
        assert_eq!(pre_enqueue(&a, &cache), None);
        // A pod without a group is never gated here.
        assert_eq!(pre_enqueue(&Pod::default(), &cache), None);
    }

    #[test]
    fn several_topology_keys_are_refused_by_name() {
        let mut g = gang("g", 1);
        assert!(unsupported_fields(&g).is_empty());
        g.spec.scheduling_constraints = Some(PodGroupSchedulingConstraints {
            topology: Some(vec![TopologyConstraint { key: "rack".into() }]),
        });
        assert!(unsupported_fields(&g).is_empty());
        assert_eq!(topology_key(&g), Some("rack"));
        g.spec.scheduling_constraints = Some(PodGroupSchedulingConstraints {
            topology: Some(vec![
                TopologyConstraint { key: "rack".into() },
                TopologyConstraint { key: "zone".into() },
            ]),
        });
        assert_eq!(
            unsupported_fields(&g),
            vec!["PodGroup spec.schedulingConstraints.topology (more than one key)"]
        );
    }
}
