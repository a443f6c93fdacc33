//! The DRA answers the pod-group search keeps per node and member shape ([`NodeMemo`]), and
//! when they stay valid: a member placed on a node changes that node only, unless one of its
//! allocations reaches beyond it; backtracking restores an earlier state, so everything goes.

use std::collections::HashMap;

use k8s_openapi::api::resource::v1::AllocationResult;

use crate::cycle::NodeMemo;

/// The DRA answers per node and member shape, valid for the current state of the search only.
pub(super) struct Memos {
    by_shape: HashMap<u64, NodeMemo>,
    /// Off once an allocation reached beyond its own node (devices other nodes see).
    enabled: bool,
}

impl Memos {
    pub(super) fn new() -> Self {
        Memos {
            by_shape: HashMap::new(),
            enabled: true,
        }
    }

    /// A member was placed on `node` with `allocations`: nothing else changed unless one of
    /// them reaches beyond that node.
    pub(super) fn placed<'a>(
        &mut self,
        node: &str,
        mut allocations: impl Iterator<Item = &'a AllocationResult>,
    ) {
        if !allocations.all(|a| pinned_to(a, node)) {
            self.enabled = false;
            self.by_shape.clear();
            return;
        }
        for m in self.by_shape.values_mut() {
            m.forget(node);
        }
    }

    /// The search went back to an earlier state.
    pub(super) fn restored(&mut self) {
        for m in self.by_shape.values_mut() {
            m.clear();
        }
    }

    /// The memo of member shape `signature`, unless memos are off.
    pub(super) fn for_shape(&mut self, signature: u64) -> Option<&mut NodeMemo> {
        self.enabled
            .then(|| self.by_shape.entry(signature).or_default())
    }
}

/// Whether an allocation's node selector is exactly "the node named `node`" (node-local
/// devices): nothing it holds is visible from another node.
fn pinned_to(a: &AllocationResult, node: &str) -> bool {
    let Some(sel) = &a.node_selector else {
        return false;
    };
    let [term] = sel.node_selector_terms.as_slice() else {
        return false;
    };
    term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_deref().is_some_and(|f| {
            matches!(f, [r] if r.key == "metadata.name"
                && r.operator == "In"
                && r.values.as_deref().is_some_and(|v| v.len() == 1 && v[0] == node))
        })
}
