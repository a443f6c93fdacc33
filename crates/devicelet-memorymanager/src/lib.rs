//! devicelet-memorymanager: the kubelet's Memory Manager (`pkg/kubelet/cm/memorymanager`,
//! KEP-1769) with the `None` and `Static` policies, as pure code (no async; the only IO is the
//! state file, written through `devicelet-checkpoint`'s atomic write).
//!
//! * [`MemoryTopology`]: NUMA nodes with their memory and hugepages (read from sysfs by
//!   `devicelet-machine`, or described directly);
//! * [`MemoryManagerConfig`] and its checks ([`config::validate_reserved_memory`],
//!   [`config::static_system_reserved`]), with the kubelet's error texts;
//! * [`MemoryState`] and `memory_manager_state` ([`CheckpointFile`]);
//! * [`MemoryManager`]: NUMA-pinned memory and hugepages for Guaranteed pods, multi-NUMA
//!   groups, init-container memory reuse, restore + `validateState`; a
//!   [`devicelet_topology::HintProvider`] for the Topology Manager under the resource names
//!   `memory` and `hugepages-<size>`.

pub mod config;
pub mod error;
pub mod manager;
pub mod policy;
pub mod state;
pub mod topology;

pub use config::{MemoryManagerConfig, MemoryPolicyName, ReservedMemory, SystemReserved};
pub use error::MemoryManagerError;
pub use manager::MemoryManager;
pub use state::{Assignments, CheckpointFile, MachineState, MemoryBlock, MemoryState, NodeState};
pub use topology::{
    HUGEPAGES_PREFIX, MEMORY_RESOURCE, MemoryTopology, NumaMemory, hugepage_resource_name,
    is_memory_resource,
};
