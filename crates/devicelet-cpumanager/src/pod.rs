//! From a Kubernetes `Pod` (k8s-openapi) to what the resource managers need: the topology
//! crate's [`PodSpec`], the pod's QoS class (`pkg/apis/core/v1/helper/qos/qos.go`,
//! `GetPodQOS` / `ComputePodQOS`) and each container's CPU request. Quantities come from
//! `devicelet-quantity` (exact; `Value()` / `MilliValue()` round up, as upstream).
//!
//! Requests missing from a container but present in its limits are defaulted to the limits, as
//! the API server does on create, so pods that were never defaulted classify the same way.
//!
//! Pod-level `spec.resources` (KEP-2837 `PodLevelResources`, KEP-5526
//! `PodLevelResourceManagers`) are kept apart in [`PodLevelResources`]; the managers decide
//! with their feature gates ([`PodLevelGates`]) whether they apply. With both gates on, the
//! kubelet computes the QoS class from the pod-level amounts only
//! (`pkg/apis/core/v1/helper/qos/qos.go` `ComputePodQOS`), and a container gets exclusive CPUs
//! or memory only when its own requests equal its limits for both CPU and memory
//! (`pkg/kubelet/cm/qos/helpers.go` `IsContainerEquivalentQOSGuaranteed`).

use std::collections::{BTreeMap, BTreeSet};

pub use devicelet_quantity::{Quantity, QuantityError};
use devicelet_topology::{ContainerSpec, PodSpec};
use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;

/// Errors converting a pod.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PodConversionError {
    /// A resource quantity that does not parse.
    #[error("container {container:?}: resource {resource:?}: {source}")]
    Quantity {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Parse error.
        #[source]
        source: QuantityError,
    },
    /// `status.qosClass` holds something unknown.
    #[error("unknown QoS class {0:?}")]
    UnknownQos(String),
    /// Value does not fit the 64-bit limits map.
    #[error("container {container:?}: resource {resource:?} is out of range")]
    OutOfRange {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
    },
}

/// The pod QoS class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Anything in between.
    Burstable,
    /// No requests and no limits for cpu or memory anywhere.
    #[default]
    BestEffort,
}

impl QosClass {
    /// The API spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// The two feature gates that decide how pod-level `spec.resources` are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodLevelGates {
    /// `PodLevelResources` (beta, on by default in 1.36): the QoS class comes from
    /// `spec.resources` when the pod has them.
    pub resources: bool,
    /// `PodLevelResourceManagers` (alpha, off by default): the CPU and Memory managers
    /// allocate for the pod as a whole.
    pub managers: bool,
}

impl Default for PodLevelGates {
    /// 1.36.3's defaults.
    fn default() -> Self {
        PodLevelGates {
            resources: true,
            managers: false,
        }
    }
}

impl PodLevelGates {
    /// Reads both gates.
    pub fn from_gates(gates: &devicelet_topology::FeatureGates) -> Self {
        use devicelet_topology::gates::{POD_LEVEL_RESOURCE_MANAGERS, POD_LEVEL_RESOURCES};
        PodLevelGates {
            resources: gates.enabled(POD_LEVEL_RESOURCES),
            managers: gates.enabled(POD_LEVEL_RESOURCE_MANAGERS),
        }
    }
}

/// A pod's own `spec.resources`, as the resource managers read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLevelResources {
    /// component-helpers `IsPodLevelResourcesSet`: a CPU, memory or hugepages request or
    /// limit is present.
    pub set: bool,
    /// QoS class from the pod-level amounts alone (`status.qosClass` when set).
    pub qos: QosClass,
    /// CPU request in millicores (after defaulting to the limit).
    pub cpu_request_millis: Option<i64>,
    /// Memory and hugepages requests in bytes, positive ones only (`getPodRequestedResources`);
    /// `None` when one is not a whole number of bytes (the kubelet then allocates nothing).
    pub memory_requests: Option<BTreeMap<String, u64>>,
}

/// What the CPU manager needs to know about a pod besides its [`PodSpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCpuInfo {
    /// Pod as hint providers see it.
    pub spec: PodSpec,
    /// QoS class (from the containers, or `status.qosClass`).
    pub qos: QosClass,
    /// Container name → CPU request in millicores (after defaulting to limits).
    pub cpu_requests_millis: BTreeMap<String, i64>,
    /// `spec.resources`, when the pod has them.
    pub pod_level: Option<PodLevelResources>,
    /// Containers whose CPU and memory requests equal their (non-zero) limits.
    pub equivalent_guaranteed: BTreeSet<String>,
}

