//! Where the [`DeviceStore`](super::DeviceStore) keeps its files: the kubelet's
//! `R/device-plugins/kubelet_internal_checkpoint` (`pkg/kubelet/cm/devicemanager/checkpoint/`,
//! spec devicemanager.md §3) and devicelet's own journal, restart snapshot and quarantine marker
//! in `R/devicelet/`.

use std::path::{Path, PathBuf};

use crate::device::DEVICE_CHECKPOINT_FILE;
use crate::snapshot::SNAPSHOT_FILE;

/// File name of the journal in devicelet's directory (`R/devicelet/`).
pub const JOURNAL_FILE: &str = "device-allocations.journal";
/// File name of the quarantine marker in devicelet's directory.
pub const QUARANTINE_FILE: &str = "device-allocations.quarantine";

/// Where the store keeps its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePaths {
    /// `R/device-plugins/kubelet_internal_checkpoint`.
    pub kubelet_file: PathBuf,
    /// `R/devicelet/device-allocations.journal`.
    pub journal: PathBuf,
    /// `R/devicelet/device-allocations.quarantine`.
    pub quarantine_marker: PathBuf,
    /// `R/devicelet/device-allocations.snapshot` (see [`crate::snapshot`]).
    pub snapshot: PathBuf,
}

impl StorePaths {
    /// Paths for a kubelet checkpoint directory (`R/device-plugins`) and a journal directory
    /// (`R/devicelet`).
    pub fn new(kubelet_dir: &Path, journal_dir: &Path) -> Self {
        Self {
            kubelet_file: kubelet_dir.join(DEVICE_CHECKPOINT_FILE),
            journal: journal_dir.join(JOURNAL_FILE),
            quarantine_marker: journal_dir.join(QUARANTINE_FILE),
            snapshot: journal_dir.join(SNAPSHOT_FILE),
        }
    }

    pub(super) fn journal_dir(&self) -> &Path {
        self.journal.parent().unwrap_or(Path::new("."))
    }

    pub(super) fn kubelet_dir(&self) -> &Path {
        self.kubelet_file.parent().unwrap_or(Path::new("."))
    }
}
