//! One scheduling cycle, the pure decision (`pkg/scheduler/schedule_one.go` → `schedulePod`,
//! `findNodesThatFitPod`, `prioritizeNodes`, `selectHost`; spec S13-S19, S25): PreFilter, the
//! filters on the nodes from a rotating start until enough feasible ones are found, scores,
//! the choice, or the `FitError` with PostFilter's claim to deallocate.
//!
//! The allocator's inputs (the [`ClusterSnapshot`] of classes and slices) live as long as they
//! do not change; the devices in use are an [`AllocatedIndex`] kept current from the cache's
//! allocation log. Claims given to the allocator must live as long as the snapshot (its
//! lifetime is invariant), so each pod's claims to allocate are copied into an arena that is
//! dropped with the snapshot.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use devicelet_allocator::{
    AllocateOptions, AllocatedIndex, Allocator, ClusterSnapshot, Features, Semantics,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceRequestAllocationResult, ResourceClaim,
};
use typed_arena::Arena;

use crate::cache::{ClusterCache, NodeEntry};
use crate::config::Profile;
use crate::dra::{self, DraState, NodeOutcome};
use crate::extended::{self, ExtendedPlan, RequestMapping};
use crate::filters::image_locality::PodImages;
use crate::filters::inter_pod_affinity::{self, AffinityFilter};
use crate::filters::labels::Selector;
use crate::filters::node_affinity::{self, NodeNames};
use crate::filters::node_pods::NodePods;
use crate::filters::node_resources_fit::{DeviceUse, NANO, balanced_allocation_score, fit_score};
use crate::filters::pod_info::PodInfo;
use crate::filters::pod_topology_spread::{self, DefaultSpreading, SpreadFilter};
use crate::filters::taint_toleration;
use crate::filters::volumes::{PodVolumes, VolumeCheck};
use crate::filters::{self, PodFacts};
use crate::framework::{FitError, Plugin, Rejection, ScoreBreakdown};
use crate::numa::{self, NumaInputs};

/// The DRA PostFilter's answer for a pod without claims, or whose claims PreFilter could not
/// resolve (upstream's PreFilter records an empty state before it looks at them).
const NO_CLAIMS_TO_DEALLOCATE: &str = "no new claims to deallocate";

/// `minFeasibleNodesToFind` and `minFeasibleNodesPercentageToFind` (S17).
const MIN_FEASIBLE_NODES: usize = 100;
const MIN_FEASIBLE_PERCENTAGE: usize = 5;

/// How many feasible nodes to look for among `n` (S17, W108): `percentage` of them (the
/// profile's, else the configuration's; 0 or none: adaptive), at least 100.
pub fn num_feasible_nodes_to_find(n: usize, percentage: Option<u32>) -> usize {
    if n < MIN_FEASIBLE_NODES {
        return n;
    }
    let percentage = match percentage {
        Some(p) if p > 0 => p as usize,
        _ => (50usize.saturating_sub(n / 125)).max(MIN_FEASIBLE_PERCENTAGE),
    };
    (n * percentage / 100).max(MIN_FEASIBLE_NODES)
}

/// A node that passed the filters: its index, the DRA allocations there (one per claim to
/// allocate), and the extended resources DRA serves there.
type FeasibleNode = (usize, Arc<Vec<AllocationResult>>, BTreeSet<String>);

/// Where the pod goes and what Reserve must record.
#[derive(Clone, Debug)]
pub struct Placement {
    pub node: String,
    /// Every claim of the pod (they all get the pod in `reservedFor` at PreBind).
    pub claims: Vec<Arc<ResourceClaim>>,
    /// The claims this pod allocates, with their allocation.
    pub allocations: Vec<(Arc<ResourceClaim>, AllocationResult)>,
    /// The special claim of DRA-backed extended resources (KEP-5004), to be created.
    pub extended: Option<Box<ExtendedPlacement>>,
    /// Nodes examined and found feasible, for logs.
    pub feasible: usize,
}

impl Placement {
    /// Every claim this pod allocates, with its allocation: the user claims, then the special
    /// claim (Reserve records them all in flight, Unreserve drops them all).
    pub fn allocating(&self) -> impl Iterator<Item = (&ResourceClaim, &AllocationResult)> {
        self.allocations
            .iter()
            .map(|(c, a)| (&**c, a))
            .chain(self.extended.iter().map(|e| (&e.claim, &e.allocation)))
    }
}

/// The special claim of a placement (in memory: [`extended::IN_MEMORY_NAME`], a temporary
/// UID) with its allocation and the containers' request mappings for the pod's status.
#[derive(Clone, Debug)]
pub struct ExtendedPlacement {
    pub claim: ResourceClaim,
    pub allocation: AllocationResult,
    pub mappings: Vec<RequestMapping>,
}

/// The decision of one cycle.
#[derive(Debug)]
pub enum Decision {
    Place(Placement),
    Unschedulable {
        fit: FitError,
        /// PostFilter (S43): a claim to deallocate so the pod can go elsewhere.
        deallocate: Option<Arc<ResourceClaim>>,
        /// The pod's claims, for requeueing on their events.
        claim_names: BTreeSet<(String, String)>,
    },
    /// An internal error (S9): back-off, no event needed.
    Error(String),
}

/// The outcome of [`Engine::evaluate`].
#[derive(Debug)]
pub enum Outcome {
    /// Feasible placements, the best first (never empty).
    Feasible(Vec<Placement>),
    /// Unschedulable, or an error.
    Decided(Decision),
}

/// What a cycle reads from the cache, taken under its lock.
#[derive(Clone)]
pub struct CycleInputs {
    pub nodes: Vec<NodeEntry>,
    pub dra: Result<Option<DraState>, (Rejection, Option<String>)>,
    pub unsupported: Vec<String>,
    /// The volume plugins' PreFilter (`None`: the pod has no volume claims).
    pub volumes: Option<VolumeCheck>,
    /// DRA-backed extended resources (KEP-5004).
    pub extended: Option<ExtendedPlan>,
    /// A special claim left from an earlier attempt (PostFilter deletes it).
    pub leftover_special: Option<Arc<ResourceClaim>>,
    /// Devices held for pods of at least this pod's priority nominated by preemption while
    /// their victims terminate (W92): in use for this pod.
    pub held: Vec<DeviceRequestAllocationResult>,
    /// The pod as the inter-pod plugins read it, its terms' namespace selectors resolved.
    pub pod_info: Arc<PodInfo>,
    /// The labels of the pod's namespace (existing pods' terms may select it by them).
    pub namespace_labels: Arc<BTreeMap<String, String>>,
    /// The selector of the pod's owners for default spreading (`None` when the pod has
    /// constraints of its own).
    pub spread_selector: Option<Arc<Selector>>,
    /// Every node, when `nodes` is a subset (preemption's dry run on one node): the inter-pod
    /// plugins count pods per topology domain across all of them.
    pub all_nodes: Option<Vec<NodeEntry>>,
    /// The pod's images and how many nodes hold each (ImageLocality).
    pub images: Arc<PodImages>,
    /// The NUMA nodes of the nodes that publish them, for a pod with exclusive CPUs and
    /// claims ([`crate::numa`]).
    pub numa: Arc<NumaInputs>,
}

