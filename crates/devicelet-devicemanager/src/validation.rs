//! Registration input checks, following `dm/plugin/v1beta1/server.go` (`Register`) and
//! `IsExtendedResourceName` from `pkg/apis/core/helper/helpers.go` with the qualified-name rules
//! of `k8s.io/apimachinery/pkg/util/validation`.
//!
//! The endpoint check is ours: upstream joins `endpoint` with the device-plugin directory
//! unchecked, so `../x` escapes it (spec §1.2). We require a plain file name.
//!
//! So are the size bounds on what a plugin sends ([`validate_snapshot`]): upstream accepts any
//! device ID and any number of devices that fit into a gRPC message. A snapshot beyond a bound
//! is refused as a whole and its stream closed, as an oversized message closes it upstream. The
//! message-size bounds live with the gRPC client (`devicelet-rpc` `plugin_client`).

use crate::error::{PluginError, RegistrationError};
use crate::types::{DEVICE_PLUGIN_API_VERSION, Device};

const DNS1123_SUBDOMAIN_MAX: usize = 253;
const QUALIFIED_NAME_MAX: usize = 63;

/// Longest device ID accepted from a plugin, in bytes. Real IDs are short: NVIDIA GPU and MIG
/// UUIDs are at most ~60 bytes, PCI addresses 12, smarter-device-manager and
/// generic-device-plugin names a few dozen. An ID is copied into every `Allocate` request, the
/// checkpoint, PodResources answers and `get resources`, so a 64 KB ID costs everywhere.
/// 4096 is `PATH_MAX`: even an ID that is a device path fits.
pub const MAX_DEVICE_ID_BYTES: usize = 4096;

/// Most devices one resource may advertise in a `ListAndWatch` snapshot. Upstream's bound is
/// implicit: gRPC's 4 MiB default message size, about 100 000 devices with short IDs (more
/// breaks the stream, spec §1.9). Real plugins advertise at most a few thousand (SR-IOV VFs,
/// GPU shares, one device per GiB of GPU memory); 2^18 is 2.6 times what fits through the
/// kubelet and bounds what one plugin can make devicelet hold and rescan on every update.
pub const MAX_DEVICES_PER_RESOURCE: usize = 262_144;

/// Most NUMA node entries (`TopologyInfo.nodes`) all devices of one snapshot may list together:
/// four per device at the most devices we accept. A real device names one NUMA node, rarely
/// two. Protobuf encodes an entry in 2 bytes, so without a bound a 64 MiB message would decode
/// into 33 million of them (~0.5 GB with their copies).
pub const MAX_NUMA_NODES_PER_SNAPSHOT: usize = 4 * MAX_DEVICES_PER_RESOURCE;

/// How much of an oversized ID an error shows (escaped): enough to find the device.
const SHOWN_ID_CHARS: usize = 32;

/// Checks the API version exactly as the kubelet does.
pub fn validate_version(version: &str) -> Result<(), RegistrationError> {
    if version == DEVICE_PLUGIN_API_VERSION {
        Ok(())
    } else {
        Err(RegistrationError::UnsupportedVersion {
            version: version.to_owned(),
        })
    }
}

/// True when `name` is a valid extended resource name (`IsExtendedResourceName`): it contains a
/// `/`, is not in the `kubernetes.io/` namespace, does not start with `requests.`, and
/// `requests.<name>` is a qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    is_qualified_name(&format!("requests.{name}"))
}

/// Returns an error naming the resource when it is not an extended resource name.
pub fn validate_resource_name(name: &str) -> Result<(), RegistrationError> {
    if is_extended_resource_name(name) {
        Ok(())
    } else {
        Err(RegistrationError::InvalidResourceName {
            resource: name.to_owned(),
        })
    }
}

/// The endpoint must be a plain file name inside the device-plugin directory.
pub fn validate_endpoint(endpoint: &str) -> Result<(), RegistrationError> {
    let reason = if endpoint.is_empty() {
        Some("it is empty")
    } else if endpoint.contains('/') {
        Some("it contains '/'; it must be a file name inside the device-plugin directory")
    } else if endpoint == "." || endpoint == ".." || endpoint.contains("..") {
        Some("it contains '..'")
    } else if endpoint.contains('\0') {
        Some("it contains a NUL byte")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(RegistrationError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
            reason,
        }),
    }
}

/// Checks a `ListAndWatch` snapshot against [`MAX_DEVICES_PER_RESOURCE`] and
/// [`MAX_DEVICE_ID_BYTES`]; the error names the bound and what exceeded it.
pub fn validate_snapshot(devices: &[Device]) -> Result<(), PluginError> {
    if devices.len() > MAX_DEVICES_PER_RESOURCE {
        return Err(too_many_devices(devices.len()));
    }
    let numa_nodes: usize = devices
        .iter()
        .map(|d| d.numa_nodes.as_ref().map_or(0, Vec::len))
        .sum();
    if numa_nodes > MAX_NUMA_NODES_PER_SNAPSHOT {
        return Err(too_many_numa_nodes(numa_nodes));
    }
    match devices.iter().find(|d| d.id.len() > MAX_DEVICE_ID_BYTES) {
        None => Ok(()),
        Some(device) => Err(PluginError::OverLimit {
            what: format!("device ID {}", shown_id(&device.id)),
            found: device.id.len(),
            limit: MAX_DEVICE_ID_BYTES,
            unit: "bytes",
        }),
    }
}

