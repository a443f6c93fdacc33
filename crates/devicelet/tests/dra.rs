//! DRA on the node, end to end with real processes: `devicelet serve`, the example DRA driver
//! (`devicelet example-driver`, registering through `R/plugins_registry`, writing CDI files)
//! and the CLI (`apply`, `admit`, `start`, `remove`, `get`). Spec dra-kubelet.md §2, §6 and
//! ecosystem.md A7/A8; names follow the behaviour they cover.
#![allow(clippy::unwrap_used)]

mod common;

#[path = "../src/example_driver/cdi.rs"]
#[allow(dead_code)]
mod cdi;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Proc, Root, WAIT, cli, free_address, scrape};
use serde_json::Value;

const DRIVER: &str = "gpu.example.com";

const OBJECTS: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: too-many, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu, allocationMode: ExactCount, count: 5}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu}
"#;

struct Node {
    root: Root,
    serve: Option<Proc>,
    driver: Option<Proc>,
    boot_id: PathBuf,
    serve_extra: Vec<String>,
}

impl Node {
    async fn start(driver_args: &[&str]) -> Node {
        Node::start_with(&[], driver_args).await
    }

    /// Like [`Node::start`] with extra `serve` flags (kept for restarts).
    async fn start_with(serve_args: &[&str], driver_args: &[&str]) -> Node {
        let root = Root::new();
        let boot_id = root.path().join("boot_id");
        std::fs::write(&boot_id, "boot-1\n").unwrap();
        let mut node = Node {
            root,
            serve: None,
            driver: None,
            boot_id,
            serve_extra: serve_args.iter().map(|s| (*s).to_owned()).collect(),
        };
        node.start_serve().await;
        node.start_driver(driver_args).await;
        let file = node.root.path().join("objects.yaml");
        std::fs::write(&file, OBJECTS).unwrap();
        node.ok(&["apply", "-f", file.to_str().unwrap()]).await;
        node
    }

    async fn start_serve(&mut self) {
        let boot = self.boot_id.to_str().unwrap().to_owned();
        let mut args = vec!["--boot-id-file", &boot, "--node-name", "node-1"];
        args.extend(self.serve_extra.iter().map(String::as_str));
        self.serve = Some(self.root.serve(&args).await);
    }

    async fn start_driver(&mut self, extra: &[&str]) {
        let cdi = self.cdi_dir();
        let mut args = vec![
            "example-driver",
            "--name",
            DRIVER,
            "--devices",
            "4",
            "--cdi-dir",
            cdi.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.driver = Some(self.root.spawn("driver", &args));
        self.wait_dra("driver registered and slice published", |d| {
            d["drivers"].as_array().is_some_and(|a| !a.is_empty())
                && d["publishedSlices"][DRIVER] == 1
        })
        .await;
    }

    fn cdi_dir(&self) -> PathBuf {
        self.root.path().join("cdi")
    }

    fn cdi_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.cdi_dir())
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        cli(self.root.path(), args).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    }

    async fn dra(&self) -> Value {
        self.root.control().get_json("/v1/dra").await.unwrap()
    }

    async fn objects(&self) -> Value {
        self.root
            .control()
            .get_json("/v1/draobjects")
            .await
            .unwrap()
    }

    async fn wait_dra(&self, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(v) = self.root.control().get_json::<Value>("/v1/dra").await
                && ready(&v)
            {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {:?}\nserve:\n{}\ndriver:\n{}",
                self.root.control().get_json::<Value>("/v1/dra").await,
                self.serve.as_ref().map(Proc::log).unwrap_or_default(),
                self.driver.as_ref().map(Proc::log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes a pod manifest and admits it; returns (exit code, stdout JSON or stderr).
    async fn admit(&self, uid: &str, claims: &[(&str, &str, bool)]) -> (i32, String) {
        let pod = pod(uid, claims);
        let file = self.root.path().join(format!("{uid}.json"));
        std::fs::write(&file, pod.to_string()).unwrap();
        let (code, out, err) = self
            .run(&["admit", "-f", file.to_str().unwrap(), "-o", "json"])
            .await;
        (code, if code == 0 { out } else { err })
    }

    fn driver_log_count(&self, needle: &str) -> usize {
        self.driver
            .as_ref()
            .map(|d| d.log().matches(needle).count())
            .unwrap_or_default()
    }
}

/// A pod whose container `ctr` uses every pod claim; `(pod claim, claim or template, template?)`.
fn pod(uid: &str, claims: &[(&str, &str, bool)]) -> Value {
    let entries: Vec<Value> = claims
        .iter()
        .map(|(n, c, template)| {
            if *template {
                serde_json::json!({"name": n, "resourceClaimTemplateName": c})
            } else {
                serde_json::json!({"name": n, "resourceClaimName": c})
            }
        })
        .collect();
    let refs: Vec<Value> = claims
        .iter()
        .map(|(n, _, _)| serde_json::json!({"name": n}))
        .collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": "default", "uid": uid},
        "spec": {"resourceClaims": entries,
                 "containers": [{"name": "ctr", "resources": {"claims": refs}}]}
    })
}

