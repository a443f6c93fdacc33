//! NodeResourcesFit (`pkg/scheduler/framework/plugins/noderesources/fit.go`,
//! `k8s.io/component-helpers/resource` `PodRequests`, S106-S111) and its default
//! scores: `LeastAllocated` (S127), `MostAllocated` and `RequestedToCapacityRatio` (W113).
//!
//! Quantities are kept in nano-units (`Quantity::nanos`), so cpu, memory and extended resources
//! compare exactly whatever suffix they were written with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use devicelet_quantity::Quantity;
use k8s_openapi::api::core::v1::{Container, Node, Pod};

use super::node_ports::HostPort;
use super::pod_info::PodInfo;
use crate::config::{ScoringStrategy, StrategyKind};
use crate::framework::{Code, Plugin, Rejection};

/// Resource name → amount in nano-units.
pub type ResourceList = BTreeMap<String, i128>;

pub(crate) const NANO: i128 = 1_000_000_000;
/// Non-zero defaults used for scoring only (`schedutil.DefaultMilliCPURequest`,
/// `DefaultMemoryRequest`): 100 mCPU and 200 MiB.
const DEFAULT_CPU: i128 = NANO / 10;
const DEFAULT_MEMORY: i128 = 200 * 1024 * 1024 * NANO;

fn parse(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> i128 {
    // The API server validated every quantity; a hand-made bad one counts as zero.
    Quantity::parse(&q.0).map(|q| q.nanos()).unwrap_or(0)
}

/// A container's requests, plus each of `defaults` it does not name (upstream's
/// `NonMissingContainerRequests`: a container without a cpu request counts 100m for scoring).
fn container_requests(c: &Container, defaults: &[(&str, i128)]) -> ResourceList {
    let mut r: ResourceList = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), parse(v)))
        .collect();
    for (k, v) in defaults {
        r.entry((*k).to_owned()).or_insert(*v);
    }
    r
}

fn add_into(total: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        *total.entry(k.clone()).or_default() += v;
    }
}

fn max_into(total: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        let slot = total.entry(k.clone()).or_default();
        *slot = (*slot).max(*v);
    }
}

/// The pod's effective requests (S106): the regular containers plus every sidecar (restartable
/// init container), or the largest init container plus the sidecars started before it if that
/// is more, plus `spec.overhead`; pod-level `resources.requests` replace the container sum for
/// the resources they name (PodLevelResources).
pub fn pod_requests(pod: &Pod) -> ResourceList {
    pod_requests_with(pod, &[])
}

/// The cpu and memory the scores count for `pod` (upstream `NodeInfo`'s `Non0CPU`/`Non0Mem`):
/// [`pod_requests`] with every container that names no cpu (memory) request counted at 100m
/// (200 MiB); with pod-level requests, only for a resource the pod level does not name either.
/// The same for the pod being scheduled: upstream's NodeResourcesFit score ignores its
/// pod-level requests (`NewFit` never sets the scorer's `enablePodLevelResources`) although the
/// pod counts with them once bound; an upstream bug, fixed here (interop/scheduler lists it).
pub fn non_zero_requests(pod: &Pod) -> (i128, i128) {
    let requests = pod_requests(pod);
    let pod_level = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|r| !r.is_empty());
    let defaults: Vec<(&str, i128)> = [("cpu", DEFAULT_CPU), ("memory", DEFAULT_MEMORY)]
        .into_iter()
        .filter(|(k, _)| !pod_level || !requests.contains_key(*k))
        .collect();
    let counted = if defaults.is_empty() {
        requests
    } else {
        pod_requests_with(pod, &defaults)
    };
    let get = |k: &str| counted.get(k).copied().unwrap_or(0);
    (get("cpu"), get("memory"))
}

fn pod_requests_with(pod: &Pod, defaults: &[(&str, i128)]) -> ResourceList {
    let Some(spec) = pod.spec.as_ref() else {
        return ResourceList::new();
    };
    let mut total = ResourceList::new();
    for c in &spec.containers {
        add_into(&mut total, &container_requests(c, defaults));
    }
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in spec.init_containers.iter().flatten() {
        let own = container_requests(c, defaults);
        let effective = if c.restart_policy.as_deref() == Some("Always") {
            add_into(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut with_sidecars = own;
            add_into(&mut with_sidecars, &sidecars);
            with_sidecars
        };
        max_into(&mut init_max, &effective);
    }
    add_into(&mut total, &sidecars);
    max_into(&mut total, &init_max);
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        for (k, v) in pod_level {
            total.insert(k.clone(), parse(v));
        }
    }
    if let Some(overhead) = &spec.overhead {
        for (k, v) in overhead {
            *total.entry(k.clone()).or_default() += parse(v);
        }
    }
    total.retain(|_, v| *v != 0);
    total
}

