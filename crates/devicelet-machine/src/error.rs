//! Typed errors of sysfs discovery. Texts are the ones the topology and CPU manager crates gave
//! before the reader moved here (the daemon's startup error quotes them).

use std::path::PathBuf;

use devicelet_cpumanager::CpuTopologyError;
use devicelet_topology::{CpuListError, DiscoveryError};
use thiserror::Error;

/// Why the machine could not be read from sysfs.
#[derive(Debug, Error)]
pub enum MachineError {
    /// A sysfs file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// No `node*` directories.
    #[error("no NUMA nodes found under {0}")]
    NoNodes(PathBuf),
    /// A `node<N>` directory whose suffix is not a number.
    #[error("unexpected NUMA node directory name {0:?}")]
    BadNodeName(String),
    /// A `cpulist` file in a bad format.
    #[error("bad cpulist {content:?} in {path}: {why}")]
    BadCpuList {
        /// The file.
        path: PathBuf,
        /// Its content.
        content: String,
        /// What is wrong.
        why: CpuListError,
    },
    /// A topology file (`physical_package_id`, `core_id`) that does not hold a non-negative
    /// integer.
    #[error("bad value {content:?} in {path}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
    /// The NUMA layout read is not a valid topology (or a `distance` row does not parse).
    #[error(transparent)]
    Numa(#[from] DiscoveryError),
    /// The CPU placement read is not a valid CPU topology.
    #[error(transparent)]
    Cpu(#[from] CpuTopologyError),
}
