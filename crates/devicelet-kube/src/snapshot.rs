//! The cluster's DRA state, read through the API (read-only), and its conversion into the
//! `AllocationScenario` that `devicelet allocate` replays offline (issue 19, items 1 and 2).
//!
//! [`read_state`] lists what kube-scheduler's DRA plugin looks at: DeviceClasses,
//! ResourceSlices, ResourceClaims (allocated ones in every namespace, since their devices are in
//! use whoever owns them), ResourceClaimTemplates, Nodes, DeviceTaintRules (when the API server
//! serves them) and the pods with claims. Only `get`/`list` are used; Secrets are never read.
//! [`to_scenario`] turns that state into a scenario in `mode: schedule`: one entry per pending
//! pod with its unallocated claims, the allocated claims as `allocated`, DeviceTaintRules applied
//! to the devices they select (as the scheduler does), Nodes reduced to their name and labels,
//! object metadata reduced to what allocation reads, and with `redact_config` every opaque
//! configuration parameter replaced by a marker.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use devicelet_allocator::scenario::{
    AllocatedSpec, AllocationScenario, Mode, PodGroupsSpec, PodSpec, SemanticsSpec,
};
use devicelet_allocator::types::Features;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Pod, PodStatus};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaint, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimTemplate,
    ResourceSlice,
};
use k8s_openapi::api::resource::v1beta2::DeviceTaintRule;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::client::with_deadline;
use crate::error::ClusterError;

/// The RBAC `devicelet explain` and `devicelet snapshot` need: read-only, `get` and `list`.
pub const REQUIRED_RBAC: &str = "get, list: pods (core); deviceclasses, resourceslices, \
resourceclaims, resourceclaimtemplates (resource.k8s.io/v1); nodes (core); devicetaintrules \
(resource.k8s.io/v1beta2, optional). Cluster-wide list of resourceclaims for the devices other \
namespaces hold; secrets are never read.";

/// Items per list page (large clusters are read in pages, as kubectl does).
const PAGE: u32 = 500;

/// Annotation on a claim that does not exist yet and was built from the pod's template, as
/// kube-controller-manager will build it.
pub const FROM_TEMPLATE_ANNOTATION: &str = "devicelet.dev/from-template";

/// The value opaque configuration parameters are replaced with by `--redact-config`.
pub const REDACTED: &str = "devicelet.dev/redacted";

/// Why the state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A list or get failed (the API call and why).
    #[error(transparent)]
    Api(#[from] ClusterError),
    /// The identity may not read something explain/snapshot needs.
    #[error(
        "{what}: permission denied; explain and snapshot need read-only RBAC ({REQUIRED_RBAC})"
    )]
    Denied {
        /// The call.
        what: String,
    },
}

fn classify(e: ClusterError) -> SnapshotError {
    if e.is_denied() {
        let what = match &e {
            ClusterError::Api { what, .. } => what.clone(),
            other => other.to_string(),
        };
        SnapshotError::Denied { what }
    } else {
        SnapshotError::Api(e)
    }
}

/// What [`read_state`] read.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub device_classes: Vec<DeviceClass>,
    pub resource_slices: Vec<ResourceSlice>,
    /// Claims of every namespace (or of the namespace only, when listing all was denied).
    pub claims: Vec<ResourceClaim>,
    pub claim_templates: Vec<ResourceClaimTemplate>,
    pub nodes: Vec<Node>,
    /// `None` when the API server does not serve DeviceTaintRules.
    pub taint_rules: Option<Vec<DeviceTaintRule>>,
    /// Pods with `spec.resourceClaims`, in the namespace (or every namespace).
    pub pods: Vec<Pod>,
    /// PodGroups (`scheduling.k8s.io/v1alpha2`) whose members are to be replayed as groups;
    /// `pods` then holds their members too, pending and bound. Only the scheduler's snapshot
    /// fills it.
    pub pod_groups: Vec<PodGroup>,
    /// Things the reader could not see, in words (e.g. other namespaces' claims).
    pub warnings: Vec<String>,
}

