//! Static type checking: a corpus of selector expressions (hand-written and generated
//! from typed operands, operators, functions and macros) with devicelet-cel's compile
//! verdicts.
//!
//! Go parity: with `DEVICELET_CEL_PARITY_OUT=<file>` the verdicts are written as JSON and
//! `interop/cel/run.sh` compares them with Kubernetes' own DRA CEL compiler
//! (`k8s.io/dynamic-resource-allocation/cel`, cel-go's type checker). Without Go, the
//! hand-written expectations below (taken from that compiler) are checked here.

use devicelet_cel::{CelOptions, SelectorCompiler};

/// Typed operands the generator combines.
const OPERANDS: &[&str] = &[
    "1",
    "1u",
    "1.5",
    "\"s\"",
    "b\"b\"",
    "true",
    "null",
    "[1]",
    "[\"a\"]",
    "{\"k\": 1}",
    "device.driver",
    "device.attributes[\"d\"].a",
    "device.attributes[\"d\"]",
    "device.capacity[\"d\"].c",
    "quantity(\"1\")",
    "semver(\"1.0.0\")",
    "duration(\"1s\")",
    "timestamp(\"2020-01-01T00:00:00Z\")",
    "dyn(1)",
    "device.allowMultipleAllocations",
    "size(\"a\")",
];

const BINARY: &[&str] = &[
    "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "in", "&&", "||",
];

/// Shapes with one operand (`A`).
/// Shapes with one operand (`$A`).
const UNARY_SHAPES: &[&str] = &[
    "$A",
    "!$A",
    "-$A",
    "size($A)",
    "$A.size()",
    "int($A)",
    "uint($A)",
    "double($A)",
    "string($A)",
    "bool($A)",
    "bytes($A)",
    "dyn($A)",
    "$A[0]",
    "$A[\"k\"]",
    "$A.f",
    "has($A.f)",
    "$A.contains(\"x\")",
    "$A.startsWith(\"x\")",
    "$A.endsWith(\"x\")",
    "$A.matches(\"x\")",
    "$A.lowerAscii() == \"x\"",
    "$A.all(x, x)",
    "$A.exists(x, x == 1)",
    "$A.exists_one(x, true)",
    "$A.map(x, x) == [1]",
    "$A.filter(x, true) == []",
    "$A.isGreaterThan(quantity(\"1\"))",
    "$A.compareTo(semver(\"1.0.0\")) == 0",
    "$A.major() == 1",
    "$A.asInteger() == 1",
    "$A.isInteger()",
    "true ? $A : 1",
    "[$A, 1].size() == 2",
    "{$A: 1}.size() == 1",
    "cel.bind(x, $A, x == 1)",
    "$A == $A",
    "$A.size() == \"1\"",
];

/// Operands of the two-operand shapes (a subset, to keep the run short).
const PAIR_OPERANDS: &[&str] = &[
    "1",
    "1.5",
    "\"s\"",
    "true",
    "[1]",
    "[\"a\"]",
    "{\"k\": 1}",
    "device.attributes[\"d\"].a",
    "device.capacity[\"d\"].c",
    "semver(\"1.0.0\")",
    "dyn(1)",
];

/// Shapes with two operands (`$A`, `$B`).
const PAIR_SHAPES: &[&str] = &[
    "$A.contains($B)",
    "$A.startsWith($B)",
    "$A.matches($B)",
    "$A.isGreaterThan($B)",
    "$A.isLessThan($B)",
    "$A.compareTo($B) == 0",
    "$A.add($B) == $A",
    "$A[$B] == 1",
    "true ? $A : $B",
    "[$A, $B].size() == 2",
    "{$A: $B}.size() == 1",
    "$A.exists(x, x == $B)",
    "$A.map(x, $B).size() == 1",
    "$A.filter(x, $B).size() == 1",
    "cel.bind(x, $A, x == $B)",
    "size($A) == $B",
    "$A.split($B).size() == 1",
    "$A.charAt($B) == \"a\"",
    "$A.substring($B) == \"a\"",
    "$A.replace($B, \"x\") == \"a\"",
    "$A.find($B) == \"a\"",
    "$A in $B",
    "($A == $B) == ($B == $A)",
];

