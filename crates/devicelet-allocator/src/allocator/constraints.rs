//! Claim constraints (spec `structured-allocator.md` §2.7): `matchAttribute` and
//! `distinctAttribute`, following `structured/internal/incubating/constraint.go` as used by
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use crate::types::Semantics;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttrValue<'a> {
    Int(i64),
    Bool(bool),
    Str(&'a str),
    Version(&'a str),
    Unknown,
}

impl<'a> AttrValue<'a> {
    fn of(a: &'a DeviceAttribute) -> AttrValue<'a> {
        if let Some(s) = &a.string {
            AttrValue::Str(s)
        } else if let Some(i) = a.int {
            AttrValue::Int(i)
        } else if let Some(b) = a.bool {
            AttrValue::Bool(b)
        } else if let Some(v) = &a.version {
            AttrValue::Version(v)
        } else {
            AttrValue::Unknown
        }
    }
}

/// Go: `lookupAttribute`: full name, then the bare id when the domain is the driver.
pub(crate) fn lookup_attribute<'a>(
    dev: &'a Device,
    driver: &str,
    name: &str,
) -> Option<AttrValue<'a>> {
    let attrs = dev.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(AttrValue::of(a));
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attrs.get(id).map(AttrValue::of)
}

pub(crate) enum Constraint<'a> {
    Match {
        names: Arc<[&'a str]>,
        attr: &'a str,
        first: Option<AttrValue<'a>>,
        count: usize,
    },
    Distinct {
        names: Arc<[&'a str]>,
        attr: &'a str,
        /// GoCompat: values keyed by base request name (upstream bug #140438).
        by_request: Vec<(String, AttrValue<'a>)>,
        /// Fixed: one value per allocated device, in allocation order.
        stack: Vec<AttrValue<'a>>,
    },
}

fn applies(names: &[&str], base: &str, sub: Option<&str>) -> bool {
    if names.is_empty() {
        return true;
    }
    if names.contains(&base) {
        return true;
    }
    match sub {
        Some(s) => names.iter().any(|n| {
            n.len() == base.len() + 1 + s.len()
                && n.starts_with(base)
                && n.ends_with(s)
                && n.as_bytes()[base.len()] == b'/'
        }),
        None => false,
    }
}

/// Whether a candidate value collides with one stored value (Go: `matchesAttribute`).
///
/// Versions compare as exact strings, so `1.2.3` and `1.2.3+build.7` are distinct (spec §7
/// #28). §7 does not list this as an upstream bug, so Fixed semantics compare the same way.
/// A stored value of another type never collides; a candidate of unknown type (e.g. a list
/// attribute under incubating) collides with any stored value.
fn collides(existing: &AttrValue<'_>, candidate: &AttrValue<'_>) -> bool {
    match (existing, candidate) {
        (_, AttrValue::Unknown) => true,
        (AttrValue::Str(a), AttrValue::Str(b)) => a == b,
        (AttrValue::Int(a), AttrValue::Int(b)) => a == b,
        (AttrValue::Bool(a), AttrValue::Bool(b)) => a == b,
        (AttrValue::Version(a), AttrValue::Version(b)) => a == b,
        _ => false,
    }
}

/// A candidate is distinct when it collides with none of the stored values (an empty set
/// accepts anything, like Go's loop over an empty map).
fn all_distinct<'x>(
    mut values: impl Iterator<Item = &'x AttrValue<'x>>,
    candidate: &AttrValue<'_>,
) -> bool {
    !values.any(|existing| collides(existing, candidate))
}

impl<'a> Constraint<'a> {
    pub(super) fn add(
        &mut self,
        semantics: Semantics,
        base: &str,
        sub: Option<&str>,
        dev: &'a Device,
        driver: &str,
    ) -> bool {
        match self {
            Constraint::Match {
                names,
                attr,
                first,
                count,
            } => {
                if !applies(names, base, sub) {
                    return true;
                }
                let Some(v) = lookup_attribute(dev, driver, attr) else {
                    return false;
                };
                if *count == 0 {
                    *first = Some(v);
                    *count = 1;
                    return true;
                }
                let same = match (first.as_ref(), &v) {
                    (Some(AttrValue::Str(a)), AttrValue::Str(b)) => a == b,
                    (Some(AttrValue::Int(a)), AttrValue::Int(b)) => a == b,
                    (Some(AttrValue::Bool(a)), AttrValue::Bool(b)) => a == b,
                    // Versions compare as exact strings: build metadata counts (spec §7 #28; not a
                    // listed bug, so Fixed semantics compare the same way).
                    (Some(AttrValue::Version(a)), AttrValue::Version(b)) => a == b,
                    _ => false,
                };
                if same {
                    *count += 1;
                }
                same
            }
            Constraint::Distinct {
                names,
                attr,
                by_request,
                stack,
            } => {
                if !applies(names, base, sub) {
                    return true;
                }
                let Some(v) = lookup_attribute(dev, driver, attr) else {
                    return false;
                };
                match semantics {
                    Semantics::GoCompat => {
                        if !all_distinct(by_request.iter().map(|(_, v)| v), &v) {
                            return false;
                        }
                        if let Some(e) = by_request.iter_mut().find(|(n, _)| n == base) {
                            e.1 = v;
                        } else {
                            by_request.push((base.to_string(), v));
                        }
                        true
                    }
                    Semantics::Fixed => {
                        if !all_distinct(stack.iter(), &v) {
                            return false;
                        }
                        stack.push(v);
                        true
                    }
                }
            }
        }
    }

    pub(super) fn remove(&mut self, semantics: Semantics, base: &str, sub: Option<&str>) {
        match self {
            Constraint::Match { names, count, .. } => {
                if applies(names, base, sub) {
                    *count = count.saturating_sub(1);
                }
            }
            Constraint::Distinct {
                names,
                by_request,
                stack,
                ..
            } => {
                if !applies(names, base, sub) {
                    return;
                }
                match semantics {
                    Semantics::GoCompat => by_request.retain(|(n, _)| n != base),
                    Semantics::Fixed => {
                        stack.pop();
                    }
                }
            }
        }
    }
}
