//! Moving a damaged or replaced state file aside, the one quarantine helper shared by the device
//! store, the DRA claim cache and the DRA object store.
//!
//! A file is renamed to `<path>.<tag>-<UTC timestamp>` (tag `corrupt` or `replaced`), with a
//! `.1`, `.2`, … suffix when that name is taken, so an earlier copy is never replaced: each one is
//! evidence an operator may need. The directory is fsync'd so the rename survives a power loss.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::atomic_write::{parent_dir, sync_dir};

/// The tag of a file that could not be loaded: `<path>.corrupt-<UTC>[.n]`.
pub const CORRUPT: &str = "corrupt";
/// The tag of a file an operator's recovery replaced: `<path>.replaced-<UTC>[.n]`.
pub const REPLACED: &str = "replaced";

/// Moves `path` aside to `<path>.<tag>-<UTC timestamp>[.<n>]`, never replacing an existing file,
/// and returns the new name.
pub fn move_aside(path: &Path, tag: &str) -> io::Result<PathBuf> {
    move_aside_at(path, tag, SystemTime::now())
}

fn move_aside_at(path: &Path, tag: &str, now: SystemTime) -> io::Result<PathBuf> {
    let base = format!("{}.{tag}-{}", path.display(), utc_timestamp(now));
    let mut candidate = PathBuf::from(&base);
    let mut n = 1;
    while fs::symlink_metadata(&candidate).is_ok() {
        candidate = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    fs::rename(path, &candidate)?;
    // A bare file name has the current directory as its parent.
    if let Ok(dir) = parent_dir(path) {
        sync_dir(dir)?;
    }
    Ok(candidate)
}

/// UTC timestamp `YYYYMMDDTHHMMSSZ`.
pub fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (proleptic Gregorian), Howard Hinnant's algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn utc_timestamps_are_civil_dates() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(
            utc_timestamp(UNIX_EPOCH + Duration::from_secs(1_795_305_600 + 3_723)),
            "20261122T010203Z"
        );
        assert_eq!(
            utc_timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229T000000Z"
        );
    }

    #[test]
    fn two_corruptions_in_the_same_second_keep_both_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dra_manager_state");
        let now = UNIX_EPOCH + Duration::from_secs(1_795_305_600 + 3_723);
        fs::write(&path, b"first").expect("write");
        let first = move_aside_at(&path, CORRUPT, now).expect("first move");
        fs::write(&path, b"second").expect("write");
        let second = move_aside_at(&path, CORRUPT, now).expect("second move");
        fs::write(&path, b"third").expect("write");
        let third = move_aside_at(&path, CORRUPT, now).expect("third move");

        let base = format!("{}.corrupt-20261122T010203Z", path.display());
        assert_eq!(first, PathBuf::from(&base));
        assert_eq!(second, PathBuf::from(format!("{base}.1")));
        assert_eq!(third, PathBuf::from(format!("{base}.2")));
        assert_eq!(fs::read(&first).expect("read"), b"first");
        assert_eq!(fs::read(&second).expect("read"), b"second");
        assert_eq!(fs::read(&third).expect("read"), b"third");
        assert!(!path.exists(), "the original name is free again");
    }

    #[test]
    fn a_missing_file_is_an_error_and_creates_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = move_aside(&dir.path().join("absent"), REPLACED).expect_err("nothing to move");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 0);
    }
}
