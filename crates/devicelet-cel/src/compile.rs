//! Compilation of a selector: length and depth limits, parsing with the `cel` crate,
//! a static check in the spirit of cel-go's type checker, and an AST rewrite.
//!
//! Follows `CompileCELExpression` in `DRA/cel/compile.go`. The `cel` crate parses but does
//! not type-check, so undeclared references, unknown `device` fields and calls of unknown
//! functions would only fail at run time; Go reports them at compile time, and so do we
//! (with cel-go's issue format). The rewrite:
//! * `device.driver`, `device.attributes[D].id` / `["id"]`, `has(...)` of those,
//!   `device.capacity[D].id`, `device.allowMultipleAllocations` → reserved identifiers
//!   answered lazily by `DeviceResolver` (no per-device maps);
//! * `device.attributes[expr]` with a computed key → map-with-default lookup;
//! * `cel.bind(v, init, body)` → a comprehension over an empty list (how cel-go's
//!   `ext.Bindings` expands it), which the interpreter already supports;
//! * comprehensions, list/map literals and `+` → metered (see `cost.rs`);
//! * calls of `quantity`, `semver`, `ip`, `cidr`, `url` on literals and literal
//!   lists/maps → constants computed once.

use std::sync::Arc;

use kube_cel::cel::Value;
use kube_cel::cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapEntryExpr,
    MapExpr, SelectExpr, operators,
};
use kube_cel::cel::parser::{ParseErrors, Parser};

use crate::check::{Checker, Ty};
use crate::cost::{MAX_AST_DEPTH, MAX_EXPRESSION_LENGTH};
use crate::env::Env;
use crate::error::CelCompileError;
use crate::fastpath::Fast;
use crate::functions;
use crate::program::{Program, RESERVED_PREFIX, Slot};

/// Stack size of the threads that compile, and that evaluate unusually deep expressions:
/// the ANTLR-generated parser recurses per nesting level before our depth check can run,
/// and the tree-walking interpreter recurses per level of the expression.
pub(crate) const BIG_STACK_SIZE: usize = 64 * 1024 * 1024;

/// Expressions up to this depth are evaluated on the caller's thread; deeper ones (rare:
/// real selectors are far shallower) on a thread with [`BIG_STACK_SIZE`], so that an
/// allocator running on a 2 MiB worker stack cannot overflow it.
pub(crate) const INLINE_EVAL_DEPTH: usize = 16;

/// A compiled selector: the rewritten program and, when the whole expression has one of the
/// common shapes, its native evaluator (`fastpath.rs`).
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) program: Program,
    pub(crate) fast: Option<Fast>,
}

/// Compiles `source` for `env`. Parsing, checking and rewriting all recurse over the
/// expression, so they run on a thread with a large stack; panics of the `cel` crate are
/// caught there and reported as errors.
pub(crate) fn compile(
    source: &str,
    env: &Arc<Env>,
    consumable_capacity: bool,
) -> Result<Compiled, CelCompileError> {
    if source.len() > MAX_EXPRESSION_LENGTH {
        return Err(CelCompileError::TooLong {
            length: source.len(),
            limit: MAX_EXPRESSION_LENGTH,
        });
    }
    let text = source.to_string();
    let env = env.clone();
    let handle = std::thread::Builder::new()
        .name("devicelet-cel-compile".into())
        .stack_size(BIG_STACK_SIZE)
        .spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                compile_on_big_stack(&text, &env, consumable_capacity)
            }))
            .unwrap_or_else(|panic| Err(CelCompileError::Internal(panic_message(&panic))))
        })
        .map_err(|e| CelCompileError::Internal(format!("cannot start compiler thread: {e}")))?;
    handle
        .join()
        .map_err(|panic| CelCompileError::Internal(panic_message(&panic)))?
}

