//! Admission tests against the fake plugin (spec devicemanager.md §2 C1-C5).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use devicelet_topology::NumaMask;

use crate::test_utils::{AllocateBehaviour, FakeDialer, FakePlugin};
use crate::{
    AdmissionError, ContainerKind, ContainerRequest, Device, DeviceManager, DeviceManagerConfig,
    DevicePluginOptions, FakeClock, Health, PluginError, RegisterRequest,
};

const RES: &str = "example.com/gpu";

async fn setup(devices: Vec<Device>, preferred: bool) -> (DeviceManager, FakePlugin) {
    let dialer = FakeDialer::new();
    let plugin = FakePlugin::new(DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: preferred,
    });
    dialer.add(PathBuf::from("/dp/gpu.sock"), plugin.clone());
    let mut config = DeviceManagerConfig::new("/dp");
    config.allocate_timeout = Duration::from_secs(3);
    let manager = DeviceManager::new(config, Arc::new(dialer), Arc::new(FakeClock::new()));
    manager
        .register(&RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "gpu.sock".into(),
            resource_name: RES.into(),
        })
        .await
        .unwrap();
    let expected = devices.len() as u64;
    let mut changes = manager.subscribe();
    plugin.send(devices);
    // Wait for the stream task (possibly on another worker thread) to apply the snapshot.
    while manager.capacity().capacity.get(RES) != Some(&expected) {
        tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .expect("snapshot applied")
            .unwrap();
    }
    (manager, plugin)
}

fn gpus(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| Device::healthy(format!("g{i}")).on_numa([(i / 2) as i64]))
        .collect()
}

fn container(pod: &str, name: &str, kind: ContainerKind, count: u64) -> ContainerRequest {
    ContainerRequest {
        pod_uid: pod.into(),
        container: name.into(),
        kind,
        limits: BTreeMap::from([(RES.to_owned(), count)]),
        affinity: None,
    }
}

async fn take(manager: &DeviceManager, request: ContainerRequest) -> Vec<String> {
    manager
        .allocate_container(&request)
        .await
        .unwrap()
        .remove(RES)
        .unwrap_or_default()
}

#[tokio::test]
async fn c1_init_container_devices_are_reused_by_app_containers_without_sharing() {
    // TestInitContainerDeviceAllocation.
    let (m, _) = setup(gpus(4), false).await;
    let init1 = take(&m, container("p", "init1", ContainerKind::Init, 1)).await;
    let init2 = take(&m, container("p", "init2", ContainerKind::Init, 2)).await;
    assert!(
        init1.iter().all(|d| init2.contains(d)),
        "init2 reuses init1's device: {init1:?} {init2:?}"
    );
    let app1 = take(&m, container("p", "app1", ContainerKind::App, 1)).await;
    let app2 = take(&m, container("p", "app2", ContainerKind::App, 1)).await;
    assert!(init2.contains(&app1[0]) && init2.contains(&app2[0]));
    assert_ne!(app1, app2);
}

#[tokio::test]
async fn c1_restartable_init_containers_keep_their_devices() {
    // TestRestartableInitContainerDeviceAllocation.
    let (m, _) = setup(gpus(6), false).await;
    let init = take(&m, container("p", "init", ContainerKind::Init, 3)).await;
    let side1 = take(&m, container("p", "side1", ContainerKind::Sidecar, 1)).await;
    let side2 = take(&m, container("p", "side2", ContainerKind::Sidecar, 2)).await;
    let app1 = take(&m, container("p", "app1", ContainerKind::App, 1)).await;
    let app2 = take(&m, container("p", "app2", ContainerKind::App, 2)).await;
    let sidecars: HashSet<&String> = side1.iter().chain(&side2).collect();
    assert_eq!(sidecars.len(), 3);
    assert!(sidecars.iter().all(|d| init.contains(d)));
    let apps: HashSet<&String> = app1.iter().chain(&app2).collect();
    assert_eq!(apps.len(), 3);
    assert!(apps.is_disjoint(&sidecars));
}

#[tokio::test]
async fn c3_already_allocated_container_returns_existing_devices_without_rpc() {
    let (m, plugin) = setup(gpus(2), false).await;
    let first = take(&m, container("p", "c", ContainerKind::App, 1)).await;
    let again = take(&m, container("p", "c", ContainerKind::App, 1)).await;
    assert_eq!(first, again);
    assert_eq!(plugin.allocate_requests().len(), 1);
    let err = m
        .allocate_container(&container("p", "c", ContainerKind::App, 2))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("changed request for resource"),
        "{err}"
    );
}

#[tokio::test]
async fn c4_shortage_is_rejected_with_counts_and_nothing_is_reserved() {
    let (m, _) = setup(gpus(2), false).await;
    take(&m, container("p1", "c", ContainerKind::App, 1)).await;
    let err = m
        .allocate_container(&container("p2", "c", ContainerKind::App, 2))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1"
    );
    assert_eq!(
        take(&m, container("p3", "c", ContainerKind::App, 1))
            .await
            .len(),
        1
    );
}

