//! NUMA topology of the machine, after the kubelet's `tm/numa_info.go` (`NUMAInfo`, node list,
//! distance matrix). No IO here: `devicelet-machine` reads cadvisor's sysfs files
//! (`/sys/devices/system/node/node*/cpulist`, `distance`) and builds the topology with
//! [`NumaTopology::from_nodes`]; a serde [`MachineConfig`] describes a machine without sysfs
//! (tests, demos, `--config`).
//!
//! Node ids must be 0..n-1: a `distance` file lists distances by position among online nodes,
//! so with holes in the ids the matrix could not be indexed by id; we refuse such trees with a
//! typed error instead of guessing. At most 64 nodes (the width of [`NumaMask`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{CpuListError, DiscoveryError};
use crate::mask::{MAX_NUMA_NODES, NumaMask};

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Node id.
    pub id: usize,
    /// CPUs on the node.
    pub cpus: Vec<u32>,
}

/// The machine's NUMA layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaTopology {
    /// Nodes, by id (ids are 0..n-1).
    pub nodes: Vec<NumaNode>,
    /// `distances[i][j]`: distance from node i to node j; `None` when unknown.
    pub distances: Option<Vec<Vec<u32>>>,
}

impl NumaTopology {
    /// All node ids as a mask (the kubelet's default affinity).
    pub fn default_mask(&self) -> NumaMask {
        NumaMask::from_bits(match self.nodes.len() {
            0 => 0,
            n if n >= MAX_NUMA_NODES => u64::MAX,
            n => (1u64 << n) - 1,
        })
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The NUMA node a CPU belongs to.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<usize> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// The kubelet's `NUMAInfo.NUMADistances` average over ordered pairs (self pairs included).
    pub fn average_distance(&self, mask: NumaMask) -> Option<f64> {
        let d = self.distances.as_ref()?;
        let n = mask.count();
        if n == 0 {
            return Some(0.0);
        }
        let mut sum = 0u64;
        for i in mask.nodes() {
            for j in mask.nodes() {
                sum += *d.get(i)?.get(j)? as u64;
            }
        }
        Some(sum as f64 / (n * n) as f64)
    }

    /// Checks node ids as a reader finds them (sorted): at most 64, and 0..n-1 (a `distance`
    /// row is indexed by position, so a hole would misattribute every distance after it).
    pub fn check_node_ids(ids: &[usize]) -> Result<(), DiscoveryError> {
        if ids.len() > MAX_NUMA_NODES {
            return Err(DiscoveryError::TooManyNodes(ids.len()));
        }
        if ids.iter().enumerate().any(|(i, id)| *id != i) {
            return Err(DiscoveryError::NonContiguousNodeIds {
                found: ids.to_vec(),
            });
        }
        Ok(())
    }

    /// Builds a topology from its nodes (by id) and distance matrix, refusing node ids that are
    /// not 0..n-1, a CPU on two nodes, and a matrix that is not n × n.
    pub fn from_nodes(
        nodes: Vec<NumaNode>,
        distances: Option<Vec<Vec<u32>>>,
    ) -> Result<Self, DiscoveryError> {
        let n = nodes.len();
        Self::check_node_ids(&nodes.iter().map(|node| node.id).collect::<Vec<_>>())?;
        let mut owner: BTreeMap<u32, usize> = BTreeMap::new();
        for node in &nodes {
            for &cpu in &node.cpus {
                if let Some(first) = owner.insert(cpu, node.id) {
                    return Err(DiscoveryError::DuplicateCpu {
                        cpu,
                        first,
                        second: node.id,
                    });
                }
            }
        }
        if let Some(d) = &distances {
            if d.len() != n {
                return Err(DiscoveryError::BadDistance {
                    node: d.len().min(n),
                    why: format!("{} rows for {} nodes", d.len(), n),
                });
            }
            for (i, row) in d.iter().enumerate() {
                if row.len() != n {
                    return Err(DiscoveryError::BadDistance {
                        node: i,
                        why: format!("{} entries for {} nodes", row.len(), n),
                    });
                }
            }
        }
        Ok(NumaTopology { nodes, distances })
    }

    /// Builds a topology from a machine description.
    pub fn from_config(config: &MachineConfig) -> Result<Self, DiscoveryError> {
        config.to_topology()
    }
}

/// Parses the kernel's cpulist format (`0-3,8,10-11`, possibly empty for CPU-less nodes).
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, CpuListError> {
    let mut cpus = vec![];
    if s.is_empty() {
        return Ok(cpus);
    }
    for part in s.split(',') {
        let part = part.trim();
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let not_a_cpu = |_| CpuListError::NotACpu(part.to_owned());
        let a: u32 = a.parse().map_err(not_a_cpu)?;
        let b: u32 = b.parse().map_err(not_a_cpu)?;
        if b < a {
            return Err(CpuListError::Backwards(part.to_owned()));
        }
        if b - a > 1 << 16 {
            return Err(CpuListError::TooLarge(part.to_owned()));
        }
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// A machine described in configuration (camelCase field names).
///
/// Either `nodes` + `cpusPerNode` (CPUs numbered node by node) or an explicit `layout`; the
/// distance matrix defaults to 10 on the diagonal and `remoteDistance` (default 20) elsewhere.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineConfig {
    /// Number of NUMA nodes.
    #[serde(default)]
    pub nodes: usize,
    /// CPUs on each node.
    #[serde(default)]
    pub cpus_per_node: u32,
    /// Explicit per-node CPU lists in cpulist format (overrides `nodes`/`cpusPerNode`).
    #[serde(default)]
    pub layout: Option<Vec<String>>,
    /// Full distance matrix.
    #[serde(default)]
    pub distances: Option<Vec<Vec<u32>>>,
    /// Off-diagonal distance when `distances` is absent.
    #[serde(default)]
    pub remote_distance: Option<u32>,
}

impl MachineConfig {
    /// A uniform machine.
    pub fn uniform(nodes: usize, cpus_per_node: u32) -> Self {
        MachineConfig {
            nodes,
            cpus_per_node,
            ..Default::default()
        }
    }

    /// Builds and validates the topology.
    pub fn to_topology(&self) -> Result<NumaTopology, DiscoveryError> {
        let nodes: Vec<NumaNode> = match &self.layout {
            Some(layout) => layout
                .iter()
                .enumerate()
                .map(|(id, s)| {
                    parse_cpu_list(s.trim())
                        .map(|cpus| NumaNode { id, cpus })
                        .map_err(|why| DiscoveryError::BadMachine(format!("layout[{id}]: {why}")))
                })
                .collect::<Result<_, _>>()?,
            None => (0..self.nodes)
                .map(|id| NumaNode {
                    id,
                    cpus: (0..self.cpus_per_node)
                        .map(|c| id as u32 * self.cpus_per_node + c)
                        .collect(),
                })
                .collect(),
        };
        if nodes.is_empty() {
            return Err(DiscoveryError::BadMachine(
                "a machine needs at least one NUMA node".into(),
            ));
        }
        if nodes.len() > MAX_NUMA_NODES {
            return Err(DiscoveryError::TooManyNodes(nodes.len()));
        }
        let n = nodes.len();
        let distances = match &self.distances {
            Some(d) => d.clone(),
            None => {
                let remote = self.remote_distance.unwrap_or(20);
                (0..n)
                    .map(|i| (0..n).map(|j| if i == j { 10 } else { remote }).collect())
                    .collect()
            }
        };
        NumaTopology::from_nodes(nodes, Some(distances))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: usize, cpus: &[u32]) -> NumaNode {
        NumaNode {
            id,
            cpus: cpus.to_vec(),
        }
    }

    #[test]
    fn from_nodes_builds_a_valid_topology() {
        let topo = NumaTopology::from_nodes(
            vec![
                node(0, &[0, 1, 2, 3, 8]),
                node(1, &[4, 5, 6, 7]),
                node(2, &[]),
            ],
            Some(vec![vec![10, 21, 31], vec![21, 10, 31], vec![31, 31, 10]]),
        )
        .expect("valid");
        assert_eq!(topo.node_count(), 3);
        assert_eq!(topo.default_mask(), NumaMask::from_bits(0b111));
        assert_eq!(topo.node_of_cpu(8), Some(0));
        assert!(
            topo.nodes[2].cpus.is_empty(),
            "memory-only nodes have no CPUs"
        );
        assert!(NumaTopology::from_nodes(vec![node(0, &[0])], None).is_ok());
    }

    #[test]
    fn from_nodes_rejects_holes_in_ids_a_cpu_on_two_nodes_and_odd_distances() {
        let err = NumaTopology::from_nodes(vec![node(0, &[0]), node(2, &[1])], None)
            .expect_err("hole in ids");
        assert!(
            matches!(err, DiscoveryError::NonContiguousNodeIds { ref found } if found == &vec![0, 2]),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "NUMA node ids are not contiguous from 0: found [0, 2]"
        );
        let err = NumaTopology::from_nodes(vec![node(0, &[0, 1]), node(1, &[1, 2])], None)
            .expect_err("cpu 1 twice");
        assert!(
            matches!(
                err,
                DiscoveryError::DuplicateCpu {
                    cpu: 1,
                    first: 0,
                    second: 1
                }
            ),
            "{err}"
        );
        assert_eq!(err.to_string(), "CPU 1 is listed by NUMA nodes 0 and 1");
        let two = || vec![node(0, &[0]), node(1, &[1])];
        assert!(matches!(
            NumaTopology::from_nodes(two(), Some(vec![vec![10], vec![20, 10]])),
            Err(DiscoveryError::BadDistance { node: 0, .. })
        ));
        assert!(matches!(
            NumaTopology::from_nodes(two(), Some(vec![vec![10, 20]])),
            Err(DiscoveryError::BadDistance { node: 1, .. })
        ));
        let many: Vec<usize> = (0..65).collect();
        assert!(matches!(
            NumaTopology::check_node_ids(&many),
            Err(DiscoveryError::TooManyNodes(65))
        ));
        assert!(NumaTopology::check_node_ids(&many[..64]).is_ok());
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8"), Ok(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpu_list("10-11,2,2"), Ok(vec![2, 10, 11]));
        assert_eq!(parse_cpu_list(""), Ok(vec![]));
        for bad in ["0-", "a-b", "1,,2"] {
            assert!(
                matches!(parse_cpu_list(bad), Err(CpuListError::NotACpu(_))),
                "{bad}"
            );
        }
        assert_eq!(
            parse_cpu_list("3-1"),
            Err(CpuListError::Backwards("3-1".into()))
        );
        assert_eq!(
            parse_cpu_list("0-70000"),
            Err(CpuListError::TooLarge("0-70000".into()))
        );
    }

    #[test]
    fn machine_config_describes_2_to_64_nodes() {
        for n in [2, 4, 8, 16, 64] {
            let topo = MachineConfig::uniform(n, 4).to_topology().expect("valid");
            assert_eq!(topo.node_count(), n);
            assert_eq!(topo.default_mask().count(), n);
            assert_eq!(topo.nodes[n - 1].cpus[0], (n as u32 - 1) * 4);
        }
        assert!(matches!(
            MachineConfig::uniform(65, 1).to_topology(),
            Err(DiscoveryError::TooManyNodes(65))
        ));
        assert!(matches!(
            MachineConfig::uniform(0, 1).to_topology(),
            Err(DiscoveryError::BadMachine(_))
        ));
    }

    #[test]
    fn calculate_avg_distance_for_masks() {
        let cfg = MachineConfig {
            nodes: 4,
            cpus_per_node: 1,
            distances: Some(vec![
                vec![10, 11, 12, 12],
                vec![11, 10, 12, 12],
                vec![12, 12, 10, 11],
                vec![12, 12, 11, 10],
            ]),
            ..Default::default()
        };
        let topo = cfg.to_topology().expect("valid");
        let avg = |nodes: &[usize]| {
            topo.average_distance(NumaMask::from_nodes(nodes.iter().copied()).expect("in range"))
                .expect("distances known")
        };
        assert_eq!(avg(&[0]), 10.0);
        assert_eq!(avg(&[0, 1]), 10.5);
        assert_eq!(avg(&[0, 2]), 11.0);
        assert_eq!(
            avg(&[0, 1, 2, 3]),
            (4.0 * 10.0 + 4.0 * 11.0 + 8.0 * 12.0) / 16.0
        );
        assert_eq!(topo.average_distance(NumaMask::EMPTY), Some(0.0));
        let mut no_distances = topo.clone();
        no_distances.distances = None;
        assert_eq!(no_distances.average_distance(NumaMask::from_bits(1)), None);
    }

    #[test]
    fn machine_config_from_json_with_distances() {
        let json = r#"{"layout":["0-1","2-3"],"distances":[[10,11],[11,10]]}"#;
        let cfg: MachineConfig = serde_json::from_str(json).expect("parses");
        let topo = cfg.to_topology().expect("valid");
        assert_eq!(topo.nodes[1].cpus, vec![2, 3]);
        assert_eq!(topo.average_distance(NumaMask::from_bits(0b11)), Some(10.5));
        let bad = r#"{"nodes":2,"cpusPerNode":1,"distances":[[10,11]]}"#;
        let cfg: MachineConfig = serde_json::from_str(bad).expect("parses");
        assert!(matches!(
            cfg.to_topology(),
            Err(DiscoveryError::BadDistance { .. })
        ));
        assert!(serde_json::from_str::<MachineConfig>(r#"{"nodez":2}"#).is_err());
    }
}
