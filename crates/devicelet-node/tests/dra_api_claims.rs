//! Cluster mode DRA admission ([`ClaimOrigin::Api`]): claims come from the API server (here a
//! fake claim source), are checked and prepared but never created, allocated or reserved by
//! the node.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use devicelet_dra::fake::{
    FakeDialer, FakeDraDriver, add_template_claim, allocated_claim, owned_by_pod, pod_with_claims,
};
use devicelet_dra::{
    ClaimSource, ClaimSourceError, DraPluginRegistry, FixedBootId, InMemoryClaimSource,
};
use devicelet_node::{ClaimOrigin, DraNode};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};

const GPU: &str = "gpu.example.com";

/// The API server as the node sees it: GETs only; a status update fails the test.
#[derive(Default)]
struct FakeApi {
    claims: InMemoryClaimSource,
    gets: AtomicUsize,
    updates: AtomicUsize,
    /// GETs of these claims wait until the gate opens.
    gates: std::sync::Mutex<std::collections::BTreeMap<String, Arc<tokio::sync::Notify>>>,
    /// GETs of these claims are refused with 403 (the Node authorizer has not linked them).
    forbidden: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl ClaimSource for FakeApi {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if self.forbidden.lock().expect("lock").contains(name) {
            let reason = format!(
                "resourceclaims \"{name}\" is forbidden: no relationship found between node and this object"
            );
            return futures::future::ready(Err(ClaimSourceError::Forbidden(reason))).boxed();
        }
        let gate = self.gates.lock().expect("lock").get(name).cloned();
        let get = self.claims.get_claim(namespace, name);
        async move {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            get.await
        }
        .boxed()
    }

    fn update_status(
        &self,
        _namespace: &str,
        _name: &str,
        _status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        self.updates.fetch_add(1, Ordering::SeqCst);
        futures::future::ready(Err(ClaimSourceError::Other("no writes".to_owned()))).boxed()
    }
}

struct Env {
    dir: tempfile::TempDir,
    api: Arc<FakeApi>,
    gpu: FakeDraDriver,
    node: Arc<DraNode>,
}

fn env() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let dialer = FakeDialer::new();
    let gpu = FakeDraDriver::new(GPU);
    dialer.add(&gpu);
    let registry = DraPluginRegistry::with_call_timeout(Arc::new(dialer), Duration::from_secs(2));
    registry
        .register(
            GPU,
            Path::new("/plugins/gpu/dra.sock"),
            &["v1.DRAPlugin".to_owned()],
        )
        .expect("register gpu");
    let api = Arc::new(FakeApi::default());
    let node = DraNode::open(
        dir.path(),
        "node-a",
        registry,
        &FixedBootId("boot-1".to_owned()),
        Duration::from_secs(30),
        ClaimOrigin::Api(api.clone()),
    )
    .expect("open DRA node");
    Env {
        dir,
        api,
        gpu,
        node,
    }
}

#[tokio::test]
async fn allocated_reserved_claim_is_prepared_without_writes() {
    let e = env();
    e.api
        .claims
        .insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-1"]));
    let pod = pod_with_claims("ns", "p1", "pod-1", &["c1"]);
    e.node.admit(&pod).await.expect("admitted");
    assert_eq!(e.gpu.prepared(), vec!["uid-c1".to_owned()]);
    assert_eq!(e.api.gets.load(Ordering::SeqCst), 1, "one GET per claim");
    assert_eq!(e.api.updates.load(Ordering::SeqCst), 0, "no status writes");
    assert!(e.node.has_pod("pod-1"));
    assert_eq!(
        e.node.container_cdi_devices("pod-1", "ctr").expect("cdi"),
        vec![e.gpu.cdi_id("uid-c1")]
    );
    // Unprepare from the checkpoint only: the claim is gone from the API already.
    e.api.claims.remove("ns", "c1");
    let gets = e.api.gets.load(Ordering::SeqCst);
    e.node.remove("pod-1").await.expect("removed");
    assert!(e.gpu.prepared().is_empty());
    assert_eq!(
        e.api.gets.load(Ordering::SeqCst),
        gets,
        "no API call on remove"
    );
    assert!(!e.node.has_pod("pod-1"));
}

