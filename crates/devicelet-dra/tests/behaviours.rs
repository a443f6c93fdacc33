//! Behaviour tests of the claim cache and registry, named after the numbered behaviours of
//! spec dra-kubelet.md §1 / §2 (B#) and §6 (E#), with fake drivers and real files in temp dirs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use devicelet_checkpoint::dra as ckpt;
use devicelet_dra::fake::{
    FakeDialer, FakeDraDriver, FakeMode, add_template_claim, allocated_claim, owned_by_pod,
    pod_with_claims,
};
use devicelet_dra::{
    ClaimCache, DraError, DraPluginRegistry, DraService, FixedBootId, InMemoryClaimSource,
};

const GPU: &str = "gpu.example.com";
const NIC: &str = "nic.example.com";

struct Env {
    dir: tempfile::TempDir,
    registry: DraPluginRegistry,
    gpu: FakeDraDriver,
    nic: FakeDraDriver,
    source: InMemoryClaimSource,
}

fn v1() -> Vec<String> {
    vec!["v1.DRAPlugin".to_owned()]
}

impl Env {
    fn new() -> Self {
        let dialer = FakeDialer::new();
        let gpu = FakeDraDriver::new(GPU);
        let nic = FakeDraDriver::new(NIC);
        dialer.add(&gpu);
        dialer.add(&nic);
        let registry =
            DraPluginRegistry::with_call_timeout(Arc::new(dialer.clone()), Duration::from_secs(2));
        registry
            .register(GPU, Path::new("/plugins/gpu/dra.sock"), &v1())
            .expect("register gpu");
        registry
            .register(NIC, Path::new("/plugins/nic/dra.sock"), &v1())
            .expect("register nic");
        Env {
            dir: tempfile::tempdir().expect("tempdir"),

            registry,
            gpu,
            nic,
            source: InMemoryClaimSource::new(),
        }
    }

    fn open(&self, boot: &str) -> ClaimCache {
        ClaimCache::open(
            self.dir.path(),
            self.registry.clone(),
            &FixedBootId(boot.to_owned()),
        )
        .expect("open claim cache")
    }

    fn checkpoint(&self) -> ckpt::DraCheckpoint {
        let bytes =
            std::fs::read(self.dir.path().join("dra_manager_state")).expect("read checkpoint");
        ckpt::decode(&bytes).expect("checkpoint verifies")
    }

    fn checkpoint_pods(&self, claim: &str) -> Vec<String> {
        self.checkpoint()
            .claims
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.claim_name == claim)
            .map(|c| c.pod_uids.unwrap_or_default().into_iter().collect())
            .unwrap_or_default()
    }
}

#[tokio::test]
async fn b4_one_batched_prepare_per_driver_and_cdi_ids_for_the_container() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-a"]));
    env.source.insert(allocated_claim(
        "ns",
        "c2",
        "uid-c2",
        &[GPU, NIC],
        &["pod-a"],
    ));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c1", "c2"]);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare");
    let gpu_calls = env.gpu.calls();
    assert_eq!(gpu_calls.len(), 1, "one batched call to gpu: {gpu_calls:?}");
    assert_eq!(gpu_calls[0].claims.len(), 2);
    assert_eq!(env.nic.count("prepare"), 1);
    assert_eq!(env.nic.calls()[0].claims.len(), 1);
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    let ids = cache
        .container_cdi_devices(&pod, container)
        .expect("cdi devices");
    assert_eq!(
        ids,
        vec![
            env.gpu.cdi_id("uid-c1"),
            env.gpu.cdi_id("uid-c2"),
            env.nic.cdi_id("uid-c2")
        ]
    );
    // B5: durable before success: the file on disk holds the devices and verifies its CRC.
    let cp = env.checkpoint();
    let claims = cp.claims.expect("claims list");
    assert_eq!(claims.len(), 2);
    let c2 = claims
        .iter()
        .find(|c| c.claim_name == "c2")
        .expect("c2 stored");
    let drivers = c2.driver_state.as_ref().expect("drivers");
    assert_eq!(drivers.len(), 2);
    assert_eq!(
        drivers[NIC].devices.as_ref().expect("devices")[0]
            .cdi_device_ids
            .as_deref(),
        Some(&[env.nic.cdi_id("uid-c2")][..])
    );
    assert_eq!(cache.claims_in_use()["<any>"], 2);
}

#[tokio::test]
async fn b6_two_pods_share_a_claim_one_removed_no_unprepare_until_the_last() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source.insert(allocated_claim(
        "ns",
        "shared",
        "uid-s",
        &[GPU],
        &["pod-a", "pod-b"],
    ));
    let a = pod_with_claims("ns", "a", "pod-a", &["shared"]);
    let b = pod_with_claims("ns", "b", "pod-b", &["shared"]);
    cache.prepare_resources(&a, &env.source).await.expect("a");
    cache.prepare_resources(&b, &env.source).await.expect("b");
    assert_eq!(env.gpu.count("prepare"), 1, "prepared once for both pods");
    let mut pods = env.checkpoint_pods("shared");
    pods.sort();
    assert_eq!(pods, vec!["pod-a", "pod-b"]);

    cache.unprepare_resources("pod-a").await.expect("remove a");
    assert_eq!(env.gpu.count("unprepare"), 0, "b still uses the claim");
    assert_eq!(env.gpu.prepared(), vec!["uid-s"]);
    // E11 fixed: the dropped reference is durable at once.
    assert_eq!(env.checkpoint_pods("shared"), vec!["pod-b"]);
    assert!(!cache.pod_might_need_to_unprepare("pod-a"));
    assert!(cache.pod_might_need_to_unprepare("pod-b"));

    cache.unprepare_resources("pod-b").await.expect("remove b");
    assert_eq!(env.gpu.count("unprepare"), 1);
    assert!(env.gpu.prepared().is_empty());
    assert_eq!(env.checkpoint().claims.expect("list").len(), 0);
}

