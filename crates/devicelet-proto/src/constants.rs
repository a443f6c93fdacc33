//! Well-known constants of the kubelet plugin APIs, with the values of Kubernetes 1.36:
//! `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go`,
//! `pluginregistration/v1/constants.go`, `dra/v1/types.go`, `dra/v1beta1/types.go`
//! (spec `devicemanager.md` §1.3, §5.1 and `dra-kubelet.md` §1.1, §1.5, §1.13).
//!
//! The absolute paths here are the upstream defaults; devicelet itself derives its socket paths
//! from `--root-dir` (see [`device_plugin_dir`] and friends).

use std::path::{Path, PathBuf};

/// Device plugin API (`deviceplugin/v1beta1`).
pub mod deviceplugin {
    use std::time::Duration;

    /// The only device plugin API version the kubelet accepts in `RegisterRequest.version`.
    pub const VERSION: &str = "v1beta1";
    /// All accepted device plugin API versions (the kubelet's `SupportedVersions`).
    pub const SUPPORTED_VERSIONS: &[&str] = &[VERSION];
    /// Health value of a usable device. Any other string, including `""` and `"healthy"`,
    /// means unhealthy.
    pub const HEALTHY: &str = "Healthy";
    /// Health value of an unusable device.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// Default device plugin directory (with trailing slash, as upstream).
    pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
    /// File name of the registration socket inside the device plugin directory.
    pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";
    /// Default absolute path of the registration socket.
    pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
    /// Windows variant of [`DEVICE_PLUGIN_PATH`].
    pub const DEVICE_PLUGIN_PATH_WINDOWS: &str = "\\var\\lib\\kubelet\\device-plugins\\";
    /// Windows variant of [`KUBELET_SOCKET`].
    pub const KUBELET_SOCKET_WINDOWS: &str = "\\var\\lib\\kubelet\\device-plugins\\kubelet.sock";
    /// Timeout of one `PreStartContainer` RPC, in seconds.
    pub const KUBELET_PRE_START_CONTAINER_RPC_TIMEOUT_SECS: u64 = 30;
    /// [`KUBELET_PRE_START_CONTAINER_RPC_TIMEOUT_SECS`] as a duration.
    pub const PRE_START_CONTAINER_RPC_TIMEOUT: Duration =
        Duration::from_secs(KUBELET_PRE_START_CONTAINER_RPC_TIMEOUT_SECS);
    /// Timeout the kubelet uses when dialing a plugin socket.
    pub const PLUGIN_DIAL_TIMEOUT: Duration = Duration::from_secs(10);
    /// How long a disconnected plugin's resource is kept before it is removed.
    pub const ENDPOINT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);
    /// `:authority` the kubelet sends when it dials a plugin (k8s PR #112597).
    pub const PLUGIN_CLIENT_AUTHORITY: &str = "localhost";
    /// Name of the kubelet's device checkpoint file inside the device plugin directory.
    pub const CHECKPOINT_FILE_NAME: &str = "kubelet_internal_checkpoint";
    /// Marker file that makes stub-based plugins skip `Register`; never create it.
    pub const DEPRECATION_FILE_NAME: &str = "DEPRECATION";
}

/// Plugin watcher registration (`pluginregistration/v1`).
pub mod pluginregistration {
    use std::time::Duration;

    /// `PluginInfo.type` of a CSI plugin.
    pub const CSI_PLUGIN: &str = "CSIPlugin";
    /// `PluginInfo.type` of a device plugin registering through the plugin watcher.
    pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    /// `PluginInfo.type` of a DRA driver.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
    /// Directory name of the plugin watcher under the root directory.
    pub const PLUGINS_REGISTRY_DIR_NAME: &str = "plugins_registry";
    /// Directory name where drivers put their service sockets by convention.
    pub const PLUGINS_DIR_NAME: &str = "plugins";
    /// Dial timeout for a registration socket.
    pub const REGISTRATION_DIAL_TIMEOUT: Duration = Duration::from_secs(10);
    /// Timeout of the `GetInfo` call.
    pub const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
    /// Timeout of the `NotifyRegistrationStatus` call.
    pub const NOTIFY_REGISTRATION_STATUS_TIMEOUT: Duration = Duration::from_secs(5);
    /// Reconciler period of the plugin manager.
    pub const RECONCILE_PERIOD: Duration = Duration::from_secs(1);
}

