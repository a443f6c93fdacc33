//! Table tests for spec §4.3–§4.5, named after the upstream cases in `tm/policy_test.go`
//! (`commonPolicyMergeTestCases`, best-effort `mergeTestCases`, `mergeTestCasesNoPolicies`,
//! `mergeTestCasesClosestNUMA`, single-numa-node `mergeTestCases`) and `TestMaxOfMinAffinityCounts`.
//! Every case runs through the fast merge, the policy object and the literal reference.

use devicelet_topology::merge::{
    HintList, Pick, TieBreak, compare, filter_single_numa, max_of_min_affinity_counts,
};
use devicelet_topology::reference;
use devicelet_topology::{
    NumaMask, Policy, PolicyName, PolicyOptions, ProviderHints, ResourceHints, TopologyHint,
};

fn mask(nodes: &[usize]) -> NumaMask {
    NumaMask::from_nodes(nodes.iter().copied()).expect("test ids are in range")
}

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint::new(mask(nodes), preferred)
}

fn nil(preferred: bool) -> TopologyHint {
    TopologyHint::any(preferred)
}

/// One provider answering for one resource.
fn p(resource: &str, hints: Vec<TopologyHint>) -> ProviderHints {
    ProviderHints::from([(resource.to_string(), ResourceHints::Hints(hints))])
}

fn silent() -> ProviderHints {
    ProviderHints::new()
}

struct Case {
    name: &'static str,
    providers: Vec<ProviderHints>,
    expected: TopologyHint,
}

fn case(name: &'static str, providers: Vec<ProviderHints>, expected: TopologyHint) -> Case {
    Case {
        name,
        providers,
        expected,
    }
}

fn common_cases() -> Vec<Case> {
    vec![
        case(
            "Two providers, 1 hint each, same mask, both preferred 1/2",
            vec![
                p("resource1", vec![h(&[0], true)]),
                p("resource2", vec![h(&[0], true)]),
            ],
            h(&[0], true),
        ),
        case(
            "Two providers, 1 hint each, same mask, both preferred 2/2",
            vec![
                p("resource1", vec![h(&[1], true)]),
                p("resource2", vec![h(&[1], true)]),
            ],
            h(&[1], true),
        ),
        case(
            "Two providers, 1 no hints, 1 single hint preferred 1/2",
            vec![silent(), p("resource", vec![h(&[0], true)])],
            h(&[0], true),
        ),
        case(
            "Two providers, 1 no hints, 1 single hint preferred 2/2",
            vec![silent(), p("resource", vec![h(&[1], true)])],
            h(&[1], true),
        ),
        case(
            "Two providers, 1 with 2 hints, 1 with single hint matching 1/2",
            vec![
                p("resource1", vec![h(&[0], true), h(&[1], true)]),
                p("resource2", vec![h(&[0], true)]),
            ],
            h(&[0], true),
        ),
        case(
            "Two providers, 1 with 2 hints, 1 with single hint matching 2/2",
            vec![
                p("resource1", vec![h(&[0], true), h(&[1], true)]),
                p("resource2", vec![h(&[1], true)]),
            ],
            h(&[1], true),
        ),
        case(
            "Two providers, both with 2 hints, matching narrower preferred hint from both",
            vec![
                p("resource1", vec![h(&[0], true), h(&[1], true)]),
                p("resource2", vec![h(&[0], true), h(&[0, 1], false)]),
            ],
            h(&[0], true),
        ),
        case(
            "Ensure less narrow preferred hints are chosen over narrower non-preferred hints",
            vec![
                p("resource1", vec![h(&[1], true), h(&[0, 1], false)]),
                p(
                    "resource2",
                    vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)],
                ),
            ],
            h(&[1], true),
        ),
        case(
            "Multiple resources, same provider",
            vec![ProviderHints::from([
                (
                    "resource1".to_string(),
                    ResourceHints::Hints(vec![h(&[1], true), h(&[0, 1], false)]),
                ),
                (
                    "resource2".to_string(),
                    ResourceHints::Hints(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
            ])],
            h(&[1], true),
        ),
    ]
}