#[tokio::test]
async fn c4_unhealthy_devices_are_never_picked() {
    let mut devices = gpus(3);
    devices[0].health = Health::Unhealthy;
    devices[2].health = Health::Unhealthy;
    let (m, _) = setup(devices, false).await;
    assert_eq!(
        take(&m, container("p", "c", ContainerKind::App, 1)).await,
        ["g1"]
    );
    let err = m
        .allocate_container(&container("q", "c", ContainerKind::App, 1))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("Requested: 1, Available: 0"),
        "{err}"
    );
}

#[tokio::test]
async fn c4_numa_affinity_and_preferred_allocation_are_respected() {
    let (m, plugin) = setup(gpus(6), true).await;
    plugin.set_preferred_answer(vec!["g3".into(), "bogus".into()]);
    let mut request = container("p", "c", ContainerKind::App, 1);
    request.affinity = NumaMask::single(1);
    let chosen = take(&m, request).await;
    assert_eq!(chosen, ["g3"]);
    let asked = plugin.preferred_requests();
    assert_eq!(asked[0].available_device_ids, ["g2", "g3"]);
    assert_eq!(asked[0].allocation_size, 1);
}

#[tokio::test]
async fn allocate_rpc_error_empty_answer_or_hang_leave_no_partial_allocation() {
    let (m, plugin) = setup(gpus(2), false).await;
    plugin.set_allocate(AllocateBehaviour::Fail(PluginError::Rpc {
        code: "Internal".into(),
        message: "boom".into(),
    }));
    let err = m
        .allocate_container(&container("p", "c", ContainerKind::App, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, AdmissionError::Allocate { .. }), "{err}");
    assert!(err.to_string().contains("boom"));
    plugin.set_allocate(AllocateBehaviour::Empty);
    let err = m
        .allocate_container(&container("p", "c", ContainerKind::App, 1))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no containers return in allocation response"),
        "{err}"
    );
    assert!(m.container_allocations("p", "c").is_empty());
    // Both devices are still free.
    plugin.set_allocate(AllocateBehaviour::Answer);
    assert_eq!(
        take(&m, container("q", "c", ContainerKind::App, 2))
            .await
            .len(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn hung_allocate_times_out_and_releases_the_devices() {
    let (m, plugin) = setup(gpus(1), false).await;
    plugin.set_allocate(AllocateBehaviour::Hang);
    let err = m
        .allocate_container(&container("p", "c", ContainerKind::App, 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no answer within 3s"), "{err}");
    plugin.set_allocate(AllocateBehaviour::Answer);
    assert_eq!(
        take(&m, container("q", "c", ContainerKind::App, 1)).await,
        ["g0"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admissions_of_different_pods_never_share_a_device() {
    let (m, _) = setup(gpus(40), false).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            m.allocate_container(&container(&format!("p{i}"), "c", ContainerKind::App, 2))
                .await
        }));
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for id in task.await.unwrap().unwrap().remove(RES).unwrap() {
            assert!(seen.insert(id.clone()), "{id} given twice");
        }
    }
    assert_eq!(seen.len(), 40);
    assert!(
        m.allocate_container(&container("px", "c", ContainerKind::App, 1))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn removing_a_pod_frees_its_devices_and_unknown_resources_are_skipped() {
    let (m, _) = setup(gpus(1), false).await;
    let mut request = container("p", "c", ContainerKind::App, 1);
    request.limits.insert("example.com/not-a-plugin".into(), 3);
    let got = m.allocate_container(&request).await.unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), [RES]);
    assert!(m.remove_pod("p"));
    assert!(!m.remove_pod("p"));
    assert_eq!(
        take(&m, container("q", "c", ContainerKind::App, 1)).await,
        ["g0"]
    );
}

#[tokio::test]
async fn a4_stopped_plugin_fails_allocation() {
    let (m, plugin) = setup(gpus(2), false).await;
    plugin.close_streams();
    for _ in 0..1000 {
        if m.capacity().allocatable.get(RES) == Some(&0) {
            break;
        }
        tokio::task::yield_now().await;
    }
    let err = m
        .allocate_container(&container("p", "c", ContainerKind::App, 1))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no healthy devices present"),
        "{err}"
    );
}

#[tokio::test]
async fn d1_run_container_options_calls_prestart_with_all_devices_and_merges_responses() {
    let dialer = FakeDialer::new();
    let plugin = FakePlugin::new(DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: false,
    });
    dialer.add(PathBuf::from("/dp/gpu.sock"), plugin.clone());
    let manager = DeviceManager::new(
        DeviceManagerConfig::new("/dp"),
        Arc::new(dialer),
        Arc::new(FakeClock::new()),
    );
    manager
        .register(&RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "gpu.sock".into(),
            resource_name: RES.into(),
        })
        .await
        .unwrap();
    let mut changes = manager.subscribe();
    plugin.send(gpus(2));
    while manager.capacity().capacity.get(RES) != Some(&2) {
        changes.changed().await.unwrap();
    }
    let got = take(&manager, container("p", "c", ContainerKind::App, 2)).await;
    let limits = BTreeMap::from([(RES.to_owned(), 2u64)]);
    let options = manager
        .run_container_options("p", "c", &limits)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(options.envs["FAKE_DEVICES"], got.join(","));
    assert_eq!(
        plugin
            .calls()
            .iter()
            .filter(|c| *c == "PreStartContainer")
            .count(),
        1
    );
    // A zero limit skips PreStart; a container without devices gets None.
    let zero = BTreeMap::from([(RES.to_owned(), 0u64)]);
    assert!(
        manager
            .run_container_options("p", "other", &zero)
            .await
            .unwrap()
            .is_none()
    );
    // PreStart required but nothing cached: the kubelet's error.
    let err = manager
        .run_container_options("p", "other", &limits)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no devices found allocated in local cache"),
        "{err}"
    );
}

