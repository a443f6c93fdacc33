//! The kubelet's atomic writer: a set of files projected into a directory so that a reader
//! sees either the old set or the new one, never a mix. Follows
//! `pkg/volume/util/atomic_writer.go` (`AtomicWriter.Write`).
//!
//! Layout of a target directory `T`:
//!
//! ```text
//! T/..2026_11_28_06_30_00.123456789   the files of one version (mode 0755 directory)
//! T/..data -> ..2026_11_28_06_30_00.123456789
//! T/<name> -> ..data/<name>           each top-level user-visible name
//! ```
//!
//! A write puts the new version in a fresh timestamped directory, points `..data_tmp` at it and
//! renames that link over `..data` (one atomic `rename`), adds links for new names, removes the
//! links of names that are gone, then removes the old version. Names starting with `..` are
//! reserved. Unlike upstream, a change of mode alone is written too (upstream compares the
//! contents only, so a new `defaultMode` never reaches a running pod's files).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const DATA_DIR: &str = "..data";
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_FILE_NAME: usize = 255;
const MAX_PATH: usize = 4096;

/// One file of a projection: its bytes and mode (`0o644` and the like).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// The file's contents.
    pub data: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
}

/// Files by their relative path in the volume (`key`, `dir/key`).
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a projection could not be written.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    /// A path of the payload is not a plain relative path inside the volume.
    #[error("invalid path {path:?}: {why}")]
    InvalidPath {
        /// The path.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A file system call failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AtomicWriteError + use<> {
    let path = path.to_path_buf();
    move |source| AtomicWriteError::Io { what, path, source }
}

/// Checks a payload path (upstream `validatePath`): relative, no `..` element, not starting
/// with `..`, bounded lengths.
pub fn validate_path(path: &str) -> Result<(), AtomicWriteError> {
    let bad = |why| {
        Err(AtomicWriteError::InvalidPath {
            path: path.to_owned(),
            why,
        })
    };
    if path.is_empty() {
        return bad("must not be empty");
    }
    if path.len() > MAX_PATH {
        return bad("longer than 4096 bytes");
    }
    if path.starts_with('/') {
        return bad("must be relative");
    }
    if path.starts_with("..") {
        return bad("must not start with '..'");
    }
    for part in path.split('/') {
        if part == ".." {
            return bad("must not contain '..'");
        }
        if part.len() > MAX_FILE_NAME {
            return bad("a file name is longer than 255 bytes");
        }
    }
    Ok(())
}

/// Cleans a payload path: empty and `.` elements dropped.
fn clean(path: &str) -> String {
    path.split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// Writes `payload` into `target` (created if missing) atomically. Returns whether anything
/// changed (`false`: the same files with the same modes were there already).
pub fn write(target: &Path, payload: &Payload) -> Result<bool, AtomicWriteError> {
    let mut files = Payload::new();
    for (path, file) in payload {
        validate_path(path)?;
        let cleaned = clean(path);
        validate_path(&cleaned)?;
        files.insert(cleaned, file.clone());
    }
    std::fs::create_dir_all(target).map_err(io("create volume directory", target))?;
    let data_link = target.join(DATA_DIR);
    let old_ts = match std::fs::read_link(&data_link) {
        Ok(old) => Some(old),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("read link", &data_link)(e)),
    };
    let mut to_remove = BTreeSet::new();
    let mut changed = true;
    if let Some(old) = &old_ts {
        let old_dir = target.join(old);
        to_remove = paths_to_remove(&files, &old_dir)?;
        if to_remove.is_empty() && !differs(&files, &old_dir)? {
            changed = false;
        }
    }
    if changed {
        let ts_dir = new_timestamp_dir(target)?;
        let ts_name = ts_dir
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_else(|| ts_dir.clone());
        let written = write_files(&files, &ts_dir).and_then(|()| {
            let tmp = target.join(NEW_DATA_DIR);
            let _ = std::fs::remove_file(&tmp);
            symlink(&ts_name, &tmp).map_err(io("link", &tmp))?;
            std::fs::rename(&tmp, &data_link).map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                io("rename", &tmp)(e)
            })?;
            sync_dir(target)
        });
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&ts_dir);
            return Err(e);
        }
    }
    // The user-visible links (made again even when nothing changed: one may have been lost).
    for path in files.keys() {
        let top = path.split('/').next().unwrap_or(path);
        let link = target.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA_DIR).join(top), &link).map_err(io("link", &link))?;
        }
    }
    // Names that are gone: only top-level ones are links in the target.
    for path in &to_remove {
        if path.contains('/') {
            continue;
        }
        let link = target.join(path);
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &link)(e)),
        }
    }
    if changed && let Some(old) = old_ts {
        let old_dir = target.join(old);
        if old_dir.parent() == Some(target) {
            std::fs::remove_dir_all(&old_dir).map_err(io("remove old version", &old_dir))?;
        }
    }
    Ok(changed)
}

