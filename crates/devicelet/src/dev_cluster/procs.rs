//! The dev cluster's processes: started detached (own process group, output to a log file),
//! recorded with their start time so that a later `down` or `status` never mistakes a
//! recycled PID for one of them, and stopped by process group (SIGTERM, then SIGKILL after a
//! grace period).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rustix::process::{Pid, Signal, kill_process, kill_process_group};
use serde::{Deserialize, Serialize};

/// One process of the cluster, as recorded in its state file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    /// What it is (`etcd`, `kube-apiserver`, `node dev-node-1`, ...).
    pub name: String,
    /// Its PID, also its process group.
    pub pid: i32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// Its log file (none for a process the cluster did not start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// Whether it leads its own process group (the cluster's processes), which a stop signals
    /// whole; otherwise only the process is signalled.
    #[serde(default = "yes")]
    pub group: bool,
}

fn yes() -> bool {
    true
}

impl Process {
    /// Whether this very process still runs (not a zombie, not a recycled PID).
    pub fn alive(&self) -> bool {
        stat(self.pid).is_some_and(|(state, ticks)| ticks == self.start_ticks && state != 'Z')
    }

    /// A running process the cluster did not start (a driver serving a node's socket).
    pub fn found(name: String, pid: u32) -> Option<Self> {
        let pid = i32::try_from(pid).ok()?;
        let (_, start_ticks) = stat(pid)?;
        Some(Self {
            name,
            pid,
            start_ticks,
            log: None,
            group: false,
        })
    }
}

/// Starts `program args` in its own process group with stdin closed and stdout and stderr
/// appended to `log`. The child is not waited for here: the caller keeps it to notice an
/// early exit, and it outlives `devicelet dev-cluster up`.
pub fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    log: &Path,
) -> anyhow::Result<(Process, Child)> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let err = out.try_clone().context("duplicate the log file")?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {name} ({})", program.display()))?;
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    let start_ticks = stat(pid)
        .map(|(_, ticks)| ticks)
        .with_context(|| format!("{name} (pid {pid}) exited at once; see {}", log.display()))?;
    Ok((
        Process {
            name: name.to_owned(),
            pid,
            start_ticks,
            log: Some(log.to_path_buf()),
            group: true,
        },
        child,
    ))
}

/// What [`stop`] did.
#[derive(Debug, Default)]
pub struct Stopped {
    /// Those that outlived the grace period and got SIGKILL.
    pub killed: Vec<Process>,
    /// Those still alive even after SIGKILL (none, unless the kernel is slow to reap).
    pub left: Vec<Process>,
}

/// Stops `processes`: SIGTERM to each one (its process group when it leads one), then waits up
/// to `grace` for all of them, then SIGKILL to what is left.
pub fn stop(processes: &[Process], grace: Duration) -> Stopped {
    let live: Vec<&Process> = processes.iter().filter(|p| p.alive()).collect();
    for p in &live {
        signal(p, Signal::TERM);
    }
    wait_gone(&live, grace);
    let stubborn: Vec<&Process> = live.iter().copied().filter(|p| p.alive()).collect();
    for p in &stubborn {
        signal(p, Signal::KILL);
    }
    wait_gone(&stubborn, Duration::from_secs(5));
    Stopped {
        left: stubborn
            .iter()
            .copied()
            .filter(|p| p.alive())
            .cloned()
            .collect(),
        killed: stubborn.into_iter().cloned().collect(),
    }
}

fn signal(process: &Process, signal: Signal) {
    // It may be gone already (ESRCH): nothing to stop.
    if let Some(pid) = Pid::from_raw(process.pid) {
        let _ = if process.group {
            kill_process_group(pid, signal)
        } else {
            kill_process(pid, signal)
        };
    }
}

fn wait_gone(processes: &[&Process], limit: Duration) {
    let deadline = Instant::now() + limit;
    while processes.iter().any(|p| p.alive()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The state letter and start time of `pid` from `/proc/PID/stat`.
pub fn stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// `pid (comm) S ppid ... starttime ...`: the command may hold spaces and parentheses, so the
/// fields are counted after the last `)`; the state is field 3 and the start time field 22.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ticks = fields.nth(18)?.parse().ok()?;
    Some((state, ticks))
}

/// Processes (not this one, nor its ancestors) with an argument naming a path under `nodes`:
/// drivers and plugins given a node's root or kubeconfig, including those in a private mount
/// namespace, whose sockets show only under the kubelet's paths.
pub fn pointed_at(nodes: &Path) -> Vec<(u32, String)> {
    let needle = nodes.as_os_str().as_encoded_bytes();
    let spared = ancestors();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if spared.contains(&pid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        if args
            .iter()
            .any(|a| a.windows(needle.len()).any(|w| w == needle))
        {
            let command = args
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            found.push((pid, command));
        }
    }
    found
}

/// This process and its ancestors up to init.
fn ancestors() -> Vec<u32> {
    let mut chain = vec![std::process::id()];
    while let Some(&pid) = chain.last() {
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|text| {
                let rest = text[text.rfind(')')? + 1..].to_owned();
                rest.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        match parent {
            Some(ppid) if ppid > 1 && !chain.contains(&ppid) => chain.push(ppid),
            _ => break,
        }
    }
    chain
}

/// Mount points at or under `dir` (`/proc/self/mountinfo` field 5, octal escapes undone).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount_path(field)))
        .filter(|path| path.starts_with(dir))
        .collect()
}

fn unescape_mount_path(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn processes_naming_a_node_path_are_found_but_not_this_one() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = dir.path().join("nodes");
        let kubeconfig = format!("--kubeconfig={}/n1.kubeconfig", nodes.display());
        let mut child = Command::new("/bin/sh")
            // Two commands, so the shell is not replaced by `sleep` (and keeps its arguments).
            .args(["-c", "sleep 30; true", "sh", &kubeconfig])
            .spawn()
            .unwrap();
        // Between fork and exec the child still shows this test's command line.
        let cmdline = format!("/proc/{}/cmdline", child.id());
        for _ in 0..500 {
            if std::fs::read(&cmdline)
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("n1.kubeconfig"))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let found = pointed_at(&nodes);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.iter().any(|(pid, _)| *pid == child.id()), "{found:?}");
        assert!(found.iter().all(|(pid, _)| *pid != std::process::id()));
    }

    #[test]
    fn mount_paths_with_spaces_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_path(r"/tmp/x\"), r"/tmp/x\");
    }

    #[test]
    fn a_started_process_is_recorded_and_stopped_by_group() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        // The shell's child sleeps in the same group: stopping the group stops both.
        let (p, mut child) = spawn(
            "sleeper",
            Path::new("/bin/sh"),
            &["-c".into(), "sleep 30 & echo started; wait".into()],
            &log,
        )
        .unwrap();
        assert!(p.alive());
        // A record of the same PID with another start time is not this process.
        let recycled = Process {
            start_ticks: p.start_ticks + 1,
            ..p.clone()
        };
        assert!(!recycled.alive());
        let reaper = std::thread::spawn(move || child.wait());
        let stopped = stop(std::slice::from_ref(&p), Duration::from_secs(5));
        assert!(
            stopped.killed.is_empty() && stopped.left.is_empty(),
            "{stopped:?}"
        );
        reaper.join().unwrap().unwrap();
        assert!(!p.alive());
    }
}
