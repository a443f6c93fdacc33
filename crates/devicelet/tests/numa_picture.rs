//! `devicelet top --numa` in a real terminal (issue 41, the node as a picture): `serve` on a
//! described 2-NUMA machine (static CPU policy, Static memory policy, single-numa-node), the
//! example DRA driver with `--numa-nodes 2` and the example device plugin with
//! `--numa-nodes 2` as real processes, pods admitted through the CLI. The picture runs live
//! inside a detached tmux session of a fixed size; `tmux capture-pane -p` is what a person
//! sees. Each NUMA box must name exactly the pods that `get pods -o json` places on that node
//! (by their exclusive CPUs, pinned memory, plugin devices and claim devices), and a pod
//! admitted while the picture runs must appear without a restart.
//!
//! Skipped, with a message, only when tmux is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command as StdCommand;
use std::time::Duration;

use common::{EXE, Root, WAIT, cli};
use serde_json::Value;

const DRIVER: &str = "gpu.example.com";
const NIC: &str = "example.com/nic";

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

/// A tmux server of its own (`-L`), killed when dropped: the test never touches the user's.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = StdCommand::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn capture(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "picture"])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = StdCommand::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

fn tmux_installed() -> bool {
    StdCommand::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A pod `name` with one container `app`: `cpus` exclusive CPUs and `memory` (Guaranteed),
/// or only a CPU request (`cpus` 0: the shared pool); `nics` plugin devices; a GPU claim.
fn pod(root: &Root, name: &str, cpus: u32, memory: &str, nics: u32, gpu: bool) -> String {
    let mut limits = Vec::new();
    if cpus > 0 {
        limits.push(format!("cpu: \"{cpus}\", memory: {memory}"));
    }
    if nics > 0 {
        limits.push(format!("{NIC}: \"{nics}\""));
    }
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: uid-{name}}}\nspec:\n  containers:\n  - name: app\n    resources:\n"
    );
    if limits.is_empty() {
        text.push_str("      requests: {cpu: 100m}\n");
    } else {
        text.push_str(&format!("      limits: {{{}}}\n", limits.join(", ")));
    }
    if gpu {
        text.push_str("      claims: [{name: gpu}]\n");
        text.push_str("  resourceClaims:\n  - {name: gpu, resourceClaimTemplateName: numa1-gpu}\n");
    }
    let path = root.path().join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn json(root: &Root, args: &[&str]) -> Value {
    let (code, out, err) = cli(root.path(), args).await;
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

async fn admit(root: &Root, file: &str) {
    let (code, _, err) = cli(root.path(), &["-v", "admit", "-f", file, "-o", "json"]).await;
    assert_eq!(code, 0, "admit {file}: {err}");
}

fn parse_cpus(list: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// NUMA node → pods, as `get pods -o json` places them: by the NUMA nodes of each
/// container's exclusive CPUs (the machine's CPUs per node from the picture), memory blocks,
/// plugin devices (`get resources`) and claim devices (the slices' `numaNode` attribute).
/// `None` holds the pods placed nowhere.
async fn expected(root: &Root, picture: &Value) -> BTreeMap<Option<u64>, BTreeSet<String>> {
    let pods = json(root, &["get", "pods", "-o", "json"]).await;
    let resources = json(root, &["get", "resources", "-o", "json"]).await;
    let slices = json(root, &["get", "slices", "-o", "json"]).await;
    let mut cpu_node: BTreeMap<u64, u64> = BTreeMap::new();
    for node in picture["numaNodes"].as_array().unwrap() {
        for cpu in numbers(&node["cpus"]["all"]) {
            cpu_node.insert(cpu, node["id"].as_u64().unwrap());
        }
    }
    let mut device_nodes: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for r in resources["resources"].as_array().unwrap() {
        for d in r["devices"].as_array().unwrap() {
            device_nodes.insert(
                (
                    r["name"].as_str().unwrap().to_owned(),
                    d["id"].as_str().unwrap().to_owned(),
                ),
                numbers(&d["numaNodes"]),
            );
        }
    }
    for s in slices["items"].as_array().unwrap() {
        let spec = &s["spec"];
        let key = format!(
            "{}/{}",
            spec["driver"].as_str().unwrap(),
            spec["pool"]["name"].as_str().unwrap()
        );
        for d in spec["devices"].as_array().unwrap() {
            let attr = &d["attributes"]["resource.kubernetes.io/numaNode"];
            let nodes = attr["int"]
                .as_u64()
                .map(|n| vec![n])
                .unwrap_or_else(|| numbers(&attr["ints"]));
            device_nodes.insert((key.clone(), d["name"].as_str().unwrap().to_owned()), nodes);
        }
    }
    let mut out: BTreeMap<Option<u64>, BTreeSet<String>> = BTreeMap::new();
    for p in pods["pods"].as_array().unwrap() {
        let name = format!(
            "{}/{}",
            p["pod"]["namespace"].as_str().unwrap(),
            p["pod"]["name"].as_str().unwrap()
        );
        let mut nodes: BTreeSet<u64> = BTreeSet::new();
        for c in p["containers"].as_array().unwrap() {
            for cpu in parse_cpus(c["cpus"].as_str().unwrap_or_default()) {
                nodes.insert(cpu_node[&cpu]);
            }
            for block in c["memory"].as_array().into_iter().flatten() {
                nodes.extend(numbers(&block["numaNodes"]));
            }
            for (resource, ids) in c["devices"].as_object().unwrap() {
                for id in ids.as_array().unwrap() {
                    let key = (resource.clone(), id.as_str().unwrap().to_owned());
                    nodes.extend(device_nodes.get(&key).cloned().unwrap_or_default());
                }
            }
            for claim in c["claims"].as_array().into_iter().flatten() {
                let key = (
                    format!(
                        "{}/{}",
                        claim["driver"].as_str().unwrap(),
                        claim["pool"].as_str().unwrap()
                    ),
                    claim["device"].as_str().unwrap().to_owned(),
                );
                nodes.extend(device_nodes.get(&key).cloned().unwrap_or_default());
            }
        }
        if nodes.is_empty() {
            out.entry(None).or_default().insert(name);
        } else {
            for n in nodes {
                out.entry(Some(n)).or_default().insert(name.clone());
            }
        }
    }
    out
}

/// NUMA node → pods as the captured screen shows them: the `pods:` line of each
/// `NUMA node N` box and the `pods on no NUMA node:` line of the last box.
fn shown(screen: &str) -> BTreeMap<Option<u64>, BTreeSet<String>> {
    let mut out: BTreeMap<Option<u64>, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<Option<u64>> = None;
    for line in screen.lines() {
        if let Some(rest) = line.strip_prefix("+- NUMA node ") {
            let id = rest.split_whitespace().next().unwrap().parse().unwrap();
            current = Some(Some(id));
        } else if line.starts_with("+- no NUMA") {
            current = Some(None);
        }
        let body = line
            .trim_start_matches("| ")
            .trim_end_matches('|')
            .trim_end();
        let list = body
            .strip_prefix("pods on no NUMA node: ")
            .or_else(|| body.strip_prefix("pods: "));
        if let (Some(list), Some(node)) = (list, current) {
            let pods = out.entry(node).or_default();
            if list != "none" {
                pods.extend(list.split(", ").map(str::to_owned));
            }
        }
    }
    out.retain(|_, pods| !pods.is_empty());
    out
}

/// The same map from the picture's own JSON.
fn pictured(picture: &Value) -> BTreeMap<Option<u64>, BTreeSet<String>> {
    let mut out: BTreeMap<Option<u64>, BTreeSet<String>> = BTreeMap::new();
    let strings = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_owned())
            .collect()
    };
    for node in picture["numaNodes"].as_array().unwrap() {
        out.insert(node["id"].as_u64(), strings(&node["pods"]));
    }
    out.insert(None, strings(&picture["noNuma"]["pods"]));
    out.retain(|_, pods| !pods.is_empty());
    out
}

