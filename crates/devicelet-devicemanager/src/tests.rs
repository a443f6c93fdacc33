//! Unit tests of the manager against the fake plugin and fake clock; names follow the spec's
//! numbered behaviours (devicemanager.md §1 and §2 A/B).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::test_utils::{FakeDialer, FakePlugin, OptionsBehaviour};
use crate::{
    Device, DeviceManager, DeviceManagerConfig, DevicePluginOptions, EndpointError, FakeClock,
    Health, PluginError, RegisterRequest, RegistrationError,
};

const RES: &str = "example.com/gpu";

struct Harness {
    manager: DeviceManager,
    dialer: FakeDialer,
    clock: FakeClock,
}

fn harness() -> Harness {
    let dialer = FakeDialer::new();
    let clock = FakeClock::new();
    let mut config = DeviceManagerConfig::new("/dp");
    config.options_timeout = Duration::from_secs(2);
    let manager = DeviceManager::new(config, Arc::new(dialer.clone()), Arc::new(clock.clone()));
    Harness {
        manager,
        dialer,
        clock,
    }
}

fn request(endpoint: &str) -> RegisterRequest {
    RegisterRequest {
        version: "v1beta1".into(),
        endpoint: endpoint.into(),
        resource_name: RES.into(),
    }
}

impl Harness {
    fn plugin(&self, endpoint: &str) -> FakePlugin {
        let plugin = FakePlugin::new(DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: false,
        });
        self.dialer
            .add(PathBuf::from("/dp").join(endpoint), plugin.clone());
        plugin
    }

    fn counts(&self) -> Option<(u64, u64)> {
        let report = self.manager.capacity();
        Some((*report.capacity.get(RES)?, *report.allocatable.get(RES)?))
    }
}

/// Lets spawned stream tasks run until `cond` holds (current-thread runtime).
async fn settle_until(mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition not reached");
}

fn devs(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| Device::healthy(format!("dev-{i}")).on_numa([i as i64 % 2]))
        .collect()
}

#[tokio::test]
async fn a1_register_calls_options_before_returning_then_opens_stream() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    assert_eq!(
        plugin.calls().first().map(String::as_str),
        Some("GetDevicePluginOptions")
    );
    settle_until(|| plugin.opened_streams() == 1).await;
    // No snapshot yet: not part of capacity (upstream: no healthyDevices entry).
    assert_eq!(h.counts(), None);
    plugin.send(devs(3));
    settle_until(|| h.counts() == Some((3, 3))).await;
    let (_, options) = h.manager.endpoint_client(RES).unwrap();
    assert!(options.pre_start_required);
}

#[tokio::test]
async fn b1_update_capacity_allocatable_sequence() {
    // TestUpdateCapacityAllocatable: 3 devices (2 healthy) → 3/2; drop unhealthy → 2/2;
    // one turns unhealthy → 3/1 after re-adding; drop a healthy one → 2/0 ...
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    let d = |id: &str, healthy: bool| {
        Device::healthy(id).with_health(if healthy {
            Health::Healthy
        } else {
            Health::Unhealthy
        })
    };
    plugin.send(vec![d("d1", true), d("d2", true), d("d3", false)]);
    settle_until(|| h.counts() == Some((3, 2))).await;
    plugin.send(vec![d("d1", true), d("d2", true)]);
    settle_until(|| h.counts() == Some((2, 2))).await;
    plugin.send(vec![d("d1", true), d("d2", false), d("d3", false)]);
    settle_until(|| h.counts() == Some((3, 1))).await;
    plugin.send(vec![d("d2", false), d("d3", false)]);
    settle_until(|| h.counts() == Some((2, 0))).await;
    plugin.send(vec![]);
    settle_until(|| h.counts() == Some((0, 0))).await;
    let snapshot = h.manager.snapshot();
    assert!(
        snapshot.resource(RES).is_some_and(|r| !r.inactive),
        "empty list keeps the resource registered"
    );
}

#[tokio::test]
async fn a3_b1_disconnect_keeps_capacity_zero_allocatable_then_expires_after_grace() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    plugin.send(devs(4));
    settle_until(|| h.counts() == Some((4, 4))).await;
    plugin.close_streams();
    settle_until(|| h.counts() == Some((4, 0))).await;
    assert!(matches!(
        h.manager.endpoint_client(RES),
        Err(EndpointError::Stopped { .. })
    ));

    // Exactly at the grace period: still there (strict `>`).
    h.clock.advance(Duration::from_secs(300));
    let report = h.manager.capacity();
    assert!(report.deleted.is_empty());
    assert_eq!(report.capacity.get(RES), Some(&4));

    h.clock.advance(Duration::from_millis(1));
    let report = h.manager.capacity();
    assert_eq!(report.deleted, vec![RES.to_owned()]);
    assert!(report.capacity.is_empty());
    // Reported as deleted only once, then listed as inactive.
    assert!(h.manager.capacity().deleted.is_empty());
    let snapshot = h.manager.snapshot();
    let view = snapshot.resource(RES).unwrap();
    assert!(view.inactive);
    assert_eq!((view.capacity, view.allocatable), (0, 0));
}

