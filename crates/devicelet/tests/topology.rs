//! NUMA alignment end to end (issue 5): `devicelet serve --config` with a described machine,
//! the example plugin spreading devices over NUMA nodes as a real process, pods admitted through
//! the CLI. Policies (spec devicemanager.md §4.3-§4.5), scopes (§4.6), device hints (§4.7), the
//! static CPU manager with `cpu_manager_state`, and bad configurations.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Root, cli};
use serde_json::Value;

const GPU: &str = "example.com/gpu";

/// A 2-node machine, CPUs 0-3 on node 0 and 4-7 on node 1.
fn config(root: &Root, name: &str, fields: &str) -> String {
    let text = format!("{fields}\ndevicelet:\n  machine: {{nodes: 2, cpusPerNode: 4}}\n");
    let path = root.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A container: (name, GPUs, exclusive CPUs). With CPUs the pod is Guaranteed.
type Spec<'a> = (&'a str, u32, Option<u32>);

fn pod_yaml(name: &str, uid: &str, containers: &[Spec<'_>]) -> String {
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {uid}}}\nspec:\n  containers:\n"
    );
    for (c, gpus, cpus) in containers {
        let mut limits = format!("{GPU}: \"{gpus}\"");
        if let Some(n) = cpus {
            limits.push_str(&format!(", cpu: \"{n}\", memory: 1Gi"));
        }
        text.push_str(&format!(
            "  - name: {c}\n    resources: {{limits: {{{limits}}}}}\n"
        ));
    }
    text
}

/// Admits a pod; Ok(admit JSON) or Err(stderr).
async fn admit(
    root: &Root,
    name: &str,
    uid: &str,
    containers: &[Spec<'_>],
) -> Result<Value, String> {
    let path = root.path().join(format!("{uid}.yaml"));
    std::fs::write(&path, pod_yaml(name, uid, containers)).unwrap();
    // -v: a refusal prints the kubelet's reason; the daemon's detail (which resource, which
    // NUMA node) is in the debug log the tests read.
    let (code, stdout, stderr) = cli(
        root.path(),
        &["-v", "admit", "-f", path.to_str().unwrap(), "-o", "json"],
    )
    .await;
    if code == 0 {
        Ok(serde_json::from_str(&stdout).unwrap())
    } else {
        Err(stderr)
    }
}

/// NUMA node of an example-plugin device with 8 devices on 2 nodes (blocks of 4).
fn node_of(id: &str) -> usize {
    let i: usize = id.rsplit('-').next().unwrap().parse().unwrap();
    i * 2 / 8
}

fn devices(admitted: &Value, container: usize) -> Vec<String> {
    serde_json::from_value(admitted["containers"][container]["devices"][GPU].clone()).unwrap()
}

fn nodes(ids: &[String]) -> Vec<usize> {
    let mut n: Vec<usize> = ids.iter().map(|i| node_of(i)).collect();
    n.sort_unstable();
    n.dedup();
    n
}

async fn pods_count(root: &Root) -> usize {
    let (_, pods, _) = cli(root.path(), &["get", "pods", "-o", "json"]).await;
    serde_json::from_str::<Value>(&pods).unwrap()["pods"]
        .as_array()
        .unwrap()
        .len()
}

fn cpus_of(text: &str) -> Vec<u32> {
    let mut out = vec![];
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

#[tokio::test]
async fn single_numa_node_aligns_each_container_and_rejects_with_topology_affinity_error() {
    let root = Root::new();
    let cfg = config(&root, "c.yaml", "topologyManagerPolicy: single-numa-node");
    let _serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "8", "--numa-nodes", "2"]);
    root.wait_counts(GPU, 8, 8).await;

    let a = admit(&root, "a", "uid-a", &[("c", 3, None)]).await.unwrap();
    assert_eq!(nodes(&devices(&a, 0)), [0], "{a}");
    assert_eq!(a["containers"][0]["numaAffinity"], serde_json::json!([0]));
    // Node 0 has one device left: two devices only fit on node 1.
    let b = admit(&root, "b", "uid-b", &[("c", 2, None)]).await.unwrap();
    assert_eq!(nodes(&devices(&b, 0)), [1], "{b}");
    // One free on node 0, two on node 1: three fit on no single node.
    let err = admit(&root, "c", "uid-c", &[("c", 3, None)])
        .await
        .unwrap_err();
    assert!(
        err.contains("TopologyAffinityError: Resources cannot be allocated with Topology locality"),
        "{err}"
    );
    assert!(
        err.contains("example.com/gpu=3") && err.contains("single-numa-node"),
        "{err}"
    );
    // Without -v: the reason alone, not the HTTP exchange.
    let path = root.path().join("uid-c.yaml");
    let (code, _, quiet) = cli(root.path(), &["admit", "-f", path.to_str().unwrap()]).await;
    assert_eq!(code, 1);
    assert_eq!(
        quiet.trim(),
        "error: pod rejected: TopologyAffinityError: Resources cannot be allocated with Topology locality"
    );
    // The rejection left nothing allocated.
    assert_eq!(pods_count(&root).await, 2);
    root.wait_counts(GPU, 8, 8).await;
    let view = root.control().resources().await.unwrap();
    assert_eq!(view.resource(GPU).unwrap().capacity, 8);
    // Three free devices are still there for a pod that fits one node.
    let d = admit(&root, "d", "uid-d", &[("c", 2, None)]).await.unwrap();
    assert_eq!(nodes(&devices(&d, 0)), [1]);
    assert_eq!(plugin.terminate().await, 0);
}

