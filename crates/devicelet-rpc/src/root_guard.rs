//! Refusing a root directory another live process serves (issue 29).
//!
//! The kubelet's `dm/manager.go` `CleanupPluginDirectory` removes every socket in the
//! device-plugin directory and `server.go` binds `kubelet.sock` over whatever was there: on a
//! host that runs a kubelet, a second agent on `/var/lib/kubelet` would silently take the
//! plugins away from it. devicelet first asks whether the sockets it is about to replace are
//! answered by a live process (a connect that succeeds), and refuses with that process' PID and
//! command line unless told to take over (`serve --force`). Nothing of the other process is
//! touched: a connect is all it sees.
//!
//! The holder is found the way `ss -xlp` finds it: the listening socket's inode in
//! `/proc/net/unix`, then the `/proc/<pid>/fd` link that points at `socket:[inode]`.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a connect may take before the socket is taken as answered (a listener with a full
/// backlog makes a Unix connect wait; it is still a live listener).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// `/proc/net/unix` flag `__SO_ACCEPTCON`: the socket listens.
const ACCEPTCON: u32 = 0x0001_0000;

/// A live process serving one of the root's sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketHolder {
    /// The socket that answered.
    pub socket: PathBuf,
    /// The process listening on it, when `/proc` shows it (another user's process may not be
    /// visible without privileges).
    pub process: Option<ProcessInfo>,
}

/// A process, as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its PID.
    pub pid: u32,
    /// Its command line, arguments joined by spaces (empty for kernel threads).
    pub command: String,
}

impl std::fmt::Display for SocketHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.process {
            Some(p) => write!(
                f,
                "{} is served by process {} ({})",
                self.socket.display(),
                p.pid,
                p.command
            ),
            None => write!(
                f,
                "{} is served by a live process that could not be identified (not visible in \
                 /proc to this user?)",
                self.socket.display()
            ),
        }
    }
}

/// The first of `sockets` a live process answers on, with that process when it can be named.
pub async fn live_holder(sockets: &[&Path]) -> Option<SocketHolder> {
    for socket in sockets {
        let answered =
            match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(socket))
                .await
            {
                Ok(Ok(_stream)) => true,
                Ok(Err(_)) => false,
                // Still waiting on a listener's backlog: someone listens.
                Err(_) => true,
            };
        if answered {
            let process = holder_process(socket, Path::new("/proc"));
            return Some(SocketHolder {
                socket: socket.to_path_buf(),
                process,
            });
        }
    }
    None
}

/// The process listening on `socket`, read from `proc` (`/proc` outside tests).
fn holder_process(socket: &Path, proc: &Path) -> Option<ProcessInfo> {
    let table = std::fs::read_to_string(proc.join("net/unix")).ok()?;
    // The table holds the path as it was bound: through a symlink (/var/run) or not.
    let mut inodes = listening_inodes(&table, socket);
    if let Ok(canonical) = std::fs::canonicalize(socket) {
        inodes.extend(listening_inodes(&table, &canonical));
    }
    if inodes.is_empty() {
        return None;
    }
    socket_owners(proc, &inodes)
        .into_iter()
        .next()
        .map(|(_, process)| process)
}

/// Every process (other than this one) listening on a Unix socket bound under `dir`, with
/// the socket: plugins, drivers and agents that serve a root (`devicelet dev-cluster down`
/// stops what was started against its nodes). Sockets bound with relative paths are not seen.
pub fn listeners_under(dir: &Path) -> Vec<(PathBuf, ProcessInfo)> {
    let proc = Path::new("/proc");
    let Ok(table) = std::fs::read_to_string(proc.join("net/unix")) else {
        return Vec::new();
    };
    let sockets = listening_under(&table, dir);
    let inodes: Vec<u64> = sockets.iter().map(|(inode, _)| *inode).collect();
    socket_owners(proc, &inodes)
        .into_iter()
        .filter_map(|(inode, process)| {
            let (_, path) = sockets.iter().find(|(i, _)| *i == inode)?;
            Some((path.clone(), process))
        })
        .collect()
}

/// The processes under `proc` holding one of the socket `inodes`, each with the inode it holds
/// (the first such fd per process).
fn socket_owners(proc: &Path, inodes: &[u64]) -> Vec<(u64, ProcessInfo)> {
    let mut owners = Vec::new();
    if inodes.is_empty() {
        return owners;
    }
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return owners;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let held = fds.flatten().find_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let target = target.to_string_lossy();
            inodes
                .iter()
                .copied()
                .find(|inode| target == format!("socket:[{inode}]"))
        });
        if let Some(inode) = held {
            owners.push((
                inode,
                ProcessInfo {
                    pid,
                    command: command_line(&entry.path()),
                },
            ));
        }
    }
    owners
}

