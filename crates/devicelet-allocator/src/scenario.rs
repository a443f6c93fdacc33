//! The neutral harness format of spec `structured-allocator.md` §5: `AllocationScenario` in,
//! `AllocationOutcome` out (modes `allocate` and `schedule`), the corpus comparison rules of
//! `conformance/allocator/README.md`, and a plain-text table for `devicelet allocate -o table`.
//!
//! Everything here is pure: the caller reads the file and prints the result.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::allocator::{AllocatedIndex, Allocator, ClusterSnapshot};
use crate::explain::{Explanation, explain_node};
use crate::omitempty::OmitEmpty;
use crate::quantity::Quantity;
use crate::selector::{CelFeatures, SelectorCache};
use crate::types::{
    AllocError, AllocateOptions, AllocatedState, Clock, DeviceId, ErrorClass, Features,
    MonotonicClock, SCHEDULER_FILTER_TIMEOUT, SeededShareIds, Semantics, ShareIdSource, TimeLimit,
};

/// Harness schema version.
pub const API_VERSION: &str = "dra-harness/v1alpha1";

/// `mode` of a scenario.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One allocator, one allocation call per node.
    #[default]
    Allocate,
    /// Sequential pods: allocate, pick the first node that fits, commit.
    Schedule,
}

/// `semantics` of a scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemanticsSpec {
    /// Only `incubating` is implemented.
    #[serde(default)]
    pub variant: String,
    /// A `k8s-v1.36.x` profile selects Go-compatible semantics (bugs of §7 included);
    /// absent, empty or `fixed` selects the corrected behaviour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compat: Option<String>,
}

impl SemanticsSpec {
    /// The semantics this spec selects.
    pub fn semantics(&self) -> Semantics {
        match self.compat.as_deref() {
            Some(c) if c.starts_with("k8s-") => Semantics::GoCompat,
            _ => Semantics::Fixed,
        }
    }
}

/// `cel` options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CelSpec {
    pub enable_consumable_capacity: bool,
    pub enable_list_type_attributes: bool,
}

/// One exclusively allocated device in `allocated.state.devices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// One share in `allocated.state.sharedDevices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateShare {
    pub driver: String,
    pub pool: String,
    pub device: String,
    #[serde(rename = "shareID", default)]
    pub share_id: String,
}

/// One entry of `allocated.state.consumedCapacity`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCapacity {
    pub driver: String,
    pub pool: String,
    pub device: String,
    #[serde(default)]
    pub capacity: BTreeMap<String, String>,
}

/// `allocated.state`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StateSpec {
    pub devices: Vec<StateDevice>,
    pub shared_devices: Vec<StateShare>,
    pub consumed_capacity: Vec<StateCapacity>,
}

/// `allocated`: other claims' allocations.
#[derive(Clone, Debug, Default)]
pub struct AllocatedSpec {
    pub claims: Vec<ResourceClaim>,
    pub state: StateSpec,
}

/// One pod of `mode: schedule`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSpec {
    pub name: String,
    #[serde(default)]
    pub claims: Vec<String>,
}

/// `podGroups`: pod groups (KEP-4671) to replay with the scheduler's group cycle, all or
/// nothing. The allocator itself does not read them (their members are not in `pods`): the
/// caller that knows group scheduling does (`devicelet allocate -f`).
#[derive(Clone, Debug, Default)]
pub struct PodGroupsSpec {
    /// `scheduling.k8s.io/v1alpha2` PodGroups, replayed in this order.
    pub groups: Vec<PodGroup>,
    /// Their members as Pod objects, pending and bound (`spec.nodeName`).
    pub pods: Vec<Pod>,
    /// The members' claims that are not in `allocated.claims`.
    pub claims: Vec<ResourceClaim>,
}

/// The scenario (spec §5.1).
#[derive(Clone, Debug, Default)]
pub struct AllocationScenario {
    pub name: String,
    pub semantics: SemanticsSpec,
    pub features: Features,
    pub cel: Option<CelSpec>,
    pub apply_api_defaults: bool,
    pub timeout_seconds: Option<f64>,
    /// Search step bound per allocation call; without it (and without `timeout_seconds`) a
    /// run is bounded by the scheduler's Filter timeout instead (see [`search_limits`]).
    pub step_budget: Option<u64>,
    pub nodes: Vec<Node>,
    pub device_classes: Vec<DeviceClass>,
    pub resource_slices: Vec<ResourceSlice>,
    pub claims: Vec<ResourceClaim>,
    pub allocated: AllocatedSpec,
    pub mode: Mode,
    pub pods: Vec<PodSpec>,
    pub first_fit: bool,
    /// devicelet's own: try partitions of devices already in use first
    /// ([`AllocateOptions::pack_partitions`]); upstream's order when false.
    pub pack_partitions: bool,
    pub pod_groups: PodGroupsSpec,
    /// The corpus' expected outcome, kept as raw JSON (not used by [`run_scenario`]).
    pub expect: Option<Value>,
}

