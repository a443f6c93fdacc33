//! Pods that really run: `devicelet serve --runtime cri` against a real containerd, with the
//! example device plugin and DRA driver as real processes, checked from inside the containers
//! (their own output, read with `devicelet logs`).
//!
//! Needs a containerd: `interop/cri/run.sh` installs Debian's containerd, runc and
//! busybox-static, starts containerd on a private socket, imports `devicelet.local/busybox:1`
//! and runs these tests with `DEVICELET_CRI_ENDPOINT` set. Without it they say so and pass
//! (the README's `cargo test --workspace` runs on machines without a container runtime).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Proc, Root, WAIT, cli, scrape};
use serde_json::{Value, json};

const IMAGE: &str = "devicelet.local/busybox:1";

fn endpoint() -> Option<String> {
    let endpoint = std::env::var("DEVICELET_CRI_ENDPOINT").ok();
    if endpoint.is_none() {
        eprintln!(
            "skipped: DEVICELET_CRI_ENDPOINT is not set (interop/cri/run.sh starts containerd and sets it)"
        );
    }
    endpoint
}

fn uid() -> String {
    uuid_like()
}

/// A fresh UID (time and counter based; no extra dependency).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let pid = std::process::id();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (t >> 32) as u32,
        (t & 0xffff) as u16,
        pid & 0xfff,
        n & 0xfff,
        t & 0xffff_ffff_ffff
    )
}

/// A node: `serve --runtime cri` on a fresh root.
struct Node {
    root: Root,
    serve: Option<Proc>,
    serve_args: Vec<String>,
    others: Vec<Proc>,
}

impl Node {
    async fn start(endpoint: &str, extra: &[&str]) -> Node {
        let root = Root::new();
        let cdi = root.path().join("cdi");
        std::fs::create_dir_all(&cdi).unwrap();
        let mut with_cdi = vec!["--cdi-spec-dir", cdi.to_str().unwrap()];
        with_cdi.extend_from_slice(extra);
        Node::start_on(root, endpoint, &with_cdi).await
    }

    /// `serve --runtime cri` with devicelet's own defaults otherwise (the CDI spec directories
    /// included).
    async fn start_on(root: Root, endpoint: &str, extra: &[&str]) -> Node {
        let mut serve_args: Vec<String> = [
            "--runtime",
            "cri",
            "--container-runtime-endpoint",
            endpoint,
            "--node-name",
            "node-1",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if !extra.contains(&"--metrics-address") {
            serve_args.extend(["--metrics-address".to_owned(), "off".to_owned()]);
        }
        serve_args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut node = Node {
            root,
            serve: None,
            serve_args,
            others: Vec::new(),
        };
        node.start_serve().await;
        node
    }

    async fn start_serve(&mut self) {
        let args: Vec<&str> = self.serve_args.iter().map(String::as_str).collect();
        self.serve = Some(self.root.serve(&args).await);
    }

    /// Runs the example plugin with `devices` devices of `example.com/foo` (and a CDI spec for
    /// them) and waits until they are advertised.
    async fn example_plugin(&mut self, devices: u64, extra: &[&str]) {
        let cdi = self.cdi_dir();
        let count = devices.to_string();
        let mut args = vec![
            "--resource",
            "example.com/foo",
            "--devices",
            &count,
            "--cdi-dir",
            &cdi,
        ];
        args.extend_from_slice(extra);
        self.others.push(self.root.example_plugin(&args));
        self.root
            .wait_counts("example.com/foo", devices, devices)
            .await;
    }

    fn cdi_dir(&self) -> String {
        self.root.path().join("cdi").display().to_string()
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = cli(self.root.path(), args).await;
        assert_eq!(code, 0, "{args:?}: {err}\nserve:\n{}", self.serve_log());
        out
    }

    fn serve_log(&self) -> String {
        self.serve.as_ref().map(Proc::log).unwrap_or_default()
    }

    async fn admit(&self, pod: &Value) -> Value {
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        let file = self.root.path().join(format!("{uid}.json"));
        std::fs::write(&file, pod.to_string()).unwrap();
        let out = self
            .ok(&["admit", "-f", file.to_str().unwrap(), "-o", "json"])
            .await;
        serde_json::from_str(&out).unwrap()
    }

    async fn runtime_status(&self, uid: &str) -> Option<Value> {
        self.root
            .control()
            .get_json::<Value>(&format!("/v1/pods/{uid}/runtime"))
            .await
            .ok()
    }

    /// Waits until the pod's runtime status satisfies `ready`.
    async fn wait_pod(&self, uid: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let last = self.runtime_status(uid).await;
            if let Some(v) = &last
                && ready(v)
            {
                return v.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for pod {uid} {what}: {last:?}\nserve:\n{}",
                self.serve_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn finished(&self, uid: &str) -> Value {
        self.wait_pod(uid, "to finish", |v| {
            matches!(v["phase"].as_str(), Some("Succeeded" | "Failed"))
        })
        .await
    }

    async fn logs(&self, uid: &str, container: &str) -> String {
        self.ok(&["logs", uid, container]).await
    }
}

fn pod(uid: &str, name: &str, script: &str, extra_spec: Value, resources: Value) -> Value {
    let mut spec = json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "app",
            "image": IMAGE,
            "command": ["sh", "-c", script],
            "resources": resources,
        }],
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": spec,
    })
}

