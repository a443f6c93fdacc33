//! InterPodAffinity (`pkg/scheduler/framework/plugins/interpodaffinity/`: `filtering.go`,
//! `scoring.go`, `plugin.go`; spec workloads.md E.3).
//!
//! Filter, from counts per topology pair (key, value) taken once per attempt over every node:
//! - the pod's required affinity: every term's pair on the node must hold a pod matching all
//!   of the terms, unless no such pod exists anywhere and the pod matches its own terms (the
//!   first pod of a set) — else `UnschedulableAndUnresolvable`;
//! - the pod's required anti-affinity: no pair of the node may hold a pod matching a term;
//! - existing pods' required anti-affinity: no pod whose term matches this pod may share a
//!   pair with the node (both `Unschedulable`: evicting pods can help).
//!
//! Score: per pair, the weights of the pod's preferred terms that existing pods match (minus
//! for anti-affinity), existing pods' preferred terms that this pod matches, and existing pods'
//! required affinity terms this pod matches times `hardPodAffinityWeight`; a node sums its
//! pairs; normalised to 0-100 between the lowest and highest node.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Node;

use super::node_pods::NodePods;
use super::pod_info::{AffinityTerm, PodInfo, WeightedTerm};
use crate::config::AffinityArgs;
use crate::framework::{Code, Plugin, Rejection};

/// `ErrReasonAffinityRulesNotMatch`.
pub const AFFINITY_NOT_MATCH: &str = "node(s) didn't match pod affinity rules";
/// `ErrReasonAntiAffinityRulesNotMatch`.
pub const ANTI_AFFINITY_NOT_MATCH: &str = "node(s) didn't match pod anti-affinity rules";
/// `ErrReasonExistingAntiAffinityRulesNotMatch`.
pub const EXISTING_ANTI_AFFINITY_NOT_MATCH: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

type Pair = (String, String);

fn pair(node: &Node, key: &str) -> Option<Pair> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(|v| (key.to_owned(), v.clone()))
}

/// `podMatchesAllAffinityTerms`: at least one term, and `pod` matches each.
fn matches_all(terms: &[AffinityTerm], pod: &PodInfo) -> bool {
    let none = BTreeMap::new();
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, &none))
}

/// The Filter's state (`preFilterState`).
#[derive(Clone, Debug)]
pub struct AffinityFilter {
    existing_anti: HashMap<Pair, i64>,
    affinity: HashMap<Pair, i64>,
    anti: HashMap<Pair, i64>,
    /// No pod anywhere matches the affinity terms, and the pod matches them itself.
    first_of_its_kind: bool,
    required_affinity_keys: Vec<String>,
    required_anti_keys: Vec<String>,
}