fn best_effort_cases(default: NumaMask) -> Vec<Case> {
    let d = |preferred| TopologyHint::new(default, preferred);
    let wide = || h(&[0, 1, 2, 3], false);
    vec![
        case(
            "Two providers, 2 hints each, same mask (some with different bits), same preferred",
            vec![
                p("resource1", vec![h(&[0, 1], true), h(&[0, 2], true)]),
                p("resource2", vec![h(&[0, 1], true), h(&[0, 2], true)]),
            ],
            h(&[0, 1], true),
        ),
        case("TopologyHint not set", vec![], d(true)),
        case(
            "HintProvider returns empty non-nil map[string][]TopologyHint",
            vec![silent()],
            d(true),
        ),
        case(
            "HintProvider returns -nil map[string][]TopologyHint from provider",
            vec![ProviderHints::from([(
                "resource".to_string(),
                ResourceHints::NoPreference,
            )])],
            d(true),
        ),
        case(
            "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
            vec![p("resource", vec![])],
            d(false),
        ),
        case(
            "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
            vec![p("resource", vec![nil(true)])],
            d(true),
        ),
        case(
            "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
            vec![p("resource", vec![nil(false)])],
            d(false),
        ),
        case(
            "Two providers, 1 hint each, no common mask",
            vec![
                p("resource1", vec![h(&[0], true)]),
                p("resource2", vec![h(&[1], true)]),
            ],
            d(false),
        ),
        case(
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
            vec![
                p("resource1", vec![h(&[0], true)]),
                p("resource2", vec![h(&[0], false)]),
            ],
            h(&[0], false),
        ),
        case(
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
            vec![
                p("resource1", vec![h(&[1], true)]),
                p("resource2", vec![h(&[1], false)]),
            ],
            h(&[1], false),
        ),
        case(
            "Two providers, 1 hint each, 1 wider mask, both preferred 1/2",
            vec![
                p("resource1", vec![h(&[0], true)]),
                p("resource2", vec![h(&[0, 1], true)]),
            ],
            h(&[0], false),
        ),
        case(
            "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
            vec![
                p("resource1", vec![h(&[0], true), h(&[1], true)]),
                p("resource2", vec![h(&[0, 1], false)]),
            ],
            h(&[0], false),
        ),
        case(
            "Two providers, 1 hint each, 1 wider mask, both preferred 2/2",
            vec![
                p("resource1", vec![h(&[1], true)]),
                p("resource2", vec![h(&[0, 1], true)]),
            ],
            h(&[1], false),
        ),
        case(
            "bestNonPreferredAffinityCount (1)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p("resource2", vec![h(&[0, 1], false)]),
            ],
            h(&[0, 1], false),
        ),
        case(
            "bestNonPreferredAffinityCount (2)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p("resource2", vec![h(&[0, 3], false)]),
            ],
            h(&[0, 3], false),
        ),
        case(
            "bestNonPreferredAffinityCount (3)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p("resource2", vec![h(&[1, 2], false)]),
            ],
            h(&[1, 2], false),
        ),
        case(
            "bestNonPreferredAffinityCount (4)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p("resource2", vec![h(&[2, 3], false)]),
            ],
            h(&[2, 3], false),
        ),
    ]
}

/// `mergeTestCasesNoPolicies`: only without prefer-closest-numa-nodes.
fn narrowest_only_cases() -> Vec<Case> {
    let wide = || h(&[0, 1, 2, 3], false);
    vec![
        case(
            "bestNonPreferredAffinityCount (5)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p("resource2", vec![h(&[1, 2], false), h(&[2, 3], false)]),
            ],
            h(&[1, 2], false),
        ),
        case(
            "bestNonPreferredAffinityCount (6)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p(
                    "resource2",
                    vec![
                        h(&[1, 2, 3], false),
                        h(&[1, 2], false),
                        h(&[1, 3], false),
                        h(&[2, 3], false),
                    ],
                ),
            ],
            h(&[1, 2], false),
        ),
    ]
}

