//! Why a pod (or a claim) does not allocate: `devicelet explain pod/NAME` and `claim/NAME`
//! against a live cluster (issue 19, item 1).
//!
//! Pure over a [`ClusterState`] (read by [`crate::snapshot::read_state`]): the pod's claims that
//! are not allocated (template claims through `status.resourceClaimStatuses`, or built from the
//! template when kube-controller-manager has not created them yet) are allocated on every
//! candidate node by the same allocator and `--explain` machinery as `devicelet allocate`, with
//! every allocated claim of the cluster as the allocated state. What the offline explanation
//! cannot know comes from the API objects: which claims hold the devices in use (and the pods
//! they are reserved for), pools whose newest generation is incomplete (older generations
//! ignored), drivers a class asks for that publish nothing on the node.

use std::collections::BTreeMap;
use std::time::Duration;

use devicelet_allocator::explain::NodeExplanation;
use devicelet_allocator::scenario::{Mode, OutcomeKind, RunOptions, run_scenario_with};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Serialize;

use crate::snapshot::{
    ClusterState, PodClaim, ScenarioOptions, base_scenario, is_allocated, key, pod_claims,
};

/// What to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `pod/NAME`.
    Pod { namespace: String, name: String },
    /// `claim/NAME` (`resourceclaim/NAME`).
    Claim { namespace: String, name: String },
}

/// Why a target could not be explained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    /// `pod/NAME` or `claim/NAME` was expected.
    #[error("{0:?}: expected pod/NAME or claim/NAME")]
    BadTarget(String),
    /// The object does not exist.
    #[error("{kind} {namespace}/{name} not found")]
    NotFound {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// `--node` names no Node.
    #[error("node {0} not found")]
    NoSuchNode(String),
}

impl Target {
    /// Parses `pod/NAME`, `pods/NAME`, `claim/NAME`, `resourceclaim/NAME` (kubectl-style).
    pub fn parse(text: &str, namespace: &str) -> Result<Target, ExplainError> {
        let bad = || ExplainError::BadTarget(text.to_owned());
        let (kind, name) = text.split_once('/').ok_or_else(bad)?;
        if name.is_empty() || name.contains('/') {
            return Err(bad());
        }
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        match kind.to_ascii_lowercase().as_str() {
            "pod" | "pods" | "po" => Ok(Target::Pod { namespace, name }),
            "claim" | "claims" | "resourceclaim" | "resourceclaims" => {
                Ok(Target::Claim { namespace, name })
            }
            _ => Err(bad()),
        }
    }
}

/// Options of [`explain`].
#[derive(Debug, Clone, Default)]
pub struct ExplainOptions {
    /// Only this node (else every candidate node).
    pub node: Option<String>,
    /// Time limit per allocation call (default: the scheduler's 10 s Filter timeout).
    pub time_limit: Option<Duration>,
}

/// The state of one of the target's claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ClaimState {
    /// Allocated (`status.allocation` set).
    Allocated,
    /// Exists, not allocated yet.
    Pending,
    /// A template claim kube-controller-manager has not created yet.
    NotCreated,
    /// The claim (or its template) does not exist.
    Missing,
}

/// One claim of the target.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimReport {
    /// The pod's name for the claim (`spec.resourceClaims[].name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_claim: Option<String>,
    /// `namespace/name` of the claim (for a claim not created yet: the template's claim as
    /// devicelet names it, `POD-PODCLAIM`).
    pub claim: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub state: ClaimState,
    /// Allocated: the node(s) its allocation is bound to (or the selector in words).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_on: Option<String>,
    /// Allocated: `request: driver/pool/device`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Allocated: `status.reservedFor` as `resource/name`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<String>,
    /// In words.
    pub message: String,
}

/// One device an allocation would pick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChosenDevice {
    pub claim: String,
    pub request: String,
    /// `driver/pool/device`.
    pub device: String,
}

/// A device in use and the claims holding it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceHolder {
    /// `driver/pool/device`.
    pub device: String,
    /// `namespace/claim (reserved for pods/NAME, ...)`.
    pub held_by: Vec<String>,
}

