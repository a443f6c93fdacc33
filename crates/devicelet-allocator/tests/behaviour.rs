//! Behaviour tests for spec `structured-allocator.md` §2 and the upstream bugs of §7, each run
//! under the fixed semantics (default) and the Go-compatible profile (`compat: k8s-v1.36.1`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use devicelet_allocator::scenario::{
    AllocationOutcome, OutcomeKind, RunOptions, parse_scenario, render_outcome_table, run_scenario,
    run_scenario_with, search_limits,
};
use devicelet_allocator::{
    Clock, ErrorClass, SCHEDULER_FILTER_TIMEOUT, TIME_CHECK_INTERVAL, scenario::ScenarioError,
};

const HEADER: &str = r#"
apiVersion: dra-harness/v1alpha1
kind: AllocationScenario
name: test
features: {AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true, DeviceBindingAndStatus: true, ConsumableCapacity: true}
nodes:
- metadata: {name: node-1, labels: {region: r1}}
deviceClasses:
- metadata: {name: class-a}
  spec: {selectors: [{cel: {expression: 'device.driver == "driver-a"'}}]}
- metadata: {name: class-b}
  spec: {selectors: [{cel: {expression: 'device.driver == "driver-b"'}}]}
"#;

fn run(body: &str, compat: bool) -> AllocationOutcome {
    let semantics = if compat {
        "semantics: {variant: incubating, compat: k8s-v1.36.1}\n"
    } else {
        "semantics: {variant: incubating}\n"
    };
    let text = format!("{HEADER}{semantics}{body}");
    let s = parse_scenario(text.as_bytes())
        .unwrap_or_else(|e| panic!("bad test scenario: {e}\n{text}"));
    run_scenario(&s)
}

fn devices(o: &AllocationOutcome) -> Vec<Vec<String>> {
    let n = &o.per_node[0];
    assert_eq!(
        n.outcome,
        OutcomeKind::Allocated,
        "expected an allocation, got {:?}: {}",
        n.outcome,
        n.error
    );
    n.results
        .iter()
        .flatten()
        .map(|r| {
            r.devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|d| format!("{}/{}/{}", d.driver, d.pool, d.device))
                .collect()
        })
        .collect()
}

fn outcome(o: &AllocationOutcome) -> OutcomeKind {
    o.per_node[0].outcome
}

/// A pool whose counter set has 2 units; device-1 (tainted) and device-2 each consume 2.
const TAINT_COUNTER_LEAK: &str = r#"
resourceSlices:
- metadata: {name: counters}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    sharedCounters: [{name: set, counters: {units: {value: "2"}}}]
- metadata: {name: devices}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    devices:
    - name: device-1
      taints: [{key: broken, effect: NoSchedule}]
      consumesCounters: [{counterSet: set, counters: {units: {value: "2"}}}]
    - name: device-2
      consumesCounters: [{counterSet: set, counters: {units: {value: "2"}}}]
claims:
- metadata: {name: claim-0}
  spec: {devices: {requests: [{name: req-0, exactly: {deviceClassName: class-a}}]}}
"#;

#[test]
fn s7_21_taint_rejection_releases_counters_unless_go_compat() {
    assert_eq!(
        devices(&run(TAINT_COUNTER_LEAK, false)),
        vec![vec!["driver-a/pool-1/device-2"]]
    );
    // Upstream bug #140436: the tainted device's counters stay reserved, device-2 no longer fits.
    assert_eq!(
        outcome(&run(TAINT_COUNTER_LEAK, true)),
        OutcomeKind::Unschedulable
    );
}

#[test]
fn s7_21_constraint_rejection_releases_counters_unless_go_compat() {
    let body = r#"
resourceSlices:
- metadata: {name: other}
  spec:
    driver: driver-b
    nodeName: node-1
    pool: {name: pool-b, generation: 1, resourceSliceCount: 1}
    devices: [{name: x, attributes: {"dra.example.com/v": {int: 1}}}]
- metadata: {name: counters}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    sharedCounters: [{name: set, counters: {units: {value: "2"}}}]
- metadata: {name: devices}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    devices:
    - name: device-1
      attributes: {"dra.example.com/v": {int: 2}}
      consumesCounters: [{counterSet: set, counters: {units: {value: "2"}}}]
    - name: device-2
      attributes: {"dra.example.com/v": {int: 1}}
      consumesCounters: [{counterSet: set, counters: {units: {value: "2"}}}]
claims:
- metadata: {name: claim-0}
  spec:
    devices:
      requests:
      - {name: req-b, exactly: {deviceClassName: class-b}}
      - {name: req-a, exactly: {deviceClassName: class-a}}
      constraints: [{matchAttribute: dra.example.com/v}]
"#;
    assert_eq!(
        devices(&run(body, false)),
        vec![vec!["driver-b/pool-b/x", "driver-a/pool-1/device-2"]]
    );
    assert_eq!(outcome(&run(body, true)), OutcomeKind::Unschedulable);
}