#[tokio::test]
async fn restricted_rejects_a_non_preferred_hint_that_best_effort_admits_across_nodes() {
    for (policy, admitted) in [("restricted", false), ("best-effort", true)] {
        let root = Root::new();
        let cfg = config(&root, "c.yaml", &format!("topologyManagerPolicy: {policy}"));
        let _serve = root.serve(&["--config", &cfg]).await;
        let plugin =
            root.example_plugin(&["--resource", GPU, "--devices", "8", "--numa-nodes", "2"]);
        root.wait_counts(GPU, 8, 8).await;
        // Leave one free device per node.
        let a = admit(&root, "a", "uid-a", &[("c", 3, None)]).await.unwrap();
        let b = admit(&root, "b", "uid-b", &[("c", 3, None)]).await.unwrap();
        assert_eq!(nodes(&devices(&a, 0)), [0], "{policy}");
        assert_eq!(nodes(&devices(&b, 0)), [1], "{policy}");
        // Two devices could sit on one node on this machine, so {0,1} is not preferred.
        let got = admit(&root, "c", "uid-c", &[("c", 2, None)]).await;
        match (admitted, got) {
            (true, Ok(c)) => {
                assert_eq!(nodes(&devices(&c, 0)), [0, 1], "{c}");
                assert_eq!(
                    c["containers"][0]["numaAffinity"],
                    serde_json::json!([0, 1])
                );
            }
            (false, Err(err)) => {
                assert!(err.contains("TopologyAffinityError"), "{err}");
                assert_eq!(pods_count(&root).await, 2);
            }
            (_, other) => panic!("{policy}: unexpected {other:?}"),
        }
        // A request that needs both nodes on this machine is preferred under both policies.
        let (code, _, stderr) = cli(root.path(), &["remove", "uid-a"]).await;
        assert_eq!(code, 0, "{stderr}");
        if admitted {
            let (code, _, _) = cli(root.path(), &["remove", "uid-c"]).await;
            assert_eq!(code, 0);
        }
        let wide = admit(&root, "w", "uid-w", &[("c", 5, None)]).await.unwrap();
        assert_eq!(nodes(&devices(&wide, 0)), [0, 1], "{policy}: {wide}");
        assert_eq!(plugin.terminate().await, 0);
    }
}