fn compile_on_big_stack(
    source: &str,
    env: &Env,
    consumable_capacity: bool,
) -> Result<Compiled, CelCompileError> {
    // The cel 0.13 parser expands `x.existsOne(v, p)` like `exists_one`; cel-go v0.26
    // has no such macro, so Go reports an undeclared function at the `(`.
    let at = find_identifier(source, "existsOne");
    if source[at..].starts_with("existsOne")
        && source[..at].trim_end().ends_with('.')
        && source[at + "existsOne".len()..]
            .trim_start()
            .starts_with('(')
    {
        let open = source[at..].find('(').map_or(at, |i| at + i);
        return Err(CelCompileError::Compilation(issue(
            source,
            open,
            "undeclared reference to 'existsOne' (in container '')",
        )));
    }
    let folded = fold_unary_runs(source);
    let parsed = match Parser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth(MAX_AST_DEPTH as u16)
        .parse(&folded)
    {
        Ok(expr) => expr,
        Err(errors) => {
            return Err(CelCompileError::Compilation(format_parse_errors(
                &errors, source,
            )));
        }
    };
    if ast_depth(&parsed) > MAX_AST_DEPTH {
        return Err(CelCompileError::TooDeep {
            limit: MAX_AST_DEPTH,
        });
    }
    let mut rewriter = Rewriter {
        env,
        source,
        scope: Vec::new(),
        domain_bindings: Vec::new(),
        program: Program {
            expr: IdedExpr::default(),
            depth: 0,
            attribute_slots: Vec::new(),
            capacity_slots: Vec::new(),
            attribute_domains: Vec::new(),
            capacity_domains: Vec::new(),
            constants: Vec::new(),
            quantity_literals: Vec::new(),
            semver_literals: Vec::new(),
        },
    };
    let list_type_attributes = env.list_type_attributes;
    // DRAConsumableCapacity does not change what compiles in the StoredExpressions
    // environment (`device.allowMultipleAllocations` is always declared).
    let _ = consumable_capacity;
    let checked = Checker::check(&parsed, list_type_attributes);
    let planning_error = crate::check::planning_error(&parsed);
    // Undeclared references and unknown fields (found by the rewriter) take precedence.
    let expr = rewriter.rewrite(parsed)?;
    if !checked.issues.is_empty() {
        return Err(CelCompileError::Compilation(format_check_issues(
            &checked.issues,
            &folded,
            source,
        )));
    }
    // Kubernetes accepts bool, `any` (an attribute value) and, with list-type
    // attributes, `dyn`; types we do not model are given the benefit of the doubt.
    let result_ok = match &checked.ty {
        Ty::Bool | Ty::Any | Ty::Unknown | Ty::Free => true,
        Ty::Dyn => list_type_attributes,
        _ => false,
    };
    if !result_ok {
        return Err(CelCompileError::ResultType(checked.ty.result_name()));
    }
    if let Some(error) = planning_error {
        return Err(CelCompileError::ProgramInstantiation(error.to_string()));
    }
    let mut program = rewriter.program;
    program.depth = ast_depth(&expr);
    // Built here, on the big stack: it recurses over the expression like the rewrite.
    let fast = Fast::build(&expr, &program);
    program.expr = expr;
    Ok(Compiled { program, fast })
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Upstream bug (cel 0.13 parser, `visit_LogicalNot` / `visit_Negate`): a run of an even
/// number of `!` or unary `-` is evaluated as a single negation (`!!true` is false). cel-go
/// drops even runs. We blank out the even part of every run before parsing; the text keeps
/// its length, so error positions stay right.
pub(crate) fn fold_unary_runs(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = bytes.to_vec();
    // Whether the previous significant token ends an operand (so a `-` is binary).
    let mut after_operand = false;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(end) = string_literal_end(bytes, i) {
            i = end;
            after_operand = true;
            continue;
        }
        if c == b'!' || c == b'-' {
            // Collect the run of the same operator, allowing whitespace in between.
            let mut positions = Vec::new();
            let mut j = i;
            while j < bytes.len() {
                if bytes[j] == c {
                    positions.push(j);
                    j += 1;
                } else if bytes[j].is_ascii_whitespace() {
                    j += 1;
                } else {
                    break;
                }
            }
            if c == b'!' && bytes.get(j) == Some(&b'=') {
                // The last `!` belongs to `!=`.
                positions.pop();
            }
            if c == b'-' && after_operand && !positions.is_empty() {
                // The first `-` is the binary minus.
                positions.remove(0);
            }
            let even = positions.len() - positions.len() % 2;
            for &p in positions.iter().take(even) {
                out[p] = b' ';
            }
            i = j;
            after_operand = false;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        after_operand = c.is_ascii_alphanumeric()
            || c == b'_'
            || c == b')'
            || c == b']'
            || c == b'}'
            || c == b'.';
        i += 1;
    }
    // Only ASCII bytes were replaced by ASCII spaces, so this stays valid UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| source.to_string())
}

/// If a string or bytes literal starts at `i` (with optional `r`/`b` prefixes), the index
/// just past its end.
fn string_literal_end(bytes: &[u8], i: usize) -> Option<usize> {
    let mut k = i;
    let mut raw = false;
    // A prefix only counts when it does not continue an identifier.
    if i > 0
        && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')
        && bytes[i] != b'"'
        && bytes[i] != b'\''
    {
        return None;
    }
    while k < bytes.len() && k < i + 2 && matches!(bytes[k], b'r' | b'R' | b'b' | b'B') {
        raw |= matches!(bytes[k], b'r' | b'R');
        k += 1;
    }
    let quote = *bytes.get(k)?;
    if quote != b'"' && quote != b'\'' {
        return None;
    }
    let triple = bytes
        .get(k..k + 3)
        .is_some_and(|s| s.iter().all(|b| *b == quote));
    let quote_len = if triple { 3 } else { 1 };
    let mut j = k + quote_len;
    while j < bytes.len() {
        if bytes[j] == b'\\' && !raw {
            j += 2;
            continue;
        }
        if bytes[j] == quote
            && (!triple
                || bytes
                    .get(j..j + 3)
                    .is_some_and(|s| s.iter().all(|b| *b == quote)))
        {
            return Some(j + quote_len);
        }
        j += 1;
    }
    Some(bytes.len())
}

/// Depth of an expression tree, computed without recursion.
fn ast_depth(root: &IdedExpr) -> usize {
    let mut max = 0;
    let mut pending: Vec<(&IdedExpr, usize)> = vec![(root, 1)];
    while let Some((e, depth)) = pending.pop() {
        max = max.max(depth);
        if depth > MAX_AST_DEPTH {
            return depth;
        }
        let next = depth + 1;
        match &e.expr {
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    pending.push((t, next));
                }
                pending.extend(c.args.iter().map(|a| (a, next)));
            }
            Expr::Comprehension(c) => {
                for x in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    pending.push((x, next));
                }
            }
            Expr::List(l) => pending.extend(l.elements.iter().map(|a| (a, next))),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        pending.push((&me.key, next));
                        pending.push((&me.value, next));
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    match &entry.expr {
                        EntryExpr::StructField(f) => pending.push((&f.value, next)),
                        EntryExpr::MapEntry(me) => {
                            pending.push((&me.key, next));
                            pending.push((&me.value, next));
                        }
                    }
                }
            }
            Expr::Select(s) => pending.push((&s.operand, next)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    max
}

