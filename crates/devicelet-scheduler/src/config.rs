//! `devicelet scheduler --config FILE`: a KubeSchedulerConfiguration
//! (`kubescheduler.config.k8s.io/v1`) as kube-scheduler reads it
//! (`pkg/scheduler/apis/config/v1/types.go`, `defaults.go`, `validation/`; spec W127-W134).
//!
//! Every field of the v1 type is known. The ones this scheduler honours are applied; the
//! others are refused with the field named, never silently dropped (a configuration that asks
//! for preemption or pod affinity weights would otherwise be believed). Errors name the field
//! as a path (`profiles[0].pluginConfig[1].args.scoringStrategy.type`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// The configuration's `apiVersion`.
pub const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML/JSON, or a field of the wrong type or unknown (serde's message names the path).
    #[error("{0}")]
    Syntax(String),
    /// A field with a value kube-scheduler would refuse (its message).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// A valid field this scheduler does not implement.
    #[error("{field}: {message} (not supported by devicelet scheduler)")]
    Unsupported { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn unsupported(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Unsupported {
        field: field.into(),
        message: message.into(),
    }
}

/// How NodeResourcesFit scores a node (W113, W115).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoringStrategy {
    pub kind: StrategyKind,
    /// (resource, weight 1..=100), in order.
    pub resources: Vec<(String, i64)>,
}

/// `scoringStrategy.type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrategyKind {
    LeastAllocated,
    MostAllocated,
    /// The shape's points: (utilization 0..=100, score 0..=10), utilization increasing.
    RequestedToCapacityRatio(Vec<(i64, i64)>),
}

impl Default for ScoringStrategy {
    fn default() -> Self {
        ScoringStrategy {
            kind: StrategyKind::LeastAllocated,
            resources: vec![("cpu".to_owned(), 1), ("memory".to_owned(), 1)],
        }
    }
}

/// The score plugins this scheduler runs, with their weights (W112: TaintToleration 3,
/// NodeAffinity 2, NodeResourcesFit 1, DynamicResources 2, NodeResourcesBalancedAllocation 1,
/// PodTopologySpread 2, InterPodAffinity 2, ImageLocality 1 in 1.36.3). A weight of 0 means
/// disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreWeights {
    pub taint_toleration: i64,
    pub node_affinity: i64,
    pub node_resources_fit: i64,
    pub dynamic_resources: i64,
    pub balanced_allocation: i64,
    pub pod_topology_spread: i64,
    pub inter_pod_affinity: i64,
    pub image_locality: i64,
}

impl ScoreWeights {
    /// The weights in the order of a score breakdown (`framework::SCORE_PLUGINS`).
    pub fn in_score_order(&self) -> [i64; 8] {
        [
            self.taint_toleration,
            self.node_affinity,
            self.node_resources_fit,
            self.pod_topology_spread,
            self.inter_pod_affinity,
            self.dynamic_resources,
            self.balanced_allocation,
            self.image_locality,
        ]
    }

    /// Every score plugin disabled.
    pub fn none() -> Self {
        ScoreWeights {
            taint_toleration: 0,
            node_affinity: 0,
            node_resources_fit: 0,
            dynamic_resources: 0,
            balanced_allocation: 0,
            pod_topology_spread: 0,
            inter_pod_affinity: 0,
            image_locality: 0,
        }
    }

    /// Whether any score plugin runs (W108: without one the first feasible node is taken).
    pub fn scores(&self) -> bool {
        self.taint_toleration > 0
            || self.node_affinity > 0
            || self.node_resources_fit > 0
            || self.dynamic_resources > 0
            || self.balanced_allocation > 0
            || self.pod_topology_spread > 0
            || self.inter_pod_affinity > 0
            || self.image_locality > 0
    }
}

impl Default for ScoreWeights {
    fn default() -> Self {
        ScoreWeights {
            taint_toleration: 3,
            node_affinity: 2,
            node_resources_fit: 1,
            dynamic_resources: 2,
            balanced_allocation: 1,
            pod_topology_spread: 2,
            inter_pod_affinity: 2,
            image_locality: 1,
        }
    }
}

/// One profile (W131): the pods whose `spec.schedulerName` is `scheduler_name`. One process
/// serves every profile of its configuration from one cache and one queue, so two profiles never
/// race for a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub scheduler_name: String,
    /// The profile's `percentageOfNodesToScore`, else the global one (W108).
    pub percentage_of_nodes_to_score: Option<u32>,
    pub weights: ScoreWeights,
    pub scoring: ScoringStrategy,
    /// DynamicResourcesArgs `filterTimeout` (`None`: 0, no limit).
    pub filter_timeout: Option<Duration>,
    /// DynamicResourcesArgs `bindingTimeout`.
    pub binding_timeout: Option<Duration>,
    /// DynamicResourcesArgs `packPartitions`, devicelet's own: inside a node, partitions of
    /// devices already in use are tried first ([`devicelet_allocator::AllocateOptions`]).
    pub pack_partitions: bool,
    /// DynamicResourcesArgs `numaAlignment`, devicelet's own (default true): on a node that
    /// publishes its NUMA nodes' free CPUs and memory under a policy that refuses misaligned
    /// pods, a pod's devices go to a NUMA node that still has its exclusive CPUs
    /// ([`crate::numa`]).
    pub numa_alignment: bool,
    /// DefaultPreemption's args; `None` when `plugins.postFilter` disables it.
    pub preemption: Option<PreemptionArgs>,
    /// InterPodAffinityArgs.
    pub affinity: AffinityArgs,
    /// NodeResourcesBalancedAllocationArgs `resources` (cpu and memory by default).
    pub balanced_resources: Vec<String>,
    /// NodeAffinityArgs `addedAffinity`.
    pub added_affinity: Option<std::sync::Arc<crate::filters::node_affinity::AddedAffinity>>,
    /// PodTopologySpreadArgs: the constraints of pods without their own.
    pub spread_defaults: SpreadDefaults,
}

/// The constraints of pods without their own (PodTopologySpreadArgs `defaultConstraints` and
/// `defaultingType`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpreadDefaults {
    pub constraints: Vec<k8s_openapi::api::core::v1::TopologySpreadConstraint>,
    /// `defaultingType: System` (the default): nodes without a constraint's key are not
    /// ignored when scoring.
    pub system: bool,
}