/// One candidate node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    /// `Allocated` (the claims fit), `Unschedulable`, `UnschedulableOnNode`, `Timeout`, `Error`.
    pub outcome: OutcomeKind,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// What the allocator picks when the claims fit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<ChosenDevice>,
    /// Why not, per request and constraint (the `allocate --explain` explanation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<NodeExplanation>,
    /// Devices in use on this node for the requests, and who holds them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub in_use_by: Vec<DeviceHolder>,
    /// Findings from the API objects: pool generations, drivers without slices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `pod NAMESPACE/NAME` or `claim NAMESPACE/NAME`.
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The pod's node, when bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_node: Option<String>,
    /// The pod's `PodScheduled` condition when false: what kube-scheduler said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    pub claims: Vec<ClaimReport>,
    /// Candidate nodes, when there is something to allocate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeReport>,
    /// Nodes left out, and things the reader could not see.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The answer in one line.
    pub summary: String,
}

/// Explains `target` over `state`.
pub fn explain(
    state: &ClusterState,
    target: &Target,
    options: &ExplainOptions,
) -> Result<Report, ExplainError> {
    if let Some(n) = &options.node
        && !state
            .nodes
            .iter()
            .any(|x| x.metadata.name.as_deref() == Some(n.as_str()))
    {
        return Err(ExplainError::NoSuchNode(n.clone()));
    }
    match target {
        Target::Pod { namespace, name } => {
            let pod = state
                .pods
                .iter()
                .find(|p| {
                    p.metadata.namespace.as_deref() == Some(namespace.as_str())
                        && p.metadata.name.as_deref() == Some(name.as_str())
                })
                .ok_or_else(|| ExplainError::NotFound {
                    kind: "pod with resource claims",
                    namespace: namespace.clone(),
                    name: name.clone(),
                })?;
            Ok(explain_pod(state, pod, options))
        }
        Target::Claim { namespace, name } => {
            let claim = state
                .claims
                .iter()
                .find(|c| {
                    c.metadata.namespace.as_deref() == Some(namespace.as_str())
                        && c.metadata.name.as_deref() == Some(name.as_str())
                })
                .ok_or_else(|| ExplainError::NotFound {
                    kind: "ResourceClaim",
                    namespace: namespace.clone(),
                    name: name.clone(),
                })?;
            Ok(explain_claim(state, claim, options))
        }
    }
}

fn allocated_report(claim: &ResourceClaim, pod_claim: Option<String>) -> ClaimReport {
    let allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref());
    let devices: Vec<String> = allocation
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| format!("{}: {}/{}/{}", r.request, r.driver, r.pool, r.device))
        .collect();
    let reserved_for: Vec<String> = claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .map(|r| format!("{}/{}", r.resource, r.name))
        .collect();
    let on = allocation
        .and_then(|a| a.node_selector.as_ref())
        .map(node_selector_text)
        .unwrap_or_else(|| "any node (network-attached devices)".into());
    let message = format!(
        "allocated on {on}; {}",
        if reserved_for.is_empty() {
            "reserved for nobody (kube-controller-manager deallocates it)".to_string()
        } else {
            format!("reserved for {}", reserved_for.join(", "))
        }
    );
    ClaimReport {
        pod_claim,
        claim: key(&claim.metadata),
        template: None,
        state: ClaimState::Allocated,
        allocated_on: Some(on),
        devices,
        reserved_for,
        message,
    }
}

/// `node-a` for the scheduler's `metadata.name In [node-a]` (or a hostname label), else the
/// selector in words.
fn node_selector_text(sel: &k8s_openapi::api::core::v1::NodeSelector) -> String {
    let mut names = Vec::new();
    for term in &sel.node_selector_terms {
        let reqs = term
            .match_fields
            .iter()
            .flatten()
            .chain(term.match_expressions.iter().flatten());
        for r in reqs {
            let parts = r.values.iter().flatten().cloned().collect::<Vec<_>>();
            if (r.key == "metadata.name" || r.key == "kubernetes.io/hostname") && r.operator == "In"
            {
                names.extend(parts);
            } else {
                names.push(format!("{} {} {:?}", r.key, r.operator, parts));
            }
        }
    }
    if names.is_empty() {
        "any node".into()
    } else {
        names.join(", ")
    }
}

fn pending_claim_report(claim: &ResourceClaim, pod_claim: Option<String>) -> ClaimReport {
    ClaimReport {
        pod_claim,
        claim: key(&claim.metadata),
        template: None,
        state: ClaimState::Pending,
        allocated_on: None,
        devices: Vec::new(),
        reserved_for: Vec::new(),
        message: "not allocated".into(),
    }
}

