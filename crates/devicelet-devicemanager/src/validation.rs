//! Registration input checks, following `dm/plugin/v1beta1/server.go` (`Register`) and
//! `IsExtendedResourceName` from `pkg/apis/core/helper/helpers.go` with the qualified-name rules
//! of `k8s.io/apimachinery/pkg/util/validation`.
//!
//! The endpoint check is ours: upstream joins `endpoint` with the device-plugin directory
//! unchecked, so `../x` escapes it (spec §1.2). We require a plain file name.

use crate::error::RegistrationError;
use crate::types::DEVICE_PLUGIN_API_VERSION;

const DNS1123_SUBDOMAIN_MAX: usize = 253;
const QUALIFIED_NAME_MAX: usize = 63;

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
