//! PodTopologySpread (`pkg/scheduler/framework/plugins/podtopologyspread/`: `common.go`,
//! `filtering.go`, `scoring.go`; KEP-895, KEP-3022 `minDomains`, KEP-3094 node inclusion
//! policies, KEP-3243 `matchLabelKeys`; spec workloads.md E.3).
//!
//! Filter: for each `DoNotSchedule` constraint, the pods matching its selector in the pod's
//! namespace are counted per topology domain over the nodes that carry every constraint's key
//! (and pass the constraint's node inclusion policies); a node is refused when its domain's
//! count plus the pod itself, minus the smallest domain's count (0 while there are fewer
//! domains than `minDomains`), exceeds `maxSkew`.
//!
//! Score: for each `ScheduleAnyway` constraint, the matching pods of the node's domain (of the
//! node itself for `kubernetes.io/hostname`), weighted by `log(domains + 2)`; fewer is better,
//! normalised so the emptiest node scores 100.
//!
//! A pod without constraints of its own gets the profile's default constraints (by default
//! the system's: hostname skew 3 and zone skew 5, both `ScheduleAnyway`) with the selector of
//! what owns it (`helper.DefaultSelector`): the Services that select it, and the
//! ReplicationController, ReplicaSet or StatefulSet that controls it.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Node, Pod, ReplicationController, Service, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::PodFacts;
use super::labels::Selector;
use super::node_pods::NodePods;
use super::pod_info::PodInfo;
use crate::config::SpreadDefaults;
use crate::framework::{Code, Plugin, Rejection};

/// `ErrReasonConstraintsNotMatch`.
pub const CONSTRAINTS_NOT_MATCH: &str = "node(s) didn't match pod topology spread constraints";
/// `ErrReasonNodeLabelNotMatch`.
pub const MISSING_LABEL: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const HOSTNAME: &str = "kubernetes.io/hostname";

/// The selectors of the objects that own pods: what default spreading counts a pod's
/// siblings by.
#[derive(Clone, Debug, Default)]
pub struct SpreadOwners {
    /// By (kind, namespace, name); ordered so that a namespace's Services are one range.
    owners: BTreeMap<(OwnerKind, String, String), OwnerSelector>,
}

/// An owner kind default spreading knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerKind {
    Service,
    ReplicationController,
    ReplicaSet,
    StatefulSet,
}

/// What an owner selects pods by.
#[derive(Clone, Debug)]
pub enum OwnerSelector {
    /// A label set (Services', ReplicationControllers' `spec.selector`).
    Labels(BTreeMap<String, String>),
    /// A label selector (ReplicaSets', StatefulSets').
    Selector(Selector),
}

impl OwnerSelector {
    /// A ReplicaSet's or StatefulSet's `spec.selector`.
    pub fn of(selector: Option<&LabelSelector>) -> Self {
        OwnerSelector::Selector(Selector::of(selector))
    }
}

/// An object default spreading finds a pod's siblings by, and what it selects them by.
pub trait SpreadOwner: k8s_openapi::Metadata<Ty = ObjectMeta> {
    const OWNER_KIND: OwnerKind;
    /// `None`: it selects nothing (a Service without a selector).
    fn owner_selector(&self) -> Option<OwnerSelector>;
}

impl SpreadOwner for Service {
    const OWNER_KIND: OwnerKind = OwnerKind::Service;
    fn owner_selector(&self) -> Option<OwnerSelector> {
        self.spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .map(OwnerSelector::Labels)
    }
}

impl SpreadOwner for ReplicationController {
    const OWNER_KIND: OwnerKind = OwnerKind::ReplicationController;
    fn owner_selector(&self) -> Option<OwnerSelector> {
        Some(OwnerSelector::Labels(
            self.spec
                .as_ref()
                .and_then(|s| s.selector.clone())
                .unwrap_or_default(),
        ))
    }
}

impl SpreadOwner for ReplicaSet {
    const OWNER_KIND: OwnerKind = OwnerKind::ReplicaSet;
    fn owner_selector(&self) -> Option<OwnerSelector> {
        Some(OwnerSelector::of(self.spec.as_ref().map(|s| &s.selector)))
    }
}

impl SpreadOwner for StatefulSet {
    const OWNER_KIND: OwnerKind = OwnerKind::StatefulSet;
    fn owner_selector(&self) -> Option<OwnerSelector> {
        Some(OwnerSelector::of(self.spec.as_ref().map(|s| &s.selector)))
    }
}