impl CycleInputs {
    /// Reads what `pod` needs from the cache.
    pub fn read(pod: &Pod, cache: &ClusterCache, binding_timeout: Duration) -> Self {
        let extended = extended::plan(pod, |r| extended::class_for(cache.classes(), r));
        let leftover_special = extended.as_ref().and_then(|_| {
            cache
                .claims()
                .into_iter()
                .find(|c| extended::is_special_claim_of(c, pod))
        });
        let volumes = filters::volumes::pre_filter(pod, cache);
        let nodes = cache.node_entries_for(pod);
        let pod_info = PodInfo::of(pod).with_namespaces_resolved(|s| cache.namespaces_matching(s));
        let numa = NumaInputs::read(pod_info.numa_use.as_deref(), &nodes, cache);
        CycleInputs {
            nodes,
            numa: Arc::new(numa),
            dra: dra::pre_filter(pod, cache, binding_timeout),
            unsupported: match &volumes {
                Some(VolumeCheck::Unsupported(fields)) => fields.clone(),
                _ => Vec::new(),
            },
            volumes,
            extended,
            leftover_special,
            held: cache.held_devices_for(pod),
            pod_info: Arc::new(pod_info),
            namespace_labels: Arc::new(
                cache.namespace_labels(pod.metadata.namespace.as_deref().unwrap_or("")),
            ),
            spread_selector: pod
                .spec
                .as_ref()
                .and_then(|s| s.topology_spread_constraints.as_ref())
                .is_none_or(|c| c.is_empty())
                .then(|| Arc::new(cache.spread_owners().selector_for(pod))),
            all_nodes: None,
            images: Arc::new(PodImages::new(pod, cache.node_count(), |name| {
                cache.nodes_with_image(name)
            })),
        }
    }

    /// Default spreading for `pod` under `profile` (see [`CycleInputs::spread_selector`]).
    fn default_spreading<'p>(&'p self, profile: &'p Profile) -> Option<DefaultSpreading<'p>> {
        self.spread_selector
            .as_deref()
            .map(|selector| DefaultSpreading {
                defaults: &profile.spread_defaults,
                selector,
            })
    }

    /// Every node of the cluster (see [`CycleInputs::all_nodes`]).
    pub fn every_node(&self) -> &[NodeEntry] {
        self.all_nodes.as_deref().unwrap_or(&self.nodes)
    }

    /// Whether InterPodAffinity or PodTopologySpread has anything to do for `pod`: its own
    /// terms or constraints, or pods with terms somewhere.
    pub fn inter_pod_relevant(&self, pod: &Pod) -> bool {
        self.pod_info.has_affinity()
            || pod
                .spec
                .as_ref()
                .and_then(|s| s.topology_spread_constraints.as_ref())
                .is_some_and(|c| !c.is_empty())
            || self.spread_selector.as_ref().is_some_and(|s| !s.is_empty())
            || self.every_node().iter().any(|e| e.usage.with_affinity > 0)
    }
}

/// The filters whose state comes from the pod's PreFilter over the whole cluster rather than
/// from the node alone: the volume plugins, PodTopologySpread and InterPodAffinity (`None`:
/// the plugin skips). Every path that places a pod runs them (the cycle, the group search's
/// re-pack of a node).
pub struct PodLevelFilters {
    volumes: Option<Arc<PodVolumes>>,
    spread: Option<SpreadFilter>,
    affinity: Option<AffinityFilter>,
}

impl PodLevelFilters {
    /// The PreFilters of `pod` on `inputs` (a volume PreFilter that rejected the pod is the
    /// caller's to report; here it skips).
    pub fn new(pod: &Pod, facts: &PodFacts, inputs: &CycleInputs, profile: &Profile) -> Self {
        let volumes = match &inputs.volumes {
            Some(VolumeCheck::Bound(v)) => Some(v.clone()),
            _ => None,
        };
        if !inputs.inter_pod_relevant(pod) {
            return PodLevelFilters {
                volumes,
                spread: None,
                affinity: None,
            };
        }
        let view = node_pods(inputs.every_node());
        PodLevelFilters {
            volumes,
            spread: SpreadFilter::pre_filter(pod, facts, inputs.default_spreading(profile), &view),
            affinity: AffinityFilter::pre_filter(&inputs.pod_info, &inputs.namespace_labels, &view),
        }
    }

    /// The volume plugins, PodTopologySpread, InterPodAffinity: the default profile's order.
    pub fn filter(&self, node: &k8s_openapi::api::core::v1::Node) -> Option<Rejection> {
        self.volumes
            .as_ref()
            .and_then(|v| v.filter(node))
            .or_else(|| self.spread.as_ref().and_then(|s| s.filter(node)))
            .or_else(|| self.affinity.as_ref().and_then(|a| a.filter(node)))
    }
}

fn node_pods(nodes: &[NodeEntry]) -> Vec<NodePods<'_>> {
    nodes
        .iter()
        .map(|e| NodePods {
            node: &e.node,
            usage: &e.usage,
        })
        .collect()
}