impl AllocationScenario {
    /// The CEL environment: `cel` if given, else derived from the features.
    pub fn cel_features(&self) -> CelFeatures {
        match self.cel {
            Some(c) => CelFeatures {
                enable_consumable_capacity: c.enable_consumable_capacity,
                enable_list_type_attributes: c.enable_list_type_attributes,
            },
            None => CelFeatures {
                enable_consumable_capacity: self.features.consumable_capacity,
                enable_list_type_attributes: self.features.list_type_attributes,
            },
        }
    }
}

/// Why a scenario could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScenarioError {
    #[error("{format} syntax error at line {line}, column {column}: {message}")]
    Syntax {
        format: &'static str,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    #[error("unsupported scenario: {0}")]
    Unsupported(String),
}

fn field_err(path: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Field {
        path: path.into(),
        message: message.into(),
    }
}

/// Reads a scenario from JSON or YAML (detected from the first non-blank character).
pub fn parse_scenario(bytes: &[u8]) -> Result<AllocationScenario, ScenarioError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let value: Value = if first == Some(b'{') {
        serde_json::from_slice(bytes).map_err(|e| ScenarioError::Syntax {
            format: "JSON",
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?
    } else {
        serde_yaml::from_slice(bytes).map_err(|e| {
            let (line, column) = e
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((0, 0));
            ScenarioError::Syntax {
                format: "YAML",
                line,
                column,
                message: e.to_string(),
            }
        })?
    };
    scenario_from_value(value)
}

fn typed<T: serde::de::DeserializeOwned>(path: &str, v: Value) -> Result<T, ScenarioError> {
    serde_json::from_value(v).map_err(|e| field_err(path, e.to_string()))
}

/// Rewrites `resource.k8s.io/v1beta2` to `v1` (same JSON shape) and rejects older versions.
fn normalise_api_version(path: &str, v: &mut Value) -> Result<(), ScenarioError> {
    if let Some(obj) = v.as_object_mut()
        && let Some(Value::String(av)) = obj.get("apiVersion")
    {
        match av.as_str() {
            "resource.k8s.io/v1" | "v1" => {}
            "resource.k8s.io/v1beta2" => {
                obj.insert(
                    "apiVersion".into(),
                    Value::String("resource.k8s.io/v1".into()),
                );
            }
            other => {
                return Err(field_err(
                    format!("{path}.apiVersion"),
                    format!("unsupported apiVersion {other:?} (use resource.k8s.io/v1 or v1beta2)"),
                ));
            }
        }
    }
    Ok(())
}

fn typed_list<T: serde::de::DeserializeOwned>(
    obj: &mut serde_json::Map<String, Value>,
    key: &str,
    prefix: &str,
) -> Result<Vec<T>, ScenarioError> {
    list(obj, key, prefix, normalise_api_version)
}

/// A list of objects of other API groups than resource.k8s.io (no version rewriting).
fn plain_list<T: serde::de::DeserializeOwned>(
    obj: &mut serde_json::Map<String, Value>,
    key: &str,
    prefix: &str,
) -> Result<Vec<T>, ScenarioError> {
    list(obj, key, prefix, |_, _| Ok(()))
}

/// The list under `key`, each item passed through `prepare` and typed; errors name the item.
fn list<T: serde::de::DeserializeOwned>(
    obj: &mut serde_json::Map<String, Value>,
    key: &str,
    prefix: &str,
    prepare: fn(&str, &mut Value) -> Result<(), ScenarioError>,
) -> Result<Vec<T>, ScenarioError> {
    let path_base = if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    };
    match obj.remove(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, mut item)| {
                let path = format!("{path_base}[{i}]");
                prepare(&path, &mut item)?;
                typed(&path, item)
            })
            .collect(),
        Some(_) => Err(field_err(path_base, "must be a list")),
    }
}

