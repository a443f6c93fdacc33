//! devicelet-topology: the kubelet's Topology Manager (`pkg/kubelet/cm/topologymanager`) and the
//! device manager's hint generation (`pkg/kubelet/cm/devicemanager/topology_hints.go`) as pure
//! code (no IO, no async), plus the machine's NUMA layout ([`NumaTopology`]); `devicelet-machine`
//! reads that layout from sysfs.
//!
//! Results are the kubelet's; the way to them is not. The kubelet enumerates every subset of
//! NUMA nodes to generate hints and every combination of hints to merge them, which never
//! finishes on 34-NUMA machines (spec ecosystem A6 row 38). Here generated hints stay in a
//! compact form ([`HintFamily`]) and the merge searches for the best result directly (see
//! [`merge`]); [`reference`] keeps the literal kubelet algorithm as the test oracle.
//!
//! Entry points: [`TopologyManager`] (policies, scopes, admission), [`Policy::merge`],
//! [`device_hints`] / [`resource_hints`] / [`filter_by_affinity`], [`NumaTopology::from_nodes`],
//! [`MachineConfig`].

pub mod device;
pub mod error;
pub mod gates;
pub mod hint;
pub mod manager;
pub mod mask;
pub mod merge;
pub mod numa;
pub mod policy;
pub mod reference;

pub use device::{
    AffinityGroups, DeviceHints, DeviceNuma, allocated_device_hints, check_device_numa_nodes,
    device_hints, device_numa_nodes, filter_by_affinity, has_topology_alignment, resource_hints,
};
pub use error::{AdmissionError, ConfigError, CpuListError, DiscoveryError, TopologyError};
pub use gates::{FeatureGateError, FeatureGates};
pub use hint::{HintFamily, ProviderHints, ResourceHints, TopologyHint};
pub use manager::{
    ContainerSpec, HintMerger, HintProvider, PodAdmission, PodSpec, ProviderError, TopologyManager,
    pod_effective_limits,
};
pub use mask::{MAX_NUMA_NODES, NumaMask};
pub use merge::{TieBreak, merge_providers, merge_single_numa_node};
pub use numa::{MachineConfig, NumaNode, NumaTopology};
pub use policy::{Policy, PolicyName, PolicyOptions, ScopeName};
