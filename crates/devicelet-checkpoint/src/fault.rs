//! Injectable write faults for the state-file paths: a test seam, compiled only with the
//! `fault-injection` feature (or in this crate's unit tests).
//!
//! A full disk can be made real (a small tmpfs), but an `EIO` from `fsync` cannot be made real
//! cheaply. Like youki's fakeable `Syscall` trait, the few I/O steps that make state durable —
//! writing, fsyncing and renaming a temporary file, fsyncing its directory, appending to and
//! fsyncing the journal, truncating it back — ask `check` first; a test arms a `Fault` for a
//! directory and an [`Op`], and the step fails with the chosen error instead of running. Faults
//! match by path prefix, so parallel tests with their own temporary directories do not see each
//! other's faults.
//!
//! Without the feature `check` is an empty inline function: production builds pay nothing.

use std::io;
use std::path::Path;

/// One durable-write step that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Writing bytes (the temporary file of an atomic write, or a journal append). A write that
    /// fails with [`ENOSPC`] first writes half of its bytes, as a real full disk does in the
    /// middle of a write; with any other error nothing is written (`EROFS`, `EIO`).
    Write,
    /// `fsync`/`fdatasync` of a file (the temporary file, or the journal after an append).
    Fsync,
    /// Renaming the temporary file over the target.
    Rename,
    /// `fsync` of the directory after a rename.
    SyncDir,
    /// Truncating the journal back after a failed append.
    Truncate,
}

#[cfg(any(test, feature = "fault-injection"))]
mod imp {
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, PoisonError};

    use super::Op;

    struct Armed {
        id: u64,
        prefix: PathBuf,
        op: Op,
        errno: i32,
        /// Matching steps to let through before failing.
        skip: u64,
        /// Failures left; `None` = until disarmed.
        remaining: Option<u64>,
        hits: u64,
    }

    static FAULTS: Mutex<Vec<Armed>> = Mutex::new(Vec::new());
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);

    fn faults() -> std::sync::MutexGuard<'static, Vec<Armed>> {
        FAULTS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An armed fault; disarmed when dropped.
    #[derive(Debug)]
    #[must_use = "the fault is disarmed when this guard is dropped"]
    pub struct Fault {
        id: u64,
    }

    impl Fault {
        /// Makes `op` on any path under `prefix` fail with `errno` (e.g. [`super::EIO`]) until the
        /// guard is dropped.
        pub fn arm(prefix: &Path, op: Op, errno: i32) -> Fault {
            Self::arm_times(prefix, op, errno, None)
        }

        /// Like [`Fault::arm`], but only the next `times` matching steps fail.
        pub fn arm_times(prefix: &Path, op: Op, errno: i32, times: Option<u64>) -> Fault {
            Self::arm_with(prefix, op, errno, 0, times)
        }

        /// Like [`Fault::arm`], but the first `after` matching steps succeed (e.g. the second
        /// write of a file fails, not the first).
        pub fn arm_after(prefix: &Path, op: Op, errno: i32, after: u64) -> Fault {
            Self::arm_with(prefix, op, errno, after, None)
        }

        fn arm_with(prefix: &Path, op: Op, errno: i32, skip: u64, times: Option<u64>) -> Fault {
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            faults().push(Armed {
                id,
                prefix: prefix.to_path_buf(),
                op,
                errno,
                skip,
                remaining: times,
                hits: 0,
            });
            Fault { id }
        }

        /// How many steps this fault has failed so far.
        pub fn hits(&self) -> u64 {
            faults()
                .iter()
                .find(|f| f.id == self.id)
                .map_or(0, |f| f.hits)
        }
    }

    impl Drop for Fault {
        fn drop(&mut self) {
            faults().retain(|f| f.id != self.id);
        }
    }

    pub(crate) fn check(op: Op, path: &Path) -> io::Result<()> {
        let mut all = faults();
        for f in all.iter_mut() {
            if f.op != op || !path.starts_with(&f.prefix) || f.remaining == Some(0) {
                continue;
            }
            if f.skip > 0 {
                f.skip -= 1;
                continue;
            }
            if let Some(n) = &mut f.remaining {
                *n -= 1;
            }
            f.hits += 1;
            return Err(io::Error::from_raw_os_error(f.errno));
        }
        Ok(())
    }
}

#[cfg(any(test, feature = "fault-injection"))]
pub use imp::Fault;

/// `EIO` on Linux: an I/O error, what a failing disk's `fsync` returns.
pub const EIO: i32 = 5;
/// `ENOSPC` on Linux: no space left on the device.
pub const ENOSPC: i32 = 28;

/// Fails with the armed error when a fault matches `op` on `path` (see the module docs).
#[cfg(any(test, feature = "fault-injection"))]
#[inline]
pub(crate) fn check(op: Op, path: &Path) -> io::Result<()> {
    imp::check(op, path)
}

/// Without the `fault-injection` feature nothing can be armed: always `Ok`.
#[cfg(not(any(test, feature = "fault-injection")))]
#[inline(always)]
pub(crate) fn check(_op: Op, _path: &Path) -> io::Result<()> {
    Ok(())
}

/// `EROFS` on Linux: the file system is read-only (remounted so after an error).
pub const EROFS: i32 = 30;

/// `write_all` that a [`Op::Write`] fault fails (after half of the bytes for [`ENOSPC`]).
pub(crate) fn write_all(w: &mut impl io::Write, bytes: &[u8], path: &Path) -> io::Result<()> {
    if let Err(e) = check(Op::Write, path) {
        if e.raw_os_error() == Some(ENOSPC) {
            w.write_all(&bytes[..bytes.len() / 2])?;
        }
        return Err(e);
    }
    w.write_all(bytes)
}