#[tokio::test]
async fn b10_pod_force_deleted_while_its_claim_is_gone_unprepares_from_cache() {
    let env = Env::new();
    {
        let cache = env.open("boot-1");
        env.source
            .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
        let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
        cache
            .prepare_resources(&pod, &env.source)
            .await
            .expect("prepare");
    }
    // The claim is deleted from the API and devicelet restarts; the pod object is gone too.
    env.source.remove("ns", "c").expect("claim existed");
    let cache = env.open("boot-1");
    let orphans = cache.orphaned_pods(&HashSet::new());
    assert_eq!(orphans, vec!["pod-a"]);
    let results = cache.reconcile_orphans(&HashSet::new()).await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let call = env
        .gpu
        .calls()
        .into_iter()
        .find(|c| c.method == "unprepare")
        .expect("unprepare sent");
    assert_eq!(call.claims[0].uid, "uid-c");
    assert_eq!(call.claims[0].name, "c");
    assert_eq!(call.claims[0].namespace, "ns");
    assert!(env.gpu.prepared().is_empty());
    assert!(!cache.pod_might_need_to_unprepare("pod-a"));
}

#[tokio::test]
async fn b8_restart_between_prepare_and_start_reloads_state_from_checkpoint() {
    let env = Env::new();
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    {
        let cache = env.open("boot-1");
        cache
            .prepare_resources(&pod, &env.source)
            .await
            .expect("prepare");
    }
    // devicelet restarts (same boot) before the container starts.
    let cache = env.open("boot-1");
    assert!(!cache.rebooted());
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    assert_eq!(
        cache.container_cdi_devices(&pod, container).expect("cdi"),
        vec![env.gpu.cdi_id("uid-c")]
    );
    assert!(cache.pod_might_need_to_unprepare("pod-a"));
    // Same boot: the driver still holds the preparation, no second RPC (E5 fixed).
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("again");
    assert_eq!(env.gpu.count("prepare"), 1);
    assert_eq!(cache.claims_in_use()[GPU], 1);
}

#[tokio::test]
async fn b8_reboot_boot_id_change_prepares_again_without_duplicating_devices() {
    let env = Env::new();
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    {
        let cache = env.open("boot-1");
        cache
            .prepare_resources(&pod, &env.source)
            .await
            .expect("prepare");
    }
    env.gpu.wipe(); // tmpfs CDI specs and driver state are gone after the reboot
    let cache = env.open("boot-2");
    assert!(cache.rebooted());
    assert_eq!(cache.claims_in_use()["<any>"], 0);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("re-prepare");
    assert_eq!(env.gpu.count("prepare"), 2);
    assert_eq!(env.gpu.prepared(), vec!["uid-c"]);
    // E1 fixed: the re-prepare replaced the device list.
    let c = cache.get("ns", "c").expect("cached");
    assert_eq!(c.drivers[GPU].len(), 1);
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    assert_eq!(
        cache.container_cdi_devices(&pod, container).expect("cdi"),
        vec![env.gpu.cdi_id("uid-c")]
    );
}

#[tokio::test]
async fn b4_driver_restart_mid_prepare_surfaces_error_then_retry_succeeds() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    env.gpu.set_mode(FakeMode::Unavailable);
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("driver away");
    assert!(err.is_driver_unavailable(), "{err}");
    assert!(
        err.to_string().starts_with("NodePrepareResources: "),
        "{err}"
    );
    // B7: the pod reference was durable before the RPC, so termination will unprepare.
    assert_eq!(env.checkpoint_pods("c"), vec!["pod-a"]);
    assert!(!cache.get("ns", "c").expect("entry").prepared);
    env.gpu.set_mode(FakeMode::Ok);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("retry");
    assert!(cache.get("ns", "c").expect("entry").prepared);
    assert_eq!(env.gpu.count("prepare"), 2);
}

#[tokio::test]
async fn b4_per_claim_error_and_skipped_claims_fail_the_prepare() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    env.gpu
        .set_mode(FakeMode::ClaimError("no GPU left".to_owned()));
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("claim error");
    assert_eq!(
        err.to_string(),
        "NodePrepareResources failed for ResourceClaim c: no GPU left"
    );
    env.gpu.set_mode(FakeMode::Skip);
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("skipped");
    assert_eq!(
        err.to_string(),
        "NodePrepareResources skipped 1 ResourceClaims"
    );
}

