//! Node selection for slices and devices, following
//! `k8s.io/component-helpers/scheduling/corev1/nodeaffinity` (`NewNodeSelector`, `Match`) and
//! `NodeMatches` in `dynamic-resource-allocation/structured/internal/incubating/pools_incubating.go`.
//!
//! Selectors are compiled once per allocator so the per-node check is a few string compares;
//! Go re-parses them on every `Allocate` call. A selector that does not parse keeps its error and
//! reports it whenever it is evaluated, which is when Go would have parsed it.

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement};

/// One compiled label requirement.
#[derive(Clone, Debug)]
enum LabelReq {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// One compiled field requirement (only `metadata.name` is known).
#[derive(Clone, Debug)]
enum FieldReq {
    NameIn(String),
    NameNotIn(String),
}

#[derive(Clone, Debug, Default)]
struct Term {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

/// Why a node selector does not parse: the selector and each invalid field, as
/// `nodeaffinity.NewNodeSelector`'s aggregated `field.ErrorList` prints them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{selector}: [{}]", .problems.join(", "))]
pub struct NodeSelectorError {
    /// The selector as JSON.
    pub selector: String,
    /// One `<field path>: <reason>` text per invalid field.
    pub problems: Vec<String>,
}

/// A parsed node selector: terms are ORed, requirements inside a term are ANDed.
#[derive(Clone, Debug)]
pub struct CompiledNodeSelector {
    terms: Vec<Term>,
}

/// How a slice or device says which nodes can reach it.
#[derive(Clone, Debug)]
pub enum NodeMatchSpec {
    /// `nodeName` (non-empty).
    Name(String),
    /// `allNodes: true`.
    All,
    /// `nodeSelector`, compiled, or why it does not parse.
    Selector(Result<CompiledNodeSelector, NodeSelectorError>),
    /// Nothing set: matches no node.
    Nothing,
}

impl NodeMatchSpec {
    /// Builds the spec with Go's precedence: nodeName, then allNodes, then nodeSelector.
    pub fn new(
        node_name: Option<&str>,
        all_nodes: Option<bool>,
        selector: Option<&NodeSelector>,
    ) -> Self {
        match (
            node_name.filter(|n| !n.is_empty()),
            all_nodes.unwrap_or(false),
            selector,
        ) {
            (Some(n), _, _) => NodeMatchSpec::Name(n.to_string()),
            (None, true, _) => NodeMatchSpec::All,
            (None, false, Some(sel)) => NodeMatchSpec::Selector(CompiledNodeSelector::compile(sel)),
            (None, false, None) => NodeMatchSpec::Nothing,
        }
    }

    /// Whether any node-selection field was set.
    pub fn is_set(&self) -> bool {
        !matches!(self, NodeMatchSpec::Nothing)
    }