/// What the pods bound to (or assumed on) one node use (S111).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeUsage {
    pub requested: ResourceList,
    /// cpu and memory with the scoring defaults for pods that request none.
    pub non_zero_cpu: i128,
    pub non_zero_memory: i128,
    pub pods: usize,
    pub host_ports: Vec<HostPort>,
    /// The pods themselves as the inter-pod plugins read them (labels, namespaces, affinity
    /// terms), in no particular order.
    pub pod_infos: Vec<Arc<PodInfo>>,
    /// How many of them have any pod (anti-)affinity term, and how many a required
    /// anti-affinity term (upstream's `PodsWithAffinity`, `PodsWithRequiredAntiAffinity`):
    /// without either anywhere, a pod without terms of its own skips InterPodAffinity.
    pub with_affinity: usize,
    pub with_required_anti_affinity: usize,
}

/// One pod's share of a [`NodeUsage`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodUsage {
    pub requests: ResourceList,
    /// cpu and memory as the scores count them ([`non_zero_requests`]).
    pub non_zero: (i128, i128),
    pub host_ports: Vec<HostPort>,
    pub info: Option<Arc<PodInfo>>,
}

impl PodUsage {
    /// The usage of `pod`.
    pub fn of(pod: &Pod) -> Self {
        PodUsage {
            requests: pod_requests(pod),
            non_zero: non_zero_requests(pod),
            host_ports: super::node_ports::host_ports(pod),
            info: Some(Arc::new(PodInfo::of(pod))),
        }
    }
}

impl NodeUsage {
    /// Counts a pod in.
    pub fn add(&mut self, pod: &PodUsage) {
        add_into(&mut self.requested, &pod.requests);
        let (cpu, mem) = pod.non_zero;
        self.non_zero_cpu += cpu;
        self.non_zero_memory += mem;
        self.pods += 1;
        self.host_ports.extend(pod.host_ports.iter().cloned());
        if let Some(info) = &pod.info {
            self.with_affinity += usize::from(info.has_affinity());
            self.with_required_anti_affinity += usize::from(info.has_required_anti_affinity());
            self.pod_infos.push(info.clone());
        }
    }

    /// Counts a pod out (the inverse of [`NodeUsage::add`]).
    pub fn remove(&mut self, pod: &PodUsage) {
        for (k, v) in &pod.requests {
            if let Some(slot) = self.requested.get_mut(k) {
                *slot -= v;
                if *slot == 0 {
                    self.requested.remove(k);
                }
            }
        }
        let (cpu, mem) = pod.non_zero;
        self.non_zero_cpu -= cpu;
        self.non_zero_memory -= mem;
        self.pods = self.pods.saturating_sub(1);
        for p in &pod.host_ports {
            if let Some(i) = self.host_ports.iter().position(|h| h == p) {
                self.host_ports.swap_remove(i);
            }
        }
        if let Some(info) = &pod.info
            && let Some(i) = self.pod_infos.iter().position(|p| p.uid == info.uid)
        {
            let gone = self.pod_infos.swap_remove(i);
            self.with_affinity -= usize::from(gone.has_affinity());
            self.with_required_anti_affinity -= usize::from(gone.has_required_anti_affinity());
        }
    }
}

/// The node's allocatable, parsed (the cache keeps it per node: filters and scores look at it
/// for every node of every attempt).
pub fn allocatable(node: &Node) -> ResourceList {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), parse(v)))
        .collect()
}

/// Whether the node advertises `resource` (allocatable above 0): a DRA-backed extended
/// resource is then served by the node's device plugin (S112).
pub fn advertises(node: &Node, resource: &str) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .is_some_and(|q| parse(q) > 0)
}

