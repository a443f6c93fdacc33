//! The DynamicResources plugin (`pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go`,
//! spec scheduler.md §2): claim resolution and PreEnqueue (S26-S28), PreFilter (S32-S36), the
//! per-node Filter with devicelet's allocator (S38, S40, S41), the prioritized-list score
//! (S45a) and PostFilter's choice of a claim to deallocate (S43). Pure: the API writes of
//! Reserve, PreBind and PostFilter are in [`crate::binder`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use devicelet_allocator::explain::explain_node;
use devicelet_allocator::nodesel::CompiledNodeSelector;
use devicelet_allocator::{AllocateOptions, Allocator, ErrorClass};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    AllocationResult, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::jiff::Timestamp;

use crate::binding_conditions;
use crate::cache::ClusterCache;
use crate::framework::{Code, Plugin, Rejection};

/// `FirstAvailableDeviceRequestMaxSize`: the score of subrequest `i` is `8 - i` (S45a).
const FIRST_AVAILABLE_MAX: i64 = 8;

/// One of the pod's claims, resolved.
#[derive(Clone, Debug)]
pub struct PodClaim {
    pub claim: Arc<ResourceClaim>,
}

fn ns_name(claim: &ResourceClaim) -> (String, String) {
    (
        claim.metadata.namespace.clone().unwrap_or_default(),
        claim.metadata.name.clone().unwrap_or_default(),
    )
}

pub use crate::pod_claims::claim_names;

/// Whether the claim was made for `pod`: its controller owner is the pod, or the pod's PodGroup
/// (W47, `IsForPod` with DRAWorkloadResourceClaims: any version of `scheduling.k8s.io`, matched
/// by name).
fn controlled_by(claim: &ResourceClaim, pod: &Pod) -> bool {
    let group = crate::gang::group_of(pod).map(|(_, name)| name);
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .any(|o| {
            Some(&o.uid) == pod.metadata.uid.as_ref()
                || (o.kind == "PodGroup"
                    && o.api_version.split('/').next() == Some(PODGROUP_API_GROUP)
                    && Some(&o.name) == group.as_ref())
        })
}

/// The API group of PodGroups.
pub const PODGROUP_API_GROUP: &str = "scheduling.k8s.io";

/// W41 (`resourceclaim.BindTo`): when the pod's claim `claim_name` is one of its PodGroup's
/// claims (the pod's entry and the PodGroup's have the same `name`, `resourceClaimName` and
/// `resourceClaimTemplateName`), the claim is reserved for the PodGroup, and this is the entry:
/// one for every member, so the 256-entry limit of `reservedFor` does not apply.
pub fn group_consumer(
    pod: &Pod,
    claim_name: &str,
    cache: &ClusterCache,
) -> Option<ResourceClaimConsumerReference> {
    let (ns, group_name) = crate::gang::group_of(pod)?;
    let group = cache.pod_group(&ns, &group_name)?;
    let group_claims = group.spec.resource_claims.as_ref()?;
    let statuses = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten());
    let resolved = |pc: &k8s_openapi::api::core::v1::PodResourceClaim| -> Option<String> {
        pc.resource_claim_name.clone().or_else(|| {
            statuses
                .clone()
                .find(|s| s.name == pc.name)
                .and_then(|s| s.resource_claim_name.clone())
        })
    };
    let is_group_claim = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter(|pc| {
            group_claims.iter().any(|g| {
                g.name == pc.name
                    && g.resource_claim_name == pc.resource_claim_name
                    && g.resource_claim_template_name == pc.resource_claim_template_name
            })
        })
        .any(|pc| resolved(pc).as_deref() == Some(claim_name));
    is_group_claim.then(|| ResourceClaimConsumerReference {
        api_group: Some(PODGROUP_API_GROUP.to_owned()),
        resource: "podgroups".to_owned(),
        name: group_name,
        uid: group.metadata.uid.clone().unwrap_or_default(),
    })
}

/// W50 (`IsReservedForPod`): a pod entry matches by UID, the PodGroup entry by name (pods do
/// not know their PodGroup's UID).
pub fn is_reserved_for(
    claim: &ResourceClaim,
    pod_uid: &str,
    group: Option<&ResourceClaimConsumerReference>,
) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| {
            r.iter().any(|c| {
                c.uid == pod_uid
                    || group.is_some_and(|g| {
                        c.api_group == g.api_group && c.resource == g.resource && c.name == g.name
                    })
            })
        })
}

