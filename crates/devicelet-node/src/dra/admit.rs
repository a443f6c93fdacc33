//! Admission of a pod's claims (`pkg/kubelet/cm/dra/manager.go` `PrepareResources`): in local
//! mode template claims are created, unallocated claims allocated with devicelet-allocator and
//! reserved for the pod; in cluster mode claims are read from the API server and only checked.
//! Then the [`ClaimCache`] prepares them through the drivers.

use devicelet_metrics::log_ms;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use devicelet_allocator::explain::{Explanation, explain_node};
use devicelet_allocator::scenario::{apply_api_defaults, render_explanation_table};
use devicelet_allocator::{
    AllocateOptions, AllocatedState, Allocator, CelFeatures, Features, SelectorCache, Semantics,
};
use devicelet_dra::pod::{
    POD_CLAIM_NAME_ANNOTATION, distinct_pod_claim_names, extended_resource_claim, pod_claim_names,
    template_claim_name,
};
use devicelet_dra::{ClaimSource, ClaimSourceError, DraError, PrepareTimings};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod, PodResourceClaimStatus, PodStatus};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tracing::{debug, info, warn};

use super::node::{DraNode, lock};
use super::store::{Objects, key, ns_of};
use super::{ClaimOrigin, DraNodeError};

/// The claims of one pod, read from the API server once, all at once; the claim cache's reads
/// are answered from here.
pub(super) struct Prefetched {
    claims: HashMap<String, ResourceClaim>,
}

impl Prefetched {
    /// The claim read for `name`.
    pub(super) fn claim(&self, name: &str) -> Option<&ResourceClaim> {
        self.claims.get(name)
    }

    /// GETs every claim of `pod` through `source` (de-duplicated; a template claim not created
    /// yet or a refused read is the error, as the claim cache would report it).
    pub(super) async fn read(pod: &Pod, source: &dyn ClaimSource) -> Result<Self, DraNodeError> {
        let namespace = ns_of(&pod.metadata);
        let names: Vec<String> = distinct_pod_claim_names(pod)?
            .into_iter()
            .map(|n| n.claim_name)
            .collect();
        let fetched =
            futures::future::join_all(names.iter().map(|n| source.get_claim(&namespace, n))).await;
        let mut claims = HashMap::with_capacity(names.len());
        for (name, fetched) in names.into_iter().zip(fetched) {
            let claim = fetched.map_err(|e| DraError::fetch_claim(&name, &e))?;
            claims.insert(name, claim);
        }
        Ok(Prefetched { claims })
    }
}

impl ClaimSource for Prefetched {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let found = self
            .claims
            .get(name)
            .cloned()
            .ok_or_else(|| ClaimSourceError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        futures::future::ready(found).boxed()
    }

    fn update_status(
        &self,
        namespace: &str,
        name: &str,
        _status: ResourceClaimStatus,
    ) -> BoxFuture<'static, Result<ResourceClaim, ClaimSourceError>> {
        let reason = format!("ResourceClaim {namespace}/{name}: the node does not write claims");
        futures::future::ready(Err(ClaimSourceError::Other(reason))).boxed()
    }
}

impl DraNode {
    /// Admits the claims of `pod`: creates template claims, allocates unallocated claims,
    /// reserves them for the pod and prepares them through their drivers. Returns the pod
    /// with `status.resourceClaimStatuses` filled in. Idempotent by pod UID. On failure
    /// nothing stays allocated or reserved for the pod.
    pub async fn admit(&self, pod: &Pod) -> Result<Option<Pod>, DraNodeError> {
        self.admit_timed(pod).await.map(|(resolved, _)| resolved)
    }