fn pod_condition(pod: &Pod) -> Option<String> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(format!(
        "{}: {}",
        c.reason.as_deref().unwrap_or(""),
        c.message.as_deref().unwrap_or("")
    ))
}

fn explain_pod(state: &ClusterState, pod: &Pod, options: &ExplainOptions) -> Report {
    let mut report = Report {
        target: format!("pod {}", key(&pod.metadata)),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        bound_node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        scheduler: pod_condition(pod),
        claims: Vec::new(),
        nodes: Vec::new(),
        notes: state.warnings.clone(),
        summary: String::new(),
    };
    let mut to_allocate: Vec<ResourceClaim> = Vec::new();
    for (pod_claim, resolved) in pod_claims(state, pod) {
        match resolved {
            PodClaim::Exists(c) if is_allocated(c) => {
                report.claims.push(allocated_report(c, Some(pod_claim)));
            }
            PodClaim::Exists(c) => {
                report.claims.push(pending_claim_report(c, Some(pod_claim)));
                to_allocate.push(c.clone());
            }
            PodClaim::FromTemplate { template, claim } => {
                report.claims.push(ClaimReport {
                    pod_claim: Some(pod_claim),
                    claim: key(&claim.metadata),
                    template: template.metadata.name.clone(),
                    state: ClaimState::NotCreated,
                    allocated_on: None,
                    devices: Vec::new(),
                    reserved_for: Vec::new(),
                    message: format!(
                        "not created yet (kube-controller-manager creates it from ResourceClaimTemplate {}); explained with the template's spec",
                        template.metadata.name.as_deref().unwrap_or("")
                    ),
                });
                to_allocate.push(*claim);
            }
            PodClaim::Missing { what } => report.claims.push(ClaimReport {
                pod_claim: Some(pod_claim),
                claim: what.clone(),
                template: None,
                state: ClaimState::Missing,
                allocated_on: None,
                devices: Vec::new(),
                reserved_for: Vec::new(),
                message: format!(
                    "{what} does not exist: the pod cannot be scheduled until it does"
                ),
            }),
        }
    }
    if let Some(missing) = report
        .claims
        .iter()
        .find(|c| c.state == ClaimState::Missing)
    {
        report.summary = format!("not schedulable: {}", missing.message);
        return report;
    }
    if to_allocate.is_empty() {
        report.summary = match &report.bound_node {
            Some(n) => format!("every claim is allocated; the pod is bound to node {n}"),
            None => {
                "every claim is allocated; the pod waits for other reasons (see scheduler)".into()
            }
        };
        return report;
    }
    let candidates = candidate_nodes(state, Some(pod), options, &mut report.notes);
    allocate_on(state, &to_allocate, &candidates, options, &mut report);
    report
}

fn explain_claim(state: &ClusterState, claim: &ResourceClaim, options: &ExplainOptions) -> Report {
    let mut report = Report {
        target: format!("claim {}", key(&claim.metadata)),
        phase: None,
        bound_node: None,
        scheduler: None,
        claims: Vec::new(),
        nodes: Vec::new(),
        notes: state.warnings.clone(),
        summary: String::new(),
    };
    if is_allocated(claim) {
        let r = allocated_report(claim, None);
        report.summary = r.message.clone();
        report.claims.push(r);
        return report;
    }
    report.claims.push(pending_claim_report(claim, None));
    let candidates = candidate_nodes(state, None, options, &mut report.notes);
    allocate_on(
        state,
        std::slice::from_ref(claim),
        &candidates,
        options,
        &mut report,
    );
    report
}

/// The nodes to try: `--node`, else every node that the pod's `nodeSelector` admits (other
/// scheduler filters, such as node taints or resources, are not DRA's and are left out).
fn candidate_nodes<'a>(
    state: &'a ClusterState,
    pod: Option<&Pod>,
    options: &ExplainOptions,
    notes: &mut Vec<String>,
) -> Vec<&'a Node> {
    if let Some(n) = &options.node {
        return state
            .nodes
            .iter()
            .filter(|x| x.metadata.name.as_deref() == Some(n.as_str()))
            .collect();
    }
    let selector = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_selector.as_ref());
    let mut skipped = 0;
    let nodes: Vec<&Node> = state
        .nodes
        .iter()
        .filter(|n| {
            let ok = selector.is_none_or(|sel| {
                sel.iter().all(|(k, v)| {
                    n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(k))
                        .is_some_and(|x| x == v)
                })
            });
            if !ok {
                skipped += 1;
            }
            ok
        })
        .collect();
    if skipped > 0 {
        notes.push(format!(
            "{skipped} node(s) left out by the pod's nodeSelector"
        ));
    }
    if nodes.is_empty() {
        notes.push("no node is a candidate".into());
    }
    nodes
}

