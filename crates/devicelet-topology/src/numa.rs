//! NUMA topology of the machine, after the kubelet's `tm/numa_info.go` (`NUMAInfo`, node list,
//! distance matrix) fed by cadvisor's sysfs reader (`/sys/devices/system/node/node*/cpulist`,
//! `distance`). The sysfs root is a parameter so tests use fake trees, and a serde
//! [`MachineConfig`] describes a machine without sysfs (tests, demos, `--config`).
//!
//! Node ids must be 0..n-1: a `distance` file lists distances by position among online nodes,
//! so with holes in the ids the matrix could not be indexed by id; we refuse such trees with a
//! typed error instead of guessing. At most 64 nodes (the width of [`NumaMask`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

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

    fn validate(self) -> Result<Self, DiscoveryError> {
        let n = self.nodes.len();
        if n > MAX_NUMA_NODES {
            return Err(DiscoveryError::TooManyNodes(n));
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if node.id != i {
                return Err(DiscoveryError::NonContiguousNodeIds {
                    found: self.nodes.iter().map(|n| n.id).collect(),
                });
            }
        }
        let mut owner: BTreeMap<u32, usize> = BTreeMap::new();
        for node in &self.nodes {
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
        if let Some(d) = &self.distances {
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
        Ok(self)
    }

    /// Reads `<sysfs_root>/devices/system/node/node*/{cpulist,distance}`.
    pub fn from_sysfs(sysfs_root: &Path) -> Result<Self, DiscoveryError> {
        let dir = sysfs_root.join("devices/system/node");
        let entries = fs::read_dir(&dir).map_err(|source| DiscoveryError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut found: Vec<(usize, PathBuf)> = vec![];
        for entry in entries {
            let entry = entry.map_err(|source| DiscoveryError::Io {
                path: dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(suffix) = name.strip_prefix("node") else {
                continue;
            };
            let id: usize = suffix
                .parse()
                .map_err(|_| DiscoveryError::BadNodeName(name.clone()))?;
            found.push((id, entry.path()));
        }
        if found.is_empty() {
            return Err(DiscoveryError::NoNodes(dir));
        }
        found.sort();
        if found.len() > MAX_NUMA_NODES {
            return Err(DiscoveryError::TooManyNodes(found.len()));
        }
        if found.iter().enumerate().any(|(i, (id, _))| *id != i) {
            return Err(DiscoveryError::NonContiguousNodeIds {
                found: found.iter().map(|(i, _)| *i).collect(),
            });
        }
        let read = |p: PathBuf| {
            fs::read_to_string(&p).map_err(|source| DiscoveryError::Io { path: p, source })
        };
        let mut nodes = vec![];
        let mut distances = vec![];
        for (id, path) in &found {
            let cpulist_path = path.join("cpulist");
            let content = read(cpulist_path.clone())?;
            let cpus =
                parse_cpu_list(content.trim()).map_err(|why| DiscoveryError::BadCpuList {
                    path: cpulist_path,
                    content: content.clone(),
                    why,
                })?;
            nodes.push(NumaNode { id: *id, cpus });
            let content = read(path.join("distance"))?;
            let row: Result<Vec<u32>, _> =
                content.split_whitespace().map(str::parse::<u32>).collect();
            let row = row.map_err(|e| DiscoveryError::BadDistance {
                node: *id,
                why: format!("{content:?}: {e}"),
            })?;
            distances.push(row);
        }
        NumaTopology {
            nodes,
            distances: Some(distances),
        }
        .validate()
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
        NumaTopology {
            nodes,
            distances: Some(distances),
        }
        .validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs(nodes: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("devices/system/node");
        fs::create_dir_all(&base).expect("mkdir");
        // Non-node entries that real sysfs has must be ignored.
        fs::write(base.join("online"), "0-1\n").expect("write");
        fs::create_dir_all(base.join("power")).expect("mkdir");
        for (name, cpulist, distance) in nodes {
            let d = base.join(name);
            fs::create_dir_all(&d).expect("mkdir");
            if !cpulist.is_empty() {
                fs::write(d.join("cpulist"), cpulist).expect("write");
            }
            if !distance.is_empty() {
                fs::write(d.join("distance"), distance).expect("write");
            }
        }
        dir
    }

    #[test]
    fn sysfs_two_nodes_are_read() {
        let t = fake_sysfs(&[
            ("node0", "0-3,8\n", "10 21\n"),
            ("node1", "4-7\n", "21 10\n"),
        ]);
        let topo = NumaTopology::from_sysfs(t.path()).expect("valid tree");
        assert_eq!(topo.node_count(), 2);
        assert_eq!(topo.nodes[0].cpus, vec![0, 1, 2, 3, 8]);
        assert_eq!(topo.distances, Some(vec![vec![10, 21], vec![21, 10]]));
        assert_eq!(topo.default_mask(), NumaMask::from_bits(0b11));
        assert_eq!(topo.node_of_cpu(8), Some(0));
    }

    #[test]
    fn sysfs_missing_cpulist_is_an_io_error() {
        let t = fake_sysfs(&[("node0", "", "10\n")]);
        let err = NumaTopology::from_sysfs(t.path()).expect_err("missing file");
        assert!(matches!(err, DiscoveryError::Io { .. }), "{err}");
        assert!(err.to_string().contains("cpulist"), "{err}");
    }

    #[test]
    fn sysfs_missing_root_is_an_io_error() {
        let t = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            NumaTopology::from_sysfs(t.path()),
            Err(DiscoveryError::Io { .. })
        ));
    }

    #[test]
    fn sysfs_odd_cpulist_is_rejected() {
        for bad in ["0-", "a-b", "3-1", "1,,2"] {
            let t = fake_sysfs(&[("node0", bad, "10\n")]);
            let err = NumaTopology::from_sysfs(t.path()).expect_err("bad cpulist");
            assert!(
                matches!(err, DiscoveryError::BadCpuList { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn sysfs_odd_distance_is_rejected() {
        let t = fake_sysfs(&[("node0", "0", "10 x\n"), ("node1", "1", "20 10\n")]);
        assert!(matches!(
            NumaTopology::from_sysfs(t.path()),
            Err(DiscoveryError::BadDistance { node: 0, .. })
        ));
        let t = fake_sysfs(&[("node0", "0", "10\n"), ("node1", "1", "20 10\n")]);
        assert!(matches!(
            NumaTopology::from_sysfs(t.path()),
            Err(DiscoveryError::BadDistance { node: 0, .. })
        ));
    }

    #[test]
    fn sysfs_non_contiguous_node_ids_are_rejected() {
        let t = fake_sysfs(&[("node0", "0", "10 20\n"), ("node2", "1", "20 10\n")]);
        let err = NumaTopology::from_sysfs(t.path()).expect_err("hole in ids");
        assert!(
            matches!(err, DiscoveryError::NonContiguousNodeIds { ref found } if found == &vec![0, 2]),
            "{err}"
        );
    }

    #[test]
    fn sysfs_bad_node_name_and_empty_tree_are_rejected() {
        let t = fake_sysfs(&[("nodeX", "0", "10\n")]);
        assert!(matches!(
            NumaTopology::from_sysfs(t.path()),
            Err(DiscoveryError::BadNodeName(_))
        ));
        let t = fake_sysfs(&[]);
        assert!(matches!(
            NumaTopology::from_sysfs(t.path()),
            Err(DiscoveryError::NoNodes(_))
        ));
    }

    #[test]
    fn sysfs_cpu_on_two_nodes_is_rejected() {
        let t = fake_sysfs(&[("node0", "0-1", "10 20\n"), ("node1", "1-2", "20 10\n")]);
        assert!(matches!(
            NumaTopology::from_sysfs(t.path()),
            Err(DiscoveryError::DuplicateCpu { cpu: 1, .. })
        ));
    }

    #[test]
    fn sysfs_memory_only_node_has_no_cpus() {
        let t = fake_sysfs(&[("node0", "0-1", "10 20\n"), ("node1", "\n", "20 10\n")]);
        let topo = NumaTopology::from_sysfs(t.path()).expect("valid");
        assert!(topo.nodes[1].cpus.is_empty());
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