#[tokio::test]
async fn c4_first_free_pick_sees_devices_freed_behind_the_scan_hint() {
    // The fast pick starts after the devices known to be taken; a removal or a failed
    // admission must make the freed devices visible again, in plugin order.
    let (m, _) = setup(gpus(6), false).await;
    let a = take(&m, container("a", "c", ContainerKind::App, 2)).await;
    let b = take(&m, container("b", "c", ContainerKind::App, 1)).await;
    let c = take(&m, container("c", "c", ContainerKind::App, 1)).await;
    assert_eq!(
        (a.as_slice(), b.as_slice(), c.as_slice()),
        (
            &["g0".to_string(), "g1".into()][..],
            &["g2".to_string()][..],
            &["g3".to_string()][..]
        )
    );
    assert!(m.remove_pod("a"));
    assert_eq!(
        take(&m, container("d", "c", ContainerKind::App, 1)).await,
        ["g0"]
    );
    assert_eq!(
        take(&m, container("e", "c", ContainerKind::App, 2)).await,
        ["g1", "g4"]
    );
    // Only g5 is left: a 2-device request fails with the exact counts and frees nothing.
    let err = m
        .allocate_container(&container("f", "c", ContainerKind::App, 2))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("Requested: 2, Available: 1"),
        "{err}"
    );
    assert!(m.remove_pod("b"));
    assert_eq!(
        take(&m, container("g", "c", ContainerKind::App, 2)).await,
        ["g2", "g5"]
    );
}

#[tokio::test]
async fn d1_lost_runtime_settings_are_asked_for_again_for_the_same_devices() {
    let (manager, plugin) = setup(gpus(4), false).await;
    // As restored from a checkpoint whose cached Allocate answer did not decode.
    manager.restore_allocations([(
        "p".to_owned(),
        "c".to_owned(),
        RES.to_owned(),
        crate::ResourceAllocation {
            device_ids: vec!["g2".into(), "g3".into()],
            devices_per_numa: BTreeMap::from([(1, vec!["g2".into(), "g3".into()])]),
            response: Default::default(),
        },
    )]);
    let limits = BTreeMap::from([(RES.to_owned(), 2u64)]);
    let allocates = |p: &FakePlugin| p.calls().iter().filter(|c| *c == "Allocate").count();
    assert!(
        manager
            .refresh_lost_responses("p", "c", &limits)
            .await
            .unwrap()
    );
    assert_eq!(allocates(&plugin), 1);
    let options = manager
        .run_container_options("p", "c", &limits)
        .await
        .unwrap()
        .unwrap();
    // Same devices, now with the plugin's settings.
    assert_eq!(options.envs["FAKE_DEVICES"], "g2,g3");
    assert_eq!(
        manager.container_allocations("p", "c")[RES].device_ids,
        ["g2", "g3"]
    );
    // Nothing lost any more: no second RPC.
    assert!(
        !manager
            .refresh_lost_responses("p", "c", &limits)
            .await
            .unwrap()
    );
    assert_eq!(allocates(&plugin), 1);
}

#[tokio::test]
async fn d1_lost_runtime_settings_with_the_plugin_failing_is_an_error_and_keeps_the_devices() {
    let (manager, plugin) = setup(gpus(2), false).await;
    manager.restore_allocations([(
        "p".to_owned(),
        "c".to_owned(),
        RES.to_owned(),
        crate::ResourceAllocation {
            device_ids: vec!["g0".into()],
            devices_per_numa: BTreeMap::new(),
            response: Default::default(),
        },
    )]);
    plugin.set_allocate(AllocateBehaviour::Fail(PluginError::Rpc {
        code: "Internal".into(),
        message: "boom".into(),
    }));
    let limits = BTreeMap::from([(RES.to_owned(), 1u64)]);
    let err = manager
        .refresh_lost_responses("p", "c", &limits)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Allocate rpc"), "{err}");
    let held = manager.container_allocations("p", "c");
    assert_eq!(held[RES].device_ids, ["g0"]);
    assert!(held[RES].response.is_none());
}