impl PodCpuInfo {
    /// Whether the pod has pod-level resources (`IsPodLevelResourcesSet`).
    pub fn pod_level_set(&self) -> bool {
        self.pod_level.as_ref().is_some_and(|p| p.set)
    }

    /// Whether the managers allocate for this pod as a whole (both gates on, pod-level
    /// resources set).
    pub fn managed_at_pod_level(&self, gates: PodLevelGates) -> bool {
        gates.managers && gates.resources && self.pod_level_set()
    }

    /// Whether the managers leave this pod alone: it has pod-level resources, but the gates
    /// do not let the managers handle them (the kubelet logs "allocation skipped").
    pub fn skipped_for_pod_level(&self, gates: PodLevelGates) -> bool {
        self.pod_level_set() && !(gates.managers && gates.resources)
    }

    /// `GetPodQOS` under `gates`: with `PodLevelResources` and `spec.resources` present, the
    /// pod-level class.
    pub fn qos_with(&self, gates: PodLevelGates) -> QosClass {
        match &self.pod_level {
            Some(p) if gates.resources => p.qos,
            _ => self.qos,
        }
    }

    /// Whether a container's own CPU and memory requests equal its limits.
    pub fn is_equivalent_guaranteed(&self, container: &str) -> bool {
        self.equivalent_guaranteed.contains(container)
    }

    /// The kubelet's `guaranteedCPUs`: whole CPUs for a container of a Guaranteed pod, else 0.
    /// Under pod-level management a container must also be Guaranteed on its own.
    pub fn guaranteed_cpus_with(&self, gates: PodLevelGates, container: &str) -> usize {
        if self.qos_with(gates) != QosClass::Guaranteed {
            return 0;
        }
        if self.managed_at_pod_level(gates) && !self.is_equivalent_guaranteed(container) {
            return 0;
        }
        match self.cpu_requests_millis.get(container) {
            Some(&m) if m > 0 && m % 1000 == 0 => (m / 1000) as usize,
            _ => 0,
        }
    }

    /// [`PodCpuInfo::guaranteed_cpus_with`] under 1.36.3's default gates.
    pub fn guaranteed_cpus(&self, container: &str) -> usize {
        self.guaranteed_cpus_with(PodLevelGates::default(), container)
    }

    /// [`PodCpuInfo::pod_guaranteed_cpus_with`] under 1.36.3's default gates.
    pub fn pod_guaranteed_cpus(&self) -> usize {
        self.pod_guaranteed_cpus_with(PodLevelGates::default())
    }

    /// The kubelet's `podGuaranteedCPUs`: under pod-level management the pod's own whole CPU
    /// request; else the larger of the init phase's peak and the sum of long-running
    /// containers (app containers and sidecars).
    pub fn pod_guaranteed_cpus_with(&self, gates: PodLevelGates) -> usize {
        if self.managed_at_pod_level(gates) {
            if self.qos_with(gates) != QosClass::Guaranteed {
                return 0;
            }
            return match self.pod_level.as_ref().and_then(|p| p.cpu_request_millis) {
                Some(m) if m > 0 && m % 1000 == 0 => (m / 1000) as usize,
                _ => 0,
            };
        }
        let mut by_init = 0;
        let mut by_sidecars = 0;
        for c in &self.spec.init_containers {
            if !self.cpu_requests_millis.contains_key(&c.name) {
                continue;
            }
            let n = self.guaranteed_cpus_with(gates, &c.name);
            if c.restartable {
                by_sidecars += n;
            } else {
                by_init = by_init.max(by_sidecars + n);
            }
        }
        let by_apps: usize = self
            .spec
            .containers
            .iter()
            .filter(|c| self.cpu_requests_millis.contains_key(&c.name))
            .map(|c| self.guaranteed_cpus_with(gates, &c.name))
            .sum();
        by_init.max(by_apps + by_sidecars)
    }
}

type Amounts = BTreeMap<String, Quantity>;

