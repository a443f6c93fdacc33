//! Table tests mirroring upstream
//! `staging/src/k8s.io/dynamic-resource-allocation/cel/compile_test.go` (`TestCEL`): the
//! same expressions and devices, with the expected result or error text. Cost figures of
//! the Go table are not reproduced (our cost model differs, see `cost.rs`); the one case
//! that exceeds the limit in Go ("expensive") must exceed ours too.

mod common;

use common::*;
use devicelet_cel::{CelOptions, SelectorCompiler};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ListTypes {
    Both,
    Off,
    On,
}

struct Case {
    name: &'static str,
    expression: String,
    device: TestDevice,
    consumable_capacity: bool,
    list_types: ListTypes,
    expect: Expect,
}

enum Expect {
    Match(bool),
    CompileError(&'static str),
    MatchError(&'static str),
}

fn case(name: &'static str, expression: &str, device: TestDevice, expect: Expect) -> Case {
    Case {
        name,
        expression: expression.to_string(),
        device,
        consumable_capacity: false,
        list_types: ListTypes::Both,
        expect,
    }
}

const D: &str = "dra.example.com";

fn cases() -> Vec<Case> {
    use Expect::*;
    let dev = || TestDevice::new(D);
    let mut v = vec![
        case("true", "true", TestDevice::new(""), Match(true)),
        case("false", "false", TestDevice::new(""), Match(false)),
        case(
            "syntax-error",
            "?!",
            TestDevice::new(""),
            CompileError("Syntax error"),
        ),
        case(
            "type-error",
            "1",
            TestDevice::new(""),
            CompileError("must evaluate to bool or the unknown type, not int"),
        ),
        case(
            "runtime-error-lookup-identifier",
            r#"device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))"#,
            TestDevice::new(""),
            MatchError("no such key: noSuchAttr"),
        ),
        case(
            "runtime-error-lookup-map",
            r#"device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))"#,
            TestDevice::new(""),
            MatchError("no such key: noSuchAttr"),
        ),
        case(
            "domain-check-negative",
            r#""no-such-domain" in device.attributes"#,
            TestDevice::new(""),
            Match(false),
        ),
        case(
            "domain-check-positive",
            r#""dra.example.com" in device.attributes"#,
            TestDevice::new("").attr("dra.example.com/something", boolean(true)),
            Match(true),
        ),
        case(
            "empty-driver-name",
            r#"device.driver == """#,
            TestDevice::new(""),
            Match(true),
        ),
        case(
            "real-driver-name",
            r#"device.driver == "dra.example.com""#,
            dev(),
            Match(true),
        ),
        case(
            "driver-name-qualifier",
            r#"device.attributes["dra.example.com"].name"#,
            dev().attr("name", boolean(true)),
            Match(true),
        ),
        case(
            "driver-name-qualifier-map-lookup",
            r#"device.attributes["dra.example.com"]["name"]"#,
            dev().attr("name", boolean(true)),
            Match(true),
        ),
        case(
            "bind",
            r#"cel.bind(dra, device.attributes["dra.example.com"], dra.name)"#,
            dev().attr("name", boolean(true)),
            Match(true),
        ),
        case(
            "qualified-attribute-name",
            r#"device.attributes["other.example.com"].name"#,
            dev().attr("other.example.com/name", boolean(true)),
            Match(true),
        ),
        case(
            "bool",
            r#"device.attributes["dra.example.com"].name"#,
            dev().attr("name", boolean(true)),
            Match(true),
        ),
        case(
            "int",
            r#"device.attributes["dra.example.com"].name > 0"#,
            dev().attr("name", int(1)),
            Match(true),
        ),
        case(
            "string",
            r#"device.attributes["dra.example.com"].name == "fish""#,
            dev().attr("name", string("fish")),
            Match(true),
        ),
        case(
            "macro-exists-on-int",
            r#"device.attributes["dra.example.com"].name.exists(x, x > 0)"#,
            dev().attr("name", int(1)),
            MatchError("got 'types.Int', expected iterable type"),
        ),
        case(
            "macro-exists-on-bool",
            r#"device.attributes["dra.example.com"].name.exists(x, x == true)"#,
            dev().attr("name", boolean(true)),
            MatchError("got 'types.Bool', expected iterable type"),
        ),
        case(
            "macro-exists-on-string",
            r#"device.attributes["dra.example.com"].name.exists(x, x == "fish")"#,
            dev().attr("name", string("fish")),
            MatchError("got 'types.String', expected iterable type"),
        ),
        case(
            "version",
            r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))"#,
            dev().attr("name", version("1.0.0")),
            Match(true),
        ),
        case(
            "version_v",
            r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)"#,
            dev().attr("name", version("1.0.0")),
            Match(true),
        ),
        case(
            "macro-exists-on-version",
            r#"device.attributes["dra.example.com"].name.exists(x, x.isGreaterThan(semver("0.0.1")))"#,
            dev().attr("name", version("1.0.0")),
            MatchError("got 'cel.Semver', expected iterable type"),
        ),
        case(
            "quantity",
            r#"device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#,
            dev().cap("name", "1Mi"),
            Match(true),
        ),
        case(
            "check-positive",
            r#""name" in device.capacity["dra.example.com"] && device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#,
            dev().cap("name", "1Mi"),
            Match(true),
        ),
        case(
            "check-negative",
            r#"!("name" in device.capacity["dra.example.com"]) || device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#,
            TestDevice::new(""),
            Match(true),
        ),
        case(
            "all",
            r#"
device.capacity["dra.example.com"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"].bool &&
device.attributes["dra.example.com"].int > 0 &&
device.attributes["dra.example.com"].string == "fish" &&
device.attributes["dra.example.com"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["dra.example.com"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"]["bool"] &&
device.attributes["dra.example.com"]["int"] > 0 &&
device.attributes["dra.example.com"]["string"] == "fish" &&
device.attributes["dra.example.com"]["version"].isGreaterThan(semver("0.0.1"))
"#,
            dev()
                .attr("bool", boolean(true))
                .attr("int", int(1))
                .attr("string", string("fish"))
                .attr("version", version("1.0.0"))
                .cap("quantity", "1Mi"),
            Match(true),
        ),
        case(
            "many",
            r#"device.attributes["dra.example.com"].a && device.attributes["dra.example.com"].b && device.attributes["dra.example.com"].c"#,
            dev()
                .attr("a", boolean(true))
                .attr("b", boolean(true))
                .attr("c", boolean(true)),
            Match(true),
        ),
        case(
            "check_attribute_domains",
            r#"device.attributes.exists_one(x, x == "dra.example.com")"#,
            dev().attr("services", string("some_example_value")),
            Match(true),
        ),
        case(
            "check_attribute_ids",
            r#"device.attributes["dra.example.com"].exists_one(x, x == "services")"#,
            dev().attr("services", string("some_example_value")),
            Match(true),
        ),
        case(
            "split_attribute",
            r#"device.attributes["dra.example.com"].services.split("example").size() >= 2"#,
            dev().attr("services", string("some_example_value")),
            Match(true),
        ),
        case(
            "regexp_attribute",
            r#"device.attributes["dra.example.com"].services.matches("[^a]?sym")"#,
            dev().attr("services", string("asymetric")),
            Match(true),
        ),
        case(
            "check_capacity_domains",
            r#"device.capacity.exists_one(x, x == "dra.example.com")"#,
            dev().cap("memory", "1Mi"),
            Match(true),
        ),
        case(
            "check_capacity_ids",
            r#"device.capacity["dra.example.com"].exists_one(x, x == "memory")"#,
            dev().cap("memory", "1Mi"),
            Match(true),
        ),
        case(
            "expensive",
            r#"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))"#,
            expensive_device(),
            MatchError("actual cost limit exceeded"),
        ),
    ];
    let mut with_cc = |name, expr: &str, multi: Option<bool>, enabled: bool, expect| {
        let mut c = case(name, expr, dev().multi(multi), expect);
        c.consumable_capacity = enabled;
        v.push(c);
    };
    with_cc(
        "allow_multiple_allocations",
        "device.allowMultipleAllocations == true",
        Some(true),
        true,
        Match(true),
    );
    with_cc(
        "allow_multiple_allocations_default",
        "device.allowMultipleAllocations == false",
        None,
        true,
        Match(true),
    );
    with_cc(
        "allow_multiple_allocations_false",
        "device.allowMultipleAllocations == false",
        Some(false),
        true,
        Match(true),
    );
    with_cc(
        "allow_multiple_allocations_disabled",
        "device.allowMultipleAllocations == false",
        None,
        false,
        // Upstream expects "undefined field" in the NewExpressions environment; the
        // scheduler's StoredExpressions environment declares the field whatever the
        // gate, and an unset value reads as false (verified with the Go compiler).
        Match(true),
    );

    // List-type attribute cases (upstream runs them with the feature on).
    let mut on = |name, expr: String, device: TestDevice, expect| {
        let mut c = Case {
            name,
            expression: expr,
            device,
            consumable_capacity: false,
            list_types: ListTypes::On,
            expect,
        };
        c.list_types = ListTypes::On;
        v.push(c);
    };
    let n = |s: &str| s.to_string();
    on(
        "list-result-type-causes-match-error",
        n(r#"device.attributes["dra.example.com"].names"#),
        dev().attr("names", strings(&["fish", "bird"])),
        MatchError("CEL result of type list could not be converted to bool"),
    );
    on(
        "includes-function-can-evaluate",
        n(r#"device.attributes["dra.example.com"].name.includes("fish")"#),
        dev().attr("name", strings(&["fish", "bird"])),
        Match(true),
    );
    for (name, attr) in [
        ("list-of-bool", bools(&[true, false])),
        ("list-of-int", ints(&[1, 2])),
        ("list-of-string", strings(&["fish", "bird"])),
        ("list-of-semver", versions(&["1.0.0", "2.0.0"])),
    ] {
        on(
            name,
            n(r#"device.attributes["dra.example.com"].names.size() == 2"#),
            dev().attr("names", attr),
            Match(true),
        );
    }
    on(
        "macro-on-list-of-int",
        n(r#"device.attributes["dra.example.com"].names.exists(x, x > 0)"#),
        dev().attr("names", ints(&[1, 2])),
        Match(true),
    );
    on(
        "macro-on-list-of-string",
        n(r#"device.attributes["dra.example.com"].names.all(x, x != "")"#),
        dev().attr("names", strings(&["fish", "bird"])),
        Match(true),
    );
    on(
        "macro-on-list-of-semver",
        n(r#"device.attributes["dra.example.com"].names.all(x, x.isGreaterThan(semver("0.0.1")))"#),
        dev().attr("names", versions(&["1.0.0", "2.0.0"])),
        Match(true),
    );
    let inc = |arg: &str| format!(r#"device.attributes["dra.example.com"].name.includes({arg})"#);
    for (name, arg, attr, expect) in [
        (
            "includes-function-on-bool-scalar-positive",
            "true",
            boolean(true),
            true,
        ),
        (
            "includes-function-on-bool-scalar-negative",
            "true",
            boolean(false),
            false,
        ),
        (
            "includes-function-on-bool-list-positive",
            "true",
            bools(&[true, false]),
            true,
        ),
        (
            "includes-function-on-bool-list-negative",
            "false",
            bools(&[true, true]),
            false,
        ),
        (
            "includes-function-on-int-scalar-positive",
            "1",
            int(1),
            true,
        ),
        (
            "includes-function-on-int-scalar-negative",
            "1",
            int(2),
            false,
        ),
        (
            "includes-function-on-int-list-positive",
            "1",
            ints(&[1, 2]),
            true,
        ),
        (
            "includes-function-on-int-list-negative",
            "3",
            ints(&[1, 2]),
            false,
        ),
        (
            "includes-function-on-string-scalar-positive",
            "\"fish\"",
            string("fish"),
            true,
        ),
        (
            "includes-function-on-string-scalar-negative",
            "\"bird\"",
            string("fish"),
            false,
        ),
        (
            "includes-function-on-string-list-positive",
            "\"fish\"",
            strings(&["fish", "bird"]),
            true,
        ),
        (
            "includes-function-on-string-list-negative",
            "\"cat\"",
            strings(&["fish", "bird"]),
            false,
        ),
        (
            "includes-function-on-semver-scalar-positive",
            "semver(\"1.0.0\")",
            version("1.0.0"),
            true,
        ),
        (
            "includes-function-on-semver-scalar-negative",
            "semver(\"2.0.0\")",
            version("1.0.0"),
            false,
        ),
        (
            "includes-function-on-semver-list-positive",
            "semver(\"1.0.0\")",
            versions(&["1.0.0", "2.0.0"]),
            true,
        ),
        (
            "includes-function-on-semver-list-negative",
            "semver(\"3.0.0\")",
            versions(&["1.0.0", "2.0.0"]),
            false,
        ),
    ] {
        on(name, inc(arg), dev().attr("name", attr), Match(expect));
    }
    let long = |count: usize| {
        let values: Vec<String> = (0..count).map(|i| format!("value-{i}")).collect();
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        strings(&refs)
    };
    on(
        "includes-function-on-very-long-list-positive",
        inc("\"value-48\""),
        dev().attr("name", long(48)),
        Match(false),
    );
    on(
        "includes-function-on-very-long-list-runtime-error",
        inc("\"value-49\""),
        dev().attr("name", long(49)),
        MatchError("'includes' function cannot be applied to lists longer than 48 values"),
    );
    on(
        "in-operator-on-list",
        n(r#"1 in device.attributes["dra.example.com"].names"#),
        dev().attr("names", ints(&[1, 2, 3])),
        Match(true),
    );
    on(
        "includes-function-compilation-and-eval-success",
        inc("\"fish\""),
        dev()
            .attr("attr", string("fish"))
            .attr("name", string("fish")),
        Match(true),
    );
    let mut off = case(
        "includes-function-compilation-error",
        r#"device.attributes["dra.example.com"].attr.includes("fish")"#,
        dev().attr("attr", string("fish")),
        // Upstream expects "undeclared reference" in the NewExpressions environment;
        // StoredExpressions (the scheduler's) declares `includes` whatever the gate.
        Match(true),
    );
    off.list_types = ListTypes::Off;
    v.push(off);
    // Upstream runs the "iterate over a scalar attribute" cases with list-type attributes
    // on, where an attribute is `dyn`. With the feature off it is `any`, which cel-go's
    // checker refuses as a comprehension range (checked against the Go compiler).
    let mut scalar_ranges = Vec::new();
    for c in &mut v {
        if matches!(c.expect, MatchError(m) if m.ends_with("expected iterable type")) {
            c.list_types = ListTypes::On;
            scalar_ranges.push(Case {
                name: c.name,
                expression: c.expression.clone(),
                device: TestDevice::new(D),
                consumable_capacity: c.consumable_capacity,
                list_types: ListTypes::Off,
                expect: CompileError(
                    "expression of type 'any' cannot be range of a comprehension (must be list, map, or dynamic)",
                ),
            });
        }
    }
    v.extend(scalar_ranges);
    v
}

fn expensive_device() -> TestDevice {
    let mut d = TestDevice::new(D);
    for i in 0..32 {
        let suffix = format!("-{i}");
        let name = format!(
            "dra.example.com/{}{}",
            "x".repeat(63 - suffix.len()),
            suffix
        );
        d = d.attr(&name, string("abc"));
    }
    d
}

fn run(c: &Case, list_types: bool) {
    let compiler = SelectorCompiler::new(CelOptions {
        enable_consumable_capacity: c.consumable_capacity,
        enable_list_type_attributes: list_types,
        ..CelOptions::default()
    })
    // Unoptimised test builds on a shared machine are slow; this table checks the cost
    // limit, not the wall-clock deadline (tested in hostile_inputs.rs).
    .with_deadline(std::time::Duration::from_secs(60));
    let label = format!("{} (list types {list_types})", c.name);
    let compiled = compiler.compile(&c.expression);
    match (&c.expect, compiled) {
        (Expect::CompileError(want), Err(e)) => {
            assert!(
                e.to_string().contains(want),
                "{label}: compile error {e:?} does not contain {want:?}"
            )
        }
        (Expect::CompileError(want), Ok(_)) => panic!("{label}: expected compile error {want:?}"),
        (_, Err(e)) => panic!("{label}: unexpected compile error: {e}"),
        (Expect::Match(want), Ok(s)) => match s.matches(&c.device.view()) {
            Ok(got) => assert_eq!(got, *want, "{label}"),
            Err(e) => panic!("{label}: unexpected evaluation error: {e}"),
        },
        (Expect::MatchError(want), Ok(s)) => match s.matches(&c.device.view()) {
            Ok(got) => panic!("{label}: expected error {want:?}, got {got}"),
            Err(e) => assert!(
                e.to_string().contains(want),
                "{label}: error {e} does not contain {want:?}"
            ),
        },
    }
}

#[test]
fn upstream_compile_test_table_matches_go() {
    for c in cases() {
        match c.list_types {
            ListTypes::Both => {
                run(&c, false);
                run(&c, true);
            }
            ListTypes::On => run(&c, true),
            ListTypes::Off => run(&c, false),
        }
    }
}