/// Resolves and checks the pod's claims (S26, S27): `Err` with the upstream message when one
/// is missing, being deleted, or a template claim not owned by the pod. This is PreEnqueue
/// (S28): such a pod is not attempted.
pub fn resolve_claims(pod: &Pod, cache: &ClusterCache) -> Result<Vec<PodClaim>, String> {
    let pod_ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    for (ns, name, from_template) in claim_names(pod)? {
        let Some(claim) = cache.claim(&ns, &name) else {
            return Err(format!("resourceclaim \"{ns}/{name}\" not found"));
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("resourceclaim {name:?} is being deleted"));
        }
        if from_template && !controlled_by(&claim, pod) {
            // W47: a group member's claim may be its PodGroup's; the message says both.
            let owner = match crate::gang::group_of(pod) {
                Some((_, group)) => format!("neither Pod nor PodGroup {group} is the owner"),
                None => "Pod is not owner".to_owned(),
            };
            return Err(format!(
                "ResourceClaim {ns}/{name} was not created for Pod {pod_ns}/{pod_name} ({owner})"
            ));
        }
        out.push(PodClaim { claim });
    }
    Ok(out)
}

/// What PreFilter found for a pod with claims.
#[derive(Clone, Debug, Default)]
pub struct DraState {
    pub claims: Vec<PodClaim>,
    /// Allocated claims with a node selector (index into `claims`): Filter requires it.
    pub allocated_selectors: Vec<(usize, CompiledNodeSelector)>,
    /// Allocated claims whose binding failed or timed out (S39): unavailable on every node,
    /// so PostFilter may deallocate them.
    pub unusable: Vec<usize>,
    /// Indexes of the claims to allocate.
    pub to_allocate: Vec<usize>,
}

impl DraState {
    /// Claim `i` is allocated as `allocation`: Filter requires its node selector, if any.
    pub fn require_node_of(
        &mut self,
        i: usize,
        allocation: &AllocationResult,
    ) -> Result<(), (Rejection, Option<String>)> {
        if let Some(sel) = &allocation.node_selector {
            let compiled = CompiledNodeSelector::compile(sel).map_err(|e| {
                (
                    Rejection::unresolvable(Plugin::DynamicResources, e.to_string()),
                    Some(e.to_string()),
                )
            })?;
            self.allocated_selectors.push((i, compiled));
        }
        Ok(())
    }
}

fn allocation(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref().and_then(|s| s.allocation.as_ref())
}