#[test]
fn s7_23_counters_are_keyed_by_driver_and_pool_unless_go_compat() {
    let slices = |driver: &str| {
        format!(
            r#"
- metadata: {{name: {driver}-counters}}
  spec:
    driver: {driver}
    nodeName: node-1
    pool: {{name: pool, generation: 1, resourceSliceCount: 2}}
    sharedCounters: [{{name: set, counters: {{units: {{value: "1"}}}}}}]
- metadata: {{name: {driver}-devices}}
  spec:
    driver: {driver}
    nodeName: node-1
    pool: {{name: pool, generation: 1, resourceSliceCount: 2}}
    devices: [{{name: dev, consumesCounters: [{{counterSet: set, counters: {{units: {{value: "1"}}}}}}]}}]
"#
        )
    };
    let body = format!(
        "resourceSlices:{}{}claims:\n- metadata: {{name: claim-0}}\n  spec: {{devices: {{requests: [{{name: a, exactly: {{deviceClassName: class-a}}}}, {{name: b, exactly: {{deviceClassName: class-b}}}}]}}}}\n",
        slices("driver-a"),
        slices("driver-b")
    );
    assert_eq!(
        devices(&run(&body, false)),
        vec![vec!["driver-a/pool/dev", "driver-b/pool/dev"]]
    );
    // Upstream bug #140434: both pools share the counter state of pool name "pool".
    assert_eq!(outcome(&run(&body, true)), OutcomeKind::Unschedulable);
}

const DISTINCT_THREE: &str = r#"
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: d1, attributes: {color: {string: red}}}
    - {name: d2, attributes: {color: {string: blue}}}
    - {name: d3, attributes: {color: {string: red}}}
claims:
- metadata: {name: claim-0}
  spec:
    devices:
      requests: [{name: req-0, exactly: {deviceClassName: class-a, allocationMode: ExactCount, count: 3}}]
      constraints: [{distinctAttribute: driver-a/color}]
"#;

#[test]
fn s7_27_distinct_attribute_checks_every_device_unless_go_compat() {
    assert_eq!(
        outcome(&run(DISTINCT_THREE, false)),
        OutcomeKind::Unschedulable
    );
    // Upstream bug #140438: only the latest device of the request is compared.
    assert_eq!(
        devices(&run(DISTINCT_THREE, true)),
        vec![vec![
            "driver-a/pool-1/d1",
            "driver-a/pool-1/d2",
            "driver-a/pool-1/d3"
        ]]
    );
}

const TWO_DEVICES: &str = r#"
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices: [{name: d1}, {name: d2}]
"#;

#[test]
fn s2_10_admin_allocation_blocks_later_non_admin_claim_in_same_call() {
    let body = format!(
        "{TWO_DEVICES}claims:
- metadata: {{name: admin}}
  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: class-a, count: 2, adminAccess: true}}}}]}}}}
- metadata: {{name: user}}
  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: class-a}}}}]}}}}
"
    );
    for compat in [false, true] {
        assert_eq!(outcome(&run(&body, compat)), OutcomeKind::Unschedulable);
    }
    let reversed = format!(
        "{TWO_DEVICES}claims:
- metadata: {{name: user}}
  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: class-a}}}}]}}}}
- metadata: {{name: admin}}
  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: class-a, count: 2, adminAccess: true}}}}]}}}}
"
    );
    assert_eq!(
        devices(&run(&reversed, false)),
        vec![
            vec!["driver-a/pool-1/d1"],
            vec!["driver-a/pool-1/d1", "driver-a/pool-1/d2"]
        ]
    );
}

#[test]
fn s2_4_combinations_backtrack_across_requests_in_first_fit_order() {
    let body = r#"
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: small, attributes: {size: {int: 1}}}
    - {name: large, attributes: {size: {int: 2}}}
claims:
- metadata: {name: claim-0}
  spec:
    devices:
      requests:
      - {name: any, exactly: {deviceClassName: class-a}}
      - name: big
        exactly:
          deviceClassName: class-a
          selectors: [{cel: {expression: 'device.attributes["driver-a"].size >= 2'}}]
"#;
    assert_eq!(
        devices(&run(body, false)),
        vec![vec!["driver-a/pool-1/small", "driver-a/pool-1/large"]]
    );
}