#[tokio::test]
async fn unallocated_claim_is_refused() {
    let e = env();
    let mut claim = allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-1"]);
    if let Some(s) = claim.status.as_mut() {
        s.allocation = None;
    }
    e.api.claims.insert(claim);
    let pod = pod_with_claims("ns", "p1", "pod-1", &["c1"]);
    let err = e.node.admit(&pod).await.expect_err("refused");
    assert!(err.to_string().contains("not allocated"), "{err}");
    assert!(e.gpu.prepared().is_empty());
    assert_eq!(
        e.api.updates.load(Ordering::SeqCst),
        0,
        "never allocated here"
    );
    assert!(
        !e.node.has_pod("pod-1"),
        "nothing recorded for a refused pod"
    );
}

#[tokio::test]
async fn claim_not_reserved_for_the_pod_is_refused() {
    let e = env();
    e.api.claims.insert(allocated_claim(
        "ns",
        "c1",
        "uid-c1",
        &[GPU],
        &["other-pod"],
    ));
    let pod = pod_with_claims("ns", "p1", "pod-1", &["c1"]);
    let err = e.node.admit(&pod).await.expect_err("refused");
    assert!(
        err.to_string()
            .contains("is not allowed to use ResourceClaim c1"),
        "{err}"
    );
    assert!(e.gpu.prepared().is_empty());
    assert_eq!(
        e.api.updates.load(Ordering::SeqCst),
        0,
        "never reserved here"
    );
}

#[tokio::test]
async fn replaced_claim_is_refused_and_not_prepared() {
    let e = env();
    e.api.claims.insert(allocated_claim(
        "ns",
        "shared",
        "uid-old",
        &[GPU],
        &["pod-1", "pod-2"],
    ));
    let pod1 = pod_with_claims("ns", "p1", "pod-1", &["shared"]);
    e.node.admit(&pod1).await.expect("first pod admitted");
    // Deleted and recreated with the same name: another UID.
    e.api.claims.insert(allocated_claim(
        "ns",
        "shared",
        "uid-new",
        &[GPU],
        &["pod-1", "pod-2"],
    ));
    let pod2 = pod_with_claims("ns", "p2", "pod-2", &["shared"]);
    let err = e.node.admit(&pod2).await.expect_err("refused");
    assert!(err.to_string().contains("different UID uid-old"), "{err}");
    assert_eq!(e.gpu.prepared(), vec!["uid-old".to_owned()]);
    assert_eq!(
        e.gpu.count("prepare"),
        1,
        "the new claim never reached the driver"
    );
    assert!(!e.node.has_pod("pod-2"));
    assert!(e.node.has_pod("pod-1"), "the first pod keeps its claim");
}

#[tokio::test]
async fn shared_claim_is_prepared_once() {
    let e = env();
    e.api.claims.insert(allocated_claim(
        "ns",
        "shared",
        "uid-s",
        &[GPU],
        &["pod-1", "pod-2"],
    ));
    for (name, uid) in [("p1", "pod-1"), ("p2", "pod-2")] {
        let pod = pod_with_claims("ns", name, uid, &["shared"]);
        e.node.admit(&pod).await.expect("admitted");
    }
    assert_eq!(e.gpu.count("prepare"), 1);
    e.node.remove("pod-1").await.expect("removed");
    assert_eq!(e.gpu.count("unprepare"), 0, "still used by pod-2");
    e.node.remove("pod-2").await.expect("removed");
    assert_eq!(e.gpu.count("unprepare"), 1);
}

