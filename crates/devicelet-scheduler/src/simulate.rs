//! One scheduling cycle offline (`devicelet schedule`): a pod and a snapshot of the cluster as
//! Kubernetes objects in, every node's filter verdict, every feasible node's score per plugin,
//! the node chosen, and — when no node fits — the victims DefaultPreemption would pick on each
//! node. The same code as the running scheduler ([`Engine`], `preemption`), traced to examine
//! every node (no `percentageOfNodesToScore` cut). It is what upstream's framework runtime
//! reports per plugin (`RunFilterPlugins`, `RunScorePlugins`' `NodePluginScores`,
//! `SelectVictimsOnNode`), which makes kube-scheduler's own plugin code an oracle for it
//! (`interop/scheduler`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use devicelet_allocator::AllocateOptions;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::{Deserialize, Serialize};

use crate::cache::ClusterCache;
use crate::config::{self, Profile, SchedulerConfiguration};
use crate::cycle::{CycleInputs, Decision, with_engine};
use crate::framework::{Code, Rejection, SCORE_PLUGINS};
use crate::preemption::{self, PreemptionInputs, Verdict};

/// One case: the pod to schedule and the cluster it meets.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchedulingCase {
    /// A name to find the case by in the output.
    #[serde(default)]
    pub name: Option<String>,
    /// A KubeSchedulerConfiguration (`kubescheduler.config.k8s.io/v1`), as `--config` reads
    /// it; the profile named by the pod's `schedulerName` scores it (else the first).
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    pub pod: Pod,
    #[serde(default)]
    pub nodes: Vec<Node>,
    /// Pods in the cluster: those with `spec.nodeName` count on their node.
    #[serde(default)]
    pub pods: Vec<Pod>,
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
    #[serde(default)]
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
    /// The owners default spreading selects a pod's siblings by.
    #[serde(default)]
    pub services: Vec<Service>,
    #[serde(default)]
    pub replica_sets: Vec<ReplicaSet>,
    #[serde(default)]
    pub stateful_sets: Vec<StatefulSet>,
    #[serde(default)]
    pub replication_controllers: Vec<ReplicationController>,
    #[serde(default)]
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    #[serde(default)]
    pub persistent_volumes: Vec<PersistentVolume>,
    #[serde(default)]
    pub storage_classes: Vec<StorageClass>,
    #[serde(default)]
    pub device_classes: Vec<DeviceClass>,
    #[serde(default)]
    pub resource_slices: Vec<ResourceSlice>,
    #[serde(default)]
    pub resource_claims: Vec<ResourceClaim>,
}

/// A rejection as the output shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RejectionView {
    pub plugin: String,
    pub code: String,
    pub reasons: Vec<String>,
}

impl From<&Rejection> for RejectionView {
    fn from(r: &Rejection) -> Self {
        // A node a PreFilter result leaves out has a status of no plugin upstream (the plugin
        // is kept here for requeueing, as upstream keeps it in its diagnosis).
        let outside = r.reasons.len() == 1
            && r.reasons[0] == crate::filters::node_affinity::OUTSIDE_PRE_FILTER_REASON;
        RejectionView {
            plugin: if outside { "" } else { r.plugin.name() }.to_owned(),
            code: match r.code {
                Code::Unschedulable => "Unschedulable",
                Code::UnschedulableAndUnresolvable => "UnschedulableAndUnresolvable",
            }
            .to_owned(),
            reasons: r.reasons.clone(),
        }
    }
}

/// One node's verdict.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    pub name: String,
    /// The first filter that rejected the node (none: feasible).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection: Option<RejectionView>,
    /// A feasible node's score per enabled score plugin, normalised and times its weight.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub scores: BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<i64>,
}

/// The dry run of DefaultPreemption on one node.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase", untagged)]
pub enum NodeVictims {
    #[serde(rename_all = "camelCase")]
    Victims {
        /// `namespace/name`, most important first.
        victims: Vec<String>,
        pdb_violations: usize,
    },
    Failure {
        failure: String,
    },
}

/// What preemption would do when no node fits.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionView {
    /// Per node where preemption might help.
    pub nodes: BTreeMap<String, NodeVictims>,
    /// The node chosen among them (none: preemption fails, see `message`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nominated: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The outcome of one case.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The case could not be run (a bad configuration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A PreFilter rejected the pod before any node was examined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_filter: Option<RejectionView>,
    pub nodes: Vec<NodeVerdict>,
    /// The feasible nodes with the highest total (the scheduler takes one of them at random).
    pub selected: Vec<String>,
    /// Why the pod fits nowhere, as its `PodScheduled` condition would say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionView>,
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