#[tokio::test]
async fn b9_driver_gone_at_unprepare_is_retried_until_it_returns() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare");
    let endpoint = PathBuf::from("/plugins/gpu/dra.sock");
    env.registry.deregister(GPU, &endpoint);
    let err = cache
        .unprepare_resources("pod-a")
        .await
        .expect_err("driver gone");
    assert!(matches!(err, DraError::NotRegistered(_)), "{err}");
    // The pod is removed from the pod list; the obligation is still recorded.
    assert!(cache.pod_might_need_to_unprepare("pod-a"));
    assert_eq!(env.checkpoint_pods("c"), vec!["pod-a"]);
    let failed = cache.reconcile_orphans(&HashSet::new()).await;
    assert!(failed[0].1.is_err());
    // Driver comes back (new instance, new socket).
    env.registry
        .register(GPU, Path::new("/plugins/gpu/dra-2.sock"), &v1())
        .expect("re-register");
    let done = cache.reconcile_orphans(&HashSet::new()).await;
    assert_eq!(done.len(), 1);
    assert!(done[0].1.is_ok(), "{:?}", done[0].1);
    assert!(env.gpu.prepared().is_empty());
    assert!(!cache.pod_might_need_to_unprepare("pod-a"));
    let last = env.gpu.calls().pop().expect("call");
    assert_eq!(last.endpoint, PathBuf::from("/plugins/gpu/dra-2.sock"));
}

#[tokio::test]
async fn e4_same_claim_listed_twice_in_one_pod_is_sent_once() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let mut pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    // A second pod claim entry naming the same ResourceClaim.
    pod.spec
        .as_mut()
        .expect("spec")
        .resource_claims
        .as_mut()
        .expect("claims")
        .push(k8s_openapi::api::core::v1::PodResourceClaim {
            name: "again".to_owned(),
            resource_claim_name: Some("c".to_owned()),
            resource_claim_template_name: None,
        });
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare");
    let calls = env.gpu.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].claims.len(), 1, "de-duplicated: {calls:?}");
}

#[tokio::test]
async fn e2_unprepare_of_a_pod_that_never_joined_leaves_the_shared_claim_alone() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let a = pod_with_claims("ns", "a", "pod-a", &["c"]);
    let b = pod_with_claims("ns", "b", "pod-b", &["c"]);
    cache.prepare_resources(&a, &env.source).await.expect("a");
    // b is not reserved: validation fails, nothing recorded for it (B2/E6).
    let err = cache
        .prepare_resources(&b, &env.source)
        .await
        .expect_err("b invalid");
    assert!(matches!(err, DraError::NotReserved { .. }), "{err}");
    assert!(!cache.pod_might_need_to_unprepare("pod-b"));
    cache.unprepare_resources("pod-b").await.expect("no-op");
    assert_eq!(env.gpu.count("unprepare"), 0);
    assert_eq!(env.gpu.prepared(), vec!["uid-c"]);
}

#[tokio::test]
async fn e3_prepare_and_unprepare_of_one_claim_never_interleave() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source.insert(allocated_claim(
        "ns",
        "c",
        "uid-c",
        &[GPU],
        &["pod-a", "pod-b"],
    ));
    let a = pod_with_claims("ns", "a", "pod-a", &["c"]);
    let b = pod_with_claims("ns", "b", "pod-b", &["c"]);
    cache.prepare_resources(&a, &env.source).await.expect("a");
    env.gpu.set_delay(Duration::from_millis(200));
    let c1 = cache.clone();
    let unprepare = tokio::spawn(async move { c1.unprepare_resources("pod-a").await });
    tokio::time::sleep(Duration::from_millis(50)).await; // unprepare RPC in flight
    cache.prepare_resources(&b, &env.source).await.expect("b");
    unprepare.await.expect("join").expect("unprepare a");
    // Upstream bug: b would have joined the claim being torn down without any RPC and run
    // with an unprepared device. Here b waited and prepared again.
    let methods: Vec<_> = env.gpu.calls().iter().map(|c| c.method).collect();
    assert_eq!(methods, vec!["prepare", "unprepare", "prepare"]);
    assert_eq!(env.gpu.prepared(), vec!["uid-c"]);
    assert!(cache.get("ns", "c").expect("entry").prepared);
}

#[tokio::test]
async fn b3_claim_uid_mismatch_is_refused_and_records_nothing() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-old", &[GPU], &["pod-a"]));
    let a = pod_with_claims("ns", "a", "pod-a", &["c"]);
    cache.prepare_resources(&a, &env.source).await.expect("a");
    // The claim is force-deleted and re-created under the same name for pod b.
    env.source
        .insert(allocated_claim("ns", "c", "uid-new", &[GPU], &["pod-b"]));
    let b = pod_with_claims("ns", "b", "pod-b", &["c"]);
    let err = cache
        .prepare_resources(&b, &env.source)
        .await
        .expect_err("mismatch");
    assert!(matches!(err, DraError::UidMismatch { .. }), "{err}");
    assert!(!cache.pod_might_need_to_unprepare("pod-b"));
}

