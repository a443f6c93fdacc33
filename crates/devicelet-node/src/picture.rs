//! The node as a picture (`devicelet top --numa`, the `serve --ui-address` page): for each NUMA
//! node its CPUs (exclusive ones by the container holding them, the shared pool, the reserved
//! ones), its memory and huge pages (total and allocated, by container where the Memory
//! Manager pinned them) and its devices (device-plugin devices with the NUMA nodes their
//! plugin reported, DRA devices with the ResourceSlice attribute `resource.kubernetes.io/numaNode`)
//! with the pod holding each. Devices without a NUMA node go to [`NodePicture::no_numa`].
//!
//! Plain data: [`build`] is a pure function of what the managers hold, so the terminal and
//! the web page render one model and tests check it without a daemon.
//! [`PodAdmitter::picture`] gathers the inputs from the running node.

use std::collections::{BTreeMap, BTreeSet};

use devicelet_cpumanager::CpuPolicyName;
use devicelet_devicemanager::ResourcesSnapshot;
use serde::{Deserialize, Serialize};

use crate::admitted::{AdmittedPod, PodList};
use crate::dra::numa::{NUMA_NODE_ATTRIBUTE, numa_nodes_of};
use crate::pods::PodAdmitter;

/// `top --numa` JSON/YAML and `GET /v1/picture`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePicture {
    /// Changes whenever pods are admitted or removed (the admitter's generation), so a
    /// viewer redraws only on change.
    pub generation: u64,
    /// The CPU Manager policy (`none`, `static`), empty without a CPU manager.
    pub cpu_manager_policy: String,
    /// The Memory Manager policy (`None`, `Static`), empty without a memory manager.
    pub memory_manager_policy: String,
    /// One entry per NUMA node of the machine (and per node a device names), by id.
    pub numa_nodes: Vec<NumaView>,
    /// What is on no NUMA node.
    pub no_numa: NoNumaView,
}

/// One NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaView {
    /// NUMA node id.
    pub id: usize,
    /// Its CPUs.
    pub cpus: CpuView,
    /// Memory and each huge-page size on it.
    pub memory: Vec<MemoryUse>,
    /// Devices on it (a device on several nodes is listed on each).
    pub devices: Vec<DeviceUse>,
    /// Every pod holding something here (`namespace/name`), sorted.
    pub pods: Vec<String>,
}

/// The CPUs of one NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuView {
    /// Every CPU of the node.
    pub all: Vec<u32>,
    /// Reserved for the system (static policy).
    pub reserved: Vec<u32>,
    /// The shared pool, without the reserved CPUs.
    pub shared: Vec<u32>,
    /// Exclusive CPUs by container.
    pub exclusive: Vec<CpuHolder>,
}

/// Exclusive CPUs a container holds on one NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuHolder {
    /// The holder.
    #[serde(flatten)]
    pub holder: Holder,
    /// Its CPUs on this node.
    pub cpus: Vec<u32>,
}

/// A container holding something.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// `namespace/name`.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Container name.
    pub container: String,
}

/// One memory resource (`memory`, `hugepages-2Mi`, ...) on one NUMA node, bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryUse {
    /// `memory` or `hugepages-<size>`.
    pub resource: String,
    /// What the node has.
    pub total: u64,
    /// What containers may get (total less the system's reservation); equal to `total`
    /// without the Static policy.
    pub allocatable: u64,
    /// Given to containers (Static policy).
    pub allocated: u64,
    /// The blocks pinned here, by container.
    pub holders: Vec<MemoryHolder>,
}

/// A memory block of a container that touches this NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHolder {
    /// The holder.
    #[serde(flatten)]
    pub holder: Holder,
    /// Bytes of the block (spread over `numaNodes`).
    pub size: u64,
    /// Every NUMA node of the block.
    pub numa_nodes: Vec<usize>,
}

/// Whether a device comes from a device plugin or a DRA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceSource {
    /// A device-plugin resource.
    Plugin,
    /// A device of a DRA driver's ResourceSlice.
    Dra,
}

