//! The native fast path (`fastpath.rs`) and the CEL interpreter give identical results
//! (values and error texts) on random devices, for every selector shape the fast path
//! handles.

mod common;

use common::*;
use devicelet_cel::{CelOptions, SelectorCompiler};
use k8s_openapi::api::resource::v1::DeviceAttribute;
use proptest::prelude::*;

const SELECTORS: &[&str] = &[
    r#"device.driver == "x""#,
    r#"device.driver != "x" || device.driver < "y""#,
    r#"device.attributes["x"].model == "a100""#,
    r#""a100" == device.attributes["x"].model"#,
    r#"device.attributes["x"].model >= "b""#,
    r#"device.attributes["x"].cores > 4 && device.attributes["x"].cores <= 16"#,
    r#"device.attributes["x"].cores == 8"#,
    r#"8 != device.attributes["x"].cores"#,
    r#"device.attributes["x"].flag"#,
    r#"!device.attributes["x"].flag || device.attributes["other.com"].flag == true"#,
    r#"has(device.attributes["x"].model) && device.attributes["x"].model == "a100""#,
    r#"!has(device.attributes["x"].cores) || device.attributes["x"].cores > 2"#,
    r#"has(device.capacity["x"].memory)"#,
    r#"device.capacity["x"].memory.compareTo(quantity("10Gi")) >= 0"#,
    r#"device.capacity["x"].memory.compareTo(quantity("1.5Gi")) < 0 || device.capacity["x"].memory.compareTo(quantity("500m")) == 0"#,
    r#"device.capacity["x"].memory.isGreaterThan(quantity("1Gi"))"#,
    r#"device.capacity["x"].memory.isLessThan(quantity("2048Mi"))"#,
    r#"device.driver == "x" && device.attributes["x"].model == "a100" && device.capacity["x"].memory.compareTo(quantity("10Gi")) >= 0"#,
    r#"device.allowMultipleAllocations"#,
    r#"device.allowMultipleAllocations == false && device.driver == "x""#,
    r#"device.attributes["x"].missing == 1 || true"#,
    r#"device.attributes["x"].missing == 1 && false"#,
    r#"device.attributes["x"].missing == 1 || device.attributes["x"].other == 2"#,
    "true && !false",
    r#"device.attributes["x"].model in ["a100", "b", "h100"]"#,
    r#"device.attributes["x"].cores in [1, 8, 19] || device.attributes["x"].flag in [true]"#,
    r#"device.attributes["x"].model.startsWith("a") && device.attributes["x"].model.endsWith("100")"#,
    r#"device.attributes["x"].model.contains("10") || device.attributes["x"].model.matches("^[ab]$")"#,
    r#"device.attributes["x"].model.isGreaterThan(semver("1.0.0"))"#,
    r#"device.attributes["x"].cores.compareTo(semver("2.3.4")) < 0"#,
    r#"device.attributes["x"].flag.isLessThan(semver("2.3.4-rc.2+meta"))"#,
    r#"cel.bind(a, device.attributes["x"], a.model.startsWith("h") || a.cores in [8])"#,
];

fn attribute() -> impl Strategy<Value = Option<DeviceAttribute>> {
    prop_oneof![
        Just(None),
        prop::sample::select(vec!["a100", "h100", "b", "", "a"]).prop_map(|s| Some(string(s))),
        (-3i64..20).prop_map(|i| Some(int(i))),
        any::<bool>().prop_map(|b| Some(boolean(b))),
        prop::sample::select(vec!["1.0.0", "2.3.4-rc.1", "2.3.4+build", "0.9.9"])
            .prop_map(|v| Some(version(v))),
        Just(Some(ints(&[1, 8]))),
    ]
}

fn quantity() -> impl Strategy<Value = Option<&'static str>> {
    prop::option::of(prop::sample::select(vec![
        "10Gi", "10240Mi", "1Gi", "1.5Gi", "1536Mi", "500m", "0.5", "2Gi", "11G", "1e10", "0.1n",
        "1Ei", "0",
    ]))
}

fn device() -> impl Strategy<Value = TestDevice> {
    (
        prop::sample::select(vec!["x", "y"]),
        attribute(),
        attribute(),
        attribute(),
        attribute(),
        quantity(),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(driver, model, cores, flag, other, memory, multi)| {
            let mut d = TestDevice::new(driver).multi(multi);
            // Unqualified names belong to the driver's domain; qualified ones to theirs.
            let prefix = if driver == "x" { "" } else { "x/" };
            for (name, attr) in [("model", model), ("cores", cores), ("flag", flag)] {
                if let Some(a) = attr {
                    d = d.attr(&format!("{prefix}{name}"), a);
                }
            }
            if let Some(a) = other {
                d = d.attr("other.com/flag", a);
            }
            if let Some(q) = memory {
                d = d.cap(&format!("{prefix}memory"), q);
            }
            d
        })
}

/// One compiler for all cases: compiling is the slow part in an unoptimised build.
static COMPILER: std::sync::LazyLock<SelectorCompiler> = std::sync::LazyLock::new(|| {
    SelectorCompiler::new(CelOptions {
        enable_consumable_capacity: true,
        enable_list_type_attributes: true,
        ..CelOptions::default()
    })
});

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_agrees_with_the_interpreter(d in device()) {
        for expr in SELECTORS {
            let s = COMPILER.compile(expr).expect("compiles");
            prop_assert!(s.has_fast_path(), "{} has no fast path", expr);
            let fast = s.matches(&d.view());
            let slow = s.matches_interpreted(&d.view());
            prop_assert_eq!(fast, slow, "{}", expr);
        }
    }
}

#[test]
fn shapes_outside_the_fast_path_use_the_interpreter() {
    let compiler = SelectorCompiler::new(CelOptions::default());
    for expr in [
        r#"device.attributes.exists(d, d == "x")"#,
        r#"device.attributes["x"].model.lowerAscii() == "a100""#,
        r#"cel.bind(a, device.attributes["x"], size(a) > 0)"#,
        r#"device.attributes["x"].cores == 8.0"#,
    ] {
        assert!(
            !compiler.compile(expr).expect(expr).has_fast_path(),
            "{expr}"
        );
    }
}
