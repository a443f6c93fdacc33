//! The pod worker's decisions, driven by watch events against an in-memory node core (the
//! seam the binary fills with the real node; end-to-end runs against a real API server are in
//! `interop/cluster`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use devicelet_kube::core::{AdmitStages, NodeCore, Rejection, ReleaseError};
use devicelet_kube::node_status::DeviceCapacity;
use devicelet_kube::pods::{PodWorker, PodWrites};
use devicelet_kube::status_manager::Desired;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::watcher::Event;
use tokio::sync::watch;

/// A node with `slots` identical devices, one per pod; records every call.
struct FakeNode {
    slots: usize,
    /// Resources whose plugin has not registered again yet.
    awaiting: Mutex<Vec<String>>,
    admitted: Mutex<BTreeSet<String>>,
    calls: Mutex<Vec<String>>,
    changes: watch::Sender<u64>,
    /// How many admissions answer "not yet" (a claim not ready) before they work.
    not_ready: Mutex<usize>,
    /// Whether "not yet" is the Node authorizer not having linked the claim (retry soon).
    not_linked: std::sync::atomic::AtomicBool,
    /// Admissions of these pods wait until the gate opens.
    gates: Mutex<BTreeMap<String, Arc<tokio::sync::Notify>>>,
}

impl FakeNode {
    fn new(slots: usize, admitted: &[&str]) -> Arc<Self> {
        Arc::new(FakeNode {
            slots,
            awaiting: Mutex::new(Vec::new()),
            admitted: Mutex::new(admitted.iter().map(|s| s.to_string()).collect()),
            calls: Mutex::new(Vec::new()),
            changes: watch::channel(0).0,
            not_ready: Mutex::new(0),
            not_linked: std::sync::atomic::AtomicBool::new(false),
            gates: Mutex::new(BTreeMap::new()),
        })
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("lock").clone()
    }
}

impl NodeCore for FakeNode {
    async fn admit(&self, pod: &Pod) -> Result<AdmitStages, Rejection> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.calls
            .lock()
            .expect("lock")
            .push(format!("admit {uid}"));
        let gate = self.gates.lock().expect("lock").get(&uid).cloned();
        if let Some(gate) = gate {
            gate.notified().await;
        }
        let mut admitted = self.admitted.lock().expect("lock");
        if admitted.contains(&uid) {
            return Ok(AdmitStages::default());
        }
        let mut not_ready = self.not_ready.lock().expect("lock");
        if *not_ready > 0 {
            *not_ready -= 1;
            return Err(Rejection {
                reason: "FailedPrepareDynamicResources".into(),
                message: "claim not reserved for the pod yet".into(),
                retry: true,
                retry_soon: self.not_linked.load(std::sync::atomic::Ordering::Relaxed),
            });
        }
        if admitted.len() >= self.slots {
            return Err(Rejection {
                reason: "UnexpectedAdmissionError".into(),
                message: "no device left".into(),
                retry: false,
                retry_soon: false,
            });
        }
        admitted.insert(uid);
        Ok(AdmitStages::default())
    }

    async fn release(&self, uid: &str) -> Result<(), ReleaseError> {
        self.calls
            .lock()
            .expect("lock")
            .push(format!("release {uid}"));
        self.admitted.lock().expect("lock").remove(uid);
        Ok(())
    }

    fn is_admitted(&self, uid: &str) -> bool {
        self.admitted.lock().expect("lock").contains(uid)
    }

    fn admitted(&self) -> Vec<String> {
        self.admitted
            .lock()
            .expect("lock")
            .iter()
            .cloned()
            .collect()
    }

    fn awaiting_plugins(&self) -> Vec<String> {
        self.awaiting.lock().expect("lock").clone()
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
}

/// Records what the worker asks of pod objects.
#[derive(Clone, Default)]
struct Recorder(
    Arc<Mutex<Vec<(String, String)>>>,
    Arc<Mutex<Vec<(String, devicelet_kube::startup::StartupRecord)>>>,
);

impl Recorder {
    fn writes(&self) -> Vec<(String, String)> {
        self.0.lock().expect("lock").clone()
    }
}