#[test]
fn s2_5_cel_errors_are_raised_only_when_the_search_reaches_the_device() {
    // d2 has no "size" attribute: the selector errors on it, but d1 satisfies the claim first.
    let body = |count: u32| {
        format!(
            r#"
resourceSlices:
- metadata: {{name: s}}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {{name: pool-1, generation: 1, resourceSliceCount: 1}}
    devices: [{{name: d1, attributes: {{size: {{int: 1}}}}}}, {{name: d2}}]
claims:
- metadata: {{name: claim-0, namespace: ns}}
  spec:
    devices:
      requests:
      - name: r
        exactly:
          deviceClassName: class-a
          count: {count}
          selectors: [{{cel: {{expression: 'device.attributes["driver-a"].size > 0'}}}}]
"#
        )
    };
    assert_eq!(
        devices(&run(&body(1), false)),
        vec![vec!["driver-a/pool-1/d1"]]
    );
    let o = run(&body(2), false);
    assert_eq!(outcome(&o), OutcomeKind::Error);
    assert_eq!(o.per_node[0].error_class, Some(ErrorClass::CELRuntime));
    assert!(
        o.per_node[0]
            .error
            .starts_with("claim ns/claim-0: selector #0: CEL runtime error:"),
        "{}",
        o.per_node[0].error
    );
}

#[test]
fn s2_3_setup_errors_carry_go_texts() {
    let unknown = format!(
        "{TWO_DEVICES}claims:\n- metadata: {{name: c}}\n  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: nope}}}}]}}}}\n"
    );
    let o = run(&unknown, false);
    assert_eq!(o.per_node[0].error_class, Some(ErrorClass::UnknownClass));
    assert!(
        o.per_node[0]
            .error
            .starts_with("claim c, request r: could not retrieve device class nope")
    );
    let limit = format!(
        "{TWO_DEVICES}claims:\n- metadata: {{name: c}}\n  spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: class-a, count: 33}}}}]}}}}\n"
    );
    assert_eq!(
        run(&limit, true).per_node[0].error,
        "claim c: number of requested devices 33 exceeds the claim limit of 32"
    );
}

#[test]
fn s2_13_network_selectors_merge_into_one_term() {
    let body = r#"
resourceSlices:
- metadata: {name: net-1}
  spec:
    driver: driver-a
    nodeSelector: {nodeSelectorTerms: [{matchExpressions: [{key: region, operator: In, values: [r1]}]}]}
    pool: {name: net, generation: 1, resourceSliceCount: 1}
    devices: [{name: d1}, {name: d2}]
claims:
- metadata: {name: c}
  spec: {devices: {requests: [{name: r, exactly: {deviceClassName: class-a, count: 2}}]}}
"#;
    let o = run(body, false);
    let sel = o.per_node[0].results.as_ref().unwrap()[0]
        .node_selector
        .clone()
        .unwrap();
    assert_eq!(sel.node_selector_terms.len(), 1);
    assert_eq!(
        sel.node_selector_terms[0]
            .match_expressions
            .as_ref()
            .unwrap()
            .len(),
        1,
        "duplicates are dropped"
    );
}

#[test]
fn s2_9_shares_of_a_multi_allocatable_device_respect_capacity() {
    let body = r#"
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices:
    - name: shared
      allowMultipleAllocations: true
      capacity: {memory: {value: 10Gi, requestPolicy: {default: 1Gi, validRange: {min: 1Gi, step: 1Gi}}}}
claims:
- metadata: {name: c}
  spec:
    devices:
      requests:
      - {name: a, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 3500Mi}}}}
      - {name: b, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 6Gi}}}}
"#;
    let o = run(body, false);
    let r = &o.per_node[0].results.as_ref().unwrap()[0];
    let res = r.devices.as_ref().unwrap().results.as_ref().unwrap();
    assert_eq!(res.len(), 2);
    // 3500Mi rounds up to the next step: 4Gi; 4Gi + 6Gi fills the device exactly.
    assert_eq!(
        res[0].consumed_capacity.as_ref().unwrap()["memory"].0,
        "4Gi"
    );
    assert_eq!(
        res[1].consumed_capacity.as_ref().unwrap()["memory"].0,
        "6Gi"
    );
    assert_ne!(res[0].share_id, res[1].share_id);
    let over = body.replace("6Gi", "7Gi");
    assert_eq!(outcome(&run(&over, false)), OutcomeKind::Unschedulable);
}

