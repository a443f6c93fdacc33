//! The output of the rewrite in `compile.rs`: the rewritten expression and the tables its
//! reserved identifiers refer to, read by the interpreter's resolver (`device.rs`) and the
//! native fast path (`fastpath.rs`). The Go counterpart is the `cel.Program` that
//! `CompileCELExpression` in `DRA/cel/compile.go` returns. It names no other file of the
//! crate, so the compiler and both evaluators can use it without a cycle.

use kube_cel::cel::Value;
use kube_cel::cel::common::ast::IdedExpr;

/// Prefix of the identifiers the rewrite introduces. `@` cannot appear in a CEL
/// identifier, so user expressions cannot collide with them.
pub(crate) const RESERVED_PREFIX: &str = "@dra:";

/// One `device.attributes[domain].id` or `device.capacity[domain].id` lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) domain: String,
    pub(crate) id: String,
    /// `domain/id`, the key of a qualified name in the slice.
    pub(crate) qualified: String,
}

/// A rewritten expression and the tables its reserved identifiers refer to.
#[derive(Debug)]
pub(crate) struct Program {
    pub(crate) expr: IdedExpr,
    /// Nesting depth of `expr` (after the rewrite).
    pub(crate) depth: usize,
    pub(crate) attribute_slots: Vec<Slot>,
    pub(crate) capacity_slots: Vec<Slot>,
    pub(crate) attribute_domains: Vec<String>,
    pub(crate) capacity_domains: Vec<String>,
    pub(crate) constants: Vec<Value>,
    /// For constants made by `quantity("...")`: the literal text, by constant index (used
    /// by the native fast path).
    pub(crate) quantity_literals: Vec<(usize, String)>,
    /// For constants made by a one-argument `semver("...")`: the literal text (build
    /// metadata stripped), by constant index.
    pub(crate) semver_literals: Vec<(usize, String)>,
}

impl Program {
    /// The id of a slot named by a reserved identifier, for error messages.
    pub(crate) fn slot_id_for(&self, name: &str) -> Option<&str> {
        let rest = name.strip_prefix(RESERVED_PREFIX)?;
        let (tag, index) = rest.split_at_checked(1)?;
        let index: usize = index.parse().ok()?;
        match tag {
            "A" => self.attribute_slots.get(index).map(|s| s.id.as_str()),
            "C" => self.capacity_slots.get(index).map(|s| s.id.as_str()),
            _ => None,
        }
    }
}
