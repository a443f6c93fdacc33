//! The Node object and its status, as the kubelet builds them (pure; no IO).
//!
//! Follows `pkg/kubelet/kubelet_node_status.go` (`initialNode`, `updateNodeStatus`) and
//! `pkg/kubelet/nodestatus/setters.go` (`MachineInfo`, `ReadyCondition`, `NodeAddress`,
//! `VersionInfo`), spec cluster.md §2:
//! - capacity = healthy + unhealthy devices, allocatable = healthy devices, per device plugin
//!   resource (`DeviceManager::capacity`);
//! - a resource whose plugin's grace period expired is set to `0`, never deleted; so is every
//!   extended resource the Node object still lists that the node no longer has (a Node object
//!   recreated from a stale manifest, or left from an earlier life of this node) — the kubelet's
//!   `reconcileExtendedResource` / `ShouldResetExtendedResourceCapacity` reset, applied on every
//!   report so stale device capacity is never advertised;
//! - allocatable of an extended resource never exceeds its capacity.
//!
//! The status is sent as a strategic-merge patch of `nodes/<name>/status` (`nodeutil.PatchNodeStatus`):
//! maps merge by key and conditions merge by `type`, so fields other components own
//! (e.g. conditions of a node problem detector) are left alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

/// The label the kubelet sets to the node name (`kubernetes.io/hostname`).
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// The label the kubelet sets to the OS (`kubernetes.io/os`).
pub const LABEL_OS: &str = "kubernetes.io/os";
/// The label the kubelet sets to the architecture (`kubernetes.io/arch`).
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// The kubelet's default `maxPods`.
pub const DEFAULT_MAX_PODS: u64 = 110;
/// The kubelet's default hard eviction threshold for memory (`memory.available<100Mi`), which
/// the kubelet subtracts from allocatable memory.
pub const EVICTION_HARD_MEMORY_BYTES: u64 = 100 * 1024 * 1024;

/// What the machine has, read once at start ([`crate::machine`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// Logical CPUs.
    pub cpus: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Pre-allocated huge pages: page size in bytes → pages (cadvisor's `HugePages`, from
    /// `/sys/kernel/mm/hugepages`).
    pub hugepages: BTreeMap<u64, u64>,
    /// Pods the node accepts (`maxPods`).
    pub max_pods: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: String,
    /// `GOARCH` spelling of the architecture (`amd64`, `arm64`).
    pub architecture: String,
    /// The node's address reported as `InternalIP`.
    pub internal_ip: String,
    /// `containerRuntimeVersion` (`containerd://1.6.20`); `None`: devicelet's simulated runtime.
    pub container_runtime_version: Option<String>,
}

/// Device plugin resources as the Device Manager reports them (`GetCapacity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceCapacity {
    /// Devices per resource (healthy and unhealthy).
    pub capacity: BTreeMap<String, u64>,
    /// Healthy devices per resource.
    pub allocatable: BTreeMap<String, u64>,
    /// Resources whose plugin is gone past the grace period (reported as 0).
    pub deleted: Vec<String>,
}

/// The node's Ready condition as devicelet reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// `True` / `False`.
    pub ready: bool,
    /// CamelCase reason (`KubeletReady`, `KubeletNotReady`).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl Readiness {
    /// Ready, with the kubelet's reason.
    pub fn ready(runtime: &str) -> Self {
        Readiness {
            ready: true,
            reason: "KubeletReady".to_owned(),
            message: format!("devicelet is posting ready status (device half; runtime {runtime})"),
        }
    }
}