fn allocate_on(
    state: &ClusterState,
    claims: &[ResourceClaim],
    nodes: &[&Node],
    options: &ExplainOptions,
    report: &mut Report,
) {
    let mut scenario = base_scenario(
        state,
        &ScenarioOptions {
            name: report.target.clone(),
            redact_config: false,
        },
    );
    scenario.mode = Mode::Allocate;
    let names: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    scenario.nodes.retain(|n| {
        n.metadata
            .name
            .as_deref()
            .is_some_and(|x| names.contains(&x))
    });
    scenario.claims = claims.to_vec();
    let (outcome, explanation) = run_scenario_with(
        &scenario,
        &RunOptions {
            explain: true,
            time_limit: options.time_limit,
            ..RunOptions::default()
        },
    );
    let mut explained: BTreeMap<String, NodeExplanation> = explanation
        .map(|e| e.nodes)
        .unwrap_or_default()
        .into_iter()
        .map(|n| (n.node.clone(), n))
        .collect();
    let holders = device_holders(state);
    let claim_names: Vec<String> = claims.iter().map(|c| key(&c.metadata)).collect();
    let mut fits = Vec::new();
    for n in outcome.per_node {
        let mut node = NodeReport {
            node: n.node.clone(),
            outcome: n.outcome,
            error: n.error.clone(),
            devices: Vec::new(),
            explanation: explained.remove(&n.node),
            in_use_by: Vec::new(),
            notes: Vec::new(),
        };
        for (ci, result) in n.results.iter().flatten().enumerate() {
            for r in result
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
            {
                node.devices.push(ChosenDevice {
                    claim: claim_names.get(ci).cloned().unwrap_or_default(),
                    request: r.request.clone(),
                    device: format!("{}/{}/{}", r.driver, r.pool, r.device),
                });
            }
        }
        if let Some(ex) = &node.explanation {
            let mut seen = Vec::new();
            for d in ex.requests.iter().flat_map(|r| r.in_use_devices.iter()) {
                if seen.contains(d) {
                    continue;
                }
                seen.push(d.clone());
                node.in_use_by.push(DeviceHolder {
                    device: d.clone(),
                    held_by: holders.get(d).cloned().unwrap_or_default(),
                });
            }
            node.notes = pool_notes(&state.resource_slices, ex);
            node.notes
                .extend(missing_driver_notes(state, &n.node, claims));
        }
        if n.outcome == OutcomeKind::Allocated {
            fits.push(n.node.clone());
        }
        report.nodes.push(node);
    }
    let total = report.nodes.len();
    report.summary = if total == 0 {
        "no candidate node".into()
    } else if fits.is_empty() {
        let why = first_reason(&report.nodes);
        format!("the claims cannot be allocated on any of {total} candidate node(s){why}")
    } else {
        let first = &report.nodes[report
            .nodes
            .iter()
            .position(|n| n.outcome == OutcomeKind::Allocated)
            .unwrap_or(0)];
        let devices: Vec<String> = first.devices.iter().map(|d| d.device.clone()).collect();
        format!(
            "allocatable on {} of {total} candidate node(s) ({}); on {}: {}",
            fits.len(),
            fits.join(", "),
            first.node,
            devices.join(", ")
        )
    };
}

/// `: REASON` of the first failed request of the first node, for the summary line.
fn first_reason(nodes: &[NodeReport]) -> String {
    for n in nodes {
        if !n.error.is_empty() {
            return format!(": {}: {}", n.node, n.error);
        }
        if let Some(ex) = &n.explanation {
            if let Some(r) = ex
                .requests
                .iter()
                .find(|r| !r.verdict.contains("failure comes from"))
            {
                return format!(": {}: request {}: {}", n.node, r.request, r.verdict);
            }
            if let Some(c) = ex
                .constraints
                .iter()
                .find(|c| c.verdict.starts_with("no ") || c.verdict.starts_with("only"))
            {
                return format!(": {}: constraint {}: {}", n.node, c.constraint, c.verdict);
            }
        }
    }
    String::new()
}