    /// [`Self::admit`], also saying where the time of the prepare went.
    pub async fn admit_timed(
        &self,
        pod: &Pod,
    ) -> Result<(Option<Pod>, PrepareTimings), DraNodeError> {
        let has_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        // The scheduler's claim for extended resources backed by DRA exists only in a cluster
        // (local mode has no scheduler to create it; the device manager skips those resources).
        let extended =
            matches!(self.origin, ClaimOrigin::Api(_)) && extended_resource_claim(pod).is_some();
        if !has_claims && !extended {
            return Ok((None, PrepareTimings::default()));
        }
        if let ClaimOrigin::Api(source) = &self.origin {
            return self
                .admit_from_api(pod, source)
                .await
                .map(|(resolved, timings)| (Some(resolved), timings));
        }
        // Fail-closed before anything is allocated or reserved (a prepare refused afterwards
        // would leave a reservation that cannot be undone until recovery).
        self.store.check_quarantine()?;
        self.cache.check_quarantine()?;
        let _serial = self.admission.lock().await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let resolved = self.allocate_and_reserve(pod)?;
        let result = self.cache.prepare_resources(&resolved, &*self.store).await;
        let timings = match result {
            Ok(timings) => timings,
            Err(err) => {
                // All or nothing: undo the pod's reference and reservations (a driver that is away
                // leaves this to the background retry; the claims stay reserved meanwhile).
                warn!(pod_uid = %uid, error = %err, "preparing claims failed; releasing them");
                if let Err(e) = self.release_pod_locked(&uid).await {
                    warn!(pod_uid = %uid, error = %e, "unprepare after a failed prepare failed; retrying in the background");
                    lock(&self.pending).insert(uid);
                }
                return Err(err.into());
            }
        };
        info!(pod_uid = %uid, "claims prepared");
        Ok((Some(resolved), timings))
    }

    /// Cluster mode admission (spec cluster.md §3): claim names from `spec.resourceClaims`
    /// (template claims through `status.resourceClaimStatuses`, written by
    /// kube-controller-manager; a missing entry is "ResourceClaim not created yet"), one GET per
    /// claim through `source`, which must be allocated, reserved for the pod and, when the
    /// claim is already prepared, have the checkpointed UID (a replaced claim is refused and
    /// nothing is prepared; the claim cache does these checks before any driver call). Nothing
    /// is created, allocated or reserved here. The pod is recorded while its claims are
    /// prepared, and a failure removes the record and unprepares, so it leaves nothing behind
    /// for a new pod; a re-admitted pod keeps what it had.
    ///
    /// Pods prepare concurrently: the node's admission lock covers only the pending unprepares
    /// (and the release after a failure); the claim GETs, the record, the drivers' calls and
    /// the checkpoint writes run outside it, serialised per claim by the claim cache, so a pod
    /// never waits for an unrelated pod's round trips (the kubelet prepares in per-pod workers
    /// too). The claim cache's device-in-use check still refuses a device another prepared
    /// claim holds.
    pub(super) async fn admit_from_api(
        &self,
        pod: &Pod,
        source: &Arc<dyn ClaimSource>,
    ) -> Result<(Pod, PrepareTimings), DraNodeError> {
        self.store.check_quarantine()?;
        self.cache.check_quarantine()?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut resolved = pod.clone();
        resolved.metadata.namespace = Some(ns_of(&pod.metadata));
        // Resolved and read before anything is recorded: a pod whose claims cannot be read
        // yet (the Node authorizer has not linked them, they are not reserved yet) leaves no
        // trace, so trying it again often costs no writes.
        let fetching = Instant::now();
        let claims = Prefetched::read(&resolved, source.as_ref()).await?;
        let claim_get = fetching.elapsed();
        let readmission = {
            let _serial = self.admission.lock().await;
            // Claims of deleted pods whose driver was away are unprepared before anything new
            // is prepared: the control plane may have given their devices to this pod's claims.
            self.unprepare_pending_locked().await;
            self.store.lock().pods.contains_key(&uid)
        };
        // The pod is recorded (`dra_objects.json`, for a reboot's re-prepare and for release)
        // on a blocking thread while its claims are prepared: the claim cache writes the pod's
        // reference before any driver call, so a crash in between leaves claims whose pod is
        // not recorded, which the next start unprepares (and the relist admits the pod again).
        // The record is durable before the pod is acknowledged.
        let store = Arc::clone(&self.store);
        let record = (uid.clone(), resolved.clone());
        let recording = tokio::task::spawn_blocking(move || {
            store.update(|o| {
                o.pods.insert(record.0, record.1);
            })
        });
        let started = Instant::now();
        let prepared = self
            .cache
            .prepare_resources(&resolved, &claims)
            .await
            .map(|timings| PrepareTimings {
                claim_get,
                ..timings
            });
        let recorded = recording.await.unwrap_or_else(|join| {
            Err(DraNodeError::Invalid(format!(
                "recording pod {uid} failed: {join}"
            )))
        });
        // The prepare's error first: a failed record matters only after a good prepare.
        let outcome = prepared
            .map_err(DraNodeError::from)
            .and_then(|timings| recorded.map(|()| timings));
        let timings = match outcome {
            Ok(timings) => timings,
            Err(err) if readmission => {
                // A running pod's claims stay prepared; the failure is reported only.
                warn!(pod_uid = %uid, error = %err, "preparing claims of an admitted pod again failed");
                return Err(err);
            }
            Err(err) => {
                if matches!(&err, DraNodeError::Dra(d) if d.is_claim_not_linked_yet()) {
                    debug!(pod_uid = %uid, error = %err, "claim not readable by the node yet (the Node authorizer has not linked it); the pod waits");
                } else {
                    warn!(pod_uid = %uid, error = %err, "preparing claims failed; unpreparing them");
                }
                let _serial = self.admission.lock().await;
                if let Err(e) = self.release_pod_locked(&uid).await {
                    warn!(pod_uid = %uid, error = %e, "unprepare after a failed prepare failed; retrying in the background");
                    lock(&self.pending).insert(uid);
                }
                return Err(err);
            }
        };
        // prepare_ms: claim GETs (fetch_ms), the drivers' NodePrepareResources (driver_ms) and
        // the checkpoint writes (checkpoint_ms).
        info!(pod_uid = %uid, prepare_ms = log_ms(started.elapsed()),
              fetch_ms = log_ms(timings.claim_get),
              driver_ms = log_ms(timings.driver),
              checkpoint_ms = log_ms(timings.checkpoint),
              "claims from the API server prepared");
        Ok((resolved, timings))
    }