#[tokio::test]
async fn scope_pod_keeps_all_containers_on_one_node_where_scope_container_splits_them() {
    for scope in ["container", "pod"] {
        let root = Root::new();
        let cfg = config(
            &root,
            "c.yaml",
            &format!("topologyManagerPolicy: single-numa-node\ntopologyManagerScope: {scope}"),
        );
        let _serve = root.serve(&["--config", &cfg]).await;
        let plugin =
            root.example_plugin(&["--resource", GPU, "--devices", "8", "--numa-nodes", "2"]);
        root.wait_counts(GPU, 8, 8).await;
        let first = admit(&root, "x", "uid-x", &[("c", 1, None)]).await.unwrap();
        assert_eq!(nodes(&devices(&first, 0)), [0]);
        // Node 0: 3 free, node 1: 4 free. Two containers of 2 devices each.
        let pod = admit(&root, "p", "uid-p", &[("a", 2, None), ("b", 2, None)])
            .await
            .unwrap();
        let (a, b) = (nodes(&devices(&pod, 0)), nodes(&devices(&pod, 1)));
        if scope == "container" {
            // Each container takes the narrowest, lowest node that fits it right now.
            assert_eq!((a, b), (vec![0], vec![1]), "{pod}");
        } else {
            // The pod's 4 devices fit node 1 only; every container gets that hint.
            assert_eq!((a, b), (vec![1], vec![1]), "{pod}");
            assert_eq!(pod["containers"][0]["numaAffinity"], serde_json::json!([1]));
            assert_eq!(pod["containers"][1]["numaAffinity"], serde_json::json!([1]));
        }
        assert_eq!(plugin.terminate().await, 0);
    }
}

#[tokio::test]
async fn guaranteed_pod_gets_exclusive_cpus_on_its_devices_node_kept_across_restart() {
    let root = Root::new();
    let cfg = config(
        &root,
        "c.yaml",
        "topologyManagerPolicy: single-numa-node\ncpuManagerPolicy: static\nreservedSystemCPUs: \"0\"",
    );
    let serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "8", "--numa-nodes", "2"]);
    root.wait_counts(GPU, 8, 8).await;
    // Node 0's devices are taken, so the Guaranteed pod must go to node 1, CPUs included.
    admit(&root, "fill", "uid-fill", &[("c", 4, None)])
        .await
        .unwrap();
    let g = admit(&root, "g", "uid-g", &[("main", 1, Some(2))])
        .await
        .unwrap();
    assert_eq!(nodes(&devices(&g, 0)), [1], "{g}");
    let g_cpus = cpus_of(g["containers"][0]["cpus"].as_str().unwrap());
    assert_eq!(g_cpus.len(), 2);
    assert!(g_cpus.iter().all(|c| (4..8).contains(c)), "{g}");
    // A second Guaranteed pod wanting 3 CPUs with a device: node 1 has 2 CPUs left, node 0
    // has 3 (CPU 0 is reserved) but no device: no single node holds both.
    let err = admit(&root, "h", "uid-h", &[("main", 1, Some(3))])
        .await
        .unwrap_err();
    assert!(
        err.contains("TopologyAffinityError") && err.contains("exclusive cpus=3"),
        "{err}"
    );

    // start: the exclusive set for the Guaranteed container, the shared pool for others.
    let (code, out, stderr) = cli(root.path(), &["start", "uid-g", "main", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let start: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cpus_of(start["cpusetCpus"].as_str().unwrap()), g_cpus);
    let (_, out, _) = cli(root.path(), &["start", "uid-fill", "c", "-o", "json"]).await;
    let shared = cpus_of(
        serde_json::from_str::<Value>(&out).unwrap()["cpusetCpus"]
            .as_str()
            .unwrap(),
    );
    assert!(
        shared.contains(&0) && !shared.iter().any(|c| g_cpus.contains(c)),
        "{shared:?}"
    );

    // The kubelet-format state file names the assignment.
    let state_path = root.path().join("cpu_manager_state");
    let state: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert_eq!(state["policyName"], "static");
    let entry = state["entries"]["uid-g"]["main"].as_str().unwrap();
    assert_eq!(cpus_of(entry), g_cpus);

    // Restart: the assignment survives; a new Guaranteed pod gets other CPUs, and
    // re-admitting the first pod gives it the same CPUs back.
    assert_eq!(serve.terminate().await, 0);
    let _serve = root.serve(&["--config", &cfg]).await;
    root.wait_counts(GPU, 8, 8).await;
    let state_after: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert_eq!(state_after["entries"], state["entries"]);
    let k = admit(&root, "k", "uid-k", &[("main", 0, Some(2))])
        .await
        .unwrap();
    let k_cpus = cpus_of(k["containers"][0]["cpus"].as_str().unwrap());
    assert_eq!(k_cpus.len(), 2);
    assert!(
        !k_cpus.iter().any(|c| g_cpus.contains(c) || *c == 0),
        "{k_cpus:?} vs {g_cpus:?}"
    );
    let (code, _, _) = cli(root.path(), &["remove", "uid-fill"]).await;
    assert!(code == 0 || code == 1);
    let again = admit(&root, "g", "uid-g", &[("main", 1, Some(2))])
        .await
        .unwrap();
    assert_eq!(
        cpus_of(again["containers"][0]["cpus"].as_str().unwrap()),
        g_cpus
    );

    // Removing the pod gives its CPUs back to the shared pool, durably.
    let (code, _, stderr) = cli(root.path(), &["remove", "uid-k"]).await;
    assert_eq!(code, 0, "{stderr}");
    let state: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert!(state["entries"].get("uid-k").is_none(), "{state}");
    let default = cpus_of(state["defaultCpuSet"].as_str().unwrap());
    assert!(k_cpus.iter().all(|c| default.contains(c)), "{state}");
    assert_eq!(plugin.terminate().await, 0);
}

