//! PodResources API over the real `R/pod-resources/kubelet.sock` of a running [`Daemon`]: a
//! device plugin served over gRPC registers, pods are admitted, and a tonic PodResources client
//! reads List / GetAllocatableResources / Get / v1alpha1 List (spec devicemanager.md §5).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use devicelet_proto::podresources::{v1, v1alpha1};
use devicelet_rpc::test_utils::{StaticDevicePlugin, device, register_and_wait};
use devicelet_rpc::{Daemon, DaemonConfig, transport};
use k8s_openapi::api::core::v1::Pod;
use tonic::Code;

const RESOURCE: &str = "example.com/gpu";

async fn daemon_with_plugin() -> (tempfile::TempDir, Daemon) {
    let root = tempfile::Builder::new()
        .prefix("dl-podres-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut config = DaemonConfig::new(root.path());
    config.plugin_watcher = false;
    let daemon = Daemon::start(config).await.unwrap();
    let socket = daemon.paths().device_plugins.join("gpu.sock");
    StaticDevicePlugin::new(vec![
        device("gpu-0", "Healthy", Some(vec![0])),
        device("gpu-1", "Healthy", Some(vec![1])),
        device("gpu-2", "Unhealthy", Some(vec![0])),
        device("gpu-3", "Healthy", None),
        device("gpu-4", "Healthy", Some(vec![])),
    ])
    .serve(&socket)
    .unwrap();
    register_and_wait(&daemon, "gpu.sock", RESOURCE, 5, Duration::from_secs(10))
        .await
        .expect("plugin devices reached the manager");
    (root, daemon)
}

async fn client(daemon: &Daemon) -> tonic::transport::Channel {
    assert_eq!(
        daemon.paths().pod_resources_socket,
        daemon
            .paths()
            .root
            .join("pod-resources")
            .join("kubelet.sock")
    );
    transport::dial(&daemon.paths().pod_resources_socket, Duration::from_secs(5))
        .await
        .unwrap()
}

fn sidecar_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team", "uid": "uid-web"},
        "spec": {
            "initContainers": [
                {"name": "setup", "resources": {"limits": {RESOURCE: "1"}}},
                {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {RESOURCE: "1"}}}
            ],
            "containers": [
                {"name": "app", "resources": {"limits": {RESOURCE: "1"}}},
                {"name": "plain"}
            ]
        }
    }))
    .unwrap()
}

type Entry = (String, Vec<String>, Option<Vec<i64>>);

fn entries(devices: &[v1::ContainerDevices]) -> Vec<Entry> {
    let mut out: Vec<Entry> = devices
        .iter()
        .map(|d| {
            (
                d.resource_name.clone(),
                d.device_ids.clone(),
                d.topology
                    .as_ref()
                    .map(|t| t.nodes.iter().map(|n| n.id).collect()),
            )
        })
        .collect();
    out.sort();
    out
}

fn numa_of(id: &str) -> Option<Vec<i64>> {
    match id {
        "gpu-0" => Some(vec![0]),
        "gpu-1" => Some(vec![1]),
        _ => None,
    }
}