#[tokio::test]
async fn a4_bouncing_plugin_within_grace_recovers_and_is_no_longer_inactive() {
    let h = harness();
    let p1 = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    p1.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;
    p1.fail_streams(PluginError::Connect("broken pipe".into()));
    settle_until(|| h.counts() == Some((2, 0))).await;
    h.clock.advance(Duration::from_secs(400));
    assert_eq!(h.manager.capacity().deleted, vec![RES.to_owned()]);

    let p2 = h.plugin("gpu2.sock");
    h.manager.register(&request("gpu2.sock")).await.unwrap();
    p2.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;
    assert!(!h.manager.snapshot().resource(RES).unwrap().inactive);
}

#[tokio::test]
async fn s1_5_reregistration_replaces_endpoint_and_old_stream_end_does_not_stop_new_one() {
    let h = harness();
    let old = h.plugin("old.sock");
    let old_id = h.manager.register(&request("old.sock")).await.unwrap();
    old.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;

    let new = h.plugin("new.sock");
    let new_id = h.manager.register(&request("new.sock")).await.unwrap();
    assert_ne!(old_id, new_id);
    new.send(devs(5));
    settle_until(|| h.counts() == Some((5, 5))).await;
    // The replaced connection is dropped: its stream no longer reaches the manager.
    settle_until(|| old.live_streams() == 0).await;

    // A late update or teardown of the old endpoint (upstream bug #121994) changes nothing.
    assert!(
        h.manager
            .apply_device_update(RES, old_id, devs(1))
            .is_none()
    );
    assert!(
        !h.manager
            .endpoint_disconnected(RES, old_id, "old plugin exited")
    );
    assert_eq!(h.counts(), Some((5, 5)));
    assert!(h.manager.endpoint_client(RES).is_ok());
    assert_eq!(h.manager.current_endpoint(RES), Some(new_id));
}

#[tokio::test]
async fn s1_5_reregistration_same_devices_keeps_capacity() {
    let h = harness();
    let p1 = h.plugin("p1.sock");
    h.manager.register(&request("p1.sock")).await.unwrap();
    p1.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;
    let p2 = h.plugin("p2.sock");
    h.manager.register(&request("p2.sock")).await.unwrap();
    // Until p2's first snapshot the previous device list stays (upstream keeps allDevices).
    assert_eq!(h.counts(), Some((2, 2)));
    p2.send(devs(2));
    let p3 = h.plugin("p3.sock");
    h.manager.register(&request("p3.sock")).await.unwrap();
    p3.send(devs(1));
    settle_until(|| h.counts() == Some((1, 1))).await;
}

#[tokio::test]
async fn registration_rejects_bad_version_name_and_endpoint_without_dialing() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    let mut bad = request("gpu.sock");
    bad.version = "v1alpha1".into();
    assert!(matches!(
        h.manager.register(&bad).await,
        Err(RegistrationError::UnsupportedVersion { .. })
    ));
    let mut bad = request("gpu.sock");
    bad.resource_name = "gpu".into();
    let err = h.manager.register(&bad).await.unwrap_err();
    assert_eq!(err.to_string(), "the ResourceName \"gpu\" is invalid");
    for endpoint in ["../x", "/abs/gpu.sock", ""] {
        assert!(matches!(
            h.manager.register(&request(endpoint)).await,
            Err(RegistrationError::InvalidEndpoint { .. })
        ));
    }
    assert!(
        plugin.calls().is_empty(),
        "no RPC for rejected registrations"
    );
    assert!(h.manager.snapshot().resources.is_empty());
}

