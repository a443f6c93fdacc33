//! Static type checking of a selector, matching what cel-go's checker rejects in the DRA
//! environment.
//!
//! Follows `cel-go/checker/checker.go` as configured by
//! `staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go` (the `device` variable:
//! `driver` string, `attributes` map(string, map(string, any)) — dyn with list-type
//! attributes —, `capacity` map(string, map(string, kubernetes.Quantity)),
//! `allowMultipleAllocations` bool) over `apiserver/pkg/cel/environment/base.go`
//! (CrossTypeNumericComparisons adds ordering across int/uint/double but not equality;
//! HomogeneousAggregateLiterals makes mixed list / map literals an error).
//!
//! The checker knows the overloads of the operators, the conversions, the string
//! functions and the Kubernetes quantity / semver functions. Everything else (other
//! library functions, optional values) is typed [`Ty::Unknown`], which behaves like
//! `dyn` and is never reported: the rule is to reject only what Go certainly rejects.
//! Undeclared references and unknown `device` fields are found by the rewriter in
//! `compile.rs`, which runs first.

use std::collections::HashMap;
use std::fmt;

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, SourceInfo, operators};

/// A CEL type as far as the checker tracks it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ty {
    /// What we do not model: accepted everywhere, never reported.
    Unknown,
    /// cel-go's `dyn` (from `dyn()`, selection on `dyn`/`any`, mixed results).
    Dyn,
    /// `google.protobuf.Any`: the type of an attribute value without list-type attributes.
    Any,
    /// A type variable not bound yet (element type of `[]` and `{}`).
    Free,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    Quantity,
    Semver,
    Device,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    /// `optional_type(T)`; only produced where cel-go's typing is odd (`null["k"]`).
    Optional(Box<Ty>),
}

impl Ty {
    fn list(e: Ty) -> Ty {
        Ty::List(Box::new(e))
    }
    fn map(k: Ty, v: Ty) -> Ty {
        Ty::Map(Box::new(k), Box::new(v))
    }
    /// Types that match any parameter (cel-go's `isDynOrError`, plus ours).
    fn is_dynish(&self) -> bool {
        matches!(self, Ty::Unknown | Ty::Dyn | Ty::Any | Ty::Free)
    }
    /// Whether the type mentions [`Ty::Unknown`] (then we never report it).
    fn has_unknown(&self) -> bool {
        match self {
            Ty::Unknown => true,
            Ty::List(e) | Ty::Optional(e) => e.has_unknown(),
            Ty::Map(k, v) => k.has_unknown() || v.has_unknown(),
            _ => false,
        }
    }

    /// The spelling of `cel.Type.String()`, used in "must evaluate to bool ...".
    pub(crate) fn result_name(&self) -> String {
        match self {
            Ty::Any => "google.protobuf.Any".into(),
            Ty::Duration => "google.protobuf.Duration".into(),
            Ty::Timestamp => "google.protobuf.Timestamp".into(),
            Ty::Null => "null_type".into(),
            Ty::List(e) => format!("list({})", e.result_name()),
            Ty::Map(k, v) => format!("map({}, {})", k.result_name(), v.result_name()),
            Ty::Optional(t) => format!("optional_type({})", t.result_name()),
            other => other.to_string(),
        }
    }
}

/// The spelling of cel-go's `FormatCELType`, used in overload errors.
impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Unknown | Ty::Dyn | Ty::Free => f.write_str("dyn"),
            Ty::Any => f.write_str("any"),
            Ty::Null => f.write_str("null"),
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::Uint => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::String => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Duration => f.write_str("duration"),
            Ty::Timestamp => f.write_str("timestamp"),
            Ty::Quantity => f.write_str("kubernetes.Quantity"),
            Ty::Semver => f.write_str("kubernetes.Semver"),
            Ty::Device => f.write_str("kubernetes.DRADevice"),
            Ty::List(e) => write!(f, "list({e})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Optional(t) => write!(f, "optional_type({t})"),
        }
    }
}

