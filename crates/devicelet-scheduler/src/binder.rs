//! The binding cycle, one task per pod so that a slow API write never stalls the scheduling
//! loop (`schedule_one.go` → `bindingCycle`; DRA PreBind `bindClaim`, Unreserve, PostFilter's
//! deallocation; spec S23-S24, S44, S46, S49-S53, S60).
//!
//! Claim writes:
//! - a claim this pod allocates: the finalizer `resource.kubernetes.io/delete-protection` by an
//!   Update of the claim first (S51), then allocation and reservation in one UpdateStatus,
//!   conflict-checked on resourceVersion (a conflict re-reads the claim: if someone else
//!   allocated it meanwhile the binding fails, S50);
//! - a claim allocated already (shared): the pod is added to `reservedFor` by a strategic-merge
//!   patch keyed by the pod's UID with the claim's UID as precondition, so concurrent pods
//!   sharing a claim never conflict and never need a fresh copy; if the answer shows the claim
//!   deallocated meanwhile, the entry is removed again and the binding fails.
//!
//! Devices with binding conditions (KEP-5007) hold the binding until the conditions are True.
//! Then `pods/binding`. On any failure Unreserve runs: in-flight allocations are dropped, the
//! pod's `reservedFor` entries are removed by patch (S46), the assumed pod is forgotten and the
//! pod goes back to the queue with back-off.
//!
//! Shutdown (SIGTERM): every task the scheduler spawned is tracked here. A binding cycle still
//! waiting (for a slot, binding conditions, its group, a shared claim) gives up and is undone by
//! Unreserve; one writing finishes; `drain` waits for all of them at most a bounded time, so a
//! replacement replica never finds half-written pods it cannot explain.

use std::sync::Arc;
use std::time::Instant;

use devicelet_kube::protobuf;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{
    AllocationResult, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::binding_conditions::{Readiness, has_binding_conditions, readiness};
use crate::config::ContentType;
use crate::cycle::{ExtendedPlacement, Placement};
use crate::extended;
use crate::gang::barrier::GroupBarrier;
use crate::queue::QueuedPod;
use crate::report::{FailureReason, Reporter};
use crate::shared::Shared;

/// The finalizer that protects an allocated claim (S51).
pub const DELETE_PROTECTION: &str = "resource.kubernetes.io/delete-protection";
/// Binding cycles writing at once. Every request shares one HTTP/2 connection now
/// (`devicelet_kube::client`); over HTTP/1.1 (`DEVICELET_KUBE_API_HTTP1`) each request in flight
/// holds a connection, and thousands of concurrent bindings (measured: 3 600 TLS connections at
/// 500 nodes) stalled the API server. 64 writers reach the API server's ceiling (the benchmark's
/// binder deciding nothing uses as many); more would only fill its in-flight budget. Pods
/// waiting for a slot stay assumed: their devices are reserved meanwhile.
const BINDING_SLOTS: usize = 64;
/// Attempts of a conflict-checked write (`retry.DefaultRetry`: 5 steps).
const CONFLICT_RETRIES: usize = 5;
/// How long a group member waits for the others beyond the binding-conditions timeout.
const GROUP_WAIT_MARGIN: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a member waits for the claim another member of its group allocates to be written.
const SHARED_CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// How often PreBind looks at claims waiting for binding conditions.
const BINDING_POLL: std::time::Duration = std::time::Duration::from_secs(1);
/// Why a binding cycle that was waiting stops on shutdown.
const SHUTTING_DOWN: &str = "the scheduler is shutting down";

/// Runs binding cycles.
#[derive(Clone)]
pub struct Binder {
    client: Client,
    shared: Arc<Shared>,
    reporter: Reporter,
    /// Binding cycles allowed to talk to the API server at once.
    slots: Arc<Semaphore>,
    /// Every task spawned for the scheduling loop (bindings, preemption, events).
    tasks: TaskTracker,
    /// Cancelled on shutdown: waiting binding cycles give up.
    stopping: CancellationToken,
}

impl std::fmt::Debug for Binder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binder").finish_non_exhaustive()
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

fn consumer(pod: &Pod) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".to_owned(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
    }
}