#[tokio::test]
async fn unreachable_socket_is_a_dial_error() {
    let h = harness();
    let err = h
        .manager
        .register(&request("missing.sock"))
        .await
        .unwrap_err();
    assert!(matches!(err, RegistrationError::Dial { .. }));
    assert!(err.to_string().contains("missing.sock"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn options_that_never_answer_time_out_and_do_not_block_other_plugins() {
    let h = harness();
    h.dialer.add(
        "/dp/hang.sock",
        FakePlugin::with_behaviour(OptionsBehaviour::Hang),
    );
    let good = h.plugin("gpu.sock");
    let mut hang_req = request("hang.sock");
    hang_req.resource_name = "example.com/hang".into();
    let manager = h.manager.clone();
    let hanging = tokio::spawn(async move { manager.register(&hang_req).await });
    // The good plugin registers while the other one is stuck.
    h.manager.register(&request("gpu.sock")).await.unwrap();
    good.send(devs(1));
    settle_until(|| h.counts() == Some((1, 1))).await;
    let err = hanging.await.unwrap().unwrap_err();
    assert!(matches!(err, RegistrationError::Options { .. }), "{err}");
    assert!(err.to_string().contains("no answer within 2s"), "{err}");
    assert!(h.manager.snapshot().resource("example.com/hang").is_none());
}

#[tokio::test]
async fn options_error_fails_registration_with_kubelet_wording() {
    let h = harness();
    h.dialer.add(
        "/dp/bad.sock",
        FakePlugin::with_behaviour(OptionsBehaviour::Fail(PluginError::Rpc {
            code: "Unimplemented".into(),
            message: "nope".into(),
        })),
    );
    let err = h.manager.register(&request("bad.sock")).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("failed to get device plugin options"),
        "{err}"
    );
}

#[tokio::test]
async fn duplicate_ids_counted_once_and_large_lists_applied() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    let mut list = devs(3);
    list.push(Device::healthy("dev-0").with_health(Health::Unhealthy));
    plugin.send(list);
    settle_until(|| h.counts() == Some((3, 2))).await;
    plugin.send(devs(100_000));
    settle_until(|| h.counts() == Some((100_000, 100_000))).await;
}

#[tokio::test]
async fn g1_stop_is_idempotent_and_refuses_new_registrations() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    plugin.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;
    h.manager.stop();
    h.manager.stop();
    assert_eq!(h.counts(), Some((2, 0)));
    settle_until(|| plugin.live_streams() == 0).await;
    assert!(matches!(
        h.manager.register(&request("gpu.sock")).await,
        Err(RegistrationError::ManagerStopped)
    ));
}

#[tokio::test]
async fn s1_7_restored_resources_report_zero_then_expire() {
    let h = harness();
    h.manager.restore_registered(["example.com/old"]);
    let report = h.manager.capacity();
    assert_eq!(report.capacity.get("example.com/old"), Some(&0));
    assert_eq!(report.allocatable.get("example.com/old"), Some(&0));
    let view = h.manager.snapshot();
    assert_eq!(
        view.resource("example.com/old")
            .and_then(|r| r.endpoint.as_ref())
            .map(|e| e.state.as_str()),
        Some("Restored")
    );
    h.clock.advance(Duration::from_secs(301));
    assert_eq!(
        h.manager.capacity().deleted,
        vec!["example.com/old".to_owned()]
    );
}

#[tokio::test]
async fn restored_resource_awaits_reregistration_until_its_first_snapshot() {
    // Ecosystem A1 rows 4 and 8: after a restart a resource is "back" only once its plugin
    // registered again AND sent a device list; registering alone is not enough.
    let h = harness();
    h.manager.restore_registered([RES]);
    assert_eq!(h.manager.awaiting_reregistration(), vec![RES.to_owned()]);
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    settle_until(|| plugin.opened_streams() == 1).await;
    assert_eq!(h.manager.awaiting_reregistration(), vec![RES.to_owned()]);
    plugin.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;
    assert!(h.manager.awaiting_reregistration().is_empty());
}

#[tokio::test]
async fn snapshot_json_uses_design_keys() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    plugin.send(vec![Device::healthy("g0").on_numa([1])]);
    settle_until(|| h.counts() == Some((1, 1))).await;
    let json = serde_json::to_value(h.manager.snapshot()).unwrap();
    let r = &json["resources"][0];
    assert_eq!(r["name"], RES);
    assert_eq!(r["capacity"], 1);
    assert_eq!(r["allocatable"], 1);
    assert_eq!(r["inactive"], false);
    assert_eq!(r["devices"][0]["id"], "g0");
    assert_eq!(r["devices"][0]["health"], "Healthy");
    assert_eq!(r["devices"][0]["numaNodes"][0], 1);
}

#[tokio::test]
async fn a_snapshot_beyond_a_size_bound_closes_the_stream_and_a_new_registration_serves_again() {
    let h = harness();
    let plugin = h.plugin("gpu.sock");
    h.manager.register(&request("gpu.sock")).await.unwrap();
    plugin.send(devs(2));
    settle_until(|| h.counts() == Some((2, 2))).await;
    // A 64 KB ID: the snapshot is refused whole, the stream closed, the devices unhealthy.
    let mut hostile = devs(3);
    hostile.push(Device::healthy("x".repeat(64 * 1024)));
    plugin.send(hostile);
    settle_until(|| h.counts() == Some((2, 0))).await;
    settle_until(|| plugin.live_streams() == 0).await;
    let view = h.manager.snapshot();
    let endpoint = view.resource(RES).unwrap().endpoint.clone().unwrap();
    assert_eq!(endpoint.state, "Stopped");

    // The plugin comes back within the bounds.
    let back = h.plugin("back.sock");
    h.manager.register(&request("back.sock")).await.unwrap();
    back.send(devs(4));
    settle_until(|| h.counts() == Some((4, 4))).await;
}