/// 8 nodes; 0-1, 0-2 and 2-3 are close (0-1 closest of node 0), everything else far.
fn closest_distances() -> Vec<Vec<u32>> {
    let mut d = vec![vec![20u32; 8]; 8];
    for (i, row) in d.iter_mut().enumerate() {
        row[i] = 10;
    }
    for (a, b, v) in [(0, 1, 11), (0, 2, 12), (2, 3, 11)] {
        d[a][b] = v;
        d[b][a] = v;
    }
    d
}

/// `mergeTestCasesClosestNUMA`.
fn closest_cases() -> Vec<Case> {
    let wide = || h(&[0, 1, 2, 3], false);
    vec![
        case(
            "Two providers, 2 hints each, same mask (some with different bits), same preferred",
            vec![
                p("resource1", vec![h(&[0, 4], true), h(&[0, 2], true)]),
                p("resource2", vec![h(&[0, 4], true), h(&[0, 2], true)]),
            ],
            h(&[0, 2], true),
        ),
        case(
            "Two providers, 2 hints each, different mask",
            vec![
                p("resource1", vec![h(&[4], true), h(&[0, 2], true)]),
                p("resource2", vec![h(&[4], true), h(&[0, 2], true)]),
            ],
            h(&[4], true),
        ),
        case(
            "bestNonPreferredAffinityCount (5)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p("resource2", vec![h(&[1, 2], false), h(&[2, 3], false)]),
            ],
            h(&[2, 3], false),
        ),
        case(
            "bestNonPreferredAffinityCount (6)",
            vec![
                p("resource1", vec![wide(), h(&[0, 1], false)]),
                p(
                    "resource2",
                    vec![
                        h(&[1, 2, 3], false),
                        h(&[1, 2], false),
                        h(&[1, 3], false),
                        h(&[2, 3], false),
                    ],
                ),
            ],
            h(&[2, 3], false),
        ),
    ]
}

fn single_numa_cases() -> Vec<Case> {
    vec![
        case("TopologyHint not set", vec![], nil(true)),
        case(
            "HintProvider returns empty non-nil map[string][]TopologyHint",
            vec![silent()],
            nil(true),
        ),
        case(
            "HintProvider returns -nil map[string][]TopologyHint from provider",
            vec![ProviderHints::from([(
                "resource".to_string(),
                ResourceHints::NoPreference,
            )])],
            nil(true),
        ),
        case(
            "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
            vec![p("resource", vec![])],
            nil(false),
        ),
        case(
            "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
            vec![p("resource", vec![nil(true)])],
            nil(true),
        ),
        case(
            "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
            vec![p("resource", vec![nil(false)])],
            nil(false),
        ),
        case(
            "Two providers, 1 hint each, no common mask",
            vec![
                p("resource1", vec![h(&[0], true)]),
                p("resource2", vec![h(&[1], true)]),
            ],
            nil(false),
        ),
        case(
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
            vec![
                p("resource1", vec![h(&[0], true)]),
                p("resource2", vec![h(&[0], false)]),
            ],
            nil(false),
        ),
        case(
            "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
            vec![
                p("resource1", vec![h(&[1], true)]),
                p("resource2", vec![h(&[1], false)]),
            ],
            nil(false),
        ),
        case(
            "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
            vec![
                p("resource1", vec![h(&[0], true), h(&[1], true)]),
                p("resource2", vec![h(&[0, 1], false)]),
            ],
            nil(false),
        ),
        case(
            "Single NUMA hint generation",
            vec![ProviderHints::from([
                (
                    "resource1".to_string(),
                    ResourceHints::Hints(vec![h(&[0, 1], true)]),
                ),
                (
                    "resource2".to_string(),
                    ResourceHints::Hints(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ),
            ])],
            nil(false),
        ),
        case(
            "One no-preference provider",
            vec![
                p(
                    "resource1",
                    vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)],
                ),
                silent(),
            ],
            h(&[0], true),
        ),
    ]
}

