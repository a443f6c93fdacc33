//! The Memory Manager end to end (KEP-1769, issue 26): `devicelet serve --config` with the
//! Static memory policy on a described 2-node machine, a Guaranteed pod whose GPU, CPUs, memory
//! and huge pages land on one NUMA node (`single-numa-node`), `memory_manager_state`, the
//! runtime's `cpusetMems`, restart, removal, and the configurations the kubelet refuses.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Root, cli};
use serde_json::Value;

const GPU: &str = "example.com/gpu";

/// A 2-node machine (CPUs 0-3 and 4-7, 4Gi and 512 2Mi pages per node) with the given fields.
fn config(root: &Root, name: &str, fields: &str) -> String {
    let text = format!(
        "{fields}\ndevicelet:\n  machine: {{nodes: 2, cpusPerNode: 4}}\n  memory: {{perNode: 4Gi, hugepagesPerNode: {{2Mi: 512}}}}\n"
    );
    let path = root.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const ALIGNED: &str = "topologyManagerPolicy: single-numa-node
cpuManagerPolicy: static
reservedSystemCPUs: \"0\"
memoryManagerPolicy: Static
evictionHard: {memory.available: 100Mi}
kubeReserved: {memory: 412Mi}
reservedMemory:
- {numaNode: 0, limits: {memory: 512Mi}}";

/// A Guaranteed pod with one container: GPUs, CPUs, memory and 2Mi huge pages.
fn pod(root: &Root, uid: &str, gpus: u32, cpus: u32, memory: &str, hugepages: &str) -> String {
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, uid: {uid}}}\nspec:\n  containers:\n  - name: main\n    resources: {{limits: {{{GPU}: \"{gpus}\", cpu: \"{cpus}\", memory: {memory}, hugepages-2Mi: {hugepages}}}}}\n"
    );
    let path = root.path().join(format!("{uid}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn admit(root: &Root, file: &str) -> Result<Value, String> {
    let (code, out, err) = cli(root.path(), &["-v", "admit", "-f", file, "-o", "json"]).await;
    if code == 0 {
        Ok(serde_json::from_str(&out).unwrap())
    } else {
        Err(err)
    }
}

fn blocks(admitted: &Value) -> Vec<(String, u64, Vec<u64>)> {
    admitted["containers"][0]["memory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["type"].as_str().unwrap().to_owned(),
                b["size"].as_u64().unwrap(),
                b["numaNodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_u64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn gpu_cpus_memory_and_hugepages_of_a_guaranteed_pod_share_one_numa_node() {
    let root = Root::new();
    let cfg = config(&root, "aligned.yaml", ALIGNED);
    let serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4", "--numa-nodes", "2"]);
    root.wait_counts(GPU, 4, 4).await;

    // 5Gi fits only both nodes together (2.5Gi + 3Gi allocatable): single-numa-node refuses.
    let big = pod(&root, "uid-big", 1, 1, "5Gi", "2Mi");
    let err = admit(&root, &big).await.unwrap_err();
    assert!(err.contains("TopologyAffinityError"), "{err}");

    let g = admit(&root, &pod(&root, "uid-g", 1, 2, "1Gi", "256Mi"))
        .await
        .unwrap();
    let numa = g["containers"][0]["numaAffinity"].clone();
    let node = numa[0].as_u64().unwrap();
    assert_eq!(numa.as_array().unwrap().len(), 1, "{g}");
    assert_eq!(
        blocks(&g),
        [
            ("hugepages-2Mi".to_owned(), 256 << 20, vec![node]),
            ("memory".to_owned(), 1 << 30, vec![node]),
        ],
        "{g}"
    );

    // The runtime pins the container's memory to the same node.
    let (code, out, err) = cli(root.path(), &["start", "uid-g", "main", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let start: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(start["cpusetMems"], node.to_string(), "{start}");

    // The kubelet-format state file.
    let state_path = root.path().join("memory_manager_state");
    let state: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert_eq!(state["policyName"], "Static");
    assert_eq!(
        state["entries"]["uid-g"]["main"].as_array().unwrap().len(),
        2,
        "{state}"
    );

    // 5Gi fits no single node any more, nor both: the memory manager has no hint at all, so the
    // Topology Manager aligns the GPU and CPU and the memory manager's Allocate refuses, as in
    // the kubelet (an UnexpectedAdmissionError, not a TopologyAffinityError).
    let err = admit(&root, &big).await.unwrap_err();
    assert!(
        err.contains("UnexpectedAdmissionError")
            && err.contains(
                "[memorymanager] failed to find NUMA nodes to extend the current topology hint"
            ),
        "{err}"
    );

    // A restart keeps the blocks; get pods shows them again.
    assert_eq!(serve.terminate().await, 0);
    let _serve = root.serve(&["--config", &cfg]).await;
    let (_, out, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    let pods: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(blocks(&pods["pods"][0]), blocks(&g), "{pods}");
    let (_, table, _) = cli(root.path(), &["get", "pods"]).await;
    assert!(
        table.contains("MEMORY") && table.contains(&format!("memory=1Gi@{node}")),
        "{table}"
    );

    // Removal frees the memory durably.
    let (code, _, err) = cli(root.path(), &["remove", "uid-g"]).await;
    assert_eq!(code, 0, "{err}");
    let state: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert!(state["entries"].get("uid-g").is_none(), "{state}");
    drop(plugin);
}

#[tokio::test]
async fn memory_configurations_the_kubelet_refuses_are_refused_with_its_message() {
    let root = Root::new();
    let cases = [
        (
            "memoryManagerPolicy: Static\nkubeReserved: {memory: 412Mi}\nreservedMemory:\n- {numaNode: 0, limits: {memory: 256Mi}}",
            "reservedMemory: the total amount \"256Mi\" of type \"memory\" is not equal to the value \"512Mi\" determined by Node Allocatable feature",
        ),
        (
            "memoryManagerPolicy: Static\nreservedMemory:\n- {numaNode: 7, limits: {memory: 100Mi}}",
            "the reserved memory configuration references a NUMA node 7 that does not exist on this machine",
        ),
        (
            "memoryManagerPolicy: Static\nevictionHard: {nodefs.available: 10%}",
            "[memorymanager] you should specify the system reserved memory",
        ),
        (
            "memoryManagerPolicy: Dynamic",
            "memoryManagerPolicy: unknown policy: \"Dynamic\"",
        ),
        (
            "memoryManagerPolicy: Static\nsystemReserved: {hugepages-2Mi: 2Mi}",
            "systemReserved: cannot reserve \"hugepages-2Mi\" resource",
        ),
    ];
    for (i, (fields, expected)) in cases.iter().enumerate() {
        let cfg = config(&root, &format!("bad{i}.yaml"), fields);
        root.assert_serve_refuses(&cfg, expected).await;
    }
    // The default hard eviction threshold (100Mi) counts when evictionHard is absent.
    let cfg = config(
        &root,
        "ok.yaml",
        "memoryManagerPolicy: Static\nreservedMemory:\n- {numaNode: 1, limits: {memory: 100Mi}}",
    );
    let serve = root.serve(&["--config", &cfg]).await;
    assert_eq!(serve.terminate().await, 0);
}

/// `examples/kubelet/gpu-node.yaml` as shipped starts a daemon on this machine's own sysfs
/// (the README and docs point newcomers at it), and its memory manager writes its state.
#[tokio::test]
async fn the_gpu_node_example_configuration_starts_on_this_machine() {
    let root = Root::new();
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/kubelet/gpu-node.yaml"
    );
    let serve = root.serve(&["--config", example]).await;
    let state: Value =
        serde_json::from_slice(&std::fs::read(root.path().join("memory_manager_state")).unwrap())
            .unwrap();
    assert_eq!(state["policyName"], "Static", "{state}");
    let cpu: Value =
        serde_json::from_slice(&std::fs::read(root.path().join("cpu_manager_state")).unwrap())
            .unwrap();
    assert_eq!(cpu["policyName"], "static", "{cpu}");
    assert_eq!(serve.terminate().await, 0);
}

async fn run_replay(
    root: &Root,
    config: &std::path::Path,
    steps: &std::path::Path,
) -> (i32, String, String) {
    let (config, steps) = (config.to_str().unwrap(), steps.to_str().unwrap());
    cli(
        root.path(),
        &["resources", "replay", "--config", config, "-f", steps],
    )
    .await
}

/// `devicelet resources replay` runs the same admissions offline: the GPU-node example on a
/// described machine, a Guaranteed pod pinned to one node, its removal freeing the state, and a
/// malformed step file refused with the place of the error.
#[tokio::test]
async fn resources_replay_admits_and_removes_offline_and_names_bad_input() {
    let root = Root::new();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/kubelet/gpu-node.yaml"
    ))
    .unwrap();
    let cfg = root.path().join("gpu-node.yaml");
    std::fs::write(
        &cfg,
        format!(
            "{example}devicelet:\n  machine: {{nodes: 2, cpusPerNode: 4}}\n  memory: {{perNode: 4Gi}}\n"
        ),
    )
    .unwrap();
    let steps = serde_json::json!({"steps": [
        {"admit": {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "g", "uid": "uid-g"},
            "spec": {"containers": [{"name": "main",
                "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}}},
        {"remove": "uid-g"}
    ]});
    let file = root.path().join("steps.json");
    std::fs::write(&file, steps.to_string()).unwrap();
    let (code, out, err) = run_replay(&root, &cfg, &file).await;
    assert_eq!(code, 0, "{err}");
    let replay: Value = serde_json::from_str(&out).unwrap();
    let admitted = &replay["steps"][0];
    assert_eq!(admitted["admitted"], true, "{replay}");
    let main = &admitted["containers"][0];
    let node = main["numaAffinity"][0].as_u64().unwrap();
    assert_eq!(
        main["memory"][0]["numaAffinity"][0].as_u64(),
        Some(node),
        "{replay}"
    );
    assert_eq!(
        main["cpus"].as_str().map(|c| c.is_empty()),
        Some(false),
        "{replay}"
    );
    // After the removal nothing is pinned.
    let state: Value =
        serde_json::from_str(replay["memoryManagerState"].as_str().unwrap()).unwrap();
    assert!(
        state
            .get("entries")
            .is_none_or(|e| e.get("uid-g").is_none()),
        "{state}"
    );

    std::fs::write(&file, r#"{"steps":[{"admitt":{}}]}"#).unwrap();
    let (code, _, err) = run_replay(&root, &cfg, &file).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("unknown variant `admitt`") && err.contains("line 1"),
        "{err}"
    );
}
