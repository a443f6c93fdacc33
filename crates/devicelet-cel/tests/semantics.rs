//! Behaviour of the environment beyond the upstream table: the `device` variable's lookup
//! rules (spec §3.1), the Kubernetes libraries (§3.2), error-versus-false semantics,
//! attribute conversion errors (§7 item 40), and the compile cache (§3.4).

mod common;

use std::sync::Arc;

use common::*;
use devicelet_cel::{CelCompileError, CelEvalError, CelOptions, DeviceView, SelectorCompiler};

fn full_options() -> CelOptions {
    CelOptions {
        enable_consumable_capacity: true,
        enable_list_type_attributes: true,
        ..CelOptions::default()
    }
}

fn gpu() -> TestDevice {
    TestDevice::new("x")
        .attr("model", string("a100"))
        .attr("cores", int(8))
        .attr("v", version("1.2.3+build.7"))
        .attr("other.com/flag", boolean(true))
        .cap("memory", "1Gi")
}

fn eval(compiler: &SelectorCompiler, device: &TestDevice, expr: &str) -> Result<bool, String> {
    let s = compiler
        .compile(expr)
        .map_err(|e| format!("compile: {e}"))?;
    s.matches(&device.view()).map_err(|e| format!("eval: {e}"))
}

#[test]
fn device_variable_lookup_rules_match_kubernetes() {
    let c = SelectorCompiler::new(full_options());
    let d = gpu();
    for (expr, want) in [
        (r#"device.driver == "x""#, true),
        (r#"device.attributes["x"].model == "a100""#, true),
        (r#"device.attributes.x.model == "a100""#, true),
        (r#"device.attributes["x"]["model"] == "a100""#, true),
        (r#"device.attributes["other.com"].flag"#, true),
        // Unknown domain: an empty map, not an error.
        (r#"device.attributes["nope"].size() == 0"#, true),
        (r#"size(device.capacity["nope"]) == 0"#, true),
        (r#"!("model" in device.attributes["nope"])"#, true),
        (r#"device.attributes["no" + "pe"].size() == 0"#, true),
        (r#"device.attributes[device.driver].model == "a100""#, true),
        // `in` on the domain map sees real domains only.
        (r#""x" in device.attributes"#, true),
        (r#""nope" in device.attributes"#, false),
        (r#"size(device.attributes) == 2"#, true),
        (r#"device.attributes.exists(d, d == "other.com")"#, true),
        (
            r#"device.attributes.all(d, d == "x" || d == "other.com")"#,
            true,
        ),
        // has() guards a missing key.
        (r#"has(device.attributes["x"].model)"#, true),
        (r#"has(device.attributes["x"].nope)"#, false),
        (r#"has(device.attributes.x.model)"#, true),
        (
            r#"has(device.capacity["x"].memory) && !has(device.capacity["x"].gpu)"#,
            true,
        ),
        (r#"has(device.driver)"#, true),
        // Optional field selection.
        (
            r#"device.attributes["x"].?model.orValue("none") == "a100""#,
            true,
        ),
        (
            r#"device.attributes["x"].?nope.orValue("none") == "none""#,
            true,
        ),
        (r#"device.attributes["nope"].?a.?b.orValue(1) == 1"#, true),
        // Unset allowMultipleAllocations reads as false.
        ("device.allowMultipleAllocations == false", true),
        // A local variable named like the device variable shadows it.
        ("[1].all(device, device == 1)", true),
        // cel.bind, including nesting and shadowing.
        (
            r#"cel.bind(a, device.attributes["x"], a.model == "a100" && a.cores == 8)"#,
            true,
        ),
        ("cel.bind(x, 1, cel.bind(y, 2, x + y == 3))", true),
        ("cel.bind(x, 1, cel.bind(x, 2, x == 2))", true),
        // Quantities and versions.
        (
            r#"device.capacity["x"].memory.compareTo(quantity("1Gi")) == 0"#,
            true,
        ),
        (r#"device.capacity["x"].memory == quantity("1024Mi")"#, true),
        (
            r#"device.capacity["x"].memory.isGreaterThan(quantity("1023Mi"))"#,
            true,
        ),
        (
            r#"device.capacity["x"].memory.isLessThan(quantity("2Gi"))"#,
            true,
        ),
        (
            r#"device.capacity["x"].memory.asInteger() == 1073741824"#,
            true,
        ),
        // Build metadata is ignored by version comparisons (blang/semver).
        (r#"device.attributes["x"].v == semver("1.2.3")"#, true),
        (
            r#"device.attributes["x"].v.compareTo(semver("1.2.3+other")) == 0"#,
            true,
        ),
        (
            r#"device.attributes["x"].v.isGreaterThan(semver("1.2.2"))"#,
            true,
        ),
        (
            r#"device.attributes["x"].v.major() == 1 && device.attributes["x"].v.minor() == 2"#,
            true,
        ),
    ] {
        assert_eq!(eval(&c, &d, expr), Ok(want), "{expr}");
    }
}

#[test]
fn equality_across_numeric_types_is_a_compile_error_like_cel_go() {
    // CrossTypeNumericComparisons adds ordering overloads only: `==` needs one type.
    let c = SelectorCompiler::new(CelOptions::default());
    let d = gpu();
    assert_eq!(
        eval(&c, &d, "1 == 1.0"),
        Err("compile: compilation failed: ERROR: <input>:1:3: found no matching overload for '_==_' applied to '(int, double)'\n | 1 == 1.0\n | ..^".to_string())
    );
    assert_eq!(eval(&c, &d, "1 < 1.5"), Ok(true));
    assert_eq!(
        eval(&c, &d, r#"device.capacity["x"].memory"#),
        Err(
            "compile: must evaluate to bool or the unknown type, not kubernetes.Quantity"
                .to_string()
        )
    );
}

/// At run time (values typed `dyn`, e.g. attributes) numbers compare across types.
#[test]
fn numbers_compare_across_types_like_kubernetes() {
    let c = SelectorCompiler::new(CelOptions::default());
    let d = gpu();
    for (expr, want) in [
        ("dyn(1) == 1.0", true),
        ("dyn(1) == 1u", true),
        ("dyn(1) != 1.0", false),
        ("1 < 1.5", true),
        ("2u > 1", true),
        ("1.5 > 1", true),
        (r#"device.attributes["x"].cores == 8.0"#, true),
        (r#"device.attributes["x"].cores > 7.5"#, true),
        (r#"device.attributes["x"].cores in [8, 9]"#, true),
        ("[dyn(1), dyn(2)] == [dyn(1.0), dyn(2u)]", true),
        (r#"{"a": dyn(1)} == {"a": dyn(1.0)}"#, true),
        ("dyn(-1) == 18446744073709551615u", false),
    ] {
        assert_eq!(eval(&c, &d, expr), Ok(want), "{expr}");
    }
}

#[test]
fn kubernetes_libraries_are_available() {
    let c = SelectorCompiler::new(CelOptions::default());
    let d = gpu();
    for expr in [
        // strings (ext.Strings v2)
        r#"device.attributes["x"].model.startsWith("a1") && device.attributes["x"].model.endsWith("00")"#,
        r#"device.attributes["x"].model.upperAscii() == "A100" && "ABC".lowerAscii() == "abc""#,
        r#"device.attributes["x"].model.charAt(0) == "a" && "hello".indexOf("l") == 2 && "hello".lastIndexOf("l") == 3"#,
        r#""a,b".split(",").size() == 2 && ["a", "b"].join("-") == "a-b""#,
        r#""hello".substring(1, 3) == "el" && "  x ".trim() == "x" && "abc".replace("b", "x") == "axc""#,
        r#""a-a-a".replace("a", "b", 2) == "b-b-a" && "a-a".replace("a", "b", -1) == "b-b""#,
        r#"strings.quote("a") == "\"a\"" && "%s-%d".format(["a", 1]) == "a-1""#,
        r#""abc".contains("b") && size("abc") == 3"#,
        // regex
        r#"device.attributes["x"].model.matches("^a[0-9]+$") && "a100".find("[0-9]+") == "100""#,
        r#""a1b22".findAll("[0-9]+") == ["1", "22"] && "a1b22".findAll("[0-9]+", 1) == ["1"]"#,
        // lists (Kubernetes and ext.Lists)
        "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [1, 2, 3].max() == 3 && [1, 2, 3].min() == 1",
        "[1, 2, 3].indexOf(2) == 1 && [1, 2, 1].lastIndexOf(1) == 2",
        "[3, 1, 2].sort() == [1, 2, 3] && [dyn(1), dyn([2, 3])].flatten() == [1, 2, 3] && lists.range(3) == [0, 1, 2]",
        "[1, 2, 2].distinct() == [1, 2] && [1, 2, 3].slice(1, 2) == [2] && [1, 2].reverse() == [2, 1]",
        "[1, 2].first().value() == 1 && [1, 2].last().value() == 2",
        // sets
        "sets.contains([1, 2, 3], [1]) && sets.intersects([1, 2], [2, 3]) && sets.equivalent([1, 2], [2, 1])",
        // macros
        "[1, 2].exists(x, x == 2) && [1, 2].all(x, x > 0) && [1, 2, 3].exists_one(x, x > 2)",
        "[1, 2].map(x, x * 2) == [2, 4] && [1, 2].filter(x, x > 1) == [2] && [1, 2].map(x, x > 1, x) == [2]",
        // ip, cidr, url
        r#"isIP("10.0.0.1") && ip("10.0.0.1").family() == 4 && cidr("10.0.0.0/8").containsIP(ip("10.1.2.3"))"#,
        r#"url("https://example.com/x").getHost() == "example.com" && isURL("https://a.b")"#,
        // semver and quantity constructors
        r#"isSemver("1.2.3") && !isSemver("1.2") && isSemver("v1.2", true) && semver("1.2.3").compareTo(semver("1.2.4")) == -1"#,
        r#"isQuantity("10Gi") && quantity("1Gi").isInteger() && quantity("1").add(quantity("1")) == quantity("2")"#,
        // conversions and optionals
        r#"int("12") == 12 && string(12) == "12" && dyn(1) == 1 && bool("true") && double(1) == 1.0"#,
        "optional.of(1).hasValue() && !optional.none().hasValue() && optional.of(2).value() == 2",
        r#"{"a": 1}["a"] == 1 && {"a": 1}.a == 1 && {"a": 1}[?"b"].orValue(5) == 5"#,
        // format library
        r#"!format.dns1123Label().validate("abc").hasValue()"#,
        // negation runs (cel 0.13 parser bug worked around)
        "!!true && !!!false && --1 == 1",
    ] {
        assert_eq!(eval(&c, &d, expr), Ok(true), "{expr}");
    }
}

/// The scheduler compiles in the StoredExpressions environment, which declares every
/// versioned library whatever its feature gate (checked against the Go compiler in
/// interop/cel): `allowMultipleAllocations` and `includes` exist with both gates off.
#[test]
fn feature_gated_declarations_exist_in_the_stored_expressions_environment() {
    let c = SelectorCompiler::new(CelOptions::default());
    let d = gpu();
    assert_eq!(eval(&c, &d, "device.allowMultipleAllocations"), Ok(false));
    assert_eq!(
        eval(&c, &d, r#"device.attributes["x"].model.includes("a100")"#),
        Ok(true)
    );
}

#[test]
fn compile_errors_use_cel_go_wording() {
    let c = SelectorCompiler::new(CelOptions::default());
    let cases: &[(&str, &str)] = &[
        (
            "noSuchVar",
            "compilation failed: ERROR: <input>:1:1: undeclared reference to 'noSuchVar' (in container '')\n | noSuchVar\n | ^",
        ),
        ("foo(1)", "undeclared reference to 'foo' (in container '')"),
        (
            "nope.fn(1)",
            "undeclared reference to 'nope.fn' (in container '')",
        ),
        ("device.foo == 1", "undefined field 'foo'"),
        ("?!", "Syntax error"),
        ("1 +", "Syntax error"),
        ("1", "must evaluate to bool or the unknown type, not int"),
        (
            r#""abc""#,
            "must evaluate to bool or the unknown type, not string",
        ),
        (
            "[1, 2]",
            "must evaluate to bool or the unknown type, not list(int)",
        ),
        (
            "device.driver",
            "must evaluate to bool or the unknown type, not string",
        ),
        (
            "cel.bind(1, 2, true)",
            "cel.bind() variable names must be simple identifiers",
        ),
        ("Foo{a: 1}", "unsupported: message construction"),
    ];
    for (expr, want) in cases {
        let err = c.compile(expr).expect_err(expr).to_string();
        assert!(
            err.contains(want),
            "{expr}: {err:?} does not contain {want:?}"
        );
    }
}

#[test]
fn runtime_errors_use_cel_go_wording() {
    let c = SelectorCompiler::new(full_options());
    let d = gpu();
    for (expr, want) in [
        (r#"device.attributes["x"].nope"#, "no such key: nope"),
        (
            r#"device.attributes["x"]["nope"] == 1"#,
            "no such key: nope",
        ),
        (
            r#"device.capacity["nope"].memory.isGreaterThan(quantity("0"))"#,
            "no such key: memory",
        ),
        (
            r#"cel.bind(a, device.attributes["x"], a.nope)"#,
            "no such key: nope",
        ),
        (
            r#"device.attributes["x"].model"#,
            "CEL result of type string could not be converted to bool",
        ),
        ("1 / 0 == 1", "division by zero"),
        (
            r#"device.attributes["x"].cores.exists(c, c > 0)"#,
            "got 'types.Int', expected iterable type",
        ),
    ] {
        assert_eq!(eval(&c, &d, expr), Err(format!("eval: {want}")), "{expr}");
    }
    // An error on one side of || is absorbed when the other side is true, as in cel-go.
    assert_eq!(
        eval(&c, &d, r#"device.attributes["x"].nope || true"#),
        Ok(true)
    );
    assert_eq!(
        eval(&c, &d, r#"device.attributes["x"].nope && false"#),
        Ok(false)
    );
}

#[test]
fn every_attribute_is_checked_before_any_selector_runs() {
    let plain = SelectorCompiler::new(CelOptions::default());
    let lists = SelectorCompiler::new(full_options());
    let empty = TestDevice::new("x").attr("boolAttribute", Default::default());
    let list = TestDevice::new("x").attr("stringAttribute", strings(&["a", "b"]));
    let bad_version = TestDevice::new("x").attr("v", version("1.2"));
    let err = |c: &SelectorCompiler, d: &TestDevice| eval(c, d, "true");
    assert_eq!(
        err(&plain, &empty),
        Err("eval: attribute boolAttribute: unsupported attribute value".into())
    );
    assert_eq!(
        err(&lists, &empty),
        Err("eval: attribute boolAttribute: unsupported attribute value".into())
    );
    assert_eq!(
        err(&plain, &list),
        Err("eval: attribute stringAttribute: unsupported attribute value".into())
    );
    assert_eq!(err(&lists, &list), Ok(true));
    let e = err(&plain, &bad_version).expect_err("invalid version");
    assert!(
        e.starts_with("eval: attribute v: parse semantic version: "),
        "{e}"
    );
}

#[test]
fn a_device_without_maps_behaves_like_empty_maps() {
    let c = SelectorCompiler::new(CelOptions::default());
    let view = DeviceView {
        driver: "x",
        attributes: None,
        capacity: None,
        allow_multiple_allocations: None,
    };
    for (expr, want) in [
        (r#"device.attributes["x"].size() == 0"#, Ok(true)),
        (r#"has(device.attributes["x"].a)"#, Ok(false)),
        (
            r#"device.attributes["x"].a"#,
            Err(CelEvalError::Runtime("no such key: a".into())),
        ),
        (r#"device.capacity.size() == 0"#, Ok(true)),
    ] {
        assert_eq!(c.compile(expr).expect(expr).matches(&view), want, "{expr}");
    }
}

#[test]
fn compile_cache_returns_the_same_selector_and_does_not_cache_failures() {
    let c = SelectorCompiler::with_cache_capacity(CelOptions::default(), 2);
    let a1 = c.compile(r#"device.driver == "a""#).expect("compiles");
    let a2 = c.compile(r#"device.driver == "a""#).expect("compiles");
    assert!(Arc::ptr_eq(&a1, &a2));
    assert!(c.compile("noSuchVar").is_err());
    assert_eq!(c.cached(), 1);
    let _b = c.compile(r#"device.driver == "b""#).expect("compiles");
    let _a = c.compile(r#"device.driver == "a""#).expect("compiles"); // refresh a
    let _c = c.compile(r#"device.driver == "c""#).expect("compiles"); // evicts b
    assert_eq!(c.cached(), 2);
    let a3 = c.compile(r#"device.driver == "a""#).expect("compiles");
    assert!(
        Arc::ptr_eq(&a1, &a3),
        "the recently used entry survives eviction"
    );
    assert_eq!(a3.expression(), r#"device.driver == "a""#);
}

#[test]
fn compiler_is_shareable_across_threads() {
    let c = Arc::new(SelectorCompiler::new(CelOptions::default()));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || {
                let d = TestDevice::new("x").attr("i", int(i));
                let s = c
                    .compile(r#"device.attributes["x"].i >= 0"#)
                    .expect("compiles");
                (0..50).all(|_| s.matches(&d.view()) == Ok(true))
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().expect("thread"));
    }
    assert!(matches!(
        c.compile("1"),
        Err(CelCompileError::ResultType(_))
    ));
}

#[test]
fn field_selection_on_a_non_map_is_an_error_not_false() {
    let c = SelectorCompiler::new(CelOptions::default());
    let d = gpu();
    assert_eq!(
        eval(&c, &d, r#"device.attributes["x"].model.foo == 1"#),
        Err("eval: no such overload".into())
    );
    assert_eq!(
        eval(&c, &d, r#"has(device.attributes["x"].model.foo)"#),
        Err("eval: no such overload".into())
    );
    assert_eq!(
        eval(
            &c,
            &d,
            r#"cel.bind(m, {"a": {"b": 1}}, m.a.b == 1 && has(m.a.b) && !has(m.a.c))"#
        ),
        Ok(true)
    );
    // `[?domain]` on the domain map always has a value (the map has a default).
    assert_eq!(
        eval(&c, &d, r#"device.attributes[?"nope"].hasValue()"#),
        Ok(true)
    );
    assert_eq!(
        eval(&c, &d, r#"device.attributes[?"x"].value().model == "a100""#),
        Ok(true)
    );
}

#[test]
fn bind_of_a_domain_resolves_lookups_directly_and_keeps_semantics() {
    let c = SelectorCompiler::new(CelOptions::default());
    let d = gpu();
    let direct = r#"cel.bind(a, device.attributes["x"], a.model == "a100" && a["cores"] == 8 && has(a.model) && !has(a.nope))"#;
    let s = c.compile(direct).expect("compiles");
    assert!(
        s.has_fast_path(),
        "lookups through the bound domain use slots"
    );
    assert_eq!(s.matches(&d.view()), Ok(true));
    assert_eq!(s.matches_interpreted(&d.view()), Ok(true));
    for (expr, want) in [
        // The map itself is still available where it is used as a map.
        (
            r#"cel.bind(a, device.attributes["x"], size(a) == 3 && a.model == "a100")"#,
            Ok(true),
        ),
        (
            r#"cel.bind(a, device.attributes["nope"], size(a) == 0)"#,
            Ok(true),
        ),
        (
            r#"cel.bind(a, device.attributes["x"], a.nope)"#,
            Err("eval: no such key: nope".to_string()),
        ),
        // Shadowing: the inner `a` is a list element, not the domain.
        (
            r#"cel.bind(a, device.attributes["x"], [{"model": "b"}].all(a, a.model == "b"))"#,
            Ok(true),
        ),
        (
            r#"cel.bind(a, device.capacity["x"], a.memory.isGreaterThan(quantity("1Mi")))"#,
            Ok(true),
        ),
    ] {
        assert_eq!(eval(&c, &d, expr), want, "{expr}");
    }
}
