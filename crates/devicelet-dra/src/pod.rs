//! Pod-side helpers: which ResourceClaims a pod uses and which claims/requests each container
//! gets.
//!
//! Follows `staging/src/k8s.io/dynamic-resource-allocation/resourceclaim/resourceclaim.go`
//! (`Name`), `pkg/controller/resourceclaim/controller.go` (template claim names) and
//! `pkg/kubelet/cm/dra/manager.go` (`GetResources`), spec dra-kubelet.md §2 B1, B13, E18.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::error::DraError;

/// Annotation the resourceclaim controller puts on claims generated from a template.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// One `pod.spec.resourceClaims` entry resolved to a claim object name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaimName {
    /// The pod-level claim name (`pod.spec.resourceClaims[].name`).
    pub pod_claim: String,
    /// The ResourceClaim object name.
    pub claim_name: String,
    /// Whether it comes from a template (owner check applies, B2.2).
    pub from_template: bool,
}

fn pod_err(pod: &Pod, reason: impl Into<String>) -> DraError {
    DraError::PodClaim {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        reason: reason.into(),
    }
}

/// Resolves one pod claim (B1): `resourceClaimName` directly; a template claim through
/// `pod.status.resourceClaimStatuses` — an entry without a name means "intentionally not
/// created" (`Ok(None)`), no entry is an error ("ResourceClaim not created yet").
pub fn resolve_pod_claim(pod: &Pod, pod_claim: &str) -> Result<Option<PodClaimName>, DraError> {
    let spec_claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let Some(entry) = spec_claims.iter().find(|c| c.name == pod_claim) else {
        return Err(pod_err(
            pod,
            format!("pod claim {pod_claim} is not listed in spec.resourceClaims"),
        ));
    };
    if let Some(name) = &entry.resource_claim_name {
        return Ok(Some(PodClaimName {
            pod_claim: pod_claim.to_owned(),
            claim_name: name.clone(),
            from_template: false,
        }));
    }
    if entry.resource_claim_template_name.is_some() {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .map(Vec::as_slice)
            .unwrap_or_default();
        return match statuses.iter().find(|s| s.name == pod_claim) {
            None => Err(pod_err(pod, "ResourceClaim not created yet")),
            Some(status) => Ok(status
                .resource_claim_name
                .clone()
                .map(|claim_name| PodClaimName {
                    pod_claim: pod_claim.to_owned(),
                    claim_name,
                    from_template: true,
                })),
        };
    }
    Err(pod_err(
        pod,
        format!("claim {pod_claim}: none of the supported fields are set"),
    ))
}

/// The claim kube-scheduler created for the pod's extended resources backed by DRA
/// (`status.extendedResourceClaimStatus`, KEP-5004, beta and on by default in 1.36). It has no
/// `spec.resourceClaims` entry, so its pod claim name is empty, as upstream's synthetic
/// `PodResourceClaim`; the owner check does not apply.
pub fn extended_resource_claim(pod: &Pod) -> Option<PodClaimName> {
    let status = pod
        .status
        .as_ref()?
        .extended_resource_claim_status
        .as_ref()?;
    Some(PodClaimName {
        pod_claim: String::new(),
        claim_name: status.resource_claim_name.clone(),
        from_template: false,
    })
}

/// All claims of the pod in spec order (B1), skipping intentionally absent template claims,
/// then the extended-resource claim (`pkg/kubelet/cm/dra/manager.go` `PrepareResources`).
pub fn pod_claim_names(pod: &Pod) -> Result<Vec<PodClaimName>, DraError> {
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .map(|v| v.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        if let Some(resolved) = resolve_pod_claim(pod, &n)? {
            out.push(resolved);
        }
    }
    out.extend(extended_resource_claim(pod));
    Ok(out)
}

/// The PodGroup the pod belongs to (`spec.schedulingGroup.podGroupName`), if any.
pub fn pod_group_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

/// Whether `owner` is the PodGroup `group` (any version of `scheduling.k8s.io`; upstream
/// `IsForPod`, workloads.md W47).
pub fn is_pod_group_owner(
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    group: Option<&str>,
) -> bool {
    group.is_some_and(|g| {
        owner.kind == "PodGroup"
            && owner.api_version.split('/').next() == Some("scheduling.k8s.io")
            && owner.name == g
    })
}

/// Whether a `reservedFor` entry is the PodGroup `group`: matched by name, as pods do not know
/// their PodGroup's UID (upstream `IsReservedForPod`, workloads.md W50).
pub fn is_pod_group_consumer(
    consumer: &k8s_openapi::api::resource::v1::ResourceClaimConsumerReference,
    group: Option<&str>,
) -> bool {
    group.is_some_and(|g| {
        consumer.api_group.as_deref() == Some("scheduling.k8s.io")
            && consumer.resource == "podgroups"
            && consumer.name == g
    })
}

/// [`pod_claim_names`] with each claim object once (upstream bug E4: a claim listed twice went
/// into one driver batch twice, and the driver's single answer made every prepare fail with
/// "skipped 1"; devicelet keeps the first).
pub fn distinct_pod_claim_names(pod: &Pod) -> Result<Vec<PodClaimName>, DraError> {
    let mut seen = std::collections::HashSet::new();
    Ok(pod_claim_names(pod)?
        .into_iter()
        .filter(|pc| seen.insert(pc.claim_name.clone()))
        .collect())
}

