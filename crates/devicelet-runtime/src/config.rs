//! A pod's CRI configs (pure): the sandbox config and each container's config with what the
//! pod spec asks for plus what devicelet decided (device plugin settings, CDI devices, the
//! exclusive CPUs). Follows the kubelet's `pkg/kubelet/kuberuntime` `kuberuntime_sandbox.go`
//! (`generatePodSandboxConfig`), `kuberuntime_container.go` (`generateContainerConfig`),
//! `labels.go` (the `io.kubernetes.*` labels) and `kubelet_pods.go` (`makeEnvironmentVariables`,
//! `makeMounts`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use devicelet_devicemanager::RunContainerOptions;
use devicelet_proto::cri::v1 as cri;
use devicelet_quantity::Quantity;
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cdi::CdiEdits;
use crate::error::RuntimeError;

/// Label on every sandbox and container devicelet creates, valued with the devicelet
/// instance ([`instance_id`]): what it adopts, or removes, after a restart. Several devicelets
/// (simulated nodes, test daemons) may share one runtime; each touches only its own.
pub const LABEL_MANAGED: &str = "io.devicelet.managed";

/// The instance ID of the devicelet with root `root` and node name `node_name`:
/// `<node>.<FNV-1a of the root path, 8 hex digits>`.
pub fn instance_id(root: &Path, node_name: &str) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let mut hash: u32 = 0x811c_9dc5;
    for byte in root.as_os_str().as_encoded_bytes() {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{node_name}.{hash:08x}")
}
/// The kubelet's labels (`pkg/kubelet/types/labels.go`).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// See [`LABEL_POD_NAME`].
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// See [`LABEL_POD_NAME`].
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// See [`LABEL_POD_NAME`].
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// The kubelet's annotation of a container's restart count.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// The kubelet's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
/// CPU shares of 1 CPU, and the least the kernel takes (`pkg/kubelet/cm` `MilliCPUToShares`).
const SHARES_PER_CPU: i64 = 1024;
const MIN_SHARES: i64 = 2;
/// The CFS period the kubelet uses (100 ms).
const QUOTA_PERIOD: i64 = 100_000;

/// The few facts of a pod the runtime keeps using.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Checks that `value` can name a file or directory under the root: the API server's name
/// rules keep these safe in a cluster, but a local manifest is not validated by anyone else, and
/// these names become paths (`R/logs/<ns>_<name>_<uid>/<container>/`, `R/runtime/pods/<uid>.json`).
fn path_safe(what: &str, value: &str) -> Result<(), RuntimeError> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && !value.starts_with('.')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::Config(format!(
            "{what} {value:?} cannot run: names are letters, digits, '-' and '.' (not first), at most 253 bytes"
        )))
    }
}

/// Whether `value` is safe as one path component under the root (see [`path_safe`]).
pub fn is_path_safe(value: &str) -> bool {
    path_safe("", value).is_ok()
}

/// Whether devicelet's CRI runtime can run `pod` at all: UID, namespace, name and container
/// names usable as paths, and no two containers with one name.
pub fn check_pod(pod: &Pod) -> Result<(), RuntimeError> {
    PodIdentity::of(pod)?;
    let mut seen = std::collections::BTreeSet::new();
    let spec = pod.spec.as_ref();
    for c in spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .chain(spec.map(|s| s.containers.as_slice()).unwrap_or_default())
    {
        path_safe("container name", &c.name)?;
        if !seen.insert(c.name.as_str()) {
            return Err(RuntimeError::Config(format!(
                "two containers are named {:?}",
                c.name
            )));
        }
    }
    Ok(())
}