fn terminated(status: &Value) -> &Value {
    &status["containers"][0]["state"]["terminated"]
}

#[tokio::test]
async fn a_device_plugins_env_mount_and_device_node_are_inside_the_container() {
    let Some(endpoint) = endpoint() else { return };
    let mut node = Node::start(&endpoint, &[]).await;
    let shared = node.root.path().join("plugin-files");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("info"), "mounted-by-the-plugin\n").unwrap();
    node.example_plugin(
        2,
        &[
            "--device-node",
            "/dev/null",
            "--mount-dir",
            shared.to_str().unwrap(),
            "--pre-start",
        ],
    )
    .await;
    let uid = uid();
    let script = "echo ENV=$EXAMPLE_DEVICES; echo CDI=$EXAMPLE_CDI_FOO_0$EXAMPLE_CDI_FOO_1; \
                  for d in /dev/example-*; do [ -c $d ] && echo DEV=$d; done; \
                  echo MOUNT=$(cat /run/example/info); \
                  touch /run/example/x 2>/dev/null && echo WRITABLE || echo READONLY";
    let admitted_at = Instant::now();
    let admitted = node
        .admit(&pod(
            &uid,
            "plugin-pod",
            script,
            json!({}),
            json!({"limits": {"example.com/foo": "1"}}),
        ))
        .await;
    let device = admitted["containers"][0]["devices"]["example.com/foo"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let status = node.finished(&uid).await;
    eprintln!(
        "admit → Succeeded with its output logged: {:?}",
        admitted_at.elapsed()
    );
    assert_eq!(status["phase"], "Succeeded", "{status}");
    let out = node.logs(&uid, "app").await;
    assert!(out.contains(&format!("ENV={device}\n")), "{out}");
    assert!(
        out.contains(&format!("CDI={device}\n")),
        "the CDI spec's env: {out}"
    );
    assert!(
        out.contains(&format!("DEV=/dev/example-{device}\n")),
        "{out}"
    );
    assert!(out.contains("MOUNT=mounted-by-the-plugin\n"), "{out}");
    assert!(
        out.contains("READONLY"),
        "the plugin's mount is read-only: {out}"
    );
}

