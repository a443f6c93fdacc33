//! The Topology Manager itself, after the kubelet's `tm/topology_manager.go` (`NewManager`,
//! `AddHintProvider`, `Admit`, `GetAffinity`) and the scopes `tm/scope_none.go`,
//! `scope_container.go`, `scope_pod.go`: construction checks in the kubelet's order, hint
//! collection per container or per pod, the policy's verdict, the affinity store, and the
//! `Allocate` calls on every provider in registration order.
//!
//! Providers see our own small pod/container descriptors, so the device manager and a CPU
//! manager can implement [`HintProvider`] without this crate knowing about k8s types or IO.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::error::{AdmissionError, ConfigError};
use crate::hint::{ProviderHints, TopologyHint};
use crate::numa::NumaTopology;
use crate::policy::{Policy, PolicyName, PolicyOptions, ScopeName};

/// A container as hint providers see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Resource limits (extended resources as integers; CPU in millicores, memory in bytes).
    pub limits: BTreeMap<String, i64>,
    /// An init container with `restartPolicy: Always` (sidecar).
    pub restartable: bool,
}

/// A pod as hint providers see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSpec {
    /// Pod UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Init containers, in order.
    pub init_containers: Vec<ContainerSpec>,
    /// App containers, in order.
    pub containers: Vec<ContainerSpec>,
}

impl PodSpec {
    /// Init containers then app containers: the order the kubelet admits them in.
    pub fn all_containers(&self) -> impl Iterator<Item = &ContainerSpec> {
        self.init_containers.iter().chain(self.containers.iter())
    }
}

