//! The ResourceSlice janitor (`slices.rs`) on a fake API and a fake node, in paused time:
//! slices of a driver that stays away are wiped after the 30 s delay, never before; a driver
//! that comes back within the delay keeps them; at start, drivers with slices get the delay
//! instead of an immediate wipe; failed wipes are retried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devicelet_kube::slices::{SliceApi, SliceJanitor};
use devicelet_kube::{
    AdmitStages, ClusterError, DeviceCapacity, NodeCore, Rejection, ReleaseError,
};
use k8s_openapi::api::core::v1::{Pod, ResourceStatus};
use tokio::sync::watch;

#[derive(Default)]
struct Drivers(Mutex<Vec<String>>);

struct FakeNode {
    drivers: Arc<Drivers>,
    changes: watch::Sender<u64>,
}

impl NodeCore for FakeNode {
    async fn admit(&self, _pod: &Pod) -> Result<AdmitStages, Rejection> {
        Ok(AdmitStages::default())
    }
    async fn release(&self, _uid: &str) -> Result<(), ReleaseError> {
        Ok(())
    }
    fn is_admitted(&self, _uid: &str) -> bool {
        false
    }
    fn admitted(&self) -> Vec<String> {
        Vec::new()
    }
    fn awaiting_plugins(&self) -> Vec<String> {
        Vec::new()
    }
    fn capacity(&self) -> DeviceCapacity {
        DeviceCapacity::default()
    }
    fn inventory_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
    fn resource_health(&self, _uid: &str) -> BTreeMap<String, Vec<ResourceStatus>> {
        BTreeMap::new()
    }
    fn dra_drivers(&self) -> Vec<String> {
        self.drivers.0.lock().expect("lock").clone()
    }
}

#[derive(Clone, Default)]
struct FakeSlices {
    slices: Arc<Mutex<BTreeSet<String>>>,
    /// (driver, seconds since the test started) of every wipe call.
    wipes: Arc<Mutex<Vec<(String, u64)>>>,
    failures_left: Arc<Mutex<u32>>,
    start: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl SliceApi for FakeSlices {
    async fn drivers_with_slices(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self.slices.lock().expect("lock").clone())
    }
    async fn wipe(&self, driver: &str) -> Result<(), ClusterError> {
        let start = self.start.lock().expect("lock").expect("start");
        self.wipes
            .lock()
            .expect("lock")
            .push((driver.to_owned(), start.elapsed().as_secs()));
        let mut left = self.failures_left.lock().expect("lock");
        if *left > 0 {
            *left -= 1;
            return Err(ClusterError::Deadline {
                what: "test".into(),
                seconds: 15,
            });
        }
        self.slices.lock().expect("lock").remove(driver);
        Ok(())
    }
}

fn setup(
    connected: &[&str],
    with_slices: &[&str],
) -> (Arc<Drivers>, FakeSlices, watch::Sender<bool>) {
    let drivers = Arc::new(Drivers::default());
    *drivers.0.lock().expect("lock") = connected.iter().map(|s| s.to_string()).collect();
    let api = FakeSlices::default();
    *api.slices.lock().expect("lock") = with_slices.iter().map(|s| s.to_string()).collect();
    *api.start.lock().expect("lock") = Some(tokio::time::Instant::now());
    let node = Arc::new(FakeNode {
        drivers: drivers.clone(),
        changes: watch::channel(0).0,
    });
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(SliceJanitor::new(node, api.clone(), "n1", None).run(stopped));
    (drivers, api, stop)
}

async fn advance(secs: u64) {
    for _ in 0..secs * 2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn set(drivers: &Drivers, connected: &[&str]) {
    *drivers.0.lock().expect("lock") = connected.iter().map(|s| s.to_string()).collect();
}

#[tokio::test(start_paused = true)]
async fn at_start_disconnected_drivers_get_the_delay_not_an_immediate_wipe() {
    // a and b have slices; b is connected; a registers again after 20 s (devicelet restarted).
    let (drivers, api, _stop) = setup(&["b"], &["a", "b", "c"]);
    advance(20).await;
    assert!(
        api.wipes.lock().expect("lock").is_empty(),
        "nothing wiped within the delay"
    );
    set(&drivers, &["a", "b"]);
    advance(20).await;
    let wipes = api.wipes.lock().expect("lock").clone();
    assert_eq!(wipes.len(), 1, "only c, which never came back: {wipes:?}");
    assert_eq!(wipes[0].0, "c");
    assert!(
        (30..=31).contains(&wipes[0].1),
        "after the delay: {wipes:?}"
    );
    assert_eq!(
        *api.slices.lock().expect("lock"),
        BTreeSet::from(["a".into(), "b".into()])
    );
}

#[tokio::test(start_paused = true)]
async fn a_driver_that_goes_away_loses_its_slices_after_30s_unless_it_comes_back() {
    let (drivers, api, _stop) = setup(&["a", "b"], &["a", "b"]);
    advance(2).await;
    set(&drivers, &["b"]); // a disconnects at ~2 s
    advance(10).await;
    set(&drivers, &[]); // b disconnects at ~12 s
    advance(10).await;
    set(&drivers, &["b"]); // b is back at ~22 s: its wipe is cancelled
    advance(20).await;
    let wipes = api.wipes.lock().expect("lock").clone();
    assert_eq!(wipes.len(), 1, "{wipes:?}");
    assert_eq!(wipes[0].0, "a");
    assert!(
        (32..=34).contains(&wipes[0].1),
        "30 s after a left: {wipes:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_wipe_is_retried_with_back_off() {
    let (_drivers, api, _stop) = setup(&[], &["a"]);
    *api.failures_left.lock().expect("lock") = 2;
    advance(40).await;
    let wipes = api.wipes.lock().expect("lock").clone();
    assert_eq!(wipes.len(), 3, "two failures then success: {wipes:?}");
    assert!(api.slices.lock().expect("lock").is_empty());
}
