//! Typed errors of the topology crate: configuration (texts as in the kubelet's
//! `topology_manager.go` / `policy_options.go`), admission (`TopologyAffinityError` and the
//! `UnexpectedAdmissionError` wrapping of `pkg/kubelet/cm/admission`), invalid NUMA topologies
//! and machine descriptions.

use thiserror::Error;

/// Errors about masks, hint generation and device topology.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TopologyError {
    /// A NUMA id that a 64-bit mask cannot hold.
    #[error("NUMA node {node} is out of range (valid ids are 0..63)")]
    NodeOutOfRange {
        /// The id.
        node: i64,
    },
    /// Spelling a hint family out would take too long.
    #[error("refusing to enumerate all subsets of {nodes} NUMA nodes (limit {max})")]
    TooManyNodesToEnumerate {
        /// Nodes in the universe.
        nodes: usize,
        /// Limit passed by the caller.
        max: usize,
    },
    /// A device reports a NUMA node the machine does not have.
    #[error("device {device:?} reports NUMA node {node}, which this machine does not have")]
    UnknownNumaNode {
        /// Device id.
        device: String,
        /// Reported NUMA id.
        node: i64,
    },
}

/// Errors building a Topology Manager from its configuration. Texts follow the kubelet.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Unknown `topologyManagerPolicy`.
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    /// Unknown `topologyManagerScope`.
    #[error("unknown scope: \"{0}\"")]
    UnknownScope(String),
    /// Unknown key in `topologyManagerPolicyOptions`.
    #[error("unknown Topology Manager Policy option: \"{0}\"")]
    UnknownOption(String),
    /// A boolean option that Go's `strconv.ParseBool` would refuse.
    #[error(
        "bad value for option \"{option}\": strconv.ParseBool: parsing \"{value}\": invalid syntax"
    )]
    BadBool {
        /// Option name.
        option: String,
        /// Offending value.
        value: String,
    },
    /// An integer option that does not parse.
    #[error(
        "unable to convert policy option to integer \"{option}\": strconv.Atoi: parsing \"{value}\": invalid syntax"
    )]
    BadInt {
        /// Option name.
        option: String,
        /// Offending value.
        value: String,
    },
    /// `max-allowable-numa-nodes` below 8.
    #[error("the minimum value of \"max-allowable-numa-nodes\" should not be less than 8")]
    MaxNumaNodesTooSmall,
    /// `prefer-closest-numa-nodes` without a distance matrix.
    #[error("cannot discover NUMA topology: error getting NUMA distances from cadvisor")]
    MissingDistances,
    /// More NUMA nodes than `max-allowable-numa-nodes` allows.
    #[error("unsupported on machines with more than {0} NUMA Nodes")]
    TooManyNumaNodes(usize),
}

/// Why a pod was not admitted. `reason()` / `message()` give the kubelet's pod status texts.
#[derive(Debug, Error)]
pub enum AdmissionError {
    /// The merged hint is not acceptable under the policy.
    #[error("Resources cannot be allocated with Topology locality")]
    TopologyAffinity,
    /// A hint provider's `allocate` failed.
    #[error("Allocate failed due to {0}, which is unexpected")]
    Allocate(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl AdmissionError {
    /// The pod status reason the kubelet sets.
    pub fn reason(&self) -> &'static str {
        match self {
            AdmissionError::TopologyAffinity => "TopologyAffinityError",
            AdmissionError::Allocate(_) => "UnexpectedAdmissionError",
        }
    }

    /// The pod status message the kubelet sets.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// A NUMA topology that cannot be (sysfs trees read by `devicelet-machine`, machine
/// descriptions). Reading sysfs has its own errors there (`MachineError`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DiscoveryError {
    /// Node ids are not 0..n-1 (distance rows could not be indexed by id).
    #[error("NUMA node ids are not contiguous from 0: found {found:?}")]
    NonContiguousNodeIds {
        /// The ids found, sorted.
        found: Vec<usize>,
    },
    /// More nodes than a mask can hold.
    #[error("{0} NUMA nodes found; at most 64 are supported")]
    TooManyNodes(usize),
    /// A `distance` file in a bad format or of the wrong length.
    #[error("bad distance row for NUMA node {node}: {why}")]
    BadDistance {
        /// The node.
        node: usize,
        /// What is wrong.
        why: String,
    },
    /// A CPU listed by two nodes.
    #[error("CPU {cpu} is listed by NUMA nodes {first} and {second}")]
    DuplicateCpu {
        /// The CPU.
        cpu: u32,
        /// First node.
        first: usize,
        /// Second node.
        second: usize,
    },
    /// A machine description that cannot describe a machine.
    #[error("invalid machine description: {0}")]
    BadMachine(String),
}

/// Why a cpulist (`0-3,8,10-11`) does not parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CpuListError {
    /// An element that is neither a CPU number nor a range of them.
    #[error("{0:?} is not a CPU or range")]
    NotACpu(String),
    /// A range whose end is below its start.
    #[error("range {0:?} goes backwards")]
    Backwards(String),
    /// A range of more than 65 536 CPUs.
    #[error("range {0:?} is implausibly large")]
    TooLarge(String),
}
