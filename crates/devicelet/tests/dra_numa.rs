//! DRA devices in NUMA alignment (issue 41, devicelet's addition; upstream 1.36 leaves DRA
//! devices out of the Topology Manager): `serve --config` with a described 2-NUMA machine,
//! `single-numa-node`, the static CPU policy and the Static memory policy; the example DRA
//! driver as a real process with `--numa-nodes 2`, publishing
//! `resource.kubernetes.io/numaNode`; a claim template that selects GPUs on NUMA node 1.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Root, WAIT, cli};
use serde_json::Value;

const DRIVER: &str = "gpu.example.com";

/// CPUs 0-3 on node 0 and 4-7 on node 1 (CPU 0 reserved), 4Gi per node.
const CONFIG: &str = "topologyManagerPolicy: single-numa-node
cpuManagerPolicy: static
reservedSystemCPUs: \"0\"
memoryManagerPolicy: Static
evictionHard: {memory.available: 100Mi}
kubeReserved: {memory: 412Mi}
reservedMemory:
- {numaNode: 0, limits: {memory: 512Mi}}
devicelet:
  machine: {nodes: 2, cpusPerNode: 4}
  memory: {perNode: 4Gi}
";

/// A DeviceClass for the driver and a template for one of its GPUs on NUMA node 1.
const OBJECTS: &str = r#"apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: numa1-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
          selectors:
          - cel: {expression: 'device.attributes["resource.kubernetes.io"].numaNode == 1'}
"#;

