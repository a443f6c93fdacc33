//! NodeAffinity (`pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`, S104):
//! `spec.nodeSelector` and `requiredDuringSchedulingIgnoredDuringExecution` (the filter), and
//! the preferred terms (the score, W120), matched with the
//! allocator's compiled node selectors (the semantics of
//! `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`).

use std::collections::{BTreeMap, BTreeSet};

use devicelet_allocator::nodesel::CompiledNodeSelector;
use k8s_openapi::api::core::v1::{Node, NodeAffinity, NodeSelector, Pod, PreferredSchedulingTerm};

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
    /// PreFilter's answer: the only nodes the required terms can match by name.
    names: NodeNames,
}

/// NodeAffinity's PreFilter (upstream `PreFilterResult`): when every required term names nodes
/// with `matchFields` `metadata.name In`, only those nodes are examined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodeNames {
    /// Every node.
    #[default]
    All,
    /// Only these (the union over the terms of each term's intersection).
    Only(BTreeSet<String>),
    /// Every term names nodes, and together none: `pod affinity terms conflict`.
    Conflict,
}

/// PreFilter's rejection of a pod whose terms name no node.
pub const CONFLICT_REASON: &str = "pod affinity terms conflict";

/// The status of a node a PreFilter result leaves out (upstream's diagnosis names the plugins
/// whose PreFilter narrowed the nodes, and no plugin as the status's own).
pub const OUTSIDE_PRE_FILTER_REASON: &str = "node(s) didn't satisfy plugin(s) [NodeAffinity]";

fn node_names(sel: &NodeSelector) -> NodeNames {
    if sel.node_selector_terms.is_empty() {
        return NodeNames::All;
    }
    let mut union = BTreeSet::new();
    for term in &sel.node_selector_terms {
        let mut names: Option<BTreeSet<String>> = None;
        for r in term.match_fields.iter().flatten() {
            if r.key == "metadata.name" && r.operator == "In" {
                let these: BTreeSet<String> = r.values.iter().flatten().cloned().collect();
                names = Some(match names {
                    None => these,
                    Some(before) => before.intersection(&these).cloned().collect(),
                });
            }
        }
        // A term without a name requirement: every node may match it.
        let Some(names) = names else {
            return NodeNames::All;
        };
        union.extend(names);
    }
    if union.is_empty() {
        NodeNames::Conflict
    } else {
        NodeNames::Only(union)
    }
}

impl RequiredNodeAffinity {
    /// PreFilter's node names.
    pub fn names(&self) -> &NodeNames {
        &self.names
    }

    /// Reads the pod's `nodeSelector` and required node affinity.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let selector = spec
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default();
        let raw = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        RequiredNodeAffinity {
            selector,
            required: raw.map(|sel| CompiledNodeSelector::compile(sel).ok()),
            names: raw.map(node_names).unwrap_or_default(),
        }
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
            .map(Vec::as_slice)
            .unwrap_or_default();
        Self::of_terms(terms)
    }

    /// Compiles `terms`.
    pub fn of_terms(terms: &[PreferredSchedulingTerm]) -> Self {
        let terms = terms
            .iter()
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

    /// Adds `other`'s terms (the score sums the weights of every matching term).
    pub fn extend(&mut self, other: &PreferredNodeAffinity) {
        self.terms.extend(other.terms.iter().cloned());
    }
}

/// Upstream's reason for a node outside the profile's `addedAffinity`.
pub const ENFORCED_REASON: &str = "node(s) didn't match scheduler-enforced node affinity";

/// NodeAffinityArgs `addedAffinity`: node affinity every pod of the profile gets on top of its
/// own (required terms filter, preferred terms add to the score).
#[derive(Clone, Debug)]
pub struct AddedAffinity {
    raw: NodeAffinity,
    required: Option<CompiledNodeSelector>,
    pub preferred: PreferredNodeAffinity,
}

impl AddedAffinity {
    /// Compiles the args; an error names what does not parse.
    pub fn new(raw: NodeAffinity) -> Result<Self, String> {
        let required = raw
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .map(|sel| {
                CompiledNodeSelector::compile(sel)
                    .map_err(|e| format!("requiredDuringSchedulingIgnoredDuringExecution: {e}"))
            })
            .transpose()?;
        let terms = raw
            .preferred_during_scheduling_ignored_during_execution
            .clone()
            .unwrap_or_default();
        for (i, t) in terms.iter().enumerate() {
            let one = NodeSelector {
                node_selector_terms: vec![t.preference.clone()],
            };
            CompiledNodeSelector::compile(&one).map_err(|e| {
                format!("preferredDuringSchedulingIgnoredDuringExecution[{i}]: {e}")
            })?;
        }
        let preferred = PreferredNodeAffinity::of_terms(&terms);
        Ok(AddedAffinity {
            raw,
            required,
            preferred,
        })
    }
}

impl PartialEq for AddedAffinity {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

// NodeAffinity has no floating-point field; k8s-openapi derives only `PartialEq`.
impl Eq for AddedAffinity {}

/// Rejects a node outside the profile's added affinity (checked first, as upstream), or one
/// the pod's selector or required affinity excludes.
pub fn filter(
    affinity: &RequiredNodeAffinity,
    added: Option<&AddedAffinity>,
    node: &Node,
) -> Option<Rejection> {
    if let Some(sel) = added.and_then(|a| a.required.as_ref())
        && !sel.matches(node)
    {
        return Some(Rejection::unresolvable(
            Plugin::NodeAffinity,
            ENFORCED_REASON,
        ));
    }
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