/// The pod's effective limits as `resource.PodLimits` computes them (component-helpers,
/// overhead excluded), used for pod-scope hints (spec §4.7): per resource, the larger of
/// * app containers plus restartable init containers (sidecars), and
/// * for each init container: a regular one's own limit plus the sidecars declared before it;
///   a sidecar's running total of sidecars so far.
pub fn pod_effective_limits(pod: &PodSpec) -> BTreeMap<String, i64> {
    fn add(into: &mut BTreeMap<String, i64>, from: &BTreeMap<String, i64>) {
        for (k, v) in from {
            let e = into.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
    }
    fn max_into(into: &mut BTreeMap<String, i64>, from: &BTreeMap<String, i64>) {
        for (k, v) in from {
            let e = into.entry(k.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
    }
    let mut limits = BTreeMap::new();
    for c in &pod.containers {
        add(&mut limits, &c.limits);
    }
    let mut sidecars = BTreeMap::new();
    let mut init_peak = BTreeMap::new();
    for c in &pod.init_containers {
        if c.restartable {
            add(&mut limits, &c.limits);
            add(&mut sidecars, &c.limits);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut during = c.limits.clone();
            add(&mut during, &sidecars);
            max_into(&mut init_peak, &during);
        }
    }
    max_into(&mut limits, &init_peak);
    limits
}

/// Error a provider's `allocate` may return.
pub type ProviderError = Box<dyn std::error::Error + Send + Sync>;

/// The kubelet's `HintProvider` (device manager, CPU manager, memory manager).
pub trait HintProvider: Send + Sync {
    /// Hints for one container (container scope).
    fn get_topology_hints(&self, pod: &PodSpec, container: &ContainerSpec) -> ProviderHints;
    /// Hints for the whole pod (pod scope).
    fn get_pod_topology_hints(&self, pod: &PodSpec) -> ProviderHints;
    /// Allocate for a container, aligned with `affinity` (what `GetAffinity` would return).
    fn allocate(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        affinity: &TopologyHint,
    ) -> Result<(), ProviderError>;
}

/// The Topology Manager.
pub struct TopologyManager {
    policy: Policy,
    scope: Option<ScopeName>,
    providers: Vec<Arc<dyn HintProvider>>,
    affinity: HashMap<(String, String), TopologyHint>,
}

impl std::fmt::Debug for TopologyManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopologyManager")
            .field("policy", &self.policy)
            .field("scope", &self.scope)
            .field("providers", &self.providers.len())
            .finish()
    }
}

impl TopologyManager {
    /// The kubelet's `NewManager`. With `none`, options are not parsed and the scope is ignored.
    /// Otherwise, in the kubelet's order: options, distances (when closest is asked for), the
    /// NUMA count limit, then the policy and scope names.
    pub fn new(
        numa: &NumaTopology,
        policy: &str,
        scope: &str,
        options: &BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        if policy == PolicyName::None.as_str() {
            return Ok(TopologyManager {
                policy: Policy::new(
                    PolicyName::None,
                    PolicyOptions::default(),
                    numa.default_mask(),
                    None,
                )?,
                scope: None,
                providers: vec![],
                affinity: HashMap::new(),
            });
        }
        let options = PolicyOptions::parse(options)?;
        if options.prefer_closest_numa_nodes && numa.distances.is_none() {
            return Err(ConfigError::MissingDistances);
        }
        if numa.node_count() > options.max_allowable_numa_nodes {
            return Err(ConfigError::TooManyNumaNodes(
                options.max_allowable_numa_nodes,
            ));
        }
        let name: PolicyName = policy.parse()?;
        let scope: ScopeName = scope.parse()?;
        let policy = Policy::new(name, options, numa.default_mask(), numa.distances.clone())?;
        Ok(TopologyManager {
            policy,
            scope: Some(scope),
            providers: vec![],
            affinity: HashMap::new(),
        })
    }

    /// The configured policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The scope; `None` for the none policy (the kubelet's "none" scope).
    pub fn scope(&self) -> Option<ScopeName> {
        self.scope
    }

    /// `AddHintProvider`: providers are asked in registration order (device manager, CPU
    /// manager, memory manager in the kubelet).
    pub fn add_hint_provider(&mut self, provider: Arc<dyn HintProvider>) {
        self.providers.push(provider);
    }

    /// `GetAffinity`: the stored hint, or `{nil, false}`.
    pub fn get_affinity(&self, pod_uid: &str, container: &str) -> TopologyHint {
        self.affinity
            .get(&(pod_uid.to_string(), container.to_string()))
            .copied()
            .unwrap_or_default()
    }

    /// Forgets a pod's stored hints.
    pub fn remove_pod(&mut self, pod_uid: &str) {
        self.affinity.retain(|(uid, _), _| uid != pod_uid);
    }

    /// Forgets one container's stored hint.
    pub fn remove_container(&mut self, pod_uid: &str, container: &str) {
        self.affinity
            .remove(&(pod_uid.to_string(), container.to_string()));
    }

    /// `accumulateProvidersHints` (container scope): every provider's answer for `container`,
    /// in registration order.
    pub fn accumulate_container_hints(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
    ) -> Vec<ProviderHints> {
        self.providers
            .iter()
            .map(|p| p.get_topology_hints(pod, container))
            .collect()
    }

    /// `accumulateProvidersHints` (pod scope): every provider's answer for the whole pod, in
    /// registration order.
    pub fn accumulate_pod_hints(&self, pod: &PodSpec) -> Vec<ProviderHints> {
        self.providers
            .iter()
            .map(|p| p.get_pod_topology_hints(pod))
            .collect()
    }

    /// Merge without side effects (what `calculateAffinity` returns).
    pub fn calculate_container_affinity(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
    ) -> (TopologyHint, bool) {
        self.policy
            .merge(&self.accumulate_container_hints(pod, container))
    }

    /// Pod-scope merge without side effects.
    pub fn calculate_pod_affinity(&self, pod: &PodSpec) -> (TopologyHint, bool) {
        self.policy.merge(&self.accumulate_pod_hints(pod))
    }

    /// Starts admitting a pod under this manager's policy and scope (see [`PodAdmission`]);
    /// `pod_hints` is asked only in the pod scope. For callers whose providers are not
    /// registered here, e.g. devicelet's daemon, whose device allocation is async.
    pub fn begin_admission(
        &self,
        pod_hints: impl FnOnce() -> Vec<ProviderHints>,
    ) -> Result<PodAdmission<'_>, AdmissionError> {
        PodAdmission::begin(&self.policy, self.scope, pod_hints)
    }

    fn allocate(
        &self,
        pod: &PodSpec,
        container: &ContainerSpec,
        hint: &TopologyHint,
    ) -> Result<(), AdmissionError> {
        for p in &self.providers {
            p.allocate(pod, container, hint)
                .map_err(AdmissionError::Allocate)?;
        }
        Ok(())
    }

    /// `Admit`. Allocations made for earlier containers are not rolled back on a later
    /// rejection (as in the kubelet; the device manager's GC frees them).
    pub fn admit(&mut self, pod: &PodSpec) -> Result<(), AdmissionError> {
        // Borrow the policy field alone, so the affinity store stays writable below.
        let admission =
            PodAdmission::begin(&self.policy, self.scope, || self.accumulate_pod_hints(pod))?;
        for c in pod.all_containers() {
            let hint = admission.container_hint(|| self.accumulate_container_hints(pod, c))?;
            if admission.stores_affinity() {
                self.affinity
                    .insert((pod.uid.clone(), c.name.clone()), hint);
            }
            self.allocate(pod, c, &hint)?;
        }
        Ok(())
    }
}