#[tokio::test]
async fn template_claim_is_resolved_through_pod_status() {
    let e = env();
    let mut pod = pod_with_claims("ns", "p1", "pod-1", &[]);
    add_template_claim(&mut pod, "gpu", "gpu-template", Some("p1-gpu-x7k2q"));
    let claim = allocated_claim("ns", "p1-gpu-x7k2q", "uid-t", &[GPU], &["pod-1"]);
    e.api.claims.insert(owned_by_pod(claim, "p1", "pod-1"));
    let admitted = e.node.admit(&pod).await.expect("admitted").expect("pod");
    assert_eq!(e.gpu.prepared(), vec!["uid-t".to_owned()]);
    assert_eq!(e.api.gets.load(Ordering::SeqCst), 1);
    assert_eq!(e.api.claims.list().len(), 1, "no claim created by the node");
    assert_eq!(admitted.metadata.uid.as_deref(), Some("pod-1"));
}

#[tokio::test]
async fn template_claim_not_created_yet_is_refused() {
    let e = env();
    let mut pod = pod_with_claims("ns", "p1", "pod-1", &[]);
    add_template_claim(&mut pod, "gpu", "gpu-template", None);
    // No status entry at all: kube-controller-manager has not created the claim.
    if let Some(status) = pod.status.as_mut() {
        status.resource_claim_statuses = None;
    }
    let err = e.node.admit(&pod).await.expect_err("refused");
    assert!(
        err.to_string().contains("ResourceClaim not created yet"),
        "{err}"
    );
    assert_eq!(e.api.gets.load(Ordering::SeqCst), 0);
    assert!(
        e.api.claims.list().is_empty(),
        "no claim created by the node"
    );
    assert!(!e.node.has_pod("pod-1"));
}

#[tokio::test]
async fn apply_is_refused_in_cluster_mode() {
    let e = env();
    let doc = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {}
    });
    let err = e.node.apply(vec![doc]).expect_err("refused");
    assert!(err.to_string().contains("cluster mode"), "{err}");
}

#[tokio::test]
async fn claims_are_prepared_again_after_a_reboot() {
    let e = env();
    e.api
        .claims
        .insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-1"]));
    let pod = pod_with_claims("ns", "p1", "pod-1", &["c1"]);
    e.node.admit(&pod).await.expect("admitted");
    assert_eq!(
        e.node.prepare_again().await,
        0,
        "nothing to do on the same boot"
    );
    assert_eq!(e.gpu.count("prepare"), 1);

    // Same root, new boot ID: the driver lost its state; the pod is not admitted again by
    // anyone, so the node prepares its claims once more.
    e.gpu.wipe();
    let dialer = FakeDialer::new();
    dialer.add(&e.gpu);
    let registry = DraPluginRegistry::with_call_timeout(Arc::new(dialer), Duration::from_secs(2));
    let rebooted = DraNode::open(
        e.dir.path(),
        "node-a",
        registry.clone(),
        &FixedBootId("boot-2".to_owned()),
        Duration::from_secs(30),
        ClaimOrigin::Api(e.api.clone()),
    )
    .expect("reopen");
    // The driver has not registered again yet: the pod waits.
    assert_eq!(rebooted.prepare_again().await, 1);
    assert!(e.gpu.prepared().is_empty());
    registry
        .register(
            GPU,
            Path::new("/plugins/gpu/dra.sock"),
            &["v1.DRAPlugin".to_owned()],
        )
        .expect("register gpu");
    assert_eq!(rebooted.prepare_again().await, 0);
    assert_eq!(e.gpu.prepared(), vec!["uid-c1".to_owned()]);
    assert_eq!(rebooted.prepare_again().await, 0, "once");
    assert_eq!(e.gpu.count("prepare"), 2);
}