impl Binder {
    /// A binder writing through `client`.
    pub fn new(client: Client, shared: Arc<Shared>) -> Self {
        let reporter = Reporter::new(client.clone(), &shared.name, shared.content_type);
        Binder {
            client,
            shared,
            reporter,
            slots: Arc::new(Semaphore::new(BINDING_SLOTS)),
            tasks: TaskTracker::new(),
            stopping: CancellationToken::new(),
        }
    }

    /// Runs `task` on `handle`, tracked so that shutdown waits for it.
    pub fn spawn<F>(&self, handle: &tokio::runtime::Handle, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        handle.spawn(self.tasks.track_future(task));
    }

    /// Runs the task `make` builds from a clone of this binder, tracked as `spawn`'s.
    pub fn spawn_with<F, Fut>(&self, handle: &tokio::runtime::Handle, make: F)
    where
        F: FnOnce(Binder) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.spawn(handle, make(self.clone()));
    }

    /// Shutdown: waiting binding cycles give up (and are undone), the others finish; returns
    /// the number of tasks still running after `limit` (they are abandoned with the process).
    pub async fn drain(&self, limit: std::time::Duration) -> usize {
        self.stopping.cancel();
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            return self.tasks.len();
        }
        0
    }

    /// `wait` unless the scheduler stops first.
    async fn unless_stopping<T>(
        &self,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, String> {
        tokio::select! {
            r = wait => Ok(r),
            _ = self.stopping.cancelled() => Err(SHUTTING_DOWN.to_owned()),
        }
    }

    /// A binding slot, unless the scheduler stops first (`None`: proceed without one, only to
    /// undo what was written).
    async fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.unless_stopping(self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// How many of the group members `written` (UIDs, in `pod`'s namespace) are deleted or
    /// being deleted. The pod watch may not have shown a deletion that came before the last
    /// claim write yet (`pods/binding` of the others would then succeed and leave the group
    /// short of its quorum), so unless the watch already shows one, one consistent list of the
    /// namespace's pod metadata settles it; when that fails, the group is not let through.
    async fn members_gone(&self, pod: &Pod, written: &[String]) -> usize {
        let known = written
            .iter()
            .filter(|uid| !self.shared.queue().is_binding(uid))
            .count();
        if known > 0 {
            return known;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.list_metadata(&ListParams::default()).await {
            Ok(list) => {
                let live: std::collections::HashSet<&str> = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| p.metadata.uid.as_deref())
                    .collect();
                written
                    .iter()
                    .filter(|uid| !live.contains(uid.as_str()))
                    .count()
            }
            Err(e) => {
                warn!(namespace = %ns, error = %e, "listing a pod group's members before binding failed");
                written.len()
            }
        }
    }

    /// The API client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The reporter (conditions and events).
    pub fn reporter(&self) -> &Reporter {
        &self.reporter
    }

    /// The binding cycle of `qp` onto `placement` (spawned by the scheduling loop after
    /// Reserve). `started`: when its scheduling attempt began.
    pub async fn bind(self, qp: QueuedPod, placement: Placement, started: Instant) {
        self.bind_member(qp, placement, started, None).await;
    }

    /// The binding cycle of a pod-group member: with a `barrier`, the pod binds only once every
    /// member of its group cycle has written its claims and the group still has its quorum
    /// (`gang::barrier`).
    pub async fn bind_member(
        self,
        qp: QueuedPod,
        placement: Placement,
        started: Instant,
        barrier: Option<(Arc<GroupBarrier>, String)>,
    ) {
        // Claims another member of the group allocates are waited for before a binding slot
        // is taken: members holding every slot while the allocating one waits for a slot
        // would stall until the wait's limit. A failure here shows again in PreBind.
        for claim in &placement.claims {
            let allocating = placement
                .allocations
                .iter()
                .any(|(c, _)| c.metadata.uid == claim.metadata.uid);
            if !allocating {
                let _ = self.wait_for_shared_allocation(claim.clone()).await;
            }
        }
        let mut slot = self.slot().await;
        let pod = qp.pod.clone();
        let pod_key = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let mut reserved: Vec<Arc<ResourceClaim>> = Vec::new();
        let mut created: Option<ResourceClaim> = None;
        let t = Instant::now();
        let prebind = if self.stopping.is_cancelled() {
            Err(SHUTTING_DOWN.to_owned())
        } else {
            self.pre_bind(&pod, &placement, &mut reserved, &mut created)
                .await
        };
        self.shared
            .metrics
            .extension_point("PreBind", prebind.is_ok(), t.elapsed());
        let prebind = match barrier {
            None => prebind,
            Some((barrier, group)) => {
                // No binding slot is held while waiting: a group larger than the slots would
                // wait for itself.
                drop(slot.take());
                // On shutdown the group does not bind: each member undoes its writes.
                let keeps_quorum = self
                    .unless_stopping(barrier.arrive(
                        &qp.uid,
                        prebind.is_ok(),
                        self.shared.binding_timeout + GROUP_WAIT_MARGIN,
                        async |written: Vec<String>| self.members_gone(&pod, &written).await,
                    ))
                    .await
                    .unwrap_or(false);
                slot = self.slot().await;
                match prebind {
                    Ok(()) if !keeps_quorum && self.stopping.is_cancelled() => {
                        Err(SHUTTING_DOWN.to_owned())
                    }
                    Ok(()) if !keeps_quorum => Err(format!(
                        "pod group {group} fell short of its quorum while its members' claims were written; no member is bound, the group is retried"
                    )),
                    other => other,
                }
            }
        };
        let _slot = slot;
        let result = match prebind {
            Ok(()) => {
                let t = Instant::now();
                let r = self.bind_pod(&pod, &placement.node).await;
                self.shared
                    .metrics
                    .extension_point("Bind", r.is_ok(), t.elapsed());
                r
            }
            Err(e) => Err(e),
        };
        let uid = qp.uid.clone();
        match result {
            Ok(()) => {
                self.shared.cache().finish_binding(&uid);
                self.shared.queue().binding_finished(&uid);
                self.shared
                    .metrics_of(&pod)
                    .attempt(crate::metrics::AttemptResult::Scheduled, started.elapsed());
                self.shared.metrics.bound(qp.attempts, qp.initial.elapsed());
                info!(pod = %pod_key, node = %placement.node, feasible = placement.feasible, "bound");
                self.reporter.scheduled(&pod, &placement.node).await;
            }
            Err(e) => {
                warn!(pod = %pod_key, node = %placement.node, error = %e, "binding failed; unreserving");
                self.unreserve(&pod, &placement, &reserved, created.as_ref())
                    .await;
                self.shared
                    .metrics_of(&pod)
                    .attempt(crate::metrics::AttemptResult::Error, started.elapsed());
                let message = format!("running PreBind/Bind for node {}: {e}", placement.node);
                let requeued = {
                    let mut cache = self.shared.cache();
                    cache.forget_assumed_pod(&uid);
                    let mut queue = self.shared.queue();
                    if cache.is_assigned(&uid) {
                        // The watch saw it bound by someone else: nothing to retry.
                        queue.binding_finished(&uid);
                        false
                    } else {
                        // Not when the pod was deleted while binding (it would be retried
                        // forever against a pod that is gone).
                        queue.binding_failed(qp, Instant::now())
                    }
                };
                // Resources the pod held are free again (S24).
                crate::informer::event(
                    &self.shared,
                    crate::queue::ClusterEvent::AssignedPodDeleted,
                );
                if requeued {
                    self.reporter
                        .failed(&pod, FailureReason::SchedulerError, &message)
                        .await;
                } else {
                    info!(pod = %pod_key, "pod deleted or bound elsewhere while binding; not retried");
                }
            }
        }
    }

    /// PreBind (S49): every claim of the pod gets the pod in `reservedFor` (and the
    /// allocation, when this pod allocated it).
    async fn pre_bind(
        &self,
        pod: &Pod,
        placement: &Placement,
        reserved: &mut Vec<Arc<ResourceClaim>>,
        created: &mut Option<ResourceClaim>,
    ) -> Result<(), String> {
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        for claim in &placement.claims {
            let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
            let allocation = placement
                .allocations
                .iter()
                .find(|(c, _)| c.metadata.uid == claim.metadata.uid)
                .map(|(_, a)| a.clone());
            let current = {
                let cache = self.shared.cache();
                cache.claim(
                    claim.metadata.namespace.as_deref().unwrap_or(""),
                    claim.metadata.name.as_deref().unwrap_or(""),
                )
            }
            .unwrap_or_else(|| claim.clone());
            let current = if allocation.is_none() {
                self.wait_for_shared_allocation(current).await?
            } else {
                current
            };
            // W41, W49: a PodGroup claim is reserved once, for the PodGroup.
            let group = {
                let cache = self.shared.cache();
                crate::dra::group_consumer(
                    pod,
                    claim.metadata.name.as_deref().unwrap_or(""),
                    &cache,
                )
            };
            if allocation.is_none()
                && crate::dra::is_reserved_for(&current, &pod_uid, group.as_ref())
            {
                continue;
            }
            let entry = group.unwrap_or_else(|| consumer(pod));
            let written = match allocation {
                Some(a) => self.allocate_and_reserve(pod, &current, a, entry).await,
                None => self.add_reservation(pod, &current, entry).await,
            };
            match written {
                Ok(w) => {
                    let mut cache = self.shared.cache();
                    cache.assume_claim(w.clone());
                    cache.remove_pending(&claim_uid, true);
                    reserved.push(Arc::new(w));
                }
                Err(e) => {
                    self.shared.cache().remove_pending(&claim_uid, false);
                    return Err(e);
                }
            }
        }
        let mut names: Vec<(String, String)> = placement
            .claims
            .iter()
            .map(|c| {
                (
                    c.metadata.namespace.clone().unwrap_or_default(),
                    c.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect();
        if let Some(ext) = &placement.extended {
            let name = self.bind_extended_claim(pod, ext, created).await?;
            names.push((pod.metadata.namespace.clone().unwrap_or_default(), name));
        }
        self.wait_for_binding_conditions(pod, &placement.node, &names)
            .await
    }

    /// A claim this pod shares with a member of its pod group that allocates it in the same
    /// group cycle: wait until that member's write lands (or is given up), so the reservation
    /// goes onto an allocated claim.
    async fn wait_for_shared_allocation(
        &self,
        current: Arc<ResourceClaim>,
    ) -> Result<Arc<ResourceClaim>, String> {
        let uid = current.metadata.uid.clone().unwrap_or_default();
        let ns = current.metadata.namespace.clone().unwrap_or_default();
        let name = current.metadata.name.clone().unwrap_or_default();
        let deadline = Instant::now() + SHARED_CLAIM_WAIT;
        // As this scheduler knows it (the placement's copy may show the other member's
        // allocation, which is not written yet).
        let mut claim = self.shared.cache().claim(&ns, &name).unwrap_or(current);
        loop {
            let allocated = claim
                .status
                .as_ref()
                .is_some_and(|s| s.allocation.is_some());
            let pending = self.shared.cache().pending_allocation(&uid).is_some();
            if allocated || !pending {
                return Ok(claim);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "claim {ns}/{name} is still being allocated by another member of the pod group"
                ));
            }
            self.unless_stopping(tokio::time::sleep(std::time::Duration::from_millis(20)))
                .await?;
            claim = self
                .shared
                .cache()
                .claim(&ns, &name)
                .ok_or_else(|| format!("claim {ns}/{name} got deleted in the meantime"))?;
        }
    }

    /// S55 (KEP-5004): the special claim is created (the pod as controller owner), allocated
    /// and reserved like a claim this pod allocates, and named in the pod's
    /// `status.extendedResourceClaimStatus` for the node. Returns the created claim's name.
    async fn bind_extended_claim(
        &self,
        pod: &Pod,
        ext: &ExtendedPlacement,
        created: &mut Option<ResourceClaim>,
    ) -> Result<String, String> {
        let temp_uid = ext.claim.metadata.uid.clone().unwrap_or_default();
        let api = self.claims_api(&ext.claim);
        let mut fresh = ext.claim.clone();
        fresh.metadata.name = None;
        fresh.metadata.uid = None;
        let written = match api.create(&PostParams::default(), &fresh).await {
            Ok(new) => {
                *created = Some(new.clone());
                self.allocate_and_reserve(pod, &new, ext.allocation.clone(), consumer(pod))
                    .await
            }
            Err(e) => Err(format!("create claim for extended resources: {e}")),
        };
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                self.shared.cache().remove_pending(&temp_uid, false);
                return Err(e);
            }
        };
        let name = written.metadata.name.clone().unwrap_or_default();
        {
            let mut cache = self.shared.cache();
            cache.assume_claim(written.clone());
            cache.remove_pending(&temp_uid, true);
        }
        *created = Some(written);
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let mappings: Vec<serde_json::Value> = ext
            .mappings
            .iter()
            .map(|m| {
                json!({"containerName": m.container, "resourceName": m.resource, "requestName": m.request})
            })
            .collect();
        let patch = json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": name, "requestMappings": mappings,
        }}});
        Api::<Pod>::namespaced(self.client.clone(), &ns)
            .patch_status(
                &pod_name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map_err(|e| format!("update pod {ns}/{pod_name} ExtendedResourceClaimStatus: {e}"))?;
        Ok(name)
    }

    /// Deletes a special claim this scheduler created: its finalizer first (the allocation
    /// goes with the claim), then the claim. Errors are only logged.
    async fn delete_claim(&self, claim: &ResourceClaim) -> Result<(), String> {
        let api = self.claims_api(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let remaining: Vec<&String> = claim
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != DELETE_PROTECTION)
            .collect();
        let patch = json!({"metadata": {"uid": claim.metadata.uid, "finalizers": remaining}});
        if let Err(e) = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404)
        {
            return Err(format!("remove the finalizer of claim {}: {e}", key(claim)));
        }
        match api.delete(&name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!("delete claim {}: {e}", key(claim))),
        }
    }

    /// S54 (KEP-5007): when a device of the pod's claims has binding conditions, the pod is
    /// bound only once they are all True in the claim's `status.devices` (set by whoever
    /// attaches the device); a failure condition or the binding timeout fails the binding.
    /// Claims are read from the cache, which the claim watch keeps current; upstream polls
    /// every 5 s, reading our own cache every second costs nothing.
    async fn wait_for_binding_conditions(
        &self,
        pod: &Pod,
        node: &str,
        names: &[(String, String)],
    ) -> Result<(), String> {
        let current = |ns: &str, name: &str| self.shared.cache().claim(ns, name);
        let waiting: Vec<&(String, String)> = names
            .iter()
            .filter(|(ns, name)| current(ns, name).is_some_and(|c| has_binding_conditions(&c)))
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        self.reporter
            .event(
                pod,
                "Normal",
                "BindingConditionsPending",
                "Scheduling",
                &format!("waiting for binding conditions for device on node {node}"),
            )
            .await;
        let deadline = Instant::now() + self.shared.binding_timeout;
        loop {
            let mut pending = false;
            for (ns, name) in &waiting {
                match current(ns, name).map(|c| readiness(&c)) {
                    None => return Err(format!("claim {ns}/{name} got deleted in the meantime")),
                    Some(Readiness::Failed(message)) => return Err(message),
                    Some(Readiness::Pending) => pending = true,
                    Some(Readiness::Ready) => {}
                }
            }
            if !pending {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err("device binding timeout".to_owned());
            }
            self.unless_stopping(tokio::time::sleep(BINDING_POLL.min(deadline - now)))
                .await?;
        }
    }

    fn claims_api(&self, claim: &ResourceClaim) -> Api<ResourceClaim> {
        Api::namespaced(
            self.client.clone(),
            claim.metadata.namespace.as_deref().unwrap_or(""),
        )
    }

    /// S50 for a claim this pod allocates: finalizer, then allocation + reservation in one
    /// UpdateStatus; conflicts re-read the claim.
    async fn allocate_and_reserve(
        &self,
        pod: &Pod,
        base: &ResourceClaim,
        mut allocation: AllocationResult,
        entry: ResourceClaimConsumerReference,
    ) -> Result<ResourceClaim, String> {
        let api = self.claims_api(base);
        let name = base.metadata.name.clone().unwrap_or_default();
        let k = key(base);
        // Binding conditions (KEP-5007) and the device-status gate are on in 1.36: the
        // allocation carries its timestamp.
        if allocation.allocation_timestamp.is_none() {
            allocation.allocation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        let mut claim = base.clone();
        for attempt in 0..CONFLICT_RETRIES {
            if attempt > 0 {
                claim = api
                    .get(&name)
                    .await
                    .map_err(|e| format!("get claim {k}: {e}"))?;
            }
            if claim.metadata.deletion_timestamp.is_some() {
                return Err(format!("claim {k} got deleted in the meantime"));
            }
            if claim.metadata.uid != base.metadata.uid {
                return Err(format!("claim {k} got deleted in the meantime"));
            }
            if claim
                .status
                .as_ref()
                .is_some_and(|s| s.allocation.is_some())
            {
                return Err(format!("claim {k} got allocated elsewhere in the meantime"));
            }
            let finalizers = claim.metadata.finalizers.get_or_insert_with(Vec::new);
            if !finalizers.iter().any(|f| f == DELETE_PROTECTION) {
                finalizers.push(DELETE_PROTECTION.to_owned());
                match api.replace(&name, &PostParams::default(), &claim).await {
                    Ok(updated) => claim = updated,
                    Err(e) if is_conflict(&e) => continue,
                    Err(e) => return Err(format!("add finalizer to claim {k}: {e}")),
                }
            }
            let status = claim
                .status
                .get_or_insert_with(ResourceClaimStatus::default);
            status.allocation = Some(allocation.clone());
            status
                .reserved_for
                .get_or_insert_with(Vec::new)
                .push(entry.clone());
            match api
                .replace_status(&name, &PostParams::default(), &claim)
                .await
            {
                Ok(updated) if updated.metadata.deletion_timestamp.is_some() => {
                    // Deleted between the finalizer and the status write: a pod must not
                    // start with a claim on its way out. kube-controller-manager deallocates
                    // it once the reservation is gone and removes the finalizer.
                    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
                    self.remove_reservation(&updated, &pod_uid).await;
                    return Err(format!("claim {k} got deleted in the meantime"));
                }
                Ok(updated) => return Ok(updated),
                Err(e) if is_conflict(&e) => {
                    debug!(claim = %k, "conflict writing the allocation; re-reading");
                    continue;
                }
                Err(e) => return Err(format!("add allocation and reservation to claim {k}: {e}")),
            }
        }
        Err(format!(
            "add allocation and reservation to claim {k}: still conflicting after {CONFLICT_RETRIES} attempts"
        ))
    }

    /// S50 steps 1, 3, 5 for an allocated claim, as a conflict-free patch (see the module
    /// documentation).
    async fn add_reservation(
        &self,
        pod: &Pod,
        claim: &ResourceClaim,
        entry: ResourceClaimConsumerReference,
    ) -> Result<ResourceClaim, String> {
        let api = self.claims_api(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let k = key(claim);
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("claim {k} got deleted in the meantime"));
        }
        let patch = json!({
            "metadata": { "uid": claim.metadata.uid },
            "status": { "reservedFor": [entry] }
        });
        let updated = api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(|e| format!("add reservation to claim {k}: {e}"))?;
        let still_allocated = updated
            .status
            .as_ref()
            .is_some_and(|s| s.allocation.is_some());
        if !still_allocated || updated.metadata.deletion_timestamp.is_some() {
            let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
            self.remove_reservation(&updated, &pod_uid).await;
            return Err(format!(
                "claim {k} got deallocated or deleted in the meantime"
            ));
        }
        Ok(updated)
    }

    /// S46: removes the pod's entry from `reservedFor` (strategic-merge delete directive with
    /// the claim's UID as precondition). Errors are only logged.
    async fn remove_reservation(&self, claim: &ResourceClaim, pod_uid: &str) {
        if let Err(e) = self.delete_reservation(claim, pod_uid).await {
            debug!(claim = %key(claim), error = %e, "removing the reservation failed");
        }
    }

    /// W55: the PodGroup's entry removed from `reservedFor` (the patch of S46 with the
    /// PodGroup's UID), so that a later cycle may deallocate the claim and allocate it anew.
    pub async fn unreserve_pod_group(
        &self,
        claim: &ResourceClaim,
        group_uid: &str,
    ) -> Result<(), String> {
        let t = Instant::now();
        let r = self.delete_reservation(claim, group_uid).await;
        self.shared
            .metrics
            .extension_point("PostFilter", r.is_ok(), t.elapsed());
        r.map_err(|e| format!("unreserve claim {} for its PodGroup: {e}", key(claim)))
    }

    /// The entry with `uid` deleted from the claim's `reservedFor` (a strategic-merge delete
    /// directive, with the claim's UID as precondition: no read of the latest claim needed).
    async fn delete_reservation(
        &self,
        claim: &ResourceClaim,
        uid: &str,
    ) -> Result<(), kube::Error> {
        let api = self.claims_api(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let patch = json!({
            "metadata": { "uid": claim.metadata.uid },
            "status": { "reservedFor": [{ "$patch": "delete", "uid": uid }] }
        });
        let updated = api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        self.shared.cache().assume_claim(updated);
        Ok(())
    }

    /// Unreserve (S46): in-flight allocations dropped, written reservations removed, a
    /// special claim created for the pod deleted.
    async fn unreserve(
        &self,
        pod: &Pod,
        placement: &Placement,
        reserved: &[Arc<ResourceClaim>],
        created: Option<&ResourceClaim>,
    ) {
        {
            let mut cache = self.shared.cache();
            for (claim, _) in placement.allocating() {
                cache.remove_pending(claim.metadata.uid.as_deref().unwrap_or(""), false);
            }
        }
        if let Some(claim) = created
            && let Err(e) = self.delete_claim(claim).await
        {
            warn!(error = %e, "deleting the extended resources claim failed");
        }
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        for claim in reserved {
            self.remove_reservation(claim, &pod_uid).await;
        }
    }

    /// Bind (S60): POST `pods/{name}/binding`.
    async fn bind_pod(&self, pod: &Pod, node: &str) -> Result<(), String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                uid: pod.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        };
        let r = match self.shared.content_type {
            ContentType::Protobuf => {
                let path = format!("{}/{name}/binding", api.resource_url());
                let body = protobuf::envelope("v1", "Binding", &protobuf::binding(&binding));
                protobuf::create(&self.client, &path, body).await
            }
            ContentType::Json => api
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    &binding,
                )
                .await
                .map(|_| ()),
        };
        r.map_err(|e| format!("binding pod {ns}/{name} to {node}: {e}"))
    }

    /// PostFilter's deallocation (S44): allocation, reservations and device status cleared by
    /// a conflict-checked UpdateStatus; the finalizer stays.
    pub async fn deallocate(&self, claim: &ResourceClaim) -> Result<(), String> {
        if extended::is_special_claim(claim) {
            // A special claim is never reused: deleted (S44).
            return self.delete_claim(claim).await;
        }
        let api = self.claims_api(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut c = claim.clone();
        if let Some(s) = c.status.as_mut() {
            s.allocation = None;
            s.reserved_for = None;
            s.devices = None;
        }
        let t = Instant::now();
        let r = api.replace_status(&name, &PostParams::default(), &c).await;
        self.shared
            .metrics
            .extension_point("PostFilter", r.is_ok(), t.elapsed());
        match r {
            Ok(updated) => {
                self.shared.cache().assume_claim(updated);
                Ok(())
            }
            Err(e) => Err(format!("deallocate claim {}: {e}", key(claim))),
        }
    }
}
