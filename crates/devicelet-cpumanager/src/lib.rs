//! devicelet-cpumanager: the kubelet's CPU manager (`pkg/kubelet/cm/cpumanager`) with the
//! `none` and `static` policies.
//!
//! * [`CpuTopology`]: sockets / cores / threads / NUMA nodes, from a description or from sysfs
//!   placements ([`CpuPlacement`], read by `devicelet-machine`);
//! * [`take_by_topology`] / [`take_by_topology_with`]: the kubelet's CPU accumulator (NUMA
//!   packed, NUMA distributed, spread over cores, uncore-cache aware);
//! * [`StaticPolicyOptions`]: every 1.36.3 static-policy option, checked against the feature
//!   gates ([`devicelet_topology::FeatureGates`]) and the machine;
//! * [`CpuManager`]: exclusive integer CPUs for Guaranteed pods, shared pool for the rest,
//!   reserved CPUs, init-container CPU reuse, NUMA-aligned allocation, `cpu_manager_state`;
//!   a [`devicelet_topology::HintProvider`] for the Topology Manager;
//! * [`pod_from_k8s`]: a k8s-openapi `Pod` to [`devicelet_topology::PodSpec`] + QoS + CPU
//!   requests.

pub mod assign;
pub mod bits;
pub mod error;
pub mod manager;
pub mod options;
pub mod pod;
pub mod state;
pub mod topology;

pub use assign::{
    SortingStrategy, cpus_in_free_cores, take_by_topology, take_by_topology_with, take_distributed,
    take_packed,
};
pub use bits::CpuBits;
pub use error::{CpuManagerError, CpuTopologyError, TakeError};
pub use manager::{CPU_RESOURCE, CpuManager, CpuManagerConfig, CpuPolicyName, ReservedCpus};
pub use options::StaticPolicyOptions;
pub use pod::{PodConversionError, PodCpuInfo, QosClass, Quantity, QuantityError, pod_from_k8s};
pub use state::{Assignments, CheckpointFile, CpuState};
pub use topology::{CpuInfo, CpuMachineConfig, CpuPlacement, CpuTopology};