impl AffinityFilter {
    /// PreFilter over every node: `None` when neither the pod nor any existing pod has a
    /// required term that applies (the plugin skips). `incoming`'s namespace selectors are
    /// resolved ([`PodInfo::with_namespaces_resolved`]); `namespace_labels` are its
    /// namespace's labels.
    pub fn pre_filter(
        incoming: &PodInfo,
        namespace_labels: &BTreeMap<String, String>,
        nodes: &[NodePods<'_>],
    ) -> Option<Self> {
        let none = BTreeMap::new();
        let mut existing_anti: HashMap<Pair, i64> = HashMap::new();
        let mut affinity: HashMap<Pair, i64> = HashMap::new();
        let mut anti: HashMap<Pair, i64> = HashMap::new();
        let own_terms =
            !incoming.required_affinity.is_empty() || !incoming.required_anti_affinity.is_empty();
        for entry in nodes {
            let usage = &entry.usage;
            if usage.with_required_anti_affinity == 0 && !own_terms {
                continue;
            }
            for existing in &usage.pod_infos {
                for t in &existing.required_anti_affinity {
                    if t.matches(incoming, namespace_labels)
                        && let Some(p) = pair(entry.node, &t.topology_key)
                    {
                        *existing_anti.entry(p).or_insert(0) += 1;
                    }
                }
                if !own_terms {
                    continue;
                }
                if matches_all(&incoming.required_affinity, existing) {
                    for t in &incoming.required_affinity {
                        if let Some(p) = pair(entry.node, &t.topology_key) {
                            *affinity.entry(p).or_insert(0) += 1;
                        }
                    }
                }
                for t in &incoming.required_anti_affinity {
                    if t.matches(existing, &none)
                        && let Some(p) = pair(entry.node, &t.topology_key)
                    {
                        *anti.entry(p).or_insert(0) += 1;
                    }
                }
            }
        }
        if existing_anti.is_empty() && !own_terms {
            return None;
        }
        let first_of_its_kind =
            affinity.is_empty() && matches_all(&incoming.required_affinity, incoming);
        Some(AffinityFilter {
            existing_anti,
            affinity,
            anti,
            first_of_its_kind,
            required_affinity_keys: incoming
                .required_affinity
                .iter()
                .map(|t| t.topology_key.clone())
                .collect(),
            required_anti_keys: incoming
                .required_anti_affinity
                .iter()
                .map(|t| t.topology_key.clone())
                .collect(),
        })
    }

    /// Filter for one node.
    pub fn filter(&self, node: &Node) -> Option<Rejection> {
        // satisfyPodAffinity
        let mut pods_exist = true;
        for key in &self.required_affinity_keys {
            match pair(node, key) {
                Some(p) if self.affinity.get(&p).copied().unwrap_or(0) > 0 => {}
                Some(_) => pods_exist = false,
                None => {
                    return Some(Rejection::unresolvable(
                        Plugin::InterPodAffinity,
                        AFFINITY_NOT_MATCH,
                    ));
                }
            }
        }
        if !pods_exist && !self.first_of_its_kind {
            return Some(Rejection::unresolvable(
                Plugin::InterPodAffinity,
                AFFINITY_NOT_MATCH,
            ));
        }
        // satisfyPodAntiAffinity
        if self
            .required_anti_keys
            .iter()
            .any(|key| pair(node, key).is_some_and(|p| self.anti.get(&p).copied().unwrap_or(0) > 0))
        {
            return Some(Rejection::new(
                Plugin::InterPodAffinity,
                Code::Unschedulable,
                ANTI_AFFINITY_NOT_MATCH,
            ));
        }
        // satisfyExistingPodsAntiAffinity: any of the node's labels.
        if !self.existing_anti.is_empty()
            && node.metadata.labels.iter().flatten().any(|(k, v)| {
                self.existing_anti
                    .get(&(k.clone(), v.clone()))
                    .is_some_and(|n| *n > 0)
            })
        {
            return Some(Rejection::new(
                Plugin::InterPodAffinity,
                Code::Unschedulable,
                EXISTING_ANTI_AFFINITY_NOT_MATCH,
            ));
        }
        None
    }
}

/// Adds `sign * weight` for each term of `terms` that `pod` matches, at the term's pair on
/// `node` (`processTerm`).
fn add_terms(
    scores: &mut HashMap<Pair, i64>,
    terms: &[WeightedTerm],
    pod: &PodInfo,
    namespace_labels: &BTreeMap<String, String>,
    node: &Node,
    sign: i64,
) {
    for w in terms {
        add_term(
            scores,
            &w.term,
            w.weight * sign,
            pod,
            namespace_labels,
            node,
        );
    }
}

fn add_term(
    scores: &mut HashMap<Pair, i64>,
    term: &AffinityTerm,
    weight: i64,
    pod: &PodInfo,
    namespace_labels: &BTreeMap<String, String>,
    node: &Node,
) {
    if term.matches(pod, namespace_labels)
        && let Some(p) = pair(node, &term.topology_key)
    {
        *scores.entry(p).or_insert(0) += weight;
    }
}

/// PreScore, Score and NormalizeScore for the `feasible` nodes (indexes into `nodes`, every
/// node): each 0-100, or `None` when the plugin skips (no term anywhere applies).
pub fn scores(
    incoming: &PodInfo,
    namespace_labels: &BTreeMap<String, String>,
    args: &AffinityArgs,
    nodes: &[NodePods<'_>],
    feasible: &[usize],
) -> Option<Vec<i64>> {
    let none = BTreeMap::new();
    let own =
        !incoming.preferred_affinity.is_empty() || !incoming.preferred_anti_affinity.is_empty();
    if args.ignore_preferred_terms_of_existing_pods && !own {
        return None;
    }
    let mut pairs: HashMap<Pair, i64> = HashMap::new();
    for entry in nodes {
        let node = &entry.node;
        if node.metadata.labels.as_ref().is_none_or(|l| l.is_empty()) {
            continue;
        }
        if !own && entry.usage.with_affinity == 0 {
            continue;
        }
        for existing in &entry.usage.pod_infos {
            if !own && !existing.has_affinity() {
                continue;
            }
            add_terms(
                &mut pairs,
                &incoming.preferred_affinity,
                existing,
                &none,
                node,
                1,
            );
            add_terms(
                &mut pairs,
                &incoming.preferred_anti_affinity,
                existing,
                &none,
                node,
                -1,
            );
            if args.hard_pod_affinity_weight > 0 {
                for t in &existing.required_affinity {
                    add_term(
                        &mut pairs,
                        t,
                        args.hard_pod_affinity_weight,
                        incoming,
                        namespace_labels,
                        node,
                    );
                }
            }
            // `ignorePreferredTermsOfExistingPods` only skips the score for a pod without
            // preferred terms (above); otherwise existing pods' terms count as upstream's
            // `processExistingPod` counts them.
            add_terms(
                &mut pairs,
                &existing.preferred_affinity,
                incoming,
                namespace_labels,
                node,
                1,
            );
            add_terms(
                &mut pairs,
                &existing.preferred_anti_affinity,
                incoming,
                namespace_labels,
                node,
                -1,
            );
        }
    }
    if pairs.is_empty() {
        return None;
    }
    let raw: Vec<i64> = feasible
        .iter()
        .map(|&i| {
            nodes[i]
                .node
                .metadata
                .labels
                .iter()
                .flatten()
                .filter_map(|(k, v)| pairs.get(&(k.clone(), v.clone())))
                .sum()
        })
        .collect();
    let min = raw.iter().copied().min().unwrap_or(0);
    let max = raw.iter().copied().max().unwrap_or(0);
    let spread = max - min;
    Some(
        raw.into_iter()
            .map(|s| {
                if spread > 0 {
                    (100.0 * ((s - min) as f64 / spread as f64)) as i64
                } else {
                    0
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Affinity, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec, WeightedPodAffinityTerm,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use crate::cache::ClusterCache;
    use crate::config::Profile;
    use crate::testing::{bind_in, labelled_pod, node, placements, sorted};

    const ZONE: &str = "topology.kubernetes.io/zone";
    const HOST: &str = "kubernetes.io/hostname";

    fn term(app: &str, key: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..LabelSelector::default()
            }),
            topology_key: key.into(),
            ..PodAffinityTerm::default()
        }
    }

    fn spec(affinity: Option<PodAffinity>, anti: Option<PodAntiAffinity>) -> PodSpec {
        PodSpec {
            affinity: Some(Affinity {
                pod_affinity: affinity,
                pod_anti_affinity: anti,
                ..Affinity::default()
            }),
            ..PodSpec::default()
        }
    }

    fn required_anti(t: PodAffinityTerm) -> Option<PodAntiAffinity> {
        Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![t]),
            ..PodAntiAffinity::default()
        })
    }

