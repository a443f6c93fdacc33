//! CEL functions that devicelet adds to the `cel` + `kube-cel` environment.
//!
//! * Internal hooks the compiler inserts into the AST (names start with `@dra.`, which the
//!   CEL grammar cannot spell, so user expressions cannot call them): cost metering
//!   (`@dra.tick`, `@dra.sized`, `@dra.add`), the iterable check of comprehensions
//!   (`@dra.iter`, with cel-go's "expected iterable type" wording) and the
//!   map-with-default lookup of `device.attributes[domain]` (`@dra.domain`,
//!   `newStringInterfaceMapWithDefault` in `DRA/cel/compile.go`).
//! * Semantics the `cel` crate gets wrong for Kubernetes: heterogeneous numeric equality
//!   (`1 == 1.0`, `1 == 1u`, also inside lists and maps; cel-go's default) through
//!   `@dra.eq` / `@dra.ne`, and `map.?field` on a missing key (optional.none, not an
//!   error) through `@dra.optselect`; `x.field` and `has(x.field)` on a value that is
//!   not a map is an error, not `false` (`@dra.select`, `@dra.has`); `&&` / `||` chains
//!   evaluated like cel-go's n-ary `evalAnd` / `evalOr` (`@dra.and`, `@dra.or`): stop at
//!   the first deciding value, else report the *first* error (the crate reports the last).
//! * Replacements for kube-cel functions whose output can be much larger than their
//!   input (`replace`, `lists.range`): same results, but the size is charged to the cost
//!   budget before anything is allocated. `replace` also follows cel-go for a negative
//!   count (replace all).
//! * `matches`, `find`, `findAll` with compiled patterns cached (the crates compile the
//!   pattern on every call; cel-go compiles literal patterns once per program).
//! * Functions Kubernetes has and the crates lack: `includes` (DRA list-type attributes,
//!   `DRA/cel/compile.go`), `dyn` and `bool` conversions.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use regex::Regex;

use kube_cel::cel::extractors::{Arguments, This};
use kube_cel::cel::objects::{Key, Map};
use kube_cel::cel::{Context, ExecutionError, FunctionContext, ResolveResult, Value};

use crate::cost::{self, COMPREHENSION_ITERATION_COST};

pub(crate) const TICK: &str = "@dra.tick";
pub(crate) const SIZED: &str = "@dra.sized";
pub(crate) const ADD: &str = "@dra.add";
pub(crate) const ITER: &str = "@dra.iter";
pub(crate) const DOMAIN: &str = "@dra.domain";
pub(crate) const EQ: &str = "@dra.eq";
pub(crate) const NE: &str = "@dra.ne";
pub(crate) const OPT_SELECT: &str = "@dra.optselect";
pub(crate) const SELECT: &str = "@dra.select";
pub(crate) const AND: &str = "@dra.and";
pub(crate) const OR: &str = "@dra.or";
pub(crate) const HAS: &str = "@dra.has";

/// Registers the internal hooks and our replacements into `ctx` (after kube-cel, so
/// that ours win for the names both define).
pub(crate) fn register(ctx: &mut Context<'_>, enable_list_type_attributes: bool) {
    ctx.add_function(TICK, tick);
    ctx.add_function(SIZED, sized);
    ctx.add_function(ADD, add);
    ctx.add_function(ITER, iter);
    ctx.add_function(DOMAIN, domain);
    ctx.add_function(EQ, |a: Value, b: Value| -> ResolveResult {
        Ok(Value::Bool(cel_equal(&a, &b)))
    });
    ctx.add_function(NE, |a: Value, b: Value| -> ResolveResult {
        Ok(Value::Bool(!cel_equal(&a, &b)))
    });
    ctx.add_function(OPT_SELECT, optional_select);
    ctx.add_function(SELECT, field_select);
    ctx.add_function(AND, |ftx: &FunctionContext| logical(ftx, false));
    ctx.add_function(OR, |ftx: &FunctionContext| logical(ftx, true));
    ctx.add_function(HAS, field_present);
    ctx.add_function("replace", replace);
    ctx.add_function("lists.range", lists_range);
    ctx.add_function("matches", regex_matches);
    ctx.add_function("find", regex_find);
    ctx.add_function("findAll", regex_find_all);
    ctx.add_function("dyn", |v: Value| -> ResolveResult { Ok(v) });
    ctx.add_function("bool", to_bool);
    // Declared whatever the feature gate says: the scheduler compiles selectors in the
    // StoredExpressions environment, which does not honour feature gates.
    let _ = enable_list_type_attributes;
    ctx.add_function("includes", includes);
}