#[tokio::test]
async fn cpu_manager_state_of_another_policy_stops_startup_like_the_kubelet() {
    let root = Root::new();
    let static_cfg = config(
        &root,
        "static.yaml",
        "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"",
    );
    let serve = root.serve(&["--config", &static_cfg]).await;
    assert_eq!(serve.terminate().await, 0);
    let none_cfg = config(&root, "none.yaml", "cpuManagerPolicy: none");
    let (code, log) = root
        .spawn("serve", &["serve", "--config", &none_cfg])
        .wait_exit()
        .await;
    assert_ne!(code, 0);
    assert!(
        log.contains(
            "configured policy \\\"none\\\" differs from state checkpoint policy \\\"static\\\""
        ) || log
            .contains("configured policy \"none\" differs from state checkpoint policy \"static\""),
        "{log}"
    );
    assert!(log.contains("cpu_manager_state"), "{log}");
}

#[tokio::test]
async fn bad_configurations_name_the_field_and_never_start() {
    let root = Root::new();
    let cases = [
        (
            "topologyManagerPolicy: bogus",
            "topologyManagerPolicy: unknown policy: \"bogus\"",
        ),
        (
            "topologyManagerPolicy: restricted\ntopologyManagerScope: node",
            "topologyManagerScope: unknown scope: \"node\"",
        ),
        (
            "topologyManagerPolicy: restricted\ntopologyManagerPolicyOptions: {max-allowable-numa-nodes: \"4\"}",
            "topologyManagerPolicyOptions: the minimum value of \"max-allowable-numa-nodes\" should not be less than 8",
        ),
        (
            "topologyManagerPolicy: restricted\ntopologyManagerPolicyOptions: {fancy: \"true\"}",
            "unknown Topology Manager Policy option: \"fancy\"",
        ),
        (
            "cpuManagerPolicy: dynamic",
            "cpuManagerPolicy: unknown policy: \"dynamic\"",
        ),
        (
            "cpuManagerPolicy: static",
            "reservedSystemCPUs: [cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero",
        ),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"99\"",
            "reservedSystemCPUs:",
        ),
        (
            "topologyManagerScope: [a]",
            "topologyManagerScope: invalid type",
        ),
        // CPU Manager options (policy_options.go): alpha options need their gate, some
        // combinations are refused, and align-by-socket cannot serve single-numa-node.
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerPolicyOptions: {distribute-cpus-across-cores: \"true\"}",
            "cpuManagerPolicyOptions: CPU Manager Policy Alpha-level Options not enabled, but option \"distribute-cpus-across-cores\" provided",
        ),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\nfeatureGates: {CPUManagerPolicyBetaOptions: false}\ncpuManagerPolicyOptions: {distribute-cpus-across-numa: \"true\"}",
            "cpuManagerPolicyOptions: CPU Manager Policy Beta-level Options not enabled, but option \"distribute-cpus-across-numa\" provided",
        ),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\nfeatureGates: {CPUManagerPolicyAlphaOptions: true}\ncpuManagerPolicyOptions: {full-pcpus-only: \"true\", distribute-cpus-across-cores: \"true\"}",
            "cpuManagerPolicyOptions: static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time",
        ),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerPolicyOptions: {prefer-align-cpus-by-uncorecache: \"true\", distribute-cpus-across-numa: \"true\"}",
            "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa can not be used at the same time",
        ),
        (
            "topologyManagerPolicy: single-numa-node\ncpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\nfeatureGates: {CPUManagerPolicyAlphaOptions: true}\ncpuManagerPolicyOptions: {align-by-socket: \"true\"}",
            "Topolgy manager single-numa-node policy is incompatible with CPUManager align-by-socket policy option",
        ),
        (
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerPolicyOptions: {strict-cpu-reservation: \"yes\"}",
            "bad value for option \"strict-cpu-reservation\": strconv.ParseBool: parsing \"yes\": invalid syntax",
        ),
    ];
    for (i, (fields, expected)) in cases.iter().enumerate() {
        let cfg = config(&root, &format!("bad{i}.yaml"), fields);
        root.assert_serve_refuses(&cfg, expected).await;
    }
    // Files that are not a configuration at all.
    for (name, text, expected) in [
        ("garbage.yaml", "{{{", "not valid YAML or JSON"),
        ("list.yaml", "- a\n- b\n", "not a mapping"),
        (
            "machine.yaml",
            "devicelet: {machine: {nodez: 2}}\n",
            "devicelet.machine: unknown field `nodez`",
        ),
        (
            "nomachine.yaml",
            "topologyManagerPolicy: restricted\ndevicelet: {machine: {nodes: 0}}\n",
            "cannot discover the machine's NUMA topology (devicelet.machine)",
        ),
    ] {
        let path = root.path().join(name);
        std::fs::write(&path, text).unwrap();
        let (code, log) = root
            .spawn("serve", &["serve", "--config", path.to_str().unwrap()])
            .wait_exit()
            .await;
        assert_ne!(code, 0, "{name}");
        assert!(log.contains(expected), "{name}: {log}");
    }
    let (code, log) = root
        .spawn("serve", &["serve", "--config", "/nonexistent/kubelet.yaml"])
        .wait_exit()
        .await;
    assert_ne!(code, 0);
    assert!(
        log.contains("read config /nonexistent/kubelet.yaml"),
        "{log}"
    );
    // An odd sysfs tree is named too.
    let sys = root.path().join("sys/devices/system/node/node0");
    std::fs::create_dir_all(&sys).unwrap();
    std::fs::write(sys.join("cpulist"), "0-\n").unwrap();
    let path = root.path().join("sysfs.yaml");
    std::fs::write(
        &path,
        format!(
            "topologyManagerPolicy: best-effort\ndevicelet: {{sysfsRoot: {}}}\n",
            root.path().join("sys").display()
        ),
    )
    .unwrap();
    let (code, log) = root
        .spawn("serve", &["serve", "--config", path.to_str().unwrap()])
        .wait_exit()
        .await;
    assert_ne!(code, 0);
    assert!(
        log.contains("cannot discover the machine's NUMA topology (sysfs")
            && log.contains("bad cpulist"),
        "{log}"
    );
}