/// One device and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceUse {
    /// Plugin or DRA.
    pub source: DeviceSource,
    /// The extended resource name (plugin) or `<driver>/<pool>` (DRA).
    pub resource: String,
    /// The device ID (plugin) or device name (DRA).
    pub id: String,
    /// Its NUMA nodes; empty when it has none.
    pub numa_nodes: Vec<usize>,
    /// `Healthy`, `Unhealthy` or `Unknown`.
    pub health: String,
    /// Containers holding it (several for a shared claim).
    pub holders: Vec<Holder>,
}

/// What is on no NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoNumaView {
    /// Devices without a NUMA node.
    pub devices: Vec<DeviceUse>,
    /// Admitted pods that hold nothing on any NUMA node (shared CPUs, unpinned memory,
    /// devices without a node), `namespace/name`, sorted.
    pub pods: Vec<String>,
}

/// The CPUs as the CPU Manager sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuInput {
    /// Policy name.
    pub policy: String,
    /// NUMA node → CPUs.
    pub by_numa: BTreeMap<usize, Vec<u32>>,
    /// Reserved CPUs (static policy; empty otherwise).
    pub reserved: Vec<u32>,
    /// The shared pool (every CPU under the none policy).
    pub shared: Vec<u32>,
}

/// One memory resource of one NUMA node as the Memory Manager sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryInput {
    /// `memory` or `hugepages-<size>`.
    pub resource: String,
    /// Bytes the node has.
    pub total: u64,
    /// Bytes containers may get.
    pub allocatable: u64,
    /// Bytes given to containers.
    pub allocated: u64,
}

/// One DRA device the node knows (from a slice, or from a claim whose slice is gone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraDeviceInput {
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// The `resource.kubernetes.io/numaNode` attribute's value(s).
    pub numa_nodes: Option<Vec<i64>>,
}

/// Everything [`build`] draws from.
#[derive(Debug, Clone, Default)]
pub struct PictureInput {
    /// The admitter's generation.
    pub generation: u64,
    /// CPUs, when a CPU manager runs.
    pub cpu: Option<CpuInput>,
    /// The Memory Manager policy name, empty without one.
    pub memory_policy: String,
    /// NUMA node → memory resources.
    pub memory: BTreeMap<usize, Vec<MemoryInput>>,
    /// The device manager's inventory.
    pub plugin_devices: ResourcesSnapshot,
    /// The DRA devices the node's slices list.
    pub dra_devices: Vec<DraDeviceInput>,
    /// Admitted pods, with their claims' devices.
    pub pods: PodList,
}

fn pod_key(pod: &AdmittedPod) -> String {
    format!("{}/{}", pod.pod.namespace, pod.pod.name)
}

/// A CPU list (`1-3,6`) parsed leniently: a malformed part is skipped (the list comes from
/// the CPU manager, which writes it well-formed).
fn parse_cpus(list: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// NUMA ids from device topology; negative ids (no node) are dropped.
fn numa_ids(nodes: &[i64]) -> Vec<usize> {
    let set: BTreeSet<usize> = nodes
        .iter()
        .filter_map(|n| usize::try_from(*n).ok())
        .collect();
    set.into_iter().collect()
}

/// A CPU list as the kernel and the kubelet write it: `1-3,6`; `-` when empty.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if out.is_empty() {
        "-".to_owned()
    } else {
        out.join(",")
    }
}

/// Bytes for people: `4Gi`, `1.5Gi`, `512Mi` (one decimal, cut, not rounded).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size {
            let whole = n / size;
            let tenth = (n % size) * 10 / size;
            return if tenth == 0 {
                format!("{whole}{unit}")
            } else {
                format!("{whole}.{tenth}{unit}")
            };
        }
    }
    n.to_string()
}

