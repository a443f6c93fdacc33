//! CDI spec files of the example DRA driver (Container Device Interface spec v1.0.0,
//! `cncf-tags/container-device-interface` `SPEC.md` and `schema/schema.json`): one file per
//! prepared claim, named after the claim UID so a CDI device ID is never reused (as the
//! kubeletplugin docs recommend), and the checks the CDI schema and name rules impose.

use std::collections::BTreeSet;

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

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// Vendor part of a kind (CDI `ValidateVendorName`): starts with a letter, ends with a letter
/// or digit, and contains only letters, digits, `_`, `.` and `-`.
pub fn valid_vendor(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().last().is_some_and(is_alnum)
        && s.chars()
            .all(|c| is_alnum(c) || matches!(c, '_' | '.' | '-'))
}

/// Class part of a kind (CDI `ValidateClassName`): starts with a letter, ends with a letter or
/// digit, and contains only letters, digits, `_` and `-`.
pub fn valid_class(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().last().is_some_and(is_alnum)
        && s.chars().all(|c| is_alnum(c) || matches!(c, '_' | '-'))
}

/// Device name (CDI `ValidateDeviceName`): starts and ends with a letter or digit, and contains
/// only letters, digits, `_`, `-`, `.` and `:`.
pub fn valid_device_name(s: &str) -> bool {
    s.chars().next().is_some_and(is_alnum)
        && s.chars().last().is_some_and(is_alnum)
        && s.chars()
            .all(|c| is_alnum(c) || matches!(c, '_' | '-' | '.' | ':'))
}

/// Checks a spec document against the constraints of the CDI JSON schema
/// (`schema/schema.json`, v1.0.0) and the name rules of `SPEC.md`; returns every violation.
///
/// Schema constraints checked: the top level is an object with required `cdiVersion` (a
/// semantic version string), `kind` and `devices`, and no properties beyond `cdiVersion`,
/// `kind`, `annotations`, `devices`, `containerEdits`; `devices` is a non-empty array of
/// objects with required `name` and `containerEdits` and no properties beyond `name`,
/// `annotations`, `containerEdits`; `containerEdits` objects only have `env` (array of
/// `KEY=VALUE` strings), `deviceNodes` (objects with a required `path`), `hooks` (objects with
/// required `hookName` and `path`), `mounts` (objects with required `hostPath` and
/// `containerPath`), `intelRdt`, `additionalGIDs`; `annotations` map strings to strings.
/// SPEC.md rules: `kind` is `vendor/class` with valid names, device names are valid and unique.
pub fn validate(spec: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(top) = spec.as_object() else {
        return vec!["spec is not a JSON object".to_owned()];
    };
    for k in top.keys() {
        if ![
            "cdiVersion",
            "kind",
            "annotations",
            "devices",
            "containerEdits",
        ]
        .contains(&k.as_str())
        {
            errors.push(format!("unknown top-level property {k:?}"));
        }
    }
    match top.get("cdiVersion").and_then(Value::as_str) {
        None => errors.push("cdiVersion is required and must be a string".to_owned()),
        Some(v) => {
            let parts: Vec<&str> = v.split('.').collect();
            if parts.len() != 3
                || parts
                    .iter()
                    .any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit()))
            {
                errors.push(format!("cdiVersion {v:?} is not a semantic version"));
            }
        }
    }
    match top.get("kind").and_then(Value::as_str) {
        None => errors.push("kind is required and must be a string".to_owned()),
        Some(k) => match k.split_once('/') {
            Some((vendor, class)) if valid_vendor(vendor) && valid_class(class) => {}
            _ => errors.push(format!("kind {k:?} is not vendor/class")),
        },
    }
    if let Some(a) = top.get("annotations") {
        check_annotations(a, "annotations", &mut errors);
    }
    if let Some(e) = top.get("containerEdits") {
        check_edits(e, "containerEdits", &mut errors);
    }
    match top.get("devices").and_then(Value::as_array) {
        None => errors.push("devices is required and must be an array".to_owned()),
        Some(devices) if devices.is_empty() => errors.push("devices is empty".to_owned()),
        Some(devices) => {
            let mut names = BTreeSet::new();
            for (i, d) in devices.iter().enumerate() {
                let at = format!("devices[{i}]");
                let Some(obj) = d.as_object() else {
                    errors.push(format!("{at} is not an object"));
                    continue;
                };
                for k in obj.keys() {
                    if !["name", "annotations", "containerEdits"].contains(&k.as_str()) {
                        errors.push(format!("{at}: unknown property {k:?}"));
                    }
                }
                match obj.get("name").and_then(Value::as_str) {
                    None => errors.push(format!("{at}.name is required")),
                    Some(n) if !valid_device_name(n) => {
                        errors.push(format!("{at}.name {n:?} is not a valid device name"));
                    }
                    Some(n) => {
                        if !names.insert(n.to_owned()) {
                            errors.push(format!("{at}.name {n:?} is not unique"));
                        }
                    }
                }
                match obj.get("containerEdits") {
                    None => errors.push(format!("{at}.containerEdits is required")),
                    Some(e) => check_edits(e, &format!("{at}.containerEdits"), &mut errors),
                }
                if let Some(a) = obj.get("annotations") {
                    check_annotations(a, &format!("{at}.annotations"), &mut errors);
                }
            }
        }
    }
    errors
}

