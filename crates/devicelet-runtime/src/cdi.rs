//! CDI device names resolved by devicelet for runtimes that do not apply CDI themselves
//! (containerd before 1.7 ignores the CRI `CDIDevices` field): the spec files are read and
//! checked by the `container-device-interface` crate (CDI `pkg/cdi` `Cache`), and the
//! edits of each named device (env, device nodes, mounts) become plain CRI fields.
//!
//! Hooks and `intelRdt` edits have no CRI field: a device that needs them is refused with a
//! clear error rather than started half-configured.

use std::collections::BTreeMap;

use container_device_interface::cache::{Cache, with_auto_refresh};
use container_device_interface::spec_dirs::with_spec_dirs;
use serde_json::Value;

use crate::error::RuntimeError;

/// What a set of CDI devices adds to a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CdiEdits {
    /// `KEY=VALUE` environment entries, in spec order.
    pub env: Vec<(String, String)>,
    /// Device nodes: (container path, host path, permissions).
    pub device_nodes: Vec<(String, String, String)>,
    /// Mounts: (container path, host path, read-only).
    pub mounts: Vec<(String, String, bool)>,
}

/// Resolves CDI device names against the spec directories (`/etc/cdi`, `/var/run/cdi` by
/// default; a later directory wins over an earlier one for the same device, as in CDI).
#[derive(Debug, Clone)]
pub struct CdiResolver {
    dirs: Vec<String>,
}

impl CdiResolver {
    /// A resolver reading `dirs`.
    pub fn new(dirs: Vec<String>) -> Self {
        CdiResolver { dirs }
    }

    /// The spec directories.
    pub fn dirs(&self) -> &[String] {
        &self.dirs
    }

    /// The edits of `names` (fully-qualified `vendor/class=device`), specs read afresh (a DRA
    /// driver writes its spec while preparing the claim, just before the container starts).
    /// Spec-wide edits are applied once per spec, then each device's own.
    pub fn resolve(&self, names: &[String]) -> Result<CdiEdits, RuntimeError> {
        let mut out = CdiEdits::default();
        if names.is_empty() {
            return Ok(out);
        }
        let dirs: Vec<&str> = self.dirs.iter().map(String::as_str).collect();
        let mut cache = Cache::default();
        cache.configure(vec![with_spec_dirs(&dirs), with_auto_refresh(false)]);
        cache
            .refresh()
            .map_err(|e| RuntimeError::Cdi(format!("reading specs in {dirs:?}: {e}")))?;
        let mut specs_seen: Vec<String> = Vec::new();
        for name in names {
            let Some(device) = cache.get_device(name) else {
                return Err(RuntimeError::Cdi(format!(
                    "unresolvable CDI device {name} (no spec in {dirs:?} defines it)"
                )));
            };
            let mut spec = device.get_spec();
            let spec_path = spec.get_path();
            let device_edits = device.edits();
            if !specs_seen.contains(&spec_path) {
                specs_seen.push(spec_path.clone());
                if let Some(edits) = spec.edits() {
                    add_edits(&mut out, &edits.container_edits, name, &spec_path)?;
                }
            }
            add_edits(&mut out, &device_edits.container_edits, name, &spec_path)?;
        }
        Ok(out)
    }
}

/// Adds one set of container edits, read through their serialized (CDI JSON) form, whose field
/// names are the spec's own.
fn add_edits(
    out: &mut CdiEdits,
    edits: &impl serde::Serialize,
    device: &str,
    spec_path: &str,
) -> Result<(), RuntimeError> {
    let value = serde_json::to_value(edits)
        .map_err(|e| RuntimeError::Cdi(format!("{device} in {spec_path}: {e}")))?;
    let empty = BTreeMap::new();
    let fields: BTreeMap<&str, &Value> = value
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or(empty);
    for (field, v) in fields {
        let items = v.as_array().map(Vec::as_slice).unwrap_or_default();
        match field {
            "env" => {
                for entry in items.iter().filter_map(Value::as_str) {
                    let (k, val) = entry.split_once('=').unwrap_or((entry, ""));
                    out.env.retain(|(key, _)| key != k);
                    out.env.push((k.to_owned(), val.to_owned()));
                }
            }
            "deviceNodes" => {
                for node in items {
                    let path = node["path"].as_str().unwrap_or_default().to_owned();
                    let host = node["hostPath"].as_str().unwrap_or(&path).to_owned();
                    let perms = node["permissions"].as_str().unwrap_or("rwm").to_owned();
                    out.device_nodes.retain(|(p, _, _)| *p != path);
                    out.device_nodes.push((path, host, perms));
                }
            }
            "mounts" => {
                for mount in items {
                    let container = mount["containerPath"].as_str().unwrap_or_default();
                    let host = mount["hostPath"].as_str().unwrap_or_default();
                    let read_only = mount["options"]
                        .as_array()
                        .is_some_and(|o| o.iter().any(|x| x.as_str() == Some("ro")));
                    out.mounts.retain(|(p, _, _)| p != container);
                    out.mounts
                        .push((container.to_owned(), host.to_owned(), read_only));
                }
            }
            "hooks" | "intelRdt" | "netDevices" if !items.is_empty() || v.is_object() => {
                return Err(RuntimeError::Cdi(format!(
                    "{device} in {spec_path} asks for {field}, which the CRI cannot carry; \
                     use a runtime that applies CDI itself (containerd 1.7+ with enable_cdi)"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, name: &str, body: &str) {
        std::fs::write(dir.join(name), body).expect("write spec");
    }

    #[test]
    fn resolves_env_device_nodes_and_mounts_of_named_devices() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "gpu.json",
            r#"{"cdiVersion":"0.6.0","kind":"gpu.example.com/device",
                "containerEdits":{"env":["SHARED=1"]},
                "devices":[
                  {"name":"a","containerEdits":{"env":["GPU=a"],
                     "deviceNodes":[{"path":"/dev/gpu-a","hostPath":"/dev/null","permissions":"rw"}],
                     "mounts":[{"hostPath":"/tmp","containerPath":"/gpu-a","options":["ro","bind"]}]}},
                  {"name":"b","containerEdits":{"env":["GPU=b"]}}]}"#,
        );
        let resolver = CdiResolver::new(vec![dir.path().display().to_string()]);
        let edits = resolver
            .resolve(&[
                "gpu.example.com/device=a".to_owned(),
                "gpu.example.com/device=b".to_owned(),
            ])
            .expect("resolve");
        assert_eq!(
            edits.env,
            vec![
                ("SHARED".to_owned(), "1".to_owned()),
                ("GPU".to_owned(), "b".to_owned())
            ]
        );
        assert_eq!(
            edits.device_nodes,
            vec![(
                "/dev/gpu-a".to_owned(),
                "/dev/null".to_owned(),
                "rw".to_owned()
            )]
        );
        assert_eq!(
            edits.mounts,
            vec![("/gpu-a".to_owned(), "/tmp".to_owned(), true)]
        );
    }

    #[test]
    fn an_unknown_device_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let resolver = CdiResolver::new(vec![dir.path().display().to_string()]);
        let err = resolver
            .resolve(&["vendor.com/x=nope".to_owned()])
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("vendor.com/x=nope"), "{err}");
        assert_eq!(resolver.resolve(&[]).expect("nothing"), CdiEdits::default());
    }
}
