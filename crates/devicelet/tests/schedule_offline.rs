//! `devicelet schedule` as a process: one traced scheduling cycle offline, every node's verdict
//! and scores, preemption's victims, many cases per file, and bad input refused clearly.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use serde_json::Value;

/// Runs `devicelet schedule -f FILE -o json` on `text`: (exit success, stdout JSON or
/// stderr).
fn schedule(text: &str, extra: &[&str]) -> (bool, Result<Value, String>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("case.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(common::EXE)
        .args(["schedule", "-f"])
        .arg(&file)
        .args(["-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    let ok = out.status.success();
    if ok {
        (ok, Ok(serde_json::from_slice(&out.stdout).unwrap()))
    } else {
        (ok, Err(String::from_utf8_lossy(&out.stderr).into_owned()))
    }
}

const CLUSTER: &str = r#"
nodes:
- metadata: {name: n1, labels: {kubernetes.io/hostname: n1}}
  status:
    allocatable: {cpu: "4", memory: 8Gi, pods: "10"}
    images: [{names: ["nginx:latest"], sizeBytes: 524288000}]
- metadata: {name: n2, labels: {kubernetes.io/hostname: n2}}
  status: {allocatable: {cpu: "4", memory: 8Gi, pods: "10"}}
- metadata: {name: n3, labels: {kubernetes.io/hostname: n3}}
  status: {allocatable: {cpu: "8", memory: 8Gi, pods: "10"}}
- metadata: {name: n4, labels: {kubernetes.io/hostname: n4}}
  status:
    allocatable: {cpu: "8", memory: 8Gi, pods: "10"}
    images: [{names: ["nginx:latest"], sizeBytes: 524288000}]
pods:
- metadata: {name: old, namespace: default, uid: u2, labels: {app: web}}
  spec: {nodeName: n2, containers: [{name: c, image: nginx}]}
  status: {phase: Running}
- metadata: {name: low, namespace: default, uid: u3, labels: {app: db}}
  spec: {nodeName: n1, priority: 0, containers: [{name: c, image: db, resources: {requests: {cpu: "2"}}}]}
  status: {phase: Running, startTime: "2026-01-01T00:00:00Z"}
"#;

const POD: &str = r#"
pod:
  metadata: {name: web, namespace: default, uid: u1, labels: {app: web}}
  spec:
    priority: 1000
    containers: [{name: c, image: nginx, resources: {requests: {cpu: "3"}}}]
    affinity:
      podAntiAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
        - labelSelector: {matchLabels: {app: web}}
          topologyKey: kubernetes.io/hostname
"#;

fn node<'a>(result: &'a Value, name: &str) -> &'a Value {
    result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .unwrap()
}

#[test]
fn every_node_gets_its_verdict_and_scores() {
    let (ok, out) = schedule(&format!("{CLUSTER}{POD}"), &[]);
    assert!(ok);
    let r = out.unwrap();
    assert_eq!(node(&r, "n1")["rejection"]["plugin"], "NodeResourcesFit");
    assert_eq!(
        node(&r, "n1")["rejection"]["reasons"][0],
        "Insufficient cpu"
    );
    assert_eq!(node(&r, "n2")["rejection"]["plugin"], "InterPodAffinity");
    assert_eq!(
        node(&r, "n2")["rejection"]["reasons"][0],
        "node(s) didn't match pod anti-affinity rules"
    );
    // nginx:latest (500 MiB) is on 2 of 4 nodes: 250 MiB count, 100 * (250 - 23) / (1000 - 23).
    let n4 = node(&r, "n4");
    assert_eq!(n4["scores"]["ImageLocality"], 23, "{n4}");
    assert_eq!(node(&r, "n3")["scores"]["ImageLocality"], 0);
    assert_eq!(
        n4["scores"]["TaintToleration"], 300,
        "no taints: 100 times weight 3"
    );
    let sum: i64 = n4["scores"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum();
    assert_eq!(n4["total"], sum);
    assert_eq!(r["selected"], serde_json::json!(["n4"]));
    assert!(r.get("preemption").is_none());
}

#[test]
fn with_no_node_left_preemption_names_its_victims() {
    let cluster = CLUSTER.replace("cpu: \"8\"", "cpu: \"1\"");
    let (ok, out) = schedule(&format!("{cluster}{POD}"), &[]);
    assert!(ok);
    let r = out.unwrap();
    assert!(r["selected"].as_array().unwrap().is_empty());
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .starts_with("0/4 nodes are available")
    );
    let p = &r["preemption"];
    assert_eq!(
        p["nodes"]["n1"],
        serde_json::json!({"victims": ["default/low"], "pdbViolations": 0})
    );
    assert_eq!(
        p["nodes"]["n2"],
        serde_json::json!({"victims": ["default/old"], "pdbViolations": 0})
    );
    // n3 and n4 have less cpu than the pod asks even empty: UnschedulableAndUnresolvable, so
    // preemption does not try them.
    assert_eq!(
        node(&r, "n3")["rejection"]["code"],
        "UnschedulableAndUnresolvable"
    );
    assert!(p["nodes"].get("n3").is_none(), "{p}");
    assert!(p["nominated"].is_string());
}

#[test]
fn a_file_of_cases_answers_each_and_a_bad_config_is_that_case_s_error() {
    let one = format!("{CLUSTER}{POD}");
    let case: Value = serde_yaml::from_str(&one).unwrap();
    let mut bad = case.clone();
    bad["config"] = serde_json::json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"plugins": {"score": {"enabled": [{"name": "MyPlugin"}]}}}]
    });
    bad["name"] = "bad".into();
    let list = serde_json::json!({"cases": [case, bad]});
    let (ok, out) = schedule(&list.to_string(), &[]);
    assert!(ok);
    let r = out.unwrap();
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    assert_eq!(cases[0]["selected"], serde_json::json!(["n4"]));
    let error = cases[1]["error"].as_str().unwrap();
    assert!(error.contains("MyPlugin"), "{error}");
}

#[test]
fn a_config_file_applies_to_cases_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
         profiles:\n- plugins: {score: {disabled: [{name: ImageLocality}]}}\n",
    )
    .unwrap();
    let (ok, out) = schedule(
        &format!("{CLUSTER}{POD}"),
        &["--config", config.to_str().unwrap()],
    );
    assert!(ok);
    let r = out.unwrap();
    assert!(node(&r, "n4")["scores"].get("ImageLocality").is_none());
}

#[test]
fn bad_input_is_refused_with_the_cause() {
    let (ok, out) = schedule(CLUSTER, &[]);
    assert!(!ok);
    let err = out.unwrap_err();
    assert!(
        err.contains("not a scheduling case") && err.contains("pod"),
        "{err}"
    );
    let (ok, out) = schedule("pod: [not, a, pod]\n", &[]);
    assert!(!ok);
    assert!(out.unwrap_err().contains("not a scheduling case"));
    let (ok, out) = schedule("cases: [{nodes: []}]\n", &[]);
    assert!(!ok);
    assert!(out.unwrap_err().contains("not a list of cases"));
}