fn check_annotations(a: &Value, at: &str, errors: &mut Vec<String>) {
    match a.as_object() {
        Some(m) if m.values().all(Value::is_string) => {}
        _ => errors.push(format!("{at} must map strings to strings")),
    }
}

fn check_edits(e: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(obj) = e.as_object() else {
        errors.push(format!("{at} is not an object"));
        return;
    };
    for (k, v) in obj {
        let required: &[&str] = match k.as_str() {
            "env" => {
                let ok = v.as_array().is_some_and(|l| {
                    l.iter().all(|x| {
                        x.as_str()
                            .and_then(|s| s.split_once('='))
                            .is_some_and(|(key, _)| !key.is_empty())
                    })
                });
                if !ok {
                    errors.push(format!("{at}.env must be an array of KEY=VALUE strings"));
                }
                continue;
            }
            "deviceNodes" => &["path"],
            "hooks" => &["hookName", "path"],
            "mounts" => &["hostPath", "containerPath"],
            "intelRdt" | "additionalGIDs" => continue,
            other => {
                errors.push(format!("{at}: unknown property {other:?}"));
                continue;
            }
        };
        let Some(items) = v.as_array() else {
            errors.push(format!("{at}.{k} must be an array"));
            continue;
        };
        for (i, item) in items.iter().enumerate() {
            for r in required {
                if item.get(r).and_then(Value::as_str).is_none() {
                    errors.push(format!("{at}.{k}[{i}].{r} is required"));
                }
            }
        }
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
    fn cdi_validation_rejects_schema_violations() {
        let bad = json!({
            "cdiVersion": "1.0",
            "kind": "-bad/class",
            "extra": 1,
            "devices": [
                {"name": "a", "containerEdits": {"env": ["NOEQUALS"], "deviceNodes": [{}]}},
                {"name": "a", "containerEdits": {}},
                {"name": "-x", "containerEdits": {"bogus": []}},
                {"containerEdits": {}}
            ]
        });
        let errors = validate(&bad);
        for needle in [
            "unknown top-level property \"extra\"",
            "cdiVersion \"1.0\"",
            "kind \"-bad/class\"",
            "env must be an array",
            "deviceNodes[0].path is required",
            "\"a\" is not unique",
            "\"-x\" is not a valid device name",
            "unknown property \"bogus\"",
            "devices[3].name is required",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(needle)),
                "{needle}: {errors:?}"
            );
        }
        assert!(
            !validate(&json!({"cdiVersion": "1.0.0", "kind": "a.b/c", "devices": []})).is_empty()
        );
    }
}