/// Selectors as users write them, and known edge cases.
const HAND_WRITTEN: &[&str] = &[
    "device.driver == 1",
    "device.driver == \"gpu.example.com\"",
    "device.driver == \"a\" && device.attributes[\"gpu.example.com\"].model == \"T4\"",
    "device.attributes[\"dra.example.com\"].numa == 0",
    "device.attributes[\"dra.example.com\"].healthy",
    "device.attributes[\"dra.example.com\"].version.isGreaterThan(semver(\"1.0.0\"))",
    "device.capacity[\"dra.example.com\"].memory.compareTo(quantity(\"1Gi\")) >= 0",
    "device.capacity[\"dra.example.com\"].memory.isGreaterThan(quantity(\"1Gi\"))",
    "device.capacity[\"dra.example.com\"].memory < quantity(\"1Gi\")",
    "device.capacity[\"dra.example.com\"].memory == quantity(\"1Gi\")",
    "device.capacity[\"a\"].b.compareTo(semver(\"1.0.0\")) == 0",
    "has(device.attributes[\"dra.example.com\"].model)",
    "\"model\" in device.attributes[\"dra.example.com\"]",
    "device.attributes[\"dra.example.com\"].exists(k, k.startsWith(\"m\"))",
    "device.attributes.exists(d, d == 1)",
    "device.attributes.exists(d, d.size())",
    "device.attributes[\"x\"].all(k, k)",
    "device.attributes[\"x\"].map(k, k) == [1]",
    "device.attributes[\"x\"].map(k, k) == [\"a\"]",
    "device.attributes[1] == 1",
    "device.attributes[\"a\"].b.c",
    "device.attributes[\"a\"].?b.hasValue()",
    "device.attributes[\"a\"].?b.orValue(1) == \"a\"",
    "cel.bind(dra, device.attributes[\"dra.example.com\"], dra.a && dra.b)",
    "cel.bind(x, 1, x == \"a\")",
    "1 == 1.0",
    "1 < 1.0",
    "1u <= 2.0",
    "1 == 1u",
    "\"a\" == null",
    "null == null",
    "[1, \"a\"].size() > 0",
    "[1, dyn(\"a\")].size() > 0",
    "{1: \"a\", \"b\": 2}.size() > 0",
    "1 == 1 && 2 == \"b\" && 3 == \"c\"",
    "\"a\" + 1 == \"a1\"",
    "true || 1",
    "1 ? true : false",
    "[1].all(x, x)",
    "[1].exists_one(x, x)",
    "[1,2].filter(x, x) == [1]",
    "[1,2].map(x, x * 2) == [\"a\"]",
    "\"abc\"[0] == \"a\"",
    "[1][0u] == 1",
    "\"a\".startsWith(1)",
    "\"a\".b == 1",
    "int(duration(\"1s\")) == 1",
    "timestamp(\"2020-01-01T00:00:00Z\") + duration(\"1s\") == 1",
    "\"a,b\".split(\",\").size() == 2",
    "\"a,b\".split(1).size() == 2",
    "\"abc\".substring(1) == \"bc\"",
    "\"abc\".charAt(\"x\") == \"a\"",
    "\"abc\".find(\"b\") == 1",
    "\"abc\".findAll(\"b\") == [\"b\"]",
    "semver(\"1.0.0\").major() == \"a\"",
    "isSemver(\"1.0.0\") == 1",
    "quantity(\"1\").add(1).isInteger()",
    "quantity(\"1\").add(\"x\").isInteger()",
    "quantity(\"1\").sign() == 1.0",
    "quantity(\"1\").asApproximateFloat() > 0.5",
    "noSuchVar",
    "foo(1)",
    "device.foo",
    "dyn(true)",
    "1",
    "device.attributes[\"a\"].b",
    "device.attributes[\"a\"]",
    "device.capacity[\"a\"].b",
    "[1]",
    "{\"a\": 1}",
    "b\"a\"",
    "1.0",
    "null",
    "duration(\"1s\")",
    "timestamp(\"2020-01-01T00:00:00Z\")",
    "[].size() == 0",
    "[] == [1]",
    "{} == {\"a\": 1}",
    "device.attributes[\"d\"].a + 1 == 2",
    "(device.attributes[\"a\"].b + 1) == \"x\"",
    "device.attributes[\"a\"].b > timestamp(\"2020-01-01T00:00:00Z\")",
    "device.allowMultipleAllocations == 1",
    "device.allowMultipleAllocations",
    "sets.contains([1], [1])",
    "[1, 2].sum() == 3",
    "ip(\"1.2.3.4\").family() == 4",
    "device.attributes[\"a\"].b.includes(1)",
    "device.allowMultipleAllocations",
    "bool(\"s\")",
    "bool(\"t\")",
    "int(\"x\") == 1",
    "uint(\"-1\") == 1u",
    "double(\"x\") == 1.0",
    "duration(\"bad\") == duration(\"1s\")",
    "timestamp(\"bad\") == timestamp(\"2020-01-01T00:00:00Z\")",
    "int(1e100) == 1",
    "uint(-1) == 1u",
    "string(b\"\\xff\") == \"a\"",
    "int(dyn(\"1\")) == 1",
    "int(dyn(true)) == 1",
    "string(dyn([1])) == \"a\"",
    "bytes(\"a\") == b\"a\"",
    "int(2.5) == 2",
    "\"a\".matches(\"(\")",
    "matches(\"a\", \"(\")",
    "\"a\".find(\"(\") == \"a\"",
    "duration(\"1h30m\") == duration(\"90m\")",
    "duration(\"1.5h\") > duration(\"0\")",
    "duration(\"-1s\") < duration(\"0s\")",
    "duration(\"1d\") > duration(\"0s\")",
    "duration(\"\") > duration(\"0s\")",
    "duration(\"1\") > duration(\"0s\")",
    "timestamp(\"2020-13-01T00:00:00Z\") > timestamp(\"2020-01-01T00:00:00Z\")",
    "timestamp(\"2020-01-01T00:00:00+01:00\") > timestamp(\"2020-01-01T00:00:00Z\")",
    "timestamp(\"2020-01-01\") > timestamp(\"2020-01-01T00:00:00Z\")",
    "timestamp(\"2020-02-30T00:00:00Z\") > timestamp(\"2020-01-01T00:00:00Z\")",
    "timestamp(\"2020-01-01T00:00:00.123Z\") > timestamp(\"2020-01-01T00:00:00Z\")",
    "timestamp(1) > timestamp(\"2020-01-01T00:00:00Z\")",
    "int(null) == 1",
    "string(null) == \"a\"",
    "dyn(1)[dyn(null)] == 1",
    "int(dyn(1.5)) == 1",
    "int(9.3e18) == 1",
    "uint(1e20) == 1u",
    "double(\"1e3\") == 1000.0",
    "double(\"inf\") > 1.0",
    "int(\"+5\") == 5",
    "int(\" 5\") == 5",
    "bool(\"true\") && bool(\"0\") == false",
    "int(\"-12\") == -12",
    "uint(\"+1\") == 1u",
    "string(b\"abc\") == \"abc\"",
    "bool(string(true))",
    "int(string(12)) == 12",
    "device.attributes[\"d\"].a.matches(\"[\")",
    "\"a\".findAll(\"(\", 1).size() == 0",
    "duration(\"1h\") > duration(\"1m\") && duration(\"1.5us\") > duration(\"1ns\")",
    "duration(\"+5m\") > duration(\"-5m\")",
    "timestamp(\"2024-02-29T23:59:59Z\") > timestamp(\"2023-02-28T00:00:00-08:00\")",
    "timestamp(\"2023-02-29T00:00:00Z\") > timestamp(\"2020-01-01T00:00:00Z\")",
    "device.attributes[\"d\"].a[dyn(null)] == 1",
    "device.attributes[\"d\"].a[1.5] == 1",
    "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [1, 2, 3].max() == 3",
    "[1, 2, 3].sum() == \"a\"",
    "[\"a\"].sum() == 1",
    "[1, 2].indexOf(1) == \"a\"",
    "\"abc\".indexOf(\"b\") == 1",
    "\"abc\".indexOf(1) == 1",
    "\"abc\".lastIndexOf(\"c\") == \"x\"",
    "[\"a\", \"b\"].join(\"-\") == 1",
    "[\"a\", \"b\"].join() == \"ab\"",
    "[1, 2].join(\"-\") == \"1-2\"",
    "sets.contains([1], [\"a\"])",
    "sets.contains([1], [1.0])",
    "sets.intersects(1, [1])",
    "optional.of(1).hasValue()",
    "optional.of(1).value() == \"a\"",
    "optional.none().orValue(1) == 1",
    "device.attributes[\"d\"].?a.orValue(1) == 1",
    "device.attributes[?\"d\"].hasValue()",
    "{\"a\": 1}[?\"a\"].value() == 1",
    "[1, 2].first().value() == \"a\"",
    "lists.range(3).size() == 3",
    "[3, 1].sort() == [1, 3]",
    "[1, [2]].flatten().size() == 2",
    "[[1], [2]].flatten() == [1, 2]",
    "[1, 2].slice(0, 1) == [1]",
    "[1, 2].distinct() == [\"a\"]",
    "[1, 2].reverse() == [2, 1]",
    "\"%d\".format([1]) == \"1\"",
    "\"%d\".format(1) == \"1\"",
    "strings.quote(\"a\") == 1",
    "\"abc\".reverse() == \"cba\"",
    "ip(\"10.0.0.1\").family() == 4",
    "ip(\"10.0.0.1\") == \"10.0.0.1\"",
    "ip(\"bad\").family() == 4",
    "cidr(\"10.0.0.0/8\").containsIP(ip(\"10.1.2.3\"))",
    "cidr(\"10.0.0.0/8\").containsIP(\"10.1.2.3\")",
    "cidr(\"10.0.0.0/8\").containsIP(1)",
    "isIP(\"1.2.3.4\") == 1",
    "url(\"https://a.b\").getHost() == \"a.b\"",
    "url(\"https://a.b\").getHost() == 1",
    "isURL(1)",
    "format.dns1123Label().validate(\"abc\").hasValue()",
    "quantity(\"1Gi\").isGreaterThan(1)",
    "quantity(\"bad\").isInteger()",
    "semver(\"bad\").major() == 1",
    "semver(\"v1.0.0\", true).major() == 1",
    "quantity(\"1\").compareTo(quantity(\"2\")) < 0",
    "device.capacity[\"d\"].c.add(1).isGreaterThan(quantity(\"1\"))",
    "device.capacity[\"d\"].c.sub(quantity(\"1\")).sign() >= 0",
    "device.capacity[\"d\"].c.asApproximateFloat() > 1",
    "device.attributes[\"d\"].exists(k, device.attributes[\"d\"][k] == 1)",
    "device.attributes.all(dom, device.attributes[dom].size() < 10)",
    "device.attributes[\"d\"].all(k, v, v == 1)",
    "device.attributes[\"d\"].transformList(k, v, k).size() > 0",
    "device.attributes[\"d\"].existsOne(k, k == \"a\")",
    "has(device.attributes.d)",
    "has(device.attributes.d.a)",
    "has(device.capacity.d.c)",
    "has(device.driver)",
    "device.attributes.d.a == 1",
    "device.attributes[\"d\"][\"a\"] == 1",
    "size(device.attributes[\"d\"]) > 0u",
    "device.attributes[\"d\"].size() >= 1.0",
    "\"a\" < \"b\" && b\"a\" < b\"b\" && true > false",
    "duration(\"1s\") < duration(\"2s\") && timestamp(\"2020-01-01T00:00:00Z\") < timestamp(\"2021-01-01T00:00:00Z\")",
    "timestamp(\"2020-01-01T00:00:00Z\").getFullYear() == 2020",
    "timestamp(\"2020-01-01T00:00:00Z\").getFullYear() == \"a\"",
    "duration(\"1s\").getSeconds() == 1",
    "1 + 2 * 3 - 4 / 2 % 3 == 5",
    "1.0 / 2.0 == 0.5 && 5u % 2u == 1u",
    "-(1u) == 1",
    "[1, 2] + [3] == [1, 2, 3]",
    "[1] + [\"a\"] == []",
    "{\"a\": [1]}[\"a\"][0] == 1",
    "{\"a\": {\"b\": 1}}.a.b == 1",
    "{\"a\": 1}.b.c == 1",
    "[1].map(x, [x]).flatten() == [1]",
    "[1].all(x, [2].exists(y, x < y))",
    "cel.bind(a, 1, cel.bind(b, \"x\", a == b))",
    "cel.bind(a, [1, 2], a.exists(x, x == \"a\"))",
    "device.attributes[\"d\"].a.includes(1)",
    "device.attributes[\"d\"].a.includes(\"x\", 1)",
    "[1].includes(1)",
    "\"x\".includes(\"x\")",
    "type(1) == int",
    "int == int",
    "dyn(1) == dyn(\"a\")",
    "[dyn(1), dyn(\"a\")].size() == 2",
    "{\"a\": dyn(1), \"b\": dyn(\"x\")}.size() == 2",
    "quantity(\"1\").sign() == 1",
    "device.capacity[\"d\"].c.sign() == 1",
    "quantity(\"1\").add(quantity(\"1\")).sign() == 1",
    "quantity(\"1\").sub(1).sign() == 1",
    "dyn(1).sign() == 1",
];