/// cel-go's issue format: `ERROR: <input>:L:C: msg` followed by the source line and a
/// caret (`C` is 1-based).
fn issue(source: &str, offset: usize, message: &str) -> String {
    let offset = offset.min(source.len());
    let before = &source[..offset];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let column = source[line_start..offset].chars().count() + 1;
    let line = source[line_start..].split('\n').next().unwrap_or("");
    format!(
        "ERROR: <input>:{line_no}:{column}: {message}\n | {line}\n | {}^",
        ".".repeat(column - 1)
    )
}

/// cel-go's rendering of checker issues: one `ERROR:` block per issue, ordered by
/// position.
fn format_check_issues(issues: &[(u64, String)], parsed_text: &str, source: &str) -> String {
    let offsets = crate::check::offsets(parsed_text);
    let mut located: Vec<(usize, &str)> = issues
        .iter()
        .map(|(id, message)| {
            let chars = offsets.get(id).copied().unwrap_or(0);
            let byte = source
                .char_indices()
                .nth(chars)
                .map(|(i, _)| i)
                .unwrap_or(source.len());
            (byte, message.as_str())
        })
        .collect();
    located.sort_by_key(|(at, _)| *at);
    located.dedup();
    located
        .iter()
        .map(|(at, message)| issue(source, *at, message))
        .collect::<Vec<_>>()
        .join("\n")
}

fn format_parse_errors(errors: &ParseErrors, source: &str) -> String {
    let mut out = Vec::new();
    for e in &errors.errors {
        // The cel crate reports (line, column) with a 0-based column.
        let (line, col) = (e.pos.0.max(1) as usize, e.pos.1.max(0) as usize);
        let line_start: usize = source.split('\n').take(line - 1).map(|l| l.len() + 1).sum();
        let offset = source[line_start.min(source.len())..]
            .char_indices()
            .nth(col)
            .map(|(i, _)| line_start + i)
            .unwrap_or(source.len());
        let mut msg = e.msg.clone();
        if msg.contains("Recursion limit") {
            // The parser's nesting guard: one clear message instead of its debug output.
            out.push(issue(
                source,
                0,
                &format!("expression recursion limit exceeded: {MAX_AST_DEPTH}"),
            ));
            break;
        }
        if !msg.starts_with("Syntax error") && e.source.is_none() && is_antlr_message(&msg) {
            msg = format!("Syntax error: {msg}");
        }
        out.push(issue(source, offset, &msg));
    }
    out.join("\n")
}

fn is_antlr_message(msg: &str) -> bool {
    [
        "mismatched input",
        "extraneous input",
        "no viable alternative",
        "token recognition",
        "missing ",
    ]
    .iter()
    .any(|p| msg.starts_with(p))
}

