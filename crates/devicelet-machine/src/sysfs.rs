//! Reading sysfs files, with the path in the error (cadvisor's `sysfs.go` helpers).

use std::fs;
use std::path::{Path, PathBuf};

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

/// The NUMA node directories under `<sysfs_root>/devices/system/node` (`nodeN`, by id); the
/// other entries of a real tree (`online`, `possible`, `power`, ...) are skipped. Returns the
/// directory too, for errors about the whole set.
pub(crate) fn node_dirs(
    sysfs_root: &Path,
) -> Result<(PathBuf, Vec<(usize, PathBuf)>), MachineError> {
    let dir = sysfs_root.join("devices/system/node");
    let io = |source| MachineError::Io {
        path: dir.clone(),
        source,
    };
    let mut found = vec![];
    for entry in fs::read_dir(&dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(suffix) = name.strip_prefix("node") else {
            continue;
        };
        let id: usize = suffix
            .parse()
            .map_err(|_| MachineError::BadNodeName(name.clone()))?;
        found.push((id, entry.path()));
    }
    if found.is_empty() {
        return Err(MachineError::NoNodes(dir));
    }
    found.sort();
    Ok((dir, found))
}