fn scenario_from_value(value: Value) -> Result<AllocationScenario, ScenarioError> {
    let Value::Object(mut obj) = value else {
        return Err(field_err("<root>", "a scenario must be an object"));
    };
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != API_VERSION
    {
        return Err(field_err(
            "apiVersion",
            format!("expected {API_VERSION:?}, got {av:?}"),
        ));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && kind != "AllocationScenario"
    {
        return Err(field_err(
            "kind",
            format!("expected \"AllocationScenario\", got {kind:?}"),
        ));
    }
    let mut s = AllocationScenario {
        name: obj
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        apply_api_defaults: true,
        ..Default::default()
    };
    if let Some(v) = obj.remove("semantics") {
        s.semantics = typed("semantics", v)?;
    }
    if !s.semantics.variant.is_empty() && s.semantics.variant != "incubating" {
        return Err(ScenarioError::Unsupported(format!(
            "semantics.variant {:?}: only \"incubating\" is implemented",
            s.semantics.variant
        )));
    }
    if let Some(v) = obj.remove("features") {
        s.features = typed("features", v)?;
    }
    if let Some(v) = obj.remove("cel") {
        s.cel = Some(typed("cel", v)?);
    }
    if let Some(v) = obj.remove("applyAPIDefaults") {
        s.apply_api_defaults = typed("applyAPIDefaults", v)?;
    }
    if let Some(v) = obj.remove("timeoutSeconds") {
        s.timeout_seconds = typed("timeoutSeconds", v)?;
    }
    if let Some(v) = obj.remove("stepBudget") {
        s.step_budget = typed("stepBudget", v)?;
    }
    if let Some(v) = obj.remove("mode") {
        s.mode = typed("mode", v)?;
    }
    if let Some(v) = obj.remove("pods") {
        s.pods = typed("pods", v)?;
    }
    if let Some(v) = obj.remove("firstFit") {
        s.first_fit = typed("firstFit", v)?;
    }
    if let Some(v) = obj.remove("packPartitions") {
        s.pack_partitions = typed("packPartitions", v)?;
    }
    s.nodes = typed_list(&mut obj, "nodes", "")?;
    s.device_classes = typed_list(&mut obj, "deviceClasses", "")?;
    s.resource_slices = typed_list(&mut obj, "resourceSlices", "")?;
    s.claims = typed_list(&mut obj, "claims", "")?;
    if let Some(v) = obj.remove("allocated") {
        let Value::Object(mut a) = v else {
            return Err(field_err("allocated", "must be an object"));
        };
        s.allocated.claims = typed_list(&mut a, "claims", "allocated")?;
        if let Some(st) = a.remove("state") {
            s.allocated.state = typed("allocated.state", st)?;
        }
    }
    if let Some(v) = obj.remove("podGroups") {
        let Value::Object(mut g) = v else {
            return Err(field_err("podGroups", "must be an object"));
        };
        s.pod_groups.groups = plain_list(&mut g, "groups", "podGroups")?;
        s.pod_groups.pods = plain_list(&mut g, "pods", "podGroups")?;
        s.pod_groups.claims = typed_list(&mut g, "claims", "podGroups")?;
        for (i, group) in s.pod_groups.groups.iter().enumerate() {
            if group.metadata.name.as_deref().unwrap_or("").is_empty() {
                return Err(field_err(
                    format!("podGroups.groups[{i}].metadata.name"),
                    "required",
                ));
            }
        }
    }
    s.expect = obj.remove("expect");
    for (i, n) in s.nodes.iter().enumerate() {
        if n.metadata.name.as_deref().unwrap_or("").is_empty() {
            return Err(field_err(format!("nodes[{i}].metadata.name"), "required"));
        }
    }
    for (i, c) in s.claims.iter().enumerate() {
        for (j, r) in c
            .spec
            .devices
            .iter()
            .flat_map(|d| d.requests.iter().flatten())
            .enumerate()
        {
            if r.exactly.is_none() && r.first_available.as_ref().is_none_or(Vec::is_empty) {
                return Err(field_err(
                    format!("claims[{i}].spec.devices.requests[{j}]"),
                    "unknown request type: one of exactly or firstAvailable must be set",
                ));
            }
        }
    }
    if s.mode == Mode::Schedule {
        let names: HashSet<String> = s.claims.iter().map(claim_key).collect();
        for (i, p) in s.pods.iter().enumerate() {
            for c in &p.claims {
                if !names.contains(c) {
                    return Err(field_err(
                        format!("pods[{i}].claims"),
                        format!("unknown claim {c:?}"),
                    ));
                }
            }
        }
    }
    Ok(s)
}

fn claim_key(c: &ResourceClaim) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

/// API defaulting of §5.1: `allocationMode` "" → ExactCount, ExactCount count 0 → 1, toleration
/// operator "" → Equal.
pub fn apply_api_defaults(claim: &mut ResourceClaim) {
    let Some(devices) = claim.spec.devices.as_mut() else {
        return;
    };
    for r in devices.requests.iter_mut().flatten() {
        if let Some(e) = r.exactly.as_mut() {
            if e.allocation_mode.as_deref().unwrap_or("").is_empty() {
                e.allocation_mode = Some("ExactCount".into());
            }
            if e.allocation_mode.as_deref() == Some("ExactCount") && e.count.unwrap_or(0) == 0 {
                e.count = Some(1);
            }
            for t in e.tolerations.iter_mut().flatten() {
                if t.operator.as_deref().unwrap_or("").is_empty() {
                    t.operator = Some("Equal".into());
                }
            }
        }
        for sub in r.first_available.iter_mut().flatten() {
            if sub.allocation_mode.as_deref().unwrap_or("").is_empty() {
                sub.allocation_mode = Some("ExactCount".into());
            }
            if sub.allocation_mode.as_deref() == Some("ExactCount") && sub.count.unwrap_or(0) == 0 {
                sub.count = Some(1);
            }
            for t in sub.tolerations.iter_mut().flatten() {
                if t.operator.as_deref().unwrap_or("").is_empty() {
                    t.operator = Some("Equal".into());
                }
            }
        }
    }
}

// ------------------------------------------------------------------------- outcome

/// `outcome` token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutcomeKind {
    Allocated,
    Unschedulable,
    UnschedulableOnNode,
    Timeout,
    Error,
}

/// Informational search statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub allocate_one_invocations: u64,
}

/// Informational timing of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTiming {
    pub allocate_nanos: u64,
}

/// The result of one allocation call on one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    pub node: String,
    pub outcome: OutcomeKind,
    #[serde(default)]
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<ErrorClass>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "go_results"
    )]
    pub results: Option<Vec<AllocationResult>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<NodeStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<NodeTiming>,
}