/// Builds the picture. Pure: every input is data.
pub fn build(input: PictureInput) -> NodePicture {
    let PictureInput {
        generation,
        cpu,
        memory_policy,
        memory,
        plugin_devices,
        dra_devices,
        pods,
    } = input;

    // Who holds which device, keyed like the devices below.
    let mut holders: BTreeMap<(DeviceSource, String, String), Vec<Holder>> = BTreeMap::new();
    for pod in &pods.pods {
        for c in &pod.containers {
            let holder = Holder {
                pod: pod_key(pod),
                uid: pod.pod.uid.clone(),
                container: c.name.clone(),
            };
            for (resource, ids) in &c.devices {
                for id in ids {
                    holders
                        .entry((DeviceSource::Plugin, resource.clone(), id.clone()))
                        .or_default()
                        .push(holder.clone());
                }
            }
            for claim in &c.claims {
                holders
                    .entry((
                        DeviceSource::Dra,
                        format!("{}/{}", claim.driver, claim.pool),
                        claim.device.clone(),
                    ))
                    .or_default()
                    .push(holder.clone());
            }
        }
    }
    for list in holders.values_mut() {
        list.sort();
        list.dedup();
    }

    let mut devices: Vec<DeviceUse> = Vec::new();
    let mut seen: BTreeSet<(DeviceSource, String, String)> = BTreeSet::new();
    for r in &plugin_devices.resources {
        for d in &r.devices {
            let key = (DeviceSource::Plugin, r.name.clone(), d.id.clone());
            devices.push(DeviceUse {
                source: DeviceSource::Plugin,
                resource: r.name.clone(),
                id: d.id.clone(),
                numa_nodes: numa_ids(&d.numa_nodes),
                health: d.health.clone(),
                holders: holders.get(&key).cloned().unwrap_or_default(),
            });
            seen.insert(key);
        }
    }
    for d in &dra_devices {
        let key = (
            DeviceSource::Dra,
            format!("{}/{}", d.driver, d.pool),
            d.device.clone(),
        );
        if !seen.insert(key.clone()) {
            continue;
        }
        devices.push(DeviceUse {
            source: DeviceSource::Dra,
            resource: key.1.clone(),
            id: d.device.clone(),
            numa_nodes: numa_ids(d.numa_nodes.as_deref().unwrap_or_default()),
            health: dra_health(&pods, d),
            holders: holders.get(&key).cloned().unwrap_or_default(),
        });
    }
    // Held devices the inventory no longer lists (a plugin gone, a slice withdrawn): still
    // shown, without a NUMA node, so no holder disappears from the picture.
    for (key, list) in &holders {
        if seen.contains(key) {
            continue;
        }
        devices.push(DeviceUse {
            source: key.0,
            resource: key.1.clone(),
            id: key.2.clone(),
            numa_nodes: Vec::new(),
            health: "Unknown".into(),
            holders: list.clone(),
        });
    }

    // The NUMA nodes: the machine's, and any a device or memory block names.
    let mut ids: BTreeSet<usize> = BTreeSet::new();
    if let Some(cpu) = &cpu {
        ids.extend(cpu.by_numa.keys().copied());
    }
    ids.extend(memory.keys().copied());
    for d in &devices {
        ids.extend(d.numa_nodes.iter().copied());
    }

    let mut numa_nodes: Vec<NumaView> = ids
        .iter()
        .map(|&id| NumaView {
            id,
            cpus: cpu_view(cpu.as_ref(), id, &pods),
            memory: memory_view(memory.get(&id).map(Vec::as_slice), id, &pods),
            devices: devices
                .iter()
                .filter(|d| d.numa_nodes.contains(&id))
                .cloned()
                .collect(),
            pods: Vec::new(),
        })
        .collect();
    let mut placed: BTreeSet<String> = BTreeSet::new();
    for node in &mut numa_nodes {
        let mut on: BTreeSet<String> = BTreeSet::new();
        on.extend(node.cpus.exclusive.iter().map(|c| c.holder.pod.clone()));
        for m in &node.memory {
            on.extend(m.holders.iter().map(|h| h.holder.pod.clone()));
        }
        for d in &node.devices {
            on.extend(d.holders.iter().map(|h| h.pod.clone()));
        }
        placed.extend(on.iter().cloned());
        node.pods = on.into_iter().collect();
    }
    let mut unplaced: Vec<String> = pods
        .pods
        .iter()
        .map(pod_key)
        .filter(|p| !placed.contains(p))
        .collect();
    unplaced.sort();
    unplaced.dedup();

    NodePicture {
        generation,
        cpu_manager_policy: cpu.as_ref().map(|c| c.policy.clone()).unwrap_or_default(),
        memory_manager_policy: memory_policy,
        numa_nodes,
        no_numa: NoNumaView {
            devices: devices
                .into_iter()
                .filter(|d| d.numa_nodes.is_empty())
                .collect(),
            pods: unplaced,
        },
    }
}