impl PodIdentity {
    /// The identity of `pod`; a pod without a UID cannot run, nor one whose names cannot be
    /// paths.
    pub fn of(pod: &Pod) -> Result<Self, RuntimeError> {
        let uid = pod
            .metadata
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| RuntimeError::Config("pod has no metadata.uid".to_owned()))?;
        let id = PodIdentity {
            uid,
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            name: pod.metadata.name.clone().unwrap_or_default(),
        };
        path_safe("metadata.uid", &id.uid)?;
        path_safe("metadata.namespace", &id.namespace)?;
        path_safe("metadata.name", &id.name)?;
        Ok(id)
    }

    /// The pod's log directory name, as the kubelet's `/var/log/pods/<ns>_<name>_<uid>`.
    pub fn log_dir_name(&self) -> String {
        format!("{}_{}_{}", self.namespace, self.name, self.uid)
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// `spec.restartPolicy` (the API's default `Always`).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// `spec.terminationGracePeriodSeconds`, or the pod's own deletion grace period when shorter.
pub fn grace_seconds(pod: &Pod) -> i64 {
    let spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    let deletion = pod.metadata.deletion_grace_period_seconds.unwrap_or(spec);
    spec.min(deletion).max(0)
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The labels every object of the pod carries.
fn pod_labels(id: &PodIdentity, instance: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED.to_owned(), instance.to_owned()),
        (LABEL_POD_NAME.to_owned(), id.name.clone()),
        (LABEL_POD_NAMESPACE.to_owned(), id.namespace.clone()),
        (LABEL_POD_UID.to_owned(), id.uid.clone()),
    ])
}

/// The sandbox config of `pod` (attempt `attempt`) for devicelet `instance`, logging under
/// `log_dir`.
pub fn sandbox_config(
    pod: &Pod,
    instance: &str,
    attempt: u32,
    log_dir: &Path,
) -> Result<cri::PodSandboxConfig, RuntimeError> {
    let id = PodIdentity::of(pod)?;
    let mut labels = pod_labels(&id, instance);
    for (k, v) in pod.metadata.labels.iter().flatten() {
        labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let host_net = host_network(pod);
    let node_mode = cri::NamespaceMode::Node as i32;
    let pod_mode = cri::NamespaceMode::Pod as i32;
    let container_mode = cri::NamespaceMode::Container as i32;
    let spec = pod.spec.as_ref();
    let share_pid = spec
        .and_then(|s| s.share_process_namespace)
        .unwrap_or(false);
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| id.name.clone());
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: id.name.clone(),
            uid: id.uid.clone(),
            namespace: id.namespace.clone(),
            attempt,
        }),
        // With the host's network the hostname is the host's (the runtime sets none).
        hostname: if host_net { String::new() } else { hostname },
        log_directory: log_dir.display().to_string(),
        labels,
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/devicelet/pod{}", id.uid),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: if host_net { node_mode } else { pod_mode },
                    pid: if spec.and_then(|s| s.host_pid).unwrap_or(false) {
                        node_mode
                    } else if share_pid {
                        pod_mode
                    } else {
                        container_mode
                    },
                    ipc: if spec.and_then(|s| s.host_ipc).unwrap_or(false) {
                        node_mode
                    } else {
                        pod_mode
                    },
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Where a pod's volumes live for the runtime: `emptyDir` volumes are directories under
/// `volumes_dir`, as are `configMap`, `secret`, `projected` and `downwardAPI` volumes
/// (`kubernetes.io~configmap/<name>` and so on, written by [`crate::volumes`]); `hostPath`
/// volumes are the host's path.
pub fn volume_host_paths(
    pod: &Pod,
    volumes_dir: &Path,
) -> Result<BTreeMap<String, PathBuf>, RuntimeError> {
    let mut out = BTreeMap::new();
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let path = if let Some(host) = &volume.host_path {
            PathBuf::from(&host.path)
        } else if volume.empty_dir.is_some() {
            path_safe("volume name", &volume.name)?;
            volumes_dir
                .join("kubernetes.io~empty-dir")
                .join(&volume.name)
        } else if let Some(kind) = crate::volumes::api_volume_kind(volume) {
            path_safe("volume name", &volume.name)?;
            crate::volumes::volume_dir(volumes_dir, kind, &volume.name)
        } else {
            return Err(RuntimeError::Config(format!(
                "volume {:?}: only emptyDir, hostPath, configMap, secret, projected and downwardAPI \
                 volumes are supported by devicelet's CRI runtime",
                volume.name
            )));
        };
        out.insert(volume.name.clone(), path);
    }
    Ok(out)
}

/// Whether the pod's volume `name` is mounted read-only whatever the mount says (configMap,
/// secret, projected, downwardAPI: the kubelet's `mustMountRO`).
fn must_mount_read_only(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .find(|v| v.name == name)
        .is_some_and(|v| crate::volumes::api_volume_kind(v).is_some())
}