#[tokio::test]
async fn b2_validation_failures_record_nothing() {
    let env = Env::new();
    let cache = env.open("boot-1");
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("missing");
    assert!(
        err.to_string().starts_with("fetch ResourceClaim c: "),
        "{err}"
    );
    let mut unallocated = allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]);
    if let Some(s) = unallocated.status.as_mut() {
        s.allocation = None;
    }
    env.source.insert(unallocated);
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("unallocated");
    assert_eq!(err.to_string(), "ResourceClaim c: not allocated");
    env.source.insert(allocated_claim(
        "ns",
        "c",
        "uid-c",
        &["absent.example.com"],
        &["pod-a"],
    ));
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("no driver");
    assert_eq!(
        err.to_string(),
        "DRA driver absent.example.com is not registered"
    );
    assert!(!cache.pod_might_need_to_unprepare("pod-a"));
    assert!(cache.claims().is_empty());
}

#[tokio::test]
async fn b1_template_claims_resolve_through_pod_status_and_need_the_pod_as_owner() {
    let env = Env::new();
    let cache = env.open("boot-1");
    let mut pod = pod_with_claims("ns", "a", "pod-a", &[]);
    add_template_claim(&mut pod, "gpu", "gpu-template", Some("a-gpu-x7k2p"));
    add_template_claim(&mut pod, "skipped", "other", None);
    let claim = allocated_claim("ns", "a-gpu-x7k2p", "uid-t", &[GPU], &["pod-a"]);
    env.source.insert(claim.clone());
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("not owner");
    assert!(matches!(err, DraError::NotOwner { .. }), "{err}");
    env.source.insert(owned_by_pod(claim, "a", "pod-a"));
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare");
    assert_eq!(env.gpu.calls()[0].claims[0].name, "a-gpu-x7k2p");
    // No status entry at all: "not created yet".
    let mut early = pod_with_claims("ns", "b", "pod-b", &[]);
    early
        .spec
        .as_mut()
        .expect("spec")
        .resource_claims
        .get_or_insert_with(Vec::new)
        .push(k8s_openapi::api::core::v1::PodResourceClaim {
            name: "gpu".to_owned(),
            resource_claim_name: None,
            resource_claim_template_name: Some("t".to_owned()),
        });
    let err = cache
        .prepare_resources(&early, &env.source)
        .await
        .expect_err("not created");
    assert_eq!(
        err.to_string(),
        "pod \"ns/b\": ResourceClaim not created yet"
    );
}

#[tokio::test]
async fn w47_w50_a_pod_group_claim_serves_every_member_of_that_group_only() {
    use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let env = Env::new();
    let cache = env.open("boot-1");
    // The resourceclaim controller made the claim for PodGroup "train" (its controller owner)
    // and the scheduler reserved it for the PodGroup, not for a pod.
    let mut claim = allocated_claim("ns", "train-gpu-x", "uid-g", &[GPU], &[]);
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "scheduling.k8s.io/v1alpha2".into(),
        kind: "PodGroup".into(),
        name: "train".into(),
        uid: "uid-train".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    if let Some(status) = claim.status.as_mut() {
        status.reserved_for = Some(vec![ResourceClaimConsumerReference {
            api_group: Some("scheduling.k8s.io".into()),
            resource: "podgroups".into(),
            name: "train".into(),
            uid: "uid-train".into(),
        }]);
    }
    env.source.insert(claim);
    let member = |name: &str, uid: &str, group: &str| {
        let mut pod = pod_with_claims("ns", name, uid, &[]);
        add_template_claim(&mut pod, "gpu", "gpu-template", Some("train-gpu-x"));
        pod.spec.as_mut().expect("spec").scheduling_group =
            Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
                pod_group_name: Some(group.into()),
            });
        pod
    };
    for (name, uid) in [("m0", "pod-m0"), ("m1", "pod-m1")] {
        cache
            .prepare_resources(&member(name, uid, "train"), &env.source)
            .await
            .expect("a member of the group");
    }
    assert_eq!(env.gpu.calls().len(), 1, "one prepare for the shared claim");
    // A pod of another group is neither owner nor reserved.
    let err = cache
        .prepare_resources(&member("x", "pod-x", "other"), &env.source)
        .await
        .expect_err("another group");
    assert!(matches!(err, DraError::NotOwner { .. }), "{err}");
}

#[tokio::test]
async fn s3_corrupt_checkpoint_is_moved_aside_and_prepare_refused_until_recovery() {
    let env = Env::new();
    let path = env.dir.path().join("dra_manager_state");
    // A valid file with one flipped byte inside Data: CRC mismatch.
    let good = ckpt::encode(Some(&[ckpt::ClaimInfoState {
        claim_uid: "uid-c".to_owned(),
        claim_name: "c".to_owned(),
        namespace: "ns".to_owned(),
        pod_uids: Some(["pod-a".to_owned()].into()),
        driver_state: None,
    }]));
    let text = String::from_utf8(good)
        .expect("utf8")
        .replace("pod-a", "pod-b");
    std::fs::write(&path, &text).expect("write corrupt");
    let cache = env.open("boot-1");
    assert!(cache.quarantined());
    assert!(!path.exists(), "bad file moved away, no fresh file written");
    let aside: Vec<_> = std::fs::read_dir(env.dir.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dra_manager_state.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join(&aside[0])).expect("read aside"),
        text,
        "kept byte for byte"
    );
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("refused");
    assert!(matches!(err, DraError::StateUnknown { .. }), "{err}");
    assert!(
        cache.pod_might_need_to_unprepare("anything"),
        "B19: hold terminal phases"
    );
    assert_eq!(env.gpu.count("prepare"), 0);
    drop(cache);
    // A restart does not forget the quarantine.
    assert!(env.open("boot-1").quarantined());
    assert!(ClaimCache::recover(env.dir.path()).expect("recover"));
    let cache = env.open("boot-1");
    assert!(!cache.quarantined());
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare after recovery");
    assert_eq!(aside.len(), 1);
}