/// Byte offset of the first occurrence of `name` as an identifier token outside string
/// literals (positions are not kept by the `cel` crate's AST).
fn find_identifier(source: &str, name: &str) -> usize {
    let bytes = source.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'"' || c == b'\'' {
            let triple = bytes
                .get(i..i + 3)
                .is_some_and(|s| s.iter().all(|b| *b == c));
            let quote_len = if triple { 3 } else { 1 };
            i += quote_len;
            while i < bytes.len() {
                if bytes[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if bytes[i] == c
                    && (!triple
                        || bytes
                            .get(i..i + 3)
                            .is_some_and(|s| s.iter().all(|b| *b == c)))
                {
                    i += quote_len;
                    break;
                }
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            if &source[start..i] == name {
                return start;
            }
            continue;
        }
        i += 1;
    }
    0
}

fn ident(name: impl Into<String>) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Ident(name.into()),
    }
}

fn call(function: &str, args: Vec<IdedExpr>) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Call(CallExpr {
            func_name: function.to_string(),
            target: None,
            args,
        }),
    }
}

fn bool_literal(b: bool) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Literal(LiteralValue::Boolean(b.into())),
    }
}

/// A literal whose type can never take part in a cross-type numeric comparison.
fn is_non_numeric_literal(e: &IdedExpr) -> bool {
    matches!(
        &e.expr,
        Expr::Literal(
            LiteralValue::String(_)
                | LiteralValue::Boolean(_)
                | LiteralValue::Bytes(_)
                | LiteralValue::Null
        )
    )
}

fn int_literal(v: usize) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Literal(LiteralValue::Int(
            i64::try_from(v).unwrap_or(i64::MAX).into(),
        )),
    }
}

/// Number of nodes evaluated by one pass over `e`, not looking into nested comprehensions
/// (they meter their own iterations). Used as the per-iteration cost of a loop body,
/// in the spirit of cel-go's one unit per evaluated node.
fn node_count(root: &IdedExpr) -> usize {
    let mut count = 0;
    let mut pending = vec![root];
    while let Some(e) = pending.pop() {
        count += 1;
        match &e.expr {
            Expr::Call(c) => {
                pending.extend(c.target.as_deref());
                pending.extend(c.args.iter());
            }
            Expr::List(l) => pending.extend(l.elements.iter()),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        pending.push(&me.key);
                        pending.push(&me.value);
                    }
                }
            }
            Expr::Select(s) => pending.push(&s.operand),
            Expr::Comprehension(c) => {
                pending.push(&c.iter_range);
                pending.push(&c.accu_init);
            }
            _ => {}
        }
    }
    count
}