/// A DRA device's health as the claims holding it report it (`Unknown` when free).
fn dra_health(pods: &PodList, d: &DraDeviceInput) -> String {
    pods.pods
        .iter()
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.claims)
        .find(|c| c.driver == d.driver && c.pool == d.pool && c.device == d.device)
        .map_or_else(|| "Unknown".to_owned(), |c| c.health.clone())
}

fn cpu_view(cpu: Option<&CpuInput>, id: usize, pods: &PodList) -> CpuView {
    let Some(cpu) = cpu else {
        return CpuView::default();
    };
    let all: Vec<u32> = cpu.by_numa.get(&id).cloned().unwrap_or_default();
    let here: BTreeSet<u32> = all.iter().copied().collect();
    let reserved: Vec<u32> = cpu
        .reserved
        .iter()
        .copied()
        .filter(|c| here.contains(c))
        .collect();
    let shared: Vec<u32> = cpu
        .shared
        .iter()
        .copied()
        .filter(|c| here.contains(c) && !reserved.contains(c))
        .collect();
    let mut exclusive = Vec::new();
    for pod in &pods.pods {
        for c in &pod.containers {
            let Some(list) = &c.cpus else { continue };
            let mine: Vec<u32> = parse_cpus(list)
                .into_iter()
                .filter(|x| here.contains(x))
                .collect();
            if !mine.is_empty() {
                exclusive.push(CpuHolder {
                    holder: Holder {
                        pod: pod_key(pod),
                        uid: pod.pod.uid.clone(),
                        container: c.name.clone(),
                    },
                    cpus: mine,
                });
            }
        }
    }
    exclusive.sort_by(|a, b| a.cpus.cmp(&b.cpus));
    CpuView {
        all,
        reserved,
        shared,
        exclusive,
    }
}

fn memory_view(tables: Option<&[MemoryInput]>, id: usize, pods: &PodList) -> Vec<MemoryUse> {
    let mut out: Vec<MemoryUse> = tables
        .unwrap_or_default()
        .iter()
        .map(|t| MemoryUse {
            resource: t.resource.clone(),
            total: t.total,
            allocatable: t.allocatable,
            allocated: t.allocated,
            holders: Vec::new(),
        })
        .collect();
    for pod in &pods.pods {
        for c in &pod.containers {
            for block in c.memory.iter().filter(|b| b.numa_nodes.contains(&id)) {
                let holder = MemoryHolder {
                    holder: Holder {
                        pod: pod_key(pod),
                        uid: pod.pod.uid.clone(),
                        container: c.name.clone(),
                    },
                    size: block.size,
                    numa_nodes: block.numa_nodes.clone(),
                };
                match out.iter_mut().find(|m| m.resource == block.memory_type) {
                    Some(m) => m.holders.push(holder),
                    None => out.push(MemoryUse {
                        resource: block.memory_type.clone(),
                        total: 0,
                        allocatable: 0,
                        allocated: block.size,
                        holders: vec![holder],
                    }),
                }
            }
        }
    }
    out
}