/// The whole corpus, deduplicated, in a stable order.
fn corpus() -> Vec<String> {
    let mut out: Vec<String> = HAND_WRITTEN.iter().map(|s| s.to_string()).collect();
    for a in OPERANDS {
        for b in OPERANDS {
            for op in BINARY {
                out.push(format!("{a} {op} {b}"));
            }
        }
        for shape in UNARY_SHAPES {
            out.push(shape.replace("$A", a));
        }
    }
    for a in PAIR_OPERANDS {
        for b in PAIR_OPERANDS {
            for shape in PAIR_SHAPES {
                out.push(shape.replace("$A", a).replace("$B", b));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|e| seen.insert(e.clone()));
    out
}

fn options() -> CelOptions {
    CelOptions {
        enable_consumable_capacity: true,
        enable_list_type_attributes: false,
        ..CelOptions::default()
    }
}

/// The second feature set: list-type attributes on (attribute values are `dyn`, a `dyn`
/// result is accepted, `includes` exists), consumable capacity off
/// (`device.allowMultipleAllocations` is undeclared).
fn list_type_options() -> CelOptions {
    CelOptions {
        enable_consumable_capacity: false,
        enable_list_type_attributes: true,
        ..CelOptions::default()
    }
}

/// The smaller corpus of the second feature set.
fn list_type_corpus() -> Vec<String> {
    let mut out: Vec<String> = HAND_WRITTEN.iter().map(|s| s.to_string()).collect();
    for a in OPERANDS {
        for shape in UNARY_SHAPES {
            out.push(shape.replace("$A", a));
        }
        out.push(format!("{a}.includes(1)"));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|e| seen.insert(e.clone()));
    out
}

fn verdicts(options: CelOptions, exprs: &[String]) -> Vec<serde_json::Value> {
    let compiler = SelectorCompiler::with_cache_capacity(options, 1);
    exprs
        .iter()
        .map(|expr| {
            let (ok, error) = match compiler.compile(expr) {
                Ok(_) => (true, String::new()),
                Err(e) => (false, e.to_string()),
            };
            serde_json::json!({ "expr": expr, "ok": ok, "error": error })
        })
        .collect()
}

#[test]
fn type_check_corpus_verdicts_are_written_for_go_parity() {
    let main = verdicts(options(), &corpus());
    let list_types = verdicts(list_type_options(), &list_type_corpus());
    assert!(main.len() > 5000, "corpus too small: {}", main.len());
    // The checker must reject a good share of the generated expressions, or it checks
    // nothing (the Go comparison runs only where Go is installed).
    let rejected = main.iter().filter(|v| v["ok"] == false).count();
    assert!(rejected * 3 > main.len(), "only {rejected} rejections");
    if let Ok(path) = std::env::var("DEVICELET_CEL_PARITY_OUT") {
        let doc = serde_json::json!({ "sets": [
            {
                "features": { "consumableCapacity": true, "listTypeAttributes": false },
                "cases": main,
            },
            {
                "features": { "consumableCapacity": false, "listTypeAttributes": true },
                "cases": list_types,
            },
        ]});
        let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
        std::fs::write(&path, text).expect("write the parity file");
    }
}

/// Verdicts of Kubernetes' DRA CEL compiler (v0.36.2) for a few expressions, so that
/// the checker is held to them even where Go is not installed.
#[test]
fn type_check_matches_go_on_known_cases() {
    let compiler = SelectorCompiler::new(options());
    let cases: &[(&str, Option<&str>)] = &[
        (
            "device.driver == 1",
            Some(
                "compilation failed: ERROR: <input>:1:15: found no matching overload for '_==_' applied to '(string, int)'\n | device.driver == 1\n | ..............^",
            ),
        ),
        (
            "device.capacity[\"a\"].b < quantity(\"1\")",
            Some(
                "compilation failed: ERROR: <input>:1:24: found no matching overload for '_<_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'\n | device.capacity[\"a\"].b < quantity(\"1\")\n | .......................^",
            ),
        ),
        (
            "\"a\".startsWith(1)",
            Some(
                "compilation failed: ERROR: <input>:1:15: found no matching overload for 'startsWith' applied to 'string.(int)'\n | \"a\".startsWith(1)\n | ..............^",
            ),
        ),
        (
            "true || 1",
            Some(
                "compilation failed: ERROR: <input>:1:9: expected type 'bool' but found 'int'\n | true || 1\n | ........^",
            ),
        ),
        (
            "1 == 1 && 2 == \"b\" && 3 == \"c\"",
            Some(
                "compilation failed: ERROR: <input>:1:13: found no matching overload for '_==_' applied to '(int, string)'\n | 1 == 1 && 2 == \"b\" && 3 == \"c\"\n | ............^\nERROR: <input>:1:25: found no matching overload for '_==_' applied to '(int, string)'\n | 1 == 1 && 2 == \"b\" && 3 == \"c\"\n | ........................^",
            ),
        ),
        (
            "[1, \"a\"].size() > 0",
            Some(
                "compilation failed: ERROR: <input>:1:5: expected type 'int' but found 'string'\n | [1, \"a\"].size() > 0\n | ....^",
            ),
        ),
        (
            "device.attributes[\"a\"]",
            Some("must evaluate to bool or the unknown type, not map(string, google.protobuf.Any)"),
        ),
        (
            "device.attributes[\"a\"].b.c",
            Some("must evaluate to bool or the unknown type, not dyn"),
        ),
        ("1 < 1.0", None),
        ("null == quantity(\"1\")", None),
        ("device.attributes[\"a\"].b == 1", None),
        ("device.attributes[\"a\"].b", None),
        ("cel.bind(x, device.attributes[\"a\"], x.b == 1)", None),
        (
            "device.attributes[\"a\"].b.isGreaterThan(semver(\"1.0.0\"))",
            None,
        ),
    ];
    for (expr, want) in cases {
        let got = compiler.compile(expr).err().map(|e| e.to_string());
        assert_eq!(got.as_deref(), *want, "{expr}");
    }
}