#[tokio::test]
async fn s3_checkpoint_is_the_kubelet_format_and_loads_kubelet_written_files() {
    let env = Env::new();
    // A file exactly as the kubelet writes it (spec §3.1 example, checksum 2570581864).
    let data = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","ClaimInfoStateList":[{"ClaimUID":"067798be-454e-4be4-9047-1aa06aea63f7","ClaimName":"example","Namespace":"default","PodUIDs":{"139cdb46-f989-4f17-9561-ca10cfb509a6":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":[{"PoolName":"worker-1","DeviceName":"dev-1","ShareID":null,"RequestNames":["test request"],"CDIDeviceIDs":["example.com/example=cdi-example"]}]}}}]}"#;
    let file = format!(
        "{{\"Data\":{},\"Checksum\":2570581864}}",
        serde_json_string(data)
    );
    std::fs::write(env.dir.path().join("dra_manager_state"), file).expect("write");
    let cache = env.open("boot-1");
    assert!(!cache.quarantined());
    let c = cache.get("default", "example").expect("loaded");
    assert_eq!(
        c.drivers["test-driver.cdi.k8s.io"][0].cdi_device_ids,
        vec!["example.com/example=cdi-example"]
    );
    assert!(cache.pod_might_need_to_unprepare("139cdb46-f989-4f17-9561-ca10cfb509a6"));
    // Rewriting the same state gives the kubelet's bytes back (same checksum).
    let reencoded = ckpt::encode(Some(&[c_to_state(&c)]));
    assert!(
        String::from_utf8(reencoded)
            .expect("utf8")
            .ends_with("\"Checksum\":2570581864}")
    );
}

fn c_to_state(c: &devicelet_dra::CachedClaim) -> ckpt::ClaimInfoState {
    ckpt::ClaimInfoState {
        claim_uid: c.uid.clone(),
        claim_name: c.name.clone(),
        namespace: c.namespace.clone(),
        pod_uids: Some(c.pod_uids.clone()),
        driver_state: Some(
            c.drivers
                .iter()
                .map(|(d, devs)| {
                    (
                        d.clone(),
                        ckpt::DriverState {
                            devices: Some(
                                devs.iter()
                                    .map(|x| ckpt::DraDevice {
                                        pool_name: x.pool_name.clone(),
                                        device_name: x.device_name.clone(),
                                        share_id: x.share_id.clone(),
                                        request_names: Some(x.request_names.clone()),
                                        cdi_device_ids: Some(x.cdi_device_ids.clone()),
                                    })
                                    .collect(),
                            ),
                        },
                    )
                })
                .collect(),
        ),
    }
}

fn serde_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[test]
fn s1_8_service_choice_follows_the_plugins_list_order() {
    let r = |v: &[&str]| {
        devicelet_dra::choose_service(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    };
    assert_eq!(
        r(&["v1.DRAPlugin", "v1beta1.DRAPlugin"]),
        Ok(DraService::V1)
    );
    assert_eq!(
        r(&["v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin"]),
        Ok(DraService::V1Beta1)
    );
    // E12: the plugin's order wins.
    assert_eq!(
        r(&["v1beta1.DRAPlugin", "v1.DRAPlugin"]),
        Ok(DraService::V1Beta1)
    );
    assert!(
        r(&[])
            .expect_err("empty")
            .to_string()
            .contains("empty list of supported gRPC services")
    );
    assert!(
        r(&["1.0.0"])
            .expect_err("legacy")
            .to_string()
            .contains("none of services supported by the plugin")
    );
}

#[test]
fn s1_9_instances_newest_connected_wins_same_endpoint_rejected_deregister_idempotent() {
    let dialer = FakeDialer::new();
    let gpu = FakeDraDriver::new(GPU);
    dialer.add(&gpu);
    let reg = DraPluginRegistry::new(Arc::new(dialer.clone()));
    let old = Path::new("/p/dra-old.sock");
    let new = Path::new("/p/dra-new.sock");
    assert!(matches!(reg.get(""), Err(DraError::EmptyDriverName)));
    assert!(matches!(reg.get(GPU), Err(DraError::NotRegistered(_))));
    reg.register(GPU, old, &v1()).expect("old");
    let err = reg.register(GPU, old, &v1()).expect_err("same endpoint");
    assert_eq!(
        err.to_string(),
        format!(
            "endpoint {} already registered for DRA driver plugin {GPU}",
            old.display()
        )
    );
    reg.register(GPU, new, &["v1beta1.DRAPlugin".to_owned()])
        .expect("new");
    assert_eq!(reg.get(GPU).expect("get").endpoint, new);
    assert_eq!(reg.get(GPU).expect("get").service, DraService::V1Beta1);
    // Rolling update: the new instance is not connected yet → the old connected one serves.
    dialer.set_connected(new, false);
    assert_eq!(reg.get(GPU).expect("get").endpoint, old);
    // Nobody connected → newest.
    dialer.set_connected(old, false);
    assert_eq!(reg.get(GPU).expect("get").endpoint, new);
    reg.deregister(GPU, new);
    reg.deregister(GPU, new);
    assert_eq!(reg.get(GPU).expect("get").endpoint, old);
    reg.deregister(GPU, old);
    assert!(!reg.is_registered(GPU));
    assert_eq!(dialer.dials().len(), 2, "one connection per instance");
}

#[test]
fn template_claim_names_follow_the_resourceclaim_controller() {
    use devicelet_dra::pod::{template_claim_generate_name, template_claim_name};
    assert_eq!(template_claim_generate_name("web-0", "gpu"), "web-0-gpu-");
    let long_pod = "p".repeat(60);
    let g = template_claim_generate_name(&long_pod, "gpu-claim");
    assert!(g.len() <= 57, "{g}");
    assert!(g.contains("-gpu"), "both parts kept: {g}");
    let n = template_claim_name("web-0", "gpu", "uid-1");
    assert_eq!(n.len(), "web-0-gpu-".len() + 5);
    assert_eq!(
        n,
        template_claim_name("web-0", "gpu", "uid-1"),
        "repeatable"
    );
    assert_ne!(n, template_claim_name("web-0", "gpu", "uid-2"));
}

#[tokio::test]
async fn b5_prepare_is_not_reported_when_the_checkpoint_cannot_be_written() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    // A directory in place of the checkpoint: the atomic rename over it fails.
    let path = env.dir.path().join("dra_manager_state");
    std::fs::remove_file(&path).expect("rm");
    std::fs::create_dir(&path).expect("mkdir");
    std::fs::write(path.join("keep"), b"x").expect("non-empty dir");
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("not durable");
    assert!(matches!(err, DraError::CheckpointWrite { .. }), "{err}");
    // E10: the pod reference could not be made durable, so no driver was called.
    assert_eq!(env.gpu.count("prepare"), 0);
}