async fn list_all<K>(api: &Api<K>, what: &str) -> Result<Vec<K>, ClusterError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = with_deadline(format!("list {what}"), api.list(&params)).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok(items),
        }
    }
}

fn namespaced<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Reads the DRA state (read-only). `namespace`: the pods and templates of that namespace only;
/// claims are listed in every namespace when allowed (their devices are in use for everyone).
pub async fn read_state(
    client: &Client,
    namespace: Option<&str>,
) -> Result<ClusterState, SnapshotError> {
    let mut state = ClusterState::default();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let rules: Api<DeviceTaintRule> = Api::all(client.clone());
    let all_claims: Api<ResourceClaim> = Api::all(client.clone());
    let templates: Api<ResourceClaimTemplate> = namespaced(client, namespace);
    let pods: Api<Pod> = namespaced(client, namespace);
    let (c, s, n, t, p, r, claims) = tokio::join!(
        list_all(&classes, "DeviceClasses"),
        list_all(&slices, "ResourceSlices"),
        list_all(&nodes, "Nodes"),
        list_all(&templates, "ResourceClaimTemplates"),
        list_all(&pods, "Pods"),
        list_all(&rules, "DeviceTaintRules"),
        list_all(&all_claims, "ResourceClaims (all namespaces)"),
    );
    state.device_classes = c.map_err(classify)?;
    state.resource_slices = s.map_err(classify)?;
    state.nodes = n.map_err(classify)?;
    state.claim_templates = t.map_err(classify)?;
    state.pods = p
        .map_err(classify)?
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.resource_claims.as_ref())
                .is_some_and(|c| !c.is_empty())
        })
        .collect();
    state.taint_rules = match r {
        Ok(rules) => Some(rules),
        // Not served (feature off or API version disabled), or not readable: no rules known.
        Err(e) if e.is_not_found() => None,
        Err(e) if e.is_denied() => {
            state
                .warnings
                .push("DeviceTaintRules not readable (RBAC): their taints are not applied".into());
            None
        }
        Err(e) => return Err(SnapshotError::Api(e)),
    };
    state.claims = match (claims, namespace) {
        (Ok(claims), _) => claims,
        (Err(e), Some(ns)) if e.is_denied() => {
            state.warnings.push(format!(
                "ResourceClaims of namespaces other than {ns} not readable (RBAC): devices they hold look free"
            ));
            let api: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
            list_all(&api, &format!("ResourceClaims in {ns}"))
                .await
                .map_err(classify)?
        }
        (Err(e), _) => return Err(classify(e)),
    };
    sort_by_name(&mut state.device_classes, |o| &o.metadata);
    sort_by_name(&mut state.resource_slices, |o| &o.metadata);
    sort_by_name(&mut state.nodes, |o| &o.metadata);
    sort_by_name(&mut state.claims, |o| &o.metadata);
    sort_by_name(&mut state.claim_templates, |o| &o.metadata);
    Ok(state)
}

fn sort_by_name<T>(items: &mut [T], meta: impl Fn(&T) -> &ObjectMeta) {
    items.sort_by(|a, b| {
        let (a, b) = (meta(a), meta(b));
        (a.namespace.as_deref(), a.name.as_deref())
            .cmp(&(b.namespace.as_deref(), b.name.as_deref()))
    });
}

/// `namespace/name` of an object.
pub fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// The claim is allocated (has `status.allocation`).
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

/// How one of a pod's claims (`spec.resourceClaims[]`) resolves against the state.
#[derive(Debug, Clone)]
pub enum PodClaim<'a> {
    /// The claim exists.
    Exists(&'a ResourceClaim),
    /// A template claim kube-controller-manager has not created yet: built from the template.
    FromTemplate {
        /// The template.
        template: &'a ResourceClaimTemplate,
        /// The claim as the controller will create it.
        claim: Box<ResourceClaim>,
    },
    /// The named claim (or the template) does not exist.
    Missing {
        /// `ResourceClaim NAME` or `ResourceClaimTemplate NAME`.
        what: String,
    },
}