/// A Guaranteed pod with one container `app`: `cpus` exclusive CPUs, 1Gi, and a claim `gpu`
/// from the template when `gpu` is set.
fn pod(root: &Root, uid: &str, cpus: u32, gpu: bool) -> String {
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, uid: {uid}}}\nspec:\n  containers:\n  - name: app\n    resources:\n      limits: {{cpu: \"{cpus}\", memory: 1Gi}}\n"
    );
    if gpu {
        text.push_str("      claims: [{name: gpu}]\n");
        text.push_str("  resourceClaims:\n  - {name: gpu, resourceClaimTemplateName: numa1-gpu}\n");
    }
    let path = root.path().join(format!("{uid}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn admit(root: &Root, file: &str) -> Result<Value, String> {
    // -v: a refusal prints the daemon's detail after the kubelet's reason.
    let (code, out, err) = cli(root.path(), &["-v", "admit", "-f", file, "-o", "json"]).await;
    if code == 0 {
        Ok(serde_json::from_str(&out).unwrap())
    } else {
        Err(err)
    }
}

fn cpus(admitted: &Value) -> Vec<u32> {
    let list = admitted["containers"][0]["cpus"]
        .as_str()
        .unwrap_or_default();
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

fn memory_nodes(admitted: &Value) -> Vec<Value> {
    admitted["containers"][0]["memory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["numaNodes"].clone())
        .collect()
}

async fn dra(root: &Root) -> Value {
    root.control().get_json("/v1/dra").await.unwrap()
}

#[tokio::test]
async fn a_dra_gpu_on_numa_1_brings_the_cpus_and_memory_and_refuses_when_numa_1_is_full() {
    let root = Root::new();
    let cfg = root.path().join("kubelet.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let _serve = root
        .serve(&["--config", cfg.to_str().unwrap(), "--node-name", "node-1"])
        .await;
    let cdi = root.path().join("cdi");
    let _driver = root.spawn(
        "driver",
        &[
            "example-driver",
            "--name",
            DRIVER,
            "--devices",
            "4",
            "--numa-nodes",
            "2",
            "--cdi-dir",
            cdi.to_str().unwrap(),
        ],
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while dra(&root).await["publishedSlices"][DRIVER] != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "driver never published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The slice carries the standard attribute: gpu-0, gpu-1 on node 0, gpu-2, gpu-3 on 1.
    let (code, out, err) = cli(root.path(), &["get", "slices", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let slices: Value = serde_json::from_str(&out).unwrap();
    let devices = slices["items"][0]["spec"]["devices"].as_array().unwrap();
    let numa: Vec<i64> = devices
        .iter()
        .map(|d| {
            d["attributes"]["resource.kubernetes.io/numaNode"]["int"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(numa, [0, 0, 1, 1], "{slices}");
    let objects = root.path().join("objects.yaml");
    std::fs::write(&objects, OBJECTS).unwrap();
    let (code, _, err) = cli(root.path(), &["apply", "-f", objects.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{err}");

    // The first pod: without DRA hints its CPUs would come from node 0 (CPUs 1-3 free, the
    // lowest node wins a tie); its GPU is on node 1, so its CPUs and memory are too.
    let a = admit(&root, &pod(&root, "uid-a", 2, true)).await.unwrap();
    assert_eq!(
        a["containers"][0]["numaAffinity"],
        serde_json::json!([1]),
        "{a}"
    );
    let got = cpus(&a);
    assert_eq!(got.len(), 2, "{a}");
    assert!(got.iter().all(|c| (4..8).contains(c)), "{a}");
    assert_eq!(memory_nodes(&a), [serde_json::json!([1])], "{a}");
    let claim_devices: Vec<&str> = a["containers"][0]["claims"]
        .as_array()
        .map(|d| d.iter().filter_map(|x| x["device"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        claim_devices.iter().all(|d| *d == "gpu-2" || *d == "gpu-3") && !claim_devices.is_empty(),
        "{a}"
    );
    // The CPU Manager's state file agrees.
    let state: Value =
        serde_json::from_slice(&std::fs::read(root.path().join("cpu_manager_state")).unwrap())
            .unwrap();
    let entry = state["entries"]["uid-a"]["app"].as_str().unwrap();
    assert_eq!(
        entry,
        a["containers"][0]["cpus"].as_str().unwrap(),
        "{state}"
    );

    // Other Guaranteed pods take node 1's last CPUs: 2 CPUs fit both nodes, so the first
    // goes to node 0 (the lowest node wins the tie), the second fits only node 1.
    let f0 = admit(&root, &pod(&root, "uid-fill0", 2, false))
        .await
        .unwrap();
    assert_eq!(cpus(&f0), [1, 2], "{f0}");
    let f1 = admit(&root, &pod(&root, "uid-fill1", 2, false))
        .await
        .unwrap();
    assert!(cpus(&f1).iter().all(|c| (4..8).contains(c)), "{f1}");

    // A further GPU pod with one CPU: node 0 still has CPU 3, and its GPU (the other one on
    // node 1) is free, but no node has both. Refused with the kubelet's reason; the detail
    // names the claim and its node.
    let err = admit(&root, &pod(&root, "uid-c", 1, true))
        .await
        .unwrap_err();
    assert!(
        err.contains("TopologyAffinityError: Resources cannot be allocated with Topology locality"),
        "{err}"
    );
    assert!(
        err.contains("claim \"gpu\"") && err.contains("NUMA nodes [1]"),
        "{err}"
    );
    assert!(err.contains("exclusive cpus=1"), "{err}");
    // Nothing of the refused pod stays: not admitted, its template claim gone (the GPU free).
    let (code, out, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0);
    let pods: Value = serde_json::from_str(&out).unwrap();
    let uids: Vec<&str> = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pod"]["uid"].as_str())
        .collect();
    assert!(!uids.contains(&"uid-c"), "{pods}");
    let stored: Value = root.control().get_json("/v1/draobjects").await.unwrap();
    let claims = stored["resourceClaims"].as_object().unwrap();
    assert_eq!(claims.len(), 1, "only uid-a's claim is left: {stored}");
    assert!(
        claims.keys().all(|k| k.contains("uid-a")),
        "{:?}",
        claims.keys().collect::<Vec<_>>()
    );

    // Once node 1 has CPUs again, the same pod is admitted there.
    let (code, _, err) = cli(root.path(), &["remove", "uid-fill1"]).await;
    assert_eq!(code, 0, "{err}");
    let c = admit(&root, &pod(&root, "uid-c", 1, true)).await.unwrap();
    assert_eq!(
        c["containers"][0]["numaAffinity"],
        serde_json::json!([1]),
        "{c}"
    );
    assert!(cpus(&c).iter().all(|c| (4..8).contains(c)), "{c}");
}
