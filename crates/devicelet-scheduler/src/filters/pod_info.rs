//! What the inter-pod plugins (InterPodAffinity, PodTopologySpread) read of a pod, parsed once
//! when the pod enters the cache, as kube-scheduler's `framework.PodInfo` does
//! (`staging/src/k8s.io/kube-scheduler/framework/types.go`: `AffinityTerm`,
//! `WeightedAffinityTerm`, `getNamespacesFromPodAffinityTerm`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, WeightedPodAffinityTerm};

use super::labels::Selector;

/// A pod affinity term with its namespaces resolved (`framework.AffinityTerm`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AffinityTerm {
    /// `namespaces`, or the pod's own namespace when neither `namespaces` nor
    /// `namespaceSelector` is set.
    pub namespaces: BTreeSet<String>,
    pub selector: Selector,
    pub topology_key: String,
    pub namespace_selector: Selector,
}

impl AffinityTerm {
    fn of(pod_namespace: &str, term: &PodAffinityTerm) -> Self {
        let listed = term.namespaces.clone().unwrap_or_default();
        let namespaces = if listed.is_empty() && term.namespace_selector.is_none() {
            BTreeSet::from([pod_namespace.to_owned()])
        } else {
            listed.into_iter().collect()
        };
        AffinityTerm {
            namespaces,
            selector: Selector::of(term.label_selector.as_ref()),
            topology_key: term.topology_key.clone(),
            namespace_selector: Selector::of(term.namespace_selector.as_ref()),
        }
    }

    /// `AffinityTerm.Matches`: the pod is in one of the term's namespaces, or its namespace's
    /// labels (`namespace_labels`) satisfy the namespace selector, and its labels satisfy the
    /// selector.
    pub fn matches(&self, pod: &PodInfo, namespace_labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.contains(&pod.namespace)
            || self.namespace_selector.matches(namespace_labels))
            && self.selector.matches(&pod.labels)
    }
}

/// A preferred term and its weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightedTerm {
    pub weight: i64,
    pub term: AffinityTerm,
}

/// A pod as the inter-pod plugins see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// `deletionTimestamp` is set (topology spreading does not count it).
    pub deleting: bool,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<WeightedTerm>,
    pub preferred_anti_affinity: Vec<WeightedTerm>,
    /// What the pod takes exclusively from a NUMA node (`None` for most pods), for the NUMA
    /// view of nodes it runs on ([`crate::numa`]).
    pub numa_use: Option<Arc<crate::numa::pod_use::PodNumaUse>>,
}

impl PodInfo {
    /// Reads `pod`.
    pub fn of(pod: &Pod) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let required = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<AffinityTerm> {
            terms
                .into_iter()
                .flatten()
                .map(|t| AffinityTerm::of(&namespace, t))
                .collect()
        };
        let preferred = |terms: Option<&Vec<WeightedPodAffinityTerm>>| -> Vec<WeightedTerm> {
            terms
                .into_iter()
                .flatten()
                .map(|t| WeightedTerm {
                    weight: i64::from(t.weight),
                    term: AffinityTerm::of(&namespace, &t.pod_affinity_term),
                })
                .collect()
        };
        PodInfo {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            required_affinity: required(pod_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            required_anti_affinity: required(anti.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_affinity: preferred(pod_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_anti_affinity: preferred(anti.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            namespace,
            numa_use: crate::numa::pod_use::PodNumaUse::of(pod).map(Arc::new),
        }
    }

    /// Any pod (anti-)affinity term (upstream's `PodsWithAffinity`).
    pub fn has_affinity(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }

    /// Required anti-affinity terms (upstream's `PodsWithRequiredAntiAffinity`).
    pub fn has_required_anti_affinity(&self) -> bool {
        !self.required_anti_affinity.is_empty()
    }

    /// The incoming pod's own terms with their namespace selectors replaced by the namespaces
    /// they select now (`mergeAffinityTermNamespacesIfNotEmpty`): `select` lists the names of
    /// the namespaces a selector matches. An empty selector stays (it matches every namespace).
    pub fn with_namespaces_resolved(mut self, select: impl Fn(&Selector) -> Vec<String>) -> Self {
        let resolve = |t: &mut AffinityTerm| {
            if t.namespace_selector.is_empty() {
                return;
            }
            t.namespaces.extend(select(&t.namespace_selector));
            t.namespace_selector = Selector::Nothing;
        };
        self.required_affinity.iter_mut().for_each(resolve);
        self.required_anti_affinity.iter_mut().for_each(resolve);
        self.preferred_affinity
            .iter_mut()
            .for_each(|w| resolve(&mut w.term));
        self.preferred_anti_affinity
            .iter_mut()
            .for_each(|w| resolve(&mut w.term));
        self
    }
}