fn first_arg(ftx: &FunctionContext) -> ResolveResult {
    let expr = ftx
        .args
        .first()
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
    Value::resolve(expr, ftx.ptx)
}

/// One comprehension iteration: charge, then evaluate the loop step. The second argument
/// is the compile-time weight of the loop body (its node count).
fn tick(ftx: &FunctionContext) -> ResolveResult {
    let weight = match ftx.args.get(1).map(|w| Value::resolve(w, ftx.ptx)) {
        Some(Ok(Value::Int(w))) => u64::try_from(w).unwrap_or(0),
        _ => 0,
    };
    cost::charge(COMPREHENSION_ITERATION_COST.saturating_add(weight))?;
    first_arg(ftx)
}

/// Evaluates its argument and charges the size of the value (see [`value_units`]).
fn sized(ftx: &FunctionContext) -> ResolveResult {
    let value = first_arg(ftx)?;
    let cap = cost::remaining()
        .min(cost::MAX_VALUE_UNITS)
        .saturating_add(1);
    cost::charge_value(value_units(&value, cap)?)?;
    Ok(value)
}

/// Size of a value counted as a tree: one unit per list element or map entry, plus the
/// units of strings and bytes. Stops counting once `cap` is reached (the caller only needs
/// to know whether the budget suffices), so the walk itself is bounded by the budget; the
/// deadline is checked along the way.
pub(crate) fn value_units(value: &Value, cap: u64) -> Result<u64, ExecutionError> {
    let mut total: u64 = 0;
    let mut pending: Vec<&Value> = vec![value];
    let mut visited: u32 = 0;
    while let Some(v) = pending.pop() {
        visited = visited.wrapping_add(1);
        if visited.is_multiple_of(4096) {
            cost::check_deadline()?;
        }
        total = total.saturating_add(match v {
            Value::String(s) => cost::string_units(s.len()),
            Value::Bytes(b) => cost::string_units(b.len()),
            Value::List(items) => {
                pending.extend(items.iter());
                items.len() as u64
            }
            Value::Map(m) => {
                for (k, val) in m.map.iter() {
                    if let Key::String(s) = k {
                        total = total.saturating_add(cost::string_units(s.len()));
                    }
                    pending.push(val);
                }
                m.map.len() as u64
            }
            _ => 0,
        });
        if total >= cap {
            return Ok(total);
        }
    }
    Ok(total)
}

/// `+` with the size of a string or list result charged first.
fn add(Arguments(args): Arguments) -> ResolveResult {
    let (lhs, rhs) = match args.as_slice() {
        [l, r] => (l.clone(), r.clone()),
        _ => return Err(ExecutionError::invalid_argument_count(2, args.len())),
    };
    match (&lhs, &rhs) {
        (Value::String(l), Value::String(r)) => {
            cost::charge_value(cost::string_units(l.len() + r.len()))?
        }
        (Value::Bytes(l), Value::Bytes(r)) => {
            cost::charge_value(cost::string_units(l.len() + r.len()))?
        }
        (Value::List(_), Value::List(_)) => {
            let cap = cost::remaining()
                .min(cost::MAX_VALUE_UNITS)
                .saturating_add(1);
            let units = value_units(&lhs, cap)?.saturating_add(value_units(&rhs, cap)?);
            cost::charge_value(units)?
        }
        _ => {}
    }
    lhs + rhs
}

/// cel-go's name of a value's type in "got 'T', expected iterable type".
fn cel_go_type_name(value: &Value) -> String {
    match value {
        Value::Int(_) => "types.Int".into(),
        Value::UInt(_) => "types.Uint".into(),
        Value::Float(_) => "types.Double".into(),
        Value::String(_) => "types.String".into(),
        Value::Bytes(_) => "types.Bytes".into(),
        Value::Bool(_) => "types.Bool".into(),
        Value::Null => "types.Null".into(),
        Value::Opaque(o) => match o.runtime_type_name() {
            "kubernetes.Semver" => "cel.Semver".into(),
            "kubernetes.Quantity" => "cel.Quantity".into(),
            other => other.to_string(),
        },
        other => format!("{}", other.type_of()),
    }
}

/// The range of a comprehension must be a list or a map.
fn iter(ftx: &FunctionContext) -> ResolveResult {
    let value = first_arg(ftx)?;
    match value {
        Value::List(_) | Value::Map(_) => Ok(value),
        other => Err(ExecutionError::function_error(
            "@dra.iter",
            format!("got '{}', expected iterable type", cel_go_type_name(&other)),
        )),
    }
}