fn cdi_of(admitted: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(admitted).unwrap();
    v["containers"][0]["claims"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["cdiDevices"].as_array().unwrap().clone())
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

async fn start_cdi(node: &Node, uid: &str) -> Vec<String> {
    let out = node.ok(&["start", uid, "ctr", "-o", "json"]).await;
    let v: Value = serde_json::from_str(&out).unwrap();
    v["cdiDevices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn claim_status(objects: &Value, key: &str) -> Value {
    objects["resourceClaims"][key]["status"].clone()
}

fn validate_file(path: &Path) {
    let spec: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(
        cdi::validate(&spec),
        Vec::<String>::new(),
        "{}",
        path.display()
    );
}

#[tokio::test]
async fn dra_local_flow_named_and_template_claims_cdi_files_valid() {
    let node = Node::start(&[]).await;
    let (code, out) = node
        .admit("pod-a", &[("s", "shared", false), ("own", "one-gpu", true)])
        .await;
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let claims = v["containers"][0]["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 2, "{out}");
    for c in claims {
        assert_eq!(c["driver"], DRIVER);
        assert_eq!(c["namespace"], "default");
        assert!(c["device"].as_str().unwrap().starts_with("gpu-"));
    }
    assert_ne!(
        claims[0]["device"], claims[1]["device"],
        "two claims, two devices"
    );
    let cdi_ids = cdi_of(&out);
    assert_eq!(cdi_ids.len(), 2);
    // Real CDI 1.0 files, valid against the schema, one per claim.
    let files = node.cdi_files();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        validate_file(f);
    }
    let mut started = start_cdi(&node, "pod-a").await;
    started.sort();
    let mut want = cdi_ids.clone();
    want.sort();
    assert_eq!(started, want);

    // Allocation and reservation are visible in the stored claim.
    let objects = node.objects().await;
    let st = claim_status(&objects, "default/shared");
    assert_eq!(st["reservedFor"][0]["uid"], "pod-a");
    assert!(st["allocation"]["devices"]["results"][0]["device"].is_string());

    node.ok(&["remove", "pod-a"]).await;
    assert!(
        node.cdi_files().is_empty(),
        "unprepare removes the CDI files"
    );
    let objects = node.objects().await;
    assert!(
        claim_status(&objects, "default/shared")["allocation"].is_null(),
        "released: {objects}"
    );
    let template_claims = objects["resourceClaims"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("default/pod-pod-a-own-"))
        .count();
    assert_eq!(
        template_claims, 0,
        "the template claim is deleted with its pod"
    );
}

/// `get slices` shows what the driver published to the node: every device, by pool.
#[tokio::test]
async fn get_slices_lists_the_driver_s_devices() {
    let node = Node::start(&[]).await;
    let json: Value =
        serde_json::from_str(&node.ok(&["get", "slices", "-o", "json"]).await).unwrap();
    assert_eq!(json["kind"], "ResourceSliceList");
    let items = json["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{json}");
    assert_eq!(items[0]["spec"]["driver"], DRIVER);
    let devices: Vec<&str> = items[0]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(
        devices.len() >= 2 && devices.iter().all(|d| d.starts_with("gpu-")),
        "{devices:?}"
    );
    let table = node.ok(&["get", "slices"]).await;
    assert!(table.starts_with("DRIVER"), "{table}");
    for device in &devices {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(DRIVER) && l.contains(device)),
            "{device} in\n{table}"
        );
    }
}

#[tokio::test]
async fn dra_allocation_failure_explains_and_leaves_nothing_allocated() {
    let node = Node::start(&[]).await;
    let (code, err) = node
        .admit("pod-x", &[("a", "shared", false), ("b", "too-many", false)])
        .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot allocate ResourceClaims default/shared, default/too-many")
            && err.contains("node node-1"),
        "{err}"
    );
    let objects = node.objects().await;
    assert!(
        claim_status(&objects, "default/shared").is_null()
            || claim_status(&objects, "default/shared")["allocation"].is_null()
    );
    assert!(node.cdi_files().is_empty());
    assert_eq!(node.driver_log_count("claim prepared"), 0);
}

