//! In-process test doubles: a fake DRA driver ([`FakeDraDriver`]) behind a [`FakeDialer`], and
//! builders for claims and pods. Used by this crate's tests and bench, and by callers that test
//! the daemon without driver processes (feature `test-utils`). The fake keeps its own prepared
//! set and call log so tests can check what really reached the driver.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::{
    Container, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    ResourceClaim as ContainerClaim, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::claim_cache::ClaimCache;
use crate::client::{
    ClaimPrepareResult, ClaimRef, DraPluginClient, DraPluginDialer, DraService, PrepareResponse,
    PreparedDevice, UnprepareResponse,
};
use crate::error::{DraError, RpcCode, RpcError};
use crate::source::{ClaimSource, InMemoryClaimSource};

/// How the fake driver answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeMode {
    /// Normal operation.
    Ok,
    /// Every RPC fails with `Unavailable` (driver process gone / restarting).
    Unavailable,
    /// Every claim gets this per-claim error.
    ClaimError(String),
    /// Answers omit every claim (buggy driver).
    Skip,
}

/// One call the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeCall {
    /// `prepare` or `unprepare`.
    pub method: &'static str,
    /// Endpoint of the instance that got it.
    pub endpoint: PathBuf,
    /// The claims of the batch.
    pub claims: Vec<ClaimRef>,
}

#[derive(Debug)]
struct DriverState {
    mode: FakeMode,
    prepared: BTreeMap<String, ClaimRef>,
    calls: Vec<FakeCall>,
    delay: Duration,
}

/// A fake DRA driver: prepares each claim with one device `dev-<claim name>` in pool `pool`,
/// CDI ID `<driver>/claim=<claim uid>`.
#[derive(Debug, Clone)]
pub struct FakeDraDriver {
    name: String,
    state: Arc<Mutex<DriverState>>,
}

