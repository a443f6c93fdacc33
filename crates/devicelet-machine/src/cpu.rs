//! CPU placement from `devices/system/cpu/cpuN/topology/{physical_package_id,core_id}`
//! (cadvisor's `sysfs.go` `GetCoreID` / `GetCPUPhysicalPackageID`, feeding the kubelet's
//! `cm/cpumanager/topology/topology.go` `Discover`).

use std::path::Path;

use devicelet_cpumanager::{CpuPlacement, CpuTopology};
use devicelet_topology::NumaTopology;

use crate::error::MachineError;
use crate::sysfs::read_u32;

/// Reads socket and core of every CPU that `numa` lists (the online CPUs of each node).
pub fn read_cpu_topology(
    sysfs_root: &Path,
    numa: &NumaTopology,
) -> Result<CpuTopology, MachineError> {
    let mut placements = vec![];
    for node in &numa.nodes {
        for &cpu in &node.cpus {
            let dir = sysfs_root.join(format!("devices/system/cpu/cpu{cpu}/topology"));
            placements.push(CpuPlacement {
                id: cpu,
                socket: read_u32(dir.join("physical_package_id"))?,
                core_id: read_u32(dir.join("core_id"))?,
                numa: node.id,
            });
        }
    }
    Ok(CpuTopology::from_placements(placements)?)
}
