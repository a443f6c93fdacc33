//! NodeName (`pkg/scheduler/framework/plugins/nodename/node_name.go`, S102).

use k8s_openapi::api::core::v1::Node;

use crate::framework::{Plugin, Rejection};

/// The upstream reason.
pub const REASON: &str = "node(s) didn't match the requested node name";

/// A pod naming a node fits only that node.
pub fn filter(node_name: Option<&str>, node: &Node) -> Option<Rejection> {
    let want = node_name?;
    (node.metadata.name.as_deref() != Some(want))
        .then(|| Rejection::unresolvable(Plugin::NodeName, REASON))
}