#[tokio::test]
async fn device_on_a_numa_node_the_machine_lacks_is_named_in_the_rejection() {
    let root = Root::new();
    let cfg = config(&root, "c.yaml", "topologyManagerPolicy: single-numa-node");
    let serve = root.serve(&["--config", &cfg]).await;
    // 8 devices over 4 nodes on a 2-node machine: gpu-4..7 claim nodes 2 and 3.
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "8", "--numa-nodes", "4"]);
    root.wait_counts(GPU, 8, 8).await;
    let a = admit(&root, "a", "uid-a", &[("c", 2, None)]).await.unwrap();
    let ids = devices(&a, 0);
    assert!(
        ids == ["gpu-0", "gpu-1"] || ids == ["gpu-2", "gpu-3"],
        "{a}"
    );
    let err = admit(&root, "b", "uid-b", &[("c", 3, None)])
        .await
        .unwrap_err();
    assert!(err.contains("TopologyAffinityError"), "{err}");
    assert!(
        err.contains("reports NUMA node 2, which this machine does not have"),
        "{err}"
    );
    assert_eq!(pods_count(&root).await, 1);
    assert!(
        serve
            .log()
            .contains("device reports a NUMA node this machine does not have")
    );
    assert_eq!(plugin.terminate().await, 0);
}