/// A policy's `Merge`, as the scopes call it. [`Policy`] is the real one; tests substitute a
/// recording merger to see exactly what a scope hands to its policy.
pub trait HintMerger {
    /// The merged hint and whether the pod may be admitted.
    fn merge(&self, providers: &[ProviderHints]) -> (TopologyHint, bool);
}

impl HintMerger for Policy {
    fn merge(&self, providers: &[ProviderHints]) -> (TopologyHint, bool) {
        Policy::merge(self, providers)
    }
}

/// One pod's admission under a scope (`scope_none.go`, `scope_container.go`, `scope_pod.go`):
/// when hints are asked for, when the policy merges them, and which hint each container's
/// allocation follows. [`TopologyManager::admit`] and devicelet's daemon both run through it;
/// the caller allocates between [`PodAdmission::container_hint`] calls, so in the container
/// scope each container's hints see what the containers before it took.
#[derive(Debug)]
pub enum PodAdmission<'a, M: HintMerger + ?Sized = Policy> {
    /// The none policy: no hints are asked for and every container gets `{nil, false}`.
    Unaligned,
    /// Container scope: each container's hints are merged on their own.
    PerContainer(&'a M),
    /// Pod scope: the pod's hints were merged once; every container gets this hint.
    PerPod(TopologyHint),
}

impl<'a, M: HintMerger + ?Sized> PodAdmission<'a, M> {
    /// Starts a pod's admission. `scope` is `None` for the none policy. In the pod scope,
    /// `pod_hints` (every provider's pod answer, in registration order) is merged here and a
    /// refusal is [`AdmissionError::TopologyAffinity`]; other scopes never call it.
    pub fn begin(
        merger: &'a M,
        scope: Option<ScopeName>,
        pod_hints: impl FnOnce() -> Vec<ProviderHints>,
    ) -> Result<Self, AdmissionError> {
        match scope {
            None => Ok(PodAdmission::Unaligned),
            Some(ScopeName::Container) => Ok(PodAdmission::PerContainer(merger)),
            Some(ScopeName::Pod) => match merger.merge(&pod_hints()) {
                (hint, true) => Ok(PodAdmission::PerPod(hint)),
                (_, false) => Err(AdmissionError::TopologyAffinity),
            },
        }
    }

    /// The hint the next container's allocation must follow. Only the container scope calls
    /// `container_hints` (every provider's answer for this container) and merges it; a
    /// refusal is [`AdmissionError::TopologyAffinity`].
    pub fn container_hint(
        &self,
        container_hints: impl FnOnce() -> Vec<ProviderHints>,
    ) -> Result<TopologyHint, AdmissionError> {
        match self {
            PodAdmission::Unaligned => Ok(TopologyHint::default()),
            PodAdmission::PerPod(hint) => Ok(*hint),
            PodAdmission::PerContainer(merger) => match merger.merge(&container_hints()) {
                (hint, true) => Ok(hint),
                (_, false) => Err(AdmissionError::TopologyAffinity),
            },
        }
    }

    /// Whether `GetAffinity` remembers the containers' hints (not under the none policy).
    pub fn stores_affinity(&self) -> bool {
        !matches!(self, PodAdmission::Unaligned)
    }
}