/// One pod of `mode: schedule`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodOutcome {
    pub pod: String,
    /// The chosen node (first node in `nodes` order that fits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub outcome: OutcomeKind,
    #[serde(default)]
    pub error: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "go_results"
    )]
    pub results: Option<Vec<AllocationResult>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_node: Vec<NodeOutcome>,
}

/// Prints allocation results the way Go's `encoding/json` does: fields that are `omitempty`
/// in the Go types and hold their zero value are left out ([`OmitEmpty`]), whoever built the
/// results.
fn go_results<S: serde::Serializer>(
    results: &Option<Vec<AllocationResult>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut results = results.clone();
    if let Some(r) = &mut results {
        r.omit_empty();
    }
    results.serialize(serializer)
}

/// Whole-run timing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunTiming {
    pub new_allocator_nanos: u64,
    pub total_nanos: u64,
}

/// The outcome (spec §5.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationOutcome {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub engine: String,
    #[serde(default)]
    pub per_node: Vec<NodeOutcome>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<RunTiming>,
}

/// Options of [`run_scenario_with`].
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Also compute an [`Explanation`] for every node where the claims do not fit.
    pub explain: bool,
    /// Draw shareIDs from a [`SeededShareIds`] sequence started at this seed (one sequence for
    /// the whole run), so that two runs with the same seed give identical outcomes. `None`:
    /// random UUIDs, as Go.
    pub share_id_seed: Option<u64>,
    /// Step budget per allocation call, instead of the scenario's `stepBudget`.
    pub step_budget: Option<u64>,
    /// Time limit per allocation call, instead of the scenario's `timeoutSeconds`.
    pub time_limit: Option<Duration>,
    /// The clock of the time limit (tests inject a fake one); `None`: the monotonic clock.
    pub clock: Option<Arc<dyn Clock>>,
}