/// The error for a snapshot of `count` devices, more than [`MAX_DEVICES_PER_RESOURCE`] (also
/// raised by the gRPC client, which counts before it decodes).
pub fn too_many_devices(count: usize) -> PluginError {
    PluginError::OverLimit {
        what: "ListAndWatch snapshot".to_owned(),
        found: count,
        limit: MAX_DEVICES_PER_RESOURCE,
        unit: "devices",
    }
}

/// The error for a snapshot listing `count` NUMA node entries, more than
/// [`MAX_NUMA_NODES_PER_SNAPSHOT`] (also raised by the gRPC client before decoding).
pub fn too_many_numa_nodes(count: usize) -> PluginError {
    PluginError::OverLimit {
        what: "ListAndWatch snapshot".to_owned(),
        found: count,
        limit: MAX_NUMA_NODES_PER_SNAPSHOT,
        unit: "NUMA node entries",
    }
}

/// The start of an ID, quoted and escaped: plugin data is not terminal input.
fn shown_id(id: &str) -> String {
    let mut shown: String = id
        .chars()
        .take(SHOWN_ID_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if id.chars().nth(SHOWN_ID_CHARS).is_some() {
        shown.push_str("...");
    }
    format!("\"{shown}\"")
}

/// `IsQualifiedName`: an optional DNS-1123 subdomain prefix and `/`, then a name of 1-63
/// characters matching `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
fn is_qualified_name(value: &str) -> bool {
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) {
                return false;
            }
            *name
        }
        _ => return false,
    };
    if name.is_empty() || name.len() > QUALIFIED_NAME_MAX {
        return false;
    }
    let bytes = name.as_bytes();
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let first_last_ok =
        bytes.first().is_some_and(|b| alnum(*b)) && bytes.last().is_some_and(|b| alnum(*b));
    first_last_ok
        && bytes
            .iter()
            .all(|b| alnum(*b) || *b == b'-' || *b == b'_' || *b == b'.')
}

/// DNS-1123 subdomain: at most 253 characters, lower-case alphanumerics, `-` and `.`, each
/// dot-separated label starting and ending with an alphanumeric.
fn is_dns1123_subdomain(value: &str) -> bool {
    if value.is_empty() || value.len() > DNS1123_SUBDOMAIN_MAX {
        return false;
    }
    value.split('.').all(|label| {
        let bytes = label.as_bytes();
        let ok_edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        !bytes.is_empty()
            && bytes.first().is_some_and(ok_edge)
            && bytes.last().is_some_and(ok_edge)
            && bytes.iter().all(|b| ok_edge(b) || *b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names_follow_kubelet_rules() {
        for ok in [
            "example.com/gpu",
            "nvidia.com/gpu",
            "a.b/c_d.e-f",
            "vendor-1.io/X",
            "example.com/a",
        ] {
            assert!(is_extended_resource_name(ok), "{ok} should be valid");
        }
        for bad in [
            "gpu",
            "kubernetes.io/gpu",
            "foo.kubernetes.io/gpu",
            "requests.example.com/gpu",
            "Example.com/gpu",
            "example.com/gpu/extra",
            "example.com/",
            "/gpu",
            "example.com/-gpu",
            "example.com/gpu-",
            "example..com/gpu",
            "",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad} should be invalid");
        }
        let long_name = format!("example.com/{}", "a".repeat(64));
        assert!(!is_extended_resource_name(&long_name));
        let max_name = format!("example.com/{}", "a".repeat(63));
        assert!(is_extended_resource_name(&max_name));
    }

    #[test]
    fn a1_version_must_be_v1beta1_with_kubelet_error_text() {
        assert!(validate_version("v1beta1").is_ok());
        let err = validate_version("v1alpha").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
            )
        );
    }

    #[test]
    fn snapshots_beyond_the_bounds_are_refused_with_the_bound_named() {
        let ok = vec![Device::healthy("a".repeat(MAX_DEVICE_ID_BYTES)); 3];
        assert!(validate_snapshot(&ok).is_ok());
        let long = vec![
            Device::healthy("ok"),
            Device::healthy(format!("\u{1b}[2J{}", "x".repeat(64 * 1024))),
        ];
        let err = validate_snapshot(&long).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "device ID \"\\u{1b}[2Jxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\" has 65540 bytes, \
                 more than devicelet's limit of 4096"
            )
        );
        let many = vec![Device::healthy("d"); MAX_DEVICES_PER_RESOURCE + 1];
        let err = validate_snapshot(&many).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("ListAndWatch snapshot has 262145 devices, more than devicelet's limit of 262144")
        );
        assert!(validate_snapshot(&many[1..]).is_ok());
        let wide = vec![Device::healthy("w").on_numa(0..1025); 1024];
        let err = validate_snapshot(&wide).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "ListAndWatch snapshot has 1049600 NUMA node entries, more than devicelet's limit of 1048576"
            )
        );
    }

    #[test]
    fn endpoint_must_be_a_plain_file_name() {
        assert!(validate_endpoint("gpu.sock").is_ok());
        assert!(validate_endpoint("nvidia-gpu.sock").is_ok());
        for bad in ["", "../x", "/abs/path.sock", "a/b.sock", "..", ".", "x..y"] {
            let err = validate_endpoint(bad);
            assert!(
                matches!(err, Err(RegistrationError::InvalidEndpoint { .. })),
                "{bad:?} should be rejected"
            );
        }
    }
}
