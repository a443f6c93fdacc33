//! The names of a pod's ResourceClaims as its spec and status give them (spec scheduler.md S26;
//! `pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go`, `podResourceClaims`),
//! apart from the DynamicResources plugin so that what reads a pod alone (the NUMA use of
//! [`crate::numa::pod_use`]) does not depend on the cache.

use k8s_openapi::api::core::v1::Pod;

/// The claim names of `pod` (S26) without looking them up: `Err` with the upstream text when a
/// template claim is not created yet or an entry names neither field.
pub fn claim_names(pod: &Pod) -> Result<Vec<(String, String, bool)>, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    for pc in pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
    {
        if let Some(claim) = &pc.resource_claim_name {
            out.push((ns.clone(), claim.clone(), false));
        } else if pc.resource_claim_template_name.is_some() {
            let status = pod
                .status
                .iter()
                .flat_map(|s| s.resource_claim_statuses.iter().flatten())
                .find(|s| s.name == pc.name);
            match status {
                // "intentionally not created": nothing to do for this entry.
                Some(s) if s.resource_claim_name.is_none() => {}
                Some(s) => out.push((
                    ns.clone(),
                    s.resource_claim_name.clone().unwrap_or_default(),
                    true,
                )),
                None => {
                    return Err(format!(
                        "pod \"{ns}/{name}\": ResourceClaim not created yet"
                    ));
                }
            }
        } else {
            return Err(format!(
                "pod \"{ns}/{name}\", spec.resourceClaim {:?}: none of the supported fields are set",
                pc.name
            ));
        }
    }
    Ok(out)
}