/// A parameter or result of an overload: a type, or one of two type variables.
#[derive(Clone, Copy)]
enum P {
    T(&'static Ty),
    A,
    B,
    ListA,
    MapAB,
    ListString,
}

const INT: P = P::T(&Ty::Int);
const UINT: P = P::T(&Ty::Uint);
const DOUBLE: P = P::T(&Ty::Double);
const STRING: P = P::T(&Ty::String);
const BOOL: P = P::T(&Ty::Bool);
const BYTES: P = P::T(&Ty::Bytes);
const DURATION: P = P::T(&Ty::Duration);
const TIMESTAMP: P = P::T(&Ty::Timestamp);
const QUANTITY: P = P::T(&Ty::Quantity);
const SEMVER: P = P::T(&Ty::Semver);
const DYN: P = P::T(&Ty::Dyn);
const LIST_STRING: P = P::ListString;

/// One overload: parameters (the receiver first for member overloads) and result.
type Overload = (&'static [P], P);

#[derive(Default)]
struct Bindings {
    a: Option<Ty>,
    b: Option<Ty>,
}

/// Whether an argument of type `arg` can be passed where `param` is expected.
fn assignable(param: &Ty, arg: &Ty) -> bool {
    if param.is_dynish() || arg.is_dynish() {
        return true;
    }
    match (param, arg) {
        (Ty::List(p), Ty::List(a)) => assignable(p, a),
        (Ty::Map(pk, pv), Ty::Map(ak, av)) => assignable(pk, ak) && assignable(pv, av),
        // null converts to the object types and the well-known timestamp / duration.
        (Ty::Quantity | Ty::Semver | Ty::Duration | Ty::Timestamp | Ty::Device, Ty::Null) => true,
        (Ty::Null, Ty::Quantity | Ty::Semver | Ty::Duration | Ty::Timestamp | Ty::Device) => true,
        _ => param == arg,
    }
}

/// The more specific of two types that are assignable to each other (a bound type
/// variable stays bound to its first concrete type, as cel-go's substitution does).
fn join(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Free, x) | (x, Ty::Free) => x.clone(),
        (Ty::List(x), Ty::List(y)) => Ty::list(join(x, y)),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => Ty::map(join(k1, k2), join(v1, v2)),
        (x, _) => x.clone(),
    }
}

fn bind(slot: &mut Option<Ty>, arg: &Ty) -> bool {
    match slot {
        None => {
            *slot = Some(arg.clone());
            true
        }
        Some(bound) => {
            if assignable(bound, arg) {
                // cel-go keeps the more general binding: a later `dyn` or `any` argument
                // replaces a concrete one (`true ? 1 : attr` is `any`, accepted).
                *slot = Some(match arg {
                    Ty::Dyn | Ty::Any | Ty::Unknown => arg.clone(),
                    _ if *bound == Ty::Unknown => Ty::Unknown,
                    _ => join(bound, arg),
                });
                true
            } else {
                false
            }
        }
    }
}

fn matches_param(p: P, arg: &Ty, bindings: &mut Bindings) -> bool {
    match p {
        P::T(t) => assignable(t, arg),
        P::ListString => assignable(&Ty::list(Ty::String), arg),
        P::A => bind(&mut bindings.a, arg),
        P::B => bind(&mut bindings.b, arg),
        P::ListA => match arg {
            Ty::List(e) => bind(&mut bindings.a, e),
            a if a.is_dynish() => true,
            _ => false,
        },
        P::MapAB => match arg {
            Ty::Map(k, v) => bind(&mut bindings.a, k) && bind(&mut bindings.b, v),
            a if a.is_dynish() => true,
            _ => false,
        },
    }
}

fn instantiate(p: P, bindings: &Bindings) -> Ty {
    let var = |v: &Option<Ty>| match v {
        Some(Ty::Free) | None => Ty::Dyn,
        Some(t) => t.clone(),
    };
    match p {
        P::T(t) => t.clone(),
        P::ListString => Ty::list(Ty::String),
        P::A => var(&bindings.a),
        P::B => var(&bindings.b),
        P::ListA => Ty::list(bindings.a.clone().unwrap_or(Ty::Free)),
        P::MapAB => Ty::map(
            bindings.a.clone().unwrap_or(Ty::Free),
            bindings.b.clone().unwrap_or(Ty::Free),
        ),
    }
}

/// cel-go's overload resolution: the result of the first matching overload, or `dyn`
/// when matching overloads disagree; `None` when nothing matches.
fn resolve(overloads: &[Overload], args: &[Ty]) -> Option<Ty> {
    let mut result: Option<Ty> = None;
    for (params, ret) in overloads {
        if params.len() != args.len() {
            continue;
        }
        let mut bindings = Bindings::default();
        if params
            .iter()
            .zip(args)
            .all(|(p, a)| matches_param(*p, a, &mut bindings))
        {
            let t = instantiate(*ret, &bindings);
            result = Some(match result {
                None => t,
                Some(prev) if prev == t || prev == Ty::Dyn => prev,
                Some(_) => Ty::Dyn,
            });
        }
    }
    result
}

const ORDERED: &[Overload] = &[
    (&[BOOL, BOOL], BOOL),
    (&[INT, INT], BOOL),
    (&[UINT, UINT], BOOL),
    (&[DOUBLE, DOUBLE], BOOL),
    (&[STRING, STRING], BOOL),
    (&[BYTES, BYTES], BOOL),
    (&[TIMESTAMP, TIMESTAMP], BOOL),
    (&[DURATION, DURATION], BOOL),
    // CrossTypeNumericComparisons.
    (&[INT, UINT], BOOL),
    (&[INT, DOUBLE], BOOL),
    (&[UINT, INT], BOOL),
    (&[UINT, DOUBLE], BOOL),
    (&[DOUBLE, INT], BOOL),
    (&[DOUBLE, UINT], BOOL),
];