/// `device.attributes[key]` with a computed key: the domain's map, or an empty map for an
/// unknown domain (`newStringInterfaceMapWithDefault`).
fn domain(Arguments(args): Arguments) -> ResolveResult {
    match args.as_slice() {
        [Value::Map(m), Value::String(key)] => Ok(m
            .map
            .get(&Key::String(key.clone()))
            .cloned()
            .unwrap_or_else(empty_map)),
        [Value::Map(_), _] => Err(ExecutionError::NoSuchOverload),
        _ => Err(ExecutionError::invalid_argument_count(2, args.len())),
    }
}

pub(crate) fn empty_map() -> Value {
    Value::Map(Map {
        map: Arc::new(HashMap::new()),
    })
}

/// `<string>.replace(from, to[, n])`: output size checked before allocating.
fn replace(
    ftx: &FunctionContext,
    This(this): This<Arc<String>>,
    Arguments(args): Arguments,
) -> ResolveResult {
    // Called as a function, `This` consumed the first argument, which `Arguments` repeats.
    let rest: &[Value] = if ftx.this.is_none() {
        args.get(1..).unwrap_or(&[])
    } else {
        &args
    };
    let (from, to, limit) = match rest {
        [Value::String(f), Value::String(t)] => (f.clone(), t.clone(), None),
        [Value::String(f), Value::String(t), Value::Int(n)] => (f.clone(), t.clone(), Some(*n)),
        _ => return Err(ExecutionError::NoSuchOverload),
    };
    let occurrences = if from.is_empty() {
        this.chars().count() + 1
    } else {
        this.matches(from.as_str()).count()
    };
    let replaced = match limit {
        Some(n) if n >= 0 => occurrences.min(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => occurrences,
    };
    let out_len = this
        .len()
        .saturating_sub(replaced.saturating_mul(from.len()))
        .saturating_add(replaced.saturating_mul(to.len()));
    cost::charge_value(cost::string_units(out_len))?;
    Ok(Value::String(Arc::new(this.replacen(
        from.as_str(),
        to.as_str(),
        replaced,
    ))))
}

/// `lists.range(n)`: the list size is charged before it is built.
fn lists_range(n: i64) -> ResolveResult {
    if n < 0 {
        return Err(ExecutionError::function_error(
            "lists.range",
            "range argument must be non-negative",
        ));
    }
    cost::charge_value(n as u64)?;
    Ok(Value::List(Arc::new((0..n).map(Value::Int).collect())))
}

/// `<attribute>.includes(value)` (DRA list-type attributes): membership for lists of at
/// most 48 values, equality for scalars.
fn includes(This(this): This<Value>, Arguments(args): Arguments) -> ResolveResult {
    let needle = match args.last() {
        Some(v) => v,
        None => return Err(ExecutionError::invalid_argument_count(1, 0)),
    };
    match &this {
        Value::List(items) => {
            if items.len() > crate::MAX_INCLUDES_LIST_LENGTH {
                return Err(ExecutionError::function_error(
                    "includes",
                    format!(
                        "'includes' function cannot be applied to lists longer than {} values",
                        crate::MAX_INCLUDES_LIST_LENGTH
                    ),
                ));
            }
            Ok(Value::Bool(items.iter().any(|item| item == needle)))
        }
        scalar => Ok(Value::Bool(scalar == needle)),
    }
}

/// `bool(x)`: cel-go's bool conversion (from bool, or from the strings it accepts).
fn to_bool(v: Value) -> ResolveResult {
    match &v {
        Value::Bool(_) => Ok(v),
        Value::String(s) => match s.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Value::Bool(true)),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Value::Bool(false)),
            _ => Err(ExecutionError::function_error(
                "bool",
                format!("type conversion error from 'string' to 'bool': {s}"),
            )),
        },
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

/// Compiled regular expressions by pattern text (bounded: cleared when full).
static REGEX_CACHE: LazyLock<RwLock<HashMap<String, Arc<Regex>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));
const REGEX_CACHE_CAPACITY: usize = 1024;

fn cached_regex(function: &str, pattern: &str) -> Result<Arc<Regex>, ExecutionError> {
    if let Ok(cache) = REGEX_CACHE.read()
        && let Some(re) = cache.get(pattern)
    {
        return Ok(re.clone());
    }
    let re = Arc::new(Regex::new(pattern).map_err(|e| {
        ExecutionError::function_error(function, format!("'{pattern}' not a valid regex: {e}"))
    })?);
    if let Ok(mut cache) = REGEX_CACHE.write() {
        if cache.len() >= REGEX_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(pattern.to_string(), re.clone());
    }
    Ok(re)
}