#[test]
fn bad_input_malformed_scenarios_give_located_errors() {
    let e = parse_scenario(b"{\"name\": \"x\",\n \"nodes\": [}").unwrap_err();
    assert!(
        matches!(
            e,
            ScenarioError::Syntax {
                format: "JSON",
                line: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = parse_scenario(b"name: x\nnodes: [\n  - {metadata: {name: a}\n").unwrap_err();
    assert!(
        matches!(
            e,
            ScenarioError::Syntax {
                format: "YAML",
                line: 3..,
                ..
            }
        ),
        "{e}"
    );
    let e =
        parse_scenario(b"nodes: [{metadata: {name: n}}]\nresourceSlices: [{spec: {driver: 7}}]\n")
            .unwrap_err();
    assert!(e.to_string().starts_with("resourceSlices[0]:"), "{e}");
    let e = parse_scenario(
        b"deviceClasses: [{apiVersion: resource.k8s.io/v1beta1, metadata: {name: c}, spec: {}}]",
    )
    .unwrap_err();
    assert!(e.to_string().contains("unsupported apiVersion"), "{e}");
    let e = parse_scenario(
        b"claims: [{metadata: {name: c}, spec: {devices: {requests: [{name: r}]}}}]",
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown request type"), "{e}");
    let e = parse_scenario(b"semantics: {variant: experimental}").unwrap_err();
    assert!(matches!(e, ScenarioError::Unsupported(_)));
}

#[test]
fn bad_input_thousand_deep_first_available_is_bounded() {
    let mut subs = String::new();
    for i in 0..999 {
        subs.push_str(&format!(
            "        - {{name: s{i}, deviceClassName: class-b}}\n"
        ));
    }
    subs.push_str("        - {name: last, deviceClassName: class-a}\n");
    let body = format!(
        "{TWO_DEVICES}claims:\n- metadata: {{name: c}}\n  spec:\n    devices:\n      requests:\n      - name: r\n        firstAvailable:\n{subs}"
    );
    let start = Instant::now();
    let o = run(&body, false);
    assert!(start.elapsed() < Duration::from_secs(5));
    let r = &o.per_node[0].results.as_ref().unwrap()[0];
    assert_eq!(
        r.devices.as_ref().unwrap().results.as_ref().unwrap()[0].request,
        "r/last"
    );
}

fn exponential(devices: usize, count: usize, budget: Option<u64>) -> String {
    let devs: Vec<String> = (0..devices).map(|i| format!("{{name: d{i}}}")).collect();
    format!(
        r#"{}resourceSlices:
- metadata: {{name: s}}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {{name: pool-1, generation: 1, resourceSliceCount: 1}}
    devices: [{}]
claims:
- metadata: {{name: c}}
  spec:
    devices:
      requests:
      - {{name: many, exactly: {{deviceClassName: class-a, count: {count}}}}}
      - {{name: impossible, exactly: {{deviceClassName: class-b}}}}
"#,
        budget
            .map(|b| format!("stepBudget: {b}\n"))
            .unwrap_or_default(),
        devs.join(", ")
    )
}

#[test]
fn bad_input_exponential_search_stops_at_the_step_budget() {
    // C(40, 10) ≈ 8.5e8 combinations, each ending in an impossible request.
    let start = Instant::now();
    let o = run(&exponential(40, 10, Some(50_000)), false);
    let elapsed = start.elapsed();
    assert_eq!(outcome(&o), OutcomeKind::Timeout);
    assert_eq!(
        o.per_node[0].stats.unwrap().allocate_one_invocations,
        50_001
    );
    assert!(
        o.per_node[0].error.contains("step budget of 50000"),
        "{}",
        o.per_node[0].error
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    // Small instances finish exhaustively within the budget: C(6,3) leaves, then Unschedulable.
    assert_eq!(
        outcome(&run(&exponential(6, 3, Some(200_000)), false)),
        OutcomeKind::Unschedulable
    );
}

#[test]
fn bad_input_exponential_search_honours_the_deadline() {
    let body = format!(
        "timeoutSeconds: 0.2\n{}",
        exponential(40, 10, Some(u64::MAX))
    );
    let start = Instant::now();
    let o = run(&body, false);
    assert_eq!(outcome(&o), OutcomeKind::Timeout);
    assert_eq!(
        o.per_node[0].error,
        "filter operation aborted: context deadline exceeded"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn explain_counts_why_devices_do_not_fit() {
    let text = format!(
        r#"{HEADER}
allocated: {{state: {{devices: [{{driver: driver-a, pool: pool-1, device: d1}}]}}}}
resourceSlices:
- metadata: {{name: s}}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {{name: pool-1, generation: 1, resourceSliceCount: 1}}
    devices:
    - {{name: d1, attributes: {{color: {{string: red}}}}}}
    - {{name: d2, attributes: {{color: {{string: red}}}}, taints: [{{key: k, effect: NoExecute}}]}}
    - {{name: d3, attributes: {{color: {{string: blue}}}}}}
claims:
- metadata: {{name: c}}
  spec:
    devices:
      requests:
      - name: r
        exactly:
          deviceClassName: class-a
          selectors: [{{cel: {{expression: 'device.attributes["driver-a"].color == "red"'}}}}]
"#
    );
    let s = parse_scenario(text.as_bytes()).unwrap();
    let (o, ex) = run_scenario_with(
        &s,
        &RunOptions {
            explain: true,
            ..RunOptions::default()
        },
    );
    assert_eq!(outcome(&o), OutcomeKind::Unschedulable);
    let ex = ex.unwrap();
    let r = &ex.nodes[0].requests[0];
    assert_eq!((r.candidates, r.in_use, r.tainted, r.usable), (3, 1, 1, 0));
    assert_eq!(r.rejected_by_selector.len(), 1);
    assert_eq!(r.rejected_by_selector[0].rejected, 1);
    assert!(
        r.rejected_by_selector[0]
            .selector
            .starts_with("claim selector #0")
    );
    assert!(render_outcome_table(&o).contains("Unschedulable"));
    let text = devicelet_allocator::scenario::render_explanation_table(&ex);
    assert!(
        text.contains("1 in use") && text.contains("1 tainted"),
        "{text}"
    );
}

#[test]
fn s7_22_rolled_back_share_releases_counters_unless_go_compat() {
    // M (multi-allocatable) and P share a 2-unit counter; req-0 first takes M, req-1 cannot
    // match M's group, so req-0 falls back to P and req-1 takes Q.
    let body = r#"
resourceSlices:
- metadata: {name: counters}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    sharedCounters: [{name: set, counters: {units: {value: "2"}}}]
- metadata: {name: devices}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    devices:
    - name: m
      allowMultipleAllocations: true
      attributes: {group: {int: 1}}
      capacity: {memory: {value: 4Gi}}
      consumesCounters: [{counterSet: set, counters: {units: {value: "2"}}}]
    - name: p
      attributes: {group: {int: 2}}
      consumesCounters: [{counterSet: set, counters: {units: {value: "2"}}}]
    - name: q
      attributes: {group: {int: 2}}
claims:
- metadata: {name: claim-0}
  spec:
    devices:
      requests:
      - {name: req-0, exactly: {deviceClassName: class-a}}
      - {name: req-1, exactly: {deviceClassName: class-a}}
      constraints: [{matchAttribute: driver-a/group}]
"#;
    assert_eq!(
        devices(&run(body, false)),
        vec![vec!["driver-a/pool-1/p", "driver-a/pool-1/q"]]
    );
    // Upstream bug #140436: the share's 2 units stay reserved after its rollback.
    assert_eq!(outcome(&run(body, true)), OutcomeKind::Unschedulable);
}

/// A claim on class-a whose request carries one extra CEL selector.
fn claim_with_selector(expr: &str) -> String {
    format!(
        "{TWO_DEVICES}claims:\n- metadata: {{name: c, namespace: ns}}\n  spec:\n    devices:\n      requests:\n      - name: r\n        exactly:\n          deviceClassName: class-a\n          selectors: [{{cel: {{expression: '{expr}'}}}}]\n"
    )
}

#[test]
fn bad_input_malformed_cel_is_a_compile_error_for_the_claim() {
    for expr in [
        "device.driver ==",
        "device.attributes[",
        "1 +* 2",
        "device.nope",
    ] {
        let start = Instant::now();
        let o = run(&claim_with_selector(expr), false);
        assert!(start.elapsed() < Duration::from_secs(2), "{expr}");
        assert_eq!(outcome(&o), OutcomeKind::Error, "{expr}");
        assert_eq!(
            o.per_node[0].error_class,
            Some(ErrorClass::CELCompile),
            "{expr}"
        );
        assert!(
            o.per_node[0]
                .error
                .starts_with("claim ns/c: selector #0: CEL compile error:"),
            "{expr}: {}",
            o.per_node[0].error
        );
    }
}

#[test]
fn bad_input_selector_over_the_cost_limit_is_stopped_within_the_evaluation_bound() {
    // 10^8 iterations of nested all() if unchecked; the CEL cost limit (Kubernetes'
    // per-evaluation limit of 1 000 000) or the evaluation deadline stops it. Release builds
    // stop within milliseconds; the bound leaves room for unoptimised builds on a busy machine.
    let ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
    let mut expr = "a + b + c + d + e + f + g + h > 0".to_string();
    for v in ["h", "g", "f", "e", "d", "c", "b", "a"] {
        expr = format!("{ten}.all({v}, {expr})");
    }
    let start = Instant::now();
    let o = run(&claim_with_selector(&expr), false);
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert_eq!(outcome(&o), OutcomeKind::Error);
    let e = &o.per_node[0].error;
    assert!(
        e.starts_with("claim ns/c: selector #0: CEL ")
            && (e.contains("cost") || e.contains("interrupted")),
        "{e}"
    );
}

/// A clock that moves on by `tick` at every reading (the search reads it every
/// `TIME_CHECK_INTERVAL` steps), so time limits are tested without waiting and exactly.
#[derive(Debug)]
struct FakeClock {
    readings: AtomicU32,
    tick: Duration,
}

impl FakeClock {
    fn new(tick: Duration) -> Arc<Self> {
        Arc::new(FakeClock {
            readings: AtomicU32::new(0),
            tick,
        })
    }
    fn readings(&self) -> u32 {
        self.readings.load(Ordering::Relaxed)
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        self.tick * self.readings.fetch_add(1, Ordering::Relaxed)
    }
}

fn run_with_clock(body: &str, clock: &Arc<FakeClock>) -> AllocationOutcome {
    let text = format!("{HEADER}semantics: {{variant: incubating}}\n{body}");
    let s = parse_scenario(text.as_bytes()).unwrap_or_else(|e| panic!("bad test scenario: {e}"));
    let opts = RunOptions {
        clock: Some(Arc::clone(clock) as Arc<dyn Clock>),
        ..RunOptions::default()
    };
    run_scenario_with(&s, &opts).0
}

#[test]
fn bad_input_exponential_search_with_default_limits_gives_up_at_the_scheduler_filter_timeout() {
    // No stepBudget and no timeoutSeconds: the scheduler's 10 s Filter timeout bounds the
    // C(40, 10) search over equivalent devices. One second per clock reading: the search
    // starts at 0 s and gives up at the 10th check, after exactly 10 × 1024 steps.
    let clock = FakeClock::new(Duration::from_secs(1));
    let o = run_with_clock(&exponential(40, 10, None), &clock);
    assert_eq!(outcome(&o), OutcomeKind::Timeout);
    assert_eq!(
        o.per_node[0].error,
        "filter operation aborted: context deadline exceeded"
    );
    assert_eq!(SCHEDULER_FILTER_TIMEOUT, Duration::from_secs(10));
    assert_eq!(
        o.per_node[0].stats.unwrap().allocate_one_invocations,
        10 * TIME_CHECK_INTERVAL
    );
    assert_eq!(clock.readings(), 11);
    let s = parse_scenario(format!("{HEADER}{}", exponential(40, 10, None)).as_bytes()).unwrap();
    let limits = search_limits(&s, &RunOptions::default());
    assert_eq!(
        (limits.step_budget, limits.time_limit_seconds),
        (None, Some(10.0))
    );
    assert_eq!(
        limits.description,
        "time limit 10s (default: the scheduler's DRA Filter timeout) per allocation call"
    );
}

#[test]
fn a_scenario_time_limit_is_measured_by_the_injected_clock() {
    let clock = FakeClock::new(Duration::from_millis(100));
    let body = format!("timeoutSeconds: 2.5\n{}", exponential(40, 10, None));
    let o = run_with_clock(&body, &clock);
    assert_eq!(outcome(&o), OutcomeKind::Timeout);
    // 2.5 s at 100 ms per reading: the 25th check (step 25 × 1024) is the first at the limit.
    assert_eq!(
        o.per_node[0].stats.unwrap().allocate_one_invocations,
        25 * TIME_CHECK_INTERVAL
    );
    // A search that ends first never sees the limit.
    let quick = FakeClock::new(Duration::from_millis(100));
    let body = format!("timeoutSeconds: 2.5\n{}", exponential(6, 3, None));
    assert_eq!(
        outcome(&run_with_clock(&body, &quick)),
        OutcomeKind::Unschedulable
    );
}

#[test]
fn a_step_budget_alone_is_deterministic_and_reads_no_clock() {
    let clock = FakeClock::new(Duration::from_secs(3600));
    let o = run_with_clock(&exponential(40, 10, Some(50_000)), &clock);
    assert_eq!(outcome(&o), OutcomeKind::Timeout);
    assert_eq!(
        o.per_node[0].stats.unwrap().allocate_one_invocations,
        50_001
    );
    assert_eq!(
        clock.readings(),
        0,
        "no time limit with an explicit step budget"
    );
    // The run options override the scenario's limits (devicelet allocate --step-budget
    // --timeout); a clock standing still leaves the step budget to stop the search.
    let clock = FakeClock::new(Duration::ZERO);
    let s = parse_scenario(format!("{HEADER}{}", exponential(40, 10, Some(50_000))).as_bytes())
        .unwrap();
    let opts = RunOptions {
        step_budget: Some(20_000),
        time_limit: Some(Duration::from_secs(60)),
        clock: Some(Arc::clone(&clock) as Arc<dyn Clock>),
        ..RunOptions::default()
    };
    let o = run_scenario_with(&s, &opts).0;
    assert_eq!(
        o.per_node[0].stats.unwrap().allocate_one_invocations,
        20_001
    );
    assert_eq!(
        search_limits(&s, &opts).description,
        "time limit 60s (run options) and step budget 20000 search steps (run options) per allocation call"
    );
}

#[test]
fn a_deep_unsatisfiable_search_is_proved_unschedulable_past_the_old_step_budget() {
    // The shape of the random scenarios where devicelet used to answer Timeout at 2 000 000
    // steps while Go, searching on, proved Unschedulable (issue 19 item 4): C(26, 8) ≈ 1.6·10⁶
    // combinations, each ending in an impossible request. With the default limits (the
    // scheduler's 10 s; here a clock that never reaches it) devicelet searches to the end.
    let clock = FakeClock::new(Duration::ZERO);
    let o = run_with_clock(&exponential(26, 8, None), &clock);
    assert_eq!(
        outcome(&o),
        OutcomeKind::Unschedulable,
        "{:?}",
        o.per_node[0]
    );
    let steps = o.per_node[0].stats.unwrap().allocate_one_invocations;
    assert!(
        steps > devicelet_allocator::DEFAULT_STEP_BUDGET,
        "{steps} steps: the old budget would have answered Timeout"
    );
}

/// The per-node results (shareIDs included) of a run, without timings.
fn results_json(o: &AllocationOutcome) -> Vec<serde_json::Value> {
    o.per_node
        .iter()
        .map(|n| serde_json::json!({"outcome": n.outcome, "results": n.results}))
        .collect()
}

#[test]
fn share_ids_are_repeatable_with_a_seed_and_random_without() {
    // Three claims sharing one multi-allocatable device, two of them with two shares each.
    let body = r#"
semantics: {variant: incubating}
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices:
    - name: shared
      allowMultipleAllocations: true
      capacity: {memory: {value: 10Gi}}
claims:
- metadata: {name: c1}
  spec: {devices: {requests: [{name: a, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 1Gi}}}}, {name: b, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 1Gi}}}}]}}
- metadata: {name: c2}
  spec: {devices: {requests: [{name: a, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 1Gi}}}}]}}