#[tokio::test]
async fn b13_container_gets_the_cdi_ids_of_its_requests_only() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let mut pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare");
    // The fake's device has no request names: it serves every request.
    let spec = pod.spec.as_mut().expect("spec");
    let mut other = spec.containers[0].clone();
    other.name = "other".to_owned();
    if let Some(claims) = other.resources.as_mut().and_then(|r| r.claims.as_mut()) {
        claims[0].request = Some("req".to_owned());
    }
    let mut none = spec.containers[0].clone();
    none.resources = None;
    spec.containers.push(other.clone());
    assert_eq!(
        cache.container_cdi_devices(&pod, &other).expect("cdi"),
        vec![env.gpu.cdi_id("uid-c")]
    );
    assert!(
        cache
            .container_cdi_devices(&pod, &none)
            .expect("cdi")
            .is_empty()
    );
    // Exact request match against devices that name their requests.
    let c = cache.get("ns", "c").expect("cached");
    let mut named = c.clone();
    for d in named.drivers.values_mut().flatten() {
        d.request_names = vec!["gpu".to_owned()];
    }
    assert_eq!(named.cdi_ids_for(Some("gpu")).count(), 1);
    assert_eq!(named.cdi_ids_for(Some("gpu/sub")).count(), 0);
    assert_eq!(named.cdi_ids_for(None).count(), 1);
    // Unknown claim in the cache fails container creation.
    cache.unprepare_resources("pod-a").await.expect("unprepare");
    assert!(matches!(
        cache.container_cdi_devices(&pod, &other),
        Err(DraError::NotCached { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b16_parallel_prepare_unprepare_of_30_pods_sharing_claims() {
    let env = Env::new();
    let cache = env.open("boot-1");
    let pods: Vec<String> = (0..30).map(|i| format!("pod-{i}")).collect();
    let refs: Vec<&str> = pods.iter().map(String::as_str).collect();
    for k in 0..5 {
        env.source.insert(allocated_claim(
            "ns",
            &format!("c{k}"),
            &format!("uid-{k}"),
            &[GPU, NIC],
            &refs,
        ));
    }
    env.gpu.set_delay(Duration::from_millis(2));
    let mut tasks = Vec::new();
    for (i, uid) in pods.iter().enumerate() {
        let cache = cache.clone();
        let source = env.source.clone();
        // Each pod uses two claims, in opposite orders for odd/even pods (lock ordering).
        let (a, b) = (format!("c{}", i % 5), format!("c{}", (i + 1) % 5));
        let names = if i % 2 == 0 { [a, b] } else { [b, a] };
        let pod = pod_with_claims("ns", &format!("p{i}"), uid, &[&names[0], &names[1]]);
        let uid = uid.clone();
        tasks.push(tokio::spawn(async move {
            cache.prepare_resources(&pod, &source).await?;
            cache.unprepare_resources(&uid).await
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("prepare+unprepare");
    }
    assert!(cache.claims().is_empty());
    assert!(
        env.gpu.prepared().is_empty(),
        "every prepare was matched by an unprepare"
    );
    assert!(env.nic.prepared().is_empty());
    assert_eq!(env.checkpoint().claims.expect("list").len(), 0);
    // Batches differ in size; per claim, every preparation was undone exactly once.
    let claims_in = |m: &str| -> usize {
        env.gpu
            .calls()
            .iter()
            .filter(|c| c.method == m)
            .map(|c| c.claims.len())
            .sum()
    };
    assert_eq!(claims_in("prepare"), claims_in("unprepare"));
}

#[tokio::test]
async fn b11_orphan_reconciler_unprepares_pods_that_left_the_active_list() {
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("prepare");
    let active = Arc::new(std::sync::Mutex::new(HashSet::from(["pod-a".to_owned()])));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let view = Arc::clone(&active);
    let task = tokio::spawn(cache.clone().run_orphan_reconciler(
        Duration::from_millis(20),
        move || view.lock().expect("lock").clone(),
        stopped,
    ));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(env.gpu.count("unprepare"), 0, "active pods are left alone");
    active.lock().expect("lock").clear();
    for _ in 0..100 {
        if !cache.pod_might_need_to_unprepare("pod-a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!cache.pod_might_need_to_unprepare("pod-a"));
    assert_eq!(env.gpu.count("unprepare"), 1);
    stop.send(true).expect("stop");
    task.await.expect("reconciler stops");
}

/// Value of one sample line (`name{labels}` exactly as rendered) in the text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn b15_metrics_operations_rpcs_with_grpc_code_and_claims_in_use_per_driver() {
    let env = Env::new();
    let cache = env.open("boot-1");
    let metrics = devicelet_metrics::Metrics::new();
    cache.set_metrics(metrics.clone());
    env.source
        .insert(allocated_claim("ns", "c1", "uid-c1", &[GPU], &["pod-a"]));
    env.source.insert(allocated_claim(
        "ns",
        "c2",
        "uid-c2",
        &[GPU, NIC],
        &["pod-a"],
    ));
    let pod = pod_with_claims("ns", "a", "pod-a", &["c1", "c2"]);
    env.nic.set_mode(FakeMode::Unavailable);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("nic away");
    let rpc = |driver: &str, method: &str, code: &str| {
        format!(
            "dra_grpc_operations_duration_seconds_count{{driver_name=\"{driver}\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}\",grpc_status_code=\"{code}\"}}"
        )
    };
    let op = |name: &str, err: bool| {
        format!(
            "dra_operations_duration_seconds_count{{operation_name=\"{name}\",is_error=\"{err}\"}}"
        )
    };
    let in_use = |driver: &str| format!("dra_resource_claims_in_use{{driver_name=\"{driver}\"}}");
    let text = metrics.encode();
    assert_eq!(
        sample(&text, &op("PrepareResources", true)),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &rpc(GPU, "NodePrepareResources", "OK")),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, &rpc(NIC, "NodePrepareResources", "Unavailable")),
        Some(1.0),
        "grpc-go code name: {text}"
    );
    // c1 (GPU only) was fully prepared by the failed call; c2 was not.
    assert_eq!(sample(&text, &in_use("<any>")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &in_use(GPU)), Some(1.0));
    assert_eq!(sample(&text, &in_use(NIC)), None);

    env.nic.set_mode(FakeMode::Ok);
    cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect("retry");
    let text = metrics.encode();
    assert_eq!(sample(&text, &op("PrepareResources", false)), Some(1.0));
    // A claim of two drivers counts once for `<any>` and once per driver.
    assert_eq!(sample(&text, &in_use("<any>")), Some(2.0), "{text}");
    assert_eq!(sample(&text, &in_use(GPU)), Some(2.0));
    assert_eq!(sample(&text, &in_use(NIC)), Some(1.0));

    cache.unprepare_resources("pod-a").await.expect("unprepare");
    let text = metrics.encode();
    assert_eq!(sample(&text, &op("UnprepareResources", false)), Some(1.0));
    assert_eq!(
        sample(&text, &rpc(GPU, "NodeUnprepareResources", "OK")),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, &rpc(NIC, "NodeUnprepareResources", "OK")),
        Some(1.0)
    );
    assert_eq!(sample(&text, &in_use("<any>")), Some(0.0), "{text}");
    assert_eq!(sample(&text, &in_use(GPU)), None);
}

#[tokio::test]
async fn b15_claims_restored_on_the_same_boot_count_as_in_use_when_metrics_attach() {
    let env = Env::new();
    {
        let cache = env.open("boot-1");
        env.source
            .insert(allocated_claim("ns", "c", "uid-c", &[GPU], &["pod-a"]));
        let pod = pod_with_claims("ns", "a", "pod-a", &["c"]);
        cache
            .prepare_resources(&pod, &env.source)
            .await
            .expect("prepare");
    }
    let cache = env.open("boot-1");
    let metrics = devicelet_metrics::Metrics::new();
    cache.set_metrics(metrics.clone());
    let text = metrics.encode();
    assert_eq!(
        sample(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test]
async fn a7_52_two_drivers_one_fails_the_other_prepared_then_pod_unprepare_frees_both() {
    // B7: the kubelet leaves what the good driver prepared in place (pod referenced, claim
    // not prepared) and relies on the pod's termination to unprepare it; k/k PR #137945
    // proposed rolling it back. DraNode::admit does that rollback by calling
    // unprepare_resources at once; here the cache-level part of it.
    let env = Env::new();
    let cache = env.open("boot-1");
    env.source
        .insert(allocated_claim("ns", "g", "uid-g", &[GPU], &["pod-a"]));
    env.source
        .insert(allocated_claim("ns", "n", "uid-n", &[NIC], &["pod-a"]));
    let pod = pod_with_claims("ns", "a", "pod-a", &["g", "n"]);
    env.nic
        .set_mode(FakeMode::ClaimError("NIC firmware busy".to_owned()));
    let err = cache
        .prepare_resources(&pod, &env.source)
        .await
        .expect_err("nic fails");
    assert_eq!(
        err.to_string(),
        "NodePrepareResources failed for ResourceClaim n: NIC firmware busy"
    );
    // The GPU claim was prepared by its driver and is recorded with its device; the NIC claim
    // has no devices; the pod references both (durably).
    assert_eq!(env.gpu.prepared(), vec!["uid-g".to_owned()]);
    let g = cache.get("ns", "g").expect("g cached");
    assert!(g.prepared);
    assert_eq!(g.drivers[GPU].len(), 1);
    let n = cache.get("ns", "n").expect("n cached");
    assert!(!n.prepared && n.drivers[NIC].is_empty());
    assert_eq!(env.checkpoint_pods("g"), vec!["pod-a"]);
    assert_eq!(env.checkpoint_pods("n"), vec!["pod-a"]);
    assert!(cache.pod_might_need_to_unprepare("pod-a"));

    // Unprepare of the pod reaches both drivers (the NIC one must accept a claim it never
    // prepared) and leaves nothing stranded.
    env.nic.set_mode(FakeMode::Ok);
    cache.unprepare_resources("pod-a").await.expect("unprepare");
    assert!(env.gpu.prepared().is_empty(), "GPU device freed");
    assert_eq!(env.nic.count("unprepare"), 1);
    assert!(cache.claims().is_empty());
    assert!(!cache.pod_might_need_to_unprepare("pod-a"));
}

/// `claim` with its (only) device renamed to `device`, optionally with admin access or a share.
fn on_device(
    mut claim: k8s_openapi::api::resource::v1::ResourceClaim,
    device: &str,
    admin_access: bool,
    share_id: Option<&str>,
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    for r in claim
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .into_iter()
        .flatten()
    {
        r.device = device.to_owned();
        r.admin_access = admin_access.then_some(true);
        r.share_id = share_id.map(str::to_owned);
    }
    claim
}

// Defence in depth (issue 25, not upstream): a device prepared for one claim is not prepared
// for another unless one has admin access or both hold shares; the refusal names both claims
// and records nothing; once the holder is unprepared the waiting claim goes through.
#[tokio::test]
async fn device_already_prepared_for_another_claim_is_refused_naming_both() {
    let env = Env::new();
    let cache = env.open("boot-1");
    let claim = |name: &str, uid: &str, pod: &str| allocated_claim("ns", name, uid, &[GPU], &[pod]);
    env.source.insert(on_device(
        claim("first", "uid-1", "pod-1"),
        "gpu-0",
        false,
        None,
    ));
    env.source.insert(on_device(
        claim("second", "uid-2", "pod-2"),
        "gpu-0",
        false,
        None,
    ));
    env.source.insert(on_device(
        claim("monitor", "uid-3", "pod-3"),
        "gpu-0",
        true,
        None,
    ));
    let first = pod_with_claims("ns", "p1", "pod-1", &["first"]);
    let second = pod_with_claims("ns", "p2", "pod-2", &["second"]);
    let monitor = pod_with_claims("ns", "p3", "pod-3", &["monitor"]);
    cache
        .prepare_resources(&first, &env.source)
        .await
        .expect("first");
    let err = cache
        .prepare_resources(&second, &env.source)
        .await
        .expect_err("the device is taken");
    assert!(
        matches!(&err, DraError::DeviceInUse { claim, device, other }
            if claim == "ns/second" && device == "gpu.example.com/pool/gpu-0" && other == "ns/first"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("ns/second") && text.contains("ns/first"),
        "{text}"
    );
    assert_eq!(
        env.gpu.count("prepare"),
        1,
        "the driver never saw the second claim"
    );
    assert!(env.checkpoint_pods("second").is_empty(), "nothing recorded");
    // Admin access may look at a device in use.
    cache
        .prepare_resources(&monitor, &env.source)
        .await
        .expect("admin access");

    cache
        .unprepare_resources("pod-1")
        .await
        .expect("unprepare first");
    cache
        .unprepare_resources("pod-3")
        .await
        .expect("unprepare monitor");
    cache
        .prepare_resources(&second, &env.source)
        .await
        .expect("the device is free again");

    // Two shares of a device that allows multiple allocations are no conflict.
    env.source.insert(on_device(
        claim("share-a", "uid-4", "pod-4"),
        "gpu-1",
        false,
        Some("a"),
    ));
    env.source.insert(on_device(
        claim("share-b", "uid-5", "pod-5"),
        "gpu-1",
        false,
        Some("b"),
    ));
    for (pod, c) in [("pod-4", "share-a"), ("pod-5", "share-b")] {
        let p = pod_with_claims("ns", pod, pod, &[c]);
        cache.prepare_resources(&p, &env.source).await.expect(c);
    }
}