/// DRA kubelet-plugin API (`dra/v1`, `dra/v1beta1`, `dra-health/v1alpha1`). The DRA service
/// names, the call deadline and the health message limit are the DRA manager's
/// (`devicelet_dra::{V1_DRA_PLUGIN_SERVICE, DRA_RPC_TIMEOUT, HEALTH_MESSAGE_MAX_LENGTH}`).
pub mod dra {
    use std::time::Duration;

    /// `supported_versions` entry of a driver serving the health API.
    pub const V1ALPHA1_DRA_RESOURCE_HEALTH_SERVICE: &str = "v1alpha1.DRAResourceHealth";
    /// Default device health timeout when a driver sends `<= 0`.
    pub const DEFAULT_HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
    /// Name of the DRA claim-cache checkpoint file in the root directory.
    pub const CLAIM_CHECKPOINT_FILE_NAME: &str = "dra_manager_state";
    /// Name of the DRA health checkpoint file in the root directory.
    pub const HEALTH_CHECKPOINT_FILE_NAME: &str = "dra_health_state";
}

/// PodResources API.
pub mod podresources {
    /// Directory name of the PodResources socket under the root directory.
    pub const POD_RESOURCES_DIR_NAME: &str = "pod-resources";
    /// File name of the PodResources socket.
    pub const SOCKET_NAME: &str = "kubelet.sock";
    /// Token-bucket rate of the PodResources server (queries per second).
    pub const RATE_LIMIT_QPS: u32 = 100;
    /// Token-bucket burst of the PodResources server.
    pub const RATE_LIMIT_BURST: u32 = 10;
    /// gRPC message of a rate-limited call (status `ResourceExhausted`).
    pub const RATE_LIMIT_MESSAGE: &str = "rejected by rate limit";
}

/// Default kubelet root directory.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";

/// Default maximum gRPC message size a Go client or server accepts (4 MiB).
pub const GRPC_DEFAULT_MAX_RECV_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// `R/device-plugins`: the device plugin directory under a root directory.
pub fn device_plugin_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("device-plugins")
}

/// `R/device-plugins/kubelet.sock`: the device plugin registration socket.
pub fn kubelet_socket(root_dir: &Path) -> PathBuf {
    device_plugin_dir(root_dir).join(deviceplugin::KUBELET_SOCKET_NAME)
}

/// `R/plugins_registry`: the plugin watcher directory.
pub fn plugins_registry_dir(root_dir: &Path) -> PathBuf {
    root_dir.join(pluginregistration::PLUGINS_REGISTRY_DIR_NAME)
}

/// `R/plugins`: where drivers put their service sockets by convention.
pub fn plugins_dir(root_dir: &Path) -> PathBuf {
    root_dir.join(pluginregistration::PLUGINS_DIR_NAME)
}

/// `R/pod-resources/kubelet.sock`: the PodResources socket.
pub fn pod_resources_socket(root_dir: &Path) -> PathBuf {
    root_dir
        .join(podresources::POD_RESOURCES_DIR_NAME)
        .join(podresources::SOCKET_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_socket_constant_is_plugin_path_plus_socket_name() {
        assert_eq!(
            deviceplugin::KUBELET_SOCKET,
            format!(
                "{}{}",
                deviceplugin::DEVICE_PLUGIN_PATH,
                deviceplugin::KUBELET_SOCKET_NAME
            )
        );
        assert_eq!(
            deviceplugin::KUBELET_SOCKET_WINDOWS,
            format!(
                "{}{}",
                deviceplugin::DEVICE_PLUGIN_PATH_WINDOWS,
                deviceplugin::KUBELET_SOCKET_NAME
            )
        );
    }

    #[test]
    fn default_root_dir_paths_match_upstream_defaults() {
        let root = Path::new(DEFAULT_ROOT_DIR);
        assert_eq!(
            kubelet_socket(root),
            Path::new(deviceplugin::KUBELET_SOCKET)
        );
        assert_eq!(
            pod_resources_socket(root),
            Path::new("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(
            plugins_registry_dir(root),
            Path::new("/var/lib/kubelet/plugins_registry")
        );
    }
}