fn policy(name: PolicyName, nodes: usize, closest: bool) -> Policy {
    let options = PolicyOptions {
        prefer_closest_numa_nodes: closest,
        ..PolicyOptions::default()
    };
    let default = NumaMask::from_bits((1u64 << nodes) - 1);
    Policy::new(name, options, default, closest.then(closest_distances)).expect("valid policy")
}

fn run(name: PolicyName, nodes: usize, closest: bool, cases: Vec<Case>) {
    let pol = policy(name, nodes, closest);
    let default = pol.default_mask();
    let d = closest_distances();
    let tie = if closest {
        TieBreak::Closest(&d)
    } else {
        TieBreak::Narrowest
    };
    for c in cases {
        let (got, admit) = pol.merge(&c.providers);
        assert_eq!(got, c.expected, "{:?}: {}", name, c.name);
        let literal = match name {
            PolicyName::SingleNumaNode => reference::merge_single_numa_node(&c.providers, default),
            _ => reference::merge_providers(&c.providers, default, tie),
        };
        assert_eq!(
            literal, c.expected,
            "reference disagrees with upstream on {:?}: {}",
            name, c.name
        );
        match name {
            PolicyName::BestEffort => assert!(admit, "best-effort always admits: {}", c.name),
            _ => assert_eq!(
                admit, c.expected.preferred,
                "admission follows preferred: {}",
                c.name
            ),
        }
    }
}

#[test]
fn policy_best_effort_merge() {
    let default = mask(&[0, 1, 2, 3]);
    let mut cases = common_cases();
    cases.extend(best_effort_cases(default));
    cases.extend(narrowest_only_cases());
    assert_eq!(cases.len(), 28);
    run(PolicyName::BestEffort, 4, false, cases);
}

#[test]
fn policy_restricted_merge() {
    let default = mask(&[0, 1, 2, 3]);
    let mut cases = common_cases();
    cases.extend(best_effort_cases(default));
    cases.extend(narrowest_only_cases());
    run(PolicyName::Restricted, 4, false, cases);
}

#[test]
fn policy_best_effort_merge_closest_numa() {
    let default = NumaMask::from_bits(0xff);
    let mut cases = common_cases();
    cases.extend(best_effort_cases(default));
    cases.extend(closest_cases());
    assert_eq!(cases.len(), 30);
    run(PolicyName::BestEffort, 8, true, cases);
}

#[test]
fn policy_restricted_merge_closest_numa() {
    let default = NumaMask::from_bits(0xff);
    let mut cases = common_cases();
    cases.extend(best_effort_cases(default));
    cases.extend(closest_cases());
    run(PolicyName::Restricted, 8, true, cases);
}

#[test]
fn policy_single_numa_node_merge() {
    let mut cases: Vec<Case> = common_cases();
    cases.extend(single_numa_cases());
    assert_eq!(cases.len(), 21);
    run(PolicyName::SingleNumaNode, 4, false, cases);
}

#[test]
fn policy_single_numa_node_ignores_prefer_closest() {
    // Closest would pick {2,3}; single-numa-node never uses it and only keeps single nodes.
    let pol = policy(PolicyName::SingleNumaNode, 8, true);
    let providers = vec![
        p("r1", vec![h(&[2], true), h(&[0], true)]),
        p("r2", vec![h(&[0], true), h(&[2], true)]),
    ];
    assert_eq!(pol.merge(&providers), (h(&[0], true), true));
}

#[test]
fn policy_single_numa_node_on_one_node_machine_gives_nil() {
    // The only node is the default mask, which single-numa-node reports as nil.
    let pol = policy(PolicyName::SingleNumaNode, 1, false);
    assert_eq!(pol.merge(&[p("r", vec![h(&[0], true)])]), (nil(true), true));
}

#[test]
fn policy_none_merge() {
    let pol = policy(PolicyName::None, 4, false);
    for providers in [
        vec![],
        vec![p("r", vec![h(&[0], true)])],
        vec![p("r", vec![])],
    ] {
        assert_eq!(
            pol.merge(&providers),
            (nil(false), true),
            "none admits with {{nil,false}}"
        );
    }
}

