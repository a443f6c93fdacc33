//! `devicelet dev-cluster up|down|status`: a real Kubernetes control plane on loopback (etcd,
//! kube-apiserver with the Node authorizer and NodeRestriction, kube-controller-manager, and
//! devicelet's scheduler or kube-scheduler) from the user's own server binaries, with N
//! devicelet nodes in cluster mode under their node identities, so that an unmodified
//! kubelet-plugin-helper DRA driver or device plugin runs against it on one machine. It follows
//! what `interop/cluster/up.sh` does for the tests (and kubeadm's phases: certs, kubeconfig,
//! control plane), written for users: progress, a state file, `down` that leaves nothing.
//!
//! Everything lives under one directory (`--dir`, default `/tmp/devicelet-dev-UID`):
//!
//! ```text
//! DIR/dev-cluster.json   the processes (PID + start time), server, nodes
//! DIR/kubeconfig         admin (system:masters), for kubectl
//! DIR/pki/               CA, serving and client certificates, service-account key
//! DIR/etcd/              etcd's data
//! DIR/nodes/NAME/        node NAME's root (plugins_registry/, plugins/, device-plugins/, ...)
//! DIR/nodes/NAME.kubeconfig   node NAME's identity (system:node:NAME), also for its drivers
//! DIR/logs/*.log         every process's output (kept by `down`)
//! ```

mod binaries;
mod pki;
mod procs;
mod up;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::cli::{DevClusterArgs, DevClusterWhat, OutputFormat};
pub use procs::Process;

/// The state file's name under the cluster directory.
const STATE_FILE: &str = "dev-cluster.json";

/// How long a stopped process may take to exit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

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
    fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    /// The state recorded in `dir`, if any.
    fn read(dir: &Path) -> anyhow::Result<Option<Self>> {
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
    fn write(&self) -> anyhow::Result<()> {
        let path = Self::path(&self.dir);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).context("encode the state")?;
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("write {}", path.display()))
    }

    /// The recorded processes still running.
    fn live(&self) -> Vec<&Process> {
        self.processes.iter().filter(|p| p.alive()).collect()
    }
}

/// Runs `dev-cluster`.
pub async fn run(args: DevClusterArgs) -> anyhow::Result<()> {
    match args.what {
        DevClusterWhat::Up(up) => {
            let dir = cluster_dir(up.dir.as_deref())?;
            up::up(&dir, &up).await
        }
        DevClusterWhat::Down { dir } => down(&cluster_dir(dir.as_deref())?),
        DevClusterWhat::Status { dir, output } => {
            status(&cluster_dir(dir.as_deref())?, output.output).await
        }
    }
}

