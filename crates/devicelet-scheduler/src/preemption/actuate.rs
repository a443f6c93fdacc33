//! Carrying out a preemption (`pkg/scheduler/framework/preemption/executor.go` and the failure
//! handler of `schedule_one.go`; W87-W90): the preemptor's `status.nominatedNodeName`, lower
//! nominations on that node cleared, then each victim marked `DisruptionTarget=True`
//! (`PreemptionByScheduler`), deleted, and told why by a `Preempted` event.
//!
//! It runs in its own task, as upstream's asynchronous preemption does; the preemptor waits in
//! the unschedulable queue meanwhile, and W79 keeps it from preempting again while its victims
//! terminate.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info, warn};

use super::inputs::Candidate;
pub use super::inputs::{PREEMPTION_BY_SCHEDULER, has_disruption_target};
use crate::report::Reporter;

fn pods(client: &Client, pod: &Pod) -> (Api<Pod>, String) {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    (
        Api::namespaced(client.clone(), ns),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Sets (or clears, with `None`) a pending pod's `status.nominatedNodeName`.
pub async fn set_nomination(client: &Client, pod: &Pod, node: Option<&str>) -> Result<(), String> {
    let (api, name) = pods(client, pod);
    let patch = json!({ "status": { "nominatedNodeName": node } });
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("nominating pod {name}: {e}"))
}

/// Who preempts: a pod for one node, or a pod group for the whole cluster (W99).
pub enum Preemptor<'a> {
    Pod {
        pod: &'a Pod,
        node: &'a str,
    },
    Group {
        group: &'a PodGroup,
        member: &'a Pod,
    },
}

impl Preemptor<'_> {
    /// The pod whose scheduler name the victims' condition and events carry.
    fn pod(&self) -> &Pod {
        match self {
            Preemptor::Pod { pod, .. } => pod,
            Preemptor::Group { member, .. } => member,
        }
    }
}

/// Evicts `candidate`'s victims for `preemptor` (W88-W90): nominates the preemptor, clears the
/// nominations of `lower` (pods of lower priority nominated to the same node), then marks,
/// deletes and tells each victim not already being deleted. Returns how many were deleted.
pub async fn actuate(
    client: Client,
    reporter: Reporter,
    preemptor: Pod,
    candidate: Candidate,
    lower: Vec<Pod>,
) -> Result<usize, String> {
    set_nomination(&client, &preemptor, Some(&candidate.node)).await?;
    for pod in &lower {
        if let Err(e) = set_nomination(&client, pod, None).await {
            // W89: only logged.
            debug!(error = %e, "lower-priority nomination not cleared");
        }
    }
    let by = Preemptor::Pod {
        pod: &preemptor,
        node: &candidate.node,
    };
    evict(&client, &reporter, &candidate.victims, &by).await
}

/// A pod group's preemption (W24, W99): each member nominated to the node the dry run placed
/// it on, then the victims evicted as for a pod.
pub async fn actuate_group(
    client: Client,
    reporter: Reporter,
    group: PodGroup,
    nominations: Vec<(Pod, String)>,
    victims: Vec<Arc<Pod>>,
) -> Result<usize, String> {
    for (member, node) in &nominations {
        set_nomination(&client, member, Some(node)).await?;
    }
    let Some((member, _)) = nominations.first() else {
        return Ok(0);
    };
    let by = Preemptor::Group {
        group: &group,
        member,
    };
    evict(&client, &reporter, &victims, &by).await
}

/// Marks, deletes and tells each victim not already being deleted; returns how many were
/// deleted.
async fn evict(
    client: &Client,
    reporter: &Reporter,
    victims: &[Arc<Pod>],
    by: &Preemptor<'_>,
) -> Result<usize, String> {
    let scheduler = by
        .pod()
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.clone())
        .unwrap_or_default();
    let kind = match by {
        Preemptor::Pod { .. } => "pod",
        Preemptor::Group { .. } => "podgroup",
    };
    let deletions = victims
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .map(|victim| {
            let scheduler = scheduler.as_str();
            async move {
                let (api, name) = pods(client, victim);
                if !has_disruption_target(victim) {
                    let patch = json!({
                        "status": { "conditions": [{
                            "type": "DisruptionTarget",
                            "status": "True",
                            "reason": PREEMPTION_BY_SCHEDULER,
                            "message": format!("{scheduler}: preempting to accommodate a higher priority {kind}"),
                            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                k8s_openapi::jiff::Timestamp::now(),
                            ),
                        }]}
                    });
                    if let Err(e) = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                        .await
                    {
                        if is_not_found(&e) {
                            return Ok(false);
                        }
                        return Err(format!("marking victim {name}: {e}"));
                    }
                }
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => return Ok(false),
                    Err(e) => return Err(format!("deleting victim {name}: {e}")),
                }
                let victim_name = format!(
                    "{}/{name}",
                    victim.metadata.namespace.as_deref().unwrap_or("")
                );
                match by {
                    Preemptor::Pod { pod, node } => {
                        info!(victim = %victim_name, preemptor = ?pod.metadata.name, node, "preempted");
                        reporter.preempted(victim, pod, node).await;
                    }
                    Preemptor::Group { group, member } => {
                        info!(victim = %victim_name, podgroup = ?group.metadata.name, "preempted");
                        reporter.preempted_by_group(victim, member, group).await;
                    }
                }
                Ok(true)
            }
        });
    let results = futures::future::join_all(deletions).await;
    let mut deleted = 0;
    let mut first_error = None;
    for r in results {
        match r {
            Ok(true) => deleted += 1,
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "preemption");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(deleted),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