fn parse_map(
    container: &str,
    m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Result<Amounts, PodConversionError> {
    let mut out = BTreeMap::new();
    for (k, v) in m.into_iter().flatten() {
        let q = Quantity::parse(&v.0).map_err(|source| PodConversionError::Quantity {
            container: container.to_string(),
            resource: k.clone(),
            source,
        })?;
        out.insert(k.clone(), q);
    }
    Ok(out)
}

/// (requests after defaulting, limits) of a container.
fn container_amounts(c: &Container) -> Result<(Amounts, Amounts), PodConversionError> {
    let res = c.resources.as_ref();
    let limits = parse_map(&c.name, res.and_then(|r| r.limits.as_ref()))?;
    let mut requests = parse_map(&c.name, res.and_then(|r| r.requests.as_ref()))?;
    for (k, v) in &limits {
        requests.entry(k.clone()).or_insert(*v);
    }
    Ok((requests, limits))
}

/// `ComputePodQOS` over (requests, limits) of every container, init containers included.
fn compute_qos(amounts: &[(Amounts, Amounts)]) -> QosClass {
    const SUPPORTED: [&str; 2] = ["cpu", "memory"];
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    for (req, lim) in amounts {
        for name in SUPPORTED {
            if let Some(q) = req.get(name).filter(|q| q.sign() > 0) {
                *requests.entry(name).or_default() += q.nanos();
            }
        }
        let mut found = 0;
        for name in SUPPORTED {
            if let Some(q) = lim.get(name).filter(|q| q.sign() > 0) {
                *limits.entry(name).or_default() += q.nanos();
                found += 1;
            }
        }
        if found != SUPPORTED.len() {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed && requests == limits {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}

fn to_spec(
    c: &Container,
    limits: &Amounts,
    restartable: bool,
) -> Result<ContainerSpec, PodConversionError> {
    let mut out = BTreeMap::new();
    for (k, q) in limits {
        // CPU in millicores, everything else (memory bytes, extended resources) in units.
        let v = if k == "cpu" {
            q.milli_value_ceil()
        } else {
            q.value_ceil()
        };
        let v = i64::try_from(v).map_err(|_| PodConversionError::OutOfRange {
            container: c.name.clone(),
            resource: k.clone(),
        })?;
        out.insert(k.clone(), v);
    }
    Ok(ContainerSpec {
        name: c.name.clone(),
        limits: out,
        restartable,
    })
}

/// Maps a Kubernetes pod to the managers' view: [`PodSpec`] (limits: CPU in millicores, memory
/// in bytes, extended resources as integers), QoS class (`status.qosClass` when set, as
/// `GetPodQOS` does, else computed) and CPU requests.
pub fn pod_from_k8s(pod: &Pod) -> Result<PodCpuInfo, PodConversionError> {
    let empty = vec![];
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_ref())
        .unwrap_or(&empty);
    let apps = spec.map(|s| &s.containers).unwrap_or(&empty);
    let mut amounts = vec![];
    let mut cpu_requests = BTreeMap::new();
    let mut init_specs = vec![];
    let mut app_specs = vec![];
    let mut equivalent = BTreeSet::new();
    for (c, is_init) in init
        .iter()
        .map(|c| (c, true))
        .chain(apps.iter().map(|c| (c, false)))
    {
        let (req, lim) = container_amounts(c)?;
        if let Some(q) = req.get("cpu") {
            let m = i64::try_from(q.milli_value_ceil()).map_err(|_| {
                PodConversionError::OutOfRange {
                    container: c.name.clone(),
                    resource: "cpu".into(),
                }
            })?;
            cpu_requests.insert(c.name.clone(), m);
        }
        let equal = |name: &str| match (req.get(name), lim.get(name)) {
            (Some(r), Some(l)) => r.sign() != 0 && r == l,
            _ => false,
        };
        if equal("cpu") && equal("memory") {
            equivalent.insert(c.name.clone());
        }
        let restartable = is_init && c.restart_policy.as_deref() == Some("Always");
        let cs = to_spec(c, &lim, restartable)?;
        if is_init {
            init_specs.push(cs);
        } else {
            app_specs.push(cs);
        }
        amounts.push((req, lim));
    }
    let status_qos = match pod
        .status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .filter(|s| !s.is_empty())
    {
        Some("Guaranteed") => Some(QosClass::Guaranteed),
        Some("Burstable") => Some(QosClass::Burstable),
        Some("BestEffort") => Some(QosClass::BestEffort),
        Some(other) => return Err(PodConversionError::UnknownQos(other.to_string())),
        None => None,
    };
    let qos = status_qos.unwrap_or_else(|| compute_qos(&amounts));
    let pod_level = match spec.and_then(|s| s.resources.as_ref()) {
        None => None,
        Some(r) => Some(pod_level_resources(r, status_qos)?),
    };
    let meta = &pod.metadata;
    Ok(PodCpuInfo {
        spec: PodSpec {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            init_containers: init_specs,
            containers: app_specs,
        },
        qos,
        cpu_requests_millis: cpu_requests,
        pod_level,
        equivalent_guaranteed: equivalent,
    })
}

/// The name the conversion errors use for the pod's own `spec.resources`.
const POD_LEVEL: &str = "<pod>";

/// `spec.resources` of a pod: whether they count (`IsPodLevelResourcesSet`), the QoS class
/// they give (`ComputePodQOS` with `PodLevelResources`), the CPU request and the memory and
/// hugepages requests (defaulted to the limits, as the API server does).
fn pod_level_resources(
    r: &k8s_openapi::api::core::v1::ResourceRequirements,
    status_qos: Option<QosClass>,
) -> Result<PodLevelResources, PodConversionError> {
    let limits = parse_map(POD_LEVEL, r.limits.as_ref())?;
    let mut requests = parse_map(POD_LEVEL, r.requests.as_ref())?;
    // `IsSupportedPodLevelResource`: cpu, memory, hugepages-*; looked for before defaulting.
    let supported = |name: &str| name == "cpu" || name == "memory" || is_hugepages(name);
    let set = requests.keys().chain(limits.keys()).any(|k| supported(k));
    for (k, v) in &limits {
        requests.entry(k.clone()).or_insert(*v);
    }
    let qos = status_qos.unwrap_or_else(|| compute_qos(&[(requests.clone(), limits)]));
    let cpu_request_millis = match requests.get("cpu") {
        None => None,
        Some(q) => Some(i64::try_from(q.milli_value_ceil()).map_err(|_| {
            PodConversionError::OutOfRange {
                container: POD_LEVEL.into(),
                resource: "cpu".into(),
            }
        })?),
    };
    // `Quantity.AsInt64` fails for a fractional or huge amount; the kubelet then gives up on
    // the pod's memory (logs, no hints, no allocation).
    let mut memory = Some(BTreeMap::new());
    for (name, q) in &requests {
        if name != "memory" && !is_hugepages(name) {
            continue;
        }
        match (q.is_integer(), i64::try_from(q.value_ceil())) {
            (true, Ok(v)) => {
                if v > 0
                    && let Some(m) = memory.as_mut()
                {
                    m.insert(name.clone(), v as u64);
                }
            }
            _ => memory = None,
        }
    }
    Ok(PodLevelResources {
        set,
        qos,
        cpu_request_millis,
        memory_requests: memory,
    })
}

fn is_hugepages(name: &str) -> bool {
    name.starts_with("hugepages-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_like_apimachinery() {
        let m = |s: &str| Quantity::parse(s).map(|q| q.milli_value_ceil());
        assert_eq!(m("2"), Ok(2000));
        assert_eq!(m("500m"), Ok(500));
        assert_eq!(m("1.5"), Ok(1500));
        assert_eq!(m(".5"), Ok(500));
        assert_eq!(m("1e3"), Ok(1_000_000));
        assert_eq!(m("2k"), Ok(2_000_000));
        assert_eq!(m("100n"), Ok(1), "MilliValue rounds up");
        assert_eq!(
            Quantity::parse("1Gi").map(|q| q.value_ceil()),
            Ok(1_073_741_824)
        );
        assert_eq!(
            Quantity::parse("1.5Mi").map(|q| q.value_ceil()),
            Ok(1_572_864)
        );
        assert!(Quantity::parse("1.5").is_ok_and(|q| !q.is_integer()));
        assert!(Quantity::parse("3000m").is_ok_and(|q| q.is_integer()));
        for bad in ["", "m", "1.2.3", "1x", "1Gb", "abc", "1 Gi"] {
            assert!(
                matches!(Quantity::parse(bad), Err(QuantityError::Format(_))),
                "{bad:?}"
            );
        }
        // "1e" matches apimachinery's quantity pattern; only its suffix is bad (ErrSuffix).
        assert!(matches!(
            Quantity::parse("1e"),
            Err(QuantityError::Suffix(_))
        ));
        assert!(matches!(
            Quantity::parse("1e40"),
            Err(QuantityError::OutOfRange(_))
        ));
    }
}