/// The relative paths (files and directories) of the old version that the new payload does not
/// have.
fn paths_to_remove(files: &Payload, old_dir: &Path) -> Result<BTreeSet<String>, AtomicWriteError> {
    let mut old = BTreeSet::new();
    walk(old_dir, "", &mut old)?;
    let mut new = BTreeSet::new();
    for path in files.keys() {
        let mut prefix = path.as_str();
        loop {
            new.insert(prefix.to_owned());
            match prefix.rfind('/') {
                Some(i) => prefix = &prefix[..i],
                None => break,
            }
        }
    }
    Ok(old.difference(&new).cloned().collect())
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> Result<(), AtomicWriteError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("read directory", dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io("read directory", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&entry.path(), &rel, out)?;
        }
        out.insert(rel);
    }
    Ok(())
}

/// Whether a file of the payload is missing from `old_dir` or differs in contents or mode.
fn differs(files: &Payload, old_dir: &Path) -> Result<bool, AtomicWriteError> {
    for (path, file) in files {
        let full = old_dir.join(path);
        let meta = match std::fs::symlink_metadata(&full) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(io("stat", &full)(e)),
        };
        if meta.permissions().mode() & 0o7777 != file.mode & 0o7777 {
            return Ok(true);
        }
        let on_disk = std::fs::read(&full).map_err(io("read", &full))?;
        if on_disk != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `..YYYY_MM_DD_HH_MM_SS.<unique>` (upstream: `os.MkdirTemp` with that UTC prefix), mode 0755.
fn new_timestamp_dir(target: &Path) -> Result<PathBuf, AtomicWriteError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let stamp = k8s_openapi::jiff::Timestamp::from_second(
        i64::try_from(since_epoch.as_secs()).unwrap_or_default(),
    )
    .unwrap_or_default()
    .strftime("..%Y_%m_%d_%H_%M_%S.")
    .to_string();
    for _ in 0..100 {
        let unique = u64::from(std::process::id())
            .wrapping_mul(1_000_003)
            .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed))
            ^ u64::from(since_epoch.subsec_nanos());
        let dir = target.join(format!("{stamp}{unique}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                    .map_err(io("chmod", &dir))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create version directory", &dir)(e)),
        }
    }
    Err(AtomicWriteError::Io {
        what: "create version directory",
        path: target.to_path_buf(),
        source: std::io::Error::other("no unused name"),
    })
}