#[test]
fn max_of_min_affinity_counts_table() {
    let e = |h: Vec<TopologyHint>| HintList::Explicit(h);
    let t = true;
    let cases: Vec<(Vec<HintList<'static>>, usize)> = vec![
        (vec![], 0),
        (vec![e(vec![TopologyHint::new(NumaMask::EMPTY, t)])], 0),
        (vec![e(vec![h(&[0], t)])], 1),
        (vec![e(vec![h(&[0, 1], t)])], 2),
        (vec![e(vec![h(&[0, 1], t), h(&[0, 1, 2], t)])], 2),
        (
            vec![
                e(vec![h(&[0, 1], t), h(&[0, 1, 2], t)]),
                e(vec![h(&[0, 1, 2], t)]),
            ],
            3,
        ),
        (
            vec![
                e(vec![h(&[0, 1], t), h(&[0, 1, 2], t)]),
                e(vec![h(&[0, 1, 2], t), h(&[0, 1, 2, 3], t)]),
            ],
            3,
        ),
    ];
    for (i, (lists, expected)) in cases.into_iter().enumerate() {
        assert_eq!(max_of_min_affinity_counts(&lists), expected, "case {i}");
    }
}

#[test]
fn policy_options_and_names_parse_like_the_kubelet() {
    use devicelet_topology::{ConfigError, ScopeName};
    use std::collections::BTreeMap;
    let opts = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        PolicyOptions::parse(&opts(&[])),
        Ok(PolicyOptions::default())
    );
    for v in ["1", "t", "T", "TRUE", "true", "True"] {
        let o =
            PolicyOptions::parse(&opts(&[("prefer-closest-numa-nodes", v)])).expect("valid bool");
        assert!(o.prefer_closest_numa_nodes, "{v}");
    }
    for v in ["0", "f", "F", "FALSE", "false", "False"] {
        let o =
            PolicyOptions::parse(&opts(&[("prefer-closest-numa-nodes", v)])).expect("valid bool");
        assert!(!o.prefer_closest_numa_nodes, "{v}");
    }
    let err =
        PolicyOptions::parse(&opts(&[("prefer-closest-numa-nodes", "yes")])).expect_err("bad bool");
    assert_eq!(
        err.to_string(),
        "bad value for option \"prefer-closest-numa-nodes\": strconv.ParseBool: parsing \"yes\": invalid syntax"
    );
    let err =
        PolicyOptions::parse(&opts(&[("max-allowable-numa-nodes", "many")])).expect_err("bad int");
    assert!(
        err.to_string()
            .starts_with("unable to convert policy option to integer \"max-allowable-numa-nodes\"")
    );
    assert_eq!(
        PolicyOptions::parse(&opts(&[("max-allowable-numa-nodes", "7")])),
        Err(ConfigError::MaxNumaNodesTooSmall)
    );
    assert_eq!(
        ConfigError::MaxNumaNodesTooSmall.to_string(),
        "the minimum value of \"max-allowable-numa-nodes\" should not be less than 8"
    );
    let o = PolicyOptions::parse(&opts(&[("max-allowable-numa-nodes", "64")])).expect("valid");
    assert_eq!(o.max_allowable_numa_nodes, 64);
    let err = PolicyOptions::parse(&opts(&[("fancy", "1")])).expect_err("unknown option");
    assert_eq!(
        err.to_string(),
        "unknown Topology Manager Policy option: \"fancy\""
    );
    assert_eq!(
        "bogus"
            .parse::<PolicyName>()
            .expect_err("unknown")
            .to_string(),
        "unknown policy: \"bogus\""
    );
    assert_eq!(
        "node"
            .parse::<ScopeName>()
            .expect_err("unknown")
            .to_string(),
        "unknown scope: \"node\""
    );
    assert_eq!(
        "single-numa-node".parse::<PolicyName>(),
        Ok(PolicyName::SingleNumaNode)
    );
    assert_eq!(
        "best-effort".parse::<PolicyName>(),
        Ok(PolicyName::BestEffort)
    );
    assert_eq!("pod".parse::<ScopeName>(), Ok(ScopeName::Pod));
}

