//! Binding conditions (KEP-5007, beta and on in 1.36; spec S39, S54): a device whose slice
//! lists `bindingConditions` is not usable when allocated, only once something outside the
//! scheduler (a driver's controller attaching a fabric device, say) has set those conditions
//! True in the claim's `status.devices`. PreBind waits for that before the pod is bound; a
//! `bindingFailureConditions` entry set True, or the wait running past the binding timeout,
//! fails the binding, and the claim counts as unavailable on every node so that PostFilter
//! deallocates it (`dynamicresources.go` → `isClaimReadyForBinding`, `isClaimTimeout`).

use std::time::Duration;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::jiff::Timestamp;

/// `DynamicResourcesArgs.bindingTimeout`'s default (`DynamicResourcesBindingTimeoutDefault`).
pub const DEFAULT_BINDING_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a claim's binding conditions stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// No device waits for anything, or every binding condition is True.
    Ready,
    /// Some binding condition is not True yet.
    Pending,
    /// A binding failure condition is True: the message names it.
    Failed(String),
}

fn condition_true(status: &AllocatedDeviceStatus, type_: &str) -> Option<(String, String)> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// Whether the allocation has a device with binding conditions.
pub fn has_binding_conditions(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .any(|r| r.binding_conditions.as_ref().is_some_and(|c| !c.is_empty()))
}

/// S54's readiness check of one allocated claim against its `status.devices`.
pub fn readiness(claim: &ResourceClaim) -> Readiness {
    let Some(status) = claim.status.as_ref() else {
        return Readiness::Ready;
    };
    let results = status
        .allocation
        .as_ref()
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    let mut ready = true;
    for r in results.into_iter().flatten() {
        let conditions = r.binding_conditions.as_deref().unwrap_or_default();
        if conditions.is_empty() {
            continue;
        }
        let device = status.devices.iter().flatten().find(|d| {
            d.driver == r.driver
                && d.pool == r.pool
                && d.device == r.device
                && d.share_id == r.share_id
        });
        let Some(device) = device else {
            ready = false;
            continue;
        };
        for failure in r.binding_failure_conditions.iter().flatten() {
            if let Some((reason, message)) = condition_true(device, failure) {
                let name = claim.metadata.name.as_deref().unwrap_or("");
                return Readiness::Failed(format!(
                    "claim {name} binding failed: reason={reason}, message={message:?}"
                ));
            }
        }
        if conditions
            .iter()
            .any(|c| condition_true(device, c).is_none())
        {
            ready = false;
        }
    }
    if ready {
        Readiness::Ready
    } else {
        Readiness::Pending
    }
}

/// S39: an allocated claim that can no longer become usable (a failure condition True, or not
/// ready `timeout` after its allocation).
pub fn unusable(claim: &ResourceClaim, timeout: Duration, now: Timestamp) -> bool {
    match readiness(claim) {
        Readiness::Ready => false,
        Readiness::Failed(_) => true,
        Readiness::Pending => claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.allocation_timestamp.as_ref())
            .is_some_and(|t| {
                let waited = now.as_millisecond() - t.0.as_millisecond();
                u128::try_from(waited).is_ok_and(|w| w > timeout.as_millis())
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn claim(allocated_at: Timestamp, conditions: &[(&str, &str)]) -> ResourceClaim {
        let result = DeviceRequestAllocationResult {
            request: "gpu".into(),
            driver: "d".into(),
            pool: "p".into(),
            device: "dev".into(),
            binding_conditions: Some(vec!["attached".into()]),
            binding_failure_conditions: Some(vec!["failed".into()]),
            ..Default::default()
        };
        let devices = (!conditions.is_empty()).then(|| {
            vec![AllocatedDeviceStatus {
                driver: "d".into(),
                pool: "p".into(),
                device: "dev".into(),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| Condition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            reason: "Test".into(),
                            message: "from the test".into(),
                            last_transition_time: Time(allocated_at),
                            observed_generation: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }]
        });
        let mut c = ResourceClaim::default();
        c.metadata.name = Some("c".into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![result]),
                    config: None,
                }),
                allocation_timestamp: Some(Time(allocated_at)),
                ..Default::default()
            }),
            devices,
            reserved_for: None,
        });
        c
    }

    #[test]
    fn s54_ready_only_when_every_binding_condition_is_true() {
        let t = Timestamp::now();
        assert!(has_binding_conditions(&claim(t, &[])));
        assert_eq!(readiness(&claim(t, &[])), Readiness::Pending);
        assert_eq!(
            readiness(&claim(t, &[("attached", "False")])),
            Readiness::Pending
        );
        assert_eq!(
            readiness(&claim(t, &[("attached", "True")])),
            Readiness::Ready
        );
        assert_eq!(
            readiness(&claim(t, &[("attached", "True"), ("failed", "True")])),
            Readiness::Failed(
                "claim c binding failed: reason=Test, message=\"from the test\"".into()
            )
        );
        assert_eq!(readiness(&ResourceClaim::default()), Readiness::Ready);
    }

    #[test]
    fn s39_failed_or_timed_out_claims_are_unusable() {
        let now = Timestamp::now();
        let minute = Duration::from_secs(60);
        let old = now - k8s_openapi::jiff::SignedDuration::from_secs(120);
        assert!(!unusable(&claim(now, &[]), minute, now), "still waiting");
        assert!(unusable(&claim(old, &[]), minute, now), "timed out");
        assert!(!unusable(&claim(old, &[("attached", "True")]), minute, now));
        assert!(unusable(&claim(now, &[("failed", "True")]), minute, now));
    }
}