/// `driver/pool/device` → holders, from every allocated claim.
fn device_holders(state: &ClusterState) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in state.claims.iter().filter(|c| is_allocated(c)) {
        let reserved: Vec<String> = c
            .status
            .iter()
            .flat_map(|s| s.reserved_for.iter().flatten())
            .map(|r| format!("{}/{}", r.resource, r.name))
            .collect();
        let holder = if reserved.is_empty() {
            format!("{} (reserved for nobody)", key(&c.metadata))
        } else {
            format!(
                "{} (reserved for {})",
                key(&c.metadata),
                reserved.join(", ")
            )
        };
        for r in c
            .status
            .iter()
            .flat_map(|s| s.allocation.iter())
            .flat_map(|a| a.devices.iter())
            .flat_map(|d| d.results.iter().flatten())
        {
            if r.admin_access == Some(true) {
                continue;
            }
            let entry = out
                .entry(format!("{}/{}/{}", r.driver, r.pool, r.device))
                .or_default();
            if !entry.contains(&holder) {
                entry.push(holder.clone());
            }
        }
    }
    out
}

/// For each incomplete pool of the explanation: which generation is current, how many of its
/// slices exist, and how many slices of older generations are ignored.
fn pool_notes(slices: &[ResourceSlice], ex: &NodeExplanation) -> Vec<String> {
    let mut notes = Vec::new();
    for pool in &ex.incomplete_pools {
        let Some((driver, name)) = pool.split_once('/') else {
            continue;
        };
        let of_pool: Vec<&ResourceSlice> = slices
            .iter()
            .filter(|s| s.spec.driver == driver && s.spec.pool.name == name)
            .collect();
        let newest = of_pool
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let current: Vec<&&ResourceSlice> = of_pool
            .iter()
            .filter(|s| s.spec.pool.generation == newest)
            .collect();
        let want = current
            .iter()
            .map(|s| s.spec.pool.resource_slice_count)
            .max()
            .unwrap_or(0);
        let older = of_pool.len() - current.len();
        let mut note = format!(
            "pool {pool} is incomplete: generation {newest} has {} of {want} ResourceSlices",
            current.len()
        );
        if older > 0 {
            note.push_str(&format!(
                "; {older} ResourceSlice(s) of older generations are outdated and ignored (is the driver still publishing?)"
            ));
        }
        notes.push(note);
    }
    notes
}

/// Drivers named by the claims' classes (`device.driver == "X"`) that publish no ResourceSlice
/// visible from `node`.
fn missing_driver_notes(state: &ClusterState, node: &str, claims: &[ResourceClaim]) -> Vec<String> {
    let mut notes = Vec::new();
    let mut drivers: Vec<String> = Vec::new();
    let classes: Vec<&str> = claims
        .iter()
        .flat_map(|c| {
            c.spec
                .devices
                .iter()
                .flat_map(|d| d.requests.iter().flatten())
        })
        .flat_map(|r| {
            r.exactly
                .iter()
                .map(|e| e.device_class_name.as_str())
                .chain(
                    r.first_available
                        .iter()
                        .flatten()
                        .map(|s| s.device_class_name.as_str()),
                )
        })
        .collect();
    for class in state
        .device_classes
        .iter()
        .filter(|c| classes.contains(&c.metadata.name.as_deref().unwrap_or("")))
    {
        for s in class.spec.selectors.iter().flatten() {
            if let Some(cel) = &s.cel
                && let Some(d) = driver_in(&cel.expression)
                && !drivers.contains(&d)
            {
                drivers.push(d);
            }
        }
    }
    for d in drivers {
        let visible = state.resource_slices.iter().any(|s| {
            s.spec.driver == d
                && (s.spec.node_name.as_deref() == Some(node)
                    || s.spec.all_nodes == Some(true)
                    || s.spec.node_selector.is_some()
                    || s.spec.per_device_node_selection == Some(true))
        });
        if !visible {
            let anywhere = state
                .resource_slices
                .iter()
                .filter(|s| s.spec.driver == d)
                .count();
            notes.push(if anywhere == 0 {
                format!("driver {d} has published no ResourceSlice at all (is it installed and running?)")
            } else {
                format!("driver {d} has published no ResourceSlice for node {node} ({anywhere} on other nodes): is its kubelet plugin running there?")
            });
        }
    }
    notes
}

