//! The CEL environment shared by all selectors of one compiler: the `cel` standard
//! library, the Kubernetes libraries from `kube-cel`, our additions (`functions.rs`), the
//! list of names a selector may call, and caches of parsed quantities and versions.
//!
//! Mirrors the StoredExpressions environment of `DRA/cel/compile.go` over
//! `apiserver/pkg/cel/environment/base.go` (spec §3.2).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube_cel::KubeCelExt;
use kube_cel::cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue};
use kube_cel::cel::{Context, ExecutionError, Value};

use crate::functions;

/// Functions of the `cel` crate's standard context.
const CEL_STDLIB: &[&str] = &[
    "contains",
    "size",
    "max",
    "min",
    "startsWith",
    "endsWith",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    "matches",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
    "value",
    "hasValue",
    "or",
    "orValue",
];

/// Functions registered by kube-cel with the features this crate enables (strings, lists,
/// sets, regex, urls, ip, semver, format, quantity, named formats, jsonpatch).
const KUBE_CEL: &[&str] = &[
    "add",
    "asApproximateFloat",
    "asInteger",
    "charAt",
    "cidr",
    "compareTo",
    "containsCIDR",
    "containsIP",
    "distinct",
    "family",
    "find",
    "findAll",
    "first",
    "flatten",
    "format",
    "format.byte",
    "format.date",
    "format.datetime",
    "format.dns1035Label",
    "format.dns1035LabelPrefix",
    "format.dns1123Label",
    "format.dns1123LabelPrefix",
    "format.dns1123Subdomain",
    "format.dns1123SubdomainPrefix",
    "format.labelValue",
    "format.named",
    "format.qualifiedName",
    "format.uri",
    "format.uuid",
    "getEscapedPath",
    "getHost",
    "getHostname",
    "getPort",
    "getQuery",
    "getScheme",
    "indexOf",
    "ip",
    "ip.isCanonical",
    "isCIDR",
    "isGlobalUnicast",
    "isGreaterThan",
    "isIP",
    "isInteger",
    "isLessThan",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isLoopback",
    "isQuantity",
    "isSemver",
    "isSorted",
    "isURL",
    "isUnspecified",
    "join",
    "jsonpatch.escapeKey",
    "last",
    "lastIndexOf",
    "lists.range",
    "lowerAscii",
    "major",
    "masked",
    "minor",
    "patch",
    "prefixLength",
    "quantity",
    "replace",
    "reverse",
    "semver",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "sign",
    "slice",
    "sort",
    "split",
    "strings.quote",
    "sub",
    "substring",
    "sum",
    "trim",
    "upperAscii",
    "url",
    "validate",
];

/// Functions added by `functions.rs` that selectors may call.
const DEVICELET: &[&str] = &["dyn", "bool"];

/// Upper bound of entries in each value cache; the cache is cleared when it is full
/// (quantities and versions of real slices repeat a lot, so this is rarely reached).
const VALUE_CACHE_CAPACITY: usize = 16 * 1024;

/// Why a value could not be built from a literal (a quantity, a version, a constant call).
/// The texts are the CEL library's and the semver crate's.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum LiteralError {
    /// The CEL function refused the literal.
    #[error(transparent)]
    Execution(ExecutionError),
    /// The CEL library panicked (caught, never propagated).
    #[error("{function}: internal error")]
    Panic {
        /// The function called.
        function: String,
    },
    /// Not a semantic version (strict parsing, as Go's `semver.Parse`); shared because
    /// failures are cached and `semver::Error` is not `Clone`.
    #[error("{0}")]
    Semver(Arc<semver::Error>),
}

pub(crate) struct Env {
    pub(crate) ctx: Context<'static>,
    known_functions: HashSet<&'static str>,
    /// DRAListTypeAttributes: attribute values are typed `dyn` instead of `any`.
    pub(crate) list_type_attributes: bool,
    quantities: RwLock<HashMap<String, Value>>,
    versions: RwLock<HashMap<String, Result<Value, LiteralError>>>,
}

