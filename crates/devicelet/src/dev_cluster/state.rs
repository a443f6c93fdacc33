//! The dev cluster's directory: its state file (what `up` started, for `status` and `down`),
//! the lock that keeps two commands off one directory, and the default location.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::procs::Process;

/// The state file's name under the cluster directory.
pub const STATE_FILE: &str = "dev-cluster.json";

/// How long a stopped process may take to exit before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// What `up` recorded: enough for `status` and `down`, and for scripts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterState {
    /// The cluster directory.
    pub dir: PathBuf,
    /// The API server's URL.
    pub server: String,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The Kubernetes version of the server binaries.
    pub kubernetes_version: String,
    /// `devicelet` or `kube-scheduler`.
    pub scheduler: String,
    /// The nodes, in order.
    pub nodes: Vec<NodeState>,
    /// The processes, in start order.
    pub processes: Vec<Process>,
}

/// One devicelet node of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// The Node's name.
    pub name: String,
    /// Its root directory (what `/var/lib/kubelet` is to a kubelet).
    pub root: PathBuf,
    /// Its identity (`system:node:NAME`), which its DRA drivers may use too.
    pub kubeconfig: PathBuf,
}

impl ClusterState {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    /// The state recorded in `dir`, if any.
    pub fn read(dir: &Path) -> anyhow::Result<Option<Self>> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is not a dev cluster's state", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
        }
    }

    /// Writes the state (a temporary file renamed over the old one).
    pub fn write(&self) -> anyhow::Result<()> {
        let path = Self::path(&self.dir);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).context("encode the state")?;
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("write {}", path.display()))
    }

    /// The recorded processes still running.
    pub fn live(&self) -> Vec<&Process> {
        self.processes.iter().filter(|p| p.alive()).collect()
    }
}

/// `--dir`, else `DEVICELET_DEV_CLUSTER_DIR`, else `/tmp/devicelet-dev-UID`, absolute.
pub fn cluster_dir(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        None => match std::env::var_os("DEVICELET_DEV_CLUSTER_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(format!(
                "/tmp/devicelet-dev-{}",
                rustix::process::getuid().as_raw()
            )),
        },
    };
    if dir.is_absolute() {
        Ok(dir)
    } else {
        Ok(std::env::current_dir()
            .context("the current directory")?
            .join(dir))
    }
}

/// Holds the directory's lock file for the life of the value: one `up` or `down` at a time.
pub struct DirLock(#[allow(dead_code)] std::fs::File);

pub fn lock(dir: &Path) -> anyhow::Result<DirLock> {
    use rustix::fs::{FlockOperation, flock};
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let path = dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    flock(&file, FlockOperation::NonBlockingLockExclusive).map_err(|_| {
        anyhow::anyhow!(
            "another devicelet dev-cluster command is working on {} (it holds {})",
            dir.display(),
            path.display()
        )
    })?;
    Ok(DirLock(file))
}

/// Removes everything in `dir` except `logs/` and the lock file.
pub fn remove_all_but_logs(dir: &Path) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == "logs" || name == ".lock" {
            continue;
        }
        let path = entry.path();
        let result = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        result.with_context(|| format!("remove {}", path.display()))?;
    }
    Ok(())
}
