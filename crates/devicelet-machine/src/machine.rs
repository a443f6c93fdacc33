//! Discovery as the kubelet does it at start: NUMA nodes, then the placement of their CPUs.

use std::path::Path;

use devicelet_cpumanager::CpuTopology;
use devicelet_topology::NumaTopology;

use crate::cpu::read_cpu_topology;
use crate::error::MachineError;
use crate::numa::read_numa_topology;

/// Where sysfs is mounted on a real node.
pub const SYSFS_ROOT: &str = "/sys";

/// What the Topology and CPU managers need to know of the machine.
#[derive(Clone, Debug)]
pub struct Machine {
    /// NUMA nodes, their CPUs and distances.
    pub numa: NumaTopology,
    /// Sockets, cores and threads of the CPUs on those nodes.
    pub cpus: CpuTopology,
}

/// Reads the machine under `sysfs_root` (cadvisor's `GetTopology` for the kubelet's
/// `topology.Discover`).
pub fn discover(sysfs_root: &Path) -> Result<Machine, MachineError> {
    let numa = read_numa_topology(sysfs_root)?;
    let cpus = read_cpu_topology(sysfs_root, &numa)?;
    Ok(Machine { numa, cpus })
}