/// A pod's claims: (the pod's name for the claim, what it resolves to).
pub fn pod_claims<'a>(state: &'a ClusterState, pod: &Pod) -> Vec<(String, PodClaim<'a>)> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let statuses: HashMap<&str, Option<&str>> = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let find_claim = |name: &str| {
        state.claims.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(name)
        })
    };
    let mut out = Vec::new();
    for pc in pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
    {
        let resolved = if let Some(name) = &pc.resource_claim_name {
            match find_claim(name) {
                Some(c) => PodClaim::Exists(c),
                None => PodClaim::Missing {
                    what: format!("ResourceClaim {ns}/{name}"),
                },
            }
        } else if let Some(template) = &pc.resource_claim_template_name {
            match statuses.get(pc.name.as_str()) {
                // The controller recorded that no claim is needed.
                Some(None) => continue,
                Some(Some(name)) if find_claim(name).is_some() => {
                    PodClaim::Exists(find_claim(name).expect("checked"))
                }
                _ => match state.claim_templates.iter().find(|t| {
                    t.metadata.namespace.as_deref() == Some(ns)
                        && t.metadata.name.as_deref() == Some(template)
                }) {
                    Some(t) => PodClaim::FromTemplate {
                        template: t,
                        claim: Box::new(claim_from_template(t, pod_name, &pc.name, ns)),
                    },
                    None => PodClaim::Missing {
                        what: format!("ResourceClaimTemplate {ns}/{template}"),
                    },
                },
            }
        } else {
            continue;
        };
        out.push((pc.name.clone(), resolved));
    }
    out
}

/// The claim kube-controller-manager creates for a pod's template claim (its name is
/// generated, `POD-CLAIM-xxxxx`; here without the random suffix).
fn claim_from_template(
    t: &ResourceClaimTemplate,
    pod: &str,
    pod_claim: &str,
    ns: &str,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{pod}-{pod_claim}")),
            namespace: Some(ns.to_owned()),
            annotations: Some(BTreeMap::from([(
                FROM_TEMPLATE_ANNOTATION.to_owned(),
                t.metadata.name.clone().unwrap_or_default(),
            )])),
            ..ObjectMeta::default()
        },
        spec: t.spec.spec.clone(),
        status: None,
    }
}

/// A pod the scheduler still has to place: not bound, not finished, not being deleted.
pub fn is_pending(pod: &Pod) -> bool {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !bound
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Options of [`to_scenario`].
#[derive(Debug, Clone, Default)]
pub struct ScenarioOptions {
    /// The scenario's `name`.
    pub name: String,
    /// Replace opaque configuration parameters by a marker.
    pub redact_config: bool,
}

/// The Kubernetes semantics the scenario asks for: the scheduler is Go's 1.36 allocator.
pub const COMPAT: &str = "k8s-v1.36.3";

/// Metadata reduced to what allocation and a reader of the scenario need.
fn slim_meta(meta: &ObjectMeta) -> ObjectMeta {
    let annotations: BTreeMap<String, String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() == FROM_TEMPLATE_ANNOTATION)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        labels: meta.labels.clone().filter(|l| !l.is_empty()),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    }
}

/// [`slim_meta`] plus what a group replay checks: the controller owner (a template claim must
/// be the pod's or its PodGroup's) and the creation time (members are tried oldest first).
fn replay_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        owner_references: meta.owner_references.as_ref().map(|refs| {
            refs.iter()
                .filter(|r| r.controller == Some(true))
                .cloned()
                .collect()
        }),
        creation_timestamp: meta.creation_timestamp.clone(),
        ..slim_meta(meta)
    }
}

