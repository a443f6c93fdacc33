//! CDI spec files of the example DRA driver (Container Device Interface spec v1.0.0,
//! `cncf-tags/container-device-interface` `SPEC.md` and `schema/schema.json`): one file per
//! prepared claim, named after the claim UID so a CDI device ID is never reused (as the
//! kubeletplugin docs recommend), and the checks the CDI schema and name rules impose.

use container_device_interface::specs::config::Spec as CdiSpec;
use serde_json::{Value, json};

/// CDI version written.
pub const CDI_VERSION: &str = "1.0.0";

/// One device of a claim to put into the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiDevice {
    /// CDI device name (unique in the spec).
    pub name: String,
    /// `KEY=VALUE` environment entries.
    pub env: Vec<String>,
    /// Device nodes: (path in the container, host path).
    pub device_nodes: Vec<(String, String)>,
}

/// The spec kind of a driver: `<driver>/device` (the driver name is a DNS-like vendor).
pub fn kind(driver: &str) -> String {
    format!("{driver}/device")
}

/// Fully-qualified CDI device ID `vendor/class=name`.
pub fn qualified(driver: &str, device: &str) -> String {
    format!("{}={device}", kind(driver))
}

/// The spec file name of a claim (`<driver>-<claimUID>.json`).
pub fn file_name(driver: &str, claim_uid: &str) -> String {
    format!("{driver}-{claim_uid}.json")
}

/// The spec document of a driver's devices (kind `<driver>/device`).
pub fn spec(driver: &str, devices: &[CdiDevice]) -> Value {
    spec_of(&kind(driver), devices)
}

/// The spec document of devices of CDI kind `kind` (`vendor/class`).
pub fn spec_of(kind: &str, devices: &[CdiDevice]) -> Value {
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": devices.iter().map(|d| {
            let mut edits = json!({"env": d.env});
            if !d.device_nodes.is_empty() {
                edits["deviceNodes"] = d.device_nodes.iter()
                    .map(|(path, host)| json!({"path": path, "hostPath": host}))
                    .collect();
            }
            json!({"name": d.name, "containerEdits": edits})
        }).collect::<Vec<_>>(),
    })
}

/// Whether `driver` can be a CDI vendor (`vendor/class` kinds are checked by the CDI library).
pub fn valid_vendor(driver: &str) -> bool {
    let probe = CdiDevice {
        name: "probe".to_owned(),
        env: vec!["PROBE=1".to_owned()],
        device_nodes: Vec::new(),
    };
    validate(&spec(driver, &[probe])).is_empty()
}

/// Checks a spec document as a CDI runtime would load it, with the CDI library
/// (`container-device-interface`, the Rust port of `cncf-tags/container-device-interface`):
/// its JSON schema, version rules, `vendor/class` kind and device names (valid, unique).
/// Returns the violations (empty when the spec loads).
pub fn validate(spec: &Value) -> Vec<String> {
    let raw: CdiSpec = match serde_json::from_value(spec.clone()) {
        Ok(raw) => raw,
        Err(e) => return vec![format!("not a CDI spec: {e}")],
    };
    // The library wants the file's path (kept for messages); nothing is read from it.
    let path = std::path::PathBuf::from("/cdi/spec.json");
    match container_device_interface::spec::new_spec(&raw, &path, 0) {
        Ok(_) => Vec::new(),
        Err(e) => vec![format!("{e:#}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdi_spec_of_a_claim_validates() {
        let s = spec(
            "gpu.example.com",
            &[CdiDevice {
                name: "0a1b-gpu-0".into(),
                env: vec!["EXAMPLE_GPU=gpu-0".into()],
                device_nodes: vec![("/dev/example-dra-gpu-0".into(), "/dev/null".into())],
            }],
        );
        assert_eq!(validate(&s), Vec::<String>::new());
        assert_eq!(
            qualified("gpu.example.com", "0a1b-gpu-0"),
            "gpu.example.com/device=0a1b-gpu-0"
        );
    }

    #[test]
    fn cdi_validation_rejects_each_violation() {
        let good = json!({"cdiVersion": "1.0.0", "kind": "a.b/c",
                          "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}]});
        assert_eq!(validate(&good), Vec::<String>::new());
        let cases: [(&str, Value); 7] = [
            (
                "extra top-level property",
                json!({"cdiVersion": "1.0.0", "kind": "a.b/c", "extra": 1,
                "devices": [{"name": "d", "containerEdits": {}}]}),
            ),
            (
                "bad version",
                json!({"cdiVersion": "1.0", "kind": "a.b/c",
                "devices": [{"name": "d", "containerEdits": {}}]}),
            ),
            (
                "bad kind",
                json!({"cdiVersion": "1.0.0", "kind": "-bad/class",
                "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}]}),
            ),
            (
                "device node without path",
                json!({"cdiVersion": "1.0.0", "kind": "a.b/c",
                "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{}]}}]}),
            ),
            (
                "duplicate names",
                json!({"cdiVersion": "1.0.0", "kind": "a.b/c",
                "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}},
                            {"name": "d", "containerEdits": {"env": ["A=1"]}}]}),
            ),
            (
                "invalid device name",
                json!({"cdiVersion": "1.0.0", "kind": "a.b/c",
                "devices": [{"name": "-x", "containerEdits": {"env": ["A=1"]}}]}),
            ),
            (
                "no devices",
                json!({"cdiVersion": "1.0.0", "kind": "a.b/c", "devices": []}),
            ),
        ];
        for (what, spec) in cases {
            assert!(!validate(&spec).is_empty(), "{what} was accepted");
        }
        assert!(valid_vendor("gpu.example.com"));
        assert!(!valid_vendor("-gpu"));
    }
}