#[tokio::test]
async fn list_get_and_v1alpha1_report_admitted_devices_per_container() {
    let (_root, daemon) = daemon_with_plugin().await;
    let admitted = daemon.pods().admit(&sidecar_pod()).await.unwrap();
    let devices_of = |name: &str| {
        admitted
            .containers
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .devices
            .get(RESOURCE)
            .cloned()
            .unwrap_or_default()
    };
    let channel = client(&daemon).await;
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(channel.clone());

    let list = v1_client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.pod_resources.len(), 1);
    let pod = &list.pod_resources[0];
    assert_eq!((pod.name.as_str(), pod.namespace.as_str()), ("web", "team"));
    // Regular init container left out; sidecar first, then app containers (with or without devices).
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["proxy", "app", "plain"]);
    for c in &pod.containers {
        let want: Vec<Entry> = devices_of(&c.name)
            .iter()
            .map(|id| (RESOURCE.to_owned(), vec![id.clone()], numa_of(id)))
            .collect();
        let mut want = want;
        want.sort();
        assert_eq!(entries(&c.devices), want, "container {}", c.name);
        assert!(c.cpu_ids.is_empty() && c.memory.is_empty() && c.dynamic_resources.is_empty());
    }
    assert_eq!(pod.containers[1].devices.len(), 1, "app holds one device");

    let got = v1_client
        .get(v1::GetPodResourcesRequest {
            pod_name: "web".into(),
            pod_namespace: "team".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.as_ref(), Some(pod));

    let mut old = v1alpha1::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let old = old
        .list(v1alpha1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let old_pod = &old.pod_resources[0];
    let old_names: Vec<&str> = old_pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        old_names,
        ["app", "plain"],
        "v1alpha1 lists app containers only"
    );
    assert_eq!(old_pod.containers[0].devices.len(), 1);
    assert_eq!(old_pod.containers[0].devices[0].resource_name, RESOURCE);
    assert_eq!(
        old_pod.containers[0].devices[0].device_ids,
        devices_of("app")
    );

    // Removing the pod removes it from List.
    daemon.pods().remove("uid-web").await.unwrap();
    let list = v1_client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(list.pod_resources.is_empty());
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn allocatable_resources_are_healthy_devices_including_allocated_ones() {
    let (_root, daemon) = daemon_with_plugin().await;
    daemon.pods().admit(&sidecar_pod()).await.unwrap();
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(client(&daemon).await);
    let alloc = v1_client
        .get_allocatable_resources(v1::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let e = |id: &str, t: Option<Vec<i64>>| (RESOURCE.to_owned(), vec![id.to_owned()], t);
    // gpu-2 is unhealthy; gpu-4 has an empty (non-nil) topology and is left out, as upstream.
    assert_eq!(
        entries(&alloc.devices),
        vec![
            e("gpu-0", Some(vec![0])),
            e("gpu-1", Some(vec![1])),
            e("gpu-3", None)
        ]
    );
    assert!(alloc.cpu_ids.is_empty() && alloc.memory.is_empty());
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn get_of_unknown_pod_is_unknown_with_kubelet_message() {
    let (_root, daemon) = daemon_with_plugin().await;
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(client(&daemon).await);
    let err = v1_client
        .get(v1::GetPodResourcesRequest {
            pod_name: "ghost".into(),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unknown);
    assert_eq!(err.message(), "pod ghost in namespace default not found");
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn tight_loop_hits_rate_limit_then_recovers() {
    let (_root, daemon) = daemon_with_plugin().await;
    let socket = daemon.paths().pod_resources_socket.clone();
    let channel = client(&daemon).await;
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(channel.clone());
    let old = v1alpha1::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    // Waves of concurrent calls, so that a slow (loaded) machine still outruns 100 QPS.
    let mut refused = Vec::new();
    for wave in 0..10 {
        let calls = (0..40).map(|i| {
            let mut v1_client = v1_client.clone();
            let mut old = old.clone();
            async move {
                // Both API versions draw from the one bucket.
                if i % 2 == 0 {
                    v1_client
                        .list(v1::ListPodResourcesRequest {})
                        .await
                        .map(|_| ())
                } else {
                    old.list(v1alpha1::ListPodResourcesRequest {})
                        .await
                        .map(|_| ())
                }
            }
        });
        let results = futures::future::join_all(calls).await;
        let allowed = results.iter().filter(|r| r.is_ok()).count();
        if wave == 0 {
            assert!(
                allowed >= 10,
                "a full bucket allows a burst of 10, got {allowed}"
            );
        }
        refused.extend(results.into_iter().filter_map(Result::err));
        if !refused.is_empty() {
            break;
        }
    }
    assert!(!refused.is_empty(), "a tight loop must be rate limited");
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "rejected by rate limit");
    }
    // 100 QPS: a token is back after 10 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    v1_client
        .list(v1::ListPodResourcesRequest {})
        .await
        .expect("bucket refilled");
    daemon.shutdown().await.unwrap();
    assert!(!socket.exists(), "shutdown removes the PodResources socket");
}

#[tokio::test]
async fn cpu_ids_are_exclusive_cpus_and_allocatable_cpus_under_the_static_policy() {
    let root = tempfile::Builder::new()
        .prefix("dl-podres-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut config = DaemonConfig::new(root.path());
    config.plugin_watcher = false;
    config.alignment.cpu_manager_policy = "static".into();
    config.alignment.reserved_system_cpus = Some("0".into());
    config.alignment.devicelet.machine = Some(devicelet_topology::MachineConfig::uniform(2, 4));
    let daemon = Daemon::start(config).await.unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "g", "namespace": "team", "uid": "uid-g"},
        "spec": {"containers": [
            {"name": "pinned", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
            {"name": "fraction", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}
        ]}
    }))
    .unwrap();
    let admitted = daemon.pods().admit(&pod).await.unwrap();
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(client(&daemon).await);
    let list = v1_client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let containers = &list.pod_resources[0].containers;
    let pinned = &containers[0].cpu_ids;
    assert_eq!(pinned.len(), 2);
    assert!(!pinned.contains(&0), "reserved CPU 0 is never exclusive");
    let expected: String = pinned
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let reported = admitted.containers[0].cpus.clone().unwrap();
    assert!(
        reported == expected || reported == format!("{}-{}", pinned[0], pinned[1]),
        "{reported} vs {pinned:?}"
    );
    // A fractional CPU request shares the pool: no exclusive CPUs.
    assert!(containers[1].cpu_ids.is_empty());
    assert!(admitted.containers[1].cpus.is_none());
    let alloc = v1_client
        .get_allocatable_resources(v1::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alloc.cpu_ids, (1..8).collect::<Vec<i64>>());
    daemon.shutdown().await.unwrap();
}

/// The Static memory manager's blocks in List, Get and GetAllocatableResources, each with its
/// NUMA nodes (`containerMemoryFromBlock`), on a described 2-node machine.
#[tokio::test]
async fn memory_blocks_and_allocatable_memory_under_the_static_memory_policy() {
    let root = tempfile::Builder::new()
        .prefix("dl-podres-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut config = DaemonConfig::new(root.path());
    config.plugin_watcher = false;
    let a = &mut config.alignment;
    a.topology_manager_policy = "single-numa-node".into();
    a.memory_manager_policy = "Static".into();
    a.reserved_memory = vec![devicelet_node::alignment::MemoryReservation {
        numa_node: 1,
        limits: [("memory".to_owned(), "100Mi".to_owned())].into(),
    }];
    a.devicelet.machine = Some(devicelet_topology::MachineConfig::uniform(2, 2));
    a.devicelet.memory = Some(devicelet_node::alignment::DescribedMemory {
        per_node: "2Gi".into(),
        hugepages_per_node: [("2Mi".to_owned(), 8)].into(),
    });
    let daemon = Daemon::start(config).await.unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "g", "namespace": "team", "uid": "uid-g"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {
            "cpu": "1", "memory": "1Gi", "hugepages-2Mi": "4Mi"}}}]}
    }))
    .unwrap();
    daemon.pods().admit(&pod).await.unwrap();
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(client(&daemon).await);
    let nodes = |m: &v1::ContainerMemory| -> Vec<i64> {
        m.topology
            .as_ref()
            .unwrap()
            .nodes
            .iter()
            .map(|n| n.id)
            .collect()
    };
    let list = v1_client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let memory = &list.pod_resources[0].containers[0].memory;
    let got: Vec<(String, u64, Vec<i64>)> = memory
        .iter()
        .map(|m| (m.memory_type.clone(), m.size, nodes(m)))
        .collect();
    // Node 0: nothing reserved there, so the narrowest preferred hint is node 0.
    assert_eq!(
        got,
        [
            ("hugepages-2Mi".to_owned(), 4 << 20, vec![0]),
            ("memory".to_owned(), 1 << 30, vec![0]),
        ]
    );
    let one = v1_client
        .get(v1::GetPodResourcesRequest {
            pod_name: "g".into(),
            pod_namespace: "team".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.pod_resources.unwrap().containers[0].memory, *memory);
    let alloc = v1_client
        .get_allocatable_resources(v1::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let allocatable: Vec<(String, u64, Vec<i64>)> = alloc
        .memory
        .iter()
        .map(|m| (m.memory_type.clone(), m.size, nodes(m)))
        .collect();
    // Per node: 2Gi less the 16Mi of huge pages, and node 1's 100Mi reserved.
    assert!(
        allocatable.contains(&("memory".to_owned(), (2 << 30) - (16 << 20), vec![0])),
        "{allocatable:?}"
    );
    assert!(
        allocatable.contains(&(
            "memory".to_owned(),
            (2 << 30) - (16 << 20) - (100 << 20),
            vec![1]
        )),
        "{allocatable:?}"
    );
    assert!(
        allocatable.contains(&("hugepages-2Mi".to_owned(), 16 << 20, vec![0])),
        "{allocatable:?}"
    );
    daemon.shutdown().await.unwrap();
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The daemon's scrape names the PodResources and Topology Manager series exactly as the
/// kubelet does (no `_total` on the per-method counters), and admission through a
/// single-numa-node, pod-scope Topology Manager records the aligned/failure counts.
#[tokio::test]
async fn kubelet_metric_names_from_podresources_and_topology_admission() {
    let root = tempfile::Builder::new()
        .prefix("dl-podres-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut config = DaemonConfig::new(root.path());
    config.plugin_watcher = false;
    config.alignment.topology_manager_policy = "single-numa-node".into();
    config.alignment.topology_manager_scope = "pod".into();
    config.alignment.cpu_manager_policy = "static".into();
    config.alignment.reserved_system_cpus = Some("0".into());
    config.alignment.devicelet.machine = Some(devicelet_topology::MachineConfig::uniform(2, 2));
    let daemon = Daemon::start(config).await.unwrap();
    let pod = |name: &str, cpus: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
            "spec": {"containers": [
                {"name": "c", "resources": {"limits": {"cpu": cpus, "memory": "1Gi"}}}
            ]}
        }))
        .unwrap()
    };
    daemon.pods().admit(&pod("fits", "1")).await.unwrap();
    // 3 exclusive CPUs span both 2-CPU nodes: single-numa-node refuses.
    let err = daemon.pods().admit(&pod("spans", "3")).await.unwrap_err();
    assert_eq!(err.reason(), "TopologyAffinityError", "{err}");
    let mut v1_client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(client(&daemon).await);
    v1_client
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap();
    let text = daemon.metrics().encode();
    let v1 = "{server_api_version=\"v1\"}";
    for (series, want) in [
        (format!("kubelet_pod_resources_endpoint_requests_list{v1}"), 1.0),
        (format!("kubelet_pod_resources_endpoint_requests_total{v1}"), 1.0),
        ("kubelet_topology_manager_admission_requests_total".into(), 2.0),
        ("kubelet_topology_manager_admission_errors_total".into(), 1.0),
        ("kubelet_topology_manager_admission_duration_ms_count".into(), 2.0),
        (
            "kubelet_container_aligned_compute_resources_count{boundary=\"numa_node\",scope=\"pod\"}"
                .into(),
            1.0,
        ),
        (
            "kubelet_container_aligned_compute_resources_failure_count{boundary=\"numa_node\",scope=\"pod\"}"
                .into(),
            1.0,
        ),
        (
            "kubelet_container_aligned_compute_resources_count{boundary=\"numa_node\",scope=\"container\"}"
                .into(),
            0.0,
        ),
        ("kubelet_cpu_manager_pinning_requests_total".into(), 1.0),
        (
            "devicelet_pod_rejections_total{reason=\"TopologyAffinityError\"}".into(),
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, &series), Some(want), "{series}\n{text}");
    }
    assert!(text.contains("# TYPE kubelet_pod_resources_endpoint_requests_list counter\n"));
    assert!(!text.contains("kubelet_pod_resources_endpoint_requests_list_total"));
    daemon.shutdown().await.unwrap();
}

