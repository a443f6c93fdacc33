//! NodeAffinity (`pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`, S104):
//! `spec.nodeSelector` and `requiredDuringSchedulingIgnoredDuringExecution` (the filter), and
//! the preferred terms (the score, W120), matched with the
//! allocator's compiled node selectors (the semantics of
//! `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`).

use std::collections::BTreeMap;

use devicelet_allocator::nodesel::CompiledNodeSelector;
use k8s_openapi::api::core::v1::{Node, NodeSelector, Pod};

use crate::framework::{Plugin, Rejection};

/// The upstream reason.
pub const REASON: &str = "node(s) didn't match Pod's node affinity/selector";

/// A pod's required node affinity, compiled once per attempt.
#[derive(Clone, Debug, Default)]
pub struct RequiredNodeAffinity {
    selector: BTreeMap<String, String>,
    /// `None`: no required terms. A selector that does not parse matches no node (the API
    /// server validates it, so this only guards against hand-made objects).
    required: Option<Option<CompiledNodeSelector>>,
}

impl RequiredNodeAffinity {
    /// Reads the pod's `nodeSelector` and required node affinity.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let selector = spec
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default();
        let required = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|sel| CompiledNodeSelector::compile(sel).ok());
        RequiredNodeAffinity { selector, required }
    }

    /// Whether `node` satisfies the selector and the required terms.
    pub fn matches(&self, node: &Node) -> bool {
        let labels = node.metadata.labels.as_ref();
        let selector_ok = self
            .selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
        selector_ok
            && match &self.required {
                None => true,
                Some(None) => false,
                Some(Some(sel)) => sel.matches(node),
            }
    }
}

/// The pod's preferred node affinity terms (W120), compiled once per attempt: (weight, term).
#[derive(Clone, Debug, Default)]
pub struct PreferredNodeAffinity {
    terms: Vec<(i64, CompiledNodeSelector)>,
}

impl PreferredNodeAffinity {
    /// Reads `preferredDuringSchedulingIgnoredDuringExecution`; terms of weight 0, and terms
    /// that do not compile (the API server validates them), count for nothing.
    pub fn of(pod: &Pod) -> Self {
        let terms = pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten()
            .filter(|t| t.weight != 0)
            .filter_map(|t| {
                let one = NodeSelector {
                    node_selector_terms: vec![t.preference.clone()],
                };
                Some((
                    i64::from(t.weight),
                    CompiledNodeSelector::compile(&one).ok()?,
                ))
            })
            .collect();
        PreferredNodeAffinity { terms }
    }

    /// No terms: PreScore's Skip.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The raw score: the weights of the terms `node` matches.
    pub fn score(&self, node: &Node) -> i64 {
        self.terms
            .iter()
            .filter(|(_, term)| term.matches(node))
            .map(|(w, _)| w)
            .sum()
    }
}

/// Rejects a node the pod's selector or required affinity excludes.
pub fn filter(affinity: &RequiredNodeAffinity, node: &Node) -> Option<Rejection> {
    (!affinity.matches(node)).then(|| Rejection::unresolvable(Plugin::NodeAffinity, REASON))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    };

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    #[test]
    fn s104_selector_and_required_terms_both_apply() {
        let pod = Pod {
            spec: Some(PodSpec {
                node_selector: Some(BTreeMap::from([("gpu".into(), "yes".into())])),
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms: vec![NodeSelectorTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "zone".into(),
                                    operator: "In".into(),
                                    values: Some(vec!["a".into()]),
                                }]),
                                ..NodeSelectorTerm::default()
                            }],
                        }),
                        ..NodeAffinity::default()
                    }),
                    ..Affinity::default()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let a = RequiredNodeAffinity::of(&pod);
        assert!(a.matches(&node("n1", &[("gpu", "yes"), ("zone", "a")])));
        assert!(!a.matches(&node("n2", &[("gpu", "yes"), ("zone", "b")])));
        assert!(!a.matches(&node("n3", &[("zone", "a")])));
    }
}