/// One `TestCompareHintsNarrowest` row: B, current (None = no hint yet), candidate, and
/// whether the candidate replaces the current hint.
type CompareRow = (
    &'static str,
    usize,
    Option<TopologyHint>,
    TopologyHint,
    Pick,
);

fn empty(preferred: bool) -> TopologyHint {
    TopologyHint::new(NumaMask::EMPTY, preferred)
}

/// `TestCompareHintsNarrowest` (`tm/policy_test.go`): every branch of `HintMerger.compare`
/// under Narrowest. Upstream passes B = -1 where it plays no part; 0 here (B is unsigned and
/// only read when both hints are non-preferred).
fn compare_hints_narrowest_rows() -> Vec<CompareRow> {
    use Pick::{Candidate, Current};
    let (t, f) = (true, false);
    vec![
        (
            "candidate.NUMANodeAffinity.Count() == 0 (1)",
            0,
            None,
            empty(f),
            Current,
        ),
        (
            "candidate.NUMANodeAffinity.Count() == 0 (2)",
            0,
            Some(empty(t)),
            empty(f),
            Current,
        ),
        ("current == nil (1)", 0, None, h(&[0], t), Candidate),
        ("current == nil (2)", 0, None, h(&[0], f), Candidate),
        (
            "!current.Preferred && candidate.Preferred",
            0,
            Some(h(&[0], f)),
            h(&[0], t),
            Candidate,
        ),
        (
            "current.Preferred && !candidate.Preferred",
            0,
            Some(h(&[0], t)),
            h(&[0], f),
            Current,
        ),
        (
            "current.Preferred && candidate.Preferred (1)",
            0,
            Some(h(&[0], t)),
            h(&[0], t),
            Current,
        ),
        (
            "current.Preferred && candidate.Preferred (2)",
            0,
            Some(h(&[0, 1], t)),
            h(&[0], t),
            Candidate,
        ),
        (
            "current.Preferred && candidate.Preferred (3)",
            0,
            Some(h(&[0], t)),
            h(&[0, 1], t),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (1.1)",
            1,
            Some(h(&[0, 1], f)),
            h(&[0, 1], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (1.2)",
            1,
            Some(h(&[1, 2], f)),
            h(&[0, 1], f),
            Candidate,
        ),
        (
            "!current.Preferred && !candidate.Preferred (1.3)",
            1,
            Some(h(&[0, 1], f)),
            h(&[1, 2], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (2.1)",
            2,
            Some(h(&[0, 1], f)),
            h(&[0], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (2.2)",
            2,
            Some(h(&[0, 1], f)),
            h(&[0, 1], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (2.3)",
            2,
            Some(h(&[1, 2], f)),
            h(&[0, 1], f),
            Candidate,
        ),
        (
            "!current.Preferred && !candidate.Preferred (2.4)",
            2,
            Some(h(&[0, 1], f)),
            h(&[1, 2], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3a)",
            2,
            Some(h(&[0], f)),
            h(&[0, 1, 2], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3b)",
            2,
            Some(h(&[0], f)),
            h(&[0, 1], f),
            Candidate,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3ca.1)",
            3,
            Some(h(&[0], f)),
            h(&[0, 1], f),
            Candidate,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3ca.2)",
            3,
            Some(h(&[0], f)),
            h(&[1, 2], f),
            Candidate,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3ca.3)",
            4,
            Some(h(&[0, 1], f)),
            h(&[1, 2, 3], f),
            Candidate,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3cb)",
            4,
            Some(h(&[1, 2, 3], f)),
            h(&[0, 1], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3cc.1)",
            4,
            Some(h(&[0, 1, 2], f)),
            h(&[0, 1, 2], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3cc.2)",
            4,
            Some(h(&[0, 1, 2], f)),
            h(&[1, 2, 3], f),
            Current,
        ),
        (
            "!current.Preferred && !candidate.Preferred (3cc.3)",
            4,
            Some(h(&[1, 2, 3], f)),
            h(&[0, 1, 2], f),
            Candidate,
        ),
    ]
}

