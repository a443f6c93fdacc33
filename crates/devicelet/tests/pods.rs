//! Pod admission through the CLI against `devicelet serve` and the example plugin (issue 3:
//! admit, start, remove, get pods; rejections change nothing).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Root, cli};

const GPU: &str = "example.com/gpu";

fn write(root: &Root, name: &str, text: &str) -> String {
    let path = root.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn c1_admit_start_remove_and_get_pods_with_init_container_reuse() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&[
        "--resource",
        GPU,
        "--devices",
        "4",
        "--numa-nodes",
        "2",
        "--pre-start",
    ]);
    root.wait_counts(GPU, 4, 4).await;
    let pod = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/pods/gpu-training.yaml"
    );
    let with_uid = std::fs::read_to_string(pod)
        .unwrap()
        .replace("namespace: default", "namespace: default\n  uid: uid-1");
    let file = write(&root, "pod.yaml", &with_uid);

    let (code, stdout, stderr) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let admitted: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(admitted["pod"]["uid"], "uid-1");
    let names: Vec<&str> = admitted["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["warmup", "log-shipper", "trainer"]);
    let warmup = admitted["containers"][0]["devices"][GPU][0]
        .as_str()
        .unwrap()
        .to_owned();
    let sidecar = admitted["containers"][1]["devices"][GPU][0]
        .as_str()
        .unwrap()
        .to_owned();
    let trainer: Vec<String> =
        serde_json::from_value(admitted["containers"][2]["devices"][GPU].clone()).unwrap();
    // The sidecar reuses the init container's device and keeps it; the trainer gets others.
    assert_eq!(sidecar, warmup);
    assert_eq!(trainer.len(), 2);
    assert!(!trainer.contains(&sidecar));

    // Idempotent by UID.
    let (code, again, _) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&again).unwrap(),
        admitted
    );

    let (code, start, stderr) =
        cli(root.path(), &["start", "uid-1", "trainer", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let start: serde_json::Value = serde_json::from_str(&start).unwrap();
    assert_eq!(start["envs"]["EXAMPLE_DEVICES"], trainer.join(","));
    assert_eq!(start["cdiDevices"].as_array().unwrap().len(), 2);

    // Only one device is left: a 2-GPU pod is rejected and leaves nothing behind.
    let small = write(
        &root,
        "two.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: two, uid: uid-2}\nspec:\n  containers:\n  - name: a\n    resources: {limits: {example.com/gpu: \"1\"}}\n  - name: b\n    resources: {limits: {example.com/gpu: \"1\"}}\n",
    );
    let (code, _, stderr) = cli(root.path(), &["admit", "-f", &small]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("requested number of devices unavailable for example.com/gpu. Requested: 1, Available: 0"), "{stderr}");
    let (_, pods, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    let pods: serde_json::Value = serde_json::from_str(&pods).unwrap();
    assert_eq!(pods["pods"].as_array().unwrap().len(), 1);

    let (code, _, stderr) = cli(root.path(), &["remove", "uid-1"]).await;
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = cli(root.path(), &["admit", "-f", &small]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(plugin.terminate().await, 0);
}

#[tokio::test]
async fn bad_manifests_are_rejected_with_the_cause() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    root.wait_counts(GPU, 2, 2).await;
    let cases = [
        ("garbage.yaml", "{{{ not yaml", "not valid YAML"),
        (
            "svc.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
            "expected kind: Pod",
        ),
        (
            "frac.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: f}\nspec: {containers: [{name: c, resources: {limits: {example.com/gpu: 500m}}}]}\n",
            "not a non-negative integer device count",
        ),
        (
            "neg.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: n}\nspec: {containers: [{name: c, resources: {limits: {example.com/gpu: \"-1\"}}}]}\n",
            "not a non-negative integer device count",
        ),
        (
            "unknown.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: u}\nspec: {containers: [{name: c, resources: {limits: {example.com/fpga: \"1\"}}}]}\n",
            "example.com/fpga, which no device plugin advertises",
        ),
    ];
    for (name, text, expected) in cases {
        let file = write(&root, name, text);
        let (code, _, stderr) = cli(root.path(), &["admit", "-f", &file]).await;
        assert_eq!(code, 1, "{name}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }
    let (_, pods, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&pods).unwrap()["pods"],
        serde_json::json!([])
    );
    root.wait_counts(GPU, 2, 2).await;
    assert_eq!(plugin.terminate().await, 0);
}

fn one_gpu_pod(root: &Root, uid: &str, gpus: u32) -> String {
    write(
        root,
        &format!("{uid}.yaml"),
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, uid: {uid}}}\nspec:\n  containers:\n  - name: app\n    resources: {{limits: {{example.com/gpu: \"{gpus}\"}}}}\n"
        ),
    )
}

async fn admitted_uids(root: &Root) -> Vec<String> {
    let (code, pods, stderr) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let pods: serde_json::Value = serde_json::from_str(&pods).unwrap();
    let mut uids: Vec<String> = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"]["uid"].as_str().unwrap().to_owned())
        .collect();
    uids.sort();
    uids
}

/// C7 (`UpdateAllocatedDevices`) and §3.4 ("pods that are gone are freed once the set of active
/// pods is known"): `sync-pods` removes every admitted pod that is not active, durably, also
/// after a crash; an empty active set is refused unless asked for with `--none`.
#[tokio::test]
async fn c7_sync_pods_frees_pods_no_longer_active_also_after_a_crash() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "4"]);
    root.wait_counts(GPU, 4, 4).await;
    for uid in ["uid-a", "uid-b", "uid-c"] {
        let (code, _, stderr) =
            cli(root.path(), &["admit", "-f", &one_gpu_pod(&root, uid, 1)]).await;
        assert_eq!(code, 0, "{stderr}");
    }

    // No UID at all is a usage error and changes nothing.
    let (code, _, stderr) = cli(root.path(), &["sync-pods"]).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("--none") || stderr.contains("required"),
        "{stderr}"
    );
    assert_eq!(admitted_uids(&root).await, ["uid-a", "uid-b", "uid-c"]);

    let (code, out, stderr) = cli(
        root.path(),
        &["sync-pods", "uid-a", "uid-c", "uid-unknown", "-o", "json"],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let sync: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sync["removed"], serde_json::json!(["uid-b"]));
    assert_eq!(sync["kept"], 2);
    assert_eq!(admitted_uids(&root).await, ["uid-a", "uid-c"]);
    // uid-b's device is free again: a 2-device pod fits in what is left.
    let (code, _, stderr) = cli(
        root.path(),
        &["admit", "-f", &one_gpu_pod(&root, "uid-d", 2)],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");

    // Crash; uid-c and uid-d went away while devicelet was down.
    serve.kill().await;
    let serve = root.serve(&[]).await;
    assert_eq!(admitted_uids(&root).await, ["uid-a", "uid-c", "uid-d"]);
    let active = write(&root, "active.txt", "# from the runtime\nuid-a\n");
    let (code, out, stderr) = cli(root.path(), &["sync-pods", "-f", &active, "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let sync: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sync["removed"], serde_json::json!(["uid-c", "uid-d"]));
    assert_eq!(sync["kept"], 1);

    // The removal is durable: after another crash only uid-a is there.
    serve.kill().await;
    let serve = root.serve(&[]).await;
    assert_eq!(admitted_uids(&root).await, ["uid-a"]);
    root.wait_counts(GPU, 4, 4).await;
    let (code, _, stderr) = cli(
        root.path(),
        &["admit", "-f", &one_gpu_pod(&root, "uid-e", 3)],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");

    let (code, out, stderr) = cli(root.path(), &["sync-pods", "--none", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let sync: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sync["removed"], serde_json::json!(["uid-a", "uid-e"]));
    assert!(admitted_uids(&root).await.is_empty());
    assert_eq!(serve.terminate().await, 0);
    plugin.kill().await;
}

/// C2 (`TestAdmitPodWithDRAResources`): an extended resource that
/// `status.extendedResourceClaimStatus.requestMappings` maps to a DRA claim is skipped by the
/// device manager; without the mapping the same pod is refused as an unknown resource.
#[tokio::test]
async fn c2_dra_backed_extended_resources_are_not_allocated_by_device_plugins() {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    root.wait_counts(GPU, 2, 2).await;
    let manifest = |uid: &str, mapped: bool| {
        let status = if mapped {
            "status:\n  extendedResourceClaimStatus:\n    resourceClaimName: pod-extended-resources-abc\n    requestMappings:\n    - {containerName: app, resourceName: dra.example.com/gpu, requestName: container-0-request-0}\n"
        } else {
            ""
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, uid: {uid}}}\nspec:\n  containers:\n  - name: app\n    resources: {{limits: {{dra.example.com/gpu: \"1\", example.com/gpu: \"1\"}}}}\n{status}"
        )
    };
    let unmapped = write(&root, "unmapped.yaml", &manifest("uid-plain", false));
    let (code, _, stderr) = cli(root.path(), &["admit", "-f", &unmapped]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("dra.example.com/gpu"), "{stderr}");

    let mapped = write(&root, "mapped.yaml", &manifest("uid-dra", true));
    let (code, out, stderr) = cli(root.path(), &["admit", "-f", &mapped, "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let admitted: serde_json::Value = serde_json::from_str(&out).unwrap();
    let devices = admitted["containers"][0]["devices"].as_object().unwrap();
    assert_eq!(devices.len(), 1, "{admitted}");
    assert_eq!(devices[GPU].as_array().unwrap().len(), 1);
    assert_eq!(serve.terminate().await, 0);
    plugin.kill().await;
}

/// `start --check-cdi` resolves the container's CDI names in simulated mode: the example
/// plugin's spec is under R/cdi by default, so they resolve; a plugin whose spec went elsewhere
/// gives names that do not, and the check fails naming them and the directories.
#[tokio::test]
async fn start_check_cdi_resolves_names_or_names_what_does_not() {
    let root = Root::new();
    let _serve = root.serve(&[]).await;
    let elsewhere = root.path().join("elsewhere");
    let elsewhere_arg = elsewhere.display().to_string();
    let other = root.example_plugin(&[
        "--resource",
        "example.com/fpga",
        "--devices",
        "1",
        "--cdi-dir",
        &elsewhere_arg,
    ]);
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    root.wait_counts(GPU, 2, 2).await;
    root.wait_counts("example.com/fpga", 1, 1).await;
    let pod = write(
        &root,
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: uid-c}\nspec:\n  containers:\n  - name: gpu\n    resources: {limits: {example.com/gpu: \"1\"}}\n  - name: fpga\n    resources: {limits: {example.com/fpga: \"1\"}}\n",
    );
    let (code, _, stderr) = cli(root.path(), &["admit", "-f", &pod]).await;
    assert_eq!(code, 0, "{stderr}");

    let (code, out, stderr) = cli(
        root.path(),
        &["start", "uid-c", "gpu", "--check-cdi", "-o", "json"],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let name = v["cdiDevices"][0].as_str().unwrap();
    let file = v["cdiCheck"]["resolved"][name].as_str().unwrap();
    assert!(
        file.starts_with(&root.path().join("cdi").display().to_string()),
        "{v}"
    );

    let (code, out, stderr) = cli(root.path(), &["start", "uid-c", "fpga", "--check-cdi"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("UNRESOLVED"), "{out}");
    assert!(
        stderr.contains("unresolvable CDI device(s) example.com/fpga=")
            && stderr.contains(&root.path().join("cdi").display().to_string())
            && stderr.contains("/etc/cdi"),
        "{stderr}"
    );
    // The plugin's own directory makes them resolve.
    let (code, out, stderr) = cli(
        root.path(),
        &[
            "start",
            "uid-c",
            "fpga",
            "--check-cdi",
            "--cdi-spec-dir",
            &elsewhere_arg,
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{stderr}");
    assert!(out.contains("resolved by"), "{out}");
    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(other.terminate().await, 0);
}