fn elapsed_nanos(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn engine_name(s: &AllocationScenario) -> String {
    match s.semantics.semantics() {
        Semantics::GoCompat => format!(
            "devicelet-incubating@{}",
            s.semantics.compat.as_deref().unwrap_or("k8s-v1.36.1")
        ),
        Semantics::Fixed => "devicelet-incubating@fixed".to_string(),
    }
}

fn node_outcome(
    node: &Node,
    r: Result<Option<Vec<AllocationResult>>, AllocError>,
    steps: u64,
    nanos: u64,
) -> NodeOutcome {
    let name = node.metadata.name.clone().unwrap_or_default();
    let (outcome, error, error_class, results) = match r {
        Ok(Some(res)) => (OutcomeKind::Allocated, String::new(), None, Some(res)),
        Ok(None) => (OutcomeKind::Unschedulable, String::new(), None, None),
        Err(e) => {
            let kind = match e.class {
                ErrorClass::InvalidPools => OutcomeKind::UnschedulableOnNode,
                ErrorClass::Timeout => OutcomeKind::Timeout,
                _ => OutcomeKind::Error,
            };
            (kind, e.message, Some(e.class), None)
        }
    };
    NodeOutcome {
        node: name,
        outcome,
        error,
        error_class,
        results,
        stats: Some(NodeStats {
            allocate_one_invocations: steps,
        }),
        timing: Some(NodeTiming {
            allocate_nanos: nanos,
        }),
    }
}

fn allocated_state(s: &AllocationScenario) -> Result<AllocatedState, AllocError> {
    let bad = |e: crate::quantity::QuantityError| {
        AllocError::new(ErrorClass::InvalidInput, format!("allocated: {e}"))
    };
    let mut st = AllocatedState::default();
    for d in &s.allocated.state.devices {
        st.devices.insert(DeviceId {
            driver: d.driver.clone(),
            pool: d.pool.clone(),
            device: d.device.clone(),
        });
    }
    for d in &s.allocated.state.shared_devices {
        st.shared_devices.insert((
            DeviceId {
                driver: d.driver.clone(),
                pool: d.pool.clone(),
                device: d.device.clone(),
            },
            d.share_id.clone(),
        ));
    }
    for d in &s.allocated.state.consumed_capacity {
        let id = DeviceId {
            driver: d.driver.clone(),
            pool: d.pool.clone(),
            device: d.device.clone(),
        };
        let entry = st.consumed_capacity.entry(id).or_default();
        for (k, v) in &d.capacity {
            let q = Quantity::parse(v).map_err(bad)?;
            let slot = entry.entry(k.clone()).or_insert(Quantity::ZERO);
            *slot = slot.add(&q);
        }
    }
    for c in &s.allocated.claims {
        let results = c
            .status
            .as_ref()
            .and_then(|st| st.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten() {
            st.add_result(r, s.features.consumable_capacity)
                .map_err(bad)?;
        }
    }
    Ok(st)
}

/// Which search limits apply to each allocation call of a run (issue 19 item 4): a step
/// budget (deterministic), a time limit (the scheduler's way), or both.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_budget: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_limit_seconds: Option<f64>,
    /// In words, with where each limit comes from.
    pub description: String,
}

/// The search limits of a run (issue 19 item 4): explicit ones from the run options
/// (`devicelet allocate --step-budget/--timeout`) or the scenario (`stepBudget`,
/// `timeoutSeconds`), else the scheduler's Filter timeout ([`SCHEDULER_FILTER_TIMEOUT`]). A step
/// budget alone stays deterministic: no time limit is added to it.
pub fn search_limits(s: &AllocationScenario, opts: &RunOptions) -> SearchLimits {
    let scenario_time = s
        .timeout_seconds
        .filter(|t| *t > 0.0 && t.is_finite())
        .map(|t| Duration::from_secs_f64(t.min(1e9)));
    let (step_budget, step_source) = match (opts.step_budget, s.step_budget) {
        (Some(b), _) => (Some(b), "run options"),
        (None, Some(b)) => (Some(b), "scenario stepBudget"),
        (None, None) => (None, ""),
    };
    let (time_limit, time_source) = match (opts.time_limit, scenario_time) {
        (Some(t), _) => (Some(t), "run options"),
        (None, Some(t)) => (Some(t), "scenario timeoutSeconds"),
        (None, None) if step_budget.is_none() => (
            Some(SCHEDULER_FILTER_TIMEOUT),
            "default: the scheduler's DRA Filter timeout",
        ),
        (None, None) => (None, ""),
    };
    let mut parts = Vec::new();
    if let Some(t) = time_limit {
        parts.push(format!("time limit {t:?} ({time_source})"));
    }
    if let Some(b) = step_budget {
        parts.push(format!("step budget {b} search steps ({step_source})"));
    }
    SearchLimits {
        step_budget,
        time_limit_seconds: time_limit.map(|t| t.as_secs_f64()),
        description: format!("{} per allocation call", parts.join(" and ")),
    }
}

fn options_for(
    limits: &SearchLimits,
    clock: &Arc<dyn Clock>,
    share_ids: &Option<Arc<dyn ShareIdSource>>,
    pack_partitions: bool,
) -> AllocateOptions {
    AllocateOptions {
        step_budget: limits.step_budget,
        time_limit: limits.time_limit_seconds.map(|t| TimeLimit {
            limit: Duration::from_secs_f64(t),
            clock: Arc::clone(clock),
        }),
        share_ids: share_ids.clone(),
        pack_partitions,
        numa_node: None,
    }
}

/// Runs a scenario (spec §5).
pub fn run_scenario(s: &AllocationScenario) -> AllocationOutcome {
    run_scenario_with(s, &RunOptions::default()).0
}

/// Runs a scenario, optionally explaining every failed node.
pub fn run_scenario_with(
    s: &AllocationScenario,
    opts: &RunOptions,
) -> (AllocationOutcome, Option<Explanation>) {
    let total = Instant::now();
    let claims: Vec<ResourceClaim> = if s.apply_api_defaults {
        s.claims
            .iter()
            .cloned()
            .map(|mut c| {
                apply_api_defaults(&mut c);
                c
            })
            .collect()
    } else {
        s.claims.clone()
    };
    let semantics = s.semantics.semantics();
    let cache = Arc::new(SelectorCache::new(s.cel_features()));
    let mut outcome = AllocationOutcome {
        api_version: API_VERSION.to_string(),
        kind: "AllocationOutcome".to_string(),
        name: s.name.clone(),
        engine: engine_name(s),
        per_node: Vec::new(),
        pods: Vec::new(),
        timing: None,
    };
    let limits = search_limits(s, opts);
    let mut explanation = opts.explain.then(Explanation::default);
    let clock: Arc<dyn Clock> = match &opts.clock {
        Some(c) => Arc::clone(c),
        None => Arc::new(MonotonicClock::start()),
    };
    let share_ids = opts
        .share_id_seed
        .map(|seed| Arc::new(SeededShareIds::new(seed)) as Arc<dyn ShareIdSource>);
    let state = match allocated_state(s) {
        Ok(st) => st,
        Err(e) => {
            for n in &s.nodes {
                outcome.per_node.push(node_outcome(n, Err(e.clone()), 0, 0));
            }
            return (outcome, explanation);
        }
    };
    let mut new_allocator_nanos = 0;
    match s.mode {
        Mode::Allocate => {
            let t = Instant::now();
            let allocator = Allocator::with_snapshot(
                Arc::new(ClusterSnapshot::new(
                    &s.device_classes,
                    &s.resource_slices,
                    cache,
                )),
                s.features,
                semantics,
                &state,
            );
            new_allocator_nanos = elapsed_nanos(t);
            let refs: Vec<&ResourceClaim> = claims.iter().collect();
            for node in &s.nodes {
                let before = allocator.stats().allocate_one_invocations;
                let t = Instant::now();
                let r = allocator.allocate(
                    node,
                    &refs,
                    &options_for(&limits, &clock, &share_ids, s.pack_partitions),
                );
                let nanos = elapsed_nanos(t);
                let steps = allocator.stats().allocate_one_invocations - before;
                if let (Some(ex), Ok(None) | Err(_)) = (explanation.as_mut(), &r) {
                    ex.nodes
                        .push(explain_node(&allocator, node, &refs, r.as_ref().err()));
                }
                outcome.per_node.push(node_outcome(node, r, steps, nanos));
            }
        }
        Mode::Schedule => {
            // Slices and classes do not change between pods: prepare them once.
            let snapshot = Arc::new(ClusterSnapshot::new(
                &s.device_classes,
                &s.resource_slices,
                Arc::clone(&cache),
            ));
            // The allocated state is indexed once and kept current with each pod's results,
            // like the scheduler's incremental tracker.
            let mut index = Arc::new(AllocatedIndex::new(&snapshot, &state));
            let mut done: HashSet<String> = HashSet::new();
            for pod in &s.pods {
                let refs: Vec<&ResourceClaim> = pod
                    .claims
                    .iter()
                    .filter(|n| !done.contains(*n))
                    .filter_map(|n| claims.iter().find(|c| &claim_key(c) == n))
                    .collect();
                let t = Instant::now();
                let allocator = Allocator::with_index(
                    Arc::clone(&snapshot),
                    s.features,
                    semantics,
                    Arc::clone(&index),
                );
                new_allocator_nanos += elapsed_nanos(t);
                let mut record = PodOutcome {
                    pod: pod.name.clone(),
                    node: None,
                    outcome: OutcomeKind::Unschedulable,
                    error: String::new(),
                    results: None,
                    per_node: Vec::new(),
                };
                for node in &s.nodes {
                    let before = allocator.stats().allocate_one_invocations;
                    let t = Instant::now();
                    let r = allocator.allocate(
                        node,
                        &refs,
                        &options_for(&limits, &clock, &share_ids, s.pack_partitions),
                    );
                    let nanos = elapsed_nanos(t);
                    let steps = allocator.stats().allocate_one_invocations - before;
                    if let (Some(ex), Ok(None) | Err(_)) = (explanation.as_mut(), &r) {
                        let mut e = explain_node(&allocator, node, &refs, r.as_ref().err());
                        e.pod = Some(pod.name.clone());
                        ex.nodes.push(e);
                    }
                    let no = node_outcome(node, r, steps, nanos);
                    let success = no.outcome == OutcomeKind::Allocated;
                    if success && record.node.is_none() {
                        record.node = Some(no.node.clone());
                        record.outcome = OutcomeKind::Allocated;
                        record.results = no.results.clone();
                    } else if record.node.is_none()
                        && no.outcome == OutcomeKind::Error
                        && record.error.is_empty()
                    {
                        // A fatal error aborts the pod's scheduling attempt.
                        record.outcome = OutcomeKind::Error;
                        record.error = no.error.clone();
                    }
                    record.per_node.push(no);
                    if record.outcome == OutcomeKind::Error || (success && s.first_fit) {
                        break;
                    }
                }
                // The index is shared with the allocator: drop it so the update below does not
                // copy the index.
                drop(allocator);
                if let Some(results) = &record.results {
                    for (claim, result) in refs.iter().zip(results) {
                        done.insert(claim_key(claim));
                        for r in result
                            .devices
                            .iter()
                            .flat_map(|d| d.results.iter().flatten())
                        {
                            // Quantities come from our own canonical output: cannot fail.
                            let _ = Arc::make_mut(&mut index).add_result(
                                &snapshot,
                                r,
                                s.features.consumable_capacity,
                            );
                        }
                    }
                }
                outcome.pods.push(record);
            }
        }
    }
    outcome.timing = Some(RunTiming {
        new_allocator_nanos,
        total_nanos: elapsed_nanos(total),
    });
    (outcome, explanation)
}

// ------------------------------------------------------------------------- comparison

/// Result of comparing an actual outcome with an expected one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Rule violations (the case fails).
    pub mismatches: Vec<String>,
    /// Informational differences (e.g. invocation counts where `checkStats` is false).
    pub warnings: Vec<String>,
}