- metadata: {name: c3}
  spec: {devices: {requests: [{name: a, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 1Gi}}}}, {name: b, exactly: {deviceClassName: class-a, capacity: {requests: {memory: 1Gi}}}}]}}
"#;
    let s = parse_scenario(format!("{HEADER}{body}").as_bytes()).unwrap();
    let seeded = |seed| {
        let opts = RunOptions {
            share_id_seed: Some(seed),
            ..RunOptions::default()
        };
        results_json(&run_scenario_with(&s, &opts).0)
    };
    let share_ids = |r: &[serde_json::Value]| -> Vec<String> {
        let mut ids = Vec::new();
        for claim in r[0]["results"].as_array().unwrap() {
            for d in claim["devices"]["results"].as_array().unwrap() {
                ids.push(d["shareID"].as_str().unwrap().to_string());
            }
        }
        ids
    };
    let first = seeded(7);
    assert_eq!(first, seeded(7), "same seed, same outcome");
    let ids = share_ids(&first);
    assert_eq!(ids.len(), 5);
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "shareIDs are distinct: {ids:?}");
    for id in &ids {
        let u = uuid::Uuid::parse_str(id).unwrap();
        assert_eq!(u.get_version_num(), 4, "{id}");
    }
    assert_ne!(ids, share_ids(&seeded(8)), "another seed, other shareIDs");
    // Without a seed the shareIDs are random, like Go's.
    let random = |_| results_json(&run_scenario(&s));
    assert_ne!(share_ids(&random(0)), share_ids(&random(1)));
}