impl PodWrites for Recorder {
    fn set(&self, uid: &str, _namespace: &str, _name: &str, desired: Desired) {
        let what = match desired {
            Desired::Delete => "delete".to_owned(),
            Desired::Status(v) => {
                let phase = v["status"]["phase"].as_str().unwrap_or_default().to_owned();
                match v["status"]["reason"].as_str() {
                    Some(reason) => format!("{phase} {reason}"),
                    None => phase,
                }
            }
        };
        self.0.lock().expect("lock").push((uid.to_owned(), what));
    }

    fn started(&self, uid: &str, record: devicelet_kube::startup::StartupRecord) {
        self.1.lock().expect("lock").push((uid.to_owned(), record));
    }

    fn forget(&self, uid: &str) {
        self.0
            .lock()
            .expect("lock")
            .push((uid.to_owned(), "forget".to_owned()));
    }

    fn resend(&self, uid: &str, _namespace: &str, _name: &str, _desired: Desired) {
        self.0
            .lock()
            .expect("lock")
            .push((uid.to_owned(), "resend".to_owned()));
    }
}

fn pod(uid: &str, created: i64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            creation_timestamp: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created)
                    .expect("timestamp"),
            )),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("n1".into()),
            containers: vec![Container {
                name: "app".into(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn worker(node: &Arc<FakeNode>) -> (PodWorker<FakeNode, Recorder>, Recorder) {
    let recorder = Recorder::default();
    (
        PodWorker::new("n1", "127.0.0.1", node.clone(), recorder.clone()),
        recorder,
    )
}

#[tokio::test]
async fn relist_releases_vanished_pods_before_admitting_new_ones_oldest_first() {
    // After a restart: a and b were admitted; a was force-deleted while devicelet was down.
    let node = FakeNode::new(2, &["a", "b"]);
    let (mut w, rec) = worker(&node);
    w.handle(Event::Init).await;
    // Listed in name order, created d before c: c is older, so c gets a's device.
    w.handle(Event::InitApply(pod("d", 30))).await;
    w.handle(Event::InitApply(pod("b", 10))).await;
    w.handle(Event::InitApply(pod("c", 20))).await;
    assert!(
        node.calls().is_empty(),
        "nothing happens before the list is complete"
    );
    w.handle(Event::InitDone).await;
    assert_eq!(
        node.calls(),
        ["release a", "admit c", "admit d"],
        "the vanished pod is released first, then the new pods oldest first; b (admitted before the restart) is resumed, not admitted again"
    );
    let writes = rec.writes();
    assert!(writes.contains(&("b".into(), "Running".into())));
    assert!(writes.contains(&("c".into(), "Running".into())));
    assert!(writes.contains(&("d".into(), "Failed UnexpectedAdmissionError".into())));
}

#[tokio::test]
async fn a_rejected_pod_is_never_admitted_again() {
    let node = FakeNode::new(0, &[]);
    let (mut w, rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    w.handle(Event::Apply(pod("x", 1))).await;
    assert_eq!(node.calls(), ["admit x"]);
    assert_eq!(
        rec.writes(),
        [("x".into(), "Failed UnexpectedAdmissionError".into())]
    );
}

#[tokio::test]
async fn an_admitted_pod_is_not_admitted_twice_by_repeated_events() {
    let node = FakeNode::new(1, &[]);
    let (mut w, _rec) = worker(&node);
    for _ in 0..3 {
        w.handle(Event::Apply(pod("x", 1))).await;
    }
    assert_eq!(node.calls(), ["admit x"]);
}

#[tokio::test]
async fn a_pod_being_deleted_is_released_then_deleted_with_grace_zero() {
    let node = FakeNode::new(1, &[]);
    let (mut w, rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    let mut deleting = pod("x", 1);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    w.handle(Event::Apply(deleting)).await;
    assert_eq!(node.calls(), ["admit x", "release x"]);
    assert_eq!(
        rec.writes(),
        [
            ("x".into(), "Running".into()),
            ("x".into(), "delete".into())
        ]
    );
    // The object's deletion: nothing left to release.
    w.handle(Event::Delete(pod("x", 1))).await;
    assert_eq!(node.calls(), ["admit x", "release x"]);
}

#[tokio::test]
async fn a_finished_pod_is_released_and_a_deleted_one_too() {
    let node = FakeNode::new(2, &[]);
    let (mut w, _rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    w.handle(Event::Apply(pod("y", 2))).await;
    let mut done = pod("x", 1);
    done.status = Some(PodStatus {
        phase: Some("Succeeded".into()),
        ..PodStatus::default()
    });
    w.handle(Event::Apply(done)).await;
    w.handle(Event::Delete(pod("y", 2))).await;
    assert_eq!(
        node.calls(),
        ["admit x", "admit y", "release x", "release y"]
    );
    assert!(node.admitted().is_empty());
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_new_pods_wait_for_device_plugins_to_register_again() {
    // a was admitted before the restart; b is new. The plugin comes back after 3 s.
    let node = FakeNode::new(2, &["a"]);
    *node.awaiting.lock().expect("lock") = vec!["example.com/gpu".into()];
    let (w, _rec) = worker(&node);
    let mut w = w.with_plugin_wait(std::time::Duration::from_secs(30));
    let back = node.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        back.awaiting.lock().expect("lock").clear();
        back.changes.send_modify(|v| *v += 1);
    });
    let started = tokio::time::Instant::now();
    w.handle(Event::Init).await;
    w.handle(Event::InitApply(pod("a", 1))).await;
    w.handle(Event::InitApply(pod("b", 2))).await;
    w.handle(Event::InitDone).await;
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(3) && waited < std::time::Duration::from_secs(5),
        "admission waited for the plugin ({waited:?})"
    );
    assert_eq!(node.calls(), ["admit b"], "a resumes from the checkpoint");
}

#[tokio::test(start_paused = true)]
async fn the_plugin_wait_is_bounded() {
    let node = FakeNode::new(2, &[]);
    *node.awaiting.lock().expect("lock") = vec!["example.com/gone".into()];
    let (w, rec) = worker(&node);
    let mut w = w.with_plugin_wait(std::time::Duration::from_secs(30));
    let started = tokio::time::Instant::now();
    w.handle(Event::Init).await;
    w.handle(Event::InitApply(pod("b", 2))).await;
    w.handle(Event::InitDone).await;
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(30) && waited < std::time::Duration::from_secs(32),
        "{waited:?}"
    );
    assert_eq!(rec.writes(), [("b".into(), "Running".into())]);
    // Later lists do not wait again.
    let started = tokio::time::Instant::now();
    w.handle(Event::Init).await;
    w.handle(Event::InitApply(pod("b", 2))).await;
    w.handle(Event::InitApply(pod("c", 3))).await;
    w.handle(Event::InitDone).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

#[tokio::test]
async fn a_status_overwritten_by_the_node_lifecycle_controller_is_sent_again() {
    let node = FakeNode::new(1, &[]);
    let (mut w, rec) = worker(&node);
    w.handle(Event::Init).await;
    w.handle(Event::InitDone).await;
    w.handle(Event::Apply(pod("a", 1))).await;
    let sent = rec.writes();
    assert_eq!(sent.last(), Some(&("a".into(), "Running".into())));

    // The watch shows the status devicelet wrote: nothing is forced.
    let mut reported = pod("a", 1);
    let mut status: k8s_openapi::api::core::v1::PodStatus =
        serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
        }))
        .expect("status");
    reported.status = Some(status.clone());
    w.handle(Event::Apply(reported.clone())).await;
    assert!(!rec.writes().iter().any(|(_, w)| w == "resend"));

    // The node lifecycle controller marks it not Ready (the node's Lease lapsed): sent again.
    if let Some(c) = status
        .conditions
        .as_mut()
        .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
    {
        c.status = "False".into();
    }
    reported.status = Some(status);
    w.handle(Event::Apply(reported)).await;
    assert_eq!(rec.writes().last(), Some(&("a".into(), "resend".into())));
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_claims_are_not_ready_waits_and_is_admitted_on_a_later_try() {
    let node = FakeNode::new(1, &[]);
    *node.not_ready.lock().expect("lock") = 2;
    let (mut w, rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    assert_eq!(node.calls(), ["admit x"]);
    assert!(rec.writes().is_empty(), "a waiting pod is not failed");
    assert_eq!(w.waiting(), ["x"]);

    w.retry_due().await;
    assert_eq!(node.calls().len(), 1, "not before the back-off");
    tokio::time::advance(std::time::Duration::from_millis(600)).await;
    w.retry_due().await;
    assert_eq!(node.calls().len(), 2, "tried again after 0.5 s");
    // The back-off doubles; an event for the pod tries at once.
    w.handle(Event::Apply(pod("x", 1))).await;
    assert_eq!(node.calls(), ["admit x", "admit x", "admit x"]);
    assert_eq!(rec.writes(), [("x".into(), "Running".into())]);
    assert!(w.waiting().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_waiting_pod_that_is_deleted_is_not_tried_again() {
    let node = FakeNode::new(1, &[]);
    *node.not_ready.lock().expect("lock") = 5;
    let (mut w, _rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    w.handle(Event::Delete(pod("x", 1))).await;
    assert!(w.waiting().is_empty());
    tokio::time::advance(std::time::Duration::from_secs(20)).await;
    w.retry_due().await;
    assert_eq!(node.calls(), ["admit x"]);
}

/// A1 row 3: a pod that completed before the node restarted is listed again after the restart;
/// it is neither admitted nor given a new status (the kubelet turned such pods into
/// `UnexpectedAdmissionError`).
#[tokio::test]
async fn a1_3_a_completed_pod_listed_after_a_restart_is_not_admitted_again() {
    let node = FakeNode::new(1, &[]);
    let (mut w, rec) = worker(&node);
    let mut done = pod("x", 1);
    done.status = Some(PodStatus {
        phase: Some("Succeeded".into()),
        ..PodStatus::default()
    });
    w.handle(Event::Init).await;
    w.handle(Event::InitApply(done)).await;
    w.handle(Event::InitDone).await;
    assert!(node.calls().is_empty(), "{:?}", node.calls());
    assert!(rec.writes().is_empty(), "{:?}", rec.writes());
}

#[tokio::test]
async fn a_slow_admission_holds_up_no_other_pod() {
    let node = FakeNode::new(2, &[]);
    let gate = Arc::new(tokio::sync::Notify::new());
    node.gates
        .lock()
        .expect("lock")
        .insert("slow".into(), gate.clone());
    let (mut w, rec) = worker(&node);
    w.dispatch(Event::Apply(pod("slow", 1))).await;
    w.dispatch(Event::Apply(pod("fast", 2))).await;
    // The fast pod is admitted by the node while the slow one's admission still waits.
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !node.is_admitted("fast") {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the fast pod is admitted while the slow one waits");
    assert!(!node.is_admitted("slow"));
    gate.notify_one();
    w.settle().await;
    assert_eq!(
        rec.writes(),
        [
            ("fast".into(), "Running".into()),
            ("slow".into(), "Running".into())
        ],
        "each pod is reported when its own admission finishes"
    );
}

#[tokio::test]
async fn a_pod_deleted_while_its_admission_runs_is_released_after_it() {
    let node = FakeNode::new(1, &[]);
    let gate = Arc::new(tokio::sync::Notify::new());
    node.gates
        .lock()
        .expect("lock")
        .insert("x".into(), gate.clone());
    let (mut w, rec) = worker(&node);
    w.dispatch(Event::Apply(pod("x", 1))).await;
    // Repeated events while in flight start no second admission.
    w.dispatch(Event::Apply(pod("x", 1))).await;
    let mut deleting = pod("x", 1);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    w.dispatch(Event::Apply(deleting)).await;
    gate.notify_one();
    w.settle().await;
    assert_eq!(node.calls(), ["admit x", "release x"]);
    assert_eq!(
        rec.writes(),
        [
            ("x".into(), "Running".into()),
            ("x".into(), "delete".into())
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_not_linked_yet_is_retried_within_milliseconds_and_recorded() {
    let node = FakeNode::new(1, &[]);
    *node.not_ready.lock().expect("lock") = 2;
    node.not_linked
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut w, rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    let due = w.next_retry().expect("waiting") - tokio::time::Instant::now();
    assert!(
        due <= std::time::Duration::from_millis(6),
        "the Node authorizer's lag is retried after 5 ms, not 0.5 s: {due:?}"
    );
    tokio::time::advance(std::time::Duration::from_millis(6)).await;
    w.retry_due().await;
    tokio::time::advance(std::time::Duration::from_millis(12)).await;
    w.retry_due().await;
    assert_eq!(node.calls(), ["admit x", "admit x", "admit x"]);
    assert_eq!(rec.writes(), [("x".into(), "Running".into())]);
    let records = rec.1.lock().expect("lock").clone();
    assert_eq!(records.len(), 1);
    let (uid, record) = &records[0];
    assert_eq!(uid, "x");
    assert_eq!(record.attempts, 3);
    let times = record.times(record.admitted);
    assert!(
        times.stages[0].1 >= std::time::Duration::from_millis(18),
        "the claim wait covers both retries: {times:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn other_not_ready_causes_keep_the_half_second_back_off() {
    let node = FakeNode::new(1, &[]);
    *node.not_ready.lock().expect("lock") = 1;
    let (mut w, _rec) = worker(&node);
    w.handle(Event::Apply(pod("x", 1))).await;
    let due = w.next_retry().expect("waiting") - tokio::time::Instant::now();
    assert!(due >= std::time::Duration::from_millis(500), "{due:?}");
}

/// A container runtime that records what the worker asks of it; a pod's status is whatever the
/// test sets.
#[derive(Default)]
struct FakeRuntime {
    calls: Mutex<Vec<String>>,
    statuses: Mutex<BTreeMap<String, devicelet_kube::RuntimePodStatus>>,
    changes: Option<watch::Sender<u64>>,
}

impl FakeRuntime {
    fn new() -> Arc<Self> {
        Arc::new(FakeRuntime {
            changes: Some(watch::channel(0).0),
            ..FakeRuntime::default()
        })
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("lock").clone()
    }
}

impl devicelet_kube::PodRuntime for FakeRuntime {
    fn name(&self) -> String {
        "fake".into()
    }

    fn run_pod(&self, pod: &Pod) -> Result<(), ReleaseError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.calls.lock().expect("lock").push(format!("run {uid}"));
        Ok(())
    }

    fn kill_pod<'a>(
        &'a self,
        uid: &'a str,
        grace: std::time::Duration,
    ) -> devicelet_kube::core::RuntimeFuture<'a> {
        Box::pin(async move {
            self.calls
                .lock()
                .expect("lock")
                .push(format!("kill {uid} {}s", grace.as_secs()));
            Ok(())
        })
    }

    fn status(&self, uid: &str) -> Option<devicelet_kube::RuntimePodStatus> {
        self.statuses.lock().expect("lock").get(uid).cloned()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.as_ref().expect("changes").subscribe()
    }
}

#[tokio::test]
async fn with_a_runtime_pods_run_report_real_states_and_stop_before_release_and_delete() {
    let node = FakeNode::new(1, &[]);
    let runtime = FakeRuntime::new();
    let recorder = Recorder::default();
    let mut w = PodWorker::new("n1", "127.0.0.1", node.clone(), recorder.clone())
        .with_runtime(runtime.clone());
    w.handle(Event::Apply(pod("x", 1))).await;
    assert_eq!(node.calls(), ["admit x"]);
    assert_eq!(
        runtime.calls(),
        ["run x"],
        "admitted, then handed to the runtime"
    );
    assert_eq!(
        recorder.writes(),
        [("x".into(), "Pending".into())],
        "not Running before the runtime says so"
    );

    // The pod is deleted with a 4 s grace period: containers stop first, then the devices are
    // released, then the object is deleted.
    let mut deleting = pod("x", 1);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    deleting.metadata.deletion_grace_period_seconds = Some(4);
    w.handle(Event::Apply(deleting.clone())).await;
    w.handle(Event::Apply(deleting)).await;
    w.settle_kills().await;
    assert_eq!(
        runtime.calls(),
        ["run x", "kill x 4s"],
        "killed once, with the grace period"
    );
    assert_eq!(node.calls(), ["admit x", "release x"]);
    assert_eq!(
        recorder.writes().last(),
        Some(&("x".into(), "delete".into()))
    );
}

#[tokio::test]
async fn with_a_runtime_a_relist_kills_gone_pods_before_their_devices_go_to_new_ones() {
    // After a restart: a was admitted and force-deleted while devicelet was down.
    let node = FakeNode::new(1, &["a"]);
    let runtime = FakeRuntime::new();
    let recorder = Recorder::default();
    let mut w = PodWorker::new("n1", "127.0.0.1", node.clone(), recorder.clone())
        .with_runtime(runtime.clone());
    w.handle(Event::Init).await;
    w.handle(Event::InitApply(pod("b", 10))).await;
    w.handle(Event::InitDone).await;
    assert_eq!(
        runtime.calls(),
        ["kill a 0s", "run b"],
        "killed at once, then b runs"
    );
    assert_eq!(
        node.calls(),
        ["release a", "admit b"],
        "a's device is free before b is admitted"
    );
}