/// `(claim object name, request)` pairs a container references through `resources.claims`
/// (B13), then the requests of the extended-resource claim that
/// `status.extendedResourceClaimStatus.requestMappings` maps to the container for a resource it
/// requests (upstream `GetResources`). `request = None` means the whole claim.
pub fn container_claim_requests(
    pod: &Pod,
    container: &Container,
) -> Result<Vec<(String, Option<String>)>, DraError> {
    let refs = container
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = Vec::with_capacity(refs.len());
    for r in refs {
        if let Some(resolved) = resolve_pod_claim(pod, &r.name)? {
            out.push((
                resolved.claim_name,
                r.request.clone().filter(|s| !s.is_empty()),
            ));
        }
    }
    if let Some(status) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    {
        let requested = |resource: &str| {
            container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
                .is_some_and(|q| {
                    devicelet_quantity::Quantity::parse(q.0.trim()).is_ok_and(|q| q.sign() != 0)
                })
        };
        for m in &status.request_mappings {
            if m.container_name == container.name && requested(&m.resource_name) {
                out.push((
                    status.resource_claim_name.clone(),
                    Some(m.request_name.clone()),
                ));
            }
        }
    }
    Ok(out)
}

/// The `generateName` the resourceclaim controller uses for a claim created from a template
/// for `pod_claim` of `pod_name` (the API server appends 5 random characters). Long names are
/// cut proportionally so both parts survive; as upstream, the cut form has no trailing `-`.
pub fn template_claim_generate_name(pod_name: &str, pod_claim: &str) -> String {
    const MAX_BASE_LEN: usize = 57;
    let full = format!("{pod_name}-{pod_claim}-");
    if full.len() <= MAX_BASE_LEN {
        return full;
    }
    let cut = |s: &str| {
        let mut n = s.len() * MAX_BASE_LEN / full.len();
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        s[..n].to_owned()
    };
    format!("{}-{}", cut(pod_name), cut(pod_claim))
}

/// A complete template claim name: the generate name plus a 5-character suffix from the API
/// server's alphabet, derived from `seed` (e.g. the pod UID) so the local flow is repeatable.
pub fn template_claim_name(pod_name: &str, pod_claim: &str, seed: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    // FNV-1a over the seed and pod claim: stable, no extra dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes().chain(pod_claim.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut base = template_claim_generate_name(pod_name, pod_claim);
    // The API server keeps at most 58 characters of generateName.
    if base.len() > 58 {
        let mut n = 58;
        while !base.is_char_boundary(n) {
            n -= 1;
        }
        base.truncate(n);
    }
    for _ in 0..5 {
        let idx = usize::try_from(h % ALPHABET.len() as u64).unwrap_or(0);
        base.push(char::from(ALPHABET[idx]));
        h /= ALPHABET.len() as u64;
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: &str) -> Pod {
        serde_json::from_str(json).expect("pod")
    }

    const EXTENDED: &str = r#"{
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "direct"}],
            "containers": [
                {"name": "app", "resources": {
                    "requests": {"example.com/gpu": "2", "example.com/fpga": "0"},
                    "claims": [{"name": "gpu"}]}},
                {"name": "other", "resources": {"requests": {"example.com/gpu": "1"}}}
            ]
        },
        "status": {"extendedResourceClaimStatus": {
            "resourceClaimName": "p-extended-resources-x",
            "requestMappings": [
                {"containerName": "app", "resourceName": "example.com/gpu", "requestName": "container-0-request-0"},
                {"containerName": "app", "resourceName": "example.com/fpga", "requestName": "container-0-request-1"},
                {"containerName": "other", "resourceName": "example.com/gpu", "requestName": "container-1-request-0"}
            ]}}
    }"#;

    #[test]
    fn the_extended_resource_claim_follows_the_pods_own_claims() {
        let p = pod(EXTENDED);
        let names: Vec<(String, String)> = pod_claim_names(&p)
            .unwrap()
            .into_iter()
            .map(|c| (c.pod_claim, c.claim_name))
            .collect();
        assert_eq!(
            names,
            [
                ("gpu".to_owned(), "direct".to_owned()),
                (String::new(), "p-extended-resources-x".to_owned())
            ]
        );
    }

    #[test]
    fn containers_get_the_requests_mapped_to_resources_they_request() {
        let p = pod(EXTENDED);
        let containers = &p.spec.as_ref().unwrap().containers;
        let app = container_claim_requests(&p, &containers[0]).unwrap();
        // The zero request for example.com/fpga gets nothing, as upstream's GetResources.
        assert_eq!(
            app,
            [
                ("direct".to_owned(), None),
                (
                    "p-extended-resources-x".to_owned(),
                    Some("container-0-request-0".to_owned())
                )
            ]
        );
        let other = container_claim_requests(&p, &containers[1]).unwrap();
        assert_eq!(
            other,
            [(
                "p-extended-resources-x".to_owned(),
                Some("container-1-request-0".to_owned())
            )]
        );
    }

    #[test]
    fn a_pod_without_the_status_has_no_extended_claim() {
        let mut p = pod(EXTENDED);
        p.status = None;
        assert!(extended_resource_claim(&p).is_none());
        assert_eq!(pod_claim_names(&p).unwrap().len(), 1);
    }
}
