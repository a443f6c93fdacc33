//! `devicelet explain podgroup/NAME`: the pod-group cycle run offline on a cluster's state (as
//! `devicelet snapshot` reads it, plus the PodGroups and the group's pods), with what this
//! scheduler would do now and why: per member (gated, bound, placed on a node with its devices,
//! or its rejection) and, with a topology key, per domain.
//!
//! The same search as the scheduling loop ([`super::search`]), on a cache built from the state:
//! the answer is what `devicelet scheduler` would decide, as far as the state shows the cluster
//! (pods without claims that are not the group's are not read, so their CPU and memory do not
//! count).

use std::sync::Arc;
use std::time::{Duration, Instant};

use devicelet_allocator::AllocateOptions;
use devicelet_kube::snapshot::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use serde::Serialize;

use crate::cache::ClusterCache;
use crate::cycle::{CycleInputs, Placement, with_engine};
use crate::gang::search::{
    GroupProblem, MemberInput, MemberResult, Topology, Verdict, schedule_group,
};
use crate::gang::{Policy, group_of, topology_key, unsupported_fields};

/// One member of the group.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberReport {
    pub pod: String,
    /// `bound to NODE`, `pending`, or `gated: REASON`.
    pub state: String,
    /// For a pending member: `NODE (devices)` where it would go, or why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// One topology domain.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainReport {
    pub domain: String,
    pub nodes: usize,
    pub placed: usize,
    pub fits: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The explanation of one pod group.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupReport {
    pub group: String,
    /// `gang (minCount N)` or `basic`.
    pub policy: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
    /// Members assumed or bound already.
    pub scheduled: usize,
    pub members: Vec<MemberReport>,
    /// What the scheduler would do now, in words.
    pub verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<DomainReport>,
    /// Search states visited.
    pub states: usize,
}

impl GroupReport {
    /// The table form of a PodGroup's explanation: the group, each member, each domain, the verdict.
    pub fn render(&self) -> String {
        let r = self;
        let mut out = format!("podgroup {}: {}", r.group, r.policy);
        if let Some(k) = &r.topology_key {
            out.push_str(&format!(", topology key {k}"));
        }
        out.push_str(&format!(", {} member(s) scheduled\n", r.scheduled));
        for m in &r.members {
            out.push_str(&format!("  {} [{}]", m.pod, m.state));
            if let Some(o) = &m.outcome {
                out.push_str(&format!(": {o}"));
            }
            out.push('\n');
        }
        for d in &r.domains {
            out.push_str(&format!(
                "domain {} ({} nodes): {} placed, {}",
                d.domain,
                d.nodes,
                d.placed,
                if d.fits { "fits" } else { "does not fit" }
            ));
            if let Some(m) = &d.message {
                out.push_str(&format!(": {m}"));
            }
            out.push('\n');
        }
        if let Some(d) = &r.domain {
            out.push_str(&format!("chosen domain: {d}\n"));
        }
        out.push_str(&format!("=> {} ({} search states)\n", r.verdict, r.states));
        out
    }
}

/// Why a group could not be explained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupExplainError {
    #[error("podgroup {0} not found")]
    NotFound(String),
    /// The API could not be read.
    #[error("{0}")]
    Api(String),
}