#[tokio::test]
async fn a7_49_pod_force_deleted_while_its_claim_is_gone_unprepares_from_cache() {
    let node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-f", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(node.cdi_files().len(), 1);
    node.root
        .control()
        .request(
            http::Method::DELETE,
            "/v1/resourceclaims/default/shared",
            None,
        )
        .await
        .unwrap();
    node.ok(&["remove", "pod-f"]).await;
    assert!(
        node.cdi_files().is_empty(),
        "unprepared from cached information"
    );
    let dra = node.dra().await;
    assert!(dra["cachedClaims"].as_object().unwrap().is_empty(), "{dra}");
}

#[tokio::test]
async fn b6_two_pods_share_a_claim_one_removed_keeps_it_prepared() {
    let node = Node::start(&[]).await;
    let (code, a) = node.admit("pod-1", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{a}");
    let (code, b) = node.admit("pod-2", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{b}");
    assert_eq!(cdi_of(&a), cdi_of(&b), "one claim, one device");
    assert_eq!(node.driver_log_count("claim prepared"), 1, "prepared once");
    node.ok(&["remove", "pod-1"]).await;
    assert_eq!(node.cdi_files().len(), 1, "still used by pod-2");
    assert_eq!(node.driver_log_count("claim unprepared"), 0);
    assert_eq!(start_cdi(&node, "pod-2").await, cdi_of(&b));
    let objects = node.objects().await;
    let st = claim_status(&objects, "default/shared");
    assert_eq!(st["reservedFor"].as_array().unwrap().len(), 1);
    assert!(st["allocation"].is_object());
    node.ok(&["remove", "pod-2"]).await;
    assert!(node.cdi_files().is_empty());
    assert_eq!(node.driver_log_count("claim unprepared"), 1);
}

#[tokio::test]
async fn e4_same_claim_twice_in_one_pod_is_prepared_once() {
    let node = Node::start(&[]).await;
    let (code, out) = node
        .admit(
            "pod-d",
            &[("one", "shared", false), ("two", "shared", false)],
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(node.driver_log_count("claim prepared"), 1);
    let ids = start_cdi(&node, "pod-d").await;
    assert_eq!(ids.len(), 1, "de-duplicated: {ids:?}");
    node.ok(&["remove", "pod-d"]).await;
    assert!(node.cdi_files().is_empty());
}

#[tokio::test]
async fn devicelet_restart_between_prepare_and_start_keeps_claims_prepared() {
    let mut node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-r", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    node.serve.take().unwrap().terminate().await;
    node.start_serve().await;
    // The driver re-registers through the watcher and republishes its slice (A8 row 54).
    node.wait_dra("driver re-registered", |d| {
        d["drivers"].as_array().is_some_and(|a| !a.is_empty()) && d["publishedSlices"][DRIVER] == 1
    })
    .await;
    assert_eq!(start_cdi(&node, "pod-r").await, cdi_of(&out));
    // Re-admission after the restart needs no driver call: same boot, already prepared.
    let (code, again) = node.admit("pod-r", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{again}");
    assert_eq!(cdi_of(&again), cdi_of(&out));
    assert_eq!(node.driver_log_count("claim prepared"), 1);
    node.ok(&["remove", "pod-r"]).await;
    assert!(node.cdi_files().is_empty());
}

#[tokio::test]
async fn a7_53_reboot_boot_id_changes_claims_are_prepared_again() {
    let mut node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-b", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    node.serve.take().unwrap().terminate().await;
    // Reboot: tmpfs CDI directory wiped, new boot ID.
    for f in node.cdi_files() {
        std::fs::remove_file(f).unwrap();
    }
    std::fs::write(&node.boot_id, "boot-2\n").unwrap();
    node.start_serve().await;
    node.wait_dra("driver re-registered", |d| {
        d["drivers"].as_array().is_some_and(|a| !a.is_empty())
    })
    .await;
    let (code, again) = node.admit("pod-b", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{again}");
    assert_eq!(node.driver_log_count("claim prepared"), 2, "prepared again");
    assert_eq!(node.cdi_files().len(), 1, "CDI spec re-created");
    validate_file(&node.cdi_files()[0]);
}

#[tokio::test]
async fn driver_restart_mid_prepare_fails_the_admission_then_succeeds() {
    let mut node = Node::start(&["--prepare-delay", "3s"]).await;
    let file = node.root.path().join("pod-m.json");
    std::fs::write(&file, pod("pod-m", &[("s", "shared", false)]).to_string()).unwrap();
    let root = node.root.path().to_path_buf();
    let admit = tokio::spawn(async move {
        cli(
            &root,
            &["admit", "-f", file.to_str().unwrap(), "-o", "json"],
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.driver.take().unwrap().kill().await;
    let (code, _, err) = admit.await.unwrap();
    assert_eq!(
        code, 1,
        "prepare cannot succeed when the driver dies: {err}"
    );
    // Nothing stays reserved for the pod once the (restarted) driver unprepared.
    node.start_driver(&[]).await;
    node.wait_dra("failed admission cleaned up", |d| {
        d["pendingUnprepare"].as_array().is_some_and(Vec::is_empty)
            && d["cachedClaims"].as_object().is_some_and(|c| c.is_empty())
    })
    .await;
    let (code, out) = node.admit("pod-m", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(node.cdi_files().len(), 1);
}

#[tokio::test]
async fn b12_driver_gone_at_unprepare_is_retried_until_it_returns() {
    let mut node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-g", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    node.driver.take().unwrap().terminate().await;
    node.wait_dra("driver deregistered", |d| {
        d["drivers"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let (code, _, err) = node.run(&["remove", "pod-g"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("not registered"), "{err}");
    // Issue 40: said as a removal whose unprepare waits, not as an admission failure.
    assert!(
        err.contains("pod pod-g removed, but its DRA claims are not unprepared yet")
            && !err.contains("AdmissionError"),
        "{err}"
    );
    let dra = node.dra().await;
    assert_eq!(dra["pendingUnprepare"][0], "pod-g", "{dra}");
    // Not released while unprepare is pending (B19): still reserved, file still there.
    let objects = node.objects().await;
    assert_eq!(
        claim_status(&objects, "default/shared")["reservedFor"][0]["uid"],
        "pod-g"
    );
    assert_eq!(node.cdi_files().len(), 1);
    node.start_driver(&[]).await;
    node.wait_dra("pending unprepare done", |d| {
        d["pendingUnprepare"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert!(node.cdi_files().is_empty());
    let objects = node.objects().await;
    assert!(claim_status(&objects, "default/shared")["allocation"].is_null());
}

#[tokio::test]
async fn b17_health_stream_shows_in_get_pods() {
    let node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-h", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let device = v["containers"][0]["claims"][0]["device"]
        .as_str()
        .unwrap()
        .to_owned();
    let health_file = node.root.path().join("plugins").join(DRIVER).join("health");
    std::fs::write(&health_file, format!("{device} Unhealthy overheated\n")).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let pods = node.root.control().pods().await.unwrap();
        let c = &pods.pods[0].containers[0].claims[0];
        if c.health == "Unhealthy" {
            assert_eq!(c.health_message, "overheated");
            // B17: the pod-status form, `claim:<pod claim>` with the CDI ID as resourceID.
            let status = &pods.pods[0].containers[0].allocated_resources_status;
            let entry = status.iter().find(|s| s.name == "claim:s").unwrap();
            assert_eq!(entry.resources.len(), 1);
            assert_eq!(entry.resources[0].health, "Unhealthy");
            assert_eq!(entry.resources[0].resource_id, c.cdi_devices[0]);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health not reflected: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `resources[0]` of the `claim:s` status entry of the only pod in `get pods -o json`.
fn claim_s_health(pods: &Value) -> Value {
    pods["pods"][0]["containers"][0]["allocatedResourcesStatus"]
        .as_array()
        .and_then(|s| s.iter().find(|e| e["name"] == "claim:s"))
        .map_or(Value::Null, |e| e["resources"][0].clone())
}

/// Polls `get pods -o json` until the claim's health entry satisfies `ready`.
async fn wait_claim_health(node: &Node, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let out = node.ok(&["get", "pods", "-o", "json"]).await;
        let entry = claim_s_health(&serde_json::from_str(&out).unwrap());
        if ready(&entry) {
            return entry;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: last entry {entry}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn kep4680_dra_health_message_reaches_allocated_resources_status() {
    let node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-m", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let device = v["containers"][0]["claims"][0]["device"]
        .as_str()
        .unwrap()
        .to_owned();
    let health_file = node.root.path().join("plugins").join(DRIVER).join("health");

    // Healthy without a message: no `message` key (the kubelet leaves it unset).
    let entry = wait_claim_health(&node, "healthy", |e| e["health"] == "Healthy").await;
    assert!(entry.get("message").is_none(), "{entry}");

    std::fs::write(
        &health_file,
        format!("{device} Unhealthy ECC errors over threshold\n"),
    )
    .unwrap();
    let entry = wait_claim_health(&node, "unhealthy with message", |e| {
        e["health"] == "Unhealthy"
    })
    .await;
    assert_eq!(entry["message"], "ECC errors over threshold");

    // Same health, only the message changes: reported too.
    std::fs::write(&health_file, format!("{device} Unhealthy fan stopped\n")).unwrap();
    wait_claim_health(&node, "new message", |e| e["message"] == "fan stopped").await;
    let table = node.ok(&["get", "pods"]).await;
    assert!(table.contains("(fan stopped)"), "{table}");

    // A message over the API's 1024 bytes is cut as the kubelet cuts it.
    let long = "x".repeat(1500);
    std::fs::write(&health_file, format!("{device} Unhealthy {long}\n")).unwrap();
    let entry = wait_claim_health(&node, "truncated message", |e| {
        e["message"].as_str().is_some_and(|m| m.starts_with('x'))
    })
    .await;
    let message = entry["message"].as_str().unwrap();
    assert_eq!(message, format!("{}...", "x".repeat(1021)));

    // Healthy again with no message: the message is gone.
    std::fs::write(&health_file, format!("{device} Healthy\n")).unwrap();
    let entry = wait_claim_health(&node, "healthy again", |e| e["health"] == "Healthy").await;
    assert!(entry.get("message").is_none(), "{entry}");
}

/// The value of the sample line `series` (name plus labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn b15_dra_metrics_recorded_by_prepare_unprepare_and_driver_rpcs() {
    let address = free_address();
    let node = Node::start_with(&["--metrics-address", &address], &[]).await;
    // Before any pod: the `<any>` series exists with 0 (always emitted, B15).
    let text = scrape(&address).await;
    assert_eq!(
        sample(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
        Some(0.0),
        "{text}"
    );
    let (code, out) = node
        .admit("pod-m", &[("s", "shared", false), ("own", "one-gpu", true)])
        .await;
    assert_eq!(code, 0, "{out}");
    let prepare_ok = "dra_operations_duration_seconds_count{operation_name=\"PrepareResources\",is_error=\"false\"}";
    let unprepare_ok = "dra_operations_duration_seconds_count{operation_name=\"UnprepareResources\",is_error=\"false\"}";
    let rpc = |method: &str| {
        format!(
            "dra_grpc_operations_duration_seconds_count{{driver_name=\"{DRIVER}\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}\",grpc_status_code=\"OK\"}}"
        )
    };
    let text = scrape(&address).await;
    assert_eq!(sample(&text, prepare_ok), Some(1.0), "{text}");
    // Two claims of one driver: one batched NodePrepareResources.
    assert_eq!(
        sample(&text, &rpc("NodePrepareResources")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("dra_resource_claims_in_use{{driver_name=\"{DRIVER}\"}}")
        ),
        Some(2.0),
        "{text}"
    );
    // The kubelet's buckets: 0.1 s … 40 s.
    assert!(
        text.contains("dra_operations_duration_seconds_bucket{le=\"0.1\",operation_name=\"PrepareResources\",is_error=\"false\"}"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE dra_grpc_operations_duration_seconds histogram"),
        "{text}"
    );

    node.ok(&["remove", "pod-m"]).await;
    let text = scrape(&address).await;
    assert_eq!(sample(&text, unprepare_ok), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &rpc("NodeUnprepareResources")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
        Some(0.0),
        "{text}"
    );
    assert!(
        !text.contains(&format!(
            "dra_resource_claims_in_use{{driver_name=\"{DRIVER}\"}}"
        )),
        "{text}"
    );
}

#[tokio::test]
async fn b15_failed_unprepare_is_counted_as_an_error() {
    let address = free_address();
    let mut node = Node::start_with(&["--metrics-address", &address], &[]).await;
    let (code, out) = node.admit("pod-e", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    node.driver.take().unwrap().terminate().await;
    node.wait_dra("driver deregistered", |d| {
        d["drivers"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let (code, _, _) = node.run(&["remove", "pod-e"]).await;
    assert_eq!(code, 1);
    let text = scrape(&address).await;
    let failed = "dra_operations_duration_seconds_count{operation_name=\"UnprepareResources\",is_error=\"true\"}";
    assert!(sample(&text, failed).is_some_and(|n| n >= 1.0), "{text}");
    // The prepared mark is cleared (durably) before the driver is asked, so a claim being
    // torn down no longer counts as in use even while the unprepare is pending.
    assert_eq!(
        sample(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
        Some(0.0),
        "{text}"
    );
}

/// `(claim namespace, claim name, driver, pool, device, CDI names)` of one `ClaimResource`.
type ClaimRow = (String, String, String, String, String, Vec<String>);

fn dynamic_rows(
    container: &devicelet_proto::podresources::v1::ContainerResources,
) -> Vec<ClaimRow> {
    let mut rows: Vec<ClaimRow> = container
        .dynamic_resources
        .iter()
        .flat_map(|d| {
            d.claim_resources.iter().map(|r| {
                (
                    d.claim_namespace.clone(),
                    d.claim_name.clone(),
                    r.driver_name.clone(),
                    r.pool_name.clone(),
                    r.device_name.clone(),
                    r.cdi_devices.iter().map(|c| c.name.clone()).collect(),
                )
            })
        })
        .collect();
    rows.sort();
    rows
}

#[tokio::test]
async fn b14_pod_resources_list_and_get_report_prepared_claims_as_dynamic_resources() {
    use devicelet_proto::podresources::v1;
    use v1::pod_resources_lister_client::PodResourcesListerClient;

    let node = Node::start(&[]).await;
    let (code, out) = node
        .admit("pod-p", &[("s", "shared", false), ("own", "one-gpu", true)])
        .await;
    assert_eq!(code, 0, "{out}");
    // What admit reported is what PodResources must report.
    let admitted: Value = serde_json::from_str(&out).unwrap();
    let mut want: Vec<ClaimRow> = admitted["containers"][0]["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["namespace"].as_str().unwrap().to_owned(),
                c["claim"].as_str().unwrap().to_owned(),
                c["driver"].as_str().unwrap().to_owned(),
                c["pool"].as_str().unwrap().to_owned(),
                c["device"].as_str().unwrap().to_owned(),
                c["cdiDevices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(want.len(), 2, "{out}");
    assert!(want.iter().any(|r| r.1 == "shared"));
    assert!(
        want.iter().any(|r| r.1.starts_with("pod-pod-p-own-")),
        "template claim: {want:?}"
    );
    for r in &want {
        assert_eq!(r.0, "default");
        assert_eq!(r.2, DRIVER);
        assert!(!r.3.is_empty(), "pool = the driver's pool (host name)");
        assert_eq!(r.5.len(), 1);
        assert!(r.5[0].starts_with("gpu.example.com/device="), "{r:?}");
    }

    let channel = devicelet_rpc::transport::dial(
        &node.root.paths.pod_resources_socket,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut client = PodResourcesListerClient::new(channel);
    let list = client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let pod = list
        .pod_resources
        .iter()
        .find(|p| p.name == "pod-pod-p" && p.namespace == "default")
        .unwrap_or_else(|| panic!("pod missing from List: {list:?}"));
    assert_eq!(pod.containers.len(), 1);
    assert_eq!(pod.containers[0].name, "ctr");
    assert!(
        pod.containers[0].devices.is_empty(),
        "no device-plugin devices"
    );
    assert_eq!(dynamic_rows(&pod.containers[0]), want);

    let got = client
        .get(v1::GetPodResourcesRequest {
            pod_name: "pod-pod-p".to_owned(),
            pod_namespace: "default".to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_resources
        .unwrap();
    assert_eq!(dynamic_rows(&got.containers[0]), want);

    // Removed: unprepared and gone from List.
    node.ok(&["remove", "pod-p"]).await;
    let list = client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        !list.pod_resources.iter().any(|p| p.name == "pod-pod-p"),
        "{list:?}"
    );
}

fn devicelet_dir(node: &Node) -> PathBuf {
    node.root.path().join("devicelet")
}

fn files_starting_with(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect()
}

#[tokio::test]
async fn corrupt_dra_objects_file_daemon_starts_dra_fail_closed_until_state_recover() {
    let mut node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-q", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    node.serve.take().unwrap().terminate().await;
    let objects = devicelet_dir(&node).join("dra_objects.json");
    std::fs::write(&objects, b"{\"deviceClasses\": {trunc").unwrap();

    // The daemon starts (device plugins, PodResources, control API are unaffected) ...
    node.start_serve().await;
    let dra = node
        .wait_dra("driver re-registered", |d| {
            d["drivers"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    let quarantine = dra["quarantine"].as_array().unwrap();
    assert_eq!(quarantine.len(), 1, "{dra}");
    assert!(
        quarantine[0]
            .as_str()
            .unwrap()
            .contains("could not be read"),
        "{dra}"
    );
    // ... the bad file is kept aside, with a marker ...
    assert_eq!(
        files_starting_with(&devicelet_dir(&node), "dra_objects.json.corrupt-").len(),
        1
    );
    assert!(devicelet_dir(&node).join("dra_objects.quarantine").exists());
    // ... and DRA is fail-closed: no admission with claims, no release, no background
    // unprepare of the pod the claim cache still holds.
    let (code, err) = node.admit("pod-new", &[("s", "shared", false)]).await;
    assert_eq!(code, 1);
    assert!(err.contains("DRA objects state unknown"), "{err}");
    let (code, _, err) = node.run(&["remove", "pod-q"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("DRA objects state unknown"), "{err}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(node.cdi_files().len(), 1, "pod-q's claim stays prepared");
    assert_eq!(node.driver_log_count("claim unprepared"), 0);
    // A pod without claims is admitted as usual.
    let plain = node.root.path().join("plain.json");
    std::fs::write(
        &plain,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "plain", "namespace": "default", "uid": "pod-plain"},
            "spec": {"containers": [{"name": "c"}]}})
        .to_string(),
    )
    .unwrap();
    node.ok(&["admit", "-f", plain.to_str().unwrap()]).await;

    // A restart keeps the quarantine (the marker), and recovery needs devicelet stopped.
    let (code, _, err) = node.run(&["state", "recover", "--dra-only"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("stop it first"), "{err}");
    node.serve.take().unwrap().terminate().await;
    let out = node
        .ok(&["state", "recover", "--dra-only", "-o", "json"])
        .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    let cleared = v["dra_cleared_quarantine"].as_array().unwrap();
    assert_eq!(cleared.len(), 1, "{out}");
    assert!(
        cleared[0]
            .as_str()
            .unwrap()
            .ends_with("dra_objects.quarantine"),
        "{out}"
    );
    assert!(v.get("moved").is_none(), "device state untouched: {out}");

    // After recovery the store starts empty; the claim the cache still holds for the pod
    // nobody knows any more is unprepared in the background.
    node.start_serve().await;
    node.wait_dra("leftover claim unprepared", |d| {
        d["quarantine"].is_null()
            && d["cachedClaims"].as_object().is_some_and(|c| c.is_empty())
            && d["pendingUnprepare"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert!(node.cdi_files().is_empty());
    let file = node.root.path().join("objects.yaml");
    node.ok(&["apply", "-f", file.to_str().unwrap()]).await;
    let (code, out) = node.admit("pod-new", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
}

#[tokio::test]
async fn corrupt_dra_manager_state_quarantines_claims_state_recover_clears_it() {
    let mut node = Node::start(&[]).await;
    let (code, out) = node.admit("pod-c", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{out}");
    node.serve.take().unwrap().terminate().await;
    let checkpoint = node.root.path().join("dra_manager_state");
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x01; // a checksum digit
    std::fs::write(&checkpoint, bytes).unwrap();

    node.start_serve().await;
    let dra = node
        .wait_dra("driver re-registered", |d| {
            d["drivers"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    assert!(
        dra["quarantine"][0]
            .as_str()
            .unwrap()
            .contains("dra_manager_state.quarantine"),
        "{dra}"
    );
    assert_eq!(
        files_starting_with(node.root.path(), "dra_manager_state.corrupt-").len(),
        1
    );
    // Refused before anything is allocated or reserved for the pod.
    let (code, err) = node.admit("pod-d", &[("own", "one-gpu", true)]).await;
    assert_eq!(code, 1);
    assert!(err.contains("state"), "{err}");
    let objects = node.objects().await;
    assert!(
        !objects["resourceClaims"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.contains("pod-pod-d")),
        "{objects}"
    );

    node.serve.take().unwrap().terminate().await;
    let out = node.ok(&["state", "recover", "--dra-only"]).await;
    assert!(out.contains("DRA quarantine cleared"), "{out}");
    assert!(out.contains("dra_manager_state.quarantine"), "{out}");
    node.start_serve().await;
    node.wait_dra("driver re-registered, no quarantine", |d| {
        d["drivers"].as_array().is_some_and(|a| !a.is_empty()) && d["quarantine"].is_null()
    })
    .await;
    // The cache starts empty: re-admitting the pod prepares its claim again (the driver is
    // idempotent), and removal unprepares it.
    let (code, again) = node.admit("pod-c", &[("s", "shared", false)]).await;
    assert_eq!(code, 0, "{again}");
    assert_eq!(node.driver_log_count("claim prepared"), 2);
    node.ok(&["remove", "pod-c"]).await;
    assert!(node.cdi_files().is_empty());
}

#[tokio::test]
async fn a8_55_driver_back_within_the_wipe_window_keeps_its_slices_even_after_a_second_absence() {
    const DELAY: Duration = Duration::from_secs(4);
    let mut node = Node::start_with(&["--dra-wipe-delay", "4s"], &[]).await;
    let deregistered = |d: &Value| d["drivers"].as_array().is_some_and(Vec::is_empty);
    let wiped = "published ResourceSlices are wiped";

    // First absence at t0; back well within the delay.
    let t0 = tokio::time::Instant::now();
    node.driver.take().unwrap().terminate().await;
    let d = node.wait_dra("driver deregistered", deregistered).await;
    assert_eq!(d["publishedSlices"][DRIVER], 1, "not wiped at once: {d}");
    node.start_driver(&[]).await;
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "too slow to test"
    );
    // Second absence, starting 1.5 s after the first: its own deadline is t0 + 5.5 s.
    tokio::time::sleep_until(t0 + Duration::from_millis(1500)).await;
    node.driver.take().unwrap().terminate().await;
    node.wait_dra("driver deregistered again", deregistered)
        .await;
    // Past the first absence's deadline: the slices survive (the registration in between
    // cancelled that wipe), though no instance is registered right now.
    tokio::time::sleep_until(t0 + DELAY + Duration::from_millis(500)).await;
    let d = node.dra().await;
    assert!(deregistered(&d));
    assert_eq!(d["publishedSlices"][DRIVER], 1, "wiped too early: {d}");
    let log = node.serve.as_ref().unwrap().log();
    assert!(!log.contains(wiped), "{log}");
    assert!(
        log.contains("driver back within the wipe delay"),
        "the first wipe was cancelled: {log}"
    );
    // A full delay of absence wipes them (§1.11) ...
    node.wait_dra("slices wiped after the second absence", |d| {
        d["publishedSlices"][DRIVER].is_null()
    })
    .await;
    assert_eq!(node.serve.as_ref().unwrap().log().matches(wiped).count(), 1);
    // ... and the returning driver publishes again (A8 row 54).
    node.start_driver(&[]).await;
}

const NIC: &str = "nic.example.com";

const NIC_OBJECTS: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic}
spec:
  selectors:
  - cel: {expression: 'device.driver == "nic.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: nic-claim, namespace: default}
spec:
  devices:
    requests:
    - name: nic
      exactly: {deviceClassName: nic}
"#;

#[tokio::test]
async fn a7_52_two_drivers_one_dies_mid_prepare_the_other_is_unprepared_at_once() {
    let node = Node::start(&[]).await;
    let nic_file = node.root.path().join("nic.yaml");
    std::fs::write(&nic_file, NIC_OBJECTS).unwrap();
    node.ok(&["apply", "-f", nic_file.to_str().unwrap()]).await;
    let cdi = node.cdi_dir();
    let nic_args = |extra: &'static [&'static str]| {
        let mut v = vec![
            "example-driver".to_owned(),
            "--name".to_owned(),
            NIC.to_owned(),
            "--devices".to_owned(),
            "2".to_owned(),
            "--cdi-dir".to_owned(),
            cdi.to_str().unwrap().to_owned(),
        ];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let spawn_nic = |extra: &'static [&'static str]| {
        let args = nic_args(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        node.root.spawn("nic", &refs)
    };
    let nic = spawn_nic(&["--prepare-delay", "3s"]);
    node.wait_dra("nic registered", |d| d["publishedSlices"][NIC] == 1)
        .await;

    let file = node.root.path().join("pod-2d.json");
    std::fs::write(
        &file,
        pod(
            "pod-2d",
            &[("g", "shared", false), ("n", "nic-claim", false)],
        )
        .to_string(),
    )
    .unwrap();
    let root = node.root.path().to_path_buf();
    let admit = tokio::spawn(async move {
        cli(
            &root,
            &["admit", "-f", file.to_str().unwrap(), "-o", "json"],
        )
        .await
    });
    // The GPU driver answers at once; the NIC driver dies while preparing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    nic.kill().await;
    let (code, _, err) = admit.await.unwrap();
    assert_eq!(code, 1, "{err}");
    // The kubelet (B7) would leave the GPU claim prepared until the pod terminates; devicelet
    // rolls the admission back at once (as k/k PR #137945 proposed): the GPU driver already
    // unprepared it and removed its CDI spec. The NIC claim's unprepare waits for its driver,
    // and until then nothing is released (B19).
    assert_eq!(node.driver_log_count("claim prepared"), 1);
    assert_eq!(node.driver_log_count("claim unprepared"), 1);
    assert!(node.cdi_files().is_empty(), "{:?}", node.cdi_files());
    let d = node.dra().await;
    assert_eq!(d["pendingUnprepare"][0], "pod-2d", "{d}");
    let cached: Vec<&String> = d["cachedClaims"].as_object().unwrap().keys().collect();
    assert_eq!(cached, vec!["default/nic-claim"], "{d}");

    // The NIC driver returns: the pending unprepare completes and both claims are released.
    let _nic = spawn_nic(&[]);
    node.wait_dra("pending unprepare done", |d| {
        d["pendingUnprepare"].as_array().is_some_and(Vec::is_empty)
            && d["cachedClaims"].as_object().is_some_and(|c| c.is_empty())
    })
    .await;
    let objects = node.objects().await;
    for k in ["default/shared", "default/nic-claim"] {
        assert!(
            claim_status(&objects, k)["reservedFor"].is_null(),
            "{k}: {objects}"
        );
    }
    // And the pod can be admitted with both drivers working.
    let (code, out) = node
        .admit(
            "pod-2d",
            &[("g", "shared", false), ("n", "nic-claim", false)],
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(node.cdi_files().len(), 2);
}