impl FakeDraDriver {
    /// A working driver.
    pub fn new(name: &str) -> Self {
        FakeDraDriver {
            name: name.to_owned(),
            state: Arc::new(Mutex::new(DriverState {
                mode: FakeMode::Ok,
                prepared: BTreeMap::new(),
                calls: Vec::new(),
                delay: Duration::ZERO,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DriverState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes how it answers.
    pub fn set_mode(&self, mode: FakeMode) {
        self.lock().mode = mode;
    }

    /// Delays every answer (to make RPCs overlap).
    pub fn set_delay(&self, d: Duration) {
        self.lock().delay = d;
    }

    /// The CDI ID the fake hands out for a claim UID.
    pub fn cdi_id(&self, claim_uid: &str) -> String {
        format!("{}/claim={claim_uid}", self.name)
    }

    /// Claim UIDs currently prepared on the driver side.
    pub fn prepared(&self) -> Vec<String> {
        self.lock().prepared.keys().cloned().collect()
    }

    /// Forgets every preparation (e.g. a reboot wiped the driver's tmpfs state).
    pub fn wipe(&self) {
        self.lock().prepared.clear();
    }

    /// Calls received so far.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// Number of calls of `method` (`"prepare"`/`"unprepare"`).
    pub fn count(&self, method: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .count()
    }

    fn answer_prepare(
        &self,
        endpoint: &Path,
        claims: Vec<ClaimRef>,
    ) -> Result<PrepareResponse, RpcError> {
        let mut st = self.lock();
        st.calls.push(FakeCall {
            method: "prepare",
            endpoint: endpoint.to_path_buf(),
            claims: claims.clone(),
        });
        match st.mode.clone() {
            FakeMode::Unavailable => Err(RpcError {
                code: RpcCode::Unavailable,
                message: "connection refused".to_owned(),
            }),
            FakeMode::Skip => Ok(HashMap::new()),
            FakeMode::ClaimError(e) => Ok(claims
                .into_iter()
                .map(|c| {
                    (
                        c.uid,
                        ClaimPrepareResult {
                            devices: vec![],
                            error: e.clone(),
                        },
                    )
                })
                .collect()),
            FakeMode::Ok => Ok(claims
                .into_iter()
                .map(|c| {
                    let device = PreparedDevice {
                        request_names: vec![],
                        pool_name: "pool".to_owned(),
                        device_name: format!("dev-{}", c.name),
                        cdi_device_ids: vec![self.cdi_id(&c.uid)],
                        share_id: None,
                    };
                    st.prepared.insert(c.uid.clone(), c.clone());
                    (
                        c.uid,
                        ClaimPrepareResult {
                            devices: vec![device],
                            error: String::new(),
                        },
                    )
                })
                .collect()),
        }
    }

    fn answer_unprepare(
        &self,
        endpoint: &Path,
        claims: Vec<ClaimRef>,
    ) -> Result<UnprepareResponse, RpcError> {
        let mut st = self.lock();
        st.calls.push(FakeCall {
            method: "unprepare",
            endpoint: endpoint.to_path_buf(),
            claims: claims.clone(),
        });
        match st.mode.clone() {
            FakeMode::Unavailable => Err(RpcError {
                code: RpcCode::Unavailable,
                message: "connection refused".to_owned(),
            }),
            FakeMode::Skip => Ok(HashMap::new()),
            FakeMode::ClaimError(e) => Ok(claims.into_iter().map(|c| (c.uid, e.clone())).collect()),
            FakeMode::Ok => Ok(claims
                .into_iter()
                .map(|c| {
                    st.prepared.remove(&c.uid);
                    (c.uid, String::new())
                })
                .collect()),
        }
    }
}

/// Client of one fake instance.
struct FakeClient {
    driver: FakeDraDriver,
    endpoint: PathBuf,
    connected: Arc<AtomicBool>,
}

impl DraPluginClient for FakeClient {
    fn node_prepare_resources(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Duration,
    ) -> BoxFuture<'static, Result<PrepareResponse, RpcError>> {
        let driver = self.driver.clone();
        let endpoint = self.endpoint.clone();
        async move {
            let delay = driver.lock().delay;
            if delay > deadline {
                tokio::time::sleep(deadline).await;
                return Err(RpcError {
                    code: RpcCode::DeadlineExceeded,
                    message: "deadline".to_owned(),
                });
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            driver.answer_prepare(&endpoint, claims)
        }
        .boxed()
    }

    fn node_unprepare_resources(
        &self,
        claims: Vec<ClaimRef>,
        _deadline: Duration,
    ) -> BoxFuture<'static, Result<UnprepareResponse, RpcError>> {
        let driver = self.driver.clone();
        let endpoint = self.endpoint.clone();
        async move {
            let delay = driver.lock().delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            driver.answer_unprepare(&endpoint, claims)
        }
        .boxed()
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }
}

/// Dialer handing out clients of registered fake drivers; instances start connected.
#[derive(Debug, Clone, Default)]
pub struct FakeDialer {
    drivers: Arc<Mutex<HashMap<String, FakeDraDriver>>>,
    connected: Arc<Mutex<HashMap<PathBuf, Arc<AtomicBool>>>>,
    dials: Arc<Mutex<Vec<(String, PathBuf, DraService)>>>,
}

impl FakeDialer {
    /// An empty dialer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `driver` dialable.
    pub fn add(&self, driver: &FakeDraDriver) {
        self.drivers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(driver.name.clone(), driver.clone());
    }

    /// Sets the transport state of the instance at `endpoint`.
    pub fn set_connected(&self, endpoint: &Path, up: bool) {
        if let Some(f) = self
            .connected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(endpoint)
        {
            f.store(up, Ordering::Relaxed);
        }
    }

    /// Every dial so far.
    pub fn dials(&self) -> Vec<(String, PathBuf, DraService)> {
        self.dials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl DraPluginDialer for FakeDialer {
    fn dial(
        &self,
        driver: &str,
        endpoint: &Path,
        service: DraService,
    ) -> Result<Arc<dyn DraPluginClient>, DraError> {
        let fake = self
            .drivers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(driver)
            .cloned()
            .ok_or_else(|| DraError::Dial {
                driver: driver.to_owned(),
                endpoint: endpoint.to_path_buf(),
                reason: "no such fake driver".to_owned(),
            })?;
        self.dials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((driver.to_owned(), endpoint.to_path_buf(), service));
        let flag = Arc::new(AtomicBool::new(true));
        self.connected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(endpoint.to_path_buf(), Arc::clone(&flag));
        Ok(Arc::new(FakeClient {
            driver: fake,
            endpoint: endpoint.to_path_buf(),
            connected: flag,
        }))
    }
}

/// An allocated claim `namespace/name` with UID `uid`, one device per driver, reserved for
/// `reserved_for` pod UIDs.
pub fn allocated_claim(
    namespace: &str,
    name: &str,
    uid: &str,
    drivers: &[&str],
    reserved_for: &[&str],
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Default::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    config: None,
                    results: Some(
                        drivers
                            .iter()
                            .map(|d| DeviceRequestAllocationResult {
                                driver: (*d).to_owned(),
                                pool: "pool".to_owned(),
                                device: format!("dev-{name}"),
                                request: "req".to_owned(),
                                ..DeviceRequestAllocationResult::default()
                            })
                            .collect(),
                    ),
                }),
                ..AllocationResult::default()
            }),
            reserved_for: Some(
                reserved_for
                    .iter()
                    .map(|u| ResourceClaimConsumerReference {
                        api_group: None,
                        resource: "pods".to_owned(),
                        name: format!("pod-{u}"),
                        uid: (*u).to_owned(),
                    })
                    .collect(),
            ),
            devices: None,
        }),
    }
}