// The constraint type has no floating-point field; k8s-openapi derives only `PartialEq`.
impl Eq for SpreadDefaults {}

impl Default for SpreadDefaults {
    /// The system defaults (`systemDefaultConstraints`).
    fn default() -> Self {
        let soft =
            |key: &str, max_skew: i32| k8s_openapi::api::core::v1::TopologySpreadConstraint {
                max_skew,
                topology_key: key.to_owned(),
                when_unsatisfiable: "ScheduleAnyway".to_owned(),
                ..k8s_openapi::api::core::v1::TopologySpreadConstraint::default()
            };
        SpreadDefaults {
            constraints: vec![
                soft("kubernetes.io/hostname", 3),
                soft("topology.kubernetes.io/zone", 5),
            ],
            system: true,
        }
    }
}

/// The plugin's args (`InterPodAffinityArgs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AffinityArgs {
    /// Weight of an existing pod's required affinity term that the incoming pod matches
    /// (0-100, default 1).
    pub hard_pod_affinity_weight: i64,
    /// Skip the score for a pod without preferred terms of its own (existing pods' preferred
    /// terms then count for nothing).
    pub ignore_preferred_terms_of_existing_pods: bool,
}

impl Default for AffinityArgs {
    fn default() -> Self {
        AffinityArgs {
            hard_pod_affinity_weight: 1,
            ignore_preferred_terms_of_existing_pods: false,
        }
    }
}

/// DefaultPreemptionArgs (W81): how many candidate nodes the dry run looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreemptionArgs {
    pub min_candidate_nodes_percentage: u32,
    pub min_candidate_nodes_absolute: u32,
}

impl Default for PreemptionArgs {
    fn default() -> Self {
        PreemptionArgs {
            min_candidate_nodes_percentage: 10,
            min_candidate_nodes_absolute: 100,
        }
    }
}

impl Profile {
    /// The default profile's plugins and args under `scheduler_name`.
    pub fn named(scheduler_name: &str) -> Self {
        Profile {
            scheduler_name: scheduler_name.to_owned(),
            percentage_of_nodes_to_score: None,
            weights: ScoreWeights::default(),
            scoring: ScoringStrategy::default(),
            filter_timeout: Some(devicelet_allocator::SCHEDULER_FILTER_TIMEOUT),
            binding_timeout: None,
            pack_partitions: false,
            numa_alignment: true,
            balanced_resources: vec!["cpu".to_owned(), "memory".to_owned()],
            added_affinity: None,
            preemption: Some(PreemptionArgs::default()),
            affinity: AffinityArgs::default(),
            spread_defaults: SpreadDefaults::default(),
        }
    }
}

/// `leaderElection` (W130).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElection {
    pub leader_elect: bool,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub namespace: String,
    /// `None`: the profile's scheduler name (a secondary scheduler must not contend for
    /// kube-scheduler's `kube-scheduler` Lease).
    pub name: Option<String>,
}

/// The client-side rate limit (client-go's token bucket).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientRate {
    pub qps: f64,
    pub burst: u32,
}

/// `clientConnection.contentType`: how the scheduler's writes are encoded. As in kube-scheduler
/// the default is protobuf; devicelet writes bindings and events in it (the other writes and
/// every read stay JSON: `devicelet_kube::protobuf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentType {
    #[default]
    Protobuf,
    Json,
}

impl ContentType {
    fn parse(value: Option<&str>) -> Result<Self, ConfigError> {
        match value.unwrap_or("") {
            "" | devicelet_kube::protobuf::PROTOBUF => Ok(ContentType::Protobuf),
            "application/json" => Ok(ContentType::Json),
            other => Err(invalid(
                "clientConnection.contentType",
                format!(
                    "{other:?}: supported values: \"{}\", \"application/json\"",
                    devicelet_kube::protobuf::PROTOBUF
                ),
            )),
        }
    }
}

