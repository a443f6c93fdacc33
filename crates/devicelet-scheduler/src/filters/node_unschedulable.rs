//! NodeUnschedulable (`pkg/scheduler/framework/plugins/nodeunschedulable/node_unschedulable.go`,
//! S101): a cordoned node takes only pods tolerating `node.kubernetes.io/unschedulable:NoSchedule`.

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use super::taint_toleration::tolerates;
use crate::framework::{Plugin, Rejection};

/// The upstream reason.
pub const REASON: &str = "node(s) were unschedulable";
/// The taint key a cordoned node is treated as having.
pub const TAINT_KEY: &str = "node.kubernetes.io/unschedulable";

/// Rejects a cordoned node unless the pod tolerates it.
pub fn filter(tolerations: &[Toleration], node: &Node) -> Option<Rejection> {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if !cordoned {
        return None;
    }
    let taint = Taint {
        key: TAINT_KEY.to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    };
    let tolerated = tolerations.iter().any(|t| tolerates(t, &taint));
    (!tolerated).then(|| Rejection::unresolvable(Plugin::NodeUnschedulable, REASON))
}
