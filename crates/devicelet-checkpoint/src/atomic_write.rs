//! Durable whole-file replacement.
//!
//! Follows the kubelet's `pkg/kubelet/util/store/filestore.go` (`writeFile`): a temporary file
//! whose name starts with `.` in the target's directory (so directory listings that skip dotfiles
//! never see it), mode 0600, written, fsync'd, then renamed over the target. The kubelet stops
//! there; it does **not** fsync the directory, so after a power loss the rename itself may be
//! lost and the old file come back. We also fsync the directory, which makes the new content
//! durable once this function returns.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::fault::{self, Op};

/// Why an atomic write failed. The target is unchanged in every case except
/// [`AtomicWriteError::SyncDirectory`], where the new content is in place but may not survive a
/// power loss.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    /// The target has no parent directory or no file name.
    #[error("invalid checkpoint path {0}")]
    InvalidPath(PathBuf),
    /// Creating, writing or syncing the temporary file failed (e.g. `ENOSPC`); the temporary
    /// file is removed.
    #[error("writing a temporary file for {target}: {source}")]
    WriteTemp {
        /// The file that was to be replaced.
        target: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The rename over the target failed (e.g. the target is a directory).
    #[error("renaming temporary file over {target}: {source}")]
    Rename {
        /// The target path.
        target: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The directory fsync failed after the rename.
    #[error("fsync of directory {dir} after replacing {target}: {source}")]
    SyncDirectory {
        /// The replaced file.
        target: PathBuf,
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

impl AtomicWriteError {
    /// The underlying I/O error.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            AtomicWriteError::InvalidPath(_) => None,
            AtomicWriteError::WriteTemp { source, .. }
            | AtomicWriteError::Rename { source, .. }
            | AtomicWriteError::SyncDirectory { source, .. } => Some(source),
        }
    }
}

/// Replaces `target` with `bytes` atomically and durably (see the module docs).
pub fn write_file_atomic(target: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    let dir = parent_dir(target)?;
    let name = target
        .file_name()
        .ok_or_else(|| AtomicWriteError::InvalidPath(target.to_path_buf()))?;
    let wrap = |source| AtomicWriteError::WriteTemp {
        target: target.to_path_buf(),
        source,
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    // tempfile creates with O_EXCL and mode 0600; it removes the file if we bail out early.
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(wrap)?;
    fault::write_all(&mut tmp, bytes, target).map_err(wrap)?;
    fault::check(Op::Fsync, target)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(wrap)?;
    // On a failed rename `tempfile` removes the temporary file: nothing is left behind.
    if let Err(source) = fault::check(Op::Rename, target) {
        return Err(AtomicWriteError::Rename {
            target: target.to_path_buf(),
            source,
        });
    }
    tmp.persist(target).map_err(|e| AtomicWriteError::Rename {
        target: target.to_path_buf(),
        source: e.error,
    })?;
    fault::check(Op::SyncDir, target)
        .and_then(|()| File::open(dir)?.sync_all())
        .map_err(|source| AtomicWriteError::SyncDirectory {
            target: target.to_path_buf(),
            dir: dir.to_path_buf(),
            source,
        })
}

/// fsyncs a directory so that entries created, renamed or removed in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    fault::check(Op::SyncDir, dir)?;
    File::open(dir)?.sync_all()
}

/// Opens `path` for appending, creating it with mode 0600 if needed.
pub(crate) fn open_append(path: &Path) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)
}

/// The directory containing `path` ("." for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> Result<&Path, AtomicWriteError> {
    match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Ok(Path::new(".")),
        Some(p) => Ok(p),
        None => Err(AtomicWriteError::InvalidPath(path.to_path_buf())),
    }
}

/// Reads a whole file; `Ok(None)` if it does not exist.
pub(crate) fn read_if_exists(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("kubelet_internal_checkpoint");
        write_file_atomic(&target, b"one").expect("first write");
        write_file_atomic(&target, b"two").expect("second write");
        assert_eq!(fs::read(&target).expect("read"), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "only the target remains: {names:?}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&target).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
    }

    fn names(dir: &Path) -> Vec<std::ffi::OsString> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a2_12_a_failed_write_fsync_or_rename_keeps_the_previous_file_and_leaves_no_temporary_file() {
        use crate::fault::{EIO, ENOSPC, Fault, Op};
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("cpu_manager_state");
        write_file_atomic(&target, b"previous").expect("first write");
        for (op, errno) in [
            (Op::Write, ENOSPC),
            (Op::Write, EIO),
            (Op::Fsync, EIO),
            (Op::Fsync, ENOSPC),
            (Op::Rename, EIO),
        ] {
            let fault = Fault::arm(dir.path(), op, errno);
            let err = write_file_atomic(&target, b"next").expect_err("the fault fails the write");
            assert_eq!(fault.hits(), 1, "{op:?}");
            assert_eq!(
                err.io_error().and_then(io::Error::raw_os_error),
                Some(errno),
                "{op:?}: {err}"
            );
            assert!(
                err.to_string().contains(&target.display().to_string()),
                "{op:?}: the error names the file: {err}"
            );
            assert_eq!(fs::read(&target).expect("read"), b"previous", "{op:?}");
            assert_eq!(names(dir.path()), vec!["cpu_manager_state"], "{op:?}");
        }
        // The fault is gone: writing works again.
        write_file_atomic(&target, b"next").expect("write after the fault");
        assert_eq!(fs::read(&target).expect("read"), b"next");
    }

    #[test]
    fn a_failed_directory_fsync_is_reported_with_the_new_content_in_place() {
        use crate::fault::{EIO, Fault, Op};
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("f");
        write_file_atomic(&target, b"previous").expect("first write");
        let _fault = Fault::arm(dir.path(), Op::SyncDir, EIO);
        let err = write_file_atomic(&target, b"next").expect_err("dir fsync fails");
        assert!(
            matches!(err, AtomicWriteError::SyncDirectory { .. }),
            "{err}"
        );
        assert_eq!(fs::read(&target).expect("read"), b"next");
        assert_eq!(names(dir.path()), vec!["f"]);
    }

    #[test]
    fn a_directory_in_place_of_the_target_is_an_error_and_is_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("f");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("inside"), b"x").expect("write");
        let err = write_file_atomic(&target, b"data").expect_err("rename over a directory fails");
        assert!(matches!(err, AtomicWriteError::Rename { .. }), "{err}");
        assert!(target.join("inside").exists());
    }
}