/// A7 row 48 (force delete: a device prepared for a new claim before the old one was
/// unprepared). A pod whose driver was away when it was deleted leaves its claim waiting to be
/// unprepared; the control plane may give the claim's device to another claim at once, so the
/// waiting unprepare reaches the driver before the next prepare on the node.
#[tokio::test]
async fn a7_48_a_waiting_unprepare_reaches_the_driver_before_the_next_prepare() {
    let e = env();
    e.api
        .claims
        .insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-1"]));
    e.node
        .admit(&pod_with_claims("ns", "p1", "pod-1", &["c1"]))
        .await
        .expect("first pod admitted");
    e.gpu.set_mode(devicelet_dra::fake::FakeMode::Unavailable);
    e.node.remove("pod-1").await.expect_err("driver away");
    assert_eq!(e.node.pending_unprepare(), ["pod-1"]);

    e.gpu.set_mode(devicelet_dra::fake::FakeMode::Ok);
    e.api
        .claims
        .insert(allocated_claim("ns", "c2", "uid-c2", &[GPU], &["pod-2"]));
    e.node
        .admit(&pod_with_claims("ns", "p2", "pod-2", &["c2"]))
        .await
        .expect("second pod admitted");
    let order: Vec<(&str, String)> = e
        .gpu
        .calls()
        .into_iter()
        .skip(1) // the first prepare
        .filter(|c| !c.claims.is_empty())
        .map(|c| (c.method, c.claims[0].uid.clone()))
        .collect();
    // The failed attempt while the driver was away is not recorded by the fake.
    let unprepare = order
        .iter()
        .position(|(m, u)| *m == "unprepare" && u == "uid-c1");
    let prepare = order
        .iter()
        .position(|(m, u)| *m == "prepare" && u == "uid-c2");
    assert!(
        matches!((unprepare, prepare), (Some(u), Some(p)) if u < p),
        "calls after the first prepare: {order:?}"
    );
    assert!(e.node.pending_unprepare().is_empty());
    assert_eq!(e.gpu.prepared(), ["uid-c2".to_owned()]);
}

#[tokio::test]
async fn a_pod_whose_claim_read_is_slow_holds_up_no_other_pod() {
    let e = env();
    e.api.claims.insert(allocated_claim(
        "ns",
        "slow",
        "uid-slow",
        &[GPU],
        &["pod-1"],
    ));
    e.api.claims.insert(allocated_claim(
        "ns",
        "fast",
        "uid-fast",
        &[GPU],
        &["pod-2"],
    ));
    let gate = Arc::new(tokio::sync::Notify::new());
    e.api
        .gates
        .lock()
        .expect("lock")
        .insert("slow".into(), gate.clone());
    let node = e.node.clone();
    let slow = tokio::spawn(async move {
        node.admit(&pod_with_claims("ns", "p1", "pod-1", &["slow"]))
            .await
    });
    // The slow pod is inside its claim GET; the other pod is prepared meanwhile.
    while e.api.gets.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(
        Duration::from_secs(5),
        e.node
            .admit(&pod_with_claims("ns", "p2", "pod-2", &["fast"])),
    )
    .await
    .expect("not serialised behind the slow pod")
    .expect("admitted");
    assert_eq!(e.gpu.prepared(), vec!["uid-fast".to_owned()]);
    gate.notify_one();
    slow.await.expect("task").expect("slow pod admitted");
    let mut prepared = e.gpu.prepared();
    prepared.sort();
    assert_eq!(prepared, ["uid-fast", "uid-slow"]);
}

#[tokio::test]
async fn a_claim_the_node_authorizer_has_not_linked_yet_is_said_to_be_so() {
    let e = env();
    e.api
        .claims
        .insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-1"]));
    e.api.forbidden.lock().expect("lock").insert("c1".into());
    let pod = pod_with_claims("ns", "p1", "pod-1", &["c1"]);
    let err = e.node.admit(&pod).await.expect_err("forbidden");
    let devicelet_node::DraNodeError::Dra(dra) = &err else {
        panic!("{err}");
    };
    assert!(dra.is_claim_not_linked_yet(), "{err}");
    assert!(!e.node.has_pod("pod-1"), "nothing recorded");
    // Linked: the next try works.
    e.api.forbidden.lock().expect("lock").clear();
    e.node.admit(&pod).await.expect("admitted");
    assert_eq!(e.gpu.prepared(), vec!["uid-c1".to_owned()]);
}