/// A config file for a described machine (`devicelet.machine` as a flow mapping).
fn config_for(root: &Root, name: &str, fields: &str, machine: &str) -> String {
    let text = format!("{fields}\ndevicelet:\n  machine: {machine}\n");
    let path = root.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// 4 nodes where 0-2 and 1-3 are close and every other pair is far, so the closest pair for
/// node 0 is not the narrowest-integer pair {0,1}.
const FOUR_NODES_PAIRED: &str = "{nodes: 4, cpusPerNode: 2, distances: [[10, 30, 12, 30], [30, 10, 30, 12], [12, 30, 10, 30], [30, 12, 30, 10]]}";

/// NUMA node of example-plugin device `gpu-<i>` with `devices` spread over `numa` nodes.
fn node_in(id: &str, devices: usize, numa: usize) -> usize {
    let i: usize = id.rsplit('-').next().unwrap().parse().unwrap();
    i * numa / devices
}

fn nodes_in(ids: &[String], devices: usize, numa: usize) -> Vec<usize> {
    let mut n: Vec<usize> = ids.iter().map(|i| node_in(i, devices, numa)).collect();
    n.sort_unstable();
    n.dedup();
    n
}

#[tokio::test]
async fn prefer_closest_numa_nodes_picks_the_closest_pair_on_a_4_node_machine() {
    // 16 devices, 4 per node: 5 devices need two nodes. Narrowest takes {0,1} (the smaller
    // integer); with prefer-closest-numa-nodes the distances make {0,2} the better pair.
    for (options, pair) in [
        ("", [0, 1]),
        (
            "topologyManagerPolicyOptions: {prefer-closest-numa-nodes: \"true\"}",
            [0, 2],
        ),
    ] {
        for policy in ["best-effort", "restricted"] {
            let root = Root::new();
            let cfg = config_for(
                &root,
                "c.yaml",
                &format!("topologyManagerPolicy: {policy}\n{options}"),
                FOUR_NODES_PAIRED,
            );
            let _serve = root.serve(&["--config", &cfg]).await;
            let plugin =
                root.example_plugin(&["--resource", GPU, "--devices", "16", "--numa-nodes", "4"]);
            root.wait_counts(GPU, 16, 16).await;
            let a = admit(&root, "a", "uid-a", &[("c", 5, None)]).await.unwrap();
            let what = format!("{policy} {options:?}: {a}");
            // A pair is as narrow as 5 devices allow, so it is preferred and restricted admits.
            assert_eq!(
                a["containers"][0]["numaAffinity"],
                serde_json::json!(pair),
                "{what}"
            );
            assert_eq!(nodes_in(&devices(&a, 0), 16, 4), pair, "{what}");
            assert_eq!(plugin.terminate().await, 0);
        }
    }
}

#[tokio::test]
async fn max_allowable_numa_nodes_admits_machines_beyond_8_nodes() {
    let root = Root::new();
    let twelve = "{nodes: 12, cpusPerNode: 1}";
    // Without the option the kubelet's limit of 8 nodes stops startup.
    let cfg = config_for(
        &root,
        "default.yaml",
        "topologyManagerPolicy: restricted",
        twelve,
    );
    let (code, log) = root
        .spawn("serve", &["serve", "--config", &cfg])
        .wait_exit()
        .await;
    assert_ne!(code, 0);
    assert!(
        log.contains("unsupported on machines with more than 8 NUMA Nodes"),
        "{log}"
    );
    // A limit below the machine's size is named too.
    let cfg = config_for(
        &root,
        "ten.yaml",
        "topologyManagerPolicy: restricted\ntopologyManagerPolicyOptions: {max-allowable-numa-nodes: \"10\"}",
        twelve,
    );
    let (code, log) = root
        .spawn("serve", &["serve", "--config", &cfg])
        .wait_exit()
        .await;
    assert_ne!(code, 0);
    assert!(
        log.contains("unsupported on machines with more than 10 NUMA Nodes"),
        "{log}"
    );

    // Raised to 16: the 12-node machine runs and admissions are aligned on it.
    let cfg = config_for(
        &root,
        "sixteen.yaml",
        "topologyManagerPolicy: restricted\ntopologyManagerPolicyOptions: {max-allowable-numa-nodes: \"16\"}",
        twelve,
    );
    let _serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "24", "--numa-nodes", "12"]);
    root.wait_counts(GPU, 24, 24).await;
    // 2 devices per node: 3 need a pair, the narrowest one first.
    let a = admit(&root, "a", "uid-a", &[("c", 3, None)]).await.unwrap();
    assert_eq!(
        a["containers"][0]["numaAffinity"],
        serde_json::json!([0, 1]),
        "{a}"
    );
    assert_eq!(nodes_in(&devices(&a, 0), 24, 12), [0, 1]);
    // Nodes 0 and 1 have one device left between them: 2 devices go to node 2 alone.
    let b = admit(&root, "b", "uid-b", &[("c", 2, None)]).await.unwrap();
    assert_eq!(
        b["containers"][0]["numaAffinity"],
        serde_json::json!([2]),
        "{b}"
    );
    assert_eq!(plugin.terminate().await, 0);
}