impl Comparison {
    /// No mismatch.
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Removes nulls, empty lists and empty objects (absent == null == empty), replaces shareIDs by
/// `share-<claim>-<result>` and turns consumedCapacity quantities into exact values.
pub fn normalise_results(results: &Value) -> Value {
    let mut v = results.clone();
    if let Value::Array(claims) = &mut v {
        for (ci, claim) in claims.iter_mut().enumerate() {
            let Some(list) = claim
                .pointer_mut("/devices/results")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for (ri, r) in list.iter_mut().enumerate() {
                let Some(obj) = r.as_object_mut() else {
                    continue;
                };
                if obj.get("shareID").is_some_and(|s| !s.is_null()) {
                    obj.insert("shareID".into(), Value::String(format!("share-{ci}-{ri}")));
                }
                if let Some(Value::Object(cc)) = obj.get_mut("consumedCapacity") {
                    for (_, q) in cc.iter_mut() {
                        if let Some(s) = q.as_str()
                            && let Ok(parsed) = Quantity::parse(s)
                        {
                            *q = Value::String(format!("{}n", parsed.nanos()));
                        }
                    }
                }
            }
        }
    }
    strip_empty(&mut v);
    v
}

fn strip_empty(v: &mut Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => {
            for x in a.iter_mut() {
                strip_empty(x);
            }
            a.is_empty()
        }
        Value::Object(o) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                let empty = o.get_mut(&k).is_some_and(strip_empty);
                if empty || k == "allocationTimestamp" {
                    o.remove(&k);
                }
            }
            o.is_empty()
        }
        _ => false,
    }
}

