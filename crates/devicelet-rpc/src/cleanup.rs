//! Stale socket cleanup at startup (`CleanupPluginDirectory`, `dm/manager.go`; spec §1.7):
//! every Unix socket in the device-plugin directory is removed so running plugins see
//! `kubelet.sock` re-created and register again. Regular files (the checkpoint, health files)
//! and directories are left alone. We never create the `DEPRECATION` file (spec §1.8).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use tracing::{debug, info};

use crate::error::RpcError;

/// Removes every socket directly inside `dir`; returns the paths removed.
pub fn remove_stale_sockets(dir: &Path) -> Result<Vec<PathBuf>, RpcError> {
    let entries = std::fs::read_dir(dir).map_err(|source| RpcError::Io {
        action: "list device-plugin directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| RpcError::Io {
            action: "list device-plugin directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let is_socket = entry.file_type().map(|t| t.is_socket()).unwrap_or(false);
        if !is_socket {
            debug!(path = %path.display(), "cleanup: keeping non-socket entry");
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                info!(path = %path.display(), "removed stale plugin socket");
                removed.push(path);
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(RpcError::Io {
                    action: "remove stale socket",
                    path,
                    source,
                });
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s1_7_cleanup_removes_only_sockets() {
        let dir = tempfile::Builder::new()
            .prefix("dl-c")
            .tempdir_in("/tmp")
            .unwrap();
        let sock = dir.path().join("plugin.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::write(dir.path().join("kubelet_internal_checkpoint"), "{}").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let removed = remove_stale_sockets(dir.path()).unwrap();
        assert_eq!(removed, vec![sock.clone()]);
        assert!(!sock.exists());
        assert!(dir.path().join("kubelet_internal_checkpoint").exists());
        assert!(dir.path().join("sub").is_dir());
        assert!(!dir.path().join("DEPRECATION").exists());
    }
}
