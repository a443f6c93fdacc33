//! TaintToleration (`pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go`,
//! `k8s.io/api/core/v1` `Toleration.ToleratesTaint`, S103). Only `NoSchedule` and `NoExecute`
//! taints filter; `PreferNoSchedule` only scores (W119).

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use crate::framework::{Plugin, Rejection};

/// Whether `t` tolerates `taint` (effect, key, then operator `Equal`/`Exists`).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// The first `NoSchedule`/`NoExecute` taint of the node that no toleration tolerates.
pub fn untolerated<'a>(tolerations: &[Toleration], node: &'a Node) -> Option<&'a Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// W119, the score's raw count: the node's `PreferNoSchedule` taints that none of the pod's
/// tolerations with an empty or `PreferNoSchedule` effect tolerates.
pub fn intolerable_preferences(tolerations: &[Toleration], node: &Node) -> i64 {
    let counted: Vec<&Toleration> = tolerations
        .iter()
        .filter(|t| {
            matches!(
                t.effect.as_deref(),
                None | Some("") | Some("PreferNoSchedule")
            )
        })
        .collect();
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|taint| taint.effect == "PreferNoSchedule")
        .filter(|taint| !counted.iter().any(|t| tolerates(t, taint)))
        .count() as i64
}

/// Rejects a node with an untolerated taint: `node(s) had untolerated taint(s)`, v1.36.3's text
/// (spec scheduler.md S-text quotes the older `{key: value}` form; the source wins). The taint
/// itself is logged, as upstream logs it at V(4).
pub fn filter(tolerations: &[Toleration], node: &Node) -> Option<Rejection> {
    let taint = untolerated(tolerations, node)?;
    tracing::debug!(
        node = node.metadata.name.as_deref().unwrap_or(""),
        taint = %format!("{}={}:{}", taint.key, taint.value.as_deref().unwrap_or(""), taint.effect),
        "node had an untolerated taint"
    );
    Some(Rejection::unresolvable(
        Plugin::TaintToleration,
        "node(s) had untolerated taint(s)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(key: &str, op: &str, value: &str, effect: &str) -> Toleration {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Toleration {
            key: opt(key),
            operator: opt(op),
            value: opt(value),
            effect: opt(effect),
            ..Toleration::default()
        }
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.to_owned()),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    #[test]
    fn s103_toleration_matching() {
        let t = taint("dedicated", "gpu", "NoSchedule");
        assert!(tolerates(
            &tol("dedicated", "Equal", "gpu", "NoSchedule"),
            &t
        ));
        assert!(tolerates(&tol("dedicated", "", "gpu", ""), &t));
        assert!(tolerates(&tol("dedicated", "Exists", "", ""), &t));
        assert!(tolerates(&tol("", "Exists", "", ""), &t));
        assert!(!tolerates(
            &tol("dedicated", "Equal", "cpu", "NoSchedule"),
            &t
        ));
        assert!(!tolerates(&tol("dedicated", "Exists", "", "NoExecute"), &t));
        assert!(!tolerates(&tol("other", "Exists", "", ""), &t));
    }

    #[test]
    fn s103_prefer_no_schedule_does_not_filter_and_the_message_names_the_taint() {
        let mut node = Node::default();
        node.spec.get_or_insert_default().taints = Some(vec![
            taint("soft", "", "PreferNoSchedule"),
            taint("dedicated", "", "NoExecute"),
        ]);
        let r = filter(&[], &node).expect("rejected");
        assert_eq!(r.reasons, vec!["node(s) had untolerated taint(s)"]);
    }
}
