//! Criterion benchmark of selector evaluation (spec §4.5 "CEL-heavy selectors"): the typical
//! selector `device.driver == "x" && device.attributes["x"].model == "a100" &&
//! device.capacity["x"].memory.compareTo(quantity("10Gi")) >= 0` over 10 000 devices.
//! Prints evaluations per second.

use std::collections::BTreeMap;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use devicelet_cel::{CelOptions, DeviceView, SelectorCompiler};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const DEVICES: usize = 10_000;
const TYPICAL: &str = r#"device.driver == "x" && device.attributes["x"].model == "a100" && device.capacity["x"].memory.compareTo(quantity("10Gi")) >= 0"#;

struct OwnedDevice {
    driver: String,
    attributes: BTreeMap<String, DeviceAttribute>,
    capacity: BTreeMap<String, DeviceCapacity>,
}

fn devices() -> Vec<OwnedDevice> {
    (0..DEVICES)
        .map(|i| {
            let mut attributes = BTreeMap::new();
            attributes.insert(
                "model".to_string(),
                DeviceAttribute {
                    string: Some(if i % 2 == 0 { "a100" } else { "h100" }.to_string()),
                    ..Default::default()
                },
            );
            attributes.insert(
                "index".to_string(),
                DeviceAttribute {
                    int: Some(i as i64),
                    ..Default::default()
                },
            );
            attributes.insert(
                "driverVersion".to_string(),
                DeviceAttribute {
                    version: Some(format!("1.{}.0", i % 7)),
                    ..Default::default()
                },
            );
            let mut capacity = BTreeMap::new();
            capacity.insert(
                "memory".to_string(),
                DeviceCapacity {
                    value: Quantity(format!("{}Gi", 8 + (i % 4) * 8)),
                    ..Default::default()
                },
            );
            OwnedDevice {
                driver: "x".to_string(),
                attributes,
                capacity,
            }
        })
        .collect()
}

fn view(d: &OwnedDevice) -> DeviceView<'_> {
    DeviceView {
        driver: &d.driver,
        attributes: Some(&d.attributes),
        capacity: Some(&d.capacity),
        allow_multiple_allocations: None,
    }
}

fn bench_selectors(c: &mut Criterion) {
    let compiler = SelectorCompiler::new(CelOptions::default());
    let devices = devices();
    // (name, expression, use the interpreter even where a native fast path exists)
    let cases = [
        ("typical", TYPICAL, false),
        ("typical_interpreted", TYPICAL, true),
        ("driver_only", r#"device.driver == "x""#, false),
        (
            "bind_domain",
            r#"cel.bind(x, device.attributes["x"], x.model == "a100" && x.index >= 100)"#,
            false,
        ),
        (
            "semver_and_strings",
            r#"device.attributes["x"].driverVersion.isGreaterThan(semver("1.2.0")) && device.attributes["x"].model.startsWith("a")"#,
            false,
        ),
        (
            "exists_over_domains",
            r#"device.attributes.exists(d, d == "x")"#,
            false,
        ),
    ];
    for (name, expr, interpreted) in cases {
        let selector = match compiler.compile(expr) {
            Ok(s) => s,
            Err(e) => panic!("{name}: {e}"),
        };
        let eval = |d: &OwnedDevice| {
            if interpreted {
                selector.matches_interpreted(&view(d))
            } else {
                selector.matches(&view(d))
            }
        };
        // One plain timed pass (best of 5), printed for the report, then criterion.
        let mut best = f64::MAX;
        let mut matched = 0usize;
        for _ in 0..5 {
            let start = Instant::now();
            matched = devices.iter().filter(|d| eval(d).unwrap_or(false)).count();
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!(
            "selector {name} (fast path: {}): {DEVICES} devices in {:.3} ms, {:.0} evaluations/s ({matched} matched)",
            selector.has_fast_path() && !interpreted,
            best * 1e3,
            DEVICES as f64 / best
        );
        let mut group = c.benchmark_group("selectors");
        group.throughput(Throughput::Elements(DEVICES as u64));
        group.bench_function(name, |b| {
            b.iter(|| devices.iter().filter(|d| eval(d).unwrap_or(false)).count())
        });
        group.finish();
    }
}

/// Time until each hostile selector is stopped (compile error or cost / deadline error),
/// printed for the report: the bound of the cost guard in an optimised build.
fn report_hostile_bounds(_c: &mut Criterion) {
    let ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
    let mut nested_all = "a + b + c + d + e + f + g + h > 0".to_string();
    for v in ["h", "g", "f", "e", "d", "c", "b", "a"] {
        nested_all = format!("{ten}.all({v}, {nested_all})");
    }
    let mut doubling = "size(s40) > 0".to_string();
    for i in (1..=40).rev() {
        doubling = format!("cel.bind(s{i}, s{} + s{}, {doubling})", i - 1, i - 1);
    }
    let doubling = format!("cel.bind(s0, \"{}\", {doubling})", "x".repeat(64));
    let mut shared = "l9.flatten().size() > 0".to_string();
    for i in (1..=9).rev() {
        let refs = vec![format!("l{}", i - 1); 10].join(", ");
        shared = format!("cel.bind(l{i}, [{refs}], {shared})");
    }
    let shared = format!("cel.bind(l0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], {shared})");
    let cases = [
        (
            "100 KiB expression",
            format!("device.driver == \"{}\"", "a".repeat(100 * 1024)),
        ),
        (
            "5000 nested parentheses",
            format!("{}true{}", "(".repeat(5000), ")".repeat(5000)),
        ),
        (
            "3000-term sum",
            format!("{} == 1", vec!["1"; 3000].join(" + ")),
        ),
        ("10^8 nested all()", nested_all),
        ("2^40-byte string by doubling", doubling),
        ("10^9 elements by shared sub-lists", shared),
        (
            "lists.range(2^63-1)",
            "size(lists.range(9223372036854775807)) > 0".to_string(),
        ),
    ];
    let compiler = SelectorCompiler::new(CelOptions::default());
    let device = devices().into_iter().next();
    for (name, expr) in cases {
        let start = Instant::now();
        let outcome = match compiler.compile(&expr) {
            Err(e) => format!("compile error: {e}"),
            Ok(s) => match device.as_ref().map(|d| s.matches(&view(d))) {
                Some(Err(e)) => format!("evaluation error: {e}"),
                other => format!("unexpected: {other:?}"),
            },
        };
        let first_line = outcome
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(100)
            .collect::<String>();
        println!(
            "hostile {name}: stopped after {:.1} ms ({first_line})",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}

criterion_group!(benches, report_hostile_bounds, bench_selectors);
criterion_main!(benches);