/// Whether `name` is an extended resource (`IsExtendedResourceName`): a fully qualified name
/// outside the `kubernetes.io/` namespace and not a `requests.` quota name. Only these are
/// device plugin resources; `cpu`, `memory`, `pods`, `ephemeral-storage`, `hugepages-*` are
/// native and left alone.
pub fn is_extended_resource(name: &str) -> bool {
    if name.starts_with("requests.") {
        return false;
    }
    let Some((prefix, _)) = name.split_once('/') else {
        return false;
    };
    !(prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io"))
}

/// The Node devicelet registers when none exists (`initialNode`): labels for host name, OS
/// and architecture, and the machine's capacity. Status is sent by the first status patch.
pub fn initial_node(name: &str, machine: &MachineInfo) -> Node {
    let labels = BTreeMap::from([
        (LABEL_HOSTNAME.to_owned(), name.to_owned()),
        (LABEL_OS.to_owned(), "linux".to_owned()),
        (LABEL_ARCH.to_owned(), machine.architecture.clone()),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                // The kubelet sets this so the attach/detach controller manages volumes;
                // harmless here and what tools expect of a kubelet-registered node.
                "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: None,
    }
}

/// Capacity and allocatable of the whole node: the machine's native resources and every
/// device plugin resource, plus `0` for extended resources `existing` lists that the node no
/// longer has (see the module header).
pub fn resources(
    machine: &MachineInfo,
    devices: &DeviceCapacity,
    existing: &BTreeMap<String, Quantity>,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let q = |v: u64| Quantity(v.to_string());
    let mut capacity = BTreeMap::from([
        ("cpu".to_owned(), q(machine.cpus)),
        (
            "memory".to_owned(),
            Quantity(format!("{}Ki", machine.memory_bytes / 1024)),
        ),
        ("pods".to_owned(), q(machine.max_pods)),
    ]);
    let allocatable_memory = machine
        .memory_bytes
        .saturating_sub(EVICTION_HARD_MEMORY_BYTES);
    let mut allocatable = BTreeMap::from([
        ("cpu".to_owned(), q(machine.cpus)),
        (
            "memory".to_owned(),
            Quantity(format!("{}Ki", allocatable_memory / 1024)),
        ),
        ("pods".to_owned(), q(machine.max_pods)),
    ]);
    // Each page size is a resource of its own (`hugepages-2Mi`), and memory held in huge pages
    // is not allocatable as memory (the kubelet's `nodestatus.MachineInfo` setter).
    let mut hugepage_bytes: u64 = 0;
    for (size, pages) in &machine.hugepages {
        let bytes = size.saturating_mul(*pages);
        hugepage_bytes = hugepage_bytes.saturating_add(bytes);
        let name = devicelet_quantity::hugepage_resource_name(*size);
        let amount = devicelet_quantity::Quantity::from_bytes(bytes).to_k8s();
        capacity.insert(name.clone(), amount.clone());
        allocatable.insert(name, amount);
    }
    if hugepage_bytes > 0 {
        let memory = allocatable_memory.saturating_sub(hugepage_bytes);
        allocatable.insert(
            "memory".to_owned(),
            Quantity(format!("{}Ki", memory / 1024)),
        );
    }
    for name in existing.keys().filter(|n| is_extended_resource(n)) {
        capacity.insert(name.clone(), q(0));
        allocatable.insert(name.clone(), q(0));
    }
    for name in &devices.deleted {
        capacity.insert(name.clone(), q(0));
        allocatable.insert(name.clone(), q(0));
    }
    for (name, count) in &devices.capacity {
        let healthy = devices.allocatable.get(name).copied().unwrap_or(0);
        capacity.insert(name.clone(), q(*count));
        allocatable.insert(name.clone(), q(healthy.min(*count)));
    }
    (capacity, allocatable)
}

/// The body of the strategic-merge patch of `nodes/<name>/status`.
///
/// `heartbeat` is the RFC 3339 time of this report; `ready_since` when the Ready condition
/// last changed (kept by the caller so a report without a change keeps the transition time).
pub fn status_patch(
    machine: &MachineInfo,
    devices: &DeviceCapacity,
    existing_capacity: &BTreeMap<String, Quantity>,
    readiness: &Readiness,
    heartbeat: &str,
    ready_since: &str,
    node_name: &str,
) -> Value {
    let (capacity, allocatable) = resources(machine, devices, existing_capacity);
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": ready_since,
        })
    };
    json!({
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                          "devicelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                          "devicelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID",
                          "devicelet has sufficient PID available"),
                condition("Ready", if readiness.ready { "True" } else { "False" },
                          &readiness.reason, &readiness.message),
            ],
            "addresses": [
                {"type": "InternalIP", "address": machine.internal_ip},
                {"type": "Hostname", "address": node_name},
            ],
            "nodeInfo": {
                "machineID": machine.machine_id,
                "systemUUID": machine.machine_id,
                "bootID": machine.boot_id,
                "kernelVersion": machine.kernel_version,
                "osImage": machine.os_image,
                "containerRuntimeVersion": machine.container_runtime_version.clone().unwrap_or_else(
                    || concat!("devicelet-simulated://", env!("CARGO_PKG_VERSION")).to_owned()),
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": machine.architecture,
            },
        }
    })
}

/// The version devicelet reports as `nodeInfo.kubeletVersion`: the Kubernetes release whose
/// behaviour it follows, with devicelet's own version as semver build metadata (tools that
/// compare versions see 1.36.0).
pub const KUBELET_VERSION: &str = concat!("v1.36.0+devicelet.", env!("CARGO_PKG_VERSION"));