    fn required(t: PodAffinityTerm) -> Option<PodAffinity> {
        Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![t]),
            ..PodAffinity::default()
        })
    }

    fn zones() -> ClusterCache {
        let mut cache = ClusterCache::new();
        for (n, z) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            cache.upsert_node(node(n, "8", &[(ZONE, z), (HOST, n)]));
        }
        cache
    }

    #[test]
    fn required_anti_affinity_keeps_replicas_apart_both_ways() {
        let mut cache = zones();
        let replica = |name: &str| {
            labelled_pod(
                name,
                "ns",
                &[("app", "web")],
                spec(None, required_anti(term("web", HOST))),
            )
        };
        bind_in(&mut cache, replica("r1"), "a1");
        let got = placements(&mut cache, &replica("r2"), &Profile::named("s")).unwrap();
        assert_eq!(sorted(got), ["a2", "b1"]);
        // A pod without terms that the existing replica's term matches is kept off too.
        let plain = labelled_pod("plain", "ns", &[("app", "web")], PodSpec::default());
        assert_eq!(
            sorted(placements(&mut cache, &plain, &Profile::named("s")).unwrap()),
            ["a2", "b1"]
        );
        // In another namespace the term (the pod's own namespace) does not apply.
        let elsewhere = labelled_pod("x", "other", &[("app", "web")], PodSpec::default());
        assert_eq!(
            placements(&mut cache, &elsewhere, &Profile::named("s"))
                .unwrap()
                .len(),
            3
        );
        bind_in(&mut cache, replica("r2"), "a2");
        bind_in(&mut cache, replica("r3"), "b1");
        assert_eq!(
            placements(&mut cache, &replica("r4"), &Profile::named("s")).unwrap_err(),
            "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. no new claims to deallocate"
        );
        assert_eq!(
            placements(&mut cache, &plain, &Profile::named("s")).unwrap_err(),
            "0/3 nodes are available: 3 node(s) didn't satisfy existing pods anti-affinity rules. no new claims to deallocate"
        );
    }

    #[test]
    fn required_affinity_follows_the_matching_pods_zone_unless_it_is_the_first() {
        let mut cache = zones();
        let cache_pod = |name: &str| {
            labelled_pod(
                name,
                "ns",
                &[("app", "cache")],
                spec(required(term("cache", ZONE)), None),
            )
        };
        // No pod matches anywhere and the pod matches its own term: any node.
        assert_eq!(
            placements(&mut cache, &cache_pod("c1"), &Profile::named("s"))
                .unwrap()
                .len(),
            3
        );
        // A pod that does not match its own term has nowhere to go.
        let follower = labelled_pod(
            "f",
            "ns",
            &[("app", "api")],
            spec(required(term("cache", ZONE)), None),
        );
        assert_eq!(
            placements(&mut cache, &follower, &Profile::named("s")).unwrap_err(),
            "0/3 nodes are available: 3 node(s) didn't match pod affinity rules. no new claims to deallocate"
        );
        bind_in(&mut cache, cache_pod("c1"), "b1");
        assert_eq!(
            placements(&mut cache, &follower, &Profile::named("s")).unwrap(),
            ["b1"]
        );
        assert_eq!(
            placements(&mut cache, &cache_pod("c2"), &Profile::named("s")).unwrap(),
            ["b1"]
        );
    }

    #[test]
    fn a_namespace_selector_picks_namespaces_by_their_labels() {
        let mut cache = zones();
        cache.upsert_namespace("team-a", [("team".to_owned(), "a".to_owned())].into());
        cache.upsert_namespace("team-b", [("team".to_owned(), "b".to_owned())].into());
        bind_in(
            &mut cache,
            labelled_pod("db", "team-a", &[("app", "db")], PodSpec::default()),
            "a1",
        );
        bind_in(
            &mut cache,
            labelled_pod("db2", "team-b", &[("app", "db")], PodSpec::default()),
            "b1",
        );
        let mut t = term("db", HOST);
        t.namespace_selector = Some(LabelSelector {
            match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
            ..LabelSelector::default()
        });
        let pod = labelled_pod("p", "team-b", &[], spec(None, required_anti(t.clone())));
        assert_eq!(
            sorted(placements(&mut cache, &pod, &Profile::named("s")).unwrap()),
            ["a2", "b1"]
        );
        // An empty selector is every namespace.
        t.namespace_selector = Some(LabelSelector::default());
        let pod = labelled_pod("p", "team-b", &[], spec(None, required_anti(t)));
        assert_eq!(
            placements(&mut cache, &pod, &Profile::named("s")).unwrap(),
            ["a2"]
        );
    }

    #[test]
    fn preferred_terms_score_the_zone_of_the_matching_pods() {
        let mut cache = zones();
        bind_in(
            &mut cache,
            labelled_pod("db", "ns", &[("app", "db")], PodSpec::default()),
            "b1",
        );
        let near = labelled_pod(
            "p",
            "ns",
            &[],
            spec(
                Some(PodAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 50,
                            pod_affinity_term: term("db", ZONE),
                        },
                    ]),
                    ..PodAffinity::default()
                }),
                None,
            ),
        );
        assert_eq!(
            placements(&mut cache, &near, &Profile::named("s")).unwrap()[0],
            "b1"
        );
        let far = labelled_pod(
            "q",
            "ns",
            &[],
            spec(
                None,
                Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 50,
                            pod_affinity_term: term("db", ZONE),
                        },
                    ]),
                    ..PodAntiAffinity::default()
                }),
            ),
        );
        let order = placements(&mut cache, &far, &Profile::named("s")).unwrap();
        assert_eq!(order[2], "b1", "{order:?}");
        // Weight 0: the score is off and only the resource scores remain.
        let mut off = Profile::named("s");
        off.weights.inter_pod_affinity = 0;
        off.weights.node_resources_fit = 0;
        off.weights.balanced_allocation = 0;
        let firsts: std::collections::BTreeSet<String> = (0..40)
            .map(|_| placements(&mut cache, &near, &off).unwrap()[0].clone())
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
    }

    #[test]
    fn ignoring_existing_pods_preferences_only_skips_a_pod_without_its_own() {
        let mut cache = zones();
        // b1's pod prefers web pods out of its zone (weight 100).
        let shy = labelled_pod(
            "shy",
            "ns",
            &[("app", "db")],
            spec(
                None,
                Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 100,
                            pod_affinity_term: term("web", ZONE),
                        },
                    ]),
                    ..PodAntiAffinity::default()
                }),
            ),
        );
        bind_in(&mut cache, shy, "b1");
        let mut only = Profile::named("s");
        only.weights.node_resources_fit = 0;
        only.weights.balanced_allocation = 0;
        only.affinity.ignore_preferred_terms_of_existing_pods = true;
        // With a preferred term of its own (weight 1, towards db in b), the existing pod's
        // preference still counts: -100 + 1 in zone b.
        let own = labelled_pod(
            "web-1",
            "ns",
            &[("app", "web")],
            spec(
                Some(PodAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 1,
                            pod_affinity_term: term("db", ZONE),
                        },
                    ]),
                    ..PodAffinity::default()
                }),
                None,
            ),
        );
        assert_eq!(placements(&mut cache, &own, &only).unwrap()[2], "b1");
        // Without one, the score is skipped: nothing tells the nodes apart.
        let plain = labelled_pod("web-2", "ns", &[("app", "web")], PodSpec::default());
        let firsts: std::collections::BTreeSet<String> = (0..40)
            .map(|_| placements(&mut cache, &plain, &only).unwrap()[0].clone())
            .collect();
        assert!(firsts.contains("b1"), "{firsts:?}");
    }
}