/// Overloads of operators and global functions (member overloads have the receiver
/// first and are looked up by [`member_overloads`]).
fn global_overloads(name: &str) -> Option<&'static [Overload]> {
    Some(match name {
        operators::EQUALS | operators::NOT_EQUALS => &[(&[P::A, P::A], BOOL)],
        operators::LESS
        | operators::LESS_EQUALS
        | operators::GREATER
        | operators::GREATER_EQUALS => ORDERED,
        operators::ADD => &[
            (&[INT, INT], INT),
            (&[UINT, UINT], UINT),
            (&[DOUBLE, DOUBLE], DOUBLE),
            (&[STRING, STRING], STRING),
            (&[BYTES, BYTES], BYTES),
            (&[P::ListA, P::ListA], P::ListA),
            (&[TIMESTAMP, DURATION], TIMESTAMP),
            (&[DURATION, TIMESTAMP], TIMESTAMP),
            (&[DURATION, DURATION], DURATION),
        ],
        operators::SUBSTRACT => &[
            (&[INT, INT], INT),
            (&[UINT, UINT], UINT),
            (&[DOUBLE, DOUBLE], DOUBLE),
            (&[TIMESTAMP, TIMESTAMP], DURATION),
            (&[TIMESTAMP, DURATION], TIMESTAMP),
            (&[DURATION, DURATION], DURATION),
        ],
        operators::MULTIPLY | operators::DIVIDE => &[
            (&[INT, INT], INT),
            (&[UINT, UINT], UINT),
            (&[DOUBLE, DOUBLE], DOUBLE),
        ],
        operators::MODULO => &[(&[INT, INT], INT), (&[UINT, UINT], UINT)],
        operators::NEGATE => &[(&[INT], INT), (&[DOUBLE], DOUBLE)],
        operators::LOGICAL_NOT => &[(&[BOOL], BOOL)],
        operators::NOT_STRICTLY_FALSE => &[(&[BOOL], BOOL)],
        operators::CONDITIONAL => &[(&[BOOL, P::A, P::A], P::A)],
        operators::INDEX => &[(&[P::ListA, INT], P::A), (&[P::MapAB, P::A], P::B)],
        operators::IN => &[(&[P::A, P::ListA], BOOL), (&[P::A, P::MapAB], BOOL)],
        "size" => &[
            (&[STRING], INT),
            (&[BYTES], INT),
            (&[P::ListA], INT),
            (&[P::MapAB], INT),
        ],
        "matches" => &[(&[STRING, STRING], BOOL)],
        "int" => &[
            (&[INT], INT),
            (&[UINT], INT),
            (&[DOUBLE], INT),
            (&[STRING], INT),
            (&[TIMESTAMP], INT),
            (&[DURATION], INT),
        ],
        "uint" => &[
            (&[INT], UINT),
            (&[UINT], UINT),
            (&[DOUBLE], UINT),
            (&[STRING], UINT),
        ],
        "double" => &[
            (&[INT], DOUBLE),
            (&[UINT], DOUBLE),
            (&[DOUBLE], DOUBLE),
            (&[STRING], DOUBLE),
        ],
        "string" => &[
            (&[INT], STRING),
            (&[UINT], STRING),
            (&[DOUBLE], STRING),
            (&[STRING], STRING),
            (&[BOOL], STRING),
            (&[BYTES], STRING),
            (&[TIMESTAMP], STRING),
            (&[DURATION], STRING),
        ],
        "bool" => &[(&[BOOL], BOOL), (&[STRING], BOOL)],
        "bytes" => &[(&[BYTES], BYTES), (&[STRING], BYTES)],
        "dyn" => &[(&[P::A], DYN)],
        // Parameters we are not sure of are `dyn`: the result type is what matters.
        "duration" => &[(&[DYN], DURATION)],
        "timestamp" => &[(&[DYN], TIMESTAMP)],
        "quantity" => &[(&[STRING], QUANTITY)],
        "isQuantity" | "isURL" | "isIP" | "isCIDR" => &[(&[STRING], BOOL)],
        "semver" => &[(&[STRING], SEMVER), (&[STRING, BOOL], SEMVER)],
        "isSemver" => &[(&[STRING], BOOL), (&[STRING, BOOL], BOOL)],
        _ => return None,
    })
}