fn redact(opaque: &mut OpaqueDeviceConfiguration) {
    opaque.parameters = RawExtension(json!({ REDACTED: true }));
}

fn redact_claim(claim: &mut ResourceClaim) {
    for c in claim
        .spec
        .devices
        .iter_mut()
        .flat_map(|d| d.config.iter_mut().flatten())
    {
        if let Some(o) = c.opaque.as_mut() {
            redact(o);
        }
    }
    for c in claim
        .status
        .iter_mut()
        .flat_map(|s| s.allocation.iter_mut())
        .flat_map(|a| a.devices.iter_mut())
        .flat_map(|d| d.config.iter_mut().flatten())
    {
        if let Some(o) = c.opaque.as_mut() {
            redact(o);
        }
    }
}

fn slim_claim(claim: &ResourceClaim, redact_config: bool) -> ResourceClaim {
    let mut c = ResourceClaim {
        metadata: slim_meta(&claim.metadata),
        spec: claim.spec.clone(),
        status: claim.status.clone(),
    };
    if redact_config {
        redact_claim(&mut c);
    }
    c
}

/// The taint a DeviceTaintRule puts on the devices it selects (v1beta2 and v1 have the same
/// fields).
fn rule_taint(rule: &DeviceTaintRule) -> DeviceTaint {
    let t = &rule.spec.taint;
    DeviceTaint {
        effect: t.effect.clone(),
        key: t.key.clone(),
        time_added: t.time_added.clone(),
        value: t.value.clone(),
    }
}

/// Adds the taints of DeviceTaintRules to the devices they select (driver, pool and device,
/// each optional), as the scheduler's DRA plugin does before allocating.
pub fn apply_taint_rules(slices: &mut [ResourceSlice], rules: &[DeviceTaintRule]) {
    for rule in rules {
        let sel = rule.spec.device_selector.as_ref();
        let driver = sel.and_then(|s| s.driver.as_deref());
        let pool = sel.and_then(|s| s.pool.as_deref());
        let device = sel.and_then(|s| s.device.as_deref());
        let taint = rule_taint(rule);
        for slice in slices.iter_mut() {
            if driver.is_some_and(|d| d != slice.spec.driver)
                || pool.is_some_and(|p| p != slice.spec.pool.name)
            {
                continue;
            }
            for d in slice.spec.devices.iter_mut().flatten() {
                if device.is_some_and(|n| n != d.name) {
                    continue;
                }
                let taints = d.taints.get_or_insert_with(Vec::new);
                if !taints.contains(&taint) {
                    taints.push(taint.clone());
                }
            }
        }
    }
}

/// The state's slices as the allocator must see them: metadata reduced, taint rules applied.
pub fn effective_slices(state: &ClusterState) -> Vec<ResourceSlice> {
    let mut slices: Vec<ResourceSlice> = state
        .resource_slices
        .iter()
        .map(|s| ResourceSlice {
            metadata: slim_meta(&s.metadata),
            spec: s.spec.clone(),
        })
        .collect();
    if let Some(rules) = &state.taint_rules {
        apply_taint_rules(&mut slices, rules);
    }
    slices
}

/// The state's classes as the allocator sees them (metadata reduced, config redacted if asked).
pub fn effective_classes(state: &ClusterState, redact_config: bool) -> Vec<DeviceClass> {
    state
        .device_classes
        .iter()
        .map(|c| {
            let mut c = DeviceClass {
                metadata: slim_meta(&c.metadata),
                spec: c.spec.clone(),
            };
            if redact_config {
                for cfg in c.spec.config.iter_mut().flatten() {
                    if let Some(o) = cfg.opaque.as_mut() {
                        redact(o);
                    }
                }
            }
            c
        })
        .collect()
}