/// Reads the cluster (the DRA state, the namespace's PodGroups and pods) and explains PodGroup
/// `namespace/name`. Read-only: get and list.
pub async fn explain_live(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    time_limit: Duration,
) -> Result<GroupReport, GroupExplainError> {
    use kube::api::{Api, ListParams};
    let api = |e: kube::Error| GroupExplainError::Api(e.to_string());
    let groups_api: Api<PodGroup> = Api::namespaced(client.clone(), namespace);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default();
    let (state, groups, pods) = tokio::join!(
        devicelet_kube::snapshot::read_state(client, Some(namespace)),
        groups_api.list(&params),
        pods_api.list(&params),
    );
    let state = state.map_err(|e| GroupExplainError::Api(e.to_string()))?;
    let groups = groups.map_err(api)?.items;
    let pods = pods.map_err(api)?.items;
    explain_group(&state, &groups, &pods, namespace, name, time_limit)
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// Explains PodGroup `namespace/name` on `state`; `pods` are the namespace's pods (members
/// without claims included), `groups` its PodGroups.
pub fn explain_group(
    state: &ClusterState,
    groups: &[PodGroup],
    pods: &[Pod],
    namespace: &str,
    name: &str,
    time_limit: Duration,
) -> Result<GroupReport, GroupExplainError> {
    let group = groups
        .iter()
        .find(|g| {
            g.metadata.namespace.as_deref() == Some(namespace)
                && g.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| GroupExplainError::NotFound(format!("{namespace}/{name}")))?;
    let mut cache = build_cache(state, groups, pods);
    Ok(run_group_offline(&mut cache, group, pods, time_limit).0)
}

/// A cache holding `state`, the PodGroups and the pods.
pub(crate) fn build_cache(state: &ClusterState, groups: &[PodGroup], pods: &[Pod]) -> ClusterCache {
    let mut cache = ClusterCache::new();
    // The snapshot has no volume objects: members' claims are not judged offline.
    cache.set_volumes_unknown();
    for c in &state.device_classes {
        cache.upsert_class(c.clone());
    }
    for s in &state.resource_slices {
        cache.upsert_slice(s.clone());
    }
    for r in state.taint_rules.iter().flatten() {
        cache.upsert_taint_rule(r.clone());
    }
    for n in &state.nodes {
        cache.upsert_node(n.clone());
    }
    for c in &state.claims {
        cache.upsert_claim(c.clone());
    }
    for g in groups {
        cache.upsert_pod_group(g.clone());
    }
    let mut seen = std::collections::HashSet::new();
    for p in state.pods.iter().chain(pods) {
        if seen.insert(p.metadata.uid.clone()) {
            cache.upsert_pod(p);
        }
    }
    cache
}

/// Runs `group`'s cycle on `cache` (its pending members among `pods`): the report, and the
/// members it would place with their placements.
pub(crate) fn run_group_offline(
    cache: &mut ClusterCache,
    group: &PodGroup,
    pods: &[Pod],
    time_limit: Duration,
) -> (GroupReport, Vec<(Arc<Pod>, Placement)>) {
    let namespace = group.metadata.namespace.as_deref().unwrap_or("");
    let name = group.metadata.name.as_deref().unwrap_or("");
    let key = (namespace.to_owned(), name.to_owned());
    let policy = Policy::of(group);
    let mut members: Vec<&Pod> = pods
        .iter()
        .filter(|p| group_of(p).as_ref() == Some(&key))
        .collect();
    // W12, with the creation time standing in for the first attempt.
    members.sort_by(|a, b| {
        let prio = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        prio(b).cmp(&prio(a)).then_with(|| {
            a.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
                .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        })
    });
    let mut reports = Vec::new();
    let mut pending: Vec<&Pod> = Vec::new();
    for p in members {
        let bound = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let state = if let Some(node) = bound {
            format!("bound to {node}")
        } else if let Some((_, reason)) = crate::informer::pre_enqueue(p, cache) {
            format!("gated: {reason}")
        } else {
            pending.push(p);
            "pending".to_owned()
        };
        reports.push(MemberReport {
            pod: pod_name(p),
            state,
            outcome: None,
        });
    }
    let scheduled = cache.group_scheduled_count(&key);
    let topology = topology_key(group).map(str::to_owned);
    let mut report = GroupReport {
        group: format!("{namespace}/{name}"),
        policy: match policy {
            Policy::Basic => "basic".to_owned(),
            Policy::Gang { min_count } => format!("gang (minCount {min_count})"),
        },
        topology_key: topology.clone(),
        scheduled,
        members: reports,
        verdict: String::new(),
        domain: None,
        domains: Vec::new(),
        states: 0,
    };
    let refused = unsupported_fields(group);
    if !refused.is_empty() {
        report.verdict = format!("refused: {}", refused.join(", "));
        return (report, Vec::new());
    }
    if pending.is_empty() {
        report.verdict = "nothing to schedule: no member is pending and let through".to_owned();
        return (report, Vec::new());
    }
    let inputs: Vec<MemberInput> = pending
        .iter()
        .map(|p| MemberInput {
            pod: Arc::new((*p).clone()),
            inputs: CycleInputs::read(p, cache, Duration::from_secs(600)),
        })
        .collect();
    let problem = GroupProblem {
        policy,
        scheduled,
        topology: topology.map(|k| Topology {
            key: k,
            scheduled_nodes: cache.group_nodes(&key),
        }),
        deadline: Instant::now() + time_limit,
    };
    let options = AllocateOptions::with_time_limit(
        time_limit,
        Arc::new(devicelet_allocator::MonotonicClock::start()),
    );
    let profile = crate::config::Profile::named("devicelet-scheduler");
    let outcome = with_engine(cache, options, &profile, |engine, _| {
        schedule_group(engine, &inputs, &problem)
    });
    report.states = outcome.states;
    report.domain = outcome.domain.clone();
    report.domains = outcome
        .domains
        .iter()
        .map(|d| DomainReport {
            domain: d.value.clone(),
            nodes: d.nodes,
            placed: d.placed,
            fits: d.fits,
            message: d.message.clone(),
        })
        .collect();
    report.verdict = match &outcome.verdict {
        Verdict::Placed => format!("would place {} member(s)", outcome.placed()),
        Verdict::Unschedulable(m) => format!("unschedulable: {m}"),
        Verdict::Error(e) => format!("error: {e}"),
    };
    for (p, result) in pending.iter().zip(&outcome.members) {
        let outcome = match result {
            MemberResult::Placed(placement) => {
                let devices: Vec<String> = placement
                    .allocations
                    .iter()
                    .flat_map(|(_, a)| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                    .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
                    .collect();
                if devices.is_empty() {
                    placement.node.clone()
                } else {
                    format!("{} ({})", placement.node, devices.join(", "))
                }
            }
            MemberResult::NotPlaced { fit: Some(f), .. } => f.message(),
            MemberResult::NotPlaced { fit: None, .. } => "fits, but not with its group".to_owned(),
        };
        let name = pod_name(p);
        if let Some(m) = report.members.iter_mut().find(|m| m.pod == name) {
            m.outcome = Some(outcome);
        }
    }
    let placed = match outcome.verdict {
        Verdict::Placed => inputs
            .into_iter()
            .zip(outcome.members)
            .filter_map(|(m, r)| match r {
                MemberResult::Placed(p) => Some((m.pod, p)),
                MemberResult::NotPlaced { .. } => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    (report, placed)
}