fn member_overloads(name: &str) -> Option<&'static [Overload]> {
    Some(match name {
        "size" => &[
            (&[STRING], INT),
            (&[BYTES], INT),
            (&[P::ListA], INT),
            (&[P::MapAB], INT),
        ],
        "contains" | "startsWith" | "endsWith" | "matches" => &[(&[STRING, STRING], BOOL)],
        "lowerAscii" | "upperAscii" | "trim" => &[(&[STRING], STRING)],
        "charAt" => &[(&[STRING, INT], STRING)],
        "substring" => &[(&[STRING, INT], STRING), (&[STRING, INT, INT], STRING)],
        "replace" => &[
            (&[STRING, STRING, STRING], STRING),
            (&[STRING, STRING, STRING, INT], STRING),
        ],
        "split" => &[
            (&[STRING, STRING], LIST_STRING),
            (&[STRING, STRING, INT], LIST_STRING),
        ],
        "find" => &[(&[STRING, STRING], STRING)],
        "findAll" => &[
            (&[STRING, STRING], LIST_STRING),
            (&[STRING, STRING, INT], LIST_STRING),
        ],
        "indexOf" | "lastIndexOf" => &[
            (&[STRING, STRING], INT),
            (&[STRING, STRING, INT], INT),
            (&[P::ListA, P::A], INT),
        ],
        "join" => &[(&[LIST_STRING], STRING), (&[LIST_STRING, STRING], STRING)],
        "reverse" | "distinct" => &[(&[P::ListA], P::ListA)],
        "format" => &[(&[STRING, P::ListA], STRING)],
        "includes" => &[(&[DYN, DYN], BOOL)],
        "getFullYear" | "getMonth" | "getDayOfYear" | "getDayOfMonth" | "getDate"
        | "getDayOfWeek" => &[(&[TIMESTAMP], INT), (&[TIMESTAMP, STRING], INT)],
        "getHours" | "getMinutes" | "getSeconds" | "getMilliseconds" => &[
            (&[TIMESTAMP], INT),
            (&[TIMESTAMP, STRING], INT),
            (&[DURATION], INT),
        ],
        "isInteger" => &[(&[QUANTITY], BOOL)],
        "asInteger" => &[(&[QUANTITY], INT)],
        // Declared in the Kubernetes environment, but with no member overload that
        // accepts anything (cel-go rejects `quantity("1").sign()` and `dyn(1).sign()`).
        "sign" => &[],
        "asApproximateFloat" => &[(&[QUANTITY], DOUBLE)],
        "add" | "sub" => &[
            (&[QUANTITY, QUANTITY], QUANTITY),
            (&[QUANTITY, INT], QUANTITY),
        ],
        "isGreaterThan" | "isLessThan" => {
            &[(&[QUANTITY, QUANTITY], BOOL), (&[SEMVER, SEMVER], BOOL)]
        }
        "compareTo" => &[(&[QUANTITY, QUANTITY], INT), (&[SEMVER, SEMVER], INT)],
        "major" | "minor" | "patch" => &[(&[SEMVER], INT)],
        _ => return None,
    })
}

/// One reported issue: the expression id it is attached to and the message.
struct Issue {
    id: u64,
    message: String,
}

pub(crate) struct Checker {
    list_type_attributes: bool,
    /// Variables in scope (comprehension variables, `cel.bind` names) and their types.
    scope: Vec<(String, Ty)>,
    issues: Vec<Issue>,
    /// Inside the arguments of `format`, which cel-go exempts from the homogeneous
    /// aggregate literal check (`"%s-%d".format(["a", 1])` is fine).
    in_exempt_call: usize,
}

/// The outcome of checking one expression.
pub(crate) struct Checked {
    /// The type of the whole expression.
    pub(crate) ty: Ty,
    /// Issues as (expression id, message), in the order found.
    pub(crate) issues: Vec<(u64, String)>,
}

impl Checker {
    pub(crate) fn check(expr: &IdedExpr, list_type_attributes: bool) -> Checked {
        let mut checker = Checker {
            list_type_attributes,
            scope: Vec::new(),
            issues: Vec::new(),
            in_exempt_call: 0,
        };
        let ty = checker.expr(expr);
        Checked {
            ty,
            issues: checker
                .issues
                .into_iter()
                .map(|i| (i.id, i.message))
                .collect(),
        }
    }

    fn report(&mut self, id: u64, message: String) {
        self.issues.push(Issue { id, message });
    }

