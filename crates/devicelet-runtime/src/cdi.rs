//! CDI device names resolved by devicelet for runtimes that do not apply CDI themselves
//! (containerd before 1.7 ignores the CRI `CDIDevices` field): the spec files are read and
//! checked by the `container-device-interface` crate (CDI `pkg/cdi` `Cache`), and the
//! edits of each named device (env, device nodes, mounts) become plain CRI fields.
//!
//! Hooks and `intelRdt` edits have no CRI field: a device that needs them is refused with a
//! clear error rather than started half-configured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use container_device_interface::cache::{Cache, with_auto_refresh};
use container_device_interface::spec_dirs::with_spec_dirs;
use serde::Serialize;
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

/// The spec directories devicelet reads by default: the CDI standard's `/etc/cdi` and
/// `/var/run/cdi`, then the root's own `R/cdi`, where devicelet's example plugin and example
/// DRA driver write their specs (a later directory wins for the same device).
pub fn default_spec_dirs(root: &Path) -> Vec<String> {
    vec![
        "/etc/cdi".to_owned(),
        "/var/run/cdi".to_owned(),
        root.join("cdi").display().to_string(),
    ]
}

/// The spec directories given on the command line, else [`default_spec_dirs`].
pub fn spec_dirs(root: &Path, given: &[PathBuf]) -> Vec<String> {
    if given.is_empty() {
        default_spec_dirs(root)
    } else {
        given.iter().map(|d| d.display().to_string()).collect()
    }
}

/// What [`CdiResolver::check`] found: each name resolved by its spec file or not, and every
/// spec file the CDI library refused, with its error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiCheck {
    /// The directories read, in priority order (later wins).
    pub dirs: Vec<String>,
    /// Each resolved name → the spec file that defines it.
    pub resolved: BTreeMap<String, String>,
    /// Names no valid spec defines.
    pub unresolved: Vec<String>,
    /// Spec files the CDI library could not read or validate → its error.
    pub invalid_specs: BTreeMap<String, String>,
}

impl CdiCheck {
    /// Whether every name resolved.
    pub fn ok(&self) -> bool {
        self.unresolved.is_empty()
    }
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

    /// Resolves `names` spec file by spec file, so that one bad file neither hides the others
    /// nor goes unreported (the cache refuses all specs when one is invalid): each file is read
    /// and validated with the CDI library (`read_spec`), a later directory winning for a
    /// device defined twice, as in the CDI cache.
    pub fn check(&self, names: &[String]) -> CdiCheck {
        let mut out = CdiCheck {
            dirs: self.dirs.clone(),
            ..CdiCheck::default()
        };
        let mut defined: BTreeMap<String, String> = BTreeMap::new();
        for (priority, dir) in self.dirs.iter().enumerate() {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.extension()
                        .is_some_and(|e| e == "json" || e == "yaml" || e == "yml")
                })
                .collect();
            files.sort();
            for file in files {
                let priority = i32::try_from(priority).unwrap_or(i32::MAX);
                match container_device_interface::spec::read_spec(&file, priority) {
                    Ok(spec) => {
                        for device in spec.get_devices().values() {
                            defined.insert(device.get_qualified_name(), file.display().to_string());
                        }
                    }
                    Err(e) => {
                        out.invalid_specs
                            .insert(file.display().to_string(), format!("{e:#}"));
                    }
                }
            }
        }
        for name in names {
            match defined.get(name) {
                Some(file) => {
                    out.resolved.insert(name.clone(), file.clone());
                }
                None => out.unresolved.push(name.clone()),
            }
        }
        out
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

#[cfg(test)]
mod check_tests {
    use super::*;

    #[test]
    fn check_names_the_spec_of_each_device_and_every_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("example.com-gpu.json");
        std::fs::write(
            &good,
            r#"{"cdiVersion":"0.6.0","kind":"example.com/gpu","devices":[{"name":"gpu-0","containerEdits":{"env":["A=0"]}}]}"#,
        )
        .unwrap();
        let bad = dir.path().join("broken.yaml");
        std::fs::write(&bad, "cdiVersion: \"0.6.0\"\nkind: nokind\ndevices: []\n").unwrap();
        let resolver = CdiResolver::new(vec![
            "/nonexistent-cdi-dir".into(),
            dir.path().display().to_string(),
        ]);
        let names = [
            "example.com/gpu=gpu-0".to_owned(),
            "example.com/gpu=gpu-9".to_owned(),
        ];
        let check = resolver.check(&names);
        assert_eq!(
            check.resolved.get("example.com/gpu=gpu-0"),
            Some(&good.display().to_string())
        );
        assert_eq!(check.unresolved, vec!["example.com/gpu=gpu-9".to_owned()]);
        assert!(!check.ok());
        let why = check.invalid_specs.get(&bad.display().to_string()).unwrap();
        assert!(!why.is_empty(), "{check:?}");
    }
}