#[test]
fn printed_results_omit_empty_fields_like_go() {
    // Zero values copied from the inputs: a toleration with empty key and effect, an empty
    // toleration list, empty binding conditions, a claim config with no requests and a node
    // selector requirement without values. Go's `omitempty` drops them all (issue 19 item 3:
    // devicelet printed `"effect": ""` where Go prints nothing).
    let body = r#"
semantics: {variant: incubating}
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeSelector: {nodeSelectorTerms: [{matchExpressions: [{key: region, operator: Exists, values: []}]}]}
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: d0, bindingConditions: [], bindingFailureConditions: []}
    - {name: d1}
claims:
- metadata: {name: c}
  spec:
    devices:
      requests:
      - {name: a, exactly: {deviceClassName: class-a, tolerations: [{key: "", operator: Exists, effect: "", value: ""}]}}
      - {name: b, exactly: {deviceClassName: class-a, tolerations: []}}
      config:
      - {requests: [], opaque: {driver: driver-a, parameters: {x: 1}}}
"#;
    let s = parse_scenario(format!("{HEADER}{body}").as_bytes()).unwrap();
    let o = run_scenario(&s);
    assert_eq!(outcome(&o), OutcomeKind::Allocated, "{o:?}");
    let printed = serde_json::to_value(&o).unwrap();
    let results = &printed["perNode"][0]["results"];
    assert_eq!(
        results,
        &serde_json::json!([{
            "devices": {
                "results": [
                    {"request": "a", "driver": "driver-a", "pool": "pool-1", "device": "d0",
                     "tolerations": [{"operator": "Exists"}]},
                    {"request": "b", "driver": "driver-a", "pool": "pool-1", "device": "d1"},
                ],
                "config": [{"source": "FromClaim", "opaque": {"driver": "driver-a", "parameters": {"x": 1}}}],
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "region", "operator": "Exists"}]}]},
        }])
    );
}