/// A read and checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfiguration {
    pub percentage_of_nodes_to_score: Option<u32>,
    pub pod_initial_backoff: Duration,
    pub pod_max_backoff: Duration,
    pub kubeconfig: Option<PathBuf>,
    /// `clientConnection.qps` and `burst` when either is given (absent: no client-side limit,
    /// where kube-scheduler defaults to 50 and 100; the binder bounds its own concurrency).
    pub client_rate: Option<ClientRate>,
    /// `clientConnection.contentType` (`acceptContentTypes` is accepted and not used: reads
    /// are JSON).
    pub content_type: ContentType,
    pub leader_election: LeaderElection,
    pub profiles: Vec<Profile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    api_version: Option<String>,
    kind: Option<String>,
    parallelism: Option<i64>,
    percentage_of_nodes_to_score: Option<i64>,
    pod_initial_backoff_seconds: Option<i64>,
    pod_max_backoff_seconds: Option<i64>,
    enable_profiling: Option<bool>,
    enable_contention_profiling: Option<bool>,
    delay_cache_until_active: Option<bool>,
    client_connection: Option<RawClient>,
    leader_election: Option<RawLeader>,
    profiles: Option<Vec<RawProfile>>,
    extenders: Option<Vec<Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawClient {
    kubeconfig: Option<String>,
    accept_content_types: Option<String>,
    content_type: Option<String>,
    qps: Option<f64>,
    burst: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLeader {
    leader_elect: Option<bool>,
    lease_duration: Option<String>,
    renew_deadline: Option<String>,
    retry_period: Option<String>,
    resource_lock: Option<String>,
    resource_name: Option<String>,
    resource_namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProfile {
    scheduler_name: Option<String>,
    percentage_of_nodes_to_score: Option<i64>,
    plugins: Option<BTreeMap<String, RawPluginSet>>,
    plugin_config: Option<Vec<RawPluginConfig>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPluginSet {
    enabled: Option<Vec<RawPlugin>>,
    disabled: Option<Vec<RawPlugin>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPlugin {
    name: String,
    weight: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPluginConfig {
    name: String,
    args: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawFitArgs {
    api_version: Option<String>,
    kind: Option<String>,
    ignored_resources: Option<Vec<String>>,
    ignored_resource_groups: Option<Vec<String>>,
    scoring_strategy: Option<RawStrategy>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawStrategy {
    #[serde(rename = "type")]
    kind: Option<String>,
    resources: Option<Vec<RawPlugin>>,
    requested_to_capacity_ratio: Option<RawRatio>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRatio {
    shape: Option<Vec<RawPoint>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPoint {
    utilization: i64,
    score: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawDraArgs {
    api_version: Option<String>,
    kind: Option<String>,
    filter_timeout: Option<String>,
    binding_timeout: Option<String>,
    /// devicelet's own (kube-scheduler's strict decoding refuses it).
    pack_partitions: Option<bool>,
    /// devicelet's own, like `packPartitions`.
    numa_alignment: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawNodeAffinityArgs {
    api_version: Option<String>,
    kind: Option<String>,
    added_affinity: Option<k8s_openapi::api::core::v1::NodeAffinity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawBalancedArgs {
    api_version: Option<String>,
    kind: Option<String>,
    resources: Option<Vec<RawPlugin>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAffinityArgs {
    api_version: Option<String>,
    kind: Option<String>,
    hard_pod_affinity_weight: Option<i64>,
    ignore_preferred_terms_of_existing_pods: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSpreadArgs {
    api_version: Option<String>,
    kind: Option<String>,
    default_constraints: Option<Vec<k8s_openapi::api::core::v1::TopologySpreadConstraint>>,
    defaulting_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPreemptionArgs {
    api_version: Option<String>,
    kind: Option<String>,
    min_candidate_nodes_percentage: Option<i64>,
    min_candidate_nodes_absolute: Option<i64>,
}

/// The extension points of `plugins` (W132).
const EXTENSION_POINTS: &[&str] = &[
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "multiPoint",
    "placementGenerate",
    "placementScore",
];

/// The in-tree plugins outside the default profile: the workload gates' (W112) and
/// NodeDeclaredFeatures.
const OTHER_IN_TREE: &[&str] = &[
    "NodeDeclaredFeatures",
    "GangScheduling",
    "TopologyPlacementGenerator",
    "PodGroupPodsCount",
];

/// Whether `name` is an in-tree plugin.
fn in_tree(name: &str) -> bool {
    DEFAULT_PROFILE.contains(&name) || OTHER_IN_TREE.contains(&name)
}

/// The default profile's plugins (1.36.3 `getDefaultPlugins` with DynamicResources).
const DEFAULT_PROFILE: &[&str] = &[
    "SchedulingGates",
    "PrioritySort",
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "VolumeRestrictions",
    "NodeVolumeLimits",
    "VolumeBinding",
    "VolumeZone",
    "PodTopologySpread",
    "InterPodAffinity",
    "DynamicResources",
    "DefaultPreemption",
    "NodeResourcesBalancedAllocation",
    "ImageLocality",
    "DefaultBinder",
];

/// Score plugins of the default profile this scheduler does not run: a configuration may
/// disable them (a no-op here) but not enable or weigh them.
const UNSCORED: &[&str] = &["VolumeBinding", "PodGroupPodsCount"];

/// Parses and checks a KubeSchedulerConfiguration (YAML or JSON).
pub fn parse(text: &str) -> Result<SchedulerConfiguration, ConfigError> {
    let raw: RawConfig =
        serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    match raw.api_version.as_deref() {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(invalid(
                "apiVersion",
                format!("{other:?}: expected {API_VERSION:?}"),
            ));
        }
        None => return Err(invalid("apiVersion", format!("required ({API_VERSION:?})"))),
    }
    if raw.kind.as_deref() != Some("KubeSchedulerConfiguration") {
        return Err(invalid(
            "kind",
            format!(
                "{:?}: expected \"KubeSchedulerConfiguration\"",
                raw.kind.unwrap_or_default()
            ),
        ));
    }
    if let Some(p) = raw.parallelism
        && p <= 0
    {
        return Err(invalid(
            "parallelism",
            "should be an integer value greater than zero",
        ));
    }
    let _ = (raw.enable_profiling, raw.enable_contention_profiling);
    if raw.delay_cache_until_active == Some(true) {
        return Err(unsupported(
            "delayCacheUntilActive",
            "caches are filled before the Lease is won",
        ));
    }
    if raw.extenders.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(unsupported("extenders", "scheduler extenders"));
    }
    let percentage = percentage("percentageOfNodesToScore", raw.percentage_of_nodes_to_score)?;
    let initial = raw.pod_initial_backoff_seconds.unwrap_or(1);
    if initial <= 0 {
        return Err(invalid(
            "podInitialBackoffSeconds",
            "must be greater than 0",
        ));
    }
    let max = raw.pod_max_backoff_seconds.unwrap_or(10);
    if max < initial {
        return Err(invalid(
            "podMaxBackoffSeconds",
            "must be greater than or equal to PodInitialBackoffSeconds",
        ));
    }
    let client = raw.client_connection.unwrap_or(RawClient {
        kubeconfig: None,
        accept_content_types: None,
        content_type: None,
        qps: None,
        burst: None,
    });
    let _ = client.accept_content_types;
    let content_type = ContentType::parse(client.content_type.as_deref())?;
    let client_rate = client_rate(client.qps, client.burst)?;
    let leader_election = leader_election(raw.leader_election)?;
    let mut profiles = Vec::new();
    let raw_profiles = raw.profiles.unwrap_or_default();
    for (i, p) in raw_profiles.into_iter().enumerate() {
        profiles.push(profile(i, p)?);
    }
    if profiles.is_empty() {
        profiles.push(Profile::named(DEFAULT_SCHEDULER_NAME));
    }
    for p in &mut profiles {
        // W108: the profile's percentage, else the global one.
        p.percentage_of_nodes_to_score = p.percentage_of_nodes_to_score.or(percentage);
    }
    // One process allocates with one DRA Filter bound and one binding timeout.
    for (i, p) in profiles.iter().enumerate().skip(1) {
        let first = &profiles[0];
        // `numaAlignment` may differ: each profile's own is read per cycle.
        let dra = |p: &Profile| (p.filter_timeout, p.binding_timeout, p.pack_partitions);
        if dra(p) != dra(first) {
            return Err(unsupported(
                format!("profiles[{i}].pluginConfig"),
                "DynamicResources args that differ from profiles[0]'s: one process has one \
                 filterTimeout, bindingTimeout and packPartitions",
            ));
        }
    }
    for (i, p) in profiles.iter().enumerate() {
        if profiles[..i]
            .iter()
            .any(|q| q.scheduler_name == p.scheduler_name)
        {
            return Err(invalid(
                format!("profiles[{i}].schedulerName"),
                format!("Duplicate value: {:?}", p.scheduler_name),
            ));
        }
    }
    Ok(SchedulerConfiguration {
        percentage_of_nodes_to_score: percentage,
        pod_initial_backoff: Duration::from_secs(initial as u64),
        pod_max_backoff: Duration::from_secs(max as u64),
        kubeconfig: client
            .kubeconfig
            .filter(|k| !k.is_empty())
            .map(PathBuf::from),
        client_rate,
        content_type,
        leader_election,
        profiles,
    })
}

/// kube-scheduler's defaulting: a qps or burst of 0 is 50 or 100.
fn client_rate(qps: Option<f64>, burst: Option<i64>) -> Result<Option<ClientRate>, ConfigError> {
    if qps.is_none() && burst.is_none() {
        return Ok(None);
    }
    let qps = qps.unwrap_or(0.0);
    if !qps.is_finite() {
        return Err(invalid("clientConnection.qps", "must be a number"));
    }
    // client-go: a negative qps turns the client-side limit off.
    if qps < 0.0 {
        return Ok(None);
    }
    let burst = u32::try_from(burst.unwrap_or(0))
        .map_err(|_| invalid("clientConnection.burst", "must be zero or positive"))?;
    Ok(Some(ClientRate {
        qps: if qps == 0.0 { 50.0 } else { qps },
        burst: if burst == 0 { 100 } else { burst },
    }))
}

fn percentage(field: &str, value: Option<i64>) -> Result<Option<u32>, ConfigError> {
    match value {
        None => Ok(None),
        Some(v) if (0..=100).contains(&v) => Ok(Some(v as u32)),
        Some(v) => Err(invalid(field, format!("{v}: not in valid range [0-100]"))),
    }
}

fn duration(
    field: &str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(s) => go_duration(&s)
            .ok_or_else(|| invalid(field, format!("{s:?}: not a duration (e.g. 15s, 1m30s)"))),
    }
}

/// A Go duration (`metav1.Duration`): a sequence of decimal numbers with units ns, us (µs),
/// ms, s, m, h, e.g. `1m30s`, `1.5h`; `0` alone is zero. Negative durations are refused.
pub fn go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&e| e > 0)?;
        let value: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).ok()
}

fn leader_election(raw: Option<RawLeader>) -> Result<LeaderElection, ConfigError> {
    let raw = raw.unwrap_or(RawLeader {
        leader_elect: None,
        lease_duration: None,
        renew_deadline: None,
        retry_period: None,
        resource_lock: None,
        resource_name: None,
        resource_namespace: None,
    });
    if let Some(lock) = raw.resource_lock.as_deref()
        && lock != "leases"
    {
        return Err(invalid(
            "leaderElection.resourceLock",
            "resourceLock value must be \"leases\"",
        ));
    }
    let le = LeaderElection {
        leader_elect: raw.leader_elect.unwrap_or(true),
        lease_duration: duration(
            "leaderElection.leaseDuration",
            raw.lease_duration,
            crate::leader::LEASE_DURATION,
        )?,
        renew_deadline: duration(
            "leaderElection.renewDeadline",
            raw.renew_deadline,
            crate::leader::RENEW_DEADLINE,
        )?,
        retry_period: duration(
            "leaderElection.retryPeriod",
            raw.retry_period,
            crate::leader::RETRY_PERIOD,
        )?,
        namespace: raw
            .resource_namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| crate::leader::NAMESPACE.to_owned()),
        name: raw.resource_name.filter(|n| !n.is_empty()),
    };
    if le.leader_elect {
        // client-go's leaderelection checks.
        if le.lease_duration <= le.renew_deadline {
            return Err(invalid(
                "leaderElection.leaseDuration",
                "must be greater than renewDeadline",
            ));
        }
        if le.renew_deadline <= le.retry_period {
            return Err(invalid(
                "leaderElection.renewDeadline",
                "must be greater than retryPeriod",
            ));
        }
        if le.retry_period.is_zero() {
            return Err(invalid(
                "leaderElection.retryPeriod",
                "must be greater than zero",
            ));
        }
    }
    Ok(le)
}

/// The scheduler name of a pod or profile that names none.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// A pod's `spec.schedulerName`, or the default.
pub fn scheduler_name_of(pod: &k8s_openapi::api::core::v1::Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or(DEFAULT_SCHEDULER_NAME)
}

fn profile(i: usize, raw: RawProfile) -> Result<Profile, ConfigError> {
    let at = |f: &str| format!("profiles[{i}].{f}");
    let scheduler_name = raw
        .scheduler_name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.to_owned());
    let mut p = Profile::named(&scheduler_name);
    p.percentage_of_nodes_to_score = percentage(
        &at("percentageOfNodesToScore"),
        raw.percentage_of_nodes_to_score,
    )?;
    for (point, set) in raw.plugins.unwrap_or_default() {
        let field = at(&format!("plugins.{point}"));
        if !EXTENSION_POINTS.contains(&point.as_str()) {
            return Err(ConfigError::Syntax(format!(
                "{field}: unknown extension point (one of {})",
                EXTENSION_POINTS.join(", ")
            )));
        }
        plugin_set(&field, &point, set, &mut p)?;
    }
    let mut seen = Vec::new();
    for (j, pc) in raw
        .plugin_config
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let field = at(&format!("pluginConfig[{j}]"));
        if seen.contains(&pc.name) {
            return Err(invalid(
                format!("{field}.name"),
                format!("Duplicate value: {:?}", pc.name),
            ));
        }
        seen.push(pc.name.clone());
        plugin_args(&field, pc, &mut p)?;
    }
    Ok(p)
}

/// The weight slot of a score plugin this scheduler runs.
fn score_weight_mut<'w>(weights: &'w mut ScoreWeights, name: &str) -> Option<&'w mut i64> {
    Some(match name {
        "TaintToleration" => &mut weights.taint_toleration,
        "NodeAffinity" => &mut weights.node_affinity,
        "NodeResourcesFit" => &mut weights.node_resources_fit,
        "NodeResourcesBalancedAllocation" => &mut weights.balanced_allocation,
        "DynamicResources" => &mut weights.dynamic_resources,
        "PodTopologySpread" => &mut weights.pod_topology_spread,
        "InterPodAffinity" => &mut weights.inter_pod_affinity,
        "ImageLocality" => &mut weights.image_locality,
        _ => return None,
    })
}

/// Plugins of the default profile that only score: `multiPoint` may disable them.
const SCORE_ONLY: &[&str] = &["NodeResourcesBalancedAllocation", "ImageLocality"];

/// W132: the enabled and disabled plugins of one extension point. `multiPoint` (W112: every
/// extension point a plugin implements) sets score weights and may re-enable the default
/// profile's plugins; it may disable only what disabling at `score` or `postFilter` can.
fn plugin_set(
    field: &str,
    point: &str,
    set: RawPluginSet,
    profile: &mut Profile,
) -> Result<(), ConfigError> {
    let multi = point == "multiPoint";
    let fixed = |f: &str, what: &str, name: &str| {
        unsupported(
            f,
            format!("{what} {name} at {point}: this scheduler's {point} plugins are fixed"),
        )
    };
    for (k, plugin) in set.disabled.iter().flatten().enumerate() {
        let f = format!("{field}.disabled[{k}]");
        let name = plugin.name.as_str();
        if name != "*" && !in_tree(name) {
            return Err(unsupported(&f, format!("unknown plugin {name:?}")));
        }
        match point {
            "score" if name == "*" => profile.weights = ScoreWeights::none(),
            "score" => {
                // A plugin not run here: disabling it changes nothing.
                if let Some(w) = score_weight_mut(&mut profile.weights, name) {
                    *w = 0;
                }
            }
            "multiPoint" if SCORE_ONLY.contains(&name) => {
                if let Some(w) = score_weight_mut(&mut profile.weights, name) {
                    *w = 0;
                }
            }
            // DefaultPreemption is the one PostFilter that can be switched off (the DRA
            // plugin's runs with its filters).
            "postFilter" if matches!(name, "*" | "DefaultPreemption") => profile.preemption = None,
            "multiPoint" if name == "DefaultPreemption" => profile.preemption = None,
            _ => return Err(fixed(&f, "disabling", name)),
        }
    }
    for (k, plugin) in set.enabled.iter().flatten().enumerate() {
        let f = format!("{field}.enabled[{k}]");
        let name = plugin.name.as_str();
        if !in_tree(name) {
            return Err(unsupported(
                &f,
                format!("unknown plugin {name:?} (out-of-tree plugins)"),
            ));
        }
        if (point == "postFilter" || multi) && name == "DefaultPreemption" {
            profile
                .preemption
                .get_or_insert_with(PreemptionArgs::default);
            continue;
        }
        if point != "score" && !multi {
            return Err(fixed(&f, "enabling", name));
        }
        let weight = match plugin.weight {
            None | Some(0) => 1,
            Some(w) if w > 0 => w,
            Some(w) => {
                return Err(invalid(
                    format!("{f}.weight"),
                    format!("{w}: must be positive"),
                ));
            }
        };
        match score_weight_mut(&mut profile.weights, name) {
            Some(w) => *w = weight,
            None if UNSCORED.contains(&name) && plugin.weight.is_some() => {
                return Err(unsupported(&f, format!("the {name} score")));
            }
            // Already part of every profile here (its filter, its queue sort, its binder).
            None if multi && DEFAULT_PROFILE.contains(&name) => {}
            None if multi => return Err(fixed(&f, "enabling", name)),
            None if UNSCORED.contains(&name) => {
                return Err(unsupported(&f, format!("the {name} score")));
            }
            None => return Err(invalid(&f, format!("{name} is not a score plugin"))),
        }
    }
    Ok(())
}

/// W133: the args of one plugin.
fn plugin_args(field: &str, pc: RawPluginConfig, p: &mut Profile) -> Result<(), ConfigError> {
    let args = pc.args.unwrap_or(Value::Object(Default::default()));
    let decode = |what: &str| -> Result<Value, ConfigError> {
        if let Some(kind) = args.get("kind").and_then(Value::as_str)
            && kind != what
        {
            return Err(invalid(
                format!("{field}.args"),
                format!("has to match plugin args: {kind:?} is not {what:?}"),
            ));
        }
        Ok(args.clone())
    };
    let syntax = |e: serde_json::Error| ConfigError::Syntax(format!("{field}.args: {e}"));
    match pc.name.as_str() {
        "NodeResourcesFit" => {
            let raw: RawFitArgs =
                serde_json::from_value(decode("NodeResourcesFitArgs")?).map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            if raw.ignored_resources.is_some_and(|v| !v.is_empty())
                || raw.ignored_resource_groups.is_some_and(|v| !v.is_empty())
            {
                return Err(unsupported(
                    format!("{field}.args.ignoredResources"),
                    "ignored resources",
                ));
            }
            if let Some(s) = raw.scoring_strategy {
                p.scoring = strategy(&format!("{field}.args.scoringStrategy"), s)?;
            }
        }
        "DynamicResources" => {
            let raw: RawDraArgs =
                serde_json::from_value(decode("DynamicResourcesArgs")?).map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            if let Some(t) = raw.filter_timeout {
                let d = duration(
                    &format!("{field}.args.filterTimeout"),
                    Some(t),
                    Duration::ZERO,
                )?;
                p.filter_timeout = (!d.is_zero()).then_some(d);
            }
            if let Some(t) = raw.binding_timeout {
                let d = duration(
                    &format!("{field}.args.bindingTimeout"),
                    Some(t),
                    Duration::ZERO,
                )?;
                if d < Duration::from_secs(1) {
                    return Err(invalid(
                        format!("{field}.args.bindingTimeout"),
                        "must be at least 1 second",
                    ));
                }
                p.binding_timeout = Some(d);
            }
            if let Some(pack) = raw.pack_partitions {
                p.pack_partitions = pack;
            }
            if let Some(numa) = raw.numa_alignment {
                p.numa_alignment = numa;
            }
        }
        "NodeAffinity" => {
            let raw: RawNodeAffinityArgs =
                serde_json::from_value(decode("NodeAffinityArgs")?).map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            if let Some(added) = raw.added_affinity {
                let added = crate::filters::node_affinity::AddedAffinity::new(added)
                    .map_err(|e| invalid(format!("{field}.args.addedAffinity"), e))?;
                p.added_affinity = Some(std::sync::Arc::new(added));
            }
        }
        "NodeResourcesBalancedAllocation" => {
            let raw: RawBalancedArgs =
                serde_json::from_value(decode("NodeResourcesBalancedAllocationArgs")?)
                    .map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            if let Some(resources) = raw.resources {
                let mut names: Vec<String> = Vec::new();
                for (k, r) in resources.into_iter().enumerate() {
                    let at = format!("{field}.args.resources[{k}]");
                    if names.contains(&r.name) {
                        return Err(invalid(
                            format!("{at}.name"),
                            format!("Duplicate value: {:?}", r.name),
                        ));
                    }
                    // Upstream's defaulting (0 is 1) and validation: the resources are
                    // balanced, not weighed.
                    if !matches!(r.weight, None | Some(0) | Some(1)) {
                        return Err(invalid(format!("{at}.weight"), "must be 1"));
                    }
                    names.push(r.name);
                }
                // Upstream's defaulting: an empty list is cpu and memory.
                if !names.is_empty() {
                    p.balanced_resources = names;
                }
            }
        }
        "InterPodAffinity" => {
            let raw: RawAffinityArgs =
                serde_json::from_value(decode("InterPodAffinityArgs")?).map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            if let Some(w) = raw.hard_pod_affinity_weight {
                if !(0..=100).contains(&w) {
                    return Err(invalid(
                        format!("{field}.args.hardPodAffinityWeight"),
                        format!("{w}: not in valid range [0, 100]"),
                    ));
                }
                p.affinity.hard_pod_affinity_weight = w;
            }
            if let Some(b) = raw.ignore_preferred_terms_of_existing_pods {
                p.affinity.ignore_preferred_terms_of_existing_pods = b;
            }
        }
        "PodTopologySpread" => {
            let raw: RawSpreadArgs =
                serde_json::from_value(decode("PodTopologySpreadArgs")?).map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            let constraints = raw.default_constraints.unwrap_or_default();
            let f = format!("{field}.args.defaultConstraints");
            for (i, c) in constraints.iter().enumerate() {
                if c.max_skew <= 0 {
                    return Err(invalid(
                        format!("{f}[{i}].maxSkew"),
                        format!("{}: must be greater than zero", c.max_skew),
                    ));
                }
                if c.topology_key.is_empty() {
                    return Err(invalid(format!("{f}[{i}].topologyKey"), "can not be empty"));
                }
                if !matches!(
                    c.when_unsatisfiable.as_str(),
                    "DoNotSchedule" | "ScheduleAnyway"
                ) {
                    return Err(invalid(
                        format!("{f}[{i}].whenUnsatisfiable"),
                        format!(
                            "{:?}: supported values: \"DoNotSchedule\", \"ScheduleAnyway\"",
                            c.when_unsatisfiable
                        ),
                    ));
                }
                if c.label_selector.is_some() {
                    return Err(invalid(
                        format!("{f}[{i}].labelSelector"),
                        "constraint must not define a selector, as they deduced for each pod",
                    ));
                }
                if constraints[..i].iter().any(|o| {
                    o.topology_key == c.topology_key && o.when_unsatisfiable == c.when_unsatisfiable
                }) {
                    return Err(invalid(
                        format!("{f}[{i}]"),
                        format!(
                            "Duplicate value: {{{:?}, {:?}}}",
                            c.topology_key, c.when_unsatisfiable
                        ),
                    ));
                }
            }
            p.spread_defaults = match raw.defaulting_type.as_deref() {
                None | Some("System") if constraints.is_empty() => SpreadDefaults::default(),
                None | Some("System") => {
                    return Err(invalid(f, "must be empty for \"System\" defaultingType"));
                }
                Some("List") => SpreadDefaults {
                    constraints,
                    system: false,
                },
                Some(other) => {
                    return Err(invalid(
                        format!("{field}.args.defaultingType"),
                        format!("{other:?}: supported values: \"System\", \"List\""),
                    ));
                }
            };
        }
        "DefaultPreemption" => {
            let raw: RawPreemptionArgs =
                serde_json::from_value(decode("DefaultPreemptionArgs")?).map_err(syntax)?;
            let _ = (raw.api_version, raw.kind);
            let defaults = PreemptionArgs::default();
            let percentage = raw
                .min_candidate_nodes_percentage
                .unwrap_or(defaults.min_candidate_nodes_percentage.into());
            let absolute = raw
                .min_candidate_nodes_absolute
                .unwrap_or(defaults.min_candidate_nodes_absolute.into());
            if !(0..=100).contains(&percentage) {
                return Err(invalid(
                    format!("{field}.args.minCandidateNodesPercentage"),
                    format!("{percentage}: not in valid range [0, 100]"),
                ));
            }
            let absolute = u32::try_from(absolute).map_err(|_| {
                invalid(
                    format!("{field}.args.minCandidateNodesAbsolute"),
                    format!("{absolute}: not in valid range [0, inf)"),
                )
            })?;
            if percentage == 0 && absolute == 0 {
                return Err(invalid(
                    format!("{field}.args"),
                    "both minCandidateNodesPercentage and minCandidateNodesAbsolute cannot be zero",
                ));
            }
            // Args for a plugin the profile disabled are kept for nothing, as upstream.
            if p.preemption.is_some() {
                p.preemption = Some(PreemptionArgs {
                    min_candidate_nodes_percentage: percentage as u32,
                    min_candidate_nodes_absolute: absolute,
                });
            }
        }
        name if in_tree(name) => {
            return Err(unsupported(
                format!("{field}.args"),
                format!("arguments of {name}"),
            ));
        }
        // W127: args of out-of-tree plugins pass through; there are none here to use them.
        name => {
            return Err(unsupported(
                format!("{field}.name"),
                format!("unknown plugin {name:?} (out-of-tree plugins)"),
            ));
        }
    }
    Ok(())
}

/// W115: NodeResourcesFit's `scoringStrategy`.
fn strategy(field: &str, raw: RawStrategy) -> Result<ScoringStrategy, ConfigError> {
    let mut resources = Vec::new();
    for (k, r) in raw.resources.unwrap_or_default().into_iter().enumerate() {
        let weight = match r.weight {
            None | Some(0) => 1,
            Some(w) if (1..=100).contains(&w) => w,
            Some(w) => {
                return Err(invalid(
                    format!("{field}.resources[{k}].weight"),
                    format!("resource weight of {w} not in valid range (0, 100]"),
                ));
            }
        };
        resources.push((r.name, weight));
    }
    if resources.is_empty() {
        resources = ScoringStrategy::default().resources;
    }
    let kind = match raw.kind.as_deref().unwrap_or("LeastAllocated") {
        "LeastAllocated" | "MostAllocated" if raw.requested_to_capacity_ratio.is_some() => {
            return Err(invalid(
                format!("{field}.requestedToCapacityRatio"),
                "must be nil when type is not RequestedToCapacityRatio",
            ));
        }
        "LeastAllocated" => StrategyKind::LeastAllocated,
        "MostAllocated" => StrategyKind::MostAllocated,
        "RequestedToCapacityRatio" => {
            let shape = raw
                .requested_to_capacity_ratio
                .ok_or_else(|| {
                    invalid(
                        format!("{field}.requestedToCapacityRatio"),
                        "must be specified when type is RequestedToCapacityRatio",
                    )
                })?
                .shape
                .unwrap_or_default();
            if shape.is_empty() {
                return Err(invalid(
                    format!("{field}.requestedToCapacityRatio.shape"),
                    "at least one point must be specified",
                ));
            }
            let mut points = Vec::new();
            for (k, pt) in shape.iter().enumerate() {
                let f = format!("{field}.requestedToCapacityRatio.shape[{k}]");
                if !(0..=100).contains(&pt.utilization) {
                    return Err(invalid(
                        format!("{f}.utilization"),
                        format!("{}: not in valid range [0, 100]", pt.utilization),
                    ));
                }
                if k > 0 && pt.utilization <= shape[k - 1].utilization {
                    return Err(invalid(
                        format!("{f}.utilization"),
                        "values must be sorted in increasing order",
                    ));
                }
                if !(0..=10).contains(&pt.score) {
                    return Err(invalid(
                        format!("{f}.score"),
                        format!("{}: not in valid range [0, 10]", pt.score),
                    ));
                }
                points.push((pt.utilization, pt.score));
            }
            StrategyKind::RequestedToCapacityRatio(points)
        }
        other => {
            return Err(invalid(
                format!("{field}.type"),
                format!(
                    "{other:?}: supported values: \"LeastAllocated\", \"MostAllocated\", \
                     \"RequestedToCapacityRatio\""
                ),
            ));
        }
    };
    Ok(ScoringStrategy { kind, resources })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";

    fn parse_with(body: &str) -> Result<SchedulerConfiguration, ConfigError> {
        parse(&format!("{HEADER}{body}"))
    }

    #[test]
    fn client_connection_content_type_is_protobuf_unless_json_is_asked() {
        assert_eq!(
            parse_with("").expect("empty").content_type,
            ContentType::Protobuf
        );
        let json = parse_with("clientConnection:\n  contentType: application/json\n");
        assert_eq!(json.expect("json").content_type, ContentType::Json);
        let pb = parse_with(
            "clientConnection:\n  contentType: application/vnd.kubernetes.protobuf\n  acceptContentTypes: application/json\n",
        );
        assert_eq!(pb.expect("protobuf").content_type, ContentType::Protobuf);
        let bad = parse_with("clientConnection:\n  contentType: application/yaml\n")
            .expect_err("yaml is refused")
            .to_string();
        assert!(
            bad.contains("clientConnection.contentType") && bad.contains("application/yaml"),
            "{bad}"
        );
    }

    #[test]
    fn w128_w130_w131_defaults() {
        let c = parse_with("").expect("empty config");
        assert_eq!(c.pod_initial_backoff, Duration::from_secs(1));
        assert_eq!(c.pod_max_backoff, Duration::from_secs(10));
        assert_eq!(c.client_rate, None, "no client-side limit unless asked");
        let c = parse_with("clientConnection: {qps: 0, burst: 7}\n").expect("rate");
        assert_eq!(
            c.client_rate,
            Some(ClientRate {
                qps: 50.0,
                burst: 7
            })
        );
        let off = parse_with("clientConnection: {qps: -1}\n").expect("negative qps");
        assert_eq!(off.client_rate, None, "client-go: no limit");
        assert!(c.leader_election.leader_elect);
        assert_eq!(c.leader_election.namespace, "kube-system");
        assert_eq!(c.leader_election.lease_duration, Duration::from_secs(15));
        assert_eq!(c.profiles.len(), 1);
        let p = &c.profiles[0];
        assert_eq!(p.scheduler_name, "default-scheduler");
        assert_eq!(p.weights, ScoreWeights::default());
        assert_eq!(p.scoring, ScoringStrategy::default());
        assert_eq!(p.filter_timeout, Some(Duration::from_secs(10)));
        assert_eq!(p.preemption, Some(PreemptionArgs::default()));
    }

    #[test]
    fn w81_default_preemption_args_and_switching_it_off() {
        let c = parse_with(
            "profiles:\n- schedulerName: a\n  pluginConfig:\n  - name: DefaultPreemption\n    args: {minCandidateNodesPercentage: 0, minCandidateNodesAbsolute: 5}\n- schedulerName: b\n  plugins:\n    postFilter:\n      disabled: [{name: DefaultPreemption}]\n",
        )
        .expect("valid");
        assert_eq!(
            c.profiles[0].preemption,
            Some(PreemptionArgs {
                min_candidate_nodes_percentage: 0,
                min_candidate_nodes_absolute: 5
            })
        );
        assert_eq!(c.profiles[1].preemption, None);
        let both_zero = parse_with(
            "profiles: [{pluginConfig: [{name: DefaultPreemption, args: {minCandidateNodesPercentage: 0, minCandidateNodesAbsolute: 0}}]}]\n",
        )
        .expect_err("both zero");
        assert!(
            both_zero.to_string().contains("cannot be zero"),
            "{both_zero}"
        );
    }

    #[test]
    fn a_most_allocated_profile_with_weights_and_dra_args() {
        let c = parse_with(
            r#"
percentageOfNodesToScore: 30
podInitialBackoffSeconds: 2
podMaxBackoffSeconds: 20
leaderElection:
  leaderElect: true
  resourceName: gpu-scheduler
  leaseDuration: 30s
  renewDeadline: 20s
  retryPeriod: 4s
profiles:
- schedulerName: gpu-packer
  plugins:
    score:
      disabled: [{name: NodeResourcesBalancedAllocation}, {name: ImageLocality}]
      enabled: [{name: NodeResourcesFit, weight: 5}]
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: cpu, weight: 1}, {name: nvidia.com/gpu, weight: 3}]
  - name: DynamicResources
    args: {filterTimeout: 0s, bindingTimeout: 2m, packPartitions: true, numaAlignment: false}
"#,
        )
        .expect("valid");
        assert_eq!(c.pod_initial_backoff, Duration::from_secs(2));
        assert_eq!(c.leader_election.name.as_deref(), Some("gpu-scheduler"));
        assert_eq!(c.leader_election.retry_period, Duration::from_secs(4));
        let p = &c.profiles[0];
        assert_eq!(p.scheduler_name, "gpu-packer");
        assert_eq!(p.percentage_of_nodes_to_score, Some(30), "the global value");
        assert_eq!(p.weights.node_resources_fit, 5);
        assert_eq!(p.weights.balanced_allocation, 0, "disabled");
        assert_eq!(p.scoring.kind, StrategyKind::MostAllocated);
        assert_eq!(
            p.scoring.resources,
            vec![("cpu".to_owned(), 1), ("nvidia.com/gpu".to_owned(), 3)]
        );
        assert_eq!(p.filter_timeout, None, "0 turns the limit off");
        assert_eq!(p.binding_timeout, Some(Duration::from_secs(120)));
        assert!(p.pack_partitions);
        assert!(!p.numa_alignment);
        assert!(
            parse_with("profiles: [{schedulerName: a}]\n")
                .expect("default")
                .profiles[0]
                .numa_alignment
        );
        // Two profiles, one process.
        let two = parse_with("profiles: [{schedulerName: a}, {schedulerName: b}]\n").expect("two");
        let names: Vec<&str> = two
            .profiles
            .iter()
            .map(|p| p.scheduler_name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn w127_w133_bad_and_unsupported_fields_are_named() {
        let cases = [
            (
                "percentageOfNodesToScore: 101\n",
                "percentageOfNodesToScore: 101: not in valid range [0-100]",
            ),
            (
                "podInitialBackoffSeconds: 0\n",
                "podInitialBackoffSeconds: must be greater than 0",
            ),
            (
                "podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 2\n",
                "podMaxBackoffSeconds: must be greater than or equal to PodInitialBackoffSeconds",
            ),
            (
                "parallelism: 0\n",
                "parallelism: should be an integer value greater than zero",
            ),
            (
                "leaderElection: {resourceLock: endpoints}\n",
                "leaderElection.resourceLock: resourceLock value must be \"leases\"",
            ),
            (
                "profiles: [{schedulerName: a}, {schedulerName: a}]\n",
                "profiles[1].schedulerName: Duplicate value: \"a\"",
            ),
            (
                "profiles: [{schedulerName: a}, {schedulerName: b, pluginConfig: [{name: DynamicResources, args: {filterTimeout: 1s}}]}]\n",
                "profiles[1].pluginConfig: DynamicResources args that differ",
            ),
            (
                "profiles: [{plugins: {score: {enabled: [{name: NodeResourcesFit, weight: -1}]}}}]\n",
                "profiles[0].plugins.score.enabled[0].weight: -1: must be positive",
            ),
            (
                "profiles: [{plugins: {score: {enabled: [{name: VolumeBinding}]}}}]\n",
                "profiles[0].plugins.score.enabled[0]: the VolumeBinding score (not supported",
            ),
            (
                "profiles: [{plugins: {filter: {disabled: [{name: NodePorts}]}}}]\n",
                "profiles[0].plugins.filter.disabled[0]: disabling NodePorts at filter",
            ),
            (
                "profiles: [{plugins: {score: {enabled: [{name: MyPlugin}]}}}]\n",
                "unknown plugin \"MyPlugin\"",
            ),
            (
                "profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {type: Fancy}}}]}]\n",
                "profiles[0].pluginConfig[0].args.scoringStrategy.type: \"Fancy\"",
            ),
            (
                "profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {resources: [{name: cpu, weight: 101}]}}}]}]\n",
                "resource weight of 101 not in valid range (0, 100]",
            ),
            (
                "profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {type: RequestedToCapacityRatio}}}]}]\n",
                "must be specified when type is RequestedToCapacityRatio",
            ),
            (
                "profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {type: RequestedToCapacityRatio, requestedToCapacityRatio: {shape: [{utilization: 50, score: 5}, {utilization: 20, score: 1}]}}}}]}]\n",
                "values must be sorted in increasing order",
            ),
            (
                "profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {kind: DynamicResourcesArgs}}]}]\n",
                "has to match plugin args",
            ),
            (
                "profiles: [{pluginConfig: [{name: DynamicResources, args: {bindingTimeout: 500ms}}]}]\n",
                "bindingTimeout: must be at least 1 second",
            ),
            (
                "profiles: [{pluginConfig: [{name: DefaultPreemption, args: {minCandidateNodesPercentage: 101}}]}]\n",
                "profiles[0].pluginConfig[0].args.minCandidateNodesPercentage: 101: not in valid range [0, 100]",
            ),
            (
                "extenders: [{urlPrefix: http://x}]\n",
                "extenders: scheduler extenders (not supported",
            ),
        ];
        for (body, want) in cases {
            let err = parse_with(body).expect_err(body).to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
        // A misspelt field is named with its path, never dropped.
        let err = parse_with("profiles: [{schedulerName: a, pluginConfg: []}]\n")
            .expect_err("typo")
            .to_string();
        assert!(err.contains("pluginConfg"), "{err}");
        let err = parse(
            "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n",
        )
        .expect_err("old version")
        .to_string();
        assert!(err.starts_with("apiVersion: "), "{err}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "10", "s", "-1s", "1d", "1m x"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }
}