/// Compares per the corpus README: outcome strictly; results strictly and in order after
/// normalisation; errors by `errorPrefix` (and `errorClass` when given); invocation counts when
/// `checkStats` is true (a warning otherwise).
pub fn compare_outcome(expected: &Value, actual: &AllocationOutcome) -> Comparison {
    let mut cmp = Comparison::default();
    let actual_v = match serde_json::to_value(actual) {
        Ok(v) => v,
        Err(e) => {
            cmp.mismatches
                .push(format!("cannot serialise outcome: {e}"));
            return cmp;
        }
    };
    let check_stats = expected
        .get("checkStats")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let exp_nodes = expected
        .get("perNode")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let act_nodes = actual_v
        .get("perNode")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if exp_nodes.len() != act_nodes.len() {
        cmp.mismatches.push(format!(
            "perNode: expected {} entries, got {}",
            exp_nodes.len(),
            act_nodes.len()
        ));
    }
    for (e, a) in exp_nodes.iter().zip(act_nodes.iter()) {
        let node = e.get("node").and_then(Value::as_str).unwrap_or("?");
        if e.get("node") != a.get("node") {
            cmp.mismatches.push(format!(
                "node: expected {:?}, got {:?}",
                e.get("node"),
                a.get("node")
            ));
        }
        let eo = e.get("outcome").and_then(Value::as_str).unwrap_or("");
        let ao = a.get("outcome").and_then(Value::as_str).unwrap_or("");
        let aerr = a.get("error").and_then(Value::as_str).unwrap_or("");
        if eo != ao {
            cmp.mismatches.push(format!(
                "{node}: outcome: expected {eo}, got {ao} (error: {aerr:?})"
            ));
            continue;
        }
        match eo {
            "Allocated" => {
                let er = normalise_results(e.get("results").unwrap_or(&Value::Null));
                let ar = normalise_results(a.get("results").unwrap_or(&Value::Null));
                if er != ar {
                    cmp.mismatches.push(format!(
                        "{node}: results differ:\n  expected: {}\n  actual:   {}",
                        serde_json::to_string(&er).unwrap_or_default(),
                        serde_json::to_string(&ar).unwrap_or_default()
                    ));
                }
            }
            "Error" | "UnschedulableOnNode" | "Timeout" => {
                let prefix = e
                    .get("errorPrefix")
                    .and_then(Value::as_str)
                    .or_else(|| e.get("error").and_then(Value::as_str))
                    .unwrap_or("");
                if !aerr.starts_with(prefix) {
                    cmp.mismatches.push(format!(
                        "{node}: error: expected prefix {prefix:?}, got {aerr:?}"
                    ));
                }
                if let Some(class) = e.get("errorClass").and_then(Value::as_str) {
                    let aclass = a.get("errorClass").and_then(Value::as_str).unwrap_or("");
                    if class != aclass {
                        cmp.mismatches.push(format!(
                            "{node}: errorClass: expected {class}, got {aclass}"
                        ));
                    }
                }
                if let Some(contains) = e.get("errorContains").and_then(Value::as_str)
                    && !aerr.contains(contains)
                {
                    cmp.warnings.push(format!(
                        "{node}: error does not contain {contains:?} (CEL-library text)"
                    ));
                }
            }
            _ => {}
        }
        let es = e.pointer("/stats/allocateOneInvocations");
        let as_ = a.pointer("/stats/allocateOneInvocations");
        if es.is_some() && es != as_ {
            let msg = format!(
                "{node}: allocateOneInvocations: expected {:?}, got {:?}",
                es, as_
            );
            if check_stats {
                cmp.mismatches.push(msg);
            } else {
                cmp.warnings.push(msg);
            }
        }
    }
    cmp
}

// ------------------------------------------------------------------------- table

