//! Device taints and request tolerations (spec `structured-allocator.md` §2.11), following
//! the taint check of `allocateDevice` in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceToleration};

fn tolerates(t: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
        && e != taint.effect
    {
        return false;
    }
    if let Some(k) = t.key.as_deref().filter(|k| !k.is_empty())
        && k != taint.key
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "Exists" => true,
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

pub(crate) fn taint_blocks(
    taints: &[DeviceTaint],
    tolerations: Option<&[DeviceToleration]>,
) -> bool {
    taints.iter().any(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations
                .unwrap_or(&[])
                .iter()
                .any(|t| tolerates(t, taint))
    })
}