impl PodAdmitter {
    /// The node as a picture, from the live managers (see the module header).
    pub async fn picture(&self) -> NodePicture {
        let alignment = self.alignment();
        let cpu = alignment.cpu_manager().map(|m| {
            let topology = m.topology();
            let static_policy = m.policy() == CpuPolicyName::Static;
            let all: Vec<u32> = topology.all_cpus().iter().collect();
            CpuInput {
                policy: m.policy().as_str().to_owned(),
                by_numa: topology
                    .numa_nodes()
                    .iter()
                    .map(|(id, cpus)| (*id, cpus.iter().collect()))
                    .collect(),
                // Under the none policy every CPU is shared and nothing is set aside.
                reserved: if static_policy {
                    m.reserved_cpus().iter().collect()
                } else {
                    Vec::new()
                },
                shared: if static_policy {
                    m.default_cpu_set().iter().collect()
                } else {
                    all
                },
            }
        });
        let mut memory: BTreeMap<usize, Vec<MemoryInput>> = BTreeMap::new();
        let mut memory_policy = String::new();
        if let Some(m) = alignment.memory_manager() {
            memory_policy = m.policy().as_str().to_owned();
            let machine = m.machine_state();
            for (id, node) in m.topology().nodes() {
                let tables = memory.entry(*id).or_default();
                let state = machine.get(id);
                let mut resources: Vec<(String, u64)> =
                    vec![("memory".to_owned(), node.memory_bytes)];
                resources.extend(node.hugepages.iter().filter(|(_, n)| **n > 0).map(
                    |(size, n)| {
                        (
                            devicelet_memorymanager::hugepage_resource_name(*size),
                            size.saturating_mul(*n),
                        )
                    },
                ));
                for (resource, total) in resources {
                    // The Static policy's table when it keeps one; else the machine's size.
                    let table = state.and_then(|s| s.memory_map.get(&resource));
                    tables.push(MemoryInput {
                        total: table.map_or(total, |t| t.total),
                        allocatable: table.map_or(total, |t| t.allocatable),
                        allocated: table.map_or(0, |t| t.reserved),
                        resource,
                    });
                }
            }
        }
        let mut dra_devices = Vec::new();
        if let Some(dra) = self.dra() {
            for slice in dra.node_slices().await {
                for d in slice.spec.devices.iter().flatten() {
                    dra_devices.push(DraDeviceInput {
                        driver: slice.spec.driver.clone(),
                        pool: slice.spec.pool.name.clone(),
                        device: d.name.clone(),
                        numa_nodes: d
                            .attributes
                            .as_ref()
                            .and_then(|a| a.get(NUMA_NODE_ATTRIBUTE))
                            .and_then(numa_nodes_of),
                    });
                }
            }
        }
        let pods = self.list();
        build(PictureInput {
            generation: self.generation(),
            cpu,
            memory_policy,
            memory,
            plugin_devices: self.manager().snapshot(),
            dra_devices,
            pods,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admitted::{ContainerView, MemoryView, PodRef};
    use crate::dra::views::ClaimDeviceView;
    use devicelet_devicemanager::ContainerKind;
    use devicelet_devicemanager::{DeviceView, ResourceView};

    fn container(name: &str) -> ContainerView {
        ContainerView {
            name: name.into(),
            devices: BTreeMap::new(),
            claims: vec![],
            allocated_resources_status: vec![],
            cpus: None,
            numa_affinity: None,
            memory: vec![],
            limits: BTreeMap::new(),
            kind: ContainerKind::App,
        }
    }

    fn pod(name: &str, containers: Vec<ContainerView>) -> AdmittedPod {
        AdmittedPod {
            pod: PodRef {
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            containers,
        }
    }

    fn input() -> PictureInput {
        let mut a = container("app");
        a.cpus = Some("4-5".into());
        a.memory = vec![MemoryView {
            memory_type: "memory".into(),
            size: 1 << 30,
            numa_nodes: vec![1],
        }];
        a.devices
            .insert("example.com/nic".into(), vec!["nic-1".into()]);
        a.claims = vec![ClaimDeviceView {
            claim: "a-gpu".into(),
            namespace: "default".into(),
            request: None,
            driver: "gpu.example.com".into(),
            pool: "node-1".into(),
            device: "gpu-2".into(),
            cdi_devices: vec![],
            share_id: None,
            health: "Healthy".into(),
            health_message: String::new(),
        }];
        let shared = pod("shared", vec![container("app")]);
        PictureInput {
            generation: 7,
            cpu: Some(CpuInput {
                policy: "static".into(),
                by_numa: BTreeMap::from([(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])]),
                reserved: vec![0],
                shared: vec![0, 1, 2, 3, 6, 7],
            }),
            memory_policy: "Static".into(),
            memory: BTreeMap::from([(
                1,
                vec![MemoryInput {
                    resource: "memory".into(),
                    total: 4 << 30,
                    allocatable: 4 << 30,
                    allocated: 1 << 30,
                }],
            )]),
            plugin_devices: ResourcesSnapshot {
                resources: vec![ResourceView {
                    name: "example.com/nic".into(),
                    devices: vec![
                        DeviceView {
                            id: "nic-0".into(),
                            health: "Healthy".into(),
                            numa_nodes: vec![0],
                        },
                        DeviceView {
                            id: "nic-1".into(),
                            health: "Healthy".into(),
                            numa_nodes: vec![1],
                        },
                        DeviceView {
                            id: "nic-x".into(),
                            health: "Healthy".into(),
                            numa_nodes: vec![],
                        },
                    ],
                    ..ResourceView::default()
                }],
            },
            dra_devices: vec![
                DraDeviceInput {
                    driver: "gpu.example.com".into(),
                    pool: "node-1".into(),
                    device: "gpu-2".into(),
                    numa_nodes: Some(vec![1]),
                },
                DraDeviceInput {
                    driver: "gpu.example.com".into(),
                    pool: "node-1".into(),
                    device: "gpu-9".into(),
                    numa_nodes: None,
                },
            ],
            pods: PodList {
                pods: vec![pod("a", vec![a]), shared],
            },
        }
    }

    #[test]
    fn each_numa_node_shows_what_its_pods_hold() {
        let p = build(input());
        assert_eq!(p.generation, 7);
        assert_eq!(p.numa_nodes.len(), 2);
        let (n0, n1) = (&p.numa_nodes[0], &p.numa_nodes[1]);
        assert_eq!(n0.cpus.reserved, [0]);
        assert_eq!(n0.cpus.shared, [1, 2, 3]);
        assert!(n0.pods.is_empty(), "{n0:?}");
        assert_eq!(n1.pods, ["default/a"]);
        assert_eq!(n1.cpus.exclusive[0].cpus, [4, 5]);
        assert_eq!(n1.cpus.shared, [6, 7]);
        assert_eq!(n1.memory[0].holders[0].holder.container, "app");
        let ids: Vec<&str> = n1.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["nic-1", "gpu-2"]);
        assert!(n1.devices.iter().all(|d| d.holders.len() == 1));
        let free: Vec<&str> = p.no_numa.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(free, ["nic-x", "gpu-9"]);
        assert_eq!(p.no_numa.pods, ["default/shared"]);
    }

    #[test]
    fn a_held_device_missing_from_the_inventory_stays_in_the_picture() {
        let mut i = input();
        i.plugin_devices.resources.clear();
        let p = build(i);
        let nic = p.no_numa.devices.iter().find(|d| d.id == "nic-1").unwrap();
        assert_eq!(nic.holders[0].pod, "default/a");
        assert_eq!(nic.health, "Unknown");
    }

    #[test]
    fn a_device_on_two_nodes_is_drawn_on_both_and_negative_ids_mean_none() {
        let mut i = input();
        i.dra_devices[1].numa_nodes = Some(vec![0, 1]);
        i.plugin_devices.resources[0].devices[2].numa_nodes = vec![-1];
        let p = build(i);
        assert!(p.numa_nodes[0].devices.iter().any(|d| d.id == "gpu-9"));
        assert!(p.numa_nodes[1].devices.iter().any(|d| d.id == "gpu-9"));
        assert_eq!(p.no_numa.devices.len(), 1);
    }

    #[test]
    fn lists_and_sizes_read_as_people_write_them() {
        assert_eq!(cpu_list(&[1, 2, 3, 6]), "1-3,6");
        assert_eq!(cpu_list(&[]), "-");
        assert_eq!(human_bytes(1536 << 20), "1.5Gi");
        assert_eq!(human_bytes(2 << 20), "2Mi");
        assert_eq!(human_bytes(512), "512");
    }

    #[test]
    fn cpu_lists_parse_ranges_and_skip_garbage() {
        assert_eq!(parse_cpus("1-3,6"), [1, 2, 3, 6]);
        assert_eq!(parse_cpus(""), Vec::<u32>::new());
        assert_eq!(parse_cpus("x,2"), [2]);
    }
}