/// Nodes reduced to name and labels (what node selectors read).
pub fn effective_nodes(nodes: &[Node]) -> Vec<Node> {
    nodes
        .iter()
        .map(|n| Node {
            metadata: ObjectMeta {
                name: n.metadata.name.clone(),
                labels: n.metadata.labels.clone().filter(|l| !l.is_empty()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: None,
        })
        .collect()
}

/// A scenario skeleton with the state's classes, slices, nodes and allocated claims, and no
/// claims to allocate.
pub fn base_scenario(state: &ClusterState, options: &ScenarioOptions) -> AllocationScenario {
    AllocationScenario {
        name: options.name.clone(),
        semantics: SemanticsSpec {
            variant: "incubating".into(),
            compat: Some(COMPAT.into()),
        },
        features: Features::kubernetes_1_36_defaults(),
        apply_api_defaults: true,
        nodes: effective_nodes(&state.nodes),
        device_classes: effective_classes(state, options.redact_config),
        resource_slices: effective_slices(state),
        allocated: AllocatedSpec {
            claims: state
                .claims
                .iter()
                .filter(|c| is_allocated(c))
                .map(|c| slim_claim(c, options.redact_config))
                .collect(),
            state: Default::default(),
        },
        ..AllocationScenario::default()
    }
}

/// Scenario claims are named by `metadata.name` alone (`pods[].claims`): a name used in
/// several namespaces is qualified as `NAMESPACE.NAME` (dots are valid in object names).
fn scenario_claim(
    claim: &ResourceClaim,
    clashing: &BTreeSet<String>,
    redact_config: bool,
) -> ResourceClaim {
    let mut c = slim_claim(claim, redact_config);
    let name = c.metadata.name.clone().unwrap_or_default();
    if clashing.contains(&name) {
        c.metadata.name = Some(format!(
            "{}.{name}",
            c.metadata.namespace.as_deref().unwrap_or("")
        ));
    }
    c
}

/// The whole state as a replayable scenario (`mode: schedule`): each pending pod, oldest
/// first, with its claims that are not allocated yet (template claims not created yet built
/// from their template), placed on the first node that fits as the scheduler would place it
/// if DRA were the only constraint.
pub fn to_scenario(state: &ClusterState, options: &ScenarioOptions) -> AllocationScenario {
    let mut scenario = base_scenario(state, options);
    scenario.mode = Mode::Schedule;
    let in_group = |p: &Pod| {
        group_name(p).is_some_and(|(ns, name)| {
            state.pod_groups.iter().any(|g| {
                g.metadata.namespace.as_deref() == Some(ns)
                    && g.metadata.name.as_deref() == Some(name)
            })
        })
    };
    if !state.pod_groups.is_empty() {
        scenario.pod_groups = group_replay(state, &in_group, options.redact_config);
        // The group cycle checks room for pods too: the nodes keep what it reads.
        scenario.nodes = scheduling_nodes(&state.nodes);
    }
    let mut pods: Vec<&Pod> = state
        .pods
        .iter()
        .filter(|p| is_pending(p) && !in_group(p))
        .collect();
    pods.sort_by(|a, b| {
        let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b))
            .then_with(|| key(&a.metadata).cmp(&key(&b.metadata)))
    });
    // Claims to allocate: per pod, the existing unallocated ones and those from templates.
    let mut pending: Vec<(String, Vec<ResourceClaim>)> = Vec::new();
    for pod in pods {
        let claims: Vec<ResourceClaim> = pod_claims(state, pod)
            .into_iter()
            .filter_map(|(_, pc)| match pc {
                PodClaim::Exists(c) if !is_allocated(c) => Some(c.clone()),
                PodClaim::FromTemplate { claim, .. } => Some(*claim),
                _ => None,
            })
            .collect();
        if !claims.is_empty() {
            pending.push((key(&pod.metadata), claims));
        }
    }
    let mut namespaces_by_name: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, claims) in &pending {
        for c in claims {
            namespaces_by_name
                .entry(c.metadata.name.clone().unwrap_or_default())
                .or_default()
                .insert(c.metadata.namespace.clone().unwrap_or_default());
        }
    }
    let clashing: BTreeSet<String> = namespaces_by_name
        .into_iter()
        .filter(|(_, ns)| ns.len() > 1)
        .map(|(n, _)| n)
        .collect();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (pod, claims) in pending {
        let mut names = Vec::new();
        for c in claims {
            let c = scenario_claim(&c, &clashing, options.redact_config);
            let name = c.metadata.name.clone().unwrap_or_default();
            // A claim shared by several pending pods is allocated once, for the first.
            if seen.insert(key(&c.metadata)) {
                scenario.claims.push(c);
            }
            names.push(name);
        }
        scenario.pods.push(PodSpec {
            name: pod,
            claims: names,
        });
    }
    scenario
}