/// The listening sockets of a `/proc/net/unix` table (`Num RefCount Protocol Flags Type St
/// Inode [Path]`), as (inode, path as bound); unbound ones are left out.
fn listeners(table: &str) -> impl Iterator<Item = (u64, &str)> {
    table.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
        let inode = fields.get(6)?.parse::<u64>().ok()?;
        let path = fields.get(7)?;
        (flags & ACCEPTCON != 0).then_some((inode, *path))
    })
}

/// Inodes of the listening sockets bound at `socket` in a `/proc/net/unix` table. A socket
/// bound with a relative path is listed relative: it matches when `socket` ends with it.
fn listening_inodes(table: &str, socket: &Path) -> Vec<u64> {
    let wanted = socket.to_string_lossy();
    listeners(table)
        .filter(|(_, path)| {
            *path == wanted || (!path.starts_with('/') && wanted.ends_with(&format!("/{path}")))
        })
        .map(|(inode, _)| inode)
        .collect()
}

/// Listening sockets of a `/proc/net/unix` table bound at an absolute path under `dir`.
fn listening_under(table: &str, dir: &Path) -> Vec<(u64, PathBuf)> {
    listeners(table)
        .map(|(inode, path)| (inode, Path::new(path)))
        .filter(|(_, path)| path.is_absolute() && path.starts_with(dir))
        .map(|(inode, path)| (inode, path.to_path_buf()))
        .collect()
}

/// `/proc/<pid>/cmdline` as one line (NULs as spaces), or `comm` when it is empty.
fn command_line(process_dir: &Path) -> String {
    let cmdline = std::fs::read(process_dir.join("cmdline")).unwrap_or_default();
    let joined = cmdline
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if !joined.is_empty() {
        return joined;
    }
    std::fs::read_to_string(process_dir.join("comm"))
        .map(|c| c.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 4242 /var/lib/kubelet/device-plugins/kubelet.sock
0000000000000000: 00000003 00000000 00000000 0001 03 4243 /var/lib/kubelet/device-plugins/kubelet.sock
0000000000000000: 00000002 00000000 00010000 0001 01 5151 rel/pod-resources/kubelet.sock
0000000000000000: 00000002 00000000 00010000 0001 01 6000
";

    #[test]
    fn listening_sockets_are_found_by_path_only() {
        let kubelet = Path::new("/var/lib/kubelet/device-plugins/kubelet.sock");
        // The connected (non-listening) entry for the same path is not the listener.
        assert_eq!(listening_inodes(TABLE, kubelet), vec![4242]);
        let relative = Path::new("/home/u/rel/pod-resources/kubelet.sock");
        assert_eq!(listening_inodes(TABLE, relative), vec![5151]);
        assert!(listening_inodes(TABLE, Path::new("/other.sock")).is_empty());
    }

    #[test]
    fn listening_sockets_under_a_directory() {
        let under = listening_under(TABLE, Path::new("/var/lib/kubelet"));
        assert_eq!(
            under,
            vec![(
                4242,
                PathBuf::from("/var/lib/kubelet/device-plugins/kubelet.sock")
            )]
        );
        // A prefix of a name is not a parent directory.
        assert!(listening_under(TABLE, Path::new("/var/lib/kube")).is_empty());
    }

    #[tokio::test]
    async fn a_live_listener_is_named_and_a_dead_socket_is_not() {
        let dir = tempfile::Builder::new()
            .prefix("dl-guard")
            .tempdir_in("/tmp")
            .unwrap();
        let dead = dir.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        let live = dir.path().join("live.sock");
        let missing = dir.path().join("missing.sock");
        assert_eq!(live_holder(&[&dead, &missing]).await, None);

        // A child process holds the listener, so the holder is another PID.
        let script = format!(
            "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind({:?})\ns.listen(1)\ntime.sleep(30)\n",
            live.to_string_lossy()
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if live.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let holder = live_holder(&[&dead, &live]).await.unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(holder.socket, live);
        let process = holder
            .process
            .clone()
            .expect("the holder is visible in /proc");
        assert_eq!(process.pid, child.id());
        assert!(process.command.contains("python3"), "{}", process.command);
        assert!(
            holder
                .to_string()
                .contains(&format!("process {}", child.id()))
        );
    }
}