/// The built-in parts work together with no flag: the example plugin writes its CDI spec under
/// the root by default and `serve --runtime cri` reads specs there, so the CDI names its
/// `Allocate` returns resolve and the container sees the spec's env (issue 40).
#[tokio::test]
async fn the_default_example_plugin_and_serve_compose_without_cdi_flags() {
    let Some(endpoint) = endpoint() else { return };
    let mut node = Node::start_on(Root::new(), &endpoint, &[]).await;
    node.others.push(node.root.example_plugin(&[
        "--resource",
        "example.com/foo",
        "--devices",
        "1",
    ]));
    node.root.wait_counts("example.com/foo", 1, 1).await;
    let uid = uid();
    let admitted = node
        .admit(&pod(
            &uid,
            "default-plugin-pod",
            "echo ENV=$EXAMPLE_DEVICES; echo CDI=$EXAMPLE_CDI_FOO_0",
            json!({}),
            json!({"limits": {"example.com/foo": "1"}}),
        ))
        .await;
    let device = admitted["containers"][0]["devices"]["example.com/foo"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let status = node.finished(&uid).await;
    assert_eq!(status["phase"], "Succeeded", "{status}");
    let out = node.logs(&uid, "app").await;
    assert!(out.contains(&format!("ENV={device}\n")), "{out}");
    assert!(
        out.contains(&format!("CDI={device}\n")),
        "the CDI spec's env: {out}"
    );
}

#[tokio::test]
async fn a_dra_claims_cdi_env_and_device_nodes_are_inside_the_container() {
    let Some(endpoint) = endpoint() else { return };
    let mut node = Node::start(&endpoint, &[]).await;
    let cdi = node.cdi_dir();
    node.others.push(node.root.spawn(
        "driver",
        &[
            "example-driver",
            "--name",
            "gpu.example.com",
            "--devices",
            "2",
            "--cdi-dir",
            &cdi,
            "--device-node",
            "/dev/zero",
        ],
    ));
    let deadline = Instant::now() + WAIT;
    loop {
        let dra: Value = node
            .root
            .control()
            .get_json("/v1/dra")
            .await
            .unwrap_or_default();
        if dra["publishedSlices"]["gpu.example.com"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "driver did not publish: {dra}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let objects = node.root.path().join("objects.yaml");
    std::fs::write(
        &objects,
        r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: one-gpu, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu}
"#,
    )
    .unwrap();
    node.ok(&["apply", "-f", objects.to_str().unwrap()]).await;
    let uid = uid();
    let mut p = pod(
        &uid,
        "dra-pod",
        "env | grep ^EXAMPLE_DRA_ | sort; for d in /dev/example-dra-*; do [ -c $d ] && echo DEV=$d; done",
        json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}]}),
        json!({"claims": [{"name": "gpu"}]}),
    );
    p["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    let admitted = node.admit(&p).await;
    let device = admitted["containers"][0]["claims"][0]["device"]
        .as_str()
        .unwrap_or("gpu-0")
        .to_owned();
    let status = node.finished(&uid).await;
    assert_eq!(status["phase"], "Succeeded", "{status}");
    let out = node.logs(&uid, "app").await;
    assert!(
        out.contains("EXAMPLE_DRA_CLAIM=default/one-gpu\n"),
        "{out}\n{admitted}"
    );
    assert!(
        out.contains(&format!("DEV=/dev/example-dra-{device}\n")),
        "{out}\n{admitted}"
    );
}