    /// Steps before prepare, in one store update: template claims, allocation, reservation.
    pub(super) fn allocate_and_reserve(&self, pod: &Pod) -> Result<Pod, DraNodeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = ns_of(&pod.metadata);
        let mut resolved = pod.clone();
        resolved.metadata.namespace = Some(namespace.clone());
        let entries = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.clone())
            .unwrap_or_default();
        let mut objects = self.store.snapshot();

        // Template claims (the resourceclaim controller's job): deterministic names so a
        // re-admission finds the same claim.
        let mut statuses = Vec::new();
        for e in &entries {
            if e.resource_claim_name.is_some() {
                continue;
            }
            let Some(template_name) = &e.resource_claim_template_name else {
                continue;
            };
            let claim_name = template_claim_name(&pod_name, &e.name, &uid);
            let k = key(&namespace, &claim_name);
            if !objects.resource_claims.contains_key(&k) {
                let template = objects
                    .resource_claim_templates
                    .get(&key(&namespace, template_name))
                    .ok_or_else(|| {
                        DraNodeError::NotFound(format!(
                            "pod {namespace}/{pod_name}: ResourceClaimTemplate {namespace}/{template_name} not found"
                        ))
                    })?;
                let claim = ResourceClaim {
                    metadata: ObjectMeta {
                        name: Some(claim_name.clone()),
                        namespace: Some(namespace.clone()),
                        uid: Some(uuid::Uuid::new_v4().to_string()),
                        annotations: Some(BTreeMap::from([(
                            POD_CLAIM_NAME_ANNOTATION.to_owned(),
                            e.name.clone(),
                        )])),
                        labels: template
                            .spec
                            .metadata
                            .as_ref()
                            .and_then(|m| m.labels.clone()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".to_owned(),
                            kind: "Pod".to_owned(),
                            name: pod_name.clone(),
                            uid: uid.clone(),
                            controller: Some(true),
                            block_owner_deletion: Some(true),
                        }]),
                        ..ObjectMeta::default()
                    },
                    spec: template.spec.spec.clone(),
                    status: None,
                };
                objects.resource_claims.insert(k, claim);
            }
            statuses.push(PodResourceClaimStatus {
                name: e.name.clone(),
                resource_claim_name: Some(claim_name),
            });
        }
        if !statuses.is_empty() {
            let status = resolved.status.get_or_insert_with(PodStatus::default);
            let list = status.resource_claim_statuses.get_or_insert_with(Vec::new);
            for s in statuses {
                if !list.iter().any(|x| x.name == s.name) {
                    list.push(s);
                }
            }
        }

        // Which claims; de-duplicated (the same claim listed twice, E4).
        let names = pod_claim_names(&resolved)?;
        let mut keys: Vec<String> = Vec::new();
        for n in &names {
            let k = key(&namespace, &n.claim_name);
            if !objects.resource_claims.contains_key(&k) {
                return Err(DraNodeError::NotFound(format!(
                    "pod {namespace}/{pod_name}: ResourceClaim {k} not found"
                )));
            }
            if !keys.contains(&k) {
                keys.push(k);
            }
        }

        // Allocation of the unallocated ones, against everything else already allocated.
        let unallocated: Vec<String> = keys
            .iter()
            .filter(|k| {
                objects.resource_claims[*k]
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_none()
            })
            .cloned()
            .collect();
        if !unallocated.is_empty() {
            let results = self.allocate(&objects, &unallocated)?;
            for (k, result) in unallocated.iter().zip(results) {
                if let Some(c) = objects.resource_claims.get_mut(k) {
                    c.status.get_or_insert_with(Default::default).allocation = Some(result);
                }
            }
        }

        // Reservation for the pod.
        for k in &keys {
            if let Some(c) = objects.resource_claims.get_mut(k) {
                let reserved = c
                    .status
                    .get_or_insert_with(Default::default)
                    .reserved_for
                    .get_or_insert_with(Vec::new);
                if !reserved.iter().any(|r| r.uid == uid) {
                    reserved.push(ResourceClaimConsumerReference {
                        api_group: None,
                        resource: "pods".to_owned(),
                        name: pod_name.clone(),
                        uid: uid.clone(),
                    });
                }
            }
        }
        objects.pods.insert(uid, resolved.clone());
        let Objects {
            resource_claims,
            pods,
            ..
        } = objects;
        self.store.update(move |o| {
            o.resource_claims = resource_claims;
            o.pods = pods;
        })?;
        Ok(resolved)
    }

    /// Runs the structured allocator for the claims `keys` on this node.
    pub(super) fn allocate(
        &self,
        objects: &Objects,
        keys: &[String],
    ) -> Result<Vec<k8s_openapi::api::resource::v1::AllocationResult>, DraNodeError> {
        let features = Features::kubernetes_1_36_defaults();
        let classes: Vec<DeviceClass> = objects.device_classes.values().cloned().collect();
        let mut slices: Vec<ResourceSlice> = objects.resource_slices.values().cloned().collect();
        slices.extend(lock(&self.published).values().flatten().cloned());
        let mut state = AllocatedState::default();
        for (k, c) in &objects.resource_claims {
            if keys.contains(k) {
                continue;
            }
            let results = c
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref());
            for r in results.into_iter().flatten() {
                state
                    .add_result(r, features.consumable_capacity)
                    .map_err(|e| DraNodeError::Allocation(format!("claim {k}: {e}")))?;
            }
        }
        let claims: Vec<ResourceClaim> = keys
            .iter()
            .filter_map(|k| objects.resource_claims.get(k).cloned())
            .map(|mut c| {
                apply_api_defaults(&mut c);
                c
            })
            .collect();
        let refs: Vec<&ResourceClaim> = claims.iter().collect();
        let cel = Arc::new(SelectorCache::new(CelFeatures {
            enable_consumable_capacity: features.consumable_capacity,
            enable_list_type_attributes: features.list_type_attributes,
        }));
        let allocator = Allocator::new(features, Semantics::Fixed, &state, &classes, &slices, cel);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/hostname".to_owned(),
                    self.node_name.clone(),
                )])),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let outcome = allocator.allocate(&node, &refs, &AllocateOptions::default());
        match outcome {
            Ok(Some(results)) => Ok(results),
            Ok(None) | Err(_) => {
                let err = outcome.as_ref().err();
                let explanation = Explanation {
                    nodes: vec![explain_node(&allocator, &node, &refs, err)],
                };
                Err(DraNodeError::Allocation(format!(
                    "cannot allocate ResourceClaims {} on node {}:\n{}",
                    keys.join(", "),
                    self.node_name,
                    render_explanation_table(&explanation).trim_end()
                )))
            }
        }
    }
}