/// Runs `f` with an engine over the cache's current classes, slices and devices in use (for
/// work outside the scheduling loop: `devicelet explain podgroup/NAME`, tests).
pub fn with_engine<R>(
    cache: &mut ClusterCache,
    options: AllocateOptions,
    profile: &Profile,
    f: impl FnOnce(&mut Engine<'_>, &ClusterCache) -> R,
) -> R {
    let features = Features::kubernetes_1_36_defaults();
    let inputs = cache.dra_inputs();
    let selectors = Arc::new(devicelet_allocator::SelectorCache::new(
        devicelet_allocator::CelFeatures {
            enable_consumable_capacity: features.consumable_capacity,
            enable_list_type_attributes: features.list_type_attributes,
        },
    ));
    let snapshot = Arc::new(ClusterSnapshot::new(
        &inputs.classes,
        &inputs.slices,
        selectors,
    ));
    let index = AllocatedIndex::new(
        &snapshot,
        &cache.allocated_state(features.consumable_capacity),
    );
    let arena = Arena::new();
    let mut engine = Engine::new(
        snapshot,
        index,
        &arena,
        features,
        options,
        std::slice::from_ref(profile),
    );
    engine.set_device_resources(device_resources(
        std::slice::from_ref(profile),
        cache.classes(),
    ));
    f(&mut engine, cache)
}

/// The DRA Filter's answer per node for one pod shape, kept across the members of one
/// pod-group cycle: a node whose devices nothing changed since answers the same, so identical
/// members cost one allocator search per changed node instead of one per node. The pod-group
/// search forgets a node when it places a member there, and everything when it backtracks or
/// when an allocation reaches beyond one node.
#[derive(Debug, Default)]
pub struct NodeMemo {
    outcomes: std::collections::HashMap<String, NodeOutcome>,
}

impl NodeMemo {
    /// Forgets what is known of `node`.
    pub fn forget(&mut self, node: &str) {
        self.outcomes.remove(node);
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.outcomes.clear();
    }
}

/// The allocator's long-lived inputs and the scheduling cycle's rotating start.
pub struct Engine<'a> {
    snapshot: Arc<ClusterSnapshot<'a>>,
    index: AllocatedIndex,
    arena: &'a Arena<ResourceClaim>,
    arena_claims: usize,
    features: Features,
    options: AllocateOptions,
    next_start: usize,
    /// At least one; a pod is scored by the profile its `schedulerName` names.
    profiles: Vec<Profile>,
    /// The extended resources of the profiles' scoring strategies that a DeviceClass backs,
    /// with that class (W117; see [`device_resources`]).
    device_resources: HashMap<String, String>,
    /// Set by [`Engine::trace_next_cycle`]: the next cycle examines every node and records
    /// what it found here.
    trace: Option<CycleTrace>,
}

/// What one traced cycle found (`devicelet schedule`, the kube-scheduler oracle): every node's
/// filter verdict and every feasible node's score per plugin.
#[derive(Clone, Debug, Default)]
pub struct CycleTrace {
    /// The nodes a filter rejected, with the first rejection.
    pub rejections: BTreeMap<String, Rejection>,
    /// The feasible nodes, in examination order, with their scores.
    pub scores: Vec<(String, ScoreBreakdown)>,
}

/// Of the resources the profiles' NodeResourcesFit strategies score, those a DeviceClass backs
/// (its `extendedResourceName`, or `deviceclass.resource.kubernetes.io/<class>`), with the class.
pub fn device_resources(
    profiles: &[Profile],
    classes: &BTreeMap<String, k8s_openapi::api::resource::v1::DeviceClass>,
) -> HashMap<String, String> {
    profiles
        .iter()
        .flat_map(|p| p.scoring.resources.iter())
        .filter_map(|(name, _)| Some((name.clone(), extended::class_for(classes, name)?)))
        .collect()
}

/// How many devices of `class` the allocations `results` of `claims` (in that order) take.
fn devices_of_class(claims: &[&ResourceClaim], results: &[AllocationResult], class: &str) -> i128 {
    let mut n = 0;
    for (claim, result) in claims.iter().zip(results) {
        let requests = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.requests.as_deref())
            .unwrap_or(&[]);
        for r in result
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
        {
            let (name, sub) = match r.request.split_once('/') {
                Some((name, sub)) => (name, Some(sub)),
                None => (r.request.as_str(), None),
            };
            let Some(request) = requests.iter().find(|q| q.name == name) else {
                continue;
            };
            let request_class = match sub {
                Some(sub) => request
                    .first_available
                    .iter()
                    .flatten()
                    .find(|s| s.name == sub)
                    .map(|s| s.device_class_name.as_str()),
                None => request
                    .exactly
                    .as_ref()
                    .map(|e| e.device_class_name.as_str()),
            };
            if request_class == Some(class) {
                n += 1;
            }
        }
    }
    n
}

impl<'a> Engine<'a> {
    /// An engine over `snapshot` with `index` as the devices in use.
    pub fn new(
        snapshot: Arc<ClusterSnapshot<'a>>,
        index: AllocatedIndex,
        arena: &'a Arena<ResourceClaim>,
        features: Features,
        options: AllocateOptions,
        profiles: &[Profile],
    ) -> Self {
        Engine {
            snapshot,
            index,
            arena,
            arena_claims: 0,
            features,
            options,
            next_start: 0,
            profiles: if profiles.is_empty() {
                vec![Profile::named("devicelet-scheduler")]
            } else {
                profiles.to_vec()
            },
            device_resources: HashMap::new(),
            trace: None,
        }
    }

    /// Makes the next cycle examine every node from the first (no `percentageOfNodesToScore`
    /// cut, no rotating start) and keep its verdicts and scores for [`Engine::take_trace`].
    pub fn trace_next_cycle(&mut self) {
        self.trace = Some(CycleTrace::default());
        self.next_start = 0;
    }

    /// What the traced cycle found.
    pub fn take_trace(&mut self) -> Option<CycleTrace> {
        self.trace.take()
    }

    /// Sets the DRA-backed extended resources the profiles score ([`device_resources`] of the
    /// classes this engine's snapshot was built from).
    pub fn set_device_resources(&mut self, resources: HashMap<String, String>) {
        self.device_resources = resources;
    }