/// Branches upstream's table leaves out (c = count of current, d = of the candidate).
fn compare_hints_extra_rows() -> Vec<CompareRow> {
    use Pick::{Candidate, Current};
    let f = false;
    vec![
        (
            "devicelet: c > B, d < B: narrower candidate wins",
            1,
            Some(h(&[0, 1], f)),
            h(&[2], f),
            Candidate,
        ),
        (
            "devicelet: c > B, d > c: current stays",
            1,
            Some(h(&[0, 1], f)),
            h(&[0, 1, 2], f),
            Current,
        ),
        (
            "devicelet: c > B, d == B: candidate wins",
            2,
            Some(h(&[0, 1, 2], f)),
            h(&[2, 3], f),
            Candidate,
        ),
        (
            "devicelet: c == B, d > B: current stays",
            2,
            Some(h(&[2, 3], f)),
            h(&[0, 1, 2], f),
            Current,
        ),
        (
            "devicelet: c < B, d > B, candidate lower bits: current stays",
            3,
            Some(h(&[3], f)),
            h(&[0, 1, 2, 3], f),
            Current,
        ),
        (
            "devicelet: c < B, d < c: current stays",
            4,
            Some(h(&[1, 2], f)),
            h(&[0], f),
            Current,
        ),
        (
            "devicelet: preferred beats a narrower non-preferred",
            1,
            Some(h(&[0], f)),
            h(&[0, 1, 2], true),
            Candidate,
        ),
    ]
}

fn check_compare_rows(rows: Vec<CompareRow>, distances: Option<&[Vec<u32>]>) {
    for (name, b, current, candidate, expected) in rows {
        let tie = match distances {
            Some(d) => TieBreak::Closest(d),
            None => TieBreak::Narrowest,
        };
        assert_eq!(
            compare(current, candidate, b, tie),
            expected,
            "fast merge order: {name}"
        );
        let kept = reference::compare(&tie, b, current, candidate);
        let wanted = match expected {
            Pick::Current => current,
            Pick::Candidate => Some(candidate),
        };
        assert_eq!(kept, wanted, "literal kubelet compare: {name}");
    }
}

#[test]
fn compare_hints_narrowest() {
    let rows = compare_hints_narrowest_rows();
    assert_eq!(rows.len(), 25, "upstream TestCompareHintsNarrowest rows");
    check_compare_rows(rows, None);
    check_compare_rows(compare_hints_extra_rows(), None);
}

/// `TestClosest` (`tm/numa_info_test.go`): `NUMAInfo.Closest(candidate, current)`, checked as
/// two preferred hints of equal standing so only the mask comparison decides.
#[test]
fn closest() {
    let flat3 = vec![vec![10u32; 3]; 3];
    let flat4 = vec![vec![10u32; 4]; 4];
    let paired = vec![
        vec![10, 11, 12, 12],
        vec![11, 10, 12, 12],
        vec![12, 12, 10, 11],
        vec![12, 12, 11, 10],
    ];
    type ClosestRow<'a> = (
        &'static str,
        &'static [usize],
        &'static [usize],
        &'a [Vec<u32>],
        Pick,
    );
    let rows: Vec<ClosestRow<'_>> = vec![
        (
            "current and candidate length is not the same, current narrower",
            &[0],
            &[0, 2],
            &[],
            Pick::Current,
        ),
        (
            "current and candidate length is the same, distance is the same, current more lower bits set",
            &[0, 1],
            &[0, 2],
            &flat3,
            Pick::Current,
        ),
        (
            "current and candidate length is the same, distance is the same, candidate more lower bits set",
            &[0, 3],
            &[0, 2],
            &flat4,
            Pick::Candidate,
        ),
        (
            "current and candidate length is the same, candidate average distance is smaller",
            &[0, 3],
            &[0, 1],
            &paired,
            Pick::Candidate,
        ),
        (
            "current and candidate length is the same, current average distance is smaller",
            &[2, 3],
            &[0, 3],
            &paired,
            Pick::Current,
        ),
    ];
    assert_eq!(rows.len(), 5);
    for (name, current, candidate, d, expected) in rows {
        check_compare_rows(
            vec![(
                name,
                0,
                Some(h(current, true)),
                h(candidate, true),
                expected,
            )],
            Some(d),
        );
    }
}

