//! Shared harness for the integration tests: short temporary roots (Unix socket paths must
//! stay below 108 bytes), `devicelet serve` and `devicelet example-plugin` as real child
//! processes, waiting on the control API, signals.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod test_plugin;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use devicelet_devicemanager::{ResourceView, ResourcesSnapshot};
use devicelet_rpc::{ControlClient, RootPaths};
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, Command};

pub const EXE: &str = env!("CARGO_BIN_EXE_devicelet");
/// How long a test waits for the daemon to reach a state. Generous: on this project's 2-core VM
/// a single fsync has been seen to stall for 19.5 s while many test daemons write at once
/// (measured with an fsync probe beside `--test dra`), and a wait that expires only hides that.
pub const WAIT: Duration = Duration::from_secs(60);

/// Where test roots live: `DEVICELET_TEST_DIR`, else `/dev/shm` (a tmpfs) when there is one,
/// else `/tmp`. The daemons of these tests fsync on every admission, prepare and checkpoint;
/// run in parallel on this project's VM disk they have stalled a single fsync for 20-50 s
/// (seen with an fsync probe beside `--test dra`), far beyond any wait a test can afford. A
/// tmpfs keeps every file operation and fsync call real, without the disk's stalls; the crash
/// tests kill processes, which page-cache contents survive anyway. Durability on a real disk
/// is measured by the benchmarks and the checkpoint crate's tests, which stay on `/tmp`.
pub fn scratch_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DEVICELET_TEST_DIR") {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    let writable = tempfile::Builder::new()
        .prefix("dl-probe-")
        .tempdir_in(shm)
        .is_ok();
    if writable {
        shm.to_path_buf()
    } else {
        PathBuf::from("/tmp")
    }
}

/// A temporary root directory like `/dev/shm/dl-XXXXXX` (see [`scratch_dir`]).
pub struct Root {
    pub dir: tempfile::TempDir,
    pub paths: RootPaths,
}

impl Root {
    pub fn new() -> Root {
        let dir = tempfile::Builder::new()
            .prefix("dl-")
            .tempdir_in(scratch_dir())
            .unwrap();
        let paths = RootPaths::new(dir.path());
        Root { dir, paths }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn control(&self) -> ControlClient {
        ControlClient::new(&self.paths.control_socket)
    }

    /// Starts `devicelet serve` with extra flags and waits until the control API answers.
    pub async fn serve(&self, extra: &[&str]) -> Proc {
        let mut args = vec!["serve"];
        args.extend_from_slice(extra);
        let proc = self.spawn("serve", &args);
        let control = self.control();
        let deadline = tokio::time::Instant::now() + WAIT;
        while control.resources().await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "serve did not come up:\n{}",
                proc.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proc
    }

    /// Starts `devicelet example-plugin` with the given flags.
    pub fn example_plugin(&self, args: &[&str]) -> Proc {
        let mut full = vec!["example-plugin"];
        full.extend_from_slice(args);
        self.spawn("plugin", &full)
    }

    pub fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        self.spawn_env(name, args, &[])
    }

    /// `serve --config CONFIG` refuses to start: it exits non-zero and its log holds
    /// `expected`, as written or with its quotes escaped (a debug-formatted error).
    pub async fn assert_serve_refuses(&self, config: &str, expected: &str) {
        let (code, log) = self
            .spawn("serve", &["serve", "--config", config])
            .wait_exit()
            .await;
        assert_ne!(code, 0, "{config}: {log}");
        assert!(
            log.contains(expected) || log.contains(&expected.replace('"', "\\\"")),
            "{config}: want {expected:?} in\n{log}"
        );
    }

    /// Like [`Root::spawn`] with extra environment variables.
    pub fn spawn_env(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let log = self.path().join(format!("{name}-{}.log", unique()));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(EXE)
            .args(args)
            .arg("--root-dir")
            .arg(self.path())
            .env("RUST_LOG", "debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Proc { child, log }
    }

    /// Polls the control API until `ready` holds for the snapshot; panics with the last
    /// snapshot after [`WAIT`].
    pub async fn wait_for(
        &self,
        what: &str,
        ready: impl Fn(&ResourcesSnapshot) -> bool,
    ) -> ResourcesSnapshot {
        let control = self.control();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let last = control.resources().await;
            if let Ok(s) = &last
                && ready(s)
            {
                return s.clone();
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("timed out waiting for {what}; last: {}", brief(&last));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until `resource` has the given capacity and allocatable.
    pub async fn wait_counts(
        &self,
        resource: &str,
        capacity: u64,
        allocatable: u64,
    ) -> ResourceView {
        let snapshot = self
            .wait_for(&format!("{resource} {capacity}/{allocatable}"), |s| {
                s.resource(resource).is_some_and(|r| {
                    r.capacity == capacity && r.allocatable == allocatable && !r.inactive
                })
            })
            .await;
        snapshot.resource(resource).cloned().unwrap()
    }
}

fn brief(last: &Result<ResourcesSnapshot, devicelet_rpc::ControlError>) -> String {
    match last {
        Err(e) => e.to_string(),
        Ok(s) => s
            .resources
            .iter()
            .map(|r| {
                format!(
                    "{} cap={} alloc={} inactive={} endpoint={:?}",
                    r.name, r.capacity, r.allocatable, r.inactive, r.endpoint
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A child process whose stderr goes to a log file.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.child.id().unwrap() as i32).unwrap();
        kill_process(pid, signal).unwrap();
    }

    /// SIGTERM and wait; returns the exit code.
    pub async fn terminate(mut self) -> i32 {
        self.signal(Signal::TERM);
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("process did not stop within 10s of SIGTERM")
            .unwrap();
        status.code().unwrap_or(-1)
    }

    /// SIGKILL and reap.
    pub async fn kill(mut self) {
        self.signal(Signal::KILL);
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit on its own.
    pub async fn wait_exit(mut self) -> (i32, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("process did not exit")
            .unwrap();
        (status.code().unwrap_or(-1), self.log())
    }
}

/// A free local TCP address (for `--metrics-address`).
#[allow(dead_code)] // not every test binary serves metrics
pub fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// `GET /metrics` on `address`: the whole HTTP answer (headers and body).
#[allow(dead_code)] // not every test binary scrapes
pub async fn scrape(address: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

/// Runs the CLI to completion; returns (exit code, stdout, stderr).
pub async fn cli(root: &Path, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(EXE)
        .args(args)
        .arg("--root-dir")
        .arg(root)
        .output()
        .await
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