impl SpreadOwners {
    /// `owner` was added or changed.
    pub fn upsert_owner<K: SpreadOwner>(&mut self, owner: &K) {
        let meta = owner.metadata();
        self.upsert(
            K::OWNER_KIND,
            meta.namespace.as_deref().unwrap_or(""),
            meta.name.as_deref().unwrap_or(""),
            owner.owner_selector(),
        );
    }

    /// An owner was seen; `None`: it selects nothing (a Service without a selector) and is
    /// not kept.
    pub fn upsert(
        &mut self,
        kind: OwnerKind,
        ns: &str,
        name: &str,
        selector: Option<OwnerSelector>,
    ) {
        let key = (kind, ns.to_owned(), name.to_owned());
        match selector {
            Some(s) => {
                self.owners.insert(key, s);
            }
            None => {
                self.owners.remove(&key);
            }
        }
    }

    /// An owner is gone.
    pub fn remove(&mut self, kind: OwnerKind, ns: &str, name: &str) {
        self.upsert(kind, ns, name, None);
    }

    /// After a relist of `kind`: only `names` (namespace, name) exist.
    pub fn retain(&mut self, kind: OwnerKind, names: &HashSet<(String, String)>) {
        self.owners
            .retain(|(k, ns, n), _| *k != kind || names.contains(&(ns.clone(), n.clone())));
    }

    /// `helper.DefaultSelector`: the selectors of the Services in the pod's namespace that
    /// select it, merged, and its controller's.
    pub fn selector_for(&self, pod: &Pod) -> Selector {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let mut set: BTreeMap<String, String> = BTreeMap::new();
        let from = (OwnerKind::Service, ns.clone(), String::new());
        for ((kind, service_ns, _), selector) in self.owners.range(from..) {
            if *kind != OwnerKind::Service || *service_ns != ns {
                break;
            }
            if let OwnerSelector::Labels(selector) = selector
                && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            {
                set.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        let kind = owner.and_then(|o| match (o.api_version.as_str(), o.kind.as_str()) {
            ("v1", "ReplicationController") => Some(OwnerKind::ReplicationController),
            ("apps/v1", "ReplicaSet") => Some(OwnerKind::ReplicaSet),
            ("apps/v1", "StatefulSet") => Some(OwnerKind::StatefulSet),
            _ => None,
        });
        let found = kind
            .zip(owner)
            .and_then(|(k, o)| self.owners.get(&(k, ns.clone(), o.name.clone())));
        match found {
            Some(OwnerSelector::Labels(rc)) => {
                set.extend(rc.iter().map(|(k, v)| (k.clone(), v.clone())));
                Selector::everything().with_labels(&set)
            }
            Some(OwnerSelector::Selector(Selector::All(reqs))) => {
                let mut merged = Selector::everything().with_labels(&set);
                if let Selector::All(out) = &mut merged {
                    out.extend(reqs.iter().cloned());
                }
                merged
            }
            // A controller whose selector selects nothing adds no requirements upstream either.
            Some(OwnerSelector::Selector(Selector::Nothing)) | None => {
                Selector::everything().with_labels(&set)
            }
        }
    }
}

/// One constraint, parsed (`topologySpreadConstraint`).
#[derive(Clone, Debug)]
pub struct Constraint {
    pub max_skew: i64,
    pub topology_key: String,
    pub selector: Selector,
    /// 1 when unset.
    pub min_domains: usize,
    /// `nodeAffinityPolicy: Honor` (the default): nodes the pod's node affinity excludes are
    /// not domains.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default `Ignore`): nodes with a taint the pod does not
    /// tolerate are not domains.
    pub honor_taints: bool,
}

impl Constraint {
    /// `matchNodeInclusionPolicies`.
    fn includes(&self, facts: &PodFacts, node: &Node) -> bool {
        (!self.honor_node_affinity || facts.affinity.matches(node))
            && (!self.honor_taints
                || super::taint_toleration::untolerated(&facts.tolerations, node).is_none())
    }
}

/// What spreading a pod without constraints of its own gets: the profile's defaults and the
/// selector of its owners ([`SpreadOwners::selector_for`]).
#[derive(Clone, Copy, Debug)]
pub struct DefaultSpreading<'a> {
    pub defaults: &'a SpreadDefaults,
    pub selector: &'a Selector,
}

/// The pod's constraints with `whenUnsatisfiable == action` (`filterTopologySpreadConstraints`:
/// `matchLabelKeys` add the pod's own values of those keys to the selector), or, for a pod
/// without any, the default ones with its owners' selector (none when that selects
/// everything). The flag: nodes without every key are left out (all but system defaults).
pub fn constraints(
    pod: &Pod,
    action: &str,
    defaults: Option<DefaultSpreading<'_>>,
) -> (Vec<Constraint>, bool) {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_ref())
        .filter(|c| !c.is_empty());
    if let Some(own) = own {
        let parsed = own
            .iter()
            .filter(|c| c.when_unsatisfiable == action)
            .map(|c| parse(c, &labels))
            .collect();
        return (parsed, true);
    }
    let Some(d) = defaults else {
        return (Vec::new(), true);
    };
    let require_all = !d.defaults.system;
    if d.selector.is_empty() {
        return (Vec::new(), require_all);
    }
    let parsed = d
        .defaults
        .constraints
        .iter()
        .filter(|c| c.when_unsatisfiable == action)
        .map(|c| Constraint {
            selector: d.selector.clone(),
            ..parse(c, &labels)
        })
        .collect();
    (parsed, require_all)
}