/// What of a status report is worth sending again before the 5-minute report: everything but
/// the heartbeat times.
pub fn without_heartbeat(patch: &Value) -> Value {
    let mut patch = patch.clone();
    if let Some(conditions) = patch
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for condition in conditions {
            if let Some(map) = condition.as_object_mut() {
                map.remove("lastHeartbeatTime");
            }
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> MachineInfo {
        MachineInfo {
            cpus: 4,
            memory_bytes: 8 * 1024 * 1024 * 1024,
            hugepages: BTreeMap::new(),
            max_pods: 110,
            boot_id: "b".into(),
            machine_id: "m".into(),
            kernel_version: "6.1".into(),
            os_image: "Debian".into(),
            architecture: "amd64".into(),
            internal_ip: "127.0.0.1".into(),
            container_runtime_version: None,
        }
    }

    fn qty(map: &BTreeMap<String, Quantity>, key: &str) -> Option<String> {
        map.get(key).map(|q| q.0.clone())
    }

    #[test]
    fn hugepages_are_resources_of_their_own_and_not_allocatable_memory() {
        let mut m = machine();
        m.hugepages = BTreeMap::from([(2 << 20, 512), (1 << 30, 2), (64 << 10, 0)]);
        let (cap, alloc) = resources(&m, &DeviceCapacity::default(), &BTreeMap::new());
        assert_eq!(qty(&cap, "hugepages-2Mi").as_deref(), Some("1Gi"));
        assert_eq!(qty(&cap, "hugepages-1Gi").as_deref(), Some("2Gi"));
        assert_eq!(qty(&cap, "hugepages-64Ki").as_deref(), Some("0"));
        assert_eq!(qty(&alloc, "hugepages-2Mi").as_deref(), Some("1Gi"));
        assert_eq!(qty(&cap, "memory").as_deref(), Some("8388608Ki"));
        // 8Gi - 100Mi eviction - 3Gi of huge pages.
        assert_eq!(qty(&alloc, "memory").as_deref(), Some("5140480Ki"));
    }

    #[test]
    fn extended_resource_names() {
        assert!(is_extended_resource("example.com/gpu"));
        assert!(is_extended_resource("nvidia.com/gpu"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("kubernetes.io/something"));
        assert!(!is_extended_resource("node.kubernetes.io/x"));
        assert!(!is_extended_resource("requests.example.com/gpu"));
    }

    #[test]
    fn capacity_counts_unhealthy_allocatable_only_healthy() {
        let devices = DeviceCapacity {
            capacity: BTreeMap::from([("example.com/gpu".into(), 4)]),
            allocatable: BTreeMap::from([("example.com/gpu".into(), 3)]),
            deleted: vec![],
        };
        let (cap, alloc) = resources(&machine(), &devices, &BTreeMap::new());
        assert_eq!(qty(&cap, "example.com/gpu").as_deref(), Some("4"));
        assert_eq!(qty(&alloc, "example.com/gpu").as_deref(), Some("3"));
        assert_eq!(qty(&cap, "cpu").as_deref(), Some("4"));
        assert_eq!(qty(&cap, "pods").as_deref(), Some("110"));
        assert_eq!(qty(&cap, "memory").as_deref(), Some("8388608Ki"));
        assert_eq!(qty(&alloc, "memory").as_deref(), Some("8286208Ki"));
    }

    #[test]
    fn deleted_and_stale_extended_resources_become_zero_never_absent() {
        let devices = DeviceCapacity {
            capacity: BTreeMap::from([("example.com/gpu".into(), 2)]),
            allocatable: BTreeMap::from([("example.com/gpu".into(), 2)]),
            deleted: vec!["example.com/nic".into()],
        };
        let existing = BTreeMap::from([
            ("example.com/old".to_owned(), Quantity("8".into())),
            ("example.com/gpu".to_owned(), Quantity("8".into())),
            ("cpu".to_owned(), Quantity("64".into())),
        ]);
        let (cap, alloc) = resources(&machine(), &devices, &existing);
        assert_eq!(qty(&cap, "example.com/old").as_deref(), Some("0"));
        assert_eq!(qty(&alloc, "example.com/old").as_deref(), Some("0"));
        assert_eq!(qty(&cap, "example.com/nic").as_deref(), Some("0"));
        assert_eq!(qty(&cap, "example.com/gpu").as_deref(), Some("2"));
        assert_eq!(
            qty(&cap, "cpu").as_deref(),
            Some("4"),
            "native resources are the machine's"
        );
    }

    #[test]
    fn allocatable_never_exceeds_capacity() {
        let devices = DeviceCapacity {
            capacity: BTreeMap::from([("r/x".into(), 1)]),
            allocatable: BTreeMap::from([("r/x".into(), 3)]),
            deleted: vec![],
        };
        let (_, alloc) = resources(&machine(), &devices, &BTreeMap::new());
        assert_eq!(qty(&alloc, "r/x").as_deref(), Some("1"));
    }

    #[test]
    fn initial_node_has_kubelet_labels() {
        let node = initial_node("n1", &machine());
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get(LABEL_HOSTNAME).map(String::as_str), Some("n1"));
        assert_eq!(labels.get(LABEL_OS).map(String::as_str), Some("linux"));
        assert_eq!(labels.get(LABEL_ARCH).map(String::as_str), Some("amd64"));
    }

    #[test]
    fn patch_has_ready_condition_and_heartbeat_is_not_a_change() {
        let ready = Readiness::ready("simulated");
        let a = status_patch(
            &machine(),
            &DeviceCapacity::default(),
            &BTreeMap::new(),
            &ready,
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Z",
            "n1",
        );
        let b = status_patch(
            &machine(),
            &DeviceCapacity::default(),
            &BTreeMap::new(),
            &ready,
            "2026-01-01T00:00:10Z",
            "2026-01-01T00:00:00Z",
            "n1",
        );
        assert_ne!(a, b);
        assert_eq!(without_heartbeat(&a), without_heartbeat(&b));
        let conditions = a["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ready = conditions
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["status"], "True");
        assert_eq!(ready["reason"], "KubeletReady");
    }
}