/// Rejects a node without room for the pod: `Too many pods`, `Insufficient <resource>` (one
/// reason per resource; unresolvable when the request exceeds the node's allocatable itself).
/// Resources in `via_dra` the node does not advertise are left to DRA (S112).
pub fn filter(
    requests: &ResourceList,
    via_dra: &BTreeSet<String>,
    alloc: &ResourceList,
    usage: &NodeUsage,
) -> Option<Rejection> {
    let mut reasons = Vec::new();
    let mut unresolvable = false;
    let max_pods = alloc.get("pods").copied().unwrap_or(0) / NANO;
    if (usage.pods as i128) + 1 > max_pods {
        reasons.push("Too many pods".to_owned());
    }
    // Upstream's order (`fitsRequest`): cpu, memory, ephemeral-storage, then the rest (a Go
    // map there, so in no fixed order; here by name).
    const FIRST: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];
    let ordered = FIRST
        .iter()
        .filter_map(|n| requests.get_key_value(*n))
        .chain(
            requests
                .iter()
                .filter(|(n, _)| !FIRST.contains(&n.as_str())),
        );
    for (name, want) in ordered {
        if *want <= 0 || name == "pods" {
            continue;
        }
        let have = alloc.get(name).copied().unwrap_or(0);
        if have <= 0 && via_dra.contains(name) {
            continue;
        }
        let used = usage.requested.get(name).copied().unwrap_or(0);
        if *want > have - used {
            reasons.push(format!("Insufficient {name}"));
            unresolvable |= *want > have;
        }
    }
    if reasons.is_empty() {
        return None;
    }
    // As upstream: one request above the node's allocatable itself makes the whole status
    // unresolvable (preemption cannot help there).
    let code = if unresolvable {
        Code::UnschedulableAndUnresolvable
    } else {
        Code::Unschedulable
    };
    Some(Rejection {
        plugin: Plugin::NodeResourcesFit,
        code,
        reasons,
    })
}

/// A DRA-backed extended resource on one node (W117), in the nano-units of a [`ResourceList`]:
/// the devices of its class there, those in use, and what the pod takes of them through its
/// claims (devicelet's device bin-packing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceUse {
    pub capacity: i128,
    pub allocated: i128,
    pub pod: i128,
}

/// The score of the profile's `scoringStrategy` (W113, W114, W116, W117), 0-100. Per resource
/// of the strategy with allocatable > 0: requested = the node's + the pod's (cpu and memory with
/// the non-zero defaults); an extended resource the pod does not request is left out. An
/// extended resource the node does not advertise counts through `devices` when a DeviceClass
/// backs it: its devices on the node, those in use, plus what the pod asks (its extended
/// request and, beyond upstream, the devices of that class its claims get there).
pub fn fit_score(
    strategy: &ScoringStrategy,
    requests: &ResourceList,
    (cpu, mem): (i128, i128),
    alloc: &ResourceList,
    usage: &NodeUsage,
    devices: impl Fn(&str) -> Option<DeviceUse>,
) -> i64 {
    let mut score_sum: i128 = 0;
    let mut weight_sum: i128 = 0;
    for (name, weight) in &strategy.resources {
        let (requested, capacity) = match name.as_str() {
            "cpu" => (
                usage.non_zero_cpu + cpu,
                alloc.get("cpu").copied().unwrap_or(0),
            ),
            "memory" => (
                usage.non_zero_memory + mem,
                alloc.get("memory").copied().unwrap_or(0),
            ),
            other => {
                let capacity = alloc.get(other).copied().unwrap_or(0);
                let want = requests.get(other).copied().unwrap_or(0);
                if capacity > 0 {
                    if want <= 0 {
                        continue;
                    }
                    let used = usage.requested.get(other).copied().unwrap_or(0);
                    (used + want, capacity)
                } else {
                    let Some(d) = devices(other) else { continue };
                    let want = want + d.pod;
                    if want <= 0 {
                        continue;
                    }
                    (d.allocated + want, d.capacity)
                }
            }
        };
        if capacity <= 0 {
            continue;
        }
        let weight = i128::from(*weight);
        let score = match &strategy.kind {
            StrategyKind::LeastAllocated if requested > capacity => 0,
            StrategyKind::LeastAllocated => (capacity - requested) * 100 / capacity,
            StrategyKind::MostAllocated => requested.min(capacity) * 100 / capacity,
            StrategyKind::RequestedToCapacityRatio(shape) => {
                let utilization = if requested > capacity {
                    100
                } else {
                    requested * 100 / capacity
                };
                let s = broken_linear(shape, utilization);
                // Only resources that score enter the mean.
                if s <= 0 {
                    continue;
                }
                s
            }
        };
        score_sum += score * weight;
        weight_sum += weight;
    }
    if weight_sum == 0 {
        return 0;
    }
    match strategy.kind {
        // The rounded mean (`math.Round`).
        StrategyKind::RequestedToCapacityRatio(_) => {
            ((score_sum * 2 + weight_sum) / (weight_sum * 2)) as i64
        }
        _ => (score_sum / weight_sum) as i64,
    }
}