/// Everything a container config is made of.
#[derive(Debug, Clone, Copy)]
pub struct ContainerInputs<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The devicelet instance ([`instance_id`]).
    pub instance: &'a str,
    /// The container of its spec.
    pub container: &'a Container,
    /// Restart attempt (0 for the first start).
    pub attempt: u32,
    /// The image reference the runtime resolved.
    pub image_ref: &'a str,
    /// What devicelet decided (device plugins, exclusive CPUs, CDI names).
    pub options: &'a RunContainerOptions,
    /// CDI devices resolved by devicelet (empty when the runtime applies CDI itself).
    pub cdi: &'a CdiEdits,
    /// Whether to pass the CDI names to the runtime in `CDIDevices` (a CDI-aware runtime).
    pub pass_cdi_names: bool,
    /// The pod's volumes on the host.
    pub volumes: &'a BTreeMap<String, PathBuf>,
    /// The node's name and IP (for `spec.nodeName` and `status.hostIP` env references).
    pub node_name: &'a str,
    /// See `node_name`.
    pub host_ip: &'a str,
    /// The `kubernetes` Service's env (cluster mode), before the spec's own.
    pub service_env: &'a [(String, String)],
}

/// The container config (the kubelet's `generateContainerConfig`).
pub fn container_config(inputs: ContainerInputs<'_>) -> Result<cri::ContainerConfig, RuntimeError> {
    let ContainerInputs {
        pod,
        instance,
        container,
        attempt,
        image_ref,
        options,
        cdi,
        pass_cdi_names,
        volumes,
        node_name,
        host_ip,
        service_env,
    } = inputs;
    let id = PodIdentity::of(pod)?;
    let mut labels = pod_labels(&id, instance);
    labels.insert(LABEL_CONTAINER_NAME.to_owned(), container.name.clone());
    let mut annotations: HashMap<String, String> = options
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(ANNOTATION_RESTART_COUNT.to_owned(), attempt.to_string());

    // The device plugins' envs, then CDI's, then the spec's own (the kubelet lets the spec win
    // over a plugin's env of the same name: it appends them after).
    let mut envs: Vec<(String, String)> = Vec::new();
    let mut set_env = |k: &str, v: String| {
        envs.retain(|(key, _)| key != k);
        envs.push((k.to_owned(), v));
    };
    for (k, v) in &options.envs {
        set_env(k, v.clone());
    }
    for (k, v) in &cdi.env {
        set_env(k, v.clone());
    }
    for (k, v) in service_env {
        set_env(k, v.clone());
    }
    for env in container.env.iter().flatten() {
        let value = match (&env.value, &env.value_from) {
            (_, Some(from)) => match &from.field_ref {
                Some(field) => {
                    crate::downward::field_value(pod, &field.field_path, node_name, host_ip)?
                }
                None => {
                    return Err(RuntimeError::Config(format!(
                        "env {:?}: only value and fieldRef are supported by devicelet's CRI runtime",
                        env.name
                    )));
                }
            },
            (Some(v), None) => v.clone(),
            (None, None) => String::new(),
        };
        set_env(&env.name, value);
    }

    let mut mounts: Vec<cri::Mount> = Vec::new();
    let mut add_mount = |container_path: &str, host_path: &str, readonly: bool| {
        mounts.retain(|m| m.container_path != container_path);
        mounts.push(cri::Mount {
            container_path: container_path.to_owned(),
            host_path: host_path.to_owned(),
            readonly,
            ..Default::default()
        });
    };
    for m in &options.mounts {
        add_mount(&m.container_path, &m.host_path, m.read_only);
    }
    for (c, h, ro) in &cdi.mounts {
        add_mount(c, h, *ro);
    }
    for vm in container.volume_mounts.iter().flatten() {
        let Some(host) = volumes.get(&vm.name) else {
            return Err(RuntimeError::Config(format!(
                "volumeMount {:?}: no volume of that name in the pod",
                vm.name
            )));
        };
        let host = match vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) if sub.starts_with('/') || sub.split('/').any(|part| part == "..") => {
                return Err(RuntimeError::Config(format!(
                    "volumeMount {:?}: subPath {sub:?} leaves the volume",
                    vm.name
                )));
            }
            Some(sub) => host.join(sub),
            None => host.clone(),
        };
        add_mount(
            &vm.mount_path,
            &host.display().to_string(),
            vm.read_only.unwrap_or(false) || must_mount_read_only(pod, &vm.name),
        );
    }

    let mut devices: Vec<cri::Device> = Vec::new();
    let mut add_device = |container_path: &str, host_path: &str, permissions: &str| {
        devices.retain(|d| d.container_path != container_path);
        devices.push(cri::Device {
            container_path: container_path.to_owned(),
            host_path: host_path.to_owned(),
            permissions: permissions.to_owned(),
        });
    };
    for d in &options.devices {
        add_device(&d.container_path, &d.host_path, &d.permissions);
    }
    for (c, h, p) in &cdi.device_nodes {
        add_device(c, h, p);
    }

    let resources = container_resources(container, options)?;
    let security = security_context(pod, container)?;
    let log_path = format!("{}/{attempt}.log", container.name);
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: image_ref.to_owned(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: container.command.clone().unwrap_or_default(),
        args: container.args.clone().unwrap_or_default(),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: envs
            .into_iter()
            .map(|(key, value)| cri::KeyValue {
                key,
                value: value.into_bytes(),
            })
            .collect(),
        mounts,
        devices,
        labels,
        annotations,
        log_path,
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(security),
        }),
        cdi_devices: if pass_cdi_names {
            options
                .cdi_devices
                .iter()
                .map(|name| cri::CdiDevice { name: name.clone() })
                .collect()
        } else {
            Vec::new()
        },
        ..Default::default()
    })
}

