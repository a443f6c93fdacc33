//! Typed errors of the memory manager. Texts that reach pods or logs are the kubelet's, from
//! `memorymanager/memory_manager.go`, `policy_static.go` and `state/state_checkpoint.go`.

use std::path::PathBuf;

use thiserror::Error;

/// Errors of the memory manager (configuration, machine description, state, allocation).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MemoryManagerError {
    /// Unknown `memoryManagerPolicy`.
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    /// `BestEffort` exists upstream only on Windows; devicelet does not implement it.
    #[error(
        "policy \"BestEffort\" is not supported by devicelet (the kubelet offers it only on Windows)"
    )]
    BestEffortNotSupported,
    /// A `reservedMemory` entry for a NUMA node the machine lacks.
    #[error(
        "the reserved memory configuration references a NUMA node {0} that does not exist on this machine"
    )]
    ReservedOnMissingNode(i64),
    /// `reservedMemory` total of a type differs from what Node Allocatable reserves.
    #[error(
        "the total amount \"{reserved}\" of type \"{resource}\" is not equal to the value \"{allocatable}\" determined by Node Allocatable feature"
    )]
    ReservedMismatch {
        /// The `reservedMemory` total (canonical quantity).
        reserved: String,
        /// The resource name.
        resource: String,
        /// kube + system reserved (+ hard eviction for memory).
        allocatable: String,
    },
    /// A reservation that is not a whole number of bytes (`AsInt64` failed).
    #[error("could not covert a variable of type Quantity to int64")]
    ReservedNotInteger,
    /// A quantity string that does not parse.
    #[error("bad quantity {value:?} for {resource:?}: {why}")]
    BadQuantity {
        /// Resource name.
        resource: String,
        /// The text.
        value: String,
        /// Parse error.
        why: String,
    },
    /// The static policy without reserved memory.
    #[error("[memorymanager] you should specify the system reserved memory")]
    NoReservedMemory,
    /// A machine description that cannot exist.
    #[error("bad machine memory description: {0}")]
    BadMachine(String),
    /// The checkpoint could not be restored (the kubelet's wording).
    #[error(
        "could not restore state from checkpoint: {detail}, please drain this node and delete the memory manager checkpoint file {path:?} before restarting Kubelet"
    )]
    Restore {
        /// What was wrong.
        detail: String,
        /// The file.
        path: PathBuf,
    },
    /// The restored state does not fit the machine or the assignments (`validateState`).
    #[error("{0}")]
    InvalidState(String),
    /// No NUMA nodes can hold the request (`getDefaultHint`).
    #[error(
        "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
    )]
    NoDefaultAffinity,
    /// The default hint was not preferred while the Topology Manager's was.
    #[error("[memorymanager] failed to find the default preferred hint")]
    NoDefaultPreferredHint,
    /// The Topology Manager's hint could not be widened to one that holds the request.
    #[error("[memorymanager] failed to find NUMA nodes to extend the current topology hint")]
    CannotExtendHint,
    /// The widened hint was not preferred while the Topology Manager's was.
    #[error("[memorymanager] failed to find the extended preferred hint")]
    NoExtendedPreferredHint,
    /// The hint mixes nodes of single-NUMA and multi-NUMA allocations.
    #[error("[memorymanager] preferred hint violates NUMA node allocation")]
    ViolatesNumaAllocation,
    /// A request that is not a whole number of bytes.
    #[error("[memorymanager] failed to represent quantity as int64")]
    RequestNotInteger,
    /// Writing the checkpoint failed; the file keeps its previous content.
    /// Pod-level management (KEP-5526): the containers that need the pod's shared memory
    /// would find none (`validatePodScopeResources`; the kubelet's `EmptyPodSharedPoolError`,
    /// whose message is this text).
    #[error("{0}")]
    EmptyPodSharedPool(String),
    #[error("cannot write memory manager checkpoint {path}: {detail}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        detail: String,
    },
}
