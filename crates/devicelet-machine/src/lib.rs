//! devicelet-machine: machine discovery, the part of cadvisor (`utils/sysfs/sysfs.go`,
//! `machine/topology.go`) that the kubelet's Topology Manager (`cm/topologymanager/`,
//! `tm/numa_info.go`) and CPU manager (`cm/cpumanager/topology/topology.go`, `Discover`) rely
//! on. Every sysfs read of the node happens here; the results are the pure types of
//! `devicelet-topology` ([`NumaTopology`]) and `devicelet-cpumanager` ([`CpuTopology`]), built
//! and validated by their constructors.
//!
//! The sysfs root is a parameter (default [`SYSFS_ROOT`]) so tests use fake trees.
//!
//! Entry points: [`discover`] (both), [`read_numa_topology`], [`read_cpu_topology`].
//!
//! [`NumaTopology`]: devicelet_topology::NumaTopology
//! [`CpuTopology`]: devicelet_cpumanager::CpuTopology

pub mod cpu;
pub mod error;
pub mod machine;
pub mod memory;
pub mod numa;
mod sysfs;

pub use cpu::read_cpu_topology;
pub use error::MachineError;
pub use machine::{Machine, SYSFS_ROOT, discover};
pub use memory::read_memory_topology;
pub use numa::read_numa_topology;