fn quantity(
    container: &Container,
    limits: bool,
    name: &str,
) -> Result<Option<Quantity>, RuntimeError> {
    let Some(resources) = container.resources.as_ref() else {
        return Ok(None);
    };
    let map = if limits {
        resources.limits.as_ref()
    } else {
        resources.requests.as_ref()
    };
    let Some(q) = map.and_then(|m| m.get(name)) else {
        return Ok(None);
    };
    Quantity::parse(&q.0)
        .map(Some)
        .map_err(|e| RuntimeError::Config(format!("resources {name} {:?}: {e}", q.0)))
}

/// CPU shares and quota, memory limit and the CPU/memory sets (`pkg/kubelet/kuberuntime`
/// `kuberuntime_container_linux.go` `calculateLinuxResources`).
fn container_resources(
    container: &Container,
    options: &RunContainerOptions,
) -> Result<cri::LinuxContainerResources, RuntimeError> {
    let cpu_request = quantity(container, false, "cpu")?.or(quantity(container, true, "cpu")?);
    let cpu_limit = quantity(container, true, "cpu")?;
    let memory_limit = quantity(container, true, "memory")?;
    let shares = cpu_request
        .map(|q| (milli(&q).saturating_mul(SHARES_PER_CPU) / 1000).max(MIN_SHARES))
        .unwrap_or(MIN_SHARES);
    let (period, quota) = match cpu_limit {
        Some(q) if milli(&q) > 0 => (
            QUOTA_PERIOD,
            (milli(&q).saturating_mul(QUOTA_PERIOD) / 1000).max(1000),
        ),
        _ => (0, 0),
    };
    Ok(cri::LinuxContainerResources {
        cpu_period: period,
        cpu_quota: quota,
        cpu_shares: shares,
        memory_limit_in_bytes: memory_limit.map_or(0, |q| clamp(q.value_ceil())),
        cpuset_cpus: options.cpuset_cpus.clone().unwrap_or_default(),
        cpuset_mems: options.cpuset_mems.clone().unwrap_or_default(),
        ..Default::default()
    })
}

fn clamp(v: i128) -> i64 {
    i64::try_from(v.max(0)).unwrap_or(i64::MAX)
}

fn milli(q: &Quantity) -> i64 {
    clamp(q.milli_value_ceil())
}

/// The container's security context, the pod's `runAsUser`, `runAsGroup` and `runAsNonRoot`
/// where the container sets none. `runAsNonRoot` is enforced on the user devicelet sets: an
/// explicit non-zero `runAsUser` is needed (the kubelet also accepts an image whose own user
/// is not root; devicelet does not read image users).
fn security_context(
    pod: &Pod,
    container: &Container,
) -> Result<cri::LinuxContainerSecurityContext, RuntimeError> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|p| p.run_as_user));
    let run_as_group = sc
        .and_then(|s| s.run_as_group)
        .or_else(|| psc.and_then(|p| p.run_as_group));
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|p| p.run_as_non_root))
        .unwrap_or(false);
    if non_root && run_as_user.is_none_or(|u| u == 0) {
        return Err(RuntimeError::Config(format!(
            "container {:?} has runAsNonRoot and would run as root: set a non-zero runAsUser",
            container.name
        )));
    }
    let mut out = security_context_of(sc);
    out.run_as_user = run_as_user.map(|value| cri::Int64Value { value });
    out.run_as_group = run_as_group.map(|value| cri::Int64Value { value });
    Ok(out)
}