/// NodeResourcesBalancedAllocation's score (W118): how much more even the use of `resources`
/// (its args; cpu and memory by default) gets with the pod, 50-100 (upstream
/// `balancedResourceScorer`: 50 + (50 + with - without) / 2, each (1 - the standard deviation
/// of the used fractions) × 100). Requests as written, no non-zero defaults; an extended
/// resource the pod does not request is left out. `None` for a pod that requests none of them
/// (PreScore skips best-effort pods).
pub fn balanced_allocation_score(
    resources: &[String],
    requests: &ResourceList,
    alloc: &ResourceList,
    usage: &NodeUsage,
) -> Option<i64> {
    let wanted = |r: &str| requests.get(r).copied().unwrap_or(0);
    if resources.iter().all(|r| wanted(r) <= 0) {
        return None;
    }
    let balance = |with_pod: bool| -> i64 {
        let fractions: Vec<f64> = resources
            .iter()
            .filter(|r| {
                matches!(r.as_str(), "cpu" | "memory" | "ephemeral-storage") || wanted(r) > 0
            })
            .filter_map(|r| {
                let capacity = alloc.get(r.as_str()).copied().unwrap_or(0);
                if capacity <= 0 {
                    return None;
                }
                let mut used = usage.requested.get(r.as_str()).copied().unwrap_or(0);
                if with_pod {
                    used += wanted(r);
                }
                Some((used as f64 / capacity as f64).min(1.0))
            })
            .collect();
        let std = match fractions.as_slice() {
            [a, b] => ((a - b) / 2.0).abs(),
            [_, _, _, ..] => {
                let n = fractions.len() as f64;
                let mean = fractions.iter().sum::<f64>() / n;
                (fractions
                    .iter()
                    .map(|f| (f - mean) * (f - mean))
                    .sum::<f64>()
                    / n)
                    .sqrt()
            }
            _ => 0.0,
        };
        ((1.0 - std) * 100.0) as i64
    };
    Some(50 + (50 + balance(true) - balance(false)) / 2)
}

