//! Native evaluation of the common selector shapes (spec §3.6: "translate common selector
//! shapes into precompiled predicates ... and fall back to a general CEL interpreter").
//!
//! After the rewrite of `compile.rs`, a selector made only of `&&`, `||`, `!`, `true` /
//! `false` and these leaves is evaluated here, without the interpreter:
//! * `device.driver <op> "literal"`;
//! * `device.attributes[D].id <op> literal` (either order), `device.attributes[D].id` as a
//!   bool, `has(device.attributes[D].id)`, `has(device.capacity[D].id)`;
//! * `device.allowMultipleAllocations` (as a bool, or `==` / `!=` a bool literal);
//! * `device.capacity[D].id.compareTo(quantity("Q")) <op> n`,
//!   `.isGreaterThan(quantity("Q"))`, `.isLessThan(quantity("Q"))`, and the same on a
//!   version attribute with `semver("V")`;
//! * `device.attributes[D].id in [literals]`;
//! * `device.attributes[D].id.startsWith("s")` / `endsWith` / `contains` / `matches("re")`.
//!
//! The result is either definite (a bool, or the same runtime error the interpreter would
//! give, e.g. "no such key: id") or [`Outcome::Fallback`] whenever a value is of a type the
//! fast path does not handle, a quantity is not exactly representable, and so on; the
//! caller then runs the interpreter, so the fast path never changes a result. `&&` / `||`
//! follow cel-go's n-ary rules (as `@dra.and` / `@dra.or` do in the interpreter): the
//! first `false` (resp. `true`) decides and stops, else the first error wins.

use std::cmp::Ordering;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use kube_cel::cel::common::ast::{Expr, IdedExpr, LiteralValue, operators};

use crate::device::DeviceView;
use crate::functions;
use crate::program::{Program, RESERVED_PREFIX, Slot};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    fn from_function(name: &str) -> Option<Self> {
        Some(match name {
            operators::EQUALS | functions::EQ => CmpOp::Eq,
            operators::NOT_EQUALS | functions::NE => CmpOp::Ne,
            operators::LESS => CmpOp::Lt,
            operators::LESS_EQUALS => CmpOp::Le,
            operators::GREATER => CmpOp::Gt,
            operators::GREATER_EQUALS => CmpOp::Ge,
            _ => return None,
        })
    }

    /// `a op b` rewritten as `b op' a`.
    fn swapped(self) -> Self {
        match self {
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            CmpOp::Ge => CmpOp::Le,
            other => other,
        }
    }

    fn holds(self, ord: Ordering) -> bool {
        match self {
            CmpOp::Eq => ord == Ordering::Equal,
            CmpOp::Ne => ord != Ordering::Equal,
            CmpOp::Lt => ord == Ordering::Less,
            CmpOp::Le => ord != Ordering::Greater,
            CmpOp::Gt => ord == Ordering::Greater,
            CmpOp::Ge => ord != Ordering::Less,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Literal {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// A compiled native predicate.
#[derive(Debug, Clone)]
pub(crate) enum Fast {
    Const(bool),
    And(Vec<Fast>),
    Or(Vec<Fast>),
    Not(Box<Fast>),
    Driver(CmpOp, String),
    Attribute(Slot, CmpOp, Literal),
    AttributeBool(Slot),
    AttributeHas(Slot),
    CapacityHas(Slot),
    Multi(CmpOp, bool),
    /// `capacity.compareTo(q) <op> n`, with `q` in nano units.
    Capacity(Slot, i128, CmpOp, i64),
    /// `version.compareTo(v) <op> n` (precedence, build metadata ignored).
    Version(Slot, semver::Version, CmpOp, i64),
    /// `attribute in [literals]`.
    AttributeIn(Slot, Vec<Literal>),
    /// A string test on a string attribute.
    StringTest(Slot, StringTest),
}

#[derive(Debug, Clone)]
pub(crate) enum StringTest {
    StartsWith(String),
    EndsWith(String),
    Contains(String),
    Matches(regex::Regex),
}

/// Either side of a `compareTo`: a capacity with a quantity constant, or a version
/// attribute with a semver constant.
enum Ordered {
    Capacity(Slot, i128),
    Version(Slot, semver::Version),
}

impl Ordered {
    fn into_fast(self, op: CmpOp, n: i64) -> Fast {
        match self {
            Ordered::Capacity(slot, q) => Fast::Capacity(slot, q, op, n),
            Ordered::Version(slot, v) => Fast::Version(slot, v, op, n),
        }
    }
}

/// Result of a native evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Bool(bool),
    /// A runtime error in cel-go's words.
    Error(String),
    /// Not decidable natively: run the interpreter.
    Fallback,
}

fn reserved(e: &IdedExpr) -> Option<(u8, Option<usize>)> {
    let Expr::Ident(name) = &e.expr else {
        return None;
    };
    let rest = name.strip_prefix(RESERVED_PREFIX)?;
    let tag = *rest.as_bytes().first()?;
    Some((tag, rest.get(1..).and_then(|s| s.parse().ok())))
}

fn literal(e: &IdedExpr) -> Option<Literal> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(Literal::Str(s.inner().to_string())),
        Expr::Literal(LiteralValue::Int(i)) => Some(Literal::Int(*i.inner())),
        Expr::Literal(LiteralValue::Boolean(b)) => Some(Literal::Bool(*b.inner())),
        _ => None,
    }
}