/// `--dir`, else `DEVICELET_DEV_CLUSTER_DIR`, else `/tmp/devicelet-dev-UID`, absolute.
fn cluster_dir(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
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
struct DirLock(#[allow(dead_code)] std::fs::File);

fn lock(dir: &Path) -> anyhow::Result<DirLock> {
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

/// `down`: stops the drivers and plugins serving the nodes' sockets, then the cluster's own
/// processes in reverse start order; unmounts anything left under the directory; removes
/// everything but the logs. Fails, naming them, if a process or a mount is left.
fn down(dir: &Path) -> anyhow::Result<()> {
    let _lock = lock(dir)?;
    let Some(state) = ClusterState::read(dir)? else {
        println!("no dev cluster in {}", dir.display());
        return Ok(());
    };
    // What the user started against the nodes (drivers, device plugins) goes first, so that it
    // does not log a storm of reconnects while its node goes away: processes serving a socket
    // under the directory, and processes given a node's root or kubeconfig.
    let own = |pid: u32| {
        state
            .processes
            .iter()
            .any(|p| i64::from(p.pid) == i64::from(pid))
    };
    let mut foreign: Vec<Process> = Vec::new();
    let serving = devicelet_rpc::root_guard::listeners_under(dir)
        .into_iter()
        .map(|(socket, p)| (p.pid, p.command, format!("serves {}", socket.display())));
    let pointed = procs::pointed_at(&dir.join("nodes"))
        .into_iter()
        .map(|(pid, command)| (pid, command, "uses a node of this cluster".to_owned()));
    for (pid, command, why) in serving.chain(pointed) {
        if own(pid) || foreign.iter().any(|p| i64::from(p.pid) == i64::from(pid)) {
            continue;
        }
        if let Some(p) = Process::found(command.clone(), pid) {
            say(&format!("stopping pid {pid} ({command}), which {why}"));
            foreign.push(p);
        }
    }
    let mut left = stopped(procs::stop(&foreign, STOP_GRACE));
    // The nodes together, then the rest one at a time in reverse start order: the API server
    // must be gone before etcd, or it spends its shutdown retrying etcd.
    let mut ours: Vec<Process> = state.processes.clone();
    ours.reverse();
    let (nodes, control_plane): (Vec<Process>, Vec<Process>) =
        ours.into_iter().partition(|p| p.name.starts_with("node "));
    let tiers = std::iter::once(nodes).chain(control_plane.into_iter().map(|p| vec![p]));
    for tier in tiers {
        for p in tier.iter().filter(|p| p.alive()) {
            say(&format!("stopping {} (pid {})", p.name, p.pid));
        }
        left.extend(stopped(procs::stop(&tier, STOP_GRACE)));
    }

    let mut mounts = procs::mounts_under(dir);
    // Deepest first: a mount inside another must go before it.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    let mut stuck = Vec::new();
    for mount in mounts {
        if let Err(e) = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH) {
            stuck.push(format!("{} ({e})", mount.display()));
        } else {
            say(&format!("unmounted {}", mount.display()));
        }
    }
    if !left.is_empty() || !stuck.is_empty() {
        let names: Vec<String> = left
            .iter()
            .map(|p| format!("{} (pid {})", p.name, p.pid))
            .collect();
        bail!(
            "dev cluster in {} not fully stopped: still running: [{}]; still mounted: [{}]",
            dir.display(),
            names.join(", "),
            stuck.join(", ")
        );
    }
    remove_all_but_logs(dir)?;
    say(&format!(
        "dev cluster in {} stopped: no process left; logs kept in {}",
        dir.display(),
        dir.join("logs").display()
    ));
    Ok(())
}

/// Says which processes needed SIGKILL; returns those still alive.
fn stopped(result: procs::Stopped) -> Vec<Process> {
    for p in &result.killed {
        say(&format!(
            "{} (pid {}) did not stop within {}s of SIGTERM: killed",
            p.name,
            p.pid,
            STOP_GRACE.as_secs()
        ));
    }
    result.left
}

/// Prints a line; a closed stdout (`down | head`) must not stop a `down` half way.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// Removes everything in `dir` except `logs/` and the lock file.
fn remove_all_but_logs(dir: &Path) -> anyhow::Result<()> {
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

/// What `status -o json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusReport {
    #[serde(flatten)]
    state: ClusterState,
    /// Per process, in start order: running or not.
    running: Vec<bool>,
    /// The API server's `/readyz` answer (or the error reaching it).
    apiserver: String,
    /// Nodes as the API server shows them: name → Ready.
    nodes_ready: Vec<(String, bool)>,
}

/// `status`: each process running or not, the API server's readiness and each Node's Ready
/// condition. Fails when something is down.
async fn status(dir: &Path, output: OutputFormat) -> anyhow::Result<()> {
    let Some(state) = ClusterState::read(dir)? else {
        bail!(
            "no dev cluster in {} (`devicelet dev-cluster up` starts one)",
            dir.display()
        );
    };
    let running: Vec<bool> = state.processes.iter().map(Process::alive).collect();
    let (apiserver, nodes_ready) = match up::admin_client(&state.kubeconfig).await {
        Ok(client) => {
            let ready = up::readyz(&client).await;
            let nodes = up::node_readiness(&client).await.unwrap_or_default();
            (ready, nodes)
        }
        Err(e) => (format!("{e:#}"), Vec::new()),
    };
    let report = StatusReport {
        state,
        running,
        apiserver,
        nodes_ready,
    };
    if matches!(output, OutputFormat::Json) {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_status(&report);
    }
    let down: Vec<&str> = report
        .state
        .processes
        .iter()
        .zip(&report.running)
        .filter(|(_, running)| !**running)
        .map(|(p, _)| p.name.as_str())
        .collect();
    if !down.is_empty() {
        bail!("not running: {}", down.join(", "));
    }
    if report.apiserver != "ok" {
        bail!("kube-apiserver is not ready: {}", report.apiserver);
    }
    Ok(())
}

fn print_status(report: &StatusReport) {
    let state = &report.state;
    println!(
        "dev cluster in {} (Kubernetes {}, scheduler: {})",
        state.dir.display(),
        state.kubernetes_version,
        state.scheduler
    );
    println!("api server {}: {}", state.server, report.apiserver);
    println!("{:<28} {:>8}  STATE", "PROCESS", "PID");
    for (p, running) in state.processes.iter().zip(&report.running) {
        let word = if *running { "running" } else { "exited" };
        println!("{:<28} {:>8}  {word}", p.name, p.pid);
    }
    println!("{:<16} {:<8} ROOT", "NODE", "READY");
    for node in &state.nodes {
        let ready = report
            .nodes_ready
            .iter()
            .find(|(name, _)| *name == node.name)
            .map_or("unknown", |(_, r)| if *r { "True" } else { "False" });
        println!("{:<16} {:<8} {}", node.name, ready, node.root.display());
    }
    println!("export KUBECONFIG={}", state.kubeconfig.display());
}
