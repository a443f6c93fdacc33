//! DynamicResources' PostFilter for a group that found no placement
//! (`dynamicresources.go` → `PostFilter`, `unreservePodGroupClaims`; spec W55, W56).
//!
//! Upstream runs it for every member that failed in the group cycle. Two things can free a
//! group that waits on an old allocation:
//! - W56: an allocated claim that kept a member off every node, reserved by nobody (or only by
//!   that member), is deallocated so that it can be allocated elsewhere;
//! - W55: otherwise, when no member is assumed or bound, the PodGroup's entry is taken out of
//!   the `reservedFor` of the first allocated PodGroup claim that holds it (a binding that
//!   failed in an earlier cycle leaves one behind). The claim is then reserved by nobody, and
//!   the next cycle's W56 may deallocate it.
//!
//! This module decides; the cycle ([`super::run`]) writes.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;

use crate::cache::ClusterCache;
use crate::dra::PODGROUP_API_GROUP;
use crate::gang::search::MemberResult;

/// What the PostFilter does for a failed group.
#[derive(Debug)]
pub enum PostFilterAction {
    /// W56: these claims (one per member at most, each once) are deallocated.
    Deallocate(Vec<Arc<ResourceClaim>>),
    /// W55: the entry with `group_uid` leaves `claim`'s `reservedFor`.
    UnreservePodGroup {
        claim: Arc<ResourceClaim>,
        group_uid: String,
    },
    /// Nothing to do: "still not schedulable".
    Nothing,
}

impl PostFilterAction {
    /// Upstream's PostFilter message for the members.
    pub fn message(&self) -> &'static str {
        match self {
            PostFilterAction::Deallocate(_) => "deallocation of ResourceClaim completed",
            PostFilterAction::UnreservePodGroup { .. } => "ResourceClaim unreserved for PodGroup",
            PostFilterAction::Nothing => "still not schedulable",
        }
    }
}

/// Chooses the PostFilter's action for `group`, whose members fared as `members` say, with
/// `scheduled` members assumed or bound (read from the live cache, as upstream does).
pub fn choose(
    group: &PodGroup,
    members: &[MemberResult],
    scheduled: usize,
    cache: &ClusterCache,
) -> PostFilterAction {
    let mut seen = BTreeSet::new();
    let deallocate: Vec<Arc<ResourceClaim>> = members
        .iter()
        .filter_map(|m| match m {
            MemberResult::NotPlaced {
                deallocate: Some(c),
                ..
            } => Some(c.clone()),
            _ => None,
        })
        .filter(|c| seen.insert(c.metadata.uid.clone()))
        .collect();
    if !deallocate.is_empty() {
        return PostFilterAction::Deallocate(deallocate);
    }
    if scheduled > 0 {
        return PostFilterAction::Nothing;
    }
    let ns = group.metadata.namespace.as_deref().unwrap_or("");
    let group_name = group.metadata.name.as_deref().unwrap_or("");
    let Some(group_uid) = group.metadata.uid.as_deref() else {
        return PostFilterAction::Nothing;
    };
    let statuses = group
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten());
    for gc in group.spec.resource_claims.iter().flatten() {
        // `NameFromPodGroup`: a named claim, or the one generated from the template (then it
        // must be owned by this PodGroup).
        let (name, must_own) = match (&gc.resource_claim_name, &gc.resource_claim_template_name) {
            (Some(n), _) => (Some(n.clone()), false),
            (None, Some(_)) => (
                statuses
                    .clone()
                    .find(|s| s.name == gc.name)
                    .and_then(|s| s.resource_claim_name.clone()),
                true,
            ),
            (None, None) => (None, false),
        };
        let Some(claim) = name.and_then(|n| cache.claim(ns, &n)) else {
            continue;
        };
        if must_own && !owned_by(&claim, group_uid) {
            continue;
        }
        let Some(status) = claim.status.as_ref() else {
            continue;
        };
        let holds_entry = status.reserved_for.iter().flatten().any(|r| {
            r.api_group.as_deref() == Some(PODGROUP_API_GROUP)
                && r.resource == "podgroups"
                && r.name == group_name
        });
        if status.allocation.is_some() && holds_entry {
            return PostFilterAction::UnreservePodGroup {
                claim,
                group_uid: group_uid.to_owned(),
            };
        }
    }
    PostFilterAction::Nothing
}

/// `IsForPodGroup`: the claim's controller is the PodGroup.
fn owned_by(claim: &ResourceClaim, group_uid: &str) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == group_uid)
}