/// Two physical GPUs of 4 memory units, each offered whole (`gpu-N`, all 4 units) and as two
/// halves (`gpu-N-a`, `gpu-N-b`, 2 units each), in slice order gpu-0 first. One half of gpu-1
/// is allocated already.
const TWO_PARTITIONED_GPUS: &str = r#"
resourceSlices:
- metadata: {name: counters}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    sharedCounters:
    - {name: gpu-0, counters: {memory: {value: "4"}}}
    - {name: gpu-1, counters: {memory: {value: "4"}}}
- metadata: {name: gpus}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 2}
    devices:
    - {name: gpu-0, attributes: {size: {string: whole}}, consumesCounters: [{counterSet: gpu-0, counters: {memory: {value: "4"}}}]}
    - {name: gpu-0-a, attributes: {size: {string: half}}, consumesCounters: [{counterSet: gpu-0, counters: {memory: {value: "2"}}}]}
    - {name: gpu-0-b, attributes: {size: {string: half}}, consumesCounters: [{counterSet: gpu-0, counters: {memory: {value: "2"}}}]}
    - {name: gpu-1, attributes: {size: {string: whole}}, consumesCounters: [{counterSet: gpu-1, counters: {memory: {value: "4"}}}]}
    - {name: gpu-1-a, attributes: {size: {string: half}}, consumesCounters: [{counterSet: gpu-1, counters: {memory: {value: "2"}}}]}
    - {name: gpu-1-b, attributes: {size: {string: half}}, consumesCounters: [{counterSet: gpu-1, counters: {memory: {value: "2"}}}]}