fn parse(c: &TopologySpreadConstraint, pod_labels: &BTreeMap<String, String>) -> Constraint {
    let mut selector = Selector::of(c.label_selector.as_ref());
    let keys: BTreeMap<String, String> = c
        .match_label_keys
        .iter()
        .flatten()
        .filter_map(|k| pod_labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect();
    if !keys.is_empty() {
        selector = selector.with_labels(&keys);
    }
    Constraint {
        max_skew: i64::from(c.max_skew),
        topology_key: c.topology_key.clone(),
        selector,
        min_domains: c.min_domains.map_or(1, |m| m.max(0) as usize),
        honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
        honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
    }
}

/// `countPodsMatchSelector`: pods of `namespace` not being deleted that `selector` matches;
/// an empty selector counts nothing.
fn count_matching(pods: &[std::sync::Arc<PodInfo>], selector: &Selector, namespace: &str) -> i64 {
    if selector.is_empty() {
        return 0;
    }
    pods.iter()
        .filter(|p| !p.deleting && p.namespace == namespace && selector.matches(&p.labels))
        .count() as i64
}

fn has_all_keys(node: &Node, constraints: &[Constraint]) -> bool {
    let labels = node.metadata.labels.as_ref();
    constraints
        .iter()
        .all(|c| labels.is_some_and(|l| l.contains_key(&c.topology_key)))
}

fn label<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The Filter's state (`preFilterState`), computed once per attempt over every node.
#[derive(Clone, Debug)]
pub struct SpreadFilter {
    constraints: Vec<Constraint>,
    /// Per constraint, matching pods per topology value.
    counts: Vec<HashMap<String, i64>>,
    /// Per constraint, whether the pod matches its own selector.
    self_match: Vec<i64>,
}

impl SpreadFilter {
    /// PreFilter: `None` when the pod has no `DoNotSchedule` constraint (the plugin skips).
    pub fn pre_filter(
        pod: &Pod,
        facts: &PodFacts,
        defaults: Option<DefaultSpreading<'_>>,
        nodes: &[NodePods<'_>],
    ) -> Option<Self> {
        let (constraints, _) = constraints(pod, "DoNotSchedule", defaults);
        if constraints.is_empty() {
            return None;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
        let mut counts = vec![HashMap::new(); constraints.len()];
        for entry in nodes {
            if !has_all_keys(entry.node, &constraints) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes(facts, entry.node) {
                    continue;
                }
                let value = label(entry.node, &c.topology_key).unwrap_or("");
                *counts[i].entry(value.to_owned()).or_insert(0) +=
                    count_matching(&entry.usage.pod_infos, &c.selector, namespace);
            }
        }
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let self_match = constraints
            .iter()
            .map(|c| i64::from(c.selector.matches(&labels)))
            .collect();
        Some(SpreadFilter {
            constraints,
            counts,
            self_match,
        })
    }

    /// The global minimum of constraint `i` (`minMatchNum`).
    fn min_match(&self, i: usize) -> i64 {
        let domains = &self.counts[i];
        if domains.len() < self.constraints[i].min_domains {
            return 0;
        }
        domains.values().copied().min().unwrap_or(0)
    }

    /// Filter for one node.
    pub fn filter(&self, node: &Node) -> Option<Rejection> {
        for (i, c) in self.constraints.iter().enumerate() {
            let Some(value) = label(node, &c.topology_key) else {
                return Some(Rejection::unresolvable(
                    Plugin::PodTopologySpread,
                    MISSING_LABEL,
                ));
            };
            let here = self.counts[i].get(value).copied().unwrap_or(0);
            let skew = here + self.self_match[i] - self.min_match(i);
            if skew > c.max_skew {
                return Some(Rejection::new(
                    Plugin::PodTopologySpread,
                    Code::Unschedulable,
                    CONSTRAINTS_NOT_MATCH,
                ));
            }
        }
        None
    }
}

/// PreScore, Score and NormalizeScore for the `feasible` nodes (indexes into `nodes`, every
/// node of the cluster): each 0-100, or `None` when the pod has no `ScheduleAnyway`
/// constraint (the plugin skips; it adds nothing to any node).
pub fn scores(
    pod: &Pod,
    facts: &PodFacts,
    defaults: Option<DefaultSpreading<'_>>,
    nodes: &[NodePods<'_>],
    feasible: &[usize],
) -> Option<Vec<i64>> {
    let (constraints, require_all) = constraints(pod, "ScheduleAnyway", defaults);
    if constraints.is_empty() {
        return None;
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    // Nodes without every key are ignored (score 0); the others' domains are the ones counted.
    let ignored: Vec<bool> = feasible
        .iter()
        .map(|&i| require_all && !has_all_keys(nodes[i].node, &constraints))
        .collect();
    let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); constraints.len()];
    for (k, &i) in feasible.iter().enumerate() {
        if ignored[k] {
            continue;
        }
        for (c, domain) in constraints.iter().zip(counts.iter_mut()) {
            if c.topology_key != HOSTNAME {
                let value = label(nodes[i].node, &c.topology_key).unwrap_or("");
                domain.entry(value.to_owned()).or_insert(0);
            }
        }
    }
    let considered = ignored.iter().filter(|x| !**x).count();
    let weights: Vec<f64> = constraints
        .iter()
        .zip(&counts)
        .map(|(c, domain)| {
            let size = if c.topology_key == HOSTNAME {
                considered
            } else {
                domain.len()
            };
            ((size + 2) as f64).ln()
        })
        .collect();
    for entry in nodes {
        if require_all && !has_all_keys(entry.node, &constraints) {
            continue;
        }
        for (c, domain) in constraints.iter().zip(counts.iter_mut()) {
            if c.topology_key == HOSTNAME || !c.includes(facts, entry.node) {
                continue;
            }
            let value = label(entry.node, &c.topology_key).unwrap_or("");
            if let Some(n) = domain.get_mut(value) {
                *n += count_matching(&entry.usage.pod_infos, &c.selector, namespace);
            }
        }
    }
    let raw: Vec<Option<i64>> = feasible
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            if ignored[k] {
                return None;
            }
            let entry = &nodes[i];
            let mut score = 0.0;
            for ((c, domain), weight) in constraints.iter().zip(&counts).zip(&weights) {
                let Some(value) = label(entry.node, &c.topology_key) else {
                    continue;
                };
                let count = if c.topology_key == HOSTNAME {
                    count_matching(&entry.usage.pod_infos, &c.selector, namespace)
                } else {
                    domain.get(value).copied().unwrap_or(0)
                };
                score += count as f64 * weight + (c.max_skew - 1) as f64;
            }
            Some(score.round() as i64)
        })
        .collect();
    let min = raw.iter().flatten().copied().min().unwrap_or(0);
    let max = raw.iter().flatten().copied().max().unwrap_or(0);
    Some(
        raw.into_iter()
            .map(|s| match s {
                None => 0,
                Some(_) if max == 0 => 100,
                Some(s) => 100 * (max + min - s) / max,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, TopologySpreadConstraint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

    use crate::cache::ClusterCache;
    use crate::config::Profile;
    use crate::testing::{bind_in, labelled_pod, node, placements};

    const ZONE: &str = "topology.kubernetes.io/zone";

    fn spread(key: &str, max_skew: i32, when: &str) -> TopologySpreadConstraint {
        TopologySpreadConstraint {
            max_skew,
            topology_key: key.into(),
            when_unsatisfiable: when.into(),
            label_selector: Some(LabelSelector {
                match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        }
    }

    fn with(constraints: Vec<TopologySpreadConstraint>) -> PodSpec {
        PodSpec {
            topology_spread_constraints: Some(constraints),
            ..PodSpec::default()
        }
    }

    /// Zone a: a1, a2; zone b: b1; `c1` has no zone label.
    fn zones() -> ClusterCache {
        let mut cache = ClusterCache::new();
        for (n, z) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            cache.upsert_node(node(n, "8", &[(ZONE, z), ("kubernetes.io/hostname", n)]));
        }
        cache.upsert_node(node("c1", "8", &[("kubernetes.io/hostname", "c1")]));
        cache
    }

    fn web(name: &str) -> k8s_openapi::api::core::v1::Pod {
        labelled_pod(name, "ns", &[("app", "web")], PodSpec::default())
    }

    #[test]
    fn a_zone_over_the_skew_is_refused_and_a_node_without_the_key_is_unresolvable() {
        let mut cache = zones();
        bind_in(&mut cache, web("w1"), "a1");
        bind_in(&mut cache, web("w2"), "a2");
        bind_in(&mut cache, web("w3"), "b1");
        let pod = labelled_pod(
            "new",
            "ns",
            &[("app", "web")],
            with(vec![spread(ZONE, 1, "DoNotSchedule")]),
        );
        // a: 2, b: 1. a + 1 - 1 = 2 > 1; b + 1 - 1 = 1.
        assert_eq!(
            placements(&mut cache, &pod, &Profile::named("s")).unwrap(),
            ["b1"]
        );
        bind_in(&mut cache, web("w4"), "b1");
        bind_in(&mut cache, web("w5"), "b1");
        let err = placements(&mut cache, &pod, &Profile::named("s"));
        // a: 2, b: 3: zone a fits again; b does not.
        assert_eq!(
            err.clone().map(|mut v| {
                v.sort();
                v
            }),
            Ok(vec!["a1".to_owned(), "a2".to_owned()])
        );
        let mut other = pod.clone();
        other.spec.as_mut().unwrap().topology_spread_constraints =
            Some(vec![spread(ZONE, 0, "DoNotSchedule")]);
        let msg = placements(&mut cache, &other, &Profile::named("s")).unwrap_err();
        assert_eq!(
            msg,
            "0/4 nodes are available: 1 node(s) didn't match pod topology spread constraints \
             (missing required label), 3 node(s) didn't match pod topology spread constraints. no new claims to deallocate"
        );
    }

    #[test]
    fn other_namespaces_deleting_pods_and_non_matching_pods_do_not_count() {
        let mut cache = zones();
        bind_in(
            &mut cache,
            labelled_pod("x", "elsewhere", &[("app", "web")], PodSpec::default()),
            "a1",
        );
        bind_in(
            &mut cache,
            labelled_pod("y", "ns", &[("app", "db")], PodSpec::default()),
            "a1",
        );
        let mut going = web("z");
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        bind_in(&mut cache, going, "a2");
        bind_in(&mut cache, web("w"), "b1");
        let pod = labelled_pod(
            "new",
            "ns",
            &[("app", "web")],
            with(vec![spread(ZONE, 1, "DoNotSchedule")]),
        );
        // a: 0, b: 1: b + 1 - 0 = 2 > 1.
        let mut got = placements(&mut cache, &pod, &Profile::named("s")).unwrap();
        got.sort();
        assert_eq!(got, ["a1", "a2"]);
    }

    #[test]
    fn min_domains_beyond_the_domains_there_are_make_the_minimum_zero() {
        let mut cache = zones();
        bind_in(&mut cache, web("w1"), "a1");
        bind_in(&mut cache, web("w2"), "b1");
        let mut c = spread(ZONE, 1, "DoNotSchedule");
        c.min_domains = Some(3);
        let pod = labelled_pod("new", "ns", &[("app", "web")], with(vec![c]));
        // Two zones < 3: min 0, each zone 1 + 1 - 0 = 2 > 1.
        assert!(placements(&mut cache, &pod, &Profile::named("s")).is_err());
    }

    #[test]
    fn match_label_keys_count_only_the_same_revision() {
        let mut cache = zones();
        for (n, node) in [("o1", "a1"), ("o2", "a2")] {
            bind_in(
                &mut cache,
                labelled_pod(n, "ns", &[("app", "web"), ("rev", "1")], PodSpec::default()),
                node,
            );
        }
        let mut c = spread(ZONE, 1, "DoNotSchedule");
        c.match_label_keys = Some(vec!["rev".into()]);
        let pod = labelled_pod("new", "ns", &[("app", "web"), ("rev", "2")], with(vec![c]));
        let mut got = placements(&mut cache, &pod, &Profile::named("s")).unwrap();
        got.sort();
        assert_eq!(got, ["a1", "a2", "b1"]);
    }

    #[test]
    fn node_affinity_policy_honor_leaves_excluded_nodes_out_of_the_domains() {
        let mut cache = zones();
        bind_in(&mut cache, web("w1"), "b1");
        let mut spec = with(vec![spread(ZONE, 1, "DoNotSchedule")]);
        spec.node_selector = Some([(ZONE.to_owned(), "b".to_owned())].into());
        let pod = labelled_pod("new", "ns", &[("app", "web")], spec.clone());
        // Zone a is not a domain (the pod cannot go there): b is the minimum, b + 1 - 1 = 1.
        assert_eq!(
            placements(&mut cache, &pod, &Profile::named("s")).unwrap(),
            ["b1"]
        );
        // Ignore: zone a counts with 0, b + 1 - 0 = 2 > 1.
        let mut c = spread(ZONE, 1, "DoNotSchedule");
        c.node_affinity_policy = Some("Ignore".into());
        spec.topology_spread_constraints = Some(vec![c]);
        let pod = labelled_pod("new", "ns", &[("app", "web")], spec);
        assert!(placements(&mut cache, &pod, &Profile::named("s")).is_err());
    }

    #[test]
    fn schedule_anyway_prefers_the_emptiest_host() {
        let mut cache = zones();
        bind_in(&mut cache, web("w1"), "a1");
        bind_in(&mut cache, web("w2"), "a1");
        bind_in(&mut cache, web("w3"), "a2");
        let pod = labelled_pod(
            "new",
            "ns",
            &[("app", "web")],
            with(vec![spread("kubernetes.io/hostname", 1, "ScheduleAnyway")]),
        );
        let order = placements(&mut cache, &pod, &Profile::named("s")).unwrap();
        // b1 and c1 hold none; a2 one; a1 two.
        assert!(matches!(order[0].as_str(), "b1" | "c1"), "{order:?}");
        assert_eq!(&order[2..], ["a2", "a1"]);
    }

    fn spread_only() -> Profile {
        let mut p = Profile::named("s");
        p.weights = crate::config::ScoreWeights {
            pod_topology_spread: 2,
            ..crate::config::ScoreWeights::none()
        };
        p
    }

    fn owned_by_replica_set(name: &str) -> k8s_openapi::api::core::v1::Pod {
        let mut p = labelled_pod(
            name,
            "ns",
            &[("app", "web"), ("pod-template-hash", "h")],
            PodSpec::default(),
        );
        p.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-h".into(),
                uid: "rs".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        p
    }

    #[test]
    fn system_defaults_spread_a_replica_sets_pods_over_hosts_and_zones() {
        let mut cache = zones();
        cache.spread_owners_mut().upsert(
            super::OwnerKind::ReplicaSet,
            "ns",
            "web-h",
            Some(super::OwnerSelector::of(Some(&LabelSelector {
                match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
                ..LabelSelector::default()
            }))),
        );
        bind_in(&mut cache, owned_by_replica_set("w1"), "a1");
        bind_in(&mut cache, owned_by_replica_set("w2"), "a2");
        let order = placements(&mut cache, &owned_by_replica_set("new"), &spread_only()).unwrap();
        // Raw scores (count x ln(domains + 2) + maxSkew - 1 per constraint, lower is better):
        // c1 (no zone label: not ignored under system defaults, no zone term) 2, b1 2 + 4,
        // a1 and a2 (1 x ln 6 + 2) + (2 x ln 5 + 4) = 11 — as upstream computes it.
        assert_eq!(&order[..2], ["c1", "b1"], "{order:?}");
        // Without an owner nothing spreads: ties at random.
        let bare = labelled_pod("bare", "ns", &[("app", "web")], PodSpec::default());
        let firsts: std::collections::BTreeSet<String> = (0..40)
            .map(|_| placements(&mut cache, &bare, &spread_only()).unwrap()[0].clone())
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
        // A Service selecting the bare pod makes its siblings count.
        cache.spread_owners_mut().upsert(
            super::OwnerKind::Service,
            "ns",
            "web",
            Some(super::OwnerSelector::Labels(
                [("app".to_owned(), "web".to_owned())].into(),
            )),
        );
        assert_eq!(
            &placements(&mut cache, &bare, &spread_only()).unwrap()[..2],
            ["c1", "b1"]
        );
    }
}
