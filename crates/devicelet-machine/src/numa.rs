//! NUMA nodes from `devices/system/node/node*/{cpulist,distance}` (cadvisor's `sysfs.go`
//! `GetNodesPaths` / `GetCPUsPaths`, the distances of the kubelet's `tm/numa_info.go`).
//!
//! Node ids are checked before any node file is read: a `distance` row lists distances by
//! position among online nodes, so a tree with holes in its ids is refused as such rather than
//! as whatever file happens to be missing.

use std::path::Path;

use devicelet_topology::numa::parse_cpu_list;
use devicelet_topology::{DiscoveryError, NumaNode, NumaTopology};

use crate::error::MachineError;
use crate::sysfs::{node_dirs, read};

/// Reads `<sysfs_root>/devices/system/node/node*/{cpulist,distance}`.
pub fn read_numa_topology(sysfs_root: &Path) -> Result<NumaTopology, MachineError> {
    let (_, found) = node_dirs(sysfs_root)?;
    NumaTopology::check_node_ids(&found.iter().map(|(id, _)| *id).collect::<Vec<_>>())?;
    let mut nodes = vec![];
    let mut distances = vec![];
    for (id, path) in found {
        let cpulist_path = path.join("cpulist");
        let content = read(cpulist_path.clone())?;
        let cpus = parse_cpu_list(content.trim()).map_err(|why| MachineError::BadCpuList {
            path: cpulist_path,
            content: content.clone(),
            why,
        })?;
        nodes.push(NumaNode { id, cpus });
        let content = read(path.join("distance"))?;
        let row: Result<Vec<u32>, _> = content.split_whitespace().map(str::parse::<u32>).collect();
        let row = row.map_err(|e| DiscoveryError::BadDistance {
            node: id,
            why: format!("{content:?}: {e}"),
        })?;
        distances.push(row);
    }
    Ok(NumaTopology::from_nodes(nodes, Some(distances))?)
}