/// PreFilter (S32-S35). `Ok(None)`: the pod has no claims (Skip). A rejection applies to every
/// node.
pub fn pre_filter(
    pod: &Pod,
    cache: &ClusterCache,
    binding_timeout: Duration,
) -> Result<Option<DraState>, (Rejection, Option<String>)> {
    let has_claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty());
    if !has_claims {
        return Ok(None);
    }
    let claims = resolve_claims(pod, cache)
        .map_err(|m| (Rejection::unresolvable(Plugin::DynamicResources, m), None))?;
    let mut state = DraState::default();
    let mut reused: Vec<(usize, Arc<ResourceClaim>)> = Vec::new();
    for (i, pc) in claims.iter().enumerate() {
        let claim = &pc.claim;
        let (ns, name) = ns_name(claim);
        if let Some(a) = allocation(claim) {
            if binding_conditions::unusable(claim, binding_timeout, Timestamp::now()) {
                state.unusable.push(i);
            }
            state.require_node_of(i, a)?;
            continue;
        }
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if let Some(p) = cache.pending_allocation(&uid)
            && Some(&p.pod_uid) != pod.metadata.uid.as_ref()
        {
            // B-L1 fixed: a PodGroup claim another member is writing is reused by every
            // member, in any cycle, as if written (its node selector holds the pod to the
            // node, B-L2); PreBind waits for the write.
            if group_consumer(pod, &name, cache).is_some()
                && let Some(pending) = p.claim.status.as_ref().and_then(|s| s.allocation.clone())
            {
                state.require_node_of(i, &pending)?;
                let mut shared = (**claim).clone();
                shared
                    .status
                    .get_or_insert_with(ResourceClaimStatus::default)
                    .allocation = Some(pending);
                reused.push((i, Arc::new(shared)));
                continue;
            }
            return Err((
                Rejection::unresolvable(
                    Plugin::DynamicResources,
                    format!("resource claim {ns}/{name} is in the process of being allocated"),
                ),
                None,
            ));
        }
        for req in claim
            .spec
            .devices
            .iter()
            .flat_map(|d| d.requests.iter().flatten())
        {
            if let Some(exact) = &req.exactly {
                if exact.device_class_name.is_empty() {
                    return Err((
                        Rejection::unresolvable(
                            Plugin::DynamicResources,
                            format!("request {}: unsupported request type", req.name),
                        ),
                        Some("unsupported request type".into()),
                    ));
                }
                if !cache.has_class(&exact.device_class_name) {
                    return Err((
                        Rejection::unresolvable(
                            Plugin::DynamicResources,
                            format!(
                                "request {}: device class {} does not exist",
                                req.name, exact.device_class_name
                            ),
                        ),
                        None,
                    ));
                }
            } else if let Some(subs) = req.first_available.as_ref().filter(|s| !s.is_empty()) {
                for sub in subs {
                    if !cache.has_class(&sub.device_class_name) {
                        return Err((
                            Rejection::unresolvable(
                                Plugin::DynamicResources,
                                format!(
                                    "request {}/{}: device class {} does not exist",
                                    req.name, sub.name, sub.device_class_name
                                ),
                            ),
                            None,
                        ));
                    }
                }
            } else {
                return Err((
                    Rejection::unresolvable(
                        Plugin::DynamicResources,
                        format!(
                            "resource claim {ns}/{name}, request {}: unknown request type",
                            req.name
                        ),
                    ),
                    None,
                ));
            }
        }
        state.to_allocate.push(i);
    }
    let mut claims = claims;
    for (i, claim) in reused {
        claims[i].claim = claim;
    }
    state.claims = claims;
    Ok(Some(state))
}

/// The outcome of the DRA Filter on one node.
#[derive(Clone, Debug)]
pub enum NodeOutcome {
    /// The claims to allocate fit: one allocation per claim in `to_allocate` order (shared:
    /// a pod-group cycle hands one answer to many identical members).
    Fits(Arc<Vec<AllocationResult>>),
    /// The node is rejected; `unavailable` lists claims whose allocation excludes the node.
    Rejected {
        rejection: Rejection,
        unavailable: Vec<usize>,
    },
    /// A fatal error (bad CEL, bad claim): the whole attempt fails (S40).
    Error(String),
}

/// Filter on one node (S38, S39, S40): allocated claims must be usable there, then the others are
/// allocated together by `allocator`.
pub fn filter_node<'a>(
    state: &DraState,
    allocator: Option<&Allocator<'a>>,
    claims: &[&'a ResourceClaim],
    node: &Node,
    options: &AllocateOptions,
) -> NodeOutcome {
    let mut unavailable: Vec<usize> = state
        .allocated_selectors
        .iter()
        .filter(|(_, sel)| !sel.matches(node))
        .map(|(i, _)| *i)
        .collect();
    for i in &state.unusable {
        if !unavailable.contains(i) {
            unavailable.push(*i);
        }
    }
    if !unavailable.is_empty() {
        return NodeOutcome::Rejected {
            rejection: Rejection::unresolvable(
                Plugin::DynamicResources,
                "resourceclaim not available on the node",
            ),
            unavailable,
        };
    }
    let Some(allocator) = allocator.filter(|_| !claims.is_empty()) else {
        return NodeOutcome::Fits(Arc::new(Vec::new()));
    };
    let reject = |m: String| NodeOutcome::Rejected {
        rejection: Rejection::new(
            Plugin::DynamicResources,
            Code::UnschedulableAndUnresolvable,
            m,
        ),
        unavailable: Vec::new(),
    };
    match allocator.allocate(node, claims, options) {
        Ok(Some(results)) if results.len() == claims.len() => NodeOutcome::Fits(Arc::new(results)),
        Ok(_) => reject("cannot allocate all claims".into()),
        Err(e) if e.class == ErrorClass::Timeout => {
            reject("timed out trying to allocate devices".into())
        }
        Err(e) if e.class == ErrorClass::InvalidPools => reject(e.message),
        Err(e) => NodeOutcome::Error(e.message),
    }
}

