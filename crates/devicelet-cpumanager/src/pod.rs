//! From a Kubernetes `Pod` (k8s-openapi) to what the resource managers need: the topology
//! crate's [`PodSpec`], the pod's QoS class (`pkg/apis/core/v1/helper/qos/qos.go`,
//! `GetPodQOS` / `ComputePodQOS`) and each container's CPU request. Quantities come from
//! `devicelet-quantity` (exact; `Value()` / `MilliValue()` round up, as upstream).
//!
//! Requests missing from a container but present in its limits are defaulted to the limits, as
//! the API server does on create, so pods that were never defaulted classify the same way.
//! Pod-level `resources` (alpha `PodLevelResources`) are not considered.

use std::collections::BTreeMap;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Anything in between.
    Burstable,
    /// No requests and no limits for cpu or memory anywhere.
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

/// What the CPU manager needs to know about a pod besides its [`PodSpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCpuInfo {
    /// Pod as hint providers see it.
    pub spec: PodSpec,
    /// QoS class.
    pub qos: QosClass,
    /// Container name → CPU request in millicores (after defaulting to limits).
    pub cpu_requests_millis: BTreeMap<String, i64>,
}

impl PodCpuInfo {
    /// The kubelet's `guaranteedCPUs`: whole CPUs for a container of a Guaranteed pod, else 0.
    pub fn guaranteed_cpus(&self, container: &str) -> usize {
        if self.qos != QosClass::Guaranteed {
            return 0;
        }
        match self.cpu_requests_millis.get(container) {
            Some(&m) if m > 0 && m % 1000 == 0 => (m / 1000) as usize,
            _ => 0,
        }
    }

    /// The kubelet's `podGuaranteedCPUs`: the larger of the init phase's peak and the sum of
    /// long-running containers (app containers and sidecars).
    pub fn pod_guaranteed_cpus(&self) -> usize {
        let mut by_init = 0;
        let mut by_sidecars = 0;
        for c in &self.spec.init_containers {
            if !self.cpu_requests_millis.contains_key(&c.name) {
                continue;
            }
            let n = self.guaranteed_cpus(&c.name);
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
            .map(|c| self.guaranteed_cpus(&c.name))
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
        let restartable = is_init && c.restart_policy.as_deref() == Some("Always");
        let cs = to_spec(c, &lim, restartable)?;
        if is_init {
            init_specs.push(cs);
        } else {
            app_specs.push(cs);
        }
        amounts.push((req, lim));
    }
    let qos = match pod
        .status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .filter(|s| !s.is_empty())
    {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        Some("BestEffort") => QosClass::BestEffort,
        Some(other) => return Err(PodConversionError::UnknownQos(other.to_string())),
        None => compute_qos(&amounts),
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
    })
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
