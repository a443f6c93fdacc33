//! The downward API's `fieldRef` paths (`pkg/fieldpath/fieldpath.go` → `ExtractFieldPathAsString`,
//! and the kubelet's `podFieldSelectorRuntimeValue` for `spec.nodeName` and `status.hostIP`):
//! shared by env values (config.rs) and downwardAPI volumes (volumes.rs).

use k8s_openapi::api::core::v1::Pod;

use crate::error::RuntimeError;

/// A `fieldRef` of the downward API.
pub fn field_value(
    pod: &Pod,
    path: &str,
    node_name: &str,
    host_ip: &str,
) -> Result<String, RuntimeError> {
    let m = &pod.metadata;
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => node_name.to_owned(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => host_ip.to_owned(),
        other => {
            if let Some(key) = other
                .strip_prefix("metadata.labels['")
                .and_then(|k| k.strip_suffix("']"))
            {
                return Ok(m
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default());
            }
            if let Some(key) = other
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
            {
                return Ok(m
                    .annotations
                    .as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default());
            }
            return Err(RuntimeError::Config(format!(
                "fieldRef {other:?} is not supported by devicelet's CRI runtime"
            )));
        }
    })
}