/// `<string>.matches(re)`: RE2-style search anywhere in the string.
fn regex_matches(This(this): This<Arc<String>>, pattern: Arc<String>) -> ResolveResult {
    Ok(Value::Bool(
        cached_regex("matches", &pattern)?.is_match(&this),
    ))
}

/// `<string>.find(re)`: the first match, or "".
fn regex_find(This(this): This<Arc<String>>, pattern: Arc<String>) -> ResolveResult {
    let re = cached_regex("find", &pattern)?;
    let found = re
        .find(&this)
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    Ok(Value::String(Arc::new(found)))
}

/// `<string>.findAll(re[, n])`: all matches, or the first `n` (`n < 0`: all).
fn regex_find_all(
    ftx: &FunctionContext,
    This(this): This<Arc<String>>,
    Arguments(args): Arguments,
) -> ResolveResult {
    let rest: &[Value] = if ftx.this.is_none() {
        args.get(1..).unwrap_or(&[])
    } else {
        &args
    };
    let (pattern, limit) = match rest {
        [Value::String(p)] => (p.clone(), None),
        [Value::String(p), Value::Int(n)] => (p.clone(), usize::try_from(*n).ok()),
        _ => return Err(ExecutionError::NoSuchOverload),
    };
    let re = cached_regex("findAll", &pattern)?;
    let found: Vec<Value> = re
        .find_iter(&this)
        .take(limit.unwrap_or(usize::MAX))
        .map(|m| Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    Ok(Value::List(Arc::new(found)))
}

/// CEL equality with cel-go's heterogeneous numeric comparison.
pub(crate) fn cel_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::UInt(y)) | (Value::UInt(y), Value::Int(x)) => {
            u64::try_from(*x).is_ok_and(|x| x == *y)
        }
        (Value::Int(x), Value::Float(y)) | (Value::Float(y), Value::Int(x)) => (*x as f64) == *y,
        (Value::UInt(x), Value::Float(y)) | (Value::Float(y), Value::UInt(x)) => (*x as f64) == *y,
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| cel_equal(p, q))
        }
        (Value::Map(x), Value::Map(y)) => {
            x.map.len() == y.map.len()
                && x.map
                    .iter()
                    .all(|(k, v)| y.map.get(k).is_some_and(|w| cel_equal(v, w)))
        }
        _ => a == b,
    }
}

/// `operand.?field`: optional.none when the operand is none or lacks the key.
fn optional_select(operand: Value, field: Value) -> ResolveResult {
    use kube_cel::cel::objects::OptionalValue;
    let Value::String(field) = field else {
        return Err(ExecutionError::NoSuchOverload);
    };
    let inner = match &operand {
        Value::Opaque(o) => match o.downcast_ref::<OptionalValue>() {
            Some(opt) => match opt.value() {
                Some(v) => v.clone(),
                None => return Ok(Value::Opaque(Arc::new(OptionalValue::none()))),
            },
            None => return Err(ExecutionError::NoSuchOverload),
        },
        other => other.clone(),
    };
    match inner {
        Value::Map(m) => Ok(Value::Opaque(Arc::new(
            match m.map.get(&Key::String(field)) {
                Some(v) => OptionalValue::of(v.clone()),
                None => OptionalValue::none(),
            },
        ))),
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

/// `operand.field` on a computed value: the map entry, "no such key", or "no such overload"
/// when the operand is not a map (the `cel` crate would silently give `false`).
fn field_select(operand: Value, field: Value) -> ResolveResult {
    match (operand, field) {
        (Value::Map(m), Value::String(f)) => m
            .map
            .get(&Key::String(f.clone()))
            .cloned()
            .ok_or(ExecutionError::NoSuchKey(f)),
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

/// `has(operand.field)` on a computed value.
fn field_present(operand: Value, field: Value) -> ResolveResult {
    match (operand, field) {
        (Value::Map(m), Value::String(f)) => Ok(Value::Bool(m.map.contains_key(&Key::String(f)))),
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

/// cel-go's n-ary `&&` (`decisive = false`) or `||` (`decisive = true`): terms are evaluated
/// in order until one is the decisive value; otherwise the first error (a non-bool term
/// counts as "no such overload") or the neutral value.
fn logical(ftx: &FunctionContext, decisive: bool) -> ResolveResult {
    let mut first_error: Option<ExecutionError> = None;
    for term in ftx.args {
        match Value::resolve(term, ftx.ptx) {
            Ok(Value::Bool(b)) if b == decisive => return Ok(Value::Bool(decisive)),
            Ok(Value::Bool(_)) => {}
            Ok(_) => {
                first_error.get_or_insert(ExecutionError::NoSuchOverload);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Value::Bool(!decisive)),
    }
}