    fn lookup(&self, name: &str) -> Option<Ty> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    }

    fn attribute_value(&self) -> Ty {
        if self.list_type_attributes {
            Ty::Dyn
        } else {
            Ty::Any
        }
    }

    fn expr(&mut self, e: &IdedExpr) -> Ty {
        match &e.expr {
            Expr::Literal(l) => match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::Null => Ty::Null,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::UInt(_) => Ty::Uint,
            },
            Expr::Ident(name) => {
                if let Some(t) = self.lookup(name) {
                    t
                } else if name == "device" {
                    Ty::Device
                } else {
                    // Undeclared references are the rewriter's business.
                    Ty::Unknown
                }
            }
            Expr::Select(s) => {
                let operand = self.expr(&s.operand);
                let field_type = match &operand {
                    Ty::Device => match s.field.as_str() {
                        "driver" => Ty::String,
                        "attributes" => {
                            Ty::map(Ty::String, Ty::map(Ty::String, self.attribute_value()))
                        }
                        "capacity" => Ty::map(Ty::String, Ty::map(Ty::String, Ty::Quantity)),
                        "allowMultipleAllocations" => Ty::Bool,
                        _ => Ty::Unknown,
                    },
                    Ty::Map(_, v) => (**v).clone(),
                    Ty::Unknown => Ty::Unknown,
                    Ty::Dyn | Ty::Any | Ty::Free => Ty::Dyn,
                    // Kubernetes declares these object types without fields.
                    Ty::Quantity | Ty::Semver => {
                        let message = format!("unexpected failed resolution of '{operand}'");
                        self.report(e.id, message);
                        Ty::Unknown
                    }
                    other => {
                        let message = format!("type '{other}' does not support field selection");
                        self.report(e.id, message);
                        Ty::Unknown
                    }
                };
                if s.test { Ty::Bool } else { field_type }
            }
            Expr::List(l) => {
                if !l.optional_indices.is_empty() {
                    for x in &l.elements {
                        self.expr(x);
                    }
                    return Ty::list(Ty::Unknown);
                }
                let types: Vec<(u64, Ty)> =
                    l.elements.iter().map(|x| (x.id, self.expr(x))).collect();
                Ty::list(self.homogeneous(&types))
            }
            Expr::Map(m) => {
                let mut keys = Vec::new();
                let mut values = Vec::new();
                let mut optional = false;
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        optional |= me.optional;
                        keys.push((me.key.id, self.expr(&me.key)));
                        values.push((me.value.id, self.expr(&me.value)));
                    }
                }
                if optional {
                    return Ty::map(Ty::Unknown, Ty::Unknown);
                }
                let k = self.homogeneous(&keys);
                let v = self.homogeneous(&values);
                Ty::map(k, v)
            }
            Expr::Struct(_) | Expr::Unspecified => Ty::Unknown,
            Expr::Comprehension(c) => {
                let range = self.expr(&c.iter_range);
                let (var1, var2) = match &range {
                    Ty::List(elem) => match &c.iter_var2 {
                        Some(_) => (Ty::Int, (**elem).clone()),
                        None => ((**elem).clone(), Ty::Unknown),
                    },
                    Ty::Map(k, v) => ((**k).clone(), (**v).clone()),
                    Ty::Unknown => (Ty::Unknown, Ty::Unknown),
                    // `any` (an attribute value) is not iterable for cel-go; `dyn` is.
                    Ty::Dyn | Ty::Free => (Ty::Dyn, Ty::Dyn),
                    other => {
                        let message = format!(
                            "expression of type '{other}' cannot be range of a comprehension (must be list, map, or dynamic)"
                        );
                        self.report(c.iter_range.id, message);
                        (Ty::Unknown, Ty::Unknown)
                    }
                };
                let accu_init = self.expr(&c.accu_init);
                let depth = self.scope.len();
                self.scope.push((c.accu_var.clone(), accu_init.clone()));
                self.scope.push((c.iter_var.clone(), var1));
                if let Some(v2) = &c.iter_var2 {
                    self.scope.push((v2.clone(), var2));
                }
                self.expr_as_bool(&c.loop_cond);
                let step = self.expr(&c.loop_step);
                let accu = if assignable(&accu_init, &step) {
                    join(&accu_init, &step)
                } else {
                    let message = format!("expected type '{accu_init}' but found '{step}'");
                    self.report(c.loop_step.id, message);
                    accu_init
                };
                self.scope.truncate(depth);
                self.scope.push((c.accu_var.clone(), accu));
                let result = self.expr(&c.result);
                self.scope.truncate(depth);
                result
            }
            Expr::Call(call) => self.call(e.id, call),
        }
    }

    /// An operand that must be a bool (`&&`, `||`, comprehension conditions).
    fn expr_as_bool(&mut self, e: &IdedExpr) -> Ty {
        let t = self.expr(e);
        if !assignable(&Ty::Bool, &t) {
            self.report(e.id, format!("expected type 'bool' but found '{t}'"));
        }
        Ty::Bool
    }

    /// The element type of a list or map literal, reporting cel-go's homogeneous
    /// aggregate literal violations (elements must have exactly the first one's type).
    fn homogeneous(&mut self, types: &[(u64, Ty)]) -> Ty {
        let Some((_, first)) = types.first() else {
            return Ty::Free;
        };
        if self.in_exempt_call > 0 {
            let all_same = types.iter().all(|(_, t)| same_type(first, t));
            return if all_same { first.clone() } else { Ty::Dyn };
        }
        if first.has_unknown() {
            return Ty::Unknown;
        }
        let mut elem = first.clone();
        for (id, t) in &types[1..] {
            if t.has_unknown() {
                return Ty::Unknown;
            }
            if !same_type(&elem, t) {
                self.report(*id, format!("expected type '{elem}' but found '{t}'"));
                return Ty::Unknown;
            }
            elem = join(&elem, t);
        }
        elem
    }

    fn call(&mut self, id: u64, c: &kube_cel::cel::common::ast::CallExpr) -> Ty {
        let name = c.func_name.as_str();
        if (name == operators::LOGICAL_AND || name == operators::LOGICAL_OR) && c.target.is_none() {
            for a in &c.args {
                self.expr_as_bool(a);
            }
            return Ty::Bool;
        }
        // cel.bind(var, init, body).
        if name == "bind"
            && c.args.len() == 3
            && matches!(c.target.as_deref(), Some(IdedExpr { expr: Expr::Ident(t), .. }) if t == "cel" && self.lookup("cel").is_none())
        {
            let Expr::Ident(var) = &c.args[0].expr else {
                return Ty::Unknown;
            };
            let init = self.expr(&c.args[1]);
            self.scope.push((var.clone(), init));
            let body = self.expr(&c.args[2]);
            self.scope.pop();
            return body;
        }
        // Namespaced functions (`sets.contains`, `optional.of`, ...): not modelled.
        if let Some(t) = &c.target
            && let Expr::Ident(prefix) = &t.expr
            && self.lookup(prefix).is_none()
            && prefix != "device"
        {
            for a in &c.args {
                self.expr(a);
            }
            return Ty::Unknown;
        }
        let mut args = Vec::with_capacity(c.args.len() + 1);
        if let Some(t) = &c.target {
            args.push(self.expr(t));
        }
        self.validate_literal_arguments(name, c);
        let exempt = name == "format" && c.target.is_some();
        self.in_exempt_call += usize::from(exempt);
        for a in &c.args {
            args.push(self.expr(a));
        }
        self.in_exempt_call -= usize::from(exempt);
        if name == operators::INDEX && args.first() == Some(&Ty::Null) {
            // cel-go types an index into null as dyn for an int key and, through the
            // optional-index overloads, as optional_type(dyn) for other keys.
            return match args.get(1) {
                Some(Ty::Int) => Ty::Dyn,
                Some(k) if k.is_dynish() => Ty::Unknown,
                _ => Ty::Optional(Box::new(Ty::Dyn)),
            };
        }
        let overloads = if c.target.is_some() {
            member_overloads(name)
        } else {
            global_overloads(name)
        };
        let Some(overloads) = overloads else {
            return Ty::Unknown;
        };
        if args.iter().any(Ty::has_unknown) {
            // Something we do not model is involved: check nothing, but keep the result
            // type when all overloads agree on it.
            return match resolve(overloads, &args) {
                Some(t) if !t.is_dynish() && overloads.iter().all(|(_, r)| same_result(*r, &t)) => {
                    t
                }
                _ => Ty::Unknown,
            };
        }
        match resolve(overloads, &args) {
            Some(t) => t,
            None => {
                let signature = if c.target.is_some() {
                    format!("{}.({})", args[0], join_types(&args[1..]))
                } else {
                    format!("({})", join_types(&args))
                };
                self.report(
                    id,
                    format!("found no matching overload for '{name}' applied to '{signature}'"),
                );
                Ty::Unknown
            }
        }
    }
}

