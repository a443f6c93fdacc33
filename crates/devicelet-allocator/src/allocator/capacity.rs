//! Consumable capacity (spec `structured-allocator.md` §2.9), following
//! `structured/internal/incubating/consumable_capacity.go` as used by
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use std::collections::BTreeMap;

use super::data::{CapacityData, DeviceData, Result};
use crate::quantity::{Quantity, QuantityFormat};

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a > 0) == (b > 0)) {
        q + 1
    } else {
        q
    }
}

/// Amount of one capacity consumed by a request (Go: `calculateConsumedCapacity`).
pub(crate) fn consumed_amount(requested: Option<&Quantity>, cap: &CapacityData) -> Quantity {
    let Some(req) = requested else {
        return cap.default.unwrap_or(cap.value);
    };
    if !cap.has_policy {
        return *req;
    }
    if let Some((min, _max, step)) = &cap.range {
        if req < min {
            return *min;
        }
        let Some(step) = step else { return *req };
        let step_v = step.value_ceil();
        if step_v <= 0 {
            return *req;
        }
        let min_v = min.value_ceil();
        let added = req.value_ceil() - min_v;
        let n = ceil_div(added, step_v);
        let val = min_v.saturating_add(step_v.saturating_mul(n));
        return Quantity::from_nanos(val.saturating_mul(1_000_000_000), QuantityFormat::BinarySI);
    }
    if let Some(values) = &cap.valid_values
        && let Some(v) = values.iter().find(|v| *v >= req)
    {
        return *v;
    }
    *req
}

/// Go: `violatesPolicy`.
fn violates_policy(consumed: &Quantity, cap: &CapacityData) -> bool {
    if !cap.has_policy {
        return false;
    }
    if cap.default.as_ref() == Some(consumed) {
        return false;
    }
    if let Some((min, max, step)) = &cap.range {
        if max.as_ref().is_some_and(|m| consumed > m) {
            return true;
        }
        if let Some(step) = step {
            let s = step.value_ceil();
            if s > 0 && (consumed.value_ceil() - min.value_ceil()) % s != 0 {
                return true;
            }
        }
        return false;
    }
    if let Some(values) = &cap.valid_values {
        return !values.iter().any(|v| v == consumed);
    }
    false
}

/// Go: `CmpRequestOverCapacity`. `Err(())` means the request names a capacity the device lacks
/// (callers skip the device silently).
pub(crate) fn capacity_fits(
    committed: &BTreeMap<String, i128>,
    requests: Option<&[(&str, Quantity)]>,
    dev: &DeviceData<'_>,
    allocating: Option<&BTreeMap<&str, i128>>,
) -> Result<bool, ()> {
    if let Some(reqs) = requests {
        for (name, _) in reqs {
            if !dev.capacity.iter().any(|(n, _)| n == name) {
                return Err(());
            }
        }
    }
    for (name, cap) in &dev.capacity {
        let requested = requests
            .and_then(|r| r.iter().find(|(n, _)| n == name))
            .map(|(_, q)| q);
        let consumed = consumed_amount(requested, cap);
        if violates_policy(&consumed, cap) {
            return Ok(false);
        }
        let total = committed.get(*name).copied().unwrap_or(0)
            + consumed.nanos()
            + allocating.and_then(|a| a.get(name)).copied().unwrap_or(0);
        if total > cap.value.nanos() {
            return Ok(false);
        }
    }
    Ok(true)
}
