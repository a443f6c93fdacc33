//! PodDisruptionBudgets in victim selection (`pkg/scheduler/framework/preemption/preemption.go`
//! → `filterPodsWithPDBViolation`; spec workloads.md W83): which potential victims would take a
//! budget below zero if evicted.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::filters::labels::Selector;

/// Whether `labels` satisfy `selector` (`metav1.LabelSelectorAsSelector`: every `matchLabels`
/// pair and every expression must hold). An unknown operator matches nothing.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::of(Some(selector)).matches(labels)
}

/// An empty selector: no `matchLabels` and no expressions (PDBs with one protect nothing here).
fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty())
}

/// Splits `units` (most important first; a unit is one pod, or the pods of a group evicted
/// together), keeping their order, into those whose eviction would violate a budget and those
/// whose would not. Budgets are spent pod by pod, so the first pods of a budget's set may pass
/// and the later ones violate; a pod already listed in a budget's `disruptedPods` spends
/// nothing of it.
pub fn split_by_violation<T>(
    units: Vec<T>,
    pods_of: impl Fn(&T) -> Vec<&Pod>,
    pdbs: &[Arc<PodDisruptionBudget>],
) -> (Vec<T>, Vec<T>) {
    let mut allowed: Vec<i32> = pdbs
        .iter()
        .map(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0)
        })
        .collect();
    let mut violating = Vec::new();
    let mut other = Vec::new();
    for item in units {
        let mut violates = false;
        for pod in pods_of(&item) {
            violates |= spend(pod, pdbs, &mut allowed);
        }
        if violates {
            violating.push(item);
        } else {
            other.push(item);
        }
    }
    (violating, other)
}

/// Spends `pod`'s share of every budget that covers it; true when one goes below zero.
fn spend(pod: &Pod, pdbs: &[Arc<PodDisruptionBudget>], allowed: &mut [i32]) -> bool {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut violates = false;
    for (i, pdb) in pdbs.iter().enumerate() {
        if pdb.metadata.namespace.as_deref().unwrap_or("") != ns {
            continue;
        }
        let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            continue;
        };
        if is_empty(selector) || !selector_matches(selector, labels) {
            continue;
        }
        let disrupted = pdb
            .status
            .as_ref()
            .and_then(|s| s.disrupted_pods.as_ref())
            .is_some_and(|d| d.contains_key(name));
        if disrupted {
            continue;
        }
        allowed[i] -= 1;
        if allowed[i] < 0 {
            violates = true;
        }
    }
    violates
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn pod(name: &str, app: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.labels = Some(BTreeMap::from([("app".to_owned(), app.to_owned())]));
        p
    }

    fn pdb(app: &str, allowed: i32, disrupted: &[&str]) -> Arc<PodDisruptionBudget> {
        let mut b = PodDisruptionBudget {
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                    match_expressions: None,
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: Some(allowed),
                disrupted_pods: Some(
                    disrupted
                        .iter()
                        .map(|n| {
                            (
                                (*n).to_owned(),
                                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                                ),
                            )
                        })
                        .collect(),
                ),
                ..PodDisruptionBudgetStatus::default()
            }),
            ..PodDisruptionBudget::default()
        };
        b.metadata.namespace = Some("ns".into());
        b.metadata.name = Some(format!("pdb-{app}"));
        Arc::new(b)
    }

    #[test]
    fn w83_budgets_are_spent_pod_by_pod() {
        let pods = vec![
            pod("a", "db"),
            pod("b", "db"),
            pod("c", "web"),
            pod("d", "db"),
        ];
        let (violating, other) = split_by_violation(pods, |p| vec![p], &[pdb("db", 1, &[])]);
        let names = |v: &[Pod]| -> Vec<String> {
            v.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
        };
        assert_eq!(names(&violating), ["b", "d"]);
        assert_eq!(names(&other), ["a", "c"]);
    }

    #[test]
    fn w83_already_disrupted_pods_spend_nothing_and_empty_selectors_protect_nothing() {
        let pods = vec![pod("a", "db"), pod("b", "db")];
        let (violating, _) = split_by_violation(pods.clone(), |p| vec![p], &[pdb("db", 0, &["a"])]);
        assert_eq!(violating.len(), 1);
        assert_eq!(violating[0].metadata.name.as_deref(), Some("b"));
        let mut empty = (*pdb("db", 0, &[])).clone();
        empty.spec.as_mut().unwrap().selector = Some(LabelSelector::default());
        let (violating, _) = split_by_violation(pods, |p| vec![p], &[Arc::new(empty)]);
        assert!(violating.is_empty());
    }

    #[test]
    fn selector_expressions() {
        let labels = BTreeMap::from([("tier".to_owned(), "gpu".to_owned())]);
        let expr = |op: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
        };
        assert!(selector_matches(&expr("In", &["gpu", "cpu"]), &labels));
        assert!(!selector_matches(&expr("NotIn", &["gpu"]), &labels));
        assert!(selector_matches(&expr("Exists", &[]), &labels));
        assert!(!selector_matches(&expr("DoesNotExist", &[]), &labels));
        assert!(!selector_matches(&expr("Bogus", &[]), &labels));
    }
}
