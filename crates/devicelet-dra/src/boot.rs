//! Boot identity, to tell a node reboot from a devicelet restart (spec ecosystem.md A1 row 5,
//! A7 row 53): after a reboot every driver-side preparation (CDI specs in tmpfs `/var/run/cdi`)
//! is gone, so cached claims must be prepared again before a new sandbox uses them.

use std::path::PathBuf;

use crate::error::DraError;

/// Where the current boot ID comes from.
pub trait BootIdSource: Send + Sync + 'static {
    /// The current boot ID (any stable string per boot).
    fn boot_id(&self) -> Result<String, DraError>;
}

/// Linux: `/proc/sys/kernel/random/boot_id` (a UUID regenerated on every boot).
#[derive(Debug, Clone)]
pub struct ProcBootId {
    path: PathBuf,
}

impl Default for ProcBootId {
    fn default() -> Self {
        ProcBootId {
            path: PathBuf::from("/proc/sys/kernel/random/boot_id"),
        }
    }
}

impl ProcBootId {
    /// Reads another file (tests).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        ProcBootId { path: path.into() }
    }
}

impl BootIdSource for ProcBootId {
    fn boot_id(&self) -> Result<String, DraError> {
        std::fs::read_to_string(&self.path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| DraError::Io {
                action: "reading boot ID",
                path: self.path.clone(),
                source,
            })
    }
}

/// A fixed boot ID (tests, benches).
#[derive(Debug, Clone)]
pub struct FixedBootId(pub String);

impl BootIdSource for FixedBootId {
    fn boot_id(&self) -> Result<String, DraError> {
        Ok(self.0.clone())
    }
}