/// The pod's PodGroup (`spec.schedulingGroup.podGroupName`, KEP-4671 W4), as (namespace,
/// name); an empty name is no group.
pub fn group_name(pod: &Pod) -> Option<(&str, &str)> {
    let name = pod
        .spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .as_deref()
        .filter(|n| !n.is_empty())?;
    Some((pod.metadata.namespace.as_deref().unwrap_or(""), name))
}

/// `podGroups`: the groups, their members (pending and bound) and the members' claims not
/// allocated yet, as the group replay reads them.
fn group_replay(
    state: &ClusterState,
    in_group: &dyn Fn(&Pod) -> bool,
    redact_config: bool,
) -> PodGroupsSpec {
    let members: Vec<&Pod> = state.pods.iter().filter(|p| in_group(p)).collect();
    let mut seen = BTreeSet::new();
    let mut claims = Vec::new();
    for pod in &members {
        for (_, pc) in pod_claims(state, pod) {
            if let PodClaim::Exists(c) = pc
                && !is_allocated(c)
                && seen.insert(key(&c.metadata))
            {
                let mut slim = slim_claim(c, redact_config);
                slim.metadata = replay_meta(&c.metadata);
                claims.push(slim);
            }
        }
    }
    PodGroupsSpec {
        groups: state
            .pod_groups
            .iter()
            .map(|g| PodGroup {
                metadata: replay_meta(&g.metadata),
                spec: g.spec.clone(),
                status: g.status.clone(),
            })
            .collect(),
        pods: members
            .into_iter()
            .map(|p| Pod {
                metadata: replay_meta(&p.metadata),
                spec: p.spec.clone(),
                status: p.status.as_ref().map(|s| PodStatus {
                    phase: s.phase.clone(),
                    resource_claim_statuses: s.resource_claim_statuses.clone(),
                    extended_resource_claim_status: s.extended_resource_claim_status.clone(),
                    ..PodStatus::default()
                }),
            })
            .collect(),
        claims,
    }
}

/// Nodes as the scheduler's filters read them: [`effective_nodes`] plus taints,
/// `unschedulable` and the allocatable resources.
fn scheduling_nodes(nodes: &[Node]) -> Vec<Node> {
    effective_nodes(nodes)
        .into_iter()
        .zip(nodes)
        .map(|(mut slim, n)| {
            slim.spec = n.spec.as_ref().map(|s| NodeSpec {
                taints: s.taints.clone(),
                unschedulable: s.unschedulable,
                ..NodeSpec::default()
            });
            slim.status = n.status.as_ref().map(|s| NodeStatus {
                allocatable: s.allocatable.clone(),
                ..NodeStatus::default()
            });
            slim
        })
        .collect()
}

