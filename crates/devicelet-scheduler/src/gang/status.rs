//! The `PodGroupScheduled` condition (W34, W35; upstream `schedule_one_podgroup.go` →
//! `updatePodGroupCondition`): written after every group cycle, `True`/`Scheduled` on success,
//! `False`/`Unschedulable` or `False`/`SchedulerError` otherwise; `True` is never regressed,
//! an unchanged condition is not written, and `lastTransitionTime` moves only when the status
//! does. Unlike upstream the Unschedulable message is never empty (A-L4 fixed).

use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::debug;

/// The condition type.
pub const POD_GROUP_SCHEDULED: &str = "PodGroupScheduled";

/// What a group cycle concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupCondition {
    Scheduled,
    Unschedulable(String),
    SchedulerError(String),
}

impl GroupCondition {
    fn parts(&self) -> (&'static str, &'static str, &str) {
        match self {
            GroupCondition::Scheduled => ("True", "Scheduled", ""),
            GroupCondition::Unschedulable(m) => ("False", "Unschedulable", m),
            GroupCondition::SchedulerError(m) => ("False", "SchedulerError", m),
        }
    }
}

/// The condition to write on `group`, or `None` when nothing is to be written (W35).
pub fn desired(group: &PodGroup, outcome: &GroupCondition, now: Timestamp) -> Option<Condition> {
    let (status, reason, message) = outcome.parts();
    let current = group
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == POD_GROUP_SCHEDULED));
    if let Some(c) = current {
        if c.status == "True" && status == "False" {
            return None;
        }
        if c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == group.metadata.generation
        {
            return None;
        }
    }
    let last_transition_time = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    Some(Condition {
        type_: POD_GROUP_SCHEDULED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time,
        observed_generation: group.metadata.generation,
    })
}

/// Writes `condition` to the group's status (strategic merge on `conditions`, keyed by type).
pub async fn write(client: &Client, group: &PodGroup, condition: Condition) {
    let ns = group.metadata.namespace.clone().unwrap_or_default();
    let name = group.metadata.name.clone().unwrap_or_default();
    let api: Api<PodGroup> = Api::namespaced(client.clone(), &ns);
    let patch = json!({
        "metadata": { "uid": group.metadata.uid },
        "status": { "conditions": [condition] }
    });
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        debug!(podgroup = %format!("{ns}/{name}"), error = %e, "PodGroupScheduled not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::scheduling::v1alpha2::PodGroupStatus;

    fn with(condition: Option<Condition>) -> PodGroup {
        let mut g = PodGroup::default();
        g.metadata.generation = Some(1);
        g.status = Some(PodGroupStatus {
            conditions: condition.map(|c| vec![c]),
            ..PodGroupStatus::default()
        });
        g
    }

    #[test]
    fn w35_true_is_never_regressed_and_unchanged_is_not_written() {
        let t0 = Timestamp::from_second(1_000).expect("time");
        let t1 = Timestamp::from_second(2_000).expect("time");
        let g = with(None);
        let c = desired(&g, &GroupCondition::Unschedulable("1/2 pods".into()), t0)
            .expect("first write");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Unschedulable")
        );
        let g = with(Some(c.clone()));
        assert!(desired(&g, &GroupCondition::Unschedulable("1/2 pods".into()), t1).is_none());
        // Another False keeps the transition time.
        let e = desired(&g, &GroupCondition::SchedulerError("boom".into()), t1).expect("write");
        assert_eq!(e.last_transition_time, Time(t0));
        assert_eq!(e.reason, "SchedulerError");
        let s = desired(&g, &GroupCondition::Scheduled, t1).expect("write");
        assert_eq!(
            (s.status.as_str(), s.reason.as_str()),
            ("True", "Scheduled")
        );
        assert_eq!(s.last_transition_time, Time(t1));
        let g = with(Some(s));
        assert!(desired(&g, &GroupCondition::Unschedulable("x".into()), t1).is_none());
    }
}