/// Waits until the screen shows `generation` and the whole last box, then checks it.
async fn check_screen(root: &Root, tmux: &Tmux) -> String {
    let picture = json(root, &["top", "--numa", "--once", "-o", "json"]).await;
    let generation = picture["generation"].as_u64().unwrap();
    let want = expected(root, &picture).await;
    assert_eq!(pictured(&picture), want, "picture JSON: {picture:#}");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let screen = tmux.capture();
        let complete = screen.contains(&format!("generation {generation}\n"))
            && screen.contains("pods on no NUMA node:");
        if complete && shown(&screen) == want {
            return screen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the terminal never showed {want:?} (generation {generation}); last screen:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn top_numa_in_tmux_names_the_pods_each_numa_node_holds() {
    if !tmux_installed() {
        eprintln!("SKIP top_numa_in_tmux: tmux is not installed (apt-get install tmux)");
        return;
    }
    let root = Root::new();
    let cfg = root.path().join("kubelet.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let _serve = root
        .serve(&[
            "--config",
            cfg.to_str().unwrap(),
            "--node-name",
            "node-1",
            "--metrics-address",
            "off",
        ])
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
    let _plugin = root.example_plugin(&["--resource", NIC, "--devices", "4", "--numa-nodes", "2"]);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let dra: Value = root.control().get_json("/v1/dra").await.unwrap();
        let nics = root
            .control()
            .resources()
            .await
            .unwrap()
            .resource(NIC)
            .map_or(0, |r| r.allocatable);
        if dra["publishedSlices"][DRIVER] == 1 && nics == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "driver or plugin never came up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let objects = root.path().join("objects.yaml");
    std::fs::write(&objects, OBJECTS).unwrap();
    let (code, _, err) = cli(root.path(), &["apply", "-f", objects.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{err}");

    // A GPU pod (node 1 by its claim), a NIC pod, a pod on the shared pool only.
    admit(&root, &pod(&root, "gpu-a", 2, "1Gi", 0, true)).await;
    admit(&root, &pod(&root, "nic-b", 1, "512Mi", 1, false)).await;
    admit(&root, &pod(&root, "shared-c", 0, "", 0, false)).await;

    let tmux = Tmux {
        socket: format!("devicelet-test-{}", std::process::id()),
    };
    let command = format!(
        "{EXE} --root-dir {} top --numa --interval 200ms",
        root.path().display()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "picture",
        "-x",
        "100",
        "-y",
        "60",
        &command,
    ]);
    let screen = check_screen(&root, &tmux).await;
    // The picture fits the pane and draws the machine: both nodes, the reserved CPU, the GPU.
    assert!(screen.lines().all(|l| l.chars().count() <= 100), "{screen}");
    assert!(
        screen.contains("+- NUMA node 0") && screen.contains("+- NUMA node 1"),
        "{screen}"
    );
    assert!(screen.contains("[R"), "{screen}");
    let node1 = screen.split("+- NUMA node 1").nth(1).unwrap();
    assert!(node1.contains("default/gpu-a (app)"), "{screen}");
    assert!(node1.contains("dra    gpu.example.com/"), "{screen}");
    assert!(
        screen.contains("pods on no NUMA node: default/shared-c"),
        "{screen}"
    );

    // Live: a pod admitted while the picture runs appears, and a removed one goes.
    admit(&root, &pod(&root, "nic-d", 1, "256Mi", 1, false)).await;
    let (code, _, err) = cli(root.path(), &["remove", "uid-nic-b"]).await;
    assert_eq!(code, 0, "{err}");
    let screen = check_screen(&root, &tmux).await;
    assert!(screen.contains("default/nic-d"), "{screen}");
    assert!(!screen.contains("default/nic-b"), "{screen}");
}
