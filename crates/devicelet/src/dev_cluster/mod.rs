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
mod state;
mod up;

use std::path::Path;

use anyhow::bail;
use serde::Serialize;

use crate::cli::{DevClusterArgs, DevClusterWhat, OutputFormat};
pub use procs::Process;
pub use state::ClusterState;
use state::{STOP_GRACE, cluster_dir, lock, remove_all_but_logs};

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
