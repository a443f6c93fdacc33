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