/// Renders an outcome as a plain-text table (`devicelet allocate -o table`).
pub fn render_outcome_table(o: &AllocationOutcome) -> String {
    let mut rows: Vec<[String; 6]> = vec![[
        "POD".into(),
        "NODE".into(),
        "OUTCOME".into(),
        "CLAIM".into(),
        "REQUEST".into(),
        "DEVICE / ERROR".into(),
    ]];
    let mut push_node = |pod: &str, n: &NodeOutcome| {
        let outcome = format!("{:?}", n.outcome);
        match &n.results {
            Some(results) if !results.is_empty() => {
                for (ci, r) in results.iter().enumerate() {
                    let devs = r.devices.as_ref().and_then(|d| d.results.as_ref());
                    if devs.is_none_or(Vec::is_empty) {
                        rows.push([
                            pod.into(),
                            n.node.clone(),
                            outcome.clone(),
                            format!("#{ci}"),
                            "-".into(),
                            "-".into(),
                        ]);
                    }
                    for d in devs.into_iter().flatten() {
                        let mut dev = format!("{}/{}/{}", d.driver, d.pool, d.device);
                        if let Some(cc) = &d.consumed_capacity {
                            let parts: Vec<String> =
                                cc.iter().map(|(k, v)| format!("{k}={}", v.0)).collect();
                            dev.push_str(&format!(" [{}]", parts.join(",")));
                        }
                        if d.admin_access == Some(true) {
                            dev.push_str(" (admin)");
                        }
                        rows.push([
                            pod.into(),
                            n.node.clone(),
                            outcome.clone(),
                            format!("#{ci}"),
                            d.request.clone(),
                            dev,
                        ]);
                    }
                }
            }
            _ => {
                let detail = if n.error.is_empty() {
                    "-".to_string()
                } else {
                    n.error.replace('\n', " ")
                };
                rows.push([
                    pod.into(),
                    n.node.clone(),
                    outcome,
                    "-".into(),
                    "-".into(),
                    detail,
                ]);
            }
        }
    };
    for n in &o.per_node {
        push_node("-", n);
    }
    for p in &o.pods {
        for n in &p.per_node {
            push_node(&p.pod, n);
        }
    }
    let mut widths = [0usize; 6];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i == 5 {
                line.push_str(c);
            } else {
                line.push_str(&format!("{:<w$}  ", c, w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Output formats of `devicelet allocate -o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Json,
    Yaml,
    Table,
}

/// An `-o` value that is not one of the [`OutputFormat`]s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown output format {0:?} (json, yaml or table)")]
pub struct UnknownOutputFormat(pub String);

impl std::str::FromStr for OutputFormat {
    type Err = UnknownOutputFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(OutputFormat::Json),
            "yaml" => Ok(OutputFormat::Yaml),
            "table" => Ok(OutputFormat::Table),
            other => Err(UnknownOutputFormat(other.to_owned())),
        }
    }
}

/// Why an outcome could not be rendered (the serializer's message).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// JSON encoding failed.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// YAML encoding failed.
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
}

/// Renders an outcome (and, if given, its explanation) for the CLI: the whole
/// `devicelet allocate` command is `parse_scenario` → `run_scenario_with` → this.
pub fn render_outcome(
    outcome: &AllocationOutcome,
    explanation: Option<&Explanation>,
    format: OutputFormat,
) -> Result<String, RenderError> {
    match format {
        OutputFormat::Json => {
            let mut v = serde_json::to_value(outcome)?;
            if let (Some(ex), Value::Object(o)) = (explanation, &mut v) {
                o.insert("explanation".into(), serde_json::to_value(ex)?);
            }
            Ok(serde_json::to_string_pretty(&v)?)
        }
        OutputFormat::Yaml => {
            let mut v = serde_json::to_value(outcome)?;
            if let (Some(ex), Value::Object(o)) = (explanation, &mut v) {
                o.insert("explanation".into(), serde_json::to_value(ex)?);
            }
            Ok(serde_yaml::to_string(&v)?)
        }
        OutputFormat::Table => {
            let mut out = render_outcome_table(outcome);
            if let Some(ex) = explanation {
                out.push('\n');
                out.push_str(&render_explanation_table(ex));
            }
            Ok(out)
        }
    }
}

/// Renders an explanation as text, one block per failed node.
pub fn render_explanation_table(ex: &Explanation) -> String {
    let mut out = String::new();
    for n in &ex.nodes {
        match &n.pod {
            Some(p) => out.push_str(&format!("pod {p}, node {}:\n", n.node)),
            None => out.push_str(&format!("node {}:\n", n.node)),
        }
        if let Some(e) = &n.error {
            out.push_str(&format!("  error: {}\n", e.replace('\n', " ")));
        }
        out.push_str(&format!("  pools visible: {}", n.pools));
        if !n.incomplete_pools.is_empty() {
            out.push_str(&format!(", incomplete: {}", n.incomplete_pools.join(", ")));
        }
        if !n.invalid_pools.is_empty() {
            out.push_str(&format!(", invalid: {}", n.invalid_pools.join("; ")));
        }
        out.push('\n');
        for r in &n.requests {
            out.push_str(&format!(
                "  claim {} request {} (class {}, {}): {} candidates",
                r.claim, r.request, r.device_class, r.wants, r.candidates
            ));
            let counts = [
                (
                    "rejected by selectors",
                    r.rejected_by_selector
                        .iter()
                        .map(|x| x.rejected)
                        .sum::<usize>(),
                ),
                (
                    "binding conditions unsupported",
                    r.binding_conditions_unsupported,
                ),
                ("not for this node", r.not_for_this_node),
                ("in use", r.in_use),
                (
                    "consume counters (feature off)",
                    r.consumes_counters_feature_off,
                ),
                ("lack requested capacity", r.lacks_requested_capacity),
                ("insufficient capacity", r.insufficient_capacity),
                ("insufficient counters", r.insufficient_counters),
                ("tainted", r.tainted),
                ("usable", r.usable),
            ];
            for (label, n) in counts {
                if n > 0 || label == "usable" {
                    out.push_str(&format!(", {n} {label}"));
                }
            }
            out.push('\n');
            for s in &r.rejected_by_selector {
                out.push_str(&format!(
                    "    {} rejected {}: {}\n",
                    s.selector, s.rejected, s.expression
                ));
            }
            for e in &r.selector_errors {
                out.push_str(&format!("    selector error: {}\n", e.replace('\n', " ")));
            }
            out.push_str(&format!("    => {}\n", r.verdict));
        }
        for c in &n.constraints {
            out.push_str(&format!(
                "  claim {} constraint #{} {}: {} devices without it, values {:?} => {}\n",
                c.claim, c.index, c.constraint, c.devices_without_attribute, c.values, c.verdict
            ));
        }
    }
    out
}