fn cache_of(case: &SchedulingCase) -> ClusterCache {
    let mut cache = ClusterCache::new();
    for c in &case.device_classes {
        cache.upsert_class(c.clone());
    }
    for s in &case.resource_slices {
        cache.upsert_slice(s.clone());
    }
    for c in &case.resource_claims {
        cache.upsert_claim(c.clone());
    }
    for n in &case.nodes {
        cache.upsert_node(n.clone());
    }
    for p in &case.pods {
        cache.upsert_pod(p);
    }
    for ns in &case.namespaces {
        cache.upsert_namespace(
            ns.metadata.name.as_deref().unwrap_or(""),
            ns.metadata.labels.clone().unwrap_or_default(),
        );
    }
    for pdb in &case.pod_disruption_budgets {
        cache.upsert_pdb(pdb.clone());
    }
    for pvc in &case.persistent_volume_claims {
        cache.upsert_volume_claim(pvc.clone());
    }
    for pv in &case.persistent_volumes {
        cache.upsert_volume(pv.clone());
    }
    for sc in &case.storage_classes {
        cache.upsert_storage_class(sc.clone());
    }
    let owners = cache.spread_owners_mut();
    for o in &case.services {
        owners.upsert_owner(o);
    }
    for o in &case.replication_controllers {
        owners.upsert_owner(o);
    }
    for o in &case.replica_sets {
        owners.upsert_owner(o);
    }
    for o in &case.stateful_sets {
        owners.upsert_owner(o);
    }
    cache
}

/// The profile that schedules `pod` under `config`.
fn profile_for(config: &SchedulerConfiguration, pod: &Pod) -> Profile {
    let name = config::scheduler_name_of(pod);
    config
        .profiles
        .iter()
        .find(|p| p.scheduler_name == name)
        .or(config.profiles.first())
        .cloned()
        .unwrap_or_else(|| Profile::named(name))
}

/// Runs one case.
pub fn run_case(case: &SchedulingCase) -> CaseResult {
    let mut result = CaseResult {
        name: case.name.clone(),
        ..CaseResult::default()
    };
    let profile = match &case.config {
        None => Profile::named(config::scheduler_name_of(&case.pod)),
        Some(value) => match config::parse(&value.to_string()) {
            Ok(c) => profile_for(&c, &case.pod),
            Err(e) => {
                result.error = Some(format!("config: {e}"));
                return result;
            }
        },
    };
    let mut cache = cache_of(case);
    let pod = &case.pod;
    // The scheduler's own Filter timeout; a snapshot this size never comes near it.
    let time_limit = Duration::from_secs(10);
    let options = AllocateOptions {
        pack_partitions: profile.pack_partitions,
        ..AllocateOptions::with_time_limit(
            time_limit,
            Arc::new(devicelet_allocator::MonotonicClock::start()),
        )
    };
    let enabled: Vec<(usize, &str)> = {
        let weights = profile.weights.in_score_order();
        SCORE_PLUGINS
            .iter()
            .enumerate()
            .filter(|(k, _)| weights[*k] > 0)
            .map(|(k, p)| (k, p.name()))
            .collect()
    };
    with_engine(&mut cache, options, &profile, |engine, cache| {
        let inputs = CycleInputs::read(pod, cache, time_limit);
        engine.trace_next_cycle();
        let decision = engine.schedule(pod, inputs.clone());
        let trace = engine.take_trace().unwrap_or_default();
        let scores: BTreeMap<&str, _> = trace.scores.iter().map(|(n, b)| (n.as_str(), b)).collect();
        for entry in &inputs.nodes {
            let name = entry.name();
            let mut verdict = NodeVerdict {
                name: name.to_owned(),
                rejection: trace.rejections.get(name).map(RejectionView::from),
                scores: BTreeMap::new(),
                total: None,
            };
            if let Some(b) = scores.get(name) {
                verdict.scores = enabled
                    .iter()
                    .map(|&(k, plugin)| (plugin.to_owned(), b[k]))
                    .collect();
                verdict.total = Some(b.iter().sum());
            }
            result.nodes.push(verdict);
        }
        let best = result.nodes.iter().filter_map(|n| n.total).max();
        result.selected = result
            .nodes
            .iter()
            .filter(|n| n.total.is_some() && n.total == best)
            .map(|n| n.name.clone())
            .collect();
        let fit = match decision {
            Decision::Unschedulable { fit, .. } => fit,
            Decision::Error(e) => {
                result.error = Some(e);
                return;
            }
            Decision::Place(_) => return,
        };
        result.pre_filter = fit.pre_filter.as_ref().map(RejectionView::from);
        if let Some(p) = &result.pre_filter {
            // Upstream gives every node the PreFilter's status.
            for n in &mut result.nodes {
                n.rejection = Some(p.clone());
            }
        }
        result.message = Some(fit.message());
        // After a PreFilter rejection too: no node is a candidate then, and the message says so.
        if profile.preemption.is_none() {
            return;
        }
        let consumable =
            devicelet_allocator::Features::kubernetes_1_36_defaults().consumable_capacity;
        let inputs_pre = PreemptionInputs::read(cache, pod, consumable);
        let (per_node, verdict) =
            preemption::dry_run_every_node(engine, pod, &inputs, &fit, &inputs_pre);
        let nodes = per_node
            .into_iter()
            .map(|(node, found)| {
                let v = match found {
                    Ok(c) => NodeVictims::Victims {
                        victims: c.victims.iter().map(|p| pod_name(p)).collect(),
                        pdb_violations: c.pdb_violations,
                    },
                    Err(failure) => NodeVictims::Failure { failure },
                };
                (node, v)
            })
            .collect();
        result.preemption = Some(match verdict {
            Verdict::Nominate(c) => PreemptionView {
                nodes,
                nominated: Some(c.node),
                message: None,
            },
            Verdict::Fail { message, .. } => PreemptionView {
                nodes,
                nominated: None,
                message: Some(message),
            },
        });
    });
    result
}