#[tokio::test]
async fn a_guaranteed_pods_cpuset_is_its_exclusive_cpus() {
    let Some(endpoint) = endpoint() else { return };
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs 2 CPUs (one reserved, one exclusive)");
        return;
    }
    let config_root = tempfile::tempdir().unwrap();
    let config = config_root.path().join("kubelet.yaml");
    std::fs::write(
        &config,
        "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n",
    )
    .unwrap();
    let node = Node::start(&endpoint, &["--config", config.to_str().unwrap()]).await;
    let uid = uid();
    let guaranteed = json!({"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}});
    let admitted = node
        .admit(&pod(
            &uid,
            "pinned",
            "grep Cpus_allowed_list /proc/self/status",
            json!({}),
            guaranteed,
        ))
        .await;
    let cpus = admitted["containers"][0]["cpus"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(cpus, "0", "CPU 0 is reserved: {admitted}");
    let status = node.finished(&uid).await;
    assert_eq!(status["phase"], "Succeeded", "{status}");
    let out = node.logs(&uid, "app").await;
    let inside = out
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim)
        .unwrap_or_default();
    assert_eq!(
        inside, cpus,
        "the container's cpuset is what devicelet reports: {out}"
    );
}

#[tokio::test]
async fn exit_codes_phases_and_restarts_follow_the_restart_policy() {
    let Some(endpoint) = endpoint() else { return };
    let node = Node::start(&endpoint, &[]).await;
    let (ok, failed, retried) = (uid(), uid(), uid());
    node.admit(&pod(&ok, "ok", "echo done", json!({}), json!({})))
        .await;
    node.admit(&pod(
        &failed,
        "fails",
        "echo bad; exit 3",
        json!({}),
        json!({}),
    ))
    .await;
    // OnFailure: the first run fails, the restart (after the 10 s crash-loop back-off) finds
    // the marker in its emptyDir and succeeds.
    let mut p = pod(
        &retried,
        "retried",
        "if [ -f /data/ran ]; then echo second; exit 0; fi; touch /data/ran; echo first; exit 1",
        json!({"restartPolicy": "OnFailure",
               "volumes": [{"name": "data", "emptyDir": {}}]}),
        json!({}),
    );
    p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    node.admit(&p).await;
    let status = node.finished(&ok).await;
    assert_eq!(status["phase"], "Succeeded");
    assert_eq!(terminated(&status)["exitCode"], 0);
    assert_eq!(terminated(&status)["reason"], "Completed");
    let status = node.finished(&failed).await;
    assert_eq!(status["phase"], "Failed", "{status}");
    assert_eq!(terminated(&status)["exitCode"], 3, "{status}");
    assert_eq!(terminated(&status)["reason"], "Error");
    assert_eq!(node.logs(&failed, "app").await, "bad\n");
    let status = node.finished(&retried).await;
    assert_eq!(status["phase"], "Succeeded", "{status}");
    assert_eq!(status["containers"][0]["restartCount"], 1, "{status}");
    assert_eq!(
        status["containers"][0]["lastState"]["terminated"]["exitCode"], 1,
        "{status}"
    );
    assert_eq!(node.logs(&retried, "app").await, "second\n");
    let previous = node.ok(&["logs", &retried, "app", "--previous"]).await;
    assert_eq!(previous, "first\n");
}

#[tokio::test]
async fn a_killed_devicelet_adopts_its_running_containers() {
    let Some(endpoint) = endpoint() else { return };
    let mut node = Node::start(&endpoint, &[]).await;
    node.example_plugin(2, &[]).await;
    let uid = uid();
    let admitted = node
        .admit(&pod(
            &uid,
            "long",
            "echo started; exec sleep 3600",
            json!({"restartPolicy": "Always"}),
            json!({"limits": {"example.com/foo": "1"}}),
        ))
        .await;
    let before = node
        .wait_pod(&uid, "running", |v| {
            v["containers"][0]["state"]["running"].is_object()
        })
        .await;
    let container_id = before["containers"][0]["containerID"].clone();
    node.serve.take().unwrap().kill().await;
    node.start_serve().await;
    // Looked at again after the restart: the same container, never started twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = node
        .wait_pod(&uid, "running after the restart", |v| {
            v["containers"][0]["state"]["running"].is_object()
        })
        .await;
    assert_eq!(
        after["containers"][0]["containerID"], container_id,
        "{after}"
    );
    assert_eq!(after["containers"][0]["restartCount"], 0, "{after}");
    assert_eq!(after["sandboxId"], before["sandboxId"]);
    assert_eq!(node.logs(&uid, "app").await, "started\n", "started once");
    let pods: Value = serde_json::from_str(&node.ok(&["get", "pods", "-o", "json"]).await).unwrap();
    assert_eq!(
        pods["pods"][0]["containers"][0]["devices"], admitted["containers"][0]["devices"],
        "devices unchanged: {pods}"
    );
    node.ok(&["remove", &uid]).await;
}

#[tokio::test]
async fn removing_a_pod_stops_its_containers_within_the_grace_period_then_frees_devices() {
    let Some(endpoint) = endpoint() else { return };
    let mut node = Node::start(&endpoint, &[]).await;
    node.example_plugin(1, &[]).await;
    let uid = uid();
    // Ignores SIGTERM: only the SIGKILL at the end of the 2 s grace period stops it.
    node.admit(&pod(
        &uid,
        "stubborn",
        "trap '' TERM; echo up; while true; do sleep 1; done",
        json!({"restartPolicy": "Always"}),
        json!({"limits": {"example.com/foo": "1"}}),
    ))
    .await;
    node.wait_pod(&uid, "running", |v| {
        v["containers"][0]["state"]["running"].is_object()
    })
    .await;
    let started = Instant::now();
    node.ok(&["remove", &uid]).await;
    let took = started.elapsed();
    eprintln!("remove took {took:?} (grace period 2 s, SIGTERM ignored)");
    assert!(
        took >= Duration::from_millis(1500),
        "SIGTERM was ignored, so ~2 s: {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "killed after the grace period: {took:?}"
    );
    assert!(
        node.runtime_status(&uid).await.is_none(),
        "the runtime forgot the pod"
    );
    node.root.wait_counts("example.com/foo", 1, 1).await;
}

/// Issue 42: CRI calls per second with many idle running pods (the PLEG's one relist for all
/// pods against a per-pod look). A measurement, not a check: it runs only with
/// `CRI_CALLS_PODS` set, as in
/// `CRI_CALLS_PODS=200 bash interop/cri/run.sh runtime_calls_per_second`, and prints the rate
/// of `kubelet_runtime_operations_total` by operation over `CRI_CALLS_SECONDS` (default 20),
/// with the CPU time of `serve` and of containerd (`CRI_CONTAINERD_PID`, set by run.sh).
#[tokio::test]
async fn runtime_calls_per_second() {
    let Some(endpoint) = endpoint() else { return };
    let Some(count) = std::env::var("CRI_CALLS_PODS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        eprintln!(
            "skipped: CRI_CALLS_PODS is not set (CRI_CALLS_PODS=200 bash interop/cri/run.sh runtime_calls_per_second)"
        );
        return;
    };
    let seconds: u64 = std::env::var("CRI_CALLS_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let address = common::free_address();
    let node = Node::start(&endpoint, &["--metrics-address", &address]).await;
    let uids: Vec<String> = (0..count).map(|_| uid()).collect();
    let started = Instant::now();
    let named: Vec<(usize, &String)> = uids.iter().enumerate().collect();
    for chunk in named.chunks(8) {
        let admits = chunk.iter().map(|(i, u)| {
            let p = pod(
                u,
                &format!("idle-{i}"),
                "sleep 100000",
                json!({"restartPolicy": "Always", "terminationGracePeriodSeconds": 0}),
                json!({}),
            );
            let node = &node;
            async move { node.admit(&p).await }
        });
        futures::future::join_all(admits).await;
    }
    let mut pending: Vec<String> = uids.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while !pending.is_empty() {
        let mut still = Vec::new();
        for u in pending {
            let running = node
                .runtime_status(&u)
                .await
                .is_some_and(|v| v["phase"] == "Running");
            if !running {
                still.push(u);
            }
        }
        pending = still;
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {count} pods not Running after 600 s\nserve:\n{}",
            pending.len(),
            node.serve_log()
        );
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    eprintln!(
        "runtime_calls_per_second: {count} pods Running after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Let the starts' own calls settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let serve_pid = node.serve.as_ref().and_then(|p| p.child.id());
    let containerd_pid: Option<u32> = std::env::var("CRI_CONTAINERD_PID")
        .ok()
        .and_then(|v| v.parse().ok());
    let before = operations(&scrape(&address).await);
    let cpu_before = (serve_pid.map(cpu_ticks), containerd_pid.map(cpu_ticks));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = operations(&scrape(&address).await);
    let cpu_after = (serve_pid.map(cpu_ticks), containerd_pid.map(cpu_ticks));
    let elapsed = t0.elapsed().as_secs_f64();
    let mut total = 0.0;
    let mut by_op = Vec::new();
    for (op, n) in &after {
        let d = n - before.get(op).copied().unwrap_or(0.0);
        if d > 0.0 {
            total += d;
            by_op.push(format!("{op} {:.1}", d / elapsed));
        }
    }
    let ticks = clock_ticks();
    let cpu = |b: Option<Option<u64>>, a: Option<Option<u64>>| match (b.flatten(), a.flatten()) {
        (Some(b), Some(a)) => format!("{:.1}%", (a - b) as f64 / ticks / elapsed * 100.0),
        _ => "n/a".to_owned(),
    };
    eprintln!(
        "runtime_calls_per_second: {count} running pods, {elapsed:.1} s: {:.1} calls/s ({}); CPU serve {}, containerd {}",
        total / elapsed,
        by_op.join(", "),
        cpu(cpu_before.0, cpu_after.0),
        cpu(cpu_before.1, cpu_after.1),
    );
}

/// `kubelet_runtime_operations_total` by operation type.
fn operations(text: &str) -> std::collections::BTreeMap<String, f64> {
    let prefix = "kubelet_runtime_operations_total{operation_type=\"";
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (op, value) = rest.split_once("\"} ")?;
            Some((op.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // state is field 3; utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}
