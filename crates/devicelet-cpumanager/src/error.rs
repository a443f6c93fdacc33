//! Typed errors of the CPU manager. Texts that reach pods or logs follow the kubelet's
//! `cpumanager/cpu_manager.go`, `policy_static.go`, `cpu_assignment.go` and
//! `state/state_checkpoint.go`.

use std::path::PathBuf;

use thiserror::Error;

/// Problems describing the CPU topology (sockets, cores, threads, NUMA nodes); reading it from
/// sysfs has its own errors in `devicelet-machine`.
#[derive(Debug, Error)]
pub enum CpuTopologyError {
    /// A machine description that cannot exist.
    #[error("bad machine description: {0}")]
    BadMachine(String),
    /// The same CPU id appears twice.
    #[error("CPU {0} is listed more than once")]
    DuplicateCpu(u32),
    /// The machine has no CPU.
    #[error("the machine has no CPUs")]
    NoCpus,
    /// The NUMA description is not a valid topology.
    #[error(transparent)]
    Numa(#[from] devicelet_topology::DiscoveryError),
}

/// `takeByTopology` failures.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TakeError {
    /// `takeByTopologyNUMADistributed` took a different count than asked (cannot happen unless
    /// the machine description is inconsistent; the kubelet's text).
    #[error("accounting error, not enough CPUs allocated, remaining: {0}")]
    Accounting(usize),
    /// The packed accumulator ran out of CPUs (the kubelet's text).
    #[error("failed to allocate cpus")]
    Failed,
    /// Fewer free CPUs than requested (the kubelet's text).
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnough {
        /// CPUs requested.
        requested: usize,
        /// CPUs that were available.
        available: usize,
    },
}

/// Errors of the CPU manager (construction, allocation, state).
#[derive(Debug, Error)]
pub enum CpuManagerError {
    /// Unknown `cpuManagerPolicy`.
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    /// The static policy without any reserved CPU (`cpu_manager.go`).
    #[error(
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    )]
    NoReservedCpus,
    /// `reservedSystemCPUs` names CPUs the machine does not have, or the count cannot be met.
    #[error(
        "[cpumanager] unable to reserve the required amount of CPUs (size of {got} did not equal {want})"
    )]
    ReserveFailed {
        /// The set that could be reserved.
        got: String,
        /// The count asked for.
        want: usize,
    },
    /// `reservedSystemCPUs` lists CPUs not on this machine.
    #[error("reserved CPUs \"{reserved}\" are not a subset of the machine's CPUs \"{all}\"")]
    ReservedNotOnMachine {
        /// The configured set.
        reserved: String,
        /// The machine.
        all: String,
    },
    /// A bad `reservedSystemCPUs` string.
    #[error("bad reservedSystemCPUs {0:?}: {1}")]
    BadReservedList(String, String),
    /// An unknown static-policy option, or one not implemented here.
    #[error("unknown CPU Manager Policy option: \"{0}\"")]
    UnknownOption(String),
    /// A bad boolean option value.
    #[error(
        "bad value for option \"{option}\": strconv.ParseBool: parsing \"{value}\": invalid syntax"
    )]
    BadOptionValue {
        /// Option.
        option: String,
        /// Value.
        value: String,
    },
    /// An option whose stage gate is off (`CheckPolicyOptionAvailable`).
    #[error(
        "CPU Manager Policy {level}-level Options not enabled, but option \"{option}\" provided"
    )]
    OptionGateDisabled {
        /// `Alpha` or `Beta`.
        level: &'static str,
        /// The option.
        option: String,
    },
    /// Two options that `NewStaticPolicyOptions` refuses together.
    #[error("static policy options {first} and {second} can not be used at the same time")]
    IncompatibleOptions {
        /// First option (the kubelet's order).
        first: &'static str,
        /// Second option.
        second: &'static str,
    },
    /// `align-by-socket` with the Topology Manager's `single-numa-node` policy (the kubelet's
    /// text, typo included).
    #[error(
        "Topolgy manager single-numa-node policy is incompatible with CPUManager align-by-socket policy option"
    )]
    AlignBySocketWithSingleNumaNode,
    /// `align-by-socket` on a machine with more sockets than NUMA nodes.
    #[error(
        "Align by socket is not compatible with hardware where number of sockets are more than number of NUMA"
    )]
    AlignBySocketMoreSocketsThanNuma,
    /// The none policy with options (`NewNonePolicy`).
    #[error("None policy: received unsupported options=map[{0}]")]
    NonePolicyOptions(String),
    /// Not enough CPUs.
    #[error(transparent)]
    Take(#[from] TakeError),
    /// `full-pcpus-only`: a request that is not a multiple of the SMT level.
    #[error(
        "SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {cpus_per_core}"
    )]
    SmtNotMultiple {
        /// CPUs requested.
        requested: usize,
        /// Threads per core.
        cpus_per_core: usize,
    },
    /// `full-pcpus-only`: not enough whole free cores.
    #[error(
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {available}, requested CPUs = {requested}, CPUs per core = {cpus_per_core}"
    )]
    SmtNotEnoughPhysical {
        /// CPUs in wholly free cores.
        available: usize,
        /// CPUs requested.
        requested: usize,
        /// Threads per core.
        cpus_per_core: usize,
    },
    /// Pod-level management (KEP-5526): the containers that need the pod's shared pool would
    /// find it empty (`validatePodScopeResources`; the kubelet's `EmptyPodSharedPoolError`,
    /// whose message is this text).
    #[error("{0}")]
    EmptyPodSharedPool(String),
    /// The checkpoint could not be restored (`state_checkpoint.go` wording).
    #[error(
        "could not restore state from checkpoint: {detail}, please drain this node and delete the CPU manager checkpoint file {path:?} before restarting Kubelet"
    )]
    Restore {
        /// What was wrong.
        detail: String,
        /// The file.
        path: PathBuf,
    },
    /// The restored state does not fit the machine or the reserved set (`validateState`).
    #[error("[cpumanager] invalid state: {0}, please drain node and remove policy state file")]
    InvalidState(String),
    /// Writing the checkpoint failed (the file keeps its previous content, no temporary file
    /// is left). An allocation did not happen; a removal happened in memory and reaches the
    /// file with the next successful write.
    #[error("cannot write CPU manager checkpoint {path}: {detail}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        detail: String,
    },
}