allocated:
  claims:
  - metadata: {name: earlier, uid: earlier}
    spec: {devices: {requests: [{name: half, exactly: {deviceClassName: class-a}}]}}
    status:
      allocation:
        devices:
          results: [{request: half, driver: driver-a, pool: pool-1, device: gpu-1-a}]
claims:
- metadata: {name: small}
  spec:
    devices:
      requests:
      - name: half
        exactly:
          deviceClassName: class-a
          selectors: [{cel: {expression: 'device.attributes["driver-a"].size == "half"'}}]
"#;

#[test]
fn packing_takes_the_partition_of_a_gpu_in_use_and_keeps_a_whole_gpu_free() {
    // Upstream's order: the first half in slice order breaks gpu-0, the only whole GPU left.
    let o = run(TWO_PARTITIONED_GPUS, false);
    assert_eq!(
        devices(&o),
        vec![vec!["driver-a/pool-1/gpu-0-a".to_owned()]]
    );
    // Packing: gpu-1's free half, so gpu-0 stays whole.
    let o = run(
        &format!("packPartitions: true\n{TWO_PARTITIONED_GPUS}"),
        false,
    );
    assert_eq!(
        devices(&o),
        vec![vec!["driver-a/pool-1/gpu-1-b".to_owned()]]
    );
    // Two halves at once: gpu-1's one, then the first of the rest.
    let two = TWO_PARTITIONED_GPUS.replace(
        "exactly:\n          deviceClassName: class-a\n",
        "exactly:\n          deviceClassName: class-a\n          count: 2\n",
    );
    let o = run(&format!("packPartitions: true\n{two}"), false);
    assert_eq!(
        devices(&o),
        vec![vec![
            "driver-a/pool-1/gpu-1-b".to_owned(),
            "driver-a/pool-1/gpu-0-a".to_owned()
        ]]
    );
    // A request only the untouched GPU's whole device serves still fits.
    let whole = TWO_PARTITIONED_GPUS.replace("size == \"half\"", "size == \"whole\"");
    let o = run(&format!("packPartitions: true\n{whole}"), false);
    assert_eq!(devices(&o), vec![vec!["driver-a/pool-1/gpu-0".to_owned()]]);
}