/// The shape's piecewise linear function at `utilization`, its 0-10 scores scaled to 0-100
/// (`buildBrokenLinearFunction`).
fn broken_linear(shape: &[(i64, i64)], utilization: i128) -> i128 {
    let scaled = |s: i64| i128::from(s) * 100 / 10;
    let Some(&(first_u, first_s)) = shape.first() else {
        return 0;
    };
    if utilization <= i128::from(first_u) {
        return scaled(first_s);
    }
    for w in shape.windows(2) {
        let ((u0, s0), (u1, s1)) = (w[0], w[1]);
        let (u0, u1) = (i128::from(u0), i128::from(u1));
        if utilization <= u1 {
            let (s0, s1) = (scaled(s0), scaled(s1));
            return s0 + (s1 - s0) * (utilization - u0) / (u1 - u0);
        }
    }
    shape.last().map_or(0, |&(_, s)| scaled(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_memory() -> Vec<String> {
        vec!["cpu".to_owned(), "memory".to_owned()]
    }

    /// The scores' cpu and memory of a one-container pod asking `r`.
    fn nz(r: &ResourceList) -> (i128, i128) {
        let get = |k: &str, d: i128| r.get(k).copied().unwrap_or(d);
        (get("cpu", DEFAULT_CPU), get("memory", DEFAULT_MEMORY))
    }
    use k8s_openapi::api::core::v1::{NodeStatus, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn container(cpu: &str, restart: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            restart_policy: restart.map(str::to_owned),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".to_owned(), Q(cpu.to_owned()))])),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn cpu(list: &ResourceList) -> i128 {
        list.get("cpu").copied().unwrap_or(0) * 1000 / NANO
    }

    #[test]
    fn s106_init_containers_and_sidecars() {
        // Containers 1 CPU; sidecar 500m started first; init container 2 CPUs after it:
        // max(1 + 0.5, 2 + 0.5) = 2.5 CPUs, plus 100m overhead.
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![container("1", None)],
                init_containers: Some(vec![
                    container("500m", Some("Always")),
                    container("2", None),
                ]),
                overhead: Some(BTreeMap::from([("cpu".to_owned(), Q("100m".into()))])),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        assert_eq!(cpu(&pod_requests(&pod)), 2600);
        // A sidecar after the init container runs beside the regular containers only.
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![container("1", None)],
                init_containers: Some(vec![
                    container("2", None),
                    container("500m", Some("Always")),
                ]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        assert_eq!(cpu(&pod_requests(&pod)), 2000);
    }

    #[test]
    fn s107_s109_messages_and_codes() {
        let node = Node {
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([
                    ("cpu".to_owned(), Q("2".into())),
                    ("pods".to_owned(), Q("1".into())),
                    ("example.com/gpu".to_owned(), Q("1".into())),
                ])),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        let facts = |reqs: &[(&str, i128)]| -> ResourceList {
            reqs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let empty = NodeUsage::default();
        assert!(
            filter(
                &facts(&[("cpu", NANO)]),
                &BTreeSet::new(),
                &allocatable(&node),
                &empty
            )
            .is_none()
        );
        let r = filter(
            &facts(&[("cpu", 3 * NANO)]),
            &BTreeSet::new(),
            &allocatable(&node),
            &empty,
        )
        .expect("too big");
        assert_eq!(r.reasons, vec!["Insufficient cpu"]);
        assert_eq!(r.code, Code::UnschedulableAndUnresolvable);
        // S112: a DRA-backed extended resource the node does not advertise is DRA's to check.
        let fpga = facts(&[("example.com/fpga", NANO)]);
        let via_dra = BTreeSet::from(["example.com/fpga".to_owned()]);
        assert!(filter(&fpga, &via_dra, &allocatable(&node), &empty).is_none());
        assert!(filter(&fpga, &BTreeSet::new(), &allocatable(&node), &empty).is_some());
        let mut used = NodeUsage::default();
        used.add(&PodUsage {
            requests: BTreeMap::from([("example.com/gpu".to_owned(), NANO)]),
            ..PodUsage::default()
        });
        let r = filter(
            &facts(&[("example.com/gpu", NANO)]),
            &BTreeSet::new(),
            &allocatable(&node),
            &used,
        )
        .expect("full");
        assert_eq!(
            r.reasons,
            vec!["Too many pods", "Insufficient example.com/gpu"]
        );
        assert_eq!(r.code, Code::Unschedulable);
        used.remove(&PodUsage {
            requests: BTreeMap::from([("example.com/gpu".to_owned(), NANO)]),
            ..PodUsage::default()
        });
        assert_eq!(used, NodeUsage::default());
    }

    #[test]
    fn w117_a_dra_backed_resource_scores_through_the_devices_of_its_class() {
        use crate::config::{ScoringStrategy, StrategyKind};
        let alloc = ResourceList::from([("cpu".to_owned(), 4 * NANO)]);
        let usage = NodeUsage::default();
        let class = "deviceclass.resource.kubernetes.io/gpu";
        let most = ScoringStrategy {
            kind: StrategyKind::MostAllocated,
            resources: vec![(class.to_owned(), 1)],
        };
        // 8 GPUs, 6 in use, the pod's claim takes 1: 7/8.
        let devices = |pod: i128| {
            move |name: &str| {
                (name == class).then_some(DeviceUse {
                    capacity: 8 * NANO,
                    allocated: 6 * NANO,
                    pod: pod * NANO,
                })
            }
        };
        let none = ResourceList::new();
        assert_eq!(
            fit_score(&most, &none, nz(&none), &alloc, &usage, devices(1)),
            87
        );
        // Nothing of that class for this pod: the resource adds no score and no weight (W116).
        assert_eq!(
            fit_score(&most, &none, nz(&none), &alloc, &usage, devices(0)),
            0
        );
        // An extended-resource request of it counts as upstream's does.
        let asks = ResourceList::from([(class.to_owned(), NANO)]);
        assert_eq!(
            fit_score(&most, &asks, nz(&asks), &alloc, &usage, devices(0)),
            87
        );
        // A node without such devices: nothing.
        assert_eq!(
            fit_score(&most, &asks, nz(&asks), &alloc, &usage, |_| None),
            0
        );
    }

    #[test]
    fn w113_w116_scoring_strategies() {
        use crate::config::{ScoringStrategy, StrategyKind};
        // 4 CPUs, 8 GPUs; 1 CPU and 6 GPUs in use; the pod asks 1 CPU and 1 GPU.
        let gib = 1024 * 1024 * 1024 * NANO;
        let alloc = ResourceList::from([
            ("cpu".to_owned(), 4 * NANO),
            ("memory".to_owned(), 16 * gib),
            ("nvidia.com/gpu".to_owned(), 8 * NANO),
        ]);
        let usage = NodeUsage {
            requested: ResourceList::from([("nvidia.com/gpu".to_owned(), 6 * NANO)]),
            non_zero_cpu: NANO,
            non_zero_memory: 0,
            pods: 1,
            ..NodeUsage::default()
        };
        let pod = ResourceList::from([
            ("cpu".to_owned(), NANO),
            ("memory".to_owned(), 4 * gib),
            ("nvidia.com/gpu".to_owned(), NANO),
        ]);
        let with = |kind: StrategyKind, resources: &[(&str, i64)]| ScoringStrategy {
            kind,
            resources: resources
                .iter()
                .map(|(n, w)| ((*n).to_owned(), *w))
                .collect(),
        };
        // cpu 2/4, memory 4/16.
        let least = with(StrategyKind::LeastAllocated, &[("cpu", 1), ("memory", 1)]);
        assert_eq!(
            fit_score(&least, &pod, nz(&pod), &alloc, &usage, |_| None),
            (50 + 75) / 2
        );
        let most = with(StrategyKind::MostAllocated, &[("cpu", 1), ("memory", 1)]);
        assert_eq!(
            fit_score(&most, &pod, nz(&pod), &alloc, &usage, |_| None),
            (50 + 25) / 2
        );
        // GPUs 7/8 = 87, weighted 3 beside cpu 50.
        let gpus = with(
            StrategyKind::MostAllocated,
            &[("cpu", 1), ("nvidia.com/gpu", 3)],
        );
        assert_eq!(
            fit_score(&gpus, &pod, nz(&pod), &alloc, &usage, |_| None),
            (50 + 87 * 3) / 4
        );
        // W116: a pod without GPUs leaves the GPU out (weight included).
        let cpu_only = ResourceList::from([("cpu".to_owned(), NANO)]);
        assert_eq!(
            fit_score(&gpus, &cpu_only, nz(&cpu_only), &alloc, &usage, |_| None),
            50
        );
        // Bin packing by ratio: shape (0, 0) → (100, 10); cpu 50 % → 50, memory 25 % → 25,
        // mean 37.5 rounded to 38.
        let ratio = with(
            StrategyKind::RequestedToCapacityRatio(vec![(0, 0), (100, 10)]),
            &[("cpu", 1), ("memory", 1)],
        );
        assert_eq!(
            fit_score(&ratio, &pod, nz(&pod), &alloc, &usage, |_| None),
            38
        );
    }

    #[test]
    fn w118_balanced_allocation() {
        let gib = 1024 * 1024 * 1024 * NANO;
        let alloc = ResourceList::from([
            ("cpu".to_owned(), 4 * NANO),
            ("memory".to_owned(), 16 * gib),
        ]);
        // The node at cpu 2/4 (0.5) and memory 4/16 (0.25): balance 87.
        let usage = NodeUsage {
            requested: ResourceList::from([
                ("cpu".to_owned(), 2 * NANO),
                ("memory".to_owned(), 4 * gib),
            ]),
            non_zero_cpu: 2 * NANO,
            non_zero_memory: 4 * gib,
            pods: 1,
            ..NodeUsage::default()
        };
        // A memory-heavy pod evens it out (0.5, 0.5: balance 100): 50 + (50 + 13) / 2 = 81.
        let evening = ResourceList::from([("memory".to_owned(), 4 * gib)]);
        assert_eq!(
            balanced_allocation_score(&cpu_memory(), &evening, &alloc, &usage),
            Some(81)
        );
        // A cpu-heavy one makes it uneven (0.75, 0.25: balance 75): 50 + (50 - 12) / 2 = 69.
        let uneven = ResourceList::from([("cpu".to_owned(), NANO)]);
        assert_eq!(
            balanced_allocation_score(&cpu_memory(), &uneven, &alloc, &usage),
            Some(69)
        );
        // Best effort: skipped.
        assert_eq!(
            balanced_allocation_score(&cpu_memory(), &ResourceList::new(), &alloc, &usage),
            None
        );
    }
}
