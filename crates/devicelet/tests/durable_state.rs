//! Issue #4: restart recovery, corruption handling, a full disk and `devicelet state`, through
//! real `devicelet serve` and `example-plugin` processes (spec devicemanager.md §3.4, §1.7;
//! ecosystem.md A1–A2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{Proc, Root, cli};
use devicelet_checkpoint::device;
use devicelet_checkpoint::hash::crc32_ieee;
use devicelet_checkpoint::store::JOURNAL_FILE;

const GPU: &str = "example.com/gpu";
const PLUGIN_ENV: &[(&str, &str)] = &[("DEVICELET_EXAMPLE_PLUGIN_POLL_MS", "20")];

fn pod_file(root: &Root, uid: &str, count: u32) -> String {
    let path = root.path().join(format!("{uid}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{uid}\n  namespace: team-a\n  uid: {uid}\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n        {GPU}: \"{count}\"\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn start_plugin(root: &Root) -> Proc {
    root.spawn_env(
        "plugin",
        &["example-plugin", "--resource", GPU, "--devices", "4"],
        PLUGIN_ENV,
    )
}

fn kubelet_file(root: &Root) -> PathBuf {
    root.paths
        .device_plugins
        .join(device::DEVICE_CHECKPOINT_FILE)
}

fn journal_file(root: &Root) -> PathBuf {
    root.paths.control_dir.join(JOURNAL_FILE)
}

async fn admit(root: &Root, uid: &str, count: u32) -> (i32, serde_json::Value, String) {
    let file = pod_file(root, uid, count);
    let (code, out, err) = cli(root.path(), &["admit", "-f", &file, "-o", "json"]).await;
    (
        code,
        serde_json::from_str(&out).unwrap_or(serde_json::Value::Null),
        err,
    )
}

async fn get_pods(root: &Root) -> serde_json::Value {
    let (code, out, err) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

async fn status(root: &Root) -> serde_json::Value {
    let (code, out, err) = cli(root.path(), &["state", "status", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// Files in `dir` whose name starts with `prefix` and contains `tag`.
fn kept_aside(dir: &Path, prefix: &str, tag: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(prefix) && n.contains(tag)
        })
        .collect()
}

/// A root with two admitted pods and a clean stop (so the kubelet file is exact).
async fn root_with_two_pods() -> (Root, serde_json::Value) {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = start_plugin(&root);
    root.wait_counts(GPU, 4, 4).await;
    assert_eq!(admit(&root, "uid-a", 1).await.0, 0);
    assert_eq!(admit(&root, "uid-b", 2).await.0, 0);
    let pods = get_pods(&root).await;
    assert_eq!(serve.terminate().await, 0);
    plugin.kill().await;
    (root, pods)
}

#[tokio::test]
async fn s3_4_restart_restores_pods_cached_responses_and_registered_resources_with_zero_allocatable()
 {
    let root = Root::new();
    let serve = root.serve(&[]).await;
    let plugin = start_plugin(&root);
    root.wait_counts(GPU, 4, 4).await;
    let (code, admitted, err) = admit(&root, "uid-a", 2).await;
    assert_eq!(code, 0, "{err}");
    let (code, start_before, err) =
        cli(root.path(), &["start", "uid-a", "main", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let pods_before = get_pods(&root).await;

    // Crash (no clean stop, no compaction) with the plugin gone as well.
    plugin.kill().await;
    serve.kill().await;
    let serve = root.serve(&[]).await;

    // The resource is registered from the checkpoint with nothing allocatable (§3.4) ...
    let snapshot = root.control().resources().await.unwrap();
    let gpu = snapshot.resource(GPU).expect("restored resource");
    assert_eq!((gpu.capacity, gpu.allocatable), (0, 0));
    // ... admitted pods come back with their names, and `start` answers from the cached
    // Allocate response without the plugin (A2 row 15).
    assert_eq!(get_pods(&root).await, pods_before);
    assert_eq!(pods_before["pods"][0]["pod"]["name"], "pod-uid-a");
    let (code, start_after, err) =
        cli(root.path(), &["start", "uid-a", "main", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(start_after, start_before);
    // A new pod cannot get the resource until its plugin is back ...
    let (code, _, err) = admit(&root, "uid-b", 1).await;
    assert_eq!(code, 1);
    assert!(err.contains(GPU), "{err}");
    // ... and then gets a device nobody holds.
    let _plugin = start_plugin(&root);
    root.wait_counts(GPU, 4, 4).await;
    let (code, b, err) = admit(&root, "uid-b", 2).await;
    assert_eq!(code, 0, "{err}");
    let a_devices: Vec<String> =
        serde_json::from_value(admitted["containers"][0]["devices"][GPU].clone()).unwrap();
    let b_devices: Vec<String> =
        serde_json::from_value(b["containers"][0]["devices"][GPU].clone()).unwrap();
    assert!(a_devices.iter().all(|d| !b_devices.contains(d)));

    // Removal is durable too.
    let (code, _, err) = cli(root.path(), &["remove", "uid-a"]).await;
    assert_eq!(code, 0, "{err}");
    serve.kill().await;
    let serve = root.serve(&[]).await;
    let pods = get_pods(&root).await;
    let uids: Vec<&str> = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids, ["uid-b"]);
    let st = status(&root).await;
    assert_eq!(st["health"], "ok");
    assert_eq!(st["restored_pods"], 1);
    assert_eq!(serve.terminate().await, 0);

    // After a clean stop the kubelet-format file is exact and verifies with `state inspect`.
    let (code, out, err) = cli(root.path(), &["state", "inspect", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["valid"], true);
    let entries = report["body"]["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["pod_uid"], "uid-b");
}

/// One corruption of `kubelet_internal_checkpoint`.
enum Damage {
    Truncate,
    FlipByte,
    WrongChecksum,
    Empty,
    Directory,
}

fn damage(path: &Path, how: &Damage) {
    let bytes = std::fs::read(path).unwrap();
    match how {
        Damage::Truncate => std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap(),
        Damage::FlipByte => {
            let mut b = bytes.clone();
            // Inside a pod UID: still JSON, checksum no longer matches.
            let at = String::from_utf8_lossy(&b).find("uid-a").unwrap() + 4;
            b[at] ^= 0x01;
            std::fs::write(path, b).unwrap();
        }
        Damage::WrongChecksum => {
            let text = String::from_utf8(bytes).unwrap();
            let at = text.rfind("\"Checksum\":").unwrap();
            let fixed = format!("{}\"Checksum\":12345}}", &text[..at]);
            std::fs::write(path, fixed).unwrap();
        }
        Damage::Empty => std::fs::write(path, b"").unwrap(),
        Damage::Directory => {
            std::fs::remove_file(path).unwrap();
            std::fs::create_dir(path).unwrap();
        }
    }
}

#[tokio::test]
async fn a2_corrupt_kubelet_checkpoint_is_kept_aside_admission_refused_until_operator_recovers() {
    for how in [
        Damage::Truncate,
        Damage::FlipByte,
        Damage::WrongChecksum,
        Damage::Empty,
        Damage::Directory,
    ] {
        let (root, _pods) = root_with_two_pods().await;
        let file = kubelet_file(&root);
        damage(&file, &how);
        let evidence = std::fs::read(&file).ok();

        let serve = root.serve(&[]).await;
        let st = status(&root).await;
        assert_eq!(st["health"], "ownership_unknown", "{st}");
        assert!(st["errors_total"].as_u64().unwrap() >= 1);
        let log = serve.log();
        assert!(log.contains("device ownership is unknown"), "{log}");
        // No device is handed out while ownership is unknown.
        let _plugin = start_plugin(&root);
        root.wait_counts(GPU, 4, 4).await;
        let (code, _, err) = admit(&root, "uid-new", 1).await;
        assert_eq!(code, 1);
        assert!(err.contains("device ownership is unknown"), "{err}");
        assert!(err.contains("devicelet state recover"), "{err}");
        // The evidence is kept aside, byte for byte, never overwritten.
        let aside = kept_aside(
            &root.paths.device_plugins,
            device::DEVICE_CHECKPOINT_FILE,
            ".corrupt-",
        );
        assert_eq!(aside.len(), 1, "{aside:?}");
        match &evidence {
            Some(bytes) => assert_eq!(&std::fs::read(&aside[0]).unwrap(), bytes),
            None => assert!(aside[0].is_dir()),
        }
        if evidence.is_some() {
            let (code, _, _) = cli(
                root.path(),
                &["state", "inspect", "--file", aside[0].to_str().unwrap()],
            )
            .await;
            assert_eq!(code, 1, "state inspect must fail on a bad checkpoint");
        }

        // Recovery is an explicit, offline operator step.
        let (code, _, err) = cli(root.path(), &["state", "recover", "--from", "empty"]).await;
        assert_eq!(code, 1);
        assert!(err.contains("stop it first"), "{err}");
        assert_eq!(serve.terminate().await, 0);
        // Nothing admitted is lost: the journal names every pod's devices, so rebuilding from
        // it brings both pods back (`--from empty` is the last resort; tried on one damage).
        let from = if matches!(how, Damage::Directory) {
            "empty"
        } else {
            "journal"
        };
        let (code, out, err) = cli(root.path(), &["state", "recover", "--from", from]).await;
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("quarantine cleared"), "{out}");
        let serve = root.serve(&[]).await;
        assert_eq!(status(&root).await["health"], "ok");
        if from == "journal" {
            let (code, _, err) = cli(root.path(), &["state", "inspect"]).await;
            assert_eq!(code, 0, "the rebuilt kubelet file verifies: {err}");
            assert!(
                out.contains("rebuilt 2 pod(s), 2 allocation entries"),
                "{out}"
            );
            let mut restored = get_pods(&root).await;
            strip_health(&mut restored);
            let mut before = _pods.clone();
            strip_health(&mut before);
            assert_eq!(restored, before);
            root.wait_counts(GPU, 4, 4).await;
            let (code, _, err) = admit(&root, "uid-new", 1).await;
            assert_eq!(code, 0, "{err}");
            let (code, _, err) = admit(&root, "uid-more", 1).await;
            assert_eq!(code, 1, "every device is held again: {err}");
        } else {
            root.wait_counts(GPU, 4, 4).await;
            let (code, _, err) = admit(&root, "uid-new", 1).await;
            assert_eq!(code, 0, "{err}");
        }
        assert_eq!(serve.terminate().await, 0);
    }
}

/// Device health is live (it depends on whether the plugin is back), not part of the state.
fn strip_health(pods: &mut serde_json::Value) {
    for pod in pods["pods"].as_array_mut().unwrap() {
        for c in pod["containers"].as_array_mut().unwrap() {
            c.as_object_mut()
                .unwrap()
                .remove("allocatedResourcesStatus");
        }
    }
}

#[tokio::test]
async fn a2_damaged_or_newer_journal_refuses_admission_and_recovery_from_the_kubelet_file_keeps_every_allocation()
 {
    for newer_version in [true, false] {
        let (root, pods) = root_with_two_pods().await;
        let path = journal_file(&root);
        let mut bytes = std::fs::read(&path).unwrap();
        if newer_version {
            bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
            let crc = crc32_ieee(&bytes[0..32]);
            bytes[32..36].copy_from_slice(&crc.to_le_bytes());
        } else {
            let last = bytes.len() - 5;
            bytes[last] ^= 0x20;
        }
        std::fs::write(&path, &bytes).unwrap();

        let serve = root.serve(&[]).await;
        let st = status(&root).await;
        assert_eq!(st["health"], "ownership_unknown", "{st}");
        let detail = st["detail"].as_str().unwrap();
        if newer_version {
            assert!(detail.contains("version 99"), "{detail}");
            // Not damaged, only newer: left in place for the newer devicelet.
            assert_eq!(std::fs::read(&path).unwrap(), bytes);
        } else {
            assert_eq!(
                kept_aside(&root.paths.control_dir, JOURNAL_FILE, ".corrupt-").len(),
                1
            );
        }
        let (code, _, err) = admit(&root, "uid-new", 1).await;
        assert_eq!(code, 1);
        assert!(err.contains("device ownership is unknown"), "{err}");
        assert_eq!(serve.terminate().await, 0);

        // The kubelet file (exact after the clean stop) still has every allocation.
        let (code, _, err) =
            cli(root.path(), &["state", "recover", "--from", "kubelet-file"]).await;
        assert_eq!(code, 0, "{err}");
        let serve = root.serve(&[]).await;
        let after = get_pods(&root).await;
        let devices = |v: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
            v["pods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["pod"]["uid"].as_str().unwrap().to_owned(),
                        p["containers"][0]["devices"].clone(),
                    )
                })
                .collect()
        };
        assert_eq!(devices(&after), devices(&pods));
        assert_eq!(serve.terminate().await, 0);
    }
}

#[tokio::test]
async fn state_import_takes_over_a_kubelet_checkpoint_and_inspect_verifies_it() {
    // A checkpoint as a kubelet writes it (spec §3.2 example, checksum 1389290435).
    let kubelet = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"5d9c1f8e-0000-4000-8000-000000000001","ContainerName":"ctr","ResourceName":"example.com/gpu","DeviceIDs":{"-1":["gpu-9"],"0":["gpu-0","gpu-1"]},"AllocResp":"CgoKA0ZPTxIDYmFyGhgKCC9kZXYvZm9vEggvZGV2L2ZvbxoCcncqEgoQdmVuZG9yLmNvbS9kZXY9MQ=="}],"RegisteredDevices":{"example.com/gpu":["gpu-0","gpu-1","gpu-2","gpu-9"],"example.com/nic":["nic-a"]}},"Checksum":1389290435}"#;
    let root = Root::new();
    let src = root.path().join("from-kubelet");
    std::fs::write(&src, kubelet).unwrap();
    let (code, out, err) = cli(
        root.path(),
        &["state", "inspect", "--file", src.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gpu-0"), "{out}");
    for format in ["json", "yaml"] {
        let (code, out, _) = cli(
            root.path(),
            &[
                "state",
                "inspect",
                "--file",
                src.to_str().unwrap(),
                "-o",
                format,
            ],
        )
        .await;
        assert_eq!(code, 0);
        assert!(out.contains("1389290435"), "{out}");
    }
    let bad = root.path().join("bad");
    std::fs::write(&bad, kubelet.replace("1389290435", "1389290436")).unwrap();
    let (code, _, err) = cli(
        root.path(),
        &["state", "inspect", "--file", bad.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("checksum"), "{err}");
    let (code, _, err) = cli(
        root.path(),
        &["state", "import", "--file", bad.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 1, "a bad checkpoint is not imported");
    assert!(err.contains("not a valid device checkpoint"), "{err}");

    let (code, out, err) = cli(
        root.path(),
        &["state", "import", "--file", src.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("imported 1 allocation entries"), "{out}");
    let serve = root.serve(&[]).await;
    let pods = get_pods(&root).await;
    assert_eq!(
        pods["pods"][0]["pod"]["uid"],
        "5d9c1f8e-0000-4000-8000-000000000001"
    );
    let (code, out, err) = cli(
        root.path(),
        &[
            "start",
            "5d9c1f8e-0000-4000-8000-000000000001",
            "ctr",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let start: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(start["envs"]["FOO"], "bar");
    assert_eq!(start["cdiDevices"][0], "vendor.com/dev=1");
    // Both resources count as registered, with nothing allocatable until their plugins return.
    let snapshot = root.control().resources().await.unwrap();
    for r in [GPU, "example.com/nic"] {
        let view = snapshot
            .resource(r)
            .expect("registered from the checkpoint");
        assert_eq!(view.allocatable, 0);
    }
    assert_eq!(serve.terminate().await, 0);
}

/// Unmounts on drop (declared after the `Root`, so it runs first).
struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test]
async fn a2_12_full_disk_fails_admission_cleanly_and_admission_works_again_once_space_is_freed() {
    // The journal's directory R/devicelet on a 1 MiB tmpfs (logs and manifests stay outside).
    let root = Root::new();
    std::fs::create_dir_all(&root.paths.control_dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&root.paths.control_dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!(
            "SKIPPED: cannot mount a tmpfs (needs root); the store-level ENOSPC test covers the write path"
        );
        return;
    }
    let _mount = Mount(root.paths.control_dir.clone());
    let serve = root.serve(&[]).await;
    let plugin = start_plugin(&root);
    root.wait_counts(GPU, 4, 4).await;
    let (code, a, err) = admit(&root, "uid-a", 1).await;
    assert_eq!(code, 0, "{err}");
    // Fill the disk.
    let filler = root.paths.control_dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    // Appends that fit in the journal's last page still succeed (they are durable); keep
    // admitting device-less pods until a write needs a new block.
    let mut acked = vec!["uid-a".to_string()];
    let mut failed = None;
    for i in 0..200 {
        let uid = format!("uid-f{i:03}");
        let (code, _, err) = cli_with_manifest_outside(&root, &uid, false).await;
        if code == 0 {
            acked.push(uid);
            continue;
        }
        assert!(err.contains("durabl"), "{err}");
        assert!(err.contains("No space left"), "{err}");
        failed = Some(uid);
        break;
    }
    let failed = failed.expect("admission must fail on a full disk");
    // A pod that needs a device fails the same way and keeps no device.
    let (code, _, err) = cli_with_manifest_outside(&root, "uid-gpu", true).await;
    assert_eq!(code, 1);
    assert!(err.contains("No space left"), "{err}");
    // Nothing of the failed admissions remains; the earlier pods are intact.
    let pods = get_pods(&root).await;
    let uids: Vec<String> = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"]["uid"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(uids, acked);
    assert_eq!(pods["pods"][0]["containers"], a["containers"]);
    // Space freed: the same pods are admitted (A2 row 12: retry works without an operator).
    std::fs::remove_file(&filler).unwrap();
    for uid in [failed.as_str(), "uid-gpu"] {
        let (code, _, err) = cli_with_manifest_outside(&root, uid, uid == "uid-gpu").await;
        assert_eq!(code, 0, "{err}");
        acked.push(uid.to_owned());
    }
    acked.sort();
    serve.kill().await;
    let serve = root.serve(&[]).await;
    let uids: Vec<String> = get_pods(&root).await["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"]["uid"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(uids, acked);
    assert_eq!(serve.terminate().await, 0);
    plugin.kill().await;
}

/// Admits from a manifest in a directory of its own.
async fn cli_with_manifest_outside(root: &Root, uid: &str, gpu: bool) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod.yaml");
    let limits = if gpu {
        format!("\n    resources:\n      limits:\n        {GPU}: \"1\"")
    } else {
        String::new()
    };
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{uid}\n  uid: {uid}\nspec:\n  containers:\n  - name: main{limits}\n"
        ),
    )
    .unwrap();
    cli(root.path(), &["admit", "-f", path.to_str().unwrap()]).await
}

/// Spec §2 D1 (`needsReAllocate`): a kubelet checkpoint whose cached `Allocate` answer does not
/// decode still gives the container its devices; `start` asks the plugin again for the same
/// devices, and the new answer is durable (after a restart `start` answers with the plugin gone).
#[tokio::test]
async fn d1_lost_runtime_settings_are_allocated_again_for_the_same_devices_and_kept() {
    let root = Root::new();
    let data = device::DeviceCheckpointData {
        pod_device_entries: Some(vec![device::PodDevicesEntry {
            pod_uid: "pod-d1".into(),
            container_name: "ctr".into(),
            resource_name: GPU.into(),
            device_ids: Some([(0, Some(vec!["gpu-1".to_owned()]))].into()),
            // An incomplete varint: no protobuf decoder accepts it.
            alloc_resp: Some(vec![0xff, 0xff, 0xff]),
        }]),
        registered_devices: Some([(GPU.to_owned(), Some(vec!["gpu-1".to_owned()]))].into()),
    };
    let src = root.path().join("from-kubelet");
    std::fs::write(&src, device::encode(&data)).unwrap();
    let (code, _, err) = cli(
        root.path(),
        &["state", "import", "--file", src.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let serve = root.serve(&[]).await;
    let plugin = start_plugin(&root);
    root.wait_counts(GPU, 4, 4).await;
    let start = || async {
        let (code, out, err) = cli(root.path(), &["start", "pod-d1", "ctr", "-o", "json"]).await;
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    assert_eq!(start().await["envs"]["EXAMPLE_DEVICES"], "gpu-1");
    let allocates = plugin.log().matches("Allocate").count();
    assert_eq!(allocates, 1, "{}", plugin.log());
    assert!(serve.log().contains("asked for again"), "{}", serve.log());
    // Durable: restarted without the plugin, the answer is still there.
    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);
    let serve = root.serve(&[]).await;
    assert_eq!(start().await["envs"]["EXAMPLE_DEVICES"], "gpu-1");
    assert_eq!(serve.terminate().await, 0);
}
