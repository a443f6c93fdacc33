//! Every CEL selector of the allocator conformance corpus
//! (`shared/conformance/allocator/cases/*.json`, read from disk so new cases are picked
//! up) compiles and evaluates on every device of its case as the Go allocator's outcome
//! implies: compile errors and runtime errors with cel-go's exact text where Go failed,
//! no error other than a guarded "no such key" elsewhere.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use devicelet_cel::{CelOptions, DeviceView, SelectorCompiler};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use serde_json::Value as Json;

fn cases_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/allocator/cases")
}

fn collect_expressions(v: &Json, out: &mut Vec<String>) {
    match v {
        Json::Object(m) => {
            if let Some(Json::String(e)) = m.get("cel").and_then(|c| c.get("expression")) {
                out.push(e.clone());
            }
            for x in m.values() {
                collect_expressions(x, out);
            }
        }
        Json::Array(a) => a.iter().for_each(|x| collect_expressions(x, out)),
        _ => {}
    }
}

struct OwnedDevice {
    driver: String,
    attributes: BTreeMap<String, DeviceAttribute>,
    capacity: BTreeMap<String, DeviceCapacity>,
    allow_multiple_allocations: Option<bool>,
}

fn devices_of(case: &Json) -> Vec<OwnedDevice> {
    let mut out = Vec::new();
    for slice in case["resourceSlices"].as_array().into_iter().flatten() {
        let driver = slice["spec"]["driver"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            let attributes = match d.get("attributes") {
                Some(a) => serde_json::from_value(a.clone()).expect("attributes decode"),
                None => BTreeMap::new(),
            };
            let capacity = match d.get("capacity") {
                Some(c) => serde_json::from_value(c.clone()).expect("capacity decode"),
                None => BTreeMap::new(),
            };
            out.push(OwnedDevice {
                driver: driver.clone(),
                attributes,
                capacity,
                allow_multiple_allocations: d
                    .get("allowMultipleAllocations")
                    .and_then(Json::as_bool),
            });
        }
    }
    out
}

#[test]
fn conformance_corpus_selectors_compile_and_evaluate_like_go() {
    let dir = cases_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("conformance corpus {} not readable: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 198,
        "expected the whole corpus, found {} files",
        files.len()
    );

    let (
        mut expressions_seen,
        mut evaluations,
        mut compile_errors_checked,
        mut runtime_errors_checked,
    ) = (0, 0, 0, 0);
    for file in &files {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let case: Json = serde_json::from_str(&std::fs::read_to_string(file).expect("read case"))
            .expect("case JSON");
        let options = CelOptions {
            enable_consumable_capacity: case["cel"]["EnableConsumableCapacity"]
                .as_bool()
                .unwrap_or(false),
            enable_list_type_attributes: case["cel"]["EnableListTypeAttributes"]
                .as_bool()
                .unwrap_or(false),
            ..CelOptions::default()
        };
        let compiler = SelectorCompiler::new(options);
        let mut expressions = Vec::new();
        collect_expressions(&case["deviceClasses"], &mut expressions);
        collect_expressions(&case["claims"], &mut expressions);
        let devices = devices_of(&case);
        let expected_error = case["expect"]["perNode"][0]["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let compile_tail = expected_error
            .split_once("CEL compile error: ")
            .map(|(_, t)| t.to_string());
        let runtime_tail = expected_error
            .split_once("CEL runtime error: ")
            .map(|(_, t)| t.to_string());

        let mut saw_expected_runtime_error = false;
        for expr in &expressions {
            if expr.is_empty() {
                continue; // "CEL expression empty" is the allocator's own check.
            }
            expressions_seen += 1;
            let selector = match compiler.compile(expr) {
                Ok(s) => s,
                Err(e) => {
                    let tail = compile_tail
                        .as_deref()
                        .unwrap_or_else(|| panic!("{name}: {expr:?} failed to compile: {e}"));
                    assert_eq!(
                        e.to_string(),
                        tail,
                        "{name}: compile error text differs from Go"
                    );
                    compile_errors_checked += 1;
                    continue;
                }
            };
            for d in &devices {
                evaluations += 1;
                let view = DeviceView {
                    driver: &d.driver,
                    attributes: Some(&d.attributes),
                    capacity: Some(&d.capacity),
                    allow_multiple_allocations: d.allow_multiple_allocations,
                };
                if let Err(e) = selector.matches(&view) {
                    let text = e.to_string();
                    if runtime_tail.as_deref() == Some(text.as_str()) {
                        saw_expected_runtime_error = true;
                    } else {
                        assert!(
                            text.starts_with("no such key: "),
                            "{name}: {expr:?} on a {} device: unexpected error {text}",
                            d.driver
                        );
                    }
                }
            }
        }
        if runtime_tail.is_some() && !expressions.is_empty() && !devices.is_empty() {
            assert!(
                saw_expected_runtime_error,
                "{name}: Go's runtime error {expected_error:?} not reproduced"
            );
            runtime_errors_checked += 1;
        }
    }
    eprintln!(
        "{} cases, {expressions_seen} selector uses, {evaluations} evaluations, \
         {compile_errors_checked} compile errors and {runtime_errors_checked} runtime errors matched Go's text",
        files.len()
    );
    assert!(compile_errors_checked >= 2 && runtime_errors_checked >= 3);
}

#[test]
fn conformance_style_selectors_give_the_expected_results() {
    use common::*;
    let compiler = SelectorCompiler::new(CelOptions {
        enable_consumable_capacity: true,
        ..CelOptions::default()
    });
    let dev = TestDevice::new("driver-a")
        .attr("generation", string("v5"))
        .attr("special", boolean(true))
        .cap("memory", "4Gi")
        .cap("capacity-0", "3")
        .multi(Some(true));
    let view = dev.view();
    for (expr, want) in [
        (r#"device.driver == "driver-a""#, true),
        (r#"device.driver == "driver-b""#, false),
        (r#"device.attributes["driver-a"].generation == "v5""#, true),
        (r#"device.attributes["driver-a"].generation == "v6""#, false),
        (r#"device.attributes["driver-a"].special"#, true),
        (
            r#"device.capacity["driver-a"].memory.compareTo(quantity("4Gi")) >= 0"#,
            true,
        ),
        (
            r#"device.capacity["driver-a"].memory.compareTo(quantity("6Gi")) >= 0"#,
            false,
        ),
        (
            r#"device.capacity["driver-a"]["capacity-0"].compareTo(quantity("2")) >= 0"#,
            true,
        ),
        (
            r#"device.capacity["driver-a"]["capacity-0"].compareTo(quantity("4")) >= 0"#,
            false,
        ),
        (
            r#"device.driver == "driver-a" && device.allowMultipleAllocations == true"#,
            true,
        ),
        (
            r#"device.driver == "driver-a" && device.allowMultipleAllocations == false"#,
            false,
        ),
    ] {
        let s = compiler
            .compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert_eq!(s.matches(&view), Ok(want), "{expr}");
    }
}