fn string_literal_of(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

fn is_operator(name: &str) -> bool {
    name.starts_with('_')
        || name.starts_with('@')
        || name == operators::LOGICAL_NOT
        || name == operators::NEGATE
}

/// Functions whose result on literal arguments is computed once at compile time.
const FOLDABLE: &[&str] = &[
    "quantity",
    "semver",
    "ip",
    "cidr",
    "url",
    "isSemver",
    "isQuantity",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum MapKind {
    Attributes,
    Capacity,
}

struct Rewriter<'a> {
    env: &'a Env,
    source: &'a str,
    scope: Vec<String>,
    /// `cel.bind` variables bound to `device.attributes[D]` / `device.capacity[D]`: the
    /// scope index of the variable, and what it stands for.
    domain_bindings: Vec<(usize, MapKind, String)>,
    program: Program,
}

impl Rewriter<'_> {
    fn in_scope(&self, name: &str) -> bool {
        self.scope.iter().any(|s| s == name)
    }

    fn is_device(&self, e: &IdedExpr) -> bool {
        matches!(&e.expr, Expr::Ident(n) if n == "device") && !self.in_scope("device")
    }

    /// `device.attributes` or `device.capacity`.
    fn device_map(&self, e: &IdedExpr) -> Option<MapKind> {
        match &e.expr {
            Expr::Select(s) if !s.test && self.is_device(&s.operand) => match s.field.as_str() {
                "attributes" => Some(MapKind::Attributes),
                "capacity" => Some(MapKind::Capacity),
                _ => None,
            },
            _ => None,
        }
    }

    /// `device.attributes["domain"]` / `device.attributes.domain` (and capacity).
    fn domain_of(&self, e: &IdedExpr) -> Option<(MapKind, String)> {
        match &e.expr {
            Expr::Call(c)
                if c.func_name == operators::INDEX && c.target.is_none() && c.args.len() == 2 =>
            {
                let kind = self.device_map(&c.args[0])?;
                Some((kind, string_literal_of(&c.args[1])?.to_string()))
            }
            Expr::Select(s) if !s.test => Some((self.device_map(&s.operand)?, s.field.clone())),
            Expr::Ident(name) => {
                let index = self.scope.iter().rposition(|v| v == name)?;
                self.domain_bindings
                    .iter()
                    .find(|(i, _, _)| *i == index)
                    .map(|(_, kind, domain)| (*kind, domain.clone()))
            }
            _ => None,
        }
    }

    fn undeclared(&self, name: &str) -> CelCompileError {
        let first = name.split('.').next().unwrap_or(name);
        CelCompileError::Compilation(issue(
            self.source,
            find_identifier(self.source, first),
            &format!("undeclared reference to '{name}' (in container '')"),
        ))
    }

    fn undefined_field(&self, field: &str) -> CelCompileError {
        let at = find_identifier(self.source, field);
        CelCompileError::Compilation(issue(
            self.source,
            at.saturating_sub(1),
            &format!("undefined field '{field}'"),
        ))
    }

    fn slot(&mut self, kind: MapKind, domain: String, id: String) -> IdedExpr {
        let qualified = format!("{domain}/{id}");
        let slot = Slot {
            domain,
            id,
            qualified,
        };
        let (slots, tag) = match kind {
            MapKind::Attributes => (&mut self.program.attribute_slots, 'A'),
            MapKind::Capacity => (&mut self.program.capacity_slots, 'C'),
        };
        let index = slots.iter().position(|s| *s == slot).unwrap_or_else(|| {
            slots.push(slot);
            slots.len() - 1
        });
        ident(format!("{RESERVED_PREFIX}{tag}{index}"))
    }

    fn has_slot(&mut self, kind: MapKind, domain: String, id: String) -> IdedExpr {
        let lookup = self.slot(kind, domain, id);
        let name = match &lookup.expr {
            Expr::Ident(n) => n.replacen(":A", ":H", 1).replacen(":C", ":J", 1),
            _ => String::new(),
        };
        ident(name)
    }

    fn domain_map(&mut self, kind: MapKind, domain: String) -> IdedExpr {
        let (domains, tag) = match kind {
            MapKind::Attributes => (&mut self.program.attribute_domains, 'P'),
            MapKind::Capacity => (&mut self.program.capacity_domains, 'Q'),
        };
        let index = domains
            .iter()
            .position(|d| *d == domain)
            .unwrap_or_else(|| {
                domains.push(domain);
                domains.len() - 1
            });
        ident(format!("{RESERVED_PREFIX}{tag}{index}"))
    }

    fn constant(&mut self, value: Value) -> IdedExpr {
        self.program.constants.push(value);
        ident(format!(
            "{RESERVED_PREFIX}K{}",
            self.program.constants.len() - 1
        ))
    }

    fn rewrite(&mut self, e: IdedExpr) -> Result<IdedExpr, CelCompileError> {
        let id = e.id;
        let expr = match e.expr {
            Expr::Literal(_) => return Ok(e),
            Expr::Ident(name) => {
                if self.in_scope(&name) {
                    Expr::Ident(name)
                } else if name == "device" {
                    return Ok(ident(format!("{RESERVED_PREFIX}V")));
                } else {
                    return Err(self.undeclared(&name));
                }
            }
            Expr::Select(s) => return self.rewrite_select(id, s),
            Expr::Call(c) => return self.rewrite_call(id, c),
            Expr::Comprehension(c) => {
                let c = *c;
                let iter_range = call(functions::ITER, vec![self.rewrite(c.iter_range)?]);
                let accu_init = self.rewrite(c.accu_init)?;
                let pushed = self.scope.len();
                self.scope.push(c.iter_var.clone());
                if let Some(v2) = &c.iter_var2 {
                    self.scope.push(v2.clone());
                }
                self.scope.push(c.accu_var.clone());
                let weight = node_count(&c.loop_cond) + node_count(&c.loop_step);
                let loop_cond = self.rewrite(c.loop_cond);
                let loop_step = self.rewrite(c.loop_step);
                let result = self.rewrite(c.result);
                self.scope.truncate(pushed);
                Expr::Comprehension(Box::new(ComprehensionExpr {
                    iter_range,
                    iter_var: c.iter_var,
                    iter_var2: c.iter_var2,
                    accu_var: c.accu_var,
                    accu_init,
                    loop_cond: loop_cond?,
                    loop_step: call(functions::TICK, vec![loop_step?, int_literal(weight)]),
                    result: call(functions::SIZED, vec![result?]),
                }))
            }
            Expr::List(l) => {
                let elements = l
                    .elements
                    .into_iter()
                    .map(|x| self.rewrite(x).map(meter_element))
                    .collect::<Result<Vec<_>, _>>()?;
                let list = IdedExpr {
                    id,
                    expr: Expr::List(ListExpr {
                        elements,
                        optional_indices: l.optional_indices,
                    }),
                };
                return Ok(self.fold_or_meter(list));
            }
            Expr::Map(m) => {
                let mut entries = Vec::with_capacity(m.entries.len());
                for entry in m.entries {
                    match entry.expr {
                        EntryExpr::MapEntry(me) => {
                            entries.push(kube_cel::cel::common::ast::IdedEntryExpr {
                                id: entry.id,
                                expr: EntryExpr::MapEntry(MapEntryExpr {
                                    key: self.rewrite(me.key)?,
                                    value: meter_element(self.rewrite(me.value)?),
                                    optional: me.optional,
                                }),
                            })
                        }
                        EntryExpr::StructField(f) => {
                            return Err(
                                self.unsupported(&format!("field initializer '{}'", f.field))
                            );
                        }
                    }
                }
                let map = IdedExpr {
                    id,
                    expr: Expr::Map(MapExpr { entries }),
                };
                return Ok(self.fold_or_meter(map));
            }
            Expr::Struct(s) => {
                return Err(
                    self.unsupported(&format!("message construction of type '{}'", s.type_name))
                );
            }
            Expr::Unspecified => return Err(self.unsupported("empty expression")),
        };
        Ok(IdedExpr { id, expr })
    }

    fn unsupported(&self, what: &str) -> CelCompileError {
        CelCompileError::Compilation(issue(self.source, 0, &format!("unsupported: {what}")))
    }

    /// Literal-only lists and maps become constants; others are metered.
    fn fold_or_meter(&mut self, e: IdedExpr) -> IdedExpr {
        if is_literal_tree(&e)
            && let Some(v) = self.evaluate_constant(&e)
        {
            return self.constant(v);
        }
        call(functions::SIZED, vec![e])
    }

    /// The value of a literal-only expression; `None` if evaluating it fails or panics, and the
    /// expression is then metered like any other instead of folded.
    fn evaluate_constant(&self, e: &IdedExpr) -> Option<Value> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Value::resolve(e, &self.env.ctx)
        }))
        .ok()?
        .ok()
    }

    fn rewrite_select(&mut self, id: u64, s: SelectExpr) -> Result<IdedExpr, CelCompileError> {
        if self.is_device(&s.operand) {
            let known = match s.field.as_str() {
                "driver" | "attributes" | "capacity" => true,
                // Declared in the StoredExpressions environment whatever the
                // DRAConsumableCapacity gate says (the gate only selects the variable's
                // type for new expressions); Go reads an unset value as false.
                "allowMultipleAllocations" => true,
                _ => false,
            };
            if !known {
                return Err(self.undefined_field(&s.field));
            }
            if s.test {
                return Ok(bool_literal(true));
            }
            let tag = match s.field.as_str() {
                "driver" => 'D',
                "attributes" => 'X',
                "capacity" => 'Y',
                _ => 'M',
            };
            return Ok(ident(format!("{RESERVED_PREFIX}{tag}")));
        }
        if let Some((kind, domain)) = self.domain_of(&s.operand) {
            return Ok(if s.test {
                self.has_slot(kind, domain, s.field)
            } else {
                self.slot(kind, domain, s.field)
            });
        }
        let operand = self.rewrite(*s.operand)?;
        let field = crate::env::string_literal(&s.field);
        let function = if s.test {
            functions::HAS
        } else {
            functions::SELECT
        };
        Ok(IdedExpr {
            id,
            expr: call(function, vec![operand, field]).expr,
        })
    }

    fn rewrite_call(&mut self, id: u64, c: CallExpr) -> Result<IdedExpr, CelCompileError> {
        if c.func_name == operators::OPT_INDEX
            && c.target.is_none()
            && c.args.len() == 2
            && let Some(kind) = self.device_map(&c.args[0])
        {
            // The domain map has a default, so `[?domain]` always has a value.
            let all = ident(format!(
                "{RESERVED_PREFIX}{}",
                if kind == MapKind::Attributes {
                    'X'
                } else {
                    'Y'
                }
            ));
            let mut args = c.args;
            let key = self.rewrite(args.remove(1))?;
            let domain = call(functions::DOMAIN, vec![all, key]);
            return Ok(IdedExpr {
                id,
                expr: Expr::Call(CallExpr {
                    func_name: "of".to_string(),
                    target: Some(Box::new(ident("optional"))),
                    args: vec![domain],
                }),
            });
        }
        if c.func_name == operators::INDEX && c.target.is_none() && c.args.len() == 2 {
            if let Some((kind, domain)) = self.domain_of(&c.args[0])
                && let Some(key) = string_literal_of(&c.args[1])
            {
                return Ok(self.slot(kind, domain, key.to_string()));
            }
            if let Some(kind) = self.device_map(&c.args[0]) {
                if let Some(domain) = string_literal_of(&c.args[1]) {
                    return Ok(self.domain_map(kind, domain.to_string()));
                }
                let all = ident(format!(
                    "{RESERVED_PREFIX}{}",
                    if kind == MapKind::Attributes {
                        'X'
                    } else {
                        'Y'
                    }
                ));
                let mut args = c.args;
                let key = self.rewrite(args.remove(1))?;
                return Ok(call(functions::DOMAIN, vec![all, key]));
            }
        }
        // cel.bind(name, init, body): cel-go's ext.Bindings macro.
        if c.func_name == "bind"
            && c.args.len() == 3
            && matches!(c.target.as_deref(), Some(IdedExpr { expr: Expr::Ident(t), .. }) if t == "cel" && !self.in_scope("cel"))
        {
            let mut args = c.args;
            let body = args.pop().unwrap_or_default();
            let init = args.pop().unwrap_or_default();
            let var = match args.pop().map(|a| a.expr) {
                Some(Expr::Ident(v)) => v,
                _ => {
                    return Err(CelCompileError::Compilation(issue(
                        self.source,
                        find_identifier(self.source, "bind"),
                        "cel.bind() variable names must be simple identifiers",
                    )));
                }
            };
            // `cel.bind(d, device.attributes["dom"], d.a && d.b)`, the use case Kubernetes
            // documents: lookups through `d` become direct slots, like the long form.
            let domain = self.domain_of(&init);
            let init = self.rewrite(init)?;
            self.scope.push(var.clone());
            if let Some((kind, name)) = &domain {
                self.domain_bindings
                    .push((self.scope.len() - 1, *kind, name.clone()));
            }
            let body = self.rewrite(body);
            self.domain_bindings
                .retain(|(i, _, _)| *i < self.scope.len() - 1);
            self.scope.pop();
            let body = body?;
            if domain.is_some() && !mentions_identifier(&body, &var) {
                // The map itself is never used: skip building it.
                return Ok(body);
            }
            return Ok(IdedExpr {
                id,
                expr: Expr::Comprehension(Box::new(ComprehensionExpr {
                    iter_range: IdedExpr {
                        id: 0,
                        expr: Expr::List(ListExpr::new(Vec::new())),
                    },
                    iter_var: "#unused".to_string(),
                    iter_var2: None,
                    accu_var: var.clone(),
                    accu_init: init,
                    loop_cond: bool_literal(false),
                    loop_step: ident(var),
                    result: body,
                })),
            });
        }
        if (c.func_name == operators::EQUALS || c.func_name == operators::NOT_EQUALS)
            && c.target.is_none()
            && c.args.len() == 2
            && !c.args.iter().any(is_non_numeric_literal)
        {
            // Possibly numbers of different types: use cel-go's heterogeneous equality.
            let function = if c.func_name == operators::EQUALS {
                functions::EQ
            } else {
                functions::NE
            };
            let args = c
                .args
                .into_iter()
                .map(|a| self.rewrite(a))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(call(function, args));
        }
        if (c.func_name == operators::LOGICAL_AND || c.func_name == operators::LOGICAL_OR)
            && c.target.is_none()
            && c.args.len() == 2
        {
            // Flatten the chain (`a && b && c`) into one n-ary call, as cel-go's planner does.
            let function = if c.func_name == operators::LOGICAL_AND {
                functions::AND
            } else {
                functions::OR
            };
            let mut terms = Vec::new();
            let mut pending = c.args;
            pending.reverse();
            while let Some(term) = pending.pop() {
                match term.expr {
                    Expr::Call(inner)
                        if inner.func_name == c.func_name
                            && inner.target.is_none()
                            && inner.args.len() == 2 =>
                    {
                        pending.extend(inner.args.into_iter().rev());
                    }
                    other => terms.push(self.rewrite(IdedExpr {
                        id: term.id,
                        expr: other,
                    })?),
                }
            }
            return Ok(call(function, terms));
        }
        if c.func_name == operators::OPT_SELECT && c.target.is_none() && c.args.len() == 2 {
            let args = c
                .args
                .into_iter()
                .map(|a| self.rewrite(a))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(call(functions::OPT_SELECT, args));
        }
        if c.func_name == operators::ADD && c.target.is_none() && c.args.len() == 2 {
            let args = c
                .args
                .into_iter()
                .map(|a| self.rewrite(a))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(call(functions::ADD, args));
        }

        // Namespaced functions (`sets.contains(...)`, `optional.of(...)`) are parsed as
        // method calls on an identifier.
        let mut target = c.target;
        if let Some(t) = &target
            && let Expr::Ident(prefix) = &t.expr
            && !self.in_scope(prefix)
            && prefix != "device"
        {
            let qualified = format!("{prefix}.{}", c.func_name);
            if !self.env.is_known_function(&qualified) {
                return Err(self.undeclared(&qualified));
            }
            let args = c
                .args
                .into_iter()
                .map(|a| self.rewrite(a))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(IdedExpr {
                id,
                expr: Expr::Call(CallExpr {
                    func_name: c.func_name,
                    target,
                    args,
                }),
            });
        }
        if !is_operator(&c.func_name) && !self.env.is_known_function(&c.func_name) {
            return Err(self.undeclared(&c.func_name));
        }
        if target.is_none()
            && FOLDABLE.contains(&c.func_name.as_str())
            && !c.args.is_empty()
            && c.args.iter().all(|a| matches!(a.expr, Expr::Literal(_)))
        {
            let mut args = c.args.clone();
            if c.func_name == "semver"
                && let Some(text) = args.first().and_then(string_literal_of)
            {
                // Go's semver comparisons ignore build metadata; so do our values.
                let stripped = crate::env::strip_build_metadata(text).to_string();
                args[0] = crate::env::string_literal(&stripped);
            }
            if let Ok(v) = self.env.call_on_literal(&c.func_name, args.clone()) {
                let constant = self.constant(v);
                let index = self.program.constants.len() - 1;
                if let [arg] = args.as_slice()
                    && let Some(text) = string_literal_of(arg)
                {
                    match c.func_name.as_str() {
                        "quantity" => self
                            .program
                            .quantity_literals
                            .push((index, text.to_string())),
                        "semver" => self.program.semver_literals.push((index, text.to_string())),
                        _ => {}
                    }
                }
                return Ok(constant);
            }
        }
        if let Some(t) = target.take() {
            target = Some(Box::new(self.rewrite(*t)?));
        }
        let args = c
            .args
            .into_iter()
            .map(|a| self.rewrite(a))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IdedExpr {
            id,
            expr: Expr::Call(CallExpr {
                func_name: c.func_name,
                target,
                args,
            }),
        })
    }
}