impl Env {
    pub(crate) fn new(enable_list_type_attributes: bool) -> Arc<Self> {
        let mut ctx = Context::default();
        ctx.register_all();
        functions::register(&mut ctx, enable_list_type_attributes);
        let mut known_functions: HashSet<&'static str> = CEL_STDLIB
            .iter()
            .chain(KUBE_CEL)
            .chain(DEVICELET)
            .copied()
            .collect();
        // StoredExpressions (what the scheduler compiles in) adds every versioned
        // library whatever its feature gate, so `includes` always exists; only the
        // attribute type (`any` or `dyn`) depends on DRAListTypeAttributes.
        known_functions.insert("includes");
        Arc::new(Env {
            ctx,
            known_functions,
            list_type_attributes: enable_list_type_attributes,
            quantities: RwLock::new(HashMap::new()),
            versions: RwLock::new(HashMap::new()),
        })
    }

    pub(crate) fn is_known_function(&self, name: &str) -> bool {
        self.known_functions.contains(name)
    }

    /// Calls a registered one-argument function on a string literal (used for constant
    /// folding and to build quantity / semver values with kube-cel's own types).
    pub(crate) fn call_on_literal(
        &self,
        function: &str,
        args: Vec<IdedExpr>,
    ) -> Result<Value, LiteralError> {
        let call = IdedExpr {
            id: 0,
            expr: Expr::Call(CallExpr {
                func_name: function.to_string(),
                target: None,
                args,
            }),
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Value::resolve(&call, &self.ctx)
        }));
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(LiteralError::Execution(e)),
            Err(_) => Err(LiteralError::Panic {
                function: function.to_owned(),
            }),
        }
    }

    /// A capacity value as a kube-cel `kubernetes.Quantity`, cached by its text.
    pub(crate) fn quantity(&self, text: &str) -> Result<Value, LiteralError> {
        if let Ok(cache) = self.quantities.read()
            && let Some(v) = cache.get(text)
        {
            return Ok(v.clone());
        }
        let value = self.call_on_literal("quantity", vec![string_literal(text)])?;
        if let Ok(mut cache) = self.quantities.write() {
            if cache.len() >= VALUE_CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(text.to_string(), value.clone());
        }
        Ok(value)
    }

    /// Whether a version attribute parses (the check Go's conversion makes on every
    /// evaluation), answered from the cache without cloning the value.
    pub(crate) fn check_version(&self, text: &str) -> Result<(), LiteralError> {
        if let Ok(cache) = self.versions.read()
            && let Some(v) = cache.get(text)
        {
            return v.as_ref().map(|_| ()).map_err(Clone::clone);
        }
        self.version(text).map(|_| ())
    }

    /// A version attribute as a kube-cel `kubernetes.Semver` (strict parsing, as Go's
    /// `semver.Parse`), cached by its text, failures included. Build metadata is dropped
    /// from the value: blang/semver's comparisons (and so Kubernetes' `==`, `compareTo`,
    /// `isGreaterThan`) ignore it, while the Rust `semver` crate orders by it.
    pub(crate) fn version(&self, text: &str) -> Result<Value, LiteralError> {
        if let Ok(cache) = self.versions.read()
            && let Some(v) = cache.get(text)
        {
            return v.clone();
        }
        let parsed = match semver::Version::parse(text) {
            Ok(_) => {
                self.call_on_literal("semver", vec![string_literal(strip_build_metadata(text))])
            }
            Err(e) => Err(LiteralError::Semver(Arc::new(e))),
        };
        if let Ok(mut cache) = self.versions.write() {
            if cache.len() >= VALUE_CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(text.to_string(), parsed.clone());
        }
        parsed
    }
}

pub(crate) fn string_literal(text: &str) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Literal(LiteralValue::String(text.into())),
    }
}

/// `1.2.3+build` → `1.2.3`.
pub(crate) fn strip_build_metadata(text: &str) -> &str {
    text.split_once('+').map(|(v, _)| v).unwrap_or(text)
}