impl Checker {
    /// cel-go's AST validators of the base environment: literal arguments of
    /// `duration()`, `timestamp()` and `<string>.matches()` must be valid.
    fn validate_literal_arguments(&mut self, name: &str, c: &kube_cel::cel::common::ast::CallExpr) {
        let [arg] = c.args.as_slice() else {
            return;
        };
        let Expr::Literal(LiteralValue::String(text)) = &arg.expr else {
            return;
        };
        let text = text.inner();
        let invalid = match (name, c.target.is_some()) {
            ("duration", false) => !valid_duration_literal(text),
            ("timestamp", false) => !valid_timestamp_literal(text),
            ("matches", true) => regex::Regex::new(text).is_err(),
            _ => false,
        };
        if invalid {
            self.report(arg.id, format!("invalid {name} argument"));
        }
    }
}

fn same_result(p: P, t: &Ty) -> bool {
    matches!(p, P::T(r) if r == t)
}

/// Exact type equality as the homogeneous literal validator applies it (`dyn` and a
/// concrete type differ; an unbound element type matches anything).
fn same_type(a: &Ty, b: &Ty) -> bool {
    match (a, b) {
        (Ty::Free, _) | (_, Ty::Free) => true,
        (Ty::List(x), Ty::List(y)) => same_type(x, y),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => same_type(k1, k2) && same_type(v1, v2),
        _ => a == b,
    }
}

fn join_types(types: &[Ty]) -> String {
    types
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Character offsets of expression ids, recovered from a second parse (the `cel` crate
/// only hands out its source info together with errors; a trailing `#` is a lexer
/// error that leaves the token stream, and so the ids, unchanged).
pub(crate) fn offsets(parsed_text: &str) -> HashMap<u64, usize> {
    use kube_cel::cel::parser::Parser;
    let probe = format!("{parsed_text}\n#");
    let mut out = HashMap::new();
    let Err(errors) = Parser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth(crate::cost::MAX_AST_DEPTH as u16)
        .parse(&probe)
    else {
        return out;
    };
    let Some(info) = errors.errors.iter().find_map(|e| e.source_info.clone()) else {
        return out;
    };
    let info: &SourceInfo = &info;
    // Ids are dense from 1; stop at the first gap after a long run of misses.
    let mut misses = 0;
    let mut id = 1u64;
    while misses < 64 {
        match info.offset_for(id) {
            Some((start, _)) => {
                misses = 0;
                out.insert(id, start as usize);
            }
            None => misses += 1,
        }
        id += 1;
    }
    out
}

/// Whether `text` is a duration Go's `time.ParseDuration` accepts (cel-go's duration
/// literal validator): `[-+]?` then `0`, or one or more `<number><unit>` with units
/// ns, us, µs, μs, ms, s, m, h.
pub(crate) fn valid_duration_literal(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    if s == "0" {
        return true;
    }
    if s.is_empty() {
        return false;
    }
    let mut rest = s;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits_end];
        if number.is_empty() || !number.chars().any(|c| c.is_ascii_digit()) {
            return false;
        }
        if number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[digits_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return false,
        };
        rest = &rest[unit_end..];
        let value: f64 = number.parse().unwrap_or(0.0);
        total_nanos += value * scale;
    }
    // time.Duration is an int64 of nanoseconds.
    total_nanos <= i64::MAX as f64
}