/// A scenario as the JSON `devicelet allocate -f` reads (write it as JSON or YAML).
pub fn scenario_value(s: &AllocationScenario) -> Result<Value, serde_json::Error> {
    let mut v = json!({
        "apiVersion": devicelet_allocator::scenario::API_VERSION,
        "kind": "AllocationScenario",
        "name": s.name,
        "semantics": s.semantics,
        "features": s.features,
        "applyAPIDefaults": s.apply_api_defaults,
        "mode": s.mode,
        "nodes": s.nodes,
        "deviceClasses": s.device_classes,
        "resourceSlices": s.resource_slices,
        "claims": s.claims,
        "allocated": { "claims": s.allocated.claims },
    });
    if let Value::Object(o) = &mut v {
        if s.mode == Mode::Schedule {
            o.insert("pods".into(), serde_json::to_value(&s.pods)?);
        }
        if let Some(t) = s.timeout_seconds {
            o.insert("timeoutSeconds".into(), json!(t));
        }
        if let Some(b) = s.step_budget {
            o.insert("stepBudget".into(), json!(b));
        }
        let g = &s.pod_groups;
        if !g.groups.is_empty() {
            o.insert(
                "podGroups".into(),
                json!({ "groups": g.groups, "pods": g.pods, "claims": g.claims }),
            );
        }
    }
    Ok(v)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use devicelet_allocator::scenario::{OutcomeKind, parse_scenario, run_scenario};

    fn from_yaml<T: DeserializeOwned>(text: &str) -> T {
        serde_yaml::from_str(text).expect("fixture")
    }

    /// A small cluster: two nodes with two GPUs each, one allocated claim, a DeviceTaintRule on
    /// one device, a pending pod with a template claim not created yet and one with an existing
    /// claim (with opaque config), and a bound pod.
    pub(crate) fn fixture() -> ClusterState {
        let slice = |node: &str| -> ResourceSlice {
            from_yaml(&format!(
                r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {node}-gpu, uid: u-{node}, resourceVersion: "7", managedFields: [{{manager: x}}]}}
spec:
  driver: gpu.example.com
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices:
  - {{name: gpu-0, attributes: {{model: {{string: a100}}}}}}
  - {{name: gpu-1, attributes: {{model: {{string: a100}}}}}}
"#
            ))
        };
        let node = |name: &str| -> Node {
            from_yaml(&format!(
                r#"
metadata: {{name: {name}, labels: {{kubernetes.io/hostname: {name}}}, annotations: {{secret-ish: x}}}}
status: {{addresses: [{{type: InternalIP, address: 10.0.0.1}}]}}
"#
            ))
        };
        ClusterState {
            device_classes: vec![from_yaml(
                r#"
metadata: {name: gpu, annotations: {kubectl.kubernetes.io/last-applied-configuration: "{}"}}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.example.com"'}}]
  config: [{opaque: {driver: gpu.example.com, parameters: {token: hunter2}}}]
"#,
            )],
            resource_slices: vec![slice("node-a"), slice("node-b")],
            claims: vec![
                from_yaml(
                    r#"
metadata: {name: held, namespace: other, uid: u-held}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu}}]}}
status:
  allocation:
    devices:
      results: [{request: gpu, driver: gpu.example.com, pool: node-a, device: gpu-0}]
    nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [node-a]}]}]}
  reservedFor: [{resource: pods, name: runner, uid: u-runner}]