    /// Go's `NodeMatches`. The error's text is what Go prints after "failed to parse node selector ".
    pub fn matches(&self, node: &Node) -> Result<bool, NodeSelectorError> {
        match self {
            NodeMatchSpec::Name(n) => Ok(node.metadata.name.as_deref() == Some(n.as_str())),
            NodeMatchSpec::All => Ok(true),
            NodeMatchSpec::Selector(Ok(sel)) => Ok(sel.matches(node)),
            NodeMatchSpec::Selector(Err(e)) => Err(e.clone()),
            NodeMatchSpec::Nothing => Ok(false),
        }
    }
}

fn values(req: &NodeSelectorRequirement) -> &[String] {
    req.values.as_deref().unwrap_or(&[])
}

impl CompiledNodeSelector {
    /// Parses a selector the way `nodeaffinity.NewNodeSelector` validates it.
    pub fn compile(sel: &NodeSelector) -> Result<CompiledNodeSelector, NodeSelectorError> {
        let mut terms = Vec::with_capacity(sel.node_selector_terms.len());
        let mut errors = Vec::new();
        for (ti, term) in sel.node_selector_terms.iter().enumerate() {
            let mut t = Term::default();
            for (ri, req) in term.match_expressions.iter().flatten().enumerate() {
                let path = format!("nodeSelectorTerms[{ti}].matchExpressions[{ri}]");
                let vals = values(req);
                let parsed = match req.operator.as_str() {
                    "In" | "NotIn" if vals.is_empty() => Err(format!(
                        "{path}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
                    )),
                    "In" => Ok(LabelReq::In(req.key.clone(), vals.to_vec())),
                    "NotIn" => Ok(LabelReq::NotIn(req.key.clone(), vals.to_vec())),
                    "Exists" | "DoesNotExist" if !vals.is_empty() => Err(format!(
                        "{path}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    )),
                    "Exists" => Ok(LabelReq::Exists(req.key.clone())),
                    "DoesNotExist" => Ok(LabelReq::DoesNotExist(req.key.clone())),
                    "Gt" | "Lt" => {
                        if vals.len() != 1 {
                            Err(format!(
                                "{path}.values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"
                            ))
                        } else {
                            match vals[0].parse::<i64>() {
                                Ok(v) if req.operator == "Gt" => {
                                    Ok(LabelReq::Gt(req.key.clone(), v))
                                }
                                Ok(v) => Ok(LabelReq::Lt(req.key.clone(), v)),
                                Err(_) => Err(format!(
                                    "{path}.values[0]: Invalid value: {:?}: must be an integer",
                                    vals[0]
                                )),
                            }
                        }
                    }
                    other => Err(format!(
                        "{path}.operator: Invalid value: {other:?}: not a valid selector operator"
                    )),
                };
                if req.key.is_empty() {
                    errors.push(format!(
                        "{path}.key: Invalid value: \"\": name part must be non-empty"
                    ));
                }
                match parsed {
                    Ok(l) => t.labels.push(l),
                    Err(e) => errors.push(e),
                }
            }
            for (ri, req) in term.match_fields.iter().flatten().enumerate() {
                let path = format!("nodeSelectorTerms[{ti}].matchFields[{ri}]");
                let vals = values(req);
                if req.key != "metadata.name" {
                    errors.push(format!(
                        "{path}.key: Invalid value: {:?}: not a valid field selector key",
                        req.key
                    ));
                    continue;
                }
                if vals.len() != 1 {
                    errors.push(format!("{path}.values: Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector"));
                    continue;
                }
                match req.operator.as_str() {
                    "In" => t.fields.push(FieldReq::NameIn(vals[0].clone())),
                    "NotIn" => t.fields.push(FieldReq::NameNotIn(vals[0].clone())),
                    other => errors.push(format!(
                        "{path}.operator: Invalid value: {other:?}: not a valid selector operator"
                    )),
                }
            }
            terms.push(t);
        }
        if errors.is_empty() {
            Ok(CompiledNodeSelector { terms })
        } else {
            Err(NodeSelectorError {
                selector: debug_selector(sel),
                problems: errors,
            })
        }
    }

    /// Whether the node satisfies any term. An empty term matches nothing.
    pub fn matches(&self, node: &Node) -> bool {
        let labels = node.metadata.labels.as_ref();
        let name = node.metadata.name.as_deref().unwrap_or("");
        self.terms.iter().any(|t| {
            if t.labels.is_empty() && t.fields.is_empty() {
                return false;
            }
            let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
            t.labels.iter().all(|r| match r {
                LabelReq::In(k, v) => label(k).is_some_and(|x| v.iter().any(|y| y == x)),
                LabelReq::NotIn(k, v) => label(k).is_none_or(|x| !v.iter().any(|y| y == x)),
                LabelReq::Exists(k) => label(k).is_some(),
                LabelReq::DoesNotExist(k) => label(k).is_none(),
                LabelReq::Gt(k, n) => label(k)
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                LabelReq::Lt(k, n) => label(k)
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }) && t.fields.iter().all(|f| match f {
                FieldReq::NameIn(v) => name == v,
                FieldReq::NameNotIn(v) => name != v,
            })
        })
    }
}

fn debug_selector(sel: &NodeSelector) -> String {
    serde_json::to_string(sel).unwrap_or_else(|_| "<node selector>".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorTerm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn req(key: &str, op: &str, vals: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(vals.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn sel(
        terms: Vec<(Vec<NodeSelectorRequirement>, Vec<NodeSelectorRequirement>)>,
    ) -> NodeSelector {
        NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|(e, f)| NodeSelectorTerm {
                    match_expressions: Some(e),
                    match_fields: Some(f),
                })
                .collect(),
        }
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        let n = node("node-1", &[("region", "r1"), ("gen", "5")]);
        let s = sel(vec![
            (vec![req("region", "In", &["r2"])], vec![]),
            (
                vec![req("region", "In", &["r1"]), req("gen", "Gt", &["4"])],
                vec![],
            ),
        ]);
        assert!(CompiledNodeSelector::compile(&s).unwrap().matches(&n));
        let s = sel(vec![(
            vec![req("region", "In", &["r1"]), req("gen", "Lt", &["4"])],
            vec![],
        )]);
        assert!(!CompiledNodeSelector::compile(&s).unwrap().matches(&n));
    }

    #[test]
    fn empty_term_matches_nothing_and_fields_know_metadata_name() {
        let n = node("node-1", &[]);
        assert!(
            !CompiledNodeSelector::compile(&sel(vec![(vec![], vec![])]))
                .unwrap()
                .matches(&n)
        );
        let s = sel(vec![(
            vec![],
            vec![req("metadata.name", "In", &["node-1"])],
        )]);
        assert!(CompiledNodeSelector::compile(&s).unwrap().matches(&n));
        let s = sel(vec![(
            vec![req("missing", "DoesNotExist", &[])],
            vec![req("metadata.name", "NotIn", &["node-2"])],
        )]);
        assert!(CompiledNodeSelector::compile(&s).unwrap().matches(&n));
    }

    #[test]
    fn invalid_selectors_are_parse_errors() {
        assert!(
            CompiledNodeSelector::compile(&sel(vec![(vec![req("a", "Bogus", &["x"])], vec![])]))
                .is_err()
        );
        assert!(
            CompiledNodeSelector::compile(&sel(vec![(vec![req("a", "In", &[])], vec![])])).is_err()
        );
        assert!(
            CompiledNodeSelector::compile(&sel(vec![(vec![], vec![req("spec.x", "In", &["a"])])]))
                .is_err()
        );
        assert!(
            CompiledNodeSelector::compile(&sel(vec![(vec![req("a", "Gt", &["x"])], vec![])]))
                .is_err()
        );
    }

    #[test]
    fn precedence_is_node_name_then_all_nodes_then_selector() {
        let n = node("node-1", &[]);
        let never = sel(vec![(vec![req("x", "Exists", &[])], vec![])]);
        assert!(
            NodeMatchSpec::new(Some("node-1"), Some(false), Some(&never))
                .matches(&n)
                .unwrap()
        );
        assert!(
            NodeMatchSpec::new(None, Some(true), Some(&never))
                .matches(&n)
                .unwrap()
        );
        assert!(
            !NodeMatchSpec::new(Some(""), None, Some(&never))
                .matches(&n)
                .unwrap()
        );
        assert!(!NodeMatchSpec::new(None, None, None).matches(&n).unwrap());
    }
}
