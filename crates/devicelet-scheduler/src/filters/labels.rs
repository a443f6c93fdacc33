//! Label selectors as `metav1.LabelSelectorAsSelector` turns them into `labels.Selector`s
//! (`k8s.io/apimachinery/pkg/apis/meta/v1/helpers.go`): a missing selector selects nothing, an
//! empty one everything. Pod affinity terms, topology spread constraints and
//! PodDisruptionBudgets all match pods this way.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    /// An operator the API server's validation would have refused: matches nothing.
    Invalid,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
            Requirement::Invalid => false,
        }
    }
}

/// A parsed label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// `labels.Nothing()`: the field was not set.
    Nothing,
    /// Every requirement must hold; none at all is `labels.Everything()`.
    All(Vec<Requirement>),
}

impl Selector {
    /// `metav1.LabelSelectorAsSelector(selector)`.
    pub fn of(selector: Option<&LabelSelector>) -> Selector {
        let Some(s) = selector else {
            return Selector::Nothing;
        };
        let mut out: Vec<Requirement> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]))
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            out.push(match e.operator.as_str() {
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                _ => Requirement::Invalid,
            });
        }
        Selector::All(out)
    }

    /// `labels.Everything()`.
    pub fn everything() -> Selector {
        Selector::All(Vec::new())
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Nothing => false,
            Selector::All(reqs) => reqs.iter().all(|r| r.matches(labels)),
        }
    }

    /// `Selector.Empty()`: selects everything (no requirement). `Nothing` is not empty.
    pub fn is_empty(&self) -> bool {
        matches!(self, Selector::All(r) if r.is_empty())
    }

    /// Adds `key = value` requirements in front (the `matchLabelKeys` merge of
    /// `podtopologyspread.mergeLabelSetWithSelector`); `Nothing` stays `Nothing`.
    pub fn with_labels(self, pairs: &BTreeMap<String, String>) -> Selector {
        match self {
            Selector::Nothing => Selector::Nothing,
            Selector::All(reqs) => Selector::All(
                pairs
                    .iter()
                    .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]))
                    .chain(reqs)
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nil_selects_nothing_and_empty_selects_everything() {
        let l = labels(&[("app", "web")]);
        assert!(!Selector::of(None).matches(&l));
        assert!(!Selector::of(None).is_empty());
        let empty = Selector::of(Some(&LabelSelector::default()));
        assert!(empty.matches(&l) && empty.matches(&BTreeMap::new()) && empty.is_empty());
    }

    #[test]
    fn labels_and_expressions_must_all_hold() {
        let s = Selector::of(Some(&LabelSelector {
            match_labels: Some(labels(&[("app", "web")]).into_iter().collect()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        }));
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "api")])));
        let bad = Selector::of(Some(&LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "Gt".into(),
                values: None,
            }]),
            ..LabelSelector::default()
        }));
        assert!(!bad.matches(&labels(&[("a", "1")])));
    }

    #[test]
    fn match_label_keys_narrow_a_selector_but_not_nothing() {
        let merged = Selector::everything().with_labels(&labels(&[("rev", "2")]));
        assert!(merged.matches(&labels(&[("rev", "2"), ("x", "y")])));
        assert!(!merged.matches(&labels(&[("rev", "1")])));
        assert_eq!(
            Selector::Nothing.with_labels(&labels(&[("rev", "2")])),
            Selector::Nothing
        );
    }
}