/// devicelet's diagnosis of why the claims do not fit on `node` (the selector that matched
/// nothing, devices in use, taints, counters), for the pod's condition and event.
pub fn diagnose<'a>(
    allocator: &Allocator<'a>,
    node: &Node,
    claims: &[&'a ResourceClaim],
) -> String {
    let ex = explain_node(allocator, node, claims, None);
    let mut parts: Vec<String> = ex
        .requests
        .iter()
        .filter(|r| !r.verdict.is_empty())
        .take(3)
        .map(|r| {
            let mut text = format!("claim {} request {}: {}", r.claim, r.request, r.verdict);
            // Name the selectors that matched nothing, with their expressions.
            for sel in &r.rejected_by_selector {
                text.push_str(&format!(
                    "; {} `{}` rejected {}",
                    sel.selector, sel.expression, sel.rejected
                ));
            }
            if !r.untolerated_taints.is_empty() {
                text.push_str(&format!(
                    "; untolerated device taints: {}",
                    r.untolerated_taints.join(", ")
                ));
            }
            text
        })
        .collect();
    parts.extend(ex.constraints.iter().take(2).map(|c| {
        format!(
            "claim {} constraint {}: {}",
            c.claim, c.constraint, c.verdict
        )
    }));
    if !ex.incomplete_pools.is_empty() {
        parts.push(format!(
            "incomplete pools: {}",
            ex.incomplete_pools.join(", ")
        ));
    }
    format!("devicelet: on node {}: {}", ex.node, parts.join("; "))
}

/// The prioritized-list score of a node's allocation (S45a, upstream `computeScore`): per
/// claim, `8 - i` once for each subrequest `i` of a `firstAvailable` request that the
/// allocation uses (however many devices it got).
pub fn score(claims: &[&ResourceClaim], results: &[AllocationResult]) -> i64 {
    claims
        .iter()
        .zip(results)
        .map(|(claim, result)| claim_score(claim, result))
        .sum()
}

/// [`score`] of the pod's claims that are allocated already (a claim shared with a pod that
/// runs, a PodGroup's claim): the same on every node, and counted as upstream counts it,
/// since it shifts the normalised scores.
pub fn allocated_score<'c>(claims: impl IntoIterator<Item = &'c ResourceClaim>) -> i64 {
    claims
        .into_iter()
        .filter_map(|c| Some((c, c.status.as_ref()?.allocation.as_ref()?)))
        .map(|(claim, allocation)| claim_score(claim, allocation))
        .sum()
}

fn claim_score(claim: &ResourceClaim, result: &AllocationResult) -> i64 {
    let used: BTreeSet<&str> = result
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| r.request.as_str())
        .filter(|r| r.contains('/'))
        .collect();
    let mut total = 0;
    for request in claim
        .spec
        .devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten())
    {
        for (i, sub) in request.first_available.iter().flatten().enumerate() {
            if used.contains(format!("{}/{}", request.name, sub.name).as_str()) {
                total += FIRST_AVAILABLE_MAX - i as i64;
            }
        }
    }
    total
}