/// Wraps a non-constant element of a list or map literal in the size meter, so that a
/// literal repeating a large value fails after a few elements instead of copying all.
fn meter_element(e: IdedExpr) -> IdedExpr {
    if is_literal_tree(&e) {
        e
    } else {
        call(functions::SIZED, vec![e])
    }
}

/// Whether `name` occurs as an identifier anywhere in `root`.
fn mentions_identifier(root: &IdedExpr, name: &str) -> bool {
    let mut pending = vec![root];
    while let Some(e) = pending.pop() {
        match &e.expr {
            Expr::Ident(n) if n == name => return true,
            Expr::Call(c) => {
                pending.extend(c.target.as_deref());
                pending.extend(c.args.iter());
            }
            Expr::List(l) => pending.extend(l.elements.iter()),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        pending.push(&me.key);
                        pending.push(&me.value);
                    }
                }
            }
            Expr::Select(s) => pending.push(&s.operand),
            Expr::Comprehension(c) => {
                pending.extend([
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ]);
            }
            _ => {}
        }
    }
    false
}

fn is_literal_tree(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Literal(_) => true,
        Expr::Ident(n) => {
            n.starts_with(RESERVED_PREFIX) && n.as_bytes().get(RESERVED_PREFIX.len()) == Some(&b'K')
        }
        Expr::List(l) => l.optional_indices.is_empty() && l.elements.iter().all(is_literal_tree),
        Expr::Map(m) => m.entries.iter().all(|en| match &en.expr {
            EntryExpr::MapEntry(me) => {
                !me.optional && is_literal_tree(&me.key) && is_literal_tree(&me.value)
            }
            EntryExpr::StructField(_) => false,
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_runs_of_not_and_unary_minus_are_blanked_keeping_positions() {
        assert_eq!(fold_unary_runs("!!true"), "  true");
        assert_eq!(fold_unary_runs("!!!true"), "  !true");
        assert_eq!(fold_unary_runs("! ! x"), "    x");
        assert_eq!(fold_unary_runs("a != b"), "a != b");
        assert_eq!(fold_unary_runs("!!a != b"), "  a != b");
        assert_eq!(fold_unary_runs("--1 == 1"), "  1 == 1");
        assert_eq!(fold_unary_runs("2 - -1"), "2 - -1");
        assert_eq!(fold_unary_runs("2 - - -1"), "2 -    1");
        assert_eq!(fold_unary_runs("x.y-1"), "x.y-1");
        assert_eq!(fold_unary_runs("1e-5 > 0.0"), "1e-5 > 0.0");
        assert_eq!(
            fold_unary_runs(r#""!!" == '--' && r"\" != b'!!'"#),
            r#""!!" == '--' && r"\" != b'!!'"#
        );
        assert_eq!(
            fold_unary_runs(r#"'''!!''' == "a\"!!""#),
            r#"'''!!''' == "a\"!!""#
        );
    }

    #[test]
    fn issue_text_follows_cel_go() {
        assert_eq!(
            issue(
                "noSuchVar",
                0,
                "undeclared reference to 'noSuchVar' (in container '')"
            ),
            "ERROR: <input>:1:1: undeclared reference to 'noSuchVar' (in container '')\n | noSuchVar\n | ^"
        );
        assert_eq!(
            issue("a &&\n  b", 7, "m"),
            "ERROR: <input>:2:3: m\n |   b\n | ..^"
        );
    }
}