/// Marks `claim` as generated from a template for the pod `pod_uid` (controller owner).
pub fn owned_by_pod(mut claim: ResourceClaim, pod_name: &str, pod_uid: &str) -> ResourceClaim {
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod_name.to_owned(),
        uid: pod_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    claim
}

/// A pod `namespace/name` (UID `uid`) whose spec lists `claims` by name (pod claim name =
/// claim name) and whose one container `ctr` references all of them.
pub fn pod_with_claims(namespace: &str, name: &str, uid: &str, claims: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            resource_claims: Some(
                claims
                    .iter()
                    .map(|c| PodResourceClaim {
                        name: (*c).to_owned(),
                        resource_claim_name: Some((*c).to_owned()),
                        resource_claim_template_name: None,
                    })
                    .collect(),
            ),
            containers: vec![Container {
                name: "ctr".to_owned(),
                resources: Some(ResourceRequirements {
                    claims: Some(
                        claims
                            .iter()
                            .map(|c| ContainerClaim {
                                name: (*c).to_owned(),
                                request: None,
                            })
                            .collect(),
                    ),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// Adds a template pod claim `pod_claim` whose generated claim is `claim_name` (recorded in
/// `status.resourceClaimStatuses`, as the resourceclaim controller does).
pub fn add_template_claim(
    pod: &mut Pod,
    pod_claim: &str,
    template: &str,
    claim_name: Option<&str>,
) {
    if let Some(spec) = pod.spec.as_mut() {
        spec.resource_claims
            .get_or_insert_with(Vec::new)
            .push(PodResourceClaim {
                name: pod_claim.to_owned(),
                resource_claim_name: None,
                resource_claim_template_name: Some(template.to_owned()),
            });
    }
    pod.status
        .get_or_insert_with(PodStatus::default)
        .resource_claim_statuses
        .get_or_insert_with(Vec::new)
        .push(PodResourceClaimStatus {
            name: pod_claim.to_owned(),
            resource_claim_name: claim_name.map(str::to_owned),
        });
}

/// The prepare/unprepare benches' workload (fake driver here, gRPC in `devicelet-rpc`): `n`
/// pods `ns/p{i}` (UID `pod-{i}`), each with two claims of `driver` reserved for it, stored in
/// `source`.
pub fn two_claim_pods(source: &InMemoryClaimSource, driver: &str, n: usize) -> Vec<Pod> {
    (0..n)
        .map(|i| {
            let uid = format!("pod-{i}");
            let (a, b) = (format!("c{i}-a"), format!("c{i}-b"));
            source.insert(allocated_claim(
                "ns",
                &a,
                &format!("u{i}a"),
                &[driver],
                &[&uid],
            ));
            source.insert(allocated_claim(
                "ns",
                &b,
                &format!("u{i}b"),
                &[driver],
                &[&uid],
            ));
            pod_with_claims("ns", &format!("p{i}"), &uid, &[&a, &b])
        })
        .collect()
}

/// Prepares then unprepares each of `pods` in turn (the benches' measured loop) and returns the
/// figure: `N pods x 2 claims prepare+unprepare in T: R pods/s, p50 .., p99 ..`.
pub async fn prepare_unprepare_each(
    cache: &ClaimCache,
    source: &dyn ClaimSource,
    pods: &[Pod],
) -> Result<String, DraError> {
    let mut lat = Vec::with_capacity(pods.len());
    let start = Instant::now();
    for pod in pods {
        let t = Instant::now();
        cache.prepare_resources(pod, source).await?;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        cache.unprepare_resources(uid).await?;
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort();
    let pct = |p: f64| {
        let i = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
        lat.get(i).copied().unwrap_or_default()
    };
    Ok(format!(
        "{} pods x 2 claims prepare+unprepare in {:.2?}: {:.0} pods/s, p50 {:.2?}, p99 {:.2?}",
        pods.len(),
        total,
        pods.len() as f64 / total.as_secs_f64(),
        pct(0.50),
        pct(0.99)
    ))
}