/// PostFilter's choice (S43): among the claims some node found unavailable, one allocated
/// claim reserved by nobody or by this pod only. The caller deallocates it (S44).
pub fn claim_to_deallocate(
    state: &DraState,
    unavailable: &BTreeSet<usize>,
    pod_uid: &str,
) -> Option<Arc<ResourceClaim>> {
    let mut candidates: Vec<usize> = unavailable.iter().copied().collect();
    fastrand::shuffle(&mut candidates);
    candidates.into_iter().find_map(|i| {
        let claim = &state.claims.get(i)?.claim;
        let status = claim.status.as_ref()?;
        status.allocation.as_ref()?;
        let reserved = status.reserved_for.as_deref().unwrap_or(&[]);
        let free = reserved.is_empty() || (reserved.len() == 1 && reserved[0].uid == pod_uid);
        free.then(|| claim.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s45a_a_subrequest_counts_once_however_many_devices_it_got() {
        use k8s_openapi::api::resource::v1::{
            DeviceAllocationResult, DeviceClaim, DeviceRequest, DeviceRequestAllocationResult,
            DeviceSubRequest, ResourceClaimSpec,
        };
        let sub = |name: &str| DeviceSubRequest {
            name: name.into(),
            device_class_name: "gpu".into(),
            ..DeviceSubRequest::default()
        };
        let claim = ResourceClaim {
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: "r".into(),
                        first_available: Some(vec![sub("big"), sub("two-small")]),
                        ..DeviceRequest::default()
                    }]),
                    ..DeviceClaim::default()
                }),
            },
            ..ResourceClaim::default()
        };
        let result = |sub: &str, devices: usize| AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    (0..devices)
                        .map(|d| DeviceRequestAllocationResult {
                            request: format!("r/{sub}"),
                            driver: "d".into(),
                            pool: "p".into(),
                            device: format!("dev-{d}"),
                            ..DeviceRequestAllocationResult::default()
                        })
                        .collect(),
                ),
                ..DeviceAllocationResult::default()
            }),
            ..AllocationResult::default()
        };
        // Upstream `computeScore`: 8 - 0 for the first alternative, 8 - 1 for the second,
        // once per subrequest (two devices of "two-small" score 7, not 14).
        assert_eq!(score(&[&claim], &[result("big", 1)]), 8);
        assert_eq!(score(&[&claim], &[result("two-small", 2)]), 7);
        let mut allocated = claim.clone();
        allocated.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
            allocation: Some(result("two-small", 2)),
            ..Default::default()
        });
        assert_eq!(allocated_score([&claim, &allocated]), 7);
    }
    use k8s_openapi::api::core::v1::{
        PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    };

    fn template_pod(status: Option<Option<&str>>) -> Pod {
        let mut pod = Pod {
            spec: Some(PodSpec {
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_template_name: Some("tmpl".into()),
                    ..PodResourceClaim::default()
                }]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.name = Some("p".into());
        if let Some(s) = status {
            pod.status = Some(PodStatus {
                resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                    name: "gpu".into(),
                    resource_claim_name: s.map(str::to_owned),
                }]),
                ..PodStatus::default()
            });
        }
        pod
    }

    #[test]
    fn s26_template_claims_resolve_through_the_pod_status() {
        assert_eq!(
            claim_names(&template_pod(None)),
            Err("pod \"ns/p\": ResourceClaim not created yet".to_owned())
        );
        assert_eq!(claim_names(&template_pod(Some(None))), Ok(vec![]));
        assert_eq!(
            claim_names(&template_pod(Some(Some("p-gpu-x")))),
            Ok(vec![("ns".into(), "p-gpu-x".into(), true)])
        );
    }

    #[test]
    fn s27_a_template_claim_not_owned_by_the_pod_is_refused() {
        let mut cache = ClusterCache::new();
        let mut claim = ResourceClaim::default();
        claim.metadata.namespace = Some("ns".into());
        claim.metadata.name = Some("p-gpu-x".into());
        cache.upsert_claim(claim);
        let pod = template_pod(Some(Some("p-gpu-x")));
        assert_eq!(
            resolve_claims(&pod, &cache).err(),
            Some("ResourceClaim ns/p-gpu-x was not created for Pod ns/p (Pod is not owner)".into())
        );
        // W47: a group member's message names its PodGroup too.
        let mut member = pod.clone();
        if let Some(spec) = member.spec.as_mut() {
            spec.scheduling_group = Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
                pod_group_name: Some("g".into()),
            });
        }
        assert_eq!(
            resolve_claims(&member, &cache).err(),
            Some(
                "ResourceClaim ns/p-gpu-x was not created for Pod ns/p (neither Pod nor PodGroup g is the owner)"
                    .into()
            )
        );
        let missing = template_pod(Some(Some("other")));
        assert_eq!(
            resolve_claims(&missing, &cache).err(),
            Some("resourceclaim \"ns/other\" not found".into())
        );
    }
}