/// List answers are shared between callers (one build per change of the admitted pods), but a
/// call never gets an answer older than itself: every admission and removal shows at once,
/// including between calls that run concurrently.
#[tokio::test]
async fn list_answers_are_shared_but_never_older_than_the_call() {
    let (_root, daemon) = daemon_with_plugin().await;
    let mut client =
        v1::pod_resources_lister_client::PodResourcesListerClient::new(client(&daemon).await);
    let names = |r: v1::ListPodResourcesResponse| {
        let mut n: Vec<String> = r.pod_resources.into_iter().map(|p| p.name).collect();
        n.sort();
        n
    };
    let pod = |name: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "app", "resources": {"limits": {RESOURCE: "1"}}}]}
        }))
        .unwrap()
    };
    let list = |mut c: v1::pod_resources_lister_client::PodResourcesListerClient<_>| async move {
        c.list(v1::ListPodResourcesRequest {})
            .await
            .unwrap()
            .into_inner()
    };
    assert!(names(list(client.clone()).await).is_empty());
    daemon.pods().admit(&pod("a")).await.unwrap();
    assert_eq!(names(list(client.clone()).await), ["a"]);
    // The same answer again (nothing changed) and then a new one after each change.
    assert_eq!(names(list(client.clone()).await), ["a"]);
    daemon.pods().admit(&pod("b")).await.unwrap();
    assert_eq!(names(list(client.clone()).await), ["a", "b"]);
    daemon.pods().remove("uid-a").await.unwrap();
    let answer = list(client.clone()).await;
    assert_eq!(names(answer.clone()), ["b"]);
    assert_eq!(answer.pod_resources[0].containers[0].devices.len(), 1);
    // Concurrent callers racing an admission: whoever starts after it returned sees it. (The
    // kubelet's rate limit, burst 10 at 100 QPS, is refilled first.)
    tokio::time::sleep(Duration::from_millis(150)).await;
    let racers: Vec<_> = (0..6).map(|_| tokio::spawn(list(client.clone()))).collect();
    daemon.pods().admit(&pod("c")).await.unwrap();
    let after = list(client.clone()).await;
    assert_eq!(names(after), ["b", "c"]);
    for r in racers {
        let seen = names(r.await.unwrap());
        assert!(seen == ["b"] || seen == ["b", "c"], "{seen:?}");
    }
    // A v1 Get is never served from the List answer.
    let got = client
        .get(v1::GetPodResourcesRequest {
            pod_name: "c".into(),
            pod_namespace: "team".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.unwrap().containers[0].devices.len(), 1);
}

/// The PodResources server's thread runs at the lowest priority (nice 19), so building and
/// sending big `List` answers yields the CPU to admissions (docs/observability.md).
#[tokio::test]
async fn server_thread_runs_at_nice_19() {
    let (_root, daemon) = daemon_with_plugin().await;
    // Every daemon in this test process has one such thread; each must be lowered.
    let mut seen = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if comm.trim() != "podresources" {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // Fields after the parenthesised name: state is field 3, nice is field 19.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i32 = after_name.split(' ').nth(16).unwrap().parse().unwrap();
        assert_eq!(nice, 19, "{}: {stat}", dir.display());
        seen += 1;
    }
    assert!(seen >= 1, "no podresources thread found");
    daemon.shutdown().await.unwrap();
}