/// `TestPolicySingleNumaNodeFilterHints` (`tm/policy_single_numa_node_test.go`): only
/// preferred hints that are nil or one node survive; a list may end up empty.
#[test]
fn policy_single_numa_node_filter_hints() {
    let (t, f) = (true, false);
    type FilterRow = (&'static str, Vec<Vec<TopologyHint>>, Vec<Vec<TopologyHint>>);
    let rows: Vec<FilterRow> = vec![
        ("filter empty resources", vec![], vec![]),
        (
            "filter hints with nil socket mask 1/2",
            vec![vec![nil(f)], vec![nil(t)]],
            vec![vec![], vec![nil(t)]],
        ),
        (
            "filter hints with nil socket mask 2/2",
            vec![vec![h(&[0], t), nil(f)], vec![h(&[1], t), nil(t)]],
            vec![vec![h(&[0], t)], vec![h(&[1], t), nil(t)]],
        ),
        (
            "filter hints with empty resource socket mask",
            vec![vec![h(&[1], t), h(&[0], t), nil(f)], vec![]],
            vec![vec![h(&[1], t), h(&[0], t)], vec![]],
        ),
        (
            "filter hints with wide sockemask",
            vec![
                vec![
                    h(&[0], t),
                    h(&[1], t),
                    h(&[1, 2], f),
                    h(&[0, 1, 2], f),
                    nil(f),
                ],
                vec![h(&[1, 2], f), h(&[0, 1, 2], f), h(&[0, 2], f), h(&[3], f)],
                vec![h(&[1, 2], f), h(&[0, 1, 2], f), h(&[0, 2], f)],
            ],
            vec![vec![h(&[0], t), h(&[1], t)], vec![], vec![]],
        ),
    ];
    assert_eq!(rows.len(), 5);
    for (name, input, expected) in rows {
        let lists: Vec<HintList<'static>> = input.into_iter().map(HintList::Explicit).collect();
        let got: Vec<Vec<TopologyHint>> = filter_single_numa(lists)
            .into_iter()
            .map(|l| match l {
                HintList::Explicit(h) => h,
                HintList::Family(_) => panic!("{name}: explicit lists stay explicit"),
            })
            .collect();
        assert_eq!(got, expected, "{name}");
    }
}

/// `TestCalculateAvgDistanceFor` (`tm/numa_info_test.go`): the average over ordered pairs,
/// self pairs included, that Closest compares (the merge compares the sums, same order).
#[test]
fn calculate_avg_distance_for() {
    use devicelet_topology::NumaTopology;
    let two = vec![vec![10, 11], vec![11, 10]];
    let four = vec![
        vec![10, 11, 12, 12],
        vec![11, 10, 12, 12],
        vec![12, 12, 10, 11],
        vec![12, 12, 11, 10],
    ];
    type AvgRow = (&'static str, &'static [usize], Vec<Vec<u32>>, f64);
    let rows: Vec<AvgRow> = vec![
        ("1 NUMA node", &[0], vec![vec![10]], 10.0),
        ("2 NUMA node, 1 set in bitmask", &[0], two.clone(), 10.0),
        ("2 NUMA node, 2 set in bitmask", &[0, 1], two, 10.5),
        ("4 NUMA node, 2 set in bitmask", &[0, 2], four.clone(), 11.0),
        (
            "4 NUMA node, 3 set in bitmask",
            &[0, 2, 3],
            four,
            100.0 / 9.0,
        ),
        ("0 NUMA node, 0 set in bitmask", &[], vec![], 0.0),
    ];
    assert_eq!(rows.len(), 6);
    for (name, set, d, expected) in rows {
        let topo = NumaTopology {
            nodes: vec![],
            distances: Some(d),
        };
        let got = topo.average_distance(mask(set)).expect("distances known");
        assert!((got - expected).abs() < 1e-9, "{name}: {got} != {expected}");
    }
}
