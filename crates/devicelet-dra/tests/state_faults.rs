//! Write faults on `dra_manager_state` (ecosystem A2 row 12 for the DRA claim cache): EIO and
//! ENOSPC injected through `devicelet_checkpoint::fault`. A prepare or unprepare whose state
//! cannot be written fails naming the file, leaves the previous file intact and no temporary
//! file, and leaves nothing in memory that the file does not have (no pod reference, devices or
//! prepared mark); once the fault is gone the same call works and a restart reads it back.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use devicelet_checkpoint::dra as ckpt;
use devicelet_checkpoint::fault::{EIO, ENOSPC, Fault, Op};
use devicelet_dra::fake::{FakeDialer, FakeDraDriver, allocated_claim, pod_with_claims};
use devicelet_dra::{ClaimCache, DraError, DraPluginRegistry, FixedBootId, InMemoryClaimSource};

const GPU: &str = "gpu.example.com";

struct Env {
    dir: tempfile::TempDir,
    registry: DraPluginRegistry,
    gpu: FakeDraDriver,
    source: InMemoryClaimSource,
}

impl Env {
    fn new() -> Self {
        let dialer = FakeDialer::new();
        let gpu = FakeDraDriver::new(GPU);
        dialer.add(&gpu);
        let registry =
            DraPluginRegistry::with_call_timeout(Arc::new(dialer), Duration::from_secs(2));
        registry
            .register(
                GPU,
                Path::new("/plugins/gpu/dra.sock"),
                &["v1.DRAPlugin".to_owned()],
            )
            .expect("register gpu");
        let source = InMemoryClaimSource::new();
        for (claim, pod) in [("c1", "pod-a"), ("c2", "pod-b")] {
            source.insert(allocated_claim(
                "ns",
                claim,
                &format!("uid-{claim}"),
                &[GPU],
                &[pod],
            ));
        }
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
            registry,
            gpu,
            source,
        }
    }

    fn open(&self) -> ClaimCache {
        ClaimCache::open(
            self.dir.path(),
            self.registry.clone(),
            &FixedBootId("boot-1".to_owned()),
        )
        .expect("open claim cache")
    }

    fn file(&self) -> std::path::PathBuf {
        self.dir.path().join("dra_manager_state")
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(self.file()).expect("read checkpoint")
    }

    fn no_temporary_files(&self) {
        for dir in [
            self.dir.path().to_path_buf(),
            self.dir.path().join("devicelet"),
        ] {
            for e in std::fs::read_dir(&dir).expect("list") {
                let name = e.expect("entry").file_name().to_string_lossy().into_owned();
                assert!(!name.ends_with(".tmp"), "temporary file left: {name}");
            }
        }
    }

    async fn prepare(&self, cache: &ClaimCache, pod: &str, claim: &str) -> Result<(), DraError> {
        let pod = pod_with_claims("ns", pod, pod, &[claim]);
        cache
            .prepare_resources(&pod, &self.source)
            .await
            .map(|_| ())
    }
}

fn assert_names_file(err: &DraError, file: &Path) {
    assert!(
        matches!(err, DraError::CheckpointWrite { .. }),
        "expected a checkpoint write error, got {err}"
    );
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "the error names the file: {err}"
    );
}

/// The pod reference (E10: written before any driver call) cannot be written: no driver is
/// called and the claim is not cached.
#[tokio::test]
async fn a2_12_eio_and_enospc_on_dra_manager_state_refuse_prepare_before_any_driver_call() {
    for (op, errno) in [(Op::Write, ENOSPC), (Op::Fsync, EIO), (Op::Rename, EIO)] {
        let env = Env::new();
        let cache = env.open();
        env.prepare(&cache, "pod-a", "c1").await.expect("prepare a");
        let before = env.bytes();
        let fault = Fault::arm(&env.file(), op, errno);
        let err = env
            .prepare(&cache, "pod-b", "c2")
            .await
            .expect_err("the write fails");
        assert_eq!(fault.hits(), 1, "{op:?}");
        assert_names_file(&err, &env.file());
        assert_eq!(env.gpu.count("prepare"), 1, "{op:?}: no driver call");
        assert!(
            cache.get("ns", "c2").is_none(),
            "{op:?}: not in memory only"
        );
        assert!(!cache.pod_might_need_to_unprepare("pod-b"), "{op:?}");
        assert_eq!(env.bytes(), before, "{op:?}");
        env.no_temporary_files();
        drop(fault);

        env.prepare(&cache, "pod-b", "c2")
            .await
            .expect("prepare works once the fault is gone");
        let reopened = env.open();
        let c2 = reopened.get("ns", "c2").expect("durable");
        assert!(c2.prepared && c2.pod_uids.contains("pod-b"), "{op:?}");
        assert_eq!(reopened.claims(), cache.claims(), "{op:?}");
    }
}