#[tokio::test]
async fn max_allowable_numa_nodes_on_a_4_node_machine_changes_nothing() {
    // The option only raises the limit; on a small machine admission is as without it.
    let root = Root::new();
    let cfg = config_for(
        &root,
        "c.yaml",
        "topologyManagerPolicy: single-numa-node\ntopologyManagerPolicyOptions: {max-allowable-numa-nodes: \"64\"}",
        FOUR_NODES_PAIRED,
    );
    let _serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "16", "--numa-nodes", "4"]);
    root.wait_counts(GPU, 16, 16).await;
    for (uid, want) in [("uid-a", 0), ("uid-b", 1), ("uid-c", 2), ("uid-d", 3)] {
        let got = admit(&root, uid, uid, &[("c", 3, None)]).await.unwrap();
        assert_eq!(nodes_in(&devices(&got, 0), 16, 4), [want], "{got}");
    }
    // One free device per node: 2 fit no single node.
    let err = admit(&root, "e", "uid-e", &[("c", 2, None)])
        .await
        .unwrap_err();
    assert!(err.contains("TopologyAffinityError"), "{err}");
    assert_eq!(plugin.terminate().await, 0);
}

/// Ecosystem A6 row 41: pods admitted at the same time must each see what the others took.
/// 10 pods of 2 devices hit a 4-node machine with 4 devices per node at once under
/// single-numa-node: exactly 8 fit, each on one node, no device twice; the 2 others are
/// refused with TopologyAffinityError and leave nothing behind.
#[tokio::test]
async fn burst_of_concurrent_admissions_keeps_single_numa_alignment() {
    let root = Root::new();
    let cfg = config_for(
        &root,
        "c.yaml",
        "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod",
        FOUR_NODES_PAIRED,
    );
    let _serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "16", "--numa-nodes", "4"]);
    root.wait_counts(GPU, 16, 16).await;

    let mut burst = tokio::task::JoinSet::new();
    for i in 0..10 {
        let uid = format!("uid-{i}");
        let path = root.path().join(format!("{uid}.yaml"));
        std::fs::write(&path, pod_yaml(&format!("p{i}"), &uid, &[("c", 2, None)])).unwrap();
        let dir = root.path().to_path_buf();
        burst.spawn(async move {
            let file = path.display().to_string();
            (uid, cli(&dir, &["admit", "-f", &file, "-o", "json"]).await)
        });
    }
    let mut taken: Vec<String> = Vec::new();
    let mut admitted = 0;
    let mut refused = 0;
    while let Some(joined) = burst.join_next().await {
        let (uid, (code, stdout, stderr)) = joined.unwrap();
        if code == 0 {
            let pod: Value = serde_json::from_str(&stdout).unwrap();
            let ids = devices(&pod, 0);
            assert_eq!(ids.len(), 2, "{uid}: {pod}");
            let on = nodes_in(&ids, 16, 4);
            assert_eq!(on.len(), 1, "{uid} spans NUMA nodes: {pod}");
            assert_eq!(
                pod["containers"][0]["numaAffinity"],
                serde_json::json!(on),
                "{uid}"
            );
            taken.extend(ids);
            admitted += 1;
        } else {
            assert!(stderr.contains("TopologyAffinityError"), "{uid}: {stderr}");
            refused += 1;
        }
    }
    assert_eq!((admitted, refused), (8, 2));
    let mut unique = taken.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        taken.len(),
        "a device was given twice: {taken:?}"
    );
    assert_eq!(unique.len(), 16);
    assert_eq!(pods_count(&root).await, 8);
    // Every device is held, so the refused pods left nothing allocated and nothing is free.
    let err = admit(&root, "late", "uid-late", &[("c", 1, None)])
        .await
        .unwrap_err();
    assert!(err.contains("TopologyAffinityError"), "{err}");
    assert_eq!(plugin.terminate().await, 0);
}