impl Fast {
    /// Recognises a rewritten expression made only of supported shapes.
    pub(crate) fn build(e: &IdedExpr, program: &Program) -> Option<Fast> {
        match &e.expr {
            Expr::Literal(LiteralValue::Boolean(b)) => Some(Fast::Const(*b.inner())),
            Expr::Ident(_) => match reserved(e)? {
                (b'A', Some(i)) => {
                    Some(Fast::AttributeBool(program.attribute_slots.get(i)?.clone()))
                }
                (b'H', Some(i)) => {
                    Some(Fast::AttributeHas(program.attribute_slots.get(i)?.clone()))
                }
                (b'J', Some(i)) => Some(Fast::CapacityHas(program.capacity_slots.get(i)?.clone())),
                (b'M', _) => Some(Fast::Multi(CmpOp::Eq, true)),
                _ => None,
            },
            Expr::Call(c) if c.target.is_none() => {
                let name = c.func_name.as_str();
                match (name, c.args.as_slice()) {
                    (functions::AND, terms) => Some(Fast::And(
                        terms
                            .iter()
                            .map(|t| Fast::build(t, program))
                            .collect::<Option<_>>()?,
                    )),
                    (functions::OR, terms) => Some(Fast::Or(
                        terms
                            .iter()
                            .map(|t| Fast::build(t, program))
                            .collect::<Option<_>>()?,
                    )),
                    (operators::LOGICAL_NOT, [a]) => {
                        Some(Fast::Not(Box::new(Fast::build(a, program)?)))
                    }
                    (operators::IN, [a, b]) => {
                        let (b'A', Some(i)) = reserved(a)? else {
                            return None;
                        };
                        let (b'K', Some(k)) = reserved(b)? else {
                            return None;
                        };
                        let kube_cel::cel::Value::List(items) = program.constants.get(k)? else {
                            return None;
                        };
                        let literals = items
                            .iter()
                            .map(|v| match v {
                                kube_cel::cel::Value::String(s) => {
                                    Some(Literal::Str(s.to_string()))
                                }
                                kube_cel::cel::Value::Int(i) => Some(Literal::Int(*i)),
                                kube_cel::cel::Value::Bool(b) => Some(Literal::Bool(*b)),
                                _ => None,
                            })
                            .collect::<Option<Vec<_>>>()?;
                        Some(Fast::AttributeIn(
                            program.attribute_slots.get(i)?.clone(),
                            literals,
                        ))
                    }
                    (_, [a, b]) => {
                        let op = CmpOp::from_function(name)?;
                        Fast::comparison(a, op, b, program)
                            .or_else(|| Fast::comparison(b, op.swapped(), a, program))
                    }
                    _ => None,
                }
            }
            Expr::Call(c) => {
                let target = c.target.as_deref()?;
                match (c.func_name.as_str(), c.args.as_slice()) {
                    ("isGreaterThan", args) => {
                        Some(Fast::ordered_compare(target, args, program)?.into_fast(CmpOp::Eq, 1))
                    }
                    ("isLessThan", args) => {
                        Some(Fast::ordered_compare(target, args, program)?.into_fast(CmpOp::Eq, -1))
                    }
                    (name @ ("startsWith" | "endsWith" | "contains" | "matches"), [arg]) => {
                        let (b'A', Some(i)) = reserved(target)? else {
                            return None;
                        };
                        let Literal::Str(text) = literal(arg)? else {
                            return None;
                        };
                        let test = match name {
                            "startsWith" => StringTest::StartsWith(text),
                            "endsWith" => StringTest::EndsWith(text),
                            "contains" => StringTest::Contains(text),
                            _ => StringTest::Matches(regex::Regex::new(&text).ok()?),
                        };
                        Some(Fast::StringTest(
                            program.attribute_slots.get(i)?.clone(),
                            test,
                        ))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn comparison(lhs: &IdedExpr, op: CmpOp, rhs: &IdedExpr, program: &Program) -> Option<Fast> {
        if let Some(lit) = literal(rhs) {
            match reserved(lhs) {
                Some((b'D', _)) => {
                    if let Literal::Str(s) = lit {
                        return Some(Fast::Driver(op, s));
                    }
                    return None;
                }
                Some((b'A', Some(i))) => {
                    return Some(Fast::Attribute(
                        program.attribute_slots.get(i)?.clone(),
                        op,
                        lit,
                    ));
                }
                Some((b'M', _)) => {
                    if let (Literal::Bool(b), CmpOp::Eq | CmpOp::Ne) = (lit, op) {
                        return Some(Fast::Multi(op, b));
                    }
                    return None;
                }
                _ => {}
            }
            // capacity.compareTo(quantity(...)) <op> n
            if let (Expr::Call(c), Literal::Int(n)) = (&lhs.expr, lit)
                && c.func_name == "compareTo"
            {
                let ordered =
                    Fast::ordered_compare(c.target.as_deref()?, c.args.as_slice(), program)?;
                return Some(ordered.into_fast(op, n));
            }
        }
        None
    }

    fn ordered_compare(target: &IdedExpr, args: &[IdedExpr], program: &Program) -> Option<Ordered> {
        let [arg] = args else {
            return None;
        };
        let (b'K', Some(k)) = reserved(arg)? else {
            return None;
        };
        let literal_of = |table: &[(usize, String)]| {
            table
                .iter()
                .find(|(index, _)| *index == k)
                .map(|(_, t)| t.clone())
        };
        match reserved(target)? {
            (b'C', Some(slot)) => {
                let text = literal_of(&program.quantity_literals)?;
                Some(Ordered::Capacity(
                    program.capacity_slots.get(slot)?.clone(),
                    quantity_nanos(&text)?,
                ))
            }
            (b'A', Some(slot)) => {
                let text = literal_of(&program.semver_literals)?;
                let version = semver::Version::parse(&text).ok()?;
                Some(Ordered::Version(
                    program.attribute_slots.get(slot)?.clone(),
                    version,
                ))
            }
            _ => None,
        }
    }

    /// Evaluates natively. Attributes must have been validated already.
    pub(crate) fn eval(&self, device: &DeviceView<'_>) -> Outcome {
        match self {
            Fast::Const(b) => Outcome::Bool(*b),
            Fast::And(items) => combine(items, device, false),
            Fast::Or(items) => combine(items, device, true),
            Fast::Not(inner) => match inner.eval(device) {
                Outcome::Bool(b) => Outcome::Bool(!b),
                other => other,
            },
            Fast::Driver(op, lit) => Outcome::Bool(op.holds(device.driver.cmp(lit.as_str()))),
            Fast::Multi(op, lit) => {
                let v = device.allow_multiple_allocations.unwrap_or(false);
                Outcome::Bool(if *op == CmpOp::Eq {
                    v == *lit
                } else {
                    v != *lit
                })
            }
            Fast::AttributeHas(slot) => Outcome::Bool(find_attribute(device, slot).is_some()),
            Fast::CapacityHas(slot) => Outcome::Bool(find_capacity(device, slot).is_some()),
            Fast::AttributeBool(slot) => match find_attribute(device, slot) {
                None => no_such_key(slot),
                Some(DeviceAttribute { bool: Some(b), .. }) => Outcome::Bool(*b),
                Some(_) => Outcome::Fallback,
            },
            Fast::Attribute(slot, op, lit) => match find_attribute(device, slot) {
                None => no_such_key(slot),
                Some(attr) => compare_attribute(attr, *op, lit),
            },
            Fast::Version(slot, constant, op, n) => match find_attribute(device, slot) {
                None => no_such_key(slot),
                Some(DeviceAttribute {
                    version: Some(text),
                    ..
                }) => match semver::Version::parse(crate::env::strip_build_metadata(text)) {
                    Ok(v) => {
                        Outcome::Bool(op.holds(ordering_as_int(v.cmp_precedence(constant)).cmp(n)))
                    }
                    Err(_) => Outcome::Fallback,
                },
                Some(_) => Outcome::Fallback,
            },
            Fast::AttributeIn(slot, literals) => match find_attribute(device, slot) {
                None => no_such_key(slot),
                Some(attr) => {
                    let mut found = false;
                    for lit in literals {
                        match compare_attribute(attr, CmpOp::Eq, lit) {
                            Outcome::Bool(true) => {
                                found = true;
                                break;
                            }
                            Outcome::Bool(false) => {}
                            _ => return Outcome::Fallback,
                        }
                    }
                    Outcome::Bool(found)
                }
            },
            Fast::StringTest(slot, test) => match find_attribute(device, slot) {
                None => no_such_key(slot),
                Some(DeviceAttribute {
                    string: Some(s), ..
                }) => Outcome::Bool(match test {
                    StringTest::StartsWith(p) => s.starts_with(p.as_str()),
                    StringTest::EndsWith(p) => s.ends_with(p.as_str()),
                    StringTest::Contains(p) => s.contains(p.as_str()),
                    StringTest::Matches(re) => re.is_match(s),
                }),
                Some(_) => Outcome::Fallback,
            },
            Fast::Capacity(slot, q, op, n) => match find_capacity(device, slot) {
                None => no_such_key(slot),
                Some(cap) => match quantity_nanos(&cap.value.0) {
                    None => Outcome::Fallback,
                    Some(v) => Outcome::Bool(op.holds(ordering_as_int(v.cmp(q)).cmp(n))),
                },
            },
        }
    }
}

/// `compareTo`'s result.
fn ordering_as_int(ord: Ordering) -> i64 {
    match ord {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

fn no_such_key(slot: &Slot) -> Outcome {
    Outcome::Error(format!("no such key: {}", slot.id))
}

/// `&&` (`short = false`) or `||` (`short = true`) over the items in order, with cel-go's
/// rules. A term that cannot be decided natively might be the decisive value, so unless a
/// later term decides, the whole chain falls back to the interpreter.
fn combine(items: &[Fast], device: &DeviceView<'_>, short: bool) -> Outcome {
    let mut first_error: Option<Outcome> = None;
    let mut undecided = false;
    for item in items {
        match item.eval(device) {
            Outcome::Bool(b) if b == short => return Outcome::Bool(short),
            Outcome::Bool(_) => {}
            // Could be the decisive value: only a later decisive value settles the chain.
            Outcome::Fallback => undecided = true,
            error => {
                first_error.get_or_insert(error);
            }
        }
    }
    if undecided {
        return Outcome::Fallback;
    }
    first_error.unwrap_or(Outcome::Bool(!short))
}

fn find_attribute<'d>(device: &DeviceView<'d>, slot: &Slot) -> Option<&'d DeviceAttribute> {
    let attributes = device.attributes?;
    if slot.domain == device.driver
        && let Some(a) = attributes.get(slot.id.as_str())
    {
        return Some(a);
    }
    attributes.get(slot.qualified.as_str())
}

fn find_capacity<'d>(device: &DeviceView<'d>, slot: &Slot) -> Option<&'d DeviceCapacity> {
    let capacity = device.capacity?;
    if slot.domain == device.driver
        && let Some(c) = capacity.get(slot.id.as_str())
    {
        return Some(c);
    }
    capacity.get(slot.qualified.as_str())
}

/// Scalar attribute against a literal of the same kind; anything else falls back.
fn compare_attribute(attr: &DeviceAttribute, op: CmpOp, lit: &Literal) -> Outcome {
    let ord = match (attr, lit) {
        (DeviceAttribute { int: Some(v), .. }, Literal::Int(l)) => v.cmp(l),
        (
            DeviceAttribute {
                string: Some(v), ..
            },
            Literal::Str(l),
        ) => v.as_str().cmp(l.as_str()),
        (DeviceAttribute { bool: Some(v), .. }, Literal::Bool(l)) => v.cmp(l),
        _ => return Outcome::Fallback,
    };
    Outcome::Bool(op.holds(ord))
}

/// A Kubernetes quantity (`resource.ParseQuantity` syntax) in nano units, when it is
/// exactly representable in an `i128` (else `None`, and the caller falls back).
pub(crate) fn quantity_nanos(text: &str) -> Option<i128> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let negative = match bytes.first() {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let mut digits: i128 = 0;
    let mut fraction_digits: i32 = 0;
    let mut seen_digit = false;
    let mut seen_point = false;
    while i < bytes.len() {
        match bytes[i] {
            d @ b'0'..=b'9' => {
                digits = digits.checked_mul(10)?.checked_add(i128::from(d - b'0'))?;
                seen_digit = true;
                if seen_point {
                    fraction_digits += 1;
                }
            }
            b'.' if !seen_point => seen_point = true,
            _ => break,
        }
        i += 1;
    }
    if !seen_digit {
        return None;
    }
    let suffix = &text[i..];
    // value = digits * 10^(exp10 - fraction_digits) * 2^exp2, in units; we want nanos.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => {
            let e: i32 = s[1..].parse().ok()?;
            if !(-30..=30).contains(&e) {
                return None;
            }
            (e, 0)
        }
        _ => return None,
    };
    let mut value = digits.checked_mul(1i128.checked_shl(exp2)?)?;
    let scale = exp10 + 9 - fraction_digits;
    if scale >= 0 {
        value = value.checked_mul(10i128.checked_pow(scale as u32)?)?;
    } else {
        let divisor = 10i128.checked_pow((-scale) as u32)?;
        if value % divisor != 0 {
            return None; // finer than a nano: let kube-cel decide
        }
        value /= divisor;
    }
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantity_nanos_parses_kubernetes_suffixes_exactly() {
        assert_eq!(quantity_nanos("1"), Some(1_000_000_000));
        assert_eq!(quantity_nanos("1Gi"), Some((1i128 << 30) * 1_000_000_000));
        assert_eq!(quantity_nanos("1024Mi"), quantity_nanos("1Gi"));
        assert_eq!(quantity_nanos("1.5Gi"), Some((3i128 << 29) * 1_000_000_000));
        assert_eq!(quantity_nanos("500m"), Some(500_000_000));
        assert_eq!(quantity_nanos("0.5"), quantity_nanos("500m"));
        assert_eq!(quantity_nanos("1k"), quantity_nanos("1e3"));
        assert_eq!(
            quantity_nanos("1E"),
            Some(1_000_000_000_000_000_000_000_000_000)
        );
        assert_eq!(quantity_nanos("-2"), Some(-2_000_000_000));
        assert_eq!(quantity_nanos("1n"), Some(1));
        assert_eq!(quantity_nanos("0.1n"), None);
        assert_eq!(quantity_nanos("1X"), None);
        assert_eq!(quantity_nanos(""), None);
        assert_eq!(quantity_nanos("Gi"), None);
    }
}