/// `X` in `device.driver == "X"` (or `'X'`).
fn driver_in(expression: &str) -> Option<String> {
    let rest = &expression[expression.find("device.driver")? + "device.driver".len()..];
    let rest = rest.trim_start().strip_prefix("==")?.trim_start();
    let q = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let body = &rest[1..];
    body.find(q).map(|end| body[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::tests::fixture;

    fn pod(name: &str) -> Target {
        Target::parse(&format!("pod/{name}"), "team").expect("target")
    }

    #[test]
    fn targets_parse_kubectl_style() {
        assert_eq!(
            Target::parse("claim/x", "ns"),
            Ok(Target::Claim {
                namespace: "ns".into(),
                name: "x".into()
            })
        );
        assert!(Target::parse("deployment/x", "ns").is_err());
        assert!(Target::parse("pod", "ns").is_err());
    }

    #[test]
    fn a_template_claim_not_created_yet_is_explained_from_its_template() {
        let state = fixture();
        let r = explain(&state, &pod("trainer"), &ExplainOptions::default()).expect("report");
        assert_eq!(r.claims[0].state, ClaimState::NotCreated);
        assert_eq!(r.claims[0].template.as_deref(), Some("one-gpu"));
        // node-a has gpu-1 free, node-b gpu-0.
        assert!(
            r.summary.starts_with("allocatable on 2 of 2"),
            "{}",
            r.summary
        );
        assert_eq!(r.nodes[0].devices[0].device, "gpu.example.com/node-a/gpu-1");
    }

    #[test]
    fn in_use_devices_name_their_claims_and_taints_are_shown() {
        let state = fixture();
        let r = explain(&state, &pod("pair"), &ExplainOptions::default()).expect("report");
        assert!(
            r.summary.contains("cannot be allocated on any of 2"),
            "{}",
            r.summary
        );
        let a = &r.nodes[0];
        assert_eq!(a.node, "node-a");
        assert_eq!(
            a.in_use_by,
            [DeviceHolder {
                device: "gpu.example.com/node-a/gpu-0".into(),
                held_by: vec!["other/held (reserved for pods/runner)".into()],
            }]
        );
        let b = r.nodes[1].explanation.as_ref().expect("explained");
        assert_eq!(
            b.requests[0].untolerated_taints,
            ["example.com/broken:NoSchedule"]
        );
        assert!(
            b.requests[0].verdict.contains("1 tainted"),
            "{}",
            b.requests[0].verdict
        );
    }

    #[test]
    fn an_allocated_claim_says_where_and_for_whom() {
        let state = fixture();
        let t = Target::parse("claim/held", "other").expect("target");
        let r = explain(&state, &t, &ExplainOptions::default()).expect("report");
        assert_eq!(r.summary, "allocated on node-a; reserved for pods/runner");
        assert_eq!(r.claims[0].devices, ["gpu: gpu.example.com/node-a/gpu-0"]);
    }

    #[test]
    fn a_driver_without_slices_on_the_node_is_named() {
        let mut state = fixture();
        state
            .resource_slices
            .retain(|s| s.spec.node_name.as_deref() != Some("node-b"));
        let opts = ExplainOptions {
            node: Some("node-b".into()),
            ..ExplainOptions::default()
        };
        let r = explain(&state, &pod("trainer"), &opts).expect("report");
        assert_eq!(r.nodes.len(), 1);
        let n = &r.nodes[0];
        assert!(
            n.notes[0].contains("no ResourceSlice for node node-b"),
            "{:?}",
            n.notes
        );
        let verdict = &n.explanation.as_ref().expect("explained").requests[0].verdict;
        assert!(
            verdict.starts_with("no devices: no ResourceSlice"),
            "{verdict}"
        );
        assert!(matches!(
            explain(
                &state,
                &pod("trainer"),
                &ExplainOptions {
                    node: Some("nope".into()),
                    ..Default::default()
                }
            ),
            Err(ExplainError::NoSuchNode(_))
        ));
    }
}