/// Whether `text` parses with Go's `time.Parse(time.RFC3339, ...)` within CEL's
/// timestamp range (years 1 to 9999): cel-go's timestamp literal validator.
pub(crate) fn valid_timestamp_literal(text: &str) -> bool {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<u32> {
        let part = text.get(from..from + len)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) = (
        num(0, 4),
        num(5, 2),
        num(8, 2),
        num(11, 2),
        num(14, 2),
        num(17, 2),
    ) else {
        return false;
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if year == 0 || day == 0 || day > days_in_month || hour > 23 || minute > 59 || second > 59 {
        return false;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let end = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        if end == 0 {
            return false;
        }
        rest = &frac[end..];
    }
    match rest {
        "Z" => true,
        zone if zone.len() == 6 && (zone.starts_with('+') || zone.starts_with('-')) => {
            let zb = zone.as_bytes();
            zb[3] == b':'
                && matches!(num(text.len() - 5, 2), Some(h) if h < 24)
                && matches!(num(text.len() - 2, 2), Some(m) if m < 60)
        }
        _ => false,
    }
}

/// A constant the program planner folds.
#[derive(Debug, Clone)]
enum Const {
    Null,
    Bool,
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    List,
    Map,
}

impl Const {
    fn type_name(&self) -> &'static str {
        match self {
            Const::Null => "null_type",
            Const::Bool => "bool",
            Const::Int(_) => "int",
            Const::Uint(_) => "uint",
            Const::Double(_) => "double",
            Const::Str(_) => "string",
            Const::Bytes(_) => "bytes",
            Const::List => "list",
            Const::Map => "map",
        }
    }
}

/// The errors cel-go raises while planning a checked expression ("program instantiation
/// failed: ..."): conversions of constants that fail (`int("x")`, `bool(dyn(1))`),
/// constant null / list / map index keys, and invalid constant regular expressions.
/// Planning is depth first and stops at the first error.
pub(crate) fn planning_error(e: &IdedExpr) -> Option<PlanError> {
    fold(e).err()
}

/// Why cel-go's planner refuses an expression: the text after "program instantiation failed: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    /// A conversion function applied to a constant of a type it does not take.
    #[error("no such overload: {function}({arg})")]
    NoOverload {
        /// The conversion function.
        function: String,
        /// The constant's type.
        arg: &'static str,
    },
    /// A constant string that does not parse as the target type.
    #[error("type conversion error from '{from}' to '{to}'")]
    Conversion {
        /// The constant's type.
        from: &'static str,
        /// The target type.
        to: &'static str,
    },
    /// A constant out of `int` range.
    #[error("integer overflow")]
    IntegerOverflow,
    /// A constant out of `uint` range.
    #[error("unsigned integer overflow")]
    UnsignedOverflow,
    /// Constant bytes that are not UTF-8, converted to a string.
    #[error("invalid UTF-8 in bytes, cannot convert to string")]
    InvalidUtf8,
    /// A constant null, list or map used as an index key.
    #[error("invalid qualifier type: {0}")]
    InvalidQualifier(&'static str),
    /// A constant regular expression that does not compile (the regex crate's last line).
    #[error("error parsing regexp: {0}")]
    Regexp(String),
}

fn conversion_error(from: &'static str, to: &'static str) -> PlanError {
    PlanError::Conversion { from, to }
}