    /// Per feasible node, the DRA-backed resources of `profile`'s strategy there (W117).
    fn device_use(
        &self,
        profile: &Profile,
        nodes: &[NodeEntry],
        feasible: &[FeasibleNode],
        claims: &[&ResourceClaim],
    ) -> Vec<Vec<(String, DeviceUse)>> {
        if profile.weights.node_resources_fit == 0 || self.device_resources.is_empty() {
            return Vec::new();
        }
        let wanted: Vec<(&str, &str)> = profile
            .scoring
            .resources
            .iter()
            .filter_map(|(name, _)| {
                let class = self.device_resources.get(name)?;
                Some((name.as_str(), class.as_str()))
            })
            .collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let allocator = self.allocator();
        feasible
            .iter()
            .map(|(i, results, _)| {
                let node = &nodes[*i].node;
                wanted
                    .iter()
                    .filter_map(|(name, class)| {
                        let t = allocator.class_totals(node, class).ok()?;
                        (t.capacity > 0).then(|| {
                            let pod = devices_of_class(claims, results, class);
                            (
                                (*name).to_owned(),
                                DeviceUse {
                                    capacity: i128::from(t.capacity) * NANO,
                                    allocated: i128::from(t.allocated) * NANO,
                                    pod: pod * NANO,
                                },
                            )
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Counts more devices as in use (the cache's allocation log since the last cycle).
    pub fn add_allocations(&mut self, results: &[DeviceRequestAllocationResult]) {
        for r in results {
            if let Err(e) =
                self.index
                    .add_result(&self.snapshot, r, self.features.consumable_capacity)
            {
                tracing::warn!(error = %e, "bad consumed capacity in an allocation");
            }
        }
    }

    /// Claims copied into the arena so far (the caller starts a fresh engine past a bound).
    pub fn arena_claims(&self) -> usize {
        self.arena_claims
    }

    /// The round-robin start (kept across engines).
    pub fn next_start(&self) -> usize {
        self.next_start
    }

    /// Sets the round-robin start.
    pub fn set_next_start(&mut self, start: usize) {
        self.next_start = start;
    }

    /// The devices in use as this engine counts them.
    pub fn index(&self) -> &AllocatedIndex {
        &self.index
    }

    /// Replaces the devices in use (the pod-group search undoes its simulation with this).
    pub fn set_index(&mut self, index: AllocatedIndex) {
        self.index = index;
    }

    /// The devices in use as `state` says, indexed against this engine's snapshot (preemption
    /// simulates with the victims' devices left out).
    pub fn index_of(&self, state: &devicelet_allocator::AllocatedState) -> AllocatedIndex {
        AllocatedIndex::new(&self.snapshot, state)
    }

    /// Takes `result`'s device back from `index` (see [`AllocatedIndex::remove_exclusive`]).
    pub fn remove_from(
        &self,
        index: &mut AllocatedIndex,
        result: &DeviceRequestAllocationResult,
    ) -> bool {
        index.remove_exclusive(&self.snapshot, result, self.features.consumable_capacity)
    }

    /// Whether `pod` passes every filter on the one node `entry`, with `index` as the devices in
    /// use (preemption's dry run on one node, W82): the devices it would get there, or why
    /// not. The engine's own index and rotating start are left as they were.
    pub fn fits_on(
        &mut self,
        pod: &Pod,
        inputs: &CycleInputs,
        entry: NodeEntry,
        index: AllocatedIndex,
    ) -> Result<Vec<DeviceRequestAllocationResult>, Vec<String>> {
        // The inter-pod plugins count across every node, this one as it would be.
        let all_nodes = inputs.inter_pod_relevant(pod).then(|| {
            inputs
                .every_node()
                .iter()
                .map(|e| {
                    if e.name() == entry.name() {
                        entry.clone()
                    } else {
                        e.clone()
                    }
                })
                .collect()
        });
        let one = CycleInputs {
            nodes: vec![entry],
            all_nodes,
            ..inputs.clone()
        };
        let saved_index = std::mem::replace(&mut self.index, index);
        let saved_start = std::mem::replace(&mut self.next_start, 0);
        let outcome = self.evaluate(pod, one, 1);
        self.index = saved_index;
        self.next_start = saved_start;
        let devices = |p: &Placement| -> Vec<DeviceRequestAllocationResult> {
            p.allocating()
                .flat_map(|(_, a)| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .cloned()
                .collect()
        };
        match outcome {
            Outcome::Feasible(p) => Ok(p.first().map(devices).unwrap_or_default()),
            Outcome::Decided(Decision::Place(p)) => Ok(devices(&p)),
            Outcome::Decided(Decision::Unschedulable { fit, .. }) => Err(fit
                .node_statuses
                .into_values()
                .next()
                .or(fit.pre_filter)
                .map(|r| r.reasons)
                .unwrap_or_default()),
            Outcome::Decided(Decision::Error(e)) => Err(vec![e]),
        }
    }

    /// Counts `allocation`'s devices as in use in `index`.
    pub fn add_to(&self, index: &mut AllocatedIndex, allocation: &AllocationResult) {
        for r in allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
        {
            if let Err(e) = index.add_result(&self.snapshot, r, self.features.consumable_capacity) {
                tracing::warn!(error = %e, "bad consumed capacity in an allocation");
            }
        }
    }

    /// Allocates `claims` together on `node`, with `index` as the devices in use: one search
    /// over all of them, so the allocator's own backtracking revisits every claim's devices
    /// (the pod-group search re-packs the members that share a node with this).
    pub fn allocate_together(
        &mut self,
        node: &k8s_openapi::api::core::v1::Node,
        claims: &[Arc<ResourceClaim>],
        index: AllocatedIndex,
    ) -> Result<Option<Vec<AllocationResult>>, String> {
        let copies: Vec<&'a ResourceClaim> = claims
            .iter()
            .map(|c| &*self.arena.alloc((**c).clone()))
            .collect();
        self.arena_claims += copies.len();
        let allocator = Allocator::with_index(
            self.snapshot.clone(),
            self.features,
            Semantics::Fixed,
            Arc::new(index),
        );
        match allocator.allocate(node, &copies, &self.options) {
            Ok(Some(results)) if results.len() == copies.len() => Ok(Some(results)),
            Ok(_) => Ok(None),
            Err(e) if e.class == devicelet_allocator::ErrorClass::Timeout => Ok(None),
            Err(e) if e.class == devicelet_allocator::ErrorClass::InvalidPools => Ok(None),
            Err(e) => Err(e.message),
        }
    }

    /// The profile `pod` names (`spec.schedulerName`), else the first.
    pub fn profile_of(&self, pod: &Pod) -> &Profile {
        let name = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        self.profiles
            .iter()
            .find(|p| Some(p.scheduler_name.as_str()) == name)
            .unwrap_or(&self.profiles[0])
    }

    fn allocator(&self) -> Allocator<'a> {
        self.allocator_holding(&[])
    }

    /// An allocator over the devices in use plus `held` (devices nominated pods wait for).
    /// Adds `held` (devices held for nominated pods, W92) to `index`: in use for this pod.
    pub fn hold(&self, index: &mut AllocatedIndex, held: &[DeviceRequestAllocationResult]) {
        for r in held {
            if let Err(e) = index.add_result(&self.snapshot, r, self.features.consumable_capacity) {
                tracing::warn!(error = %e, "bad consumed capacity in a held device");
            }
        }
    }

    fn allocator_holding(&self, held: &[DeviceRequestAllocationResult]) -> Allocator<'a> {
        let mut index = self.index.clone();
        self.hold(&mut index, held);
        Allocator::with_index(
            self.snapshot.clone(),
            self.features,
            Semantics::Fixed,
            Arc::new(index),
        )
    }

    /// Runs one cycle for `pod`.
    pub fn schedule(&mut self, pod: &Pod, inputs: CycleInputs) -> Decision {
        match self.evaluate(pod, inputs, 1) {
            Outcome::Feasible(mut placements) if !placements.is_empty() => {
                Decision::Place(placements.swap_remove(0))
            }
            Outcome::Feasible(_) => Decision::Error("internal error, no placement".to_owned()),
            Outcome::Decided(d) => d,
        }
    }

    /// One cycle for `pod` that keeps up to `limit` feasible placements, the best first (the
    /// pod-group search takes the next one when the best leads nowhere).
    pub fn evaluate(&mut self, pod: &Pod, inputs: CycleInputs, limit: usize) -> Outcome {
        self.evaluate_with(pod, inputs, limit, None)
    }

    /// [`Engine::evaluate`] with the DRA Filter's answers per node taken from, and kept in,
    /// `memo` (see [`NodeMemo`]).
    pub fn evaluate_with(
        &mut self,
        pod: &Pod,
        mut inputs: CycleInputs,
        limit: usize,
        mut memo: Option<&mut NodeMemo>,
    ) -> Outcome {
        let n = inputs.nodes.len();
        let mut fit = FitError {
            num_all_nodes: n,
            ..FitError::default()
        };
        if n == 0 {
            fit.pre_filter = Some(Rejection::unresolvable(
                Plugin::NodeName,
                "no nodes available to schedule pods",
            ));
            return unschedulable(fit, None, BTreeSet::new());
        }
        if !inputs.unsupported.is_empty() {
            fit.pre_filter = Some(Rejection::unresolvable(
                Plugin::Unsupported,
                filters::unsupported::message(
                    &self.profile_of(pod).scheduler_name,
                    &inputs.unsupported,
                ),
            ));
            return unschedulable(fit, None, BTreeSet::new());
        }
        // NodeAffinity's PreFilter comes before the volume plugins' and DRA's (profile order:
        // the first PreFilter that rejects decides the pod's status).
        let mut facts = PodFacts::for_profile(pod, self.profile_of(pod));
        let names = facts.affinity.names().clone();
        if names == NodeNames::Conflict {
            fit.pre_filter = Some(Rejection::unresolvable(
                Plugin::NodeAffinity,
                node_affinity::CONFLICT_REASON,
            ));
            return unschedulable(fit, None, BTreeSet::new());
        }
        if let Some(VolumeCheck::Rejected(r)) = &inputs.volumes {
            fit.pre_filter = Some(r.clone());
            return unschedulable(fit, None, BTreeSet::new());
        }
        let dra = std::mem::replace(&mut inputs.dra, Ok(None));
        let state = match dra {
            // DRA-backed extended resources need the DRA plugin without user claims too.
            Ok(None) if inputs.extended.is_some() => Some(DraState::default()),
            Ok(state) => state,
            Err((rejection, _)) => {
                let names = dra::claim_names(pod)
                    .map(|v| v.into_iter().map(|(ns, n, _)| (ns, n)).collect())
                    .unwrap_or_default();
                fit.pre_filter = Some(rejection);
                fit.post_filter_msg = Some(NO_CLAIMS_TO_DEALLOCATE.to_owned());
                return unschedulable(fit, None, names);
            }
        };
        let claim_names: BTreeSet<(String, String)> = state
            .iter()
            .flat_map(|s| s.claims.iter())
            .map(|c| {
                (
                    c.claim.metadata.namespace.clone().unwrap_or_default(),
                    c.claim.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect();
        if let Some(plan) = &inputs.extended {
            facts.dra_extended = plan.resources();
        }
        if let Some(leftover) = inputs.leftover_special.clone() {
            // S44: a special claim of an earlier attempt is never reused; PostFilter deletes it.
            for entry in &inputs.nodes {
                fit.node_statuses.insert(
                    entry.name().to_owned(),
                    Rejection::unresolvable(
                        Plugin::DynamicResources,
                        "cannot schedule extended resource claim",
                    ),
                );
            }
            fit.post_filter_msg = Some("deletion of ResourceClaim completed".to_owned());
            return unschedulable(fit, Some(leftover), claim_names);
        }
        // The claims to allocate, copied to live as long as the snapshot.
        let to_allocate: Vec<&'a ResourceClaim> = state
            .iter()
            .flat_map(|s| s.to_allocate.iter().map(|&i| &s.claims[i].claim))
            .map(|c| &*self.arena.alloc((**c).clone()))
            .collect();
        self.arena_claims += to_allocate.len();
        let allocator = (!to_allocate.is_empty() || inputs.extended.is_some())
            .then(|| self.allocator_holding(&inputs.held));
        // Per set of resources a node leaves to DRA, the claims to allocate there: the user
        // claims and the special claim with those resources' requests (S63).
        let mut variants: BTreeMap<
            BTreeSet<String>,
            (Vec<&'a ResourceClaim>, Option<ExtendedPlan>),
        > = BTreeMap::new();
        let temp_uid = format!(
            "extended-resources-{}",
            pod.metadata.uid.as_deref().unwrap_or("")
        );
        // W108: without a score plugin the first feasible node is as good as any.
        let profile = self.profile_of(pod);
        let to_find = if self.trace.is_some() {
            n
        } else if profile.weights.scores() {
            num_feasible_nodes_to_find(n, profile.percentage_of_nodes_to_score)
        } else {
            1
        };
        let pod_level = PodLevelFilters::new(pod, &facts, &inputs, self.profile_of(pod));
        let mut feasible: Vec<FeasibleNode> = Vec::new();
        let mut unavailable = BTreeSet::new();
        let mut examined = 0;
        let mut first_dra_failure: Option<(usize, BTreeSet<String>)> = None;
        for k in 0..n {
            if feasible.len() >= to_find {
                break;
            }
            let i = (self.next_start + k) % n;
            examined += 1;
            let entry = &inputs.nodes[i];
            if let NodeNames::Only(only) = &names
                && !only.contains(entry.name())
            {
                fit.node_statuses.insert(
                    entry.name().to_owned(),
                    Rejection::unresolvable(
                        Plugin::NodeAffinity,
                        node_affinity::OUTSIDE_PRE_FILTER_REASON,
                    ),
                );
                continue;
            }
            if let Some(r) =
                filters::filter_node(&facts, &entry.node, &entry.allocatable, &entry.usage)
                    .or_else(|| pod_level.filter(&entry.node))
            {
                fit.node_statuses.insert(entry.name().to_owned(), r);
                continue;
            }
            let Some(state) = &state else {
                feasible.push((i, Arc::new(Vec::new()), BTreeSet::new()));
                continue;
            };
            let via_dra: BTreeSet<String> = facts
                .dra_extended
                .iter()
                .filter(|r| !filters::node_resources_fit::advertises(&entry.node, r))
                .cloned()
                .collect();
            let (claims, _) = variants.entry(via_dra.clone()).or_insert_with(|| {
                let plan = inputs.extended.as_ref().and_then(|p| p.only(&via_dra));
                let mut claims = to_allocate.clone();
                if let Some(plan) = &plan {
                    claims.push(&*self.arena.alloc(extended::claim(pod, plan, &temp_uid)));
                }
                (claims, plan)
            });
            // The special claim of DRA-backed extended resources differs per node: not kept.
            let memo_here = memo.as_deref_mut().filter(|_| via_dra.is_empty());
            let outcome = match memo_here
                .as_ref()
                .and_then(|m| m.outcomes.get(entry.name()).cloned())
            {
                Some(known) => known,
                None => {
                    let numa = inputs
                        .numa
                        .nodes
                        .get(entry.name())
                        .filter(|_| profile.numa_alignment);
                    let outcome = match numa {
                        Some(numa) => numa::filter_node(
                            state,
                            allocator.as_ref(),
                            claims,
                            &entry.node,
                            &self.options,
                            numa,
                        ),
                        None => dra::filter_node(
                            state,
                            allocator.as_ref(),
                            claims,
                            &entry.node,
                            &self.options,
                        ),
                    };
                    if let Some(m) = memo_here
                        && !matches!(outcome, NodeOutcome::Error(_))
                    {
                        m.outcomes.insert(entry.name().to_owned(), outcome.clone());
                    }
                    outcome
                }
            };
            match outcome {
                NodeOutcome::Fits(results) => feasible.push((i, results, via_dra)),
                NodeOutcome::Rejected {
                    rejection,
                    unavailable: u,
                } => {
                    if rejection
                        .reasons
                        .iter()
                        .any(|r| r == "cannot allocate all claims")
                    {
                        first_dra_failure.get_or_insert((i, via_dra));
                    }
                    unavailable.extend(u);
                    fit.node_statuses.insert(entry.name().to_owned(), rejection);
                }
                NodeOutcome::Error(e) => {
                    self.next_start = (self.next_start + examined) % n;
                    return Outcome::Decided(Decision::Error(e));
                }
            }
        }
        self.next_start = (self.next_start + examined) % n;
        self.arena_claims += variants.values().filter(|(_, p)| p.is_some()).count();
        if let Some(trace) = self.trace.as_mut() {
            trace.rejections = fit.node_statuses.clone();
        }
        if feasible.is_empty() {
            let mut deallocate = None;
            if let Some(state) = &state {
                deallocate = dra::claim_to_deallocate(
                    state,
                    &unavailable,
                    pod.metadata.uid.as_deref().unwrap_or(""),
                );
                fit.post_filter_msg = Some(if deallocate.is_some() {
                    "deallocation of ResourceClaim completed".to_owned()
                } else {
                    "still not schedulable".to_owned()
                });
                if let (Some((i, via_dra)), Some(a)) = (first_dra_failure, allocator.as_ref()) {
                    // With the special claim of that node, if any.
                    let claims = variants.get(&via_dra).map_or(&to_allocate, |(c, _)| c);
                    fit.diagnosis = Some(dra::diagnose(a, &inputs.nodes[i].node, claims));
                }
            } else {
                fit.post_filter_msg = Some(NO_CLAIMS_TO_DEALLOCATE.to_owned());
            }
            return unschedulable(fit, deallocate, claim_names);
        }
        // The best node first (ties at random, S19), then the rest best first for callers
        // that want alternatives (the pod-group search).
        // Claims of the pod allocated already add the same on every node (as upstream counts
        // them, before normalising).
        // Upstream scores nothing when nothing is allocated in this cycle.
        let allocated_dra: i64 = state
            .iter()
            .filter(|_| !to_allocate.is_empty())
            .map(|s| dra::allocated_score(s.claims.iter().map(|c| &*c.claim)))
            .sum();
        let breakdowns = self.score_breakdowns(
            pod,
            &facts,
            &inputs,
            &feasible,
            (&to_allocate, allocated_dra),
        );
        if let Some(trace) = self.trace.as_mut() {
            trace.scores = feasible
                .iter()
                .zip(&breakdowns)
                .map(|((i, _, _), b)| (inputs.nodes[*i].name().to_owned(), *b))
                .collect();
        }
        let totals: Vec<i64> = breakdowns.iter().map(|b| b.iter().sum()).collect();
        let order = rank(&totals, limit);
        let feasible_count = feasible.len();
        let mut placements = Vec::with_capacity(order.len());
        for k in order {
            let (node_index, results, via_dra) = &feasible[k];
            let mut results = (**results).clone();
            let extended = variants
                .get(via_dra)
                .and_then(|(claims, plan)| Some((claims.last().copied()?, plan.clone()?)))
                .and_then(|(claim, plan)| {
                    let allocation = results.pop()?;
                    Some(Box::new(ExtendedPlacement {
                        claim: claim.clone(),
                        allocation,
                        mappings: plan.mappings,
                    }))
                });
            let node = inputs.nodes[*node_index].name().to_owned();
            let Some(state) = &state else {
                placements.push(Placement {
                    node,
                    claims: Vec::new(),
                    allocations: Vec::new(),
                    extended: None,
                    feasible: feasible_count,
                });
                continue;
            };
            if results.len() != state.to_allocate.len() {
                return Outcome::Decided(Decision::Error(format!(
                    "internal error, have {} allocations, {} claims to allocate",
                    results.len(),
                    state.to_allocate.len()
                )));
            }
            let allocations = state
                .to_allocate
                .iter()
                .zip(results)
                .map(|(&i, r)| (state.claims[i].claim.clone(), r))
                .collect();
            placements.push(Placement {
                node,
                claims: state.claims.iter().map(|c| c.claim.clone()).collect(),
                allocations,
                extended,
                feasible: feasible_count,
            });
        }
        Outcome::Feasible(placements)
    }

    /// Each feasible node's score per plugin (W110; upstream `RunScorePlugins`): the
    /// profile's weights times TaintToleration, NodeAffinity (preferred terms),
    /// NodeResourcesFit's strategy, PodTopologySpread, InterPodAffinity, the DRA score,
    /// BalancedAllocation and ImageLocality, each 0-100. A single feasible node is not scored
    /// (all zero) unless the cycle is traced.
    fn score_breakdowns(
        &self,
        pod: &Pod,
        facts: &PodFacts,
        inputs: &CycleInputs,
        feasible: &[FeasibleNode],
        (claims, allocated_dra): (&[&ResourceClaim], i64),
    ) -> Vec<ScoreBreakdown> {
        if feasible.len() == 1 && self.trace.is_none() {
            return vec![ScoreBreakdown::default()];
        }
        let profile = self.profile_of(pod);
        let devices = self.device_use(profile, &inputs.nodes, feasible, claims);
        let mut out = Self::scores(
            profile,
            facts,
            inputs,
            feasible,
            (claims, allocated_dra),
            &devices,
        );
        for (b, (spread, affinity)) in out
            .iter_mut()
            .zip(self.inter_pod_scores(pod, facts, inputs, feasible))
        {
            // Their slots in `SCORE_PLUGINS`.
            b[3] = spread;
            b[4] = affinity;
        }
        out
    }

    /// PodTopologySpread's and InterPodAffinity's scores of the feasible nodes, weighted (empty
    /// when neither runs). They count pods across every node, not only the feasible ones.
    fn inter_pod_scores(
        &self,
        pod: &Pod,
        facts: &PodFacts,
        inputs: &CycleInputs,
        feasible: &[FeasibleNode],
    ) -> Vec<(i64, i64)> {
        let weights = &self.profile_of(pod).weights;
        // Scores rank two or more feasible nodes of a whole cycle; only preemption's one-node
        // dry run sets `all_nodes`, and it never ranks.
        if (feasible.len() < 2 && self.trace.is_none())
            || inputs.all_nodes.is_some()
            || (weights.pod_topology_spread == 0 && weights.inter_pod_affinity == 0)
            || !inputs.inter_pod_relevant(pod)
        {
            return Vec::new();
        }
        let view = node_pods(&inputs.nodes);
        let index: Vec<usize> = feasible.iter().map(|(i, _, _)| *i).collect();
        let mut out = vec![(0, 0); feasible.len()];
        if weights.pod_topology_spread > 0
            && let Some(s) = pod_topology_spread::scores(
                pod,
                facts,
                inputs.default_spreading(self.profile_of(pod)),
                &view,
                &index,
            )
        {
            for (o, s) in out.iter_mut().zip(s) {
                o.0 = s * weights.pod_topology_spread;
            }
        }
        if weights.inter_pod_affinity > 0
            && let Some(s) = inter_pod_affinity::scores(
                &inputs.pod_info,
                &inputs.namespace_labels,
                &self.profile_of(pod).affinity,
                &view,
                &index,
            )
        {
            for (o, s) in out.iter_mut().zip(s) {
                o.1 = s * weights.inter_pod_affinity;
            }
        }
        out
    }

    /// The node-local scores of each feasible node, weighted, in [`SCORE_PLUGINS`] order (the
    /// inter-pod slots left zero).
    ///
    /// [`SCORE_PLUGINS`]: crate::framework::SCORE_PLUGINS
    fn scores(
        profile: &Profile,
        facts: &PodFacts,
        inputs: &CycleInputs,
        feasible: &[FeasibleNode],
        (claims, allocated_dra): (&[&ResourceClaim], i64),
        devices: &[Vec<(String, DeviceUse)>],
    ) -> Vec<ScoreBreakdown> {
        let nodes = &inputs.nodes;
        // The special claim has no prioritized lists: it adds nothing to the DRA score.
        let dra_scores: Vec<i64> = feasible
            .iter()
            .map(|(_, results, _)| {
                allocated_dra + dra::score(claims, &results[..claims.len().min(results.len())])
            })
            .collect();
        let max_dra = dra_scores.iter().copied().max().unwrap_or(0);
        let weights = &profile.weights;
        // W119: untolerated PreferNoSchedule taints, normalised reversed (none anywhere: 100).
        let taints: Vec<i64> = if weights.taint_toleration > 0 {
            feasible
                .iter()
                .map(|(i, _, _)| {
                    taint_toleration::intolerable_preferences(&facts.tolerations, &nodes[*i].node)
                })
                .collect()
        } else {
            Vec::new()
        };
        let max_taints = taints.iter().copied().max().unwrap_or(0);
        // W120: the preferred terms' weights, normalised to the best node (PreScore skips a pod
        // without preferred terms).
        let preferred: Vec<i64> = if weights.node_affinity > 0 && !facts.preferred.is_empty() {
            feasible
                .iter()
                .map(|(i, _, _)| facts.preferred.score(&nodes[*i].node))
                .collect()
        } else {
            Vec::new()
        };
        let max_preferred = preferred.iter().copied().max().unwrap_or(0);
        let weight_order = weights.in_score_order();
        feasible
            .iter()
            .enumerate()
            .map(|(k, (i, _, _))| {
                let entry = &nodes[*i];
                let dra = if max_dra > 0 {
                    dra_scores[k] * 100 / max_dra
                } else {
                    0
                };
                let taint = match taints.get(k) {
                    Some(_) if max_taints == 0 => 100,
                    Some(&c) => 100 - 100 * c / max_taints,
                    None => 0,
                };
                let affinity = match preferred.get(k) {
                    Some(&s) if max_preferred > 0 => s * 100 / max_preferred,
                    _ => 0,
                };
                // Not normalised (W118); a best-effort pod is skipped.
                let balanced = if weights.balanced_allocation > 0 {
                    balanced_allocation_score(
                        &profile.balanced_resources,
                        &facts.requests,
                        &entry.allocatable,
                        &entry.usage,
                    )
                    .unwrap_or(0)
                } else {
                    0
                };
                let fit = if weights.node_resources_fit > 0 {
                    let here = devices.get(k).map_or(&[][..], Vec::as_slice);
                    fit_score(
                        &profile.scoring,
                        &facts.requests,
                        facts.non_zero,
                        &entry.allocatable,
                        &entry.usage,
                        |name| here.iter().find(|(n, _)| n == name).map(|(_, d)| *d),
                    )
                } else {
                    0
                };
                // Not normalised either.
                let image = if weights.image_locality > 0 {
                    inputs.images.score(&entry.images)
                } else {
                    0
                };
                // The inter-pod slots are filled by the caller.
                let raw = [taint, affinity, fit, 0, 0, dra, balanced, image];
                let mut weighted = ScoreBreakdown::default();
                for ((out, score), weight) in weighted.iter_mut().zip(raw).zip(weight_order) {
                    *out = score * weight;
                }
                weighted
            })
            .collect()
    }
}

/// The order in which to take the feasible nodes by their `totals`: at most `limit`, the best
/// first. The best node's ties are broken at random (S19), the rest keep their examination
/// order.
fn rank(totals: &[i64], limit: usize) -> Vec<usize> {
    if totals.len() == 1 {
        return vec![0];
    }
    let mut best: Option<(i64, usize)> = None;
    let mut ties = 0u32;
    for (k, &total) in totals.iter().enumerate() {
        match best {
            Some((b, _)) if total < b => {}
            Some((b, _)) if total == b => {
                ties += 1;
                if fastrand::u32(0..=ties) == 0 {
                    best = Some((total, k));
                }
            }
            _ => {
                best = Some((total, k));
                ties = 0;
            }
        }
    }
    let first = best.map(|(_, k)| k).unwrap_or(0);
    let mut order = vec![first];
    if limit > 1 {
        let mut rest: Vec<usize> = (0..totals.len()).filter(|&k| k != first).collect();
        rest.sort_by_key(|&k| std::cmp::Reverse(totals[k]));
        order.extend(rest.into_iter().take(limit - 1));
    }
    order
}

fn unschedulable(
    fit: FitError,
    deallocate: Option<Arc<ResourceClaim>>,
    claim_names: BTreeSet<(String, String)>,
) -> Outcome {
    Outcome::Decided(Decision::Unschedulable {
        fit,
        deallocate,
        claim_names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s17_feasible_nodes_to_find() {
        assert_eq!(num_feasible_nodes_to_find(50, None), 50);
        assert_eq!(num_feasible_nodes_to_find(100, None), 100);
        // 500 nodes: 50 - 4 = 46 % → 230.
        assert_eq!(num_feasible_nodes_to_find(500, None), 230);
        // 5000 nodes: 50 - 40 = 10 % → 500.
        assert_eq!(num_feasible_nodes_to_find(5000, None), 500);
        // 10000 nodes: max(5, 50 - 80) = 5 % → 500.
        assert_eq!(num_feasible_nodes_to_find(10_000, None), 500);
    }

    #[test]
    fn w108_a_configured_percentage() {
        // 1 000 nodes at 30 %: 300; at 5 %: 50, raised to the minimum of 100.
        assert_eq!(num_feasible_nodes_to_find(1000, Some(30)), 300);
        assert_eq!(num_feasible_nodes_to_find(1000, Some(5)), 100);
        assert_eq!(
            num_feasible_nodes_to_find(1000, Some(0)),
            420,
            "0 is adaptive"
        );
    }

    #[test]
    fn w119_w120_preferred_affinity_leads_and_prefer_no_schedule_taints_trail() {
        use k8s_openapi::api::core::v1::{
            Affinity, Node, NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec,
            NodeStatus, PodSpec, PreferredSchedulingTerm, Taint,
        };
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let node = |name: &str, label: Option<&str>, taint: bool| {
            let mut n = Node {
                spec: taint.then(|| NodeSpec {
                    taints: Some(vec![Taint {
                        key: "spot".into(),
                        effect: "PreferNoSchedule".into(),
                        ..Taint::default()
                    }]),
                    ..NodeSpec::default()
                }),
                status: Some(NodeStatus {
                    allocatable: Some(std::collections::BTreeMap::from([
                        ("cpu".to_owned(), Quantity("8".into())),
                        ("memory".to_owned(), Quantity("32Gi".into())),
                        ("pods".to_owned(), Quantity("110".into())),
                    ])),
                    ..NodeStatus::default()
                }),
                ..Node::default()
            };
            n.metadata.name = Some(name.into());
            n.metadata.labels =
                label.map(|l| std::collections::BTreeMap::from([("gpu".to_owned(), l.to_owned())]));
            n
        };
        let mut cache = ClusterCache::new();
        cache.upsert_node(node("plain", None, false));
        cache.upsert_node(node("spot", None, true));
        cache.upsert_node(node("h100", Some("h100"), false));
        let mut pod = Pod {
            spec: Some(PodSpec {
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        preferred_during_scheduling_ignored_during_execution: Some(vec![
                            PreferredSchedulingTerm {
                                weight: 10,
                                preference: NodeSelectorTerm {
                                    match_expressions: Some(vec![NodeSelectorRequirement {
                                        key: "gpu".into(),
                                        operator: "In".into(),
                                        values: Some(vec!["h100".into()]),
                                    }]),
                                    match_fields: None,
                                },
                            },
                        ]),
                        ..NodeAffinity::default()
                    }),
                    ..Affinity::default()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("uid-p".into());
        let order = |profile: &Profile, cache: &mut ClusterCache| -> Vec<String> {
            let options = AllocateOptions::unbounded();
            with_engine(cache, options, profile, |engine, cache| {
                let inputs = CycleInputs::read(&pod, cache, Duration::from_secs(600));
                match engine.evaluate(&pod, inputs, 3) {
                    Outcome::Feasible(p) => p.into_iter().map(|p| p.node).collect(),
                    Outcome::Decided(d) => panic!("{d:?}"),
                }
            })
        };
        let default = Profile::named("s");
        assert_eq!(order(&default, &mut cache), ["h100", "plain", "spot"]);
        // Both scores off: nothing tells the nodes apart but LeastAllocated (all equal), so
        // the untainted-vs-tainted order is no longer guaranteed; the preferred node is not
        // guaranteed first either.
        let mut off = Profile::named("s");
        off.weights.taint_toleration = 0;
        off.weights.node_affinity = 0;
        let first: std::collections::BTreeSet<String> = (0..30)
            .map(|_| order(&off, &mut cache)[0].clone())
            .collect();
        assert!(first.len() > 1, "ties are broken at random: {first:?}");
    }

    #[test]
    fn w117_gpus_are_packed_by_most_allocated_over_the_device_class() {
        use crate::config::{ScoringStrategy, StrategyKind};
        use crate::testing::*;
        use k8s_openapi::api::core::v1::{PodResourceClaim, PodSpec};
        let gpus = |n: &str| {
            slice(
                n,
                (0..4).map(|i| device(&format!("gpu-{i}"), "big")).collect(),
                None,
            )
        };
        // n1 has 1 GPU in use, n2 has 2, n3 none.
        let mut cache = cache_with(
            vec![
                node("n1", "8", &[]),
                node("n2", "8", &[]),
                node("n3", "8", &[]),
            ],
            vec![gpus("n1"), gpus("n2"), gpus("n3")],
            vec![
                allocated_claim("a", "n1", "gpu-0"),
                allocated_claim("b", "n2", "gpu-0"),
                allocated_claim("c", "n2", "gpu-1"),
                claim("want", exact(1, None)),
            ],
        );
        let mut pod = Pod {
            spec: Some(PodSpec {
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_name: Some("want".into()),
                    ..PodResourceClaim::default()
                }]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("uid-p".into());
        let order = |kind: StrategyKind, cache: &mut ClusterCache| -> Vec<String> {
            let mut profile = Profile::named("s");
            profile.scoring = ScoringStrategy {
                kind,
                resources: vec![("deviceclass.resource.kubernetes.io/gpu".to_owned(), 1)],
            };
            // Only NodeResourcesFit decides.
            profile.weights.dynamic_resources = 0;
            profile.weights.balanced_allocation = 0;
            let options = AllocateOptions::unbounded();
            with_engine(cache, options, &profile, |engine, cache| {
                let inputs = CycleInputs::read(&pod, cache, Duration::from_secs(600));
                match engine.evaluate(&pod, inputs, 3) {
                    Outcome::Feasible(p) => p.into_iter().map(|p| p.node).collect(),
                    Outcome::Decided(d) => panic!("{d:?}"),
                }
            })
        };
        // Packed: the fullest node first (3/4, then 2/4, then 1/4 with the pod's GPU).
        assert_eq!(
            order(StrategyKind::MostAllocated, &mut cache),
            ["n2", "n1", "n3"]
        );
        // Spread: the emptiest first.
        assert_eq!(
            order(StrategyKind::LeastAllocated, &mut cache),
            ["n3", "n1", "n2"]
        );
    }
}