"#,
                ),
                from_yaml(
                    r#"
metadata: {name: mine, namespace: team, uid: u-mine}
spec:
  devices:
    requests: [{name: gpu, exactly: {deviceClassName: gpu, count: 2}}]
    config: [{opaque: {driver: gpu.example.com, parameters: {password: swordfish}}}]
"#,
                ),
            ],
            claim_templates: vec![from_yaml(
                r#"
metadata: {name: one-gpu, namespace: team}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu}}]}}}
"#,
            )],
            nodes: vec![node("node-a"), node("node-b")],
            taint_rules: Some(vec![from_yaml(
                r#"
metadata: {name: broken}
spec:
  deviceSelector: {driver: gpu.example.com, pool: node-b, device: gpu-1}
  taint: {key: example.com/broken, effect: NoSchedule}
"#,
            )]),
            pods: vec![
                from_yaml(
                    r#"
metadata: {name: trainer, namespace: team, creationTimestamp: "2026-11-25T10:00:00Z"}
spec:
  containers: [{name: main}]
  resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]
status: {phase: Pending}
"#,
                ),
                from_yaml(
                    r#"
metadata: {name: pair, namespace: team, creationTimestamp: "2026-11-25T10:00:01Z"}
spec:
  containers: [{name: main}]
  resourceClaims: [{name: gpus, resourceClaimName: mine}]
status: {phase: Pending}
"#,
                ),
                from_yaml(
                    r#"
metadata: {name: runner, namespace: other, creationTimestamp: "2026-11-25T09:00:00Z"}
spec:
  nodeName: node-a
  containers: [{name: main}]
  resourceClaims: [{name: gpu, resourceClaimName: held}]
status: {phase: Running}
"#,
                ),
            ],
            pod_groups: Vec::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn api_objects_become_a_replayable_scenario() {
        let state = fixture();
        let scenario = to_scenario(
            &state,
            &ScenarioOptions {
                name: "fixture".into(),
                redact_config: true,
            },
        );
        let value = scenario_value(&scenario).expect("encode");
        let text = serde_yaml::to_string(&value).expect("yaml");
        // Nothing secret-looking survives: opaque parameters, annotations, node status.
        for gone in [
            "hunter2",
            "swordfish",
            "last-applied",
            "secret-ish",
            "10.0.0.1",
            "managedFields",
            "resourceVersion",
        ] {
            assert!(!text.contains(gone), "{gone} in\n{text}");
        }
        assert!(text.contains(REDACTED));
        // The rule's taint is on node-b's gpu-1 only.
        let tainted: Vec<String> = scenario
            .resource_slices
            .iter()
            .flat_map(|s| {
                s.spec
                    .devices
                    .iter()
                    .flatten()
                    .filter(|d| d.taints.is_some())
                    .map(move |d| format!("{}/{}", s.spec.pool.name, d.name))
            })
            .collect();
        assert_eq!(tainted, ["node-b/gpu-1"]);
        // Pending pods oldest first; the template claim is built from its template.
        assert_eq!(scenario.mode, Mode::Schedule);
        let pods: Vec<(&str, Vec<&str>)> = scenario
            .pods
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.claims.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            pods,
            [
                ("team/trainer", vec!["trainer-gpu"]),
                ("team/pair", vec!["mine"])
            ]
        );
        assert_eq!(scenario.allocated.claims.len(), 1);

        // Replayed offline: trainer takes node-a's free gpu-1; pair needs 2 devices on one
        // node: node-a has none left and node-b's gpu-1 is tainted.
        let replayed = parse_scenario(text.as_bytes()).expect("the scenario parses back");
        let outcome = run_scenario(&replayed);
        let summary: Vec<(String, OutcomeKind, Option<String>)> = outcome
            .pods
            .iter()
            .map(|p| (p.pod.clone(), p.outcome, p.node.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "team/trainer".into(),
                    OutcomeKind::Allocated,
                    Some("node-a".into())
                ),
                ("team/pair".into(), OutcomeKind::Unschedulable, None),
            ]
        );
        let device = outcome.pods[0].results.as_ref().expect("results")[0]
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .expect("devices")[0]
            .device
            .clone();
        assert_eq!(device, "gpu-1");
    }

    #[test]
    fn claim_names_used_in_two_namespaces_are_qualified() {
        let mut state = fixture();
        let mut other = state.claims[1].clone();
        other.metadata.namespace = Some("team2".into());
        state.claims.push(other);
        let mut pod = state.pods[1].clone();
        pod.metadata.namespace = Some("team2".into());
        state.pods.push(pod);
        let s = to_scenario(&state, &ScenarioOptions::default());
        let names: Vec<&str> = s
            .claims
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        assert_eq!(names, ["trainer-gpu", "team.mine", "team2.mine"]);
    }
}