/// The driver prepared the claim but its devices cannot be written (the second write): the
/// devices are not kept in memory only and the claim is not prepared; the durable pod reference
/// makes the retry call the driver again, and then it is durable.
#[tokio::test]
async fn a2_12_devices_that_cannot_be_written_are_not_kept_in_memory() {
    for errno in [EIO, ENOSPC] {
        let env = Env::new();
        let cache = env.open();
        let fault = Fault::arm_after(&env.file(), Op::Fsync, errno, 1);
        let err = env
            .prepare(&cache, "pod-b", "c2")
            .await
            .expect_err("the devices cannot be written");
        assert_eq!(fault.hits(), 1);
        assert_names_file(&err, &env.file());
        assert_eq!(env.gpu.count("prepare"), 1);
        let c2 = cache.get("ns", "c2").expect("the durable pod reference");
        assert!(!c2.prepared);
        assert!(
            c2.drivers.values().all(Vec::is_empty),
            "devices only in memory: {c2:?}"
        );
        let on_disk = ckpt::decode(&env.bytes()).expect("verifies");
        let disk = on_disk.claims.unwrap_or_default();
        assert_eq!(disk.len(), 1, "the pod reference is durable");
        assert!(cache.pod_might_need_to_unprepare("pod-b"));
        env.no_temporary_files();
        drop(fault);

        env.prepare(&cache, "pod-b", "c2").await.expect("retry");
        assert_eq!(
            env.gpu.count("prepare"),
            2,
            "the retry asks the driver again"
        );
        let reopened = env.open();
        let c2 = reopened.get("ns", "c2").expect("durable");
        assert!(c2.prepared);
        assert!(c2.drivers.values().any(|d| !d.is_empty()));
    }
}

/// Unprepare whose first write (the cleared prepared mark, E11) fails: no driver call, the
/// claim stays prepared and referenced in memory as on disk; once the fault is gone the
/// unprepare finishes and a restart finds no claim.
#[tokio::test]
async fn a2_12_a_failed_write_on_unprepare_keeps_the_claim_prepared_and_referenced() {
    let env = Env::new();
    let cache = env.open();
    env.prepare(&cache, "pod-a", "c1").await.expect("prepare");
    let fault = Fault::arm(env.dir.path(), Op::Fsync, EIO);
    let err = cache
        .unprepare_resources("pod-a")
        .await
        .expect_err("the write fails");
    assert!(matches!(err, DraError::CheckpointWrite { .. }), "{err}");
    assert_eq!(env.gpu.count("unprepare"), 0, "no driver call");
    let c1 = cache.get("ns", "c1").expect("still cached");
    assert!(c1.prepared, "the mark is still on disk, so in memory too");
    assert!(cache.pod_might_need_to_unprepare("pod-a"));
    env.no_temporary_files();
    drop(fault);

    cache
        .unprepare_resources("pod-a")
        .await
        .expect("unprepare once the fault is gone");
    assert_eq!(env.gpu.count("unprepare"), 1);
    assert!(cache.get("ns", "c1").is_none());
    assert!(env.open().claims().is_empty());
}

/// The driver unprepared the claim but dropping it cannot be written: the claim stays cached
/// and referenced (memory as the file), so the unprepare is retried and then finishes.
#[tokio::test]
async fn a2_12_a_claim_whose_removal_cannot_be_written_stays_cached_for_a_retry() {
    let env = Env::new();
    let cache = env.open();
    env.prepare(&cache, "pod-a", "c1").await.expect("prepare");
    // The first write on unprepare is the marks file (devicelet/), then dra_manager_state.
    let fault = Fault::arm(&env.file(), Op::Fsync, EIO);
    let err = cache
        .unprepare_resources("pod-a")
        .await
        .expect_err("the removal cannot be written");
    assert_names_file(&err, &env.file());
    assert_eq!(env.gpu.count("unprepare"), 1);
    assert!(cache.get("ns", "c1").is_some(), "still cached, as on disk");
    assert!(cache.pod_might_need_to_unprepare("pod-a"));
    drop(fault);
    cache.unprepare_resources("pod-a").await.expect("retry");
    assert!(cache.get("ns", "c1").is_none());
    assert!(env.open().claims().is_empty());
}