/// CPUs written to `cpu_manager_state` for a pod the journal never acknowledged (a crash
/// between the two writes) are freed when devicelet starts; acknowledged pods keep theirs.
#[tokio::test]
async fn exclusive_cpus_of_a_pod_the_journal_never_admitted_are_freed_at_start() {
    let root = Root::new();
    let cfg = config(
        &root,
        "c.yaml",
        "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"",
    );
    let serve = root.serve(&["--config", &cfg]).await;
    let plugin = root.example_plugin(&["--resource", GPU, "--devices", "2"]);
    root.wait_counts(GPU, 2, 2).await;
    let g = admit(&root, "g", "uid-g", &[("main", 0, Some(2))])
        .await
        .unwrap();
    let g_cpus = cpus_of(g["containers"][0]["cpus"].as_str().unwrap());
    assert_eq!(plugin.terminate().await, 0);
    assert_eq!(serve.terminate().await, 0);

    // Hand two shared CPUs to a pod nobody admitted; checksum 0 is accepted unverified, as the
    // kubelet accepts it.
    let state_path = root.path().join("cpu_manager_state");
    let mut state: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    let shared = cpus_of(state["defaultCpuSet"].as_str().unwrap());
    let ghost: Vec<u32> = shared.iter().copied().filter(|c| *c != 0).take(2).collect();
    let rest: Vec<String> = shared
        .iter()
        .filter(|c| !ghost.contains(c))
        .map(u32::to_string)
        .collect();
    state["defaultCpuSet"] = Value::from(rest.join(","));
    state["entries"]["uid-ghost"] = serde_json::json!({
        "c": ghost.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    });
    state["checksum"] = Value::from(0);
    std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();

    let _serve = root.serve(&["--config", &cfg]).await;
    let after: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert!(after["entries"].get("uid-ghost").is_none(), "{after}");
    assert_eq!(
        cpus_of(after["entries"]["uid-g"]["main"].as_str().unwrap()),
        g_cpus
    );
    let default = cpus_of(after["defaultCpuSet"].as_str().unwrap());
    assert!(ghost.iter().all(|c| default.contains(c)), "{after}");
}