fn write_files(files: &Payload, dir: &Path) -> Result<(), AtomicWriteError> {
    for (path, file) in files {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(io("create directory", parent))?;
        }
        let mut f = std::fs::File::create(&full).map_err(io("create", &full))?;
        f.write_all(&file.data).map_err(io("write", &full))?;
        f.set_permissions(std::fs::Permissions::from_mode(file.mode & 0o7777))
            .map_err(io("chmod", &full))?;
        f.sync_all().map_err(io("sync", &full))?;
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), AtomicWriteError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    (*p).to_owned(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    fn names(dir: &Path) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn the_layout_is_the_kubelets() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("vol");
        let changed = write(
            &target,
            &payload(&[("a", "1", 0o644), ("dir/b", "2", 0o600)]),
        )
        .expect("write");
        assert!(changed);
        let data = std::fs::read_link(target.join("..data")).expect("..data is a link");
        let ts = data.to_string_lossy().into_owned();
        assert!(
            ts.starts_with("..20") && ts.len() > "..2026_01_01_00_00_00.".len(),
            "{ts}"
        );
        assert!(target.join(&ts).is_dir());
        assert_eq!(mode(&target.join(&ts)), 0o755);
        assert_eq!(
            std::fs::read_link(target.join("a")).expect("a is a link"),
            Path::new("..data/a")
        );
        assert_eq!(
            std::fs::read_link(target.join("dir")).expect("dir is a link"),
            Path::new("..data/dir")
        );
        assert_eq!(std::fs::read_to_string(target.join("a")).expect("a"), "1");
        assert_eq!(
            std::fs::read_to_string(target.join("dir/b")).expect("b"),
            "2"
        );
        assert_eq!(mode(&target.join("a")), 0o644);
        assert_eq!(mode(&target.join("dir/b")), 0o600);
        assert_eq!(
            names(&target),
            BTreeSet::from(["..data".to_owned(), ts, "a".to_owned(), "dir".to_owned()])
        );
    }

    #[test]
    fn an_update_swaps_data_and_removes_gone_keys() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("vol");
        write(&target, &payload(&[("a", "1", 0o644), ("b", "2", 0o644)])).expect("write");
        let first = std::fs::read_link(target.join("..data")).expect("link");
        // The same payload again: nothing written, the version stays.
        assert!(
            !write(&target, &payload(&[("a", "1", 0o644), ("b", "2", 0o644)])).expect("rewrite")
        );
        assert_eq!(
            std::fs::read_link(target.join("..data")).expect("link"),
            first
        );

        assert!(write(&target, &payload(&[("a", "changed", 0o644)])).expect("update"));
        let second = std::fs::read_link(target.join("..data")).expect("link");
        assert_ne!(first, second, "..data points at a new version");
        assert!(!target.join(&first).exists(), "the old version is removed");
        assert_eq!(
            std::fs::read_to_string(target.join("a")).expect("a"),
            "changed"
        );
        assert!(
            std::fs::symlink_metadata(target.join("b")).is_err(),
            "a removed key's link is gone"
        );
        assert_eq!(
            names(&target),
            BTreeSet::from([
                "..data".to_owned(),
                second.to_string_lossy().into_owned(),
                "a".to_owned()
            ])
        );
    }

    #[test]
    fn a_mode_change_alone_is_written() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("vol");
        write(&target, &payload(&[("a", "1", 0o644)])).expect("write");
        assert!(write(&target, &payload(&[("a", "1", 0o400)])).expect("chmod"));
        assert_eq!(mode(&target.join("a")), 0o400);
    }

    #[test]
    fn an_empty_payload_leaves_an_empty_volume() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("vol");
        write(&target, &payload(&[("a", "1", 0o644)])).expect("write");
        write(&target, &Payload::new()).expect("empty");
        let visible: Vec<String> = names(&target)
            .into_iter()
            .filter(|n| !n.starts_with(".."))
            .collect();
        assert!(visible.is_empty(), "{visible:?}");
    }

    #[test]
    fn paths_leaving_the_volume_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        for bad in ["/etc/passwd", "../x", "a/../../x", "..data", ""] {
            let err = write(tmp.path(), &payload(&[(bad, "x", 0o644)]));
            assert!(
                matches!(err, Err(AtomicWriteError::InvalidPath { .. })),
                "{bad:?}"
            );
        }
    }
}