fn security_context_of(
    sc: Option<&k8s_openapi::api::core::v1::SecurityContext>,
) -> cri::LinuxContainerSecurityContext {
    let mut out = cri::LinuxContainerSecurityContext {
        privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
        readonly_rootfs: sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        ..Default::default()
    };
    if let Some(caps) = sc.and_then(|s| s.capabilities.as_ref()) {
        out.capabilities = Some(cri::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use devicelet_devicemanager::{DeviceSpec, Mount};
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
            "spec": {
                "hostNetwork": true,
                "volumes": [{"name": "scratch", "emptyDir": {}},
                            {"name": "cfg", "configMap": {"name": "settings"}}],
                "containers": [{
                    "name": "c", "image": "busybox",
                    "command": ["sh", "-c"], "args": ["env"],
                    "env": [
                        {"name": "EXAMPLE_DEVICES", "value": "spec-wins"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                    ],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"},
                                     {"name": "cfg", "mountPath": "/cfg"}],
                    "resources": {"requests": {"cpu": "1", "memory": "64Mi"},
                                  "limits": {"cpu": "1", "memory": "64Mi"}}
                }]
            }
        }))
        .expect("pod")
    }

    #[test]
    fn a_container_gets_the_spec_and_what_devicelet_decided() {
        let pod = pod();
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let options = RunContainerOptions {
            envs: BTreeMap::from([
                ("EXAMPLE_DEVICES".into(), "dev-1".into()),
                ("PLUGIN".into(), "1".into()),
            ]),
            mounts: vec![Mount {
                container_path: "/plugin".into(),
                host_path: "/tmp".into(),
                read_only: true,
            }],
            devices: vec![DeviceSpec {
                container_path: "/dev/example".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: BTreeMap::from([("example.com/foo.devices".into(), "dev-1".into())]),
            cdi_devices: vec!["example.com/foo=dev-1".into()],
            cpuset_cpus: Some("1".into()),
            cpuset_mems: None,
        };
        let cdi = CdiEdits {
            env: vec![("CDI".into(), "yes".into())],
            device_nodes: vec![("/dev/cdi".into(), "/dev/zero".into(), "rwm".into())],
            mounts: vec![],
        };
        let volumes = volume_host_paths(&pod, Path::new("/root/pods/u1/volumes")).expect("volumes");
        let config = container_config(ContainerInputs {
            pod: &pod,
            instance: "node-a.0000abcd",
            container,
            attempt: 2,
            image_ref: "sha256:abc",
            options: &options,
            cdi: &cdi,
            pass_cdi_names: false,
            volumes: &volumes,
            node_name: "node-a",
            host_ip: "10.0.0.1",
            service_env: &[
                ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
                ("POD".into(), "from-service".into()),
            ],
        })
        .expect("config");
        let env: BTreeMap<_, _> = config
            .envs
            .iter()
            .map(|e| {
                (
                    e.key.as_str(),
                    String::from_utf8_lossy(&e.value).into_owned(),
                )
            })
            .collect();
        assert_eq!(env["EXAMPLE_DEVICES"], "spec-wins");
        assert_eq!(env["PLUGIN"], "1");
        assert_eq!(env["CDI"], "yes");
        assert_eq!(env["POD"], "p");
        assert_eq!(env["NODE"], "node-a");
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        let mounts: Vec<_> = config
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.readonly))
            .collect();
        assert_eq!(
            mounts,
            vec![
                ("/plugin", "/tmp", true),
                (
                    "/scratch",
                    "/root/pods/u1/volumes/kubernetes.io~empty-dir/scratch",
                    false
                ),
                (
                    "/cfg",
                    "/root/pods/u1/volumes/kubernetes.io~configmap/cfg",
                    true
                )
            ]
        );
        let devices: Vec<_> = config
            .devices
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        assert_eq!(devices, vec!["/dev/example", "/dev/cdi"]);
        assert!(
            config.cdi_devices.is_empty(),
            "resolved by devicelet, not passed"
        );
        let resources = config.linux.and_then(|l| l.resources).expect("resources");
        assert_eq!(resources.cpuset_cpus, "1");
        assert_eq!(resources.cpu_shares, 1024);
        assert_eq!(
            (resources.cpu_period, resources.cpu_quota),
            (100_000, 100_000)
        );
        assert_eq!(resources.memory_limit_in_bytes, 64 << 20);
        assert_eq!(config.log_path, "c/2.log");
        assert_eq!(config.labels[LABEL_POD_UID], "u1");
        assert_eq!(config.labels[LABEL_CONTAINER_NAME], "c");
        assert_eq!(config.annotations[ANNOTATION_RESTART_COUNT], "2");
        assert_eq!(config.annotations["example.com/foo.devices"], "dev-1");
    }

    #[test]
    fn the_sandbox_uses_the_host_network_when_asked() {
        let pod = pod();
        let config = sandbox_config(&pod, "node-a.0000abcd", 0, Path::new("/logs/ns_p_u1"))
            .expect("sandbox");
        let ns = config
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .expect("namespaces");
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(config.labels[LABEL_MANAGED], "node-a.0000abcd");
        assert_ne!(
            instance_id(Path::new("/a"), "n"),
            instance_id(Path::new("/b"), "n")
        );
        assert_eq!(config.labels["app"], "x");
        assert_eq!(config.log_directory, "/logs/ns_p_u1");
    }

    #[test]
    fn unsupported_volumes_and_env_sources_are_config_errors() {
        let mut bad = pod();
        let spec = bad.spec.as_mut().expect("spec");
        spec.volumes = Some(vec![
            serde_json::from_value(json!({"name": "s", "secret": {"secretName": "x"}}))
                .expect("volume"),
            serde_json::from_value(
                json!({"name": "pvc", "persistentVolumeClaim": {"claimName": "x"}}),
            )
            .expect("volume"),
        ]);
        let err = volume_host_paths(&bad, Path::new("/v"))
            .expect_err("pvc volume")
            .to_string();
        assert!(err.contains("\"pvc\""), "{err}");
        spec_volumes_truncate(&mut bad);
        let paths = volume_host_paths(&bad, Path::new("/v")).expect("secret volume");
        assert_eq!(paths["s"], Path::new("/v/kubernetes.io~secret/s"));
        let err = crate::downward::field_value(&bad, "status.podIP", "n", "ip")
            .expect_err("podIP")
            .to_string();
        assert!(err.contains("status.podIP"), "{err}");
    }

    fn spec_volumes_truncate(pod: &mut Pod) {
        if let Some(v) = pod.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
            v.truncate(1);
        }
    }

    #[test]
    fn hostile_names_are_refused_before_they_become_paths() {
        for (field, value) in [
            ("name", "../../etc"),
            ("name", "a/b"),
            ("namespace", ".."),
            ("uid", "u_1"),
            ("name", ""),
        ] {
            let mut p = pod();
            match field {
                "name" => p.metadata.name = Some(value.into()),
                "namespace" => p.metadata.namespace = Some(value.into()),
                _ => p.metadata.uid = Some(value.into()),
            }
            let err = check_pod(&p).expect_err(value).to_string();
            assert!(err.contains(&format!("{value:?}")), "{err}");
        }
        let mut p = pod();
        p.spec.as_mut().expect("spec").containers[0].name = "../x".into();
        assert!(check_pod(&p).is_err());
        let mut p = pod();
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        p.spec.as_mut().expect("spec").containers.push(c);
        assert!(
            check_pod(&p)
                .expect_err("duplicate")
                .to_string()
                .contains("two containers")
        );
        assert!(check_pod(&pod()).is_ok());
    }

    #[test]
    fn run_as_non_root_needs_a_non_root_user() {
        let mut p = pod();
        p.spec.as_mut().expect("spec").security_context =
            Some(serde_json::from_value(json!({"runAsNonRoot": true})).expect("psc"));
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        let err = security_context(&p, &c).expect_err("root").to_string();
        assert!(err.contains("runAsNonRoot"), "{err}");
        p.spec.as_mut().expect("spec").security_context = Some(
            serde_json::from_value(json!({"runAsNonRoot": true, "runAsUser": 1000})).expect("psc"),
        );
        let sc = security_context(&p, &c).expect("non-root");
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
    }

    #[test]
    fn grace_is_the_shorter_of_spec_and_deletion() {
        let mut p = pod();
        assert_eq!(grace_seconds(&p), DEFAULT_GRACE_SECONDS);
        p.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(grace_seconds(&p), 5);
        assert_eq!(restart_policy(&p), "Always");
    }
}
