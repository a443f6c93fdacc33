//! Reading one sysfs file, with the path in the error (cadvisor's `sysfs.go` helpers).

use std::fs;
use std::path::PathBuf;

use crate::error::MachineError;

/// The whole file as text.
pub(crate) fn read(path: PathBuf) -> Result<String, MachineError> {
    fs::read_to_string(&path).map_err(|source| MachineError::Io { path, source })
}

/// A file holding one non-negative integer (`physical_package_id`, `core_id`).
pub(crate) fn read_u32(path: PathBuf) -> Result<u32, MachineError> {
    let content = read(path.clone())?;
    content
        .trim()
        .parse::<u32>()
        .map_err(|_| MachineError::BadValue { path, content })
}