fn convert(function: &str, v: &Const) -> Result<Option<Const>, PlanError> {
    let no_overload = || {
        Err(PlanError::NoOverload {
            function: function.to_owned(),
            arg: v.type_name(),
        })
    };
    let converted: Result<Const, PlanError> = match (function, v) {
        ("dyn", _) => Ok(v.clone()),
        ("int", Const::Int(_)) => Ok(v.clone()),
        ("int", Const::Uint(u)) => i64::try_from(*u)
            .map(Const::Int)
            .map_err(|_| PlanError::IntegerOverflow),
        ("int", Const::Double(d)) => {
            if d.is_finite() && *d > i64::MIN as f64 && *d < i64::MAX as f64 {
                Ok(Const::Int(*d as i64))
            } else {
                Err(PlanError::IntegerOverflow)
            }
        }
        ("int", Const::Str(s)) => s
            .parse::<i64>()
            .map(Const::Int)
            .map_err(|_| conversion_error("string", "int")),
        ("uint", Const::Uint(_)) => Ok(v.clone()),
        ("uint", Const::Int(i)) => u64::try_from(*i)
            .map(Const::Uint)
            .map_err(|_| PlanError::UnsignedOverflow),
        ("uint", Const::Double(d)) => {
            if d.is_finite() && *d >= 0.0 && *d < u64::MAX as f64 {
                Ok(Const::Uint(*d as u64))
            } else {
                Err(PlanError::UnsignedOverflow)
            }
        }
        ("uint", Const::Str(s)) => s
            .strip_prefix('+')
            .unwrap_or(s)
            .parse::<u64>()
            .ok()
            .filter(|_| !s.starts_with('+'))
            .map(Const::Uint)
            .ok_or_else(|| conversion_error("string", "uint")),
        ("double", Const::Double(_)) => Ok(v.clone()),
        ("double", Const::Int(i)) => Ok(Const::Double(*i as f64)),
        ("double", Const::Uint(u)) => Ok(Const::Double(*u as f64)),
        ("double", Const::Str(s)) => s
            .parse::<f64>()
            .map(Const::Double)
            .map_err(|_| conversion_error("string", "double")),
        ("string", Const::Str(_)) => Ok(v.clone()),
        ("string", Const::Int(i)) => Ok(Const::Str(i.to_string())),
        ("string", Const::Uint(u)) => Ok(Const::Str(u.to_string())),
        // Valid, but we do not track the text: stop folding here.
        ("string", Const::Double(_) | Const::Bool) => return Ok(None),
        ("string", Const::Bytes(b)) => String::from_utf8(b.clone())
            .map(Const::Str)
            .map_err(|_| PlanError::InvalidUtf8),
        ("bool", Const::Bool) => Ok(Const::Bool),
        ("bool", Const::Str(s)) => {
            if matches!(
                s.as_str(),
                "1" | "t"
                    | "T"
                    | "TRUE"
                    | "true"
                    | "True"
                    | "0"
                    | "f"
                    | "F"
                    | "FALSE"
                    | "false"
                    | "False"
            ) {
                Ok(Const::Bool)
            } else {
                Err(conversion_error("string", "bool"))
            }
        }
        ("bytes", Const::Bytes(_)) => Ok(v.clone()),
        ("bytes", Const::Str(s)) => Ok(Const::Bytes(s.clone().into_bytes())),
        _ => no_overload(),
    };
    converted.map(Some)
}

/// Folds `e` like cel-go's planner: `Ok(Some)` for a constant, `Ok(None)` otherwise.
fn fold(e: &IdedExpr) -> Result<Option<Const>, PlanError> {
    match &e.expr {
        Expr::Literal(l) => Ok(Some(match l {
            LiteralValue::Boolean(_) => Const::Bool,
            LiteralValue::Bytes(b) => Const::Bytes(b.inner().to_vec()),
            LiteralValue::Double(d) => Const::Double(*d.inner()),
            LiteralValue::Int(i) => Const::Int(*i.inner()),
            LiteralValue::Null => Const::Null,
            LiteralValue::String(s) => Const::Str(s.inner().to_string()),
            LiteralValue::UInt(u) => Const::Uint(*u.inner()),
        })),
        Expr::List(l) => {
            let mut constant = l.optional_indices.is_empty();
            for x in &l.elements {
                constant &= fold(x)?.is_some();
            }
            Ok(constant.then_some(Const::List))
        }
        Expr::Map(m) => {
            let mut constant = true;
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    constant &= !me.optional;
                    constant &= fold(&me.key)?.is_some();
                    constant &= fold(&me.value)?.is_some();
                } else {
                    constant = false;
                }
            }
            Ok(constant.then_some(Const::Map))
        }
        Expr::Select(s) => {
            fold(&s.operand)?;
            Ok(None)
        }
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                fold(x)?;
            }
            Ok(None)
        }
        Expr::Call(c) => {
            let target = match &c.target {
                Some(t) => fold(t)?,
                None => None,
            };
            let mut args = Vec::with_capacity(c.args.len());
            for a in &c.args {
                args.push(fold(a)?);
            }
            let name = c.func_name.as_str();
            if c.target.is_none()
                && let [Some(arg)] = args.as_slice()
                && matches!(
                    name,
                    "int" | "uint" | "double" | "string" | "bool" | "bytes" | "dyn"
                )
            {
                return convert(name, arg);
            }
            if name == operators::INDEX && c.target.is_none() {
                let qualifier = match args.get(1) {
                    Some(Some(Const::Null)) => Some("types.Null"),
                    Some(Some(Const::List)) => Some("*types.baseList"),
                    Some(Some(Const::Map)) => Some("*types.baseMap"),
                    _ => None,
                };
                if let Some(q) = qualifier {
                    return Err(PlanError::InvalidQualifier(q));
                }
            }
            // Constant patterns are compiled when the program is planned (global
            // `matches`, and the Kubernetes regex library's `find` / `findAll`).
            let _ = target;
            let pattern = match (name, c.target.is_some(), args.as_slice()) {
                ("matches", false, [_, Some(Const::Str(p))])
                | ("matches" | "find" | "findAll", true, [Some(Const::Str(p)), ..]) => Some(p),
                _ => None,
            };
            if let Some(p) = pattern
                && let Err(err) = regex::Regex::new(p)
            {
                let detail = err
                    .to_string()
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                return Err(PlanError::Regexp(detail));
            }
            Ok(None)
        }
        Expr::Ident(_) | Expr::Struct(_) | Expr::Unspecified => Ok(None),
    }
}
