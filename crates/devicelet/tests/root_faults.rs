//! The root directory read-only or missing, through real `devicelet serve` processes (issue 18
//! item 2; ecosystem A2 row 12's "nothing lost" for the whole root). The root is a real ext4
//! file system on a loop device: mounted read-only at start, or turned read-only mid-run the
//! way the kernel does after a disk error (`errors=remount-ro` and ext4's `trigger_fs_error`).
//! A `mount -o remount,ro` cannot do the latter: it fails with EBUSY while devicelet holds the
//! journal open for writing. Needs root, `mkfs.ext4` and loop devices; skipped otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{EXE, WAIT, cli};

/// A 32 MiB ext4 image mounted on `mnt`; unmounted (and its loop device freed) on drop.
struct Ext4 {
    dir: tempfile::TempDir,
    image: PathBuf,
    mnt: PathBuf,
}

impl Ext4 {
    fn new() -> Option<Ext4> {
        let dir = tempfile::Builder::new()
            .prefix("dl-ext4-")
            .tempdir()
            .unwrap();
        let image = dir.path().join("root.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .status()
            .is_ok_and(|s| s.success());
        let fs = Ext4 { dir, image, mnt };
        if !made || !fs.mount("errors=remount-ro") {
            eprintln!(
                "SKIPPED: cannot make and loop-mount an ext4 image (needs root and mkfs.ext4)"
            );
            return None;
        }
        Some(fs)
    }

    fn mount(&self, options: &str) -> bool {
        Command::new("mount")
            .args(["-o", &format!("loop,{options}")])
            .arg(&self.image)
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success())
    }

    fn umount(&self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "umount {}", self.mnt.display());
    }

    /// Unmounts, repairs as an operator would after a disk error, mounts read-write again.
    fn repair_and_remount(&self) {
        self.umount();
        let fsck = Command::new("e2fsck")
            .args(["-f", "-y"])
            .arg(&self.image)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        // 0: clean, 1: errors corrected.
        assert!(matches!(fsck.code(), Some(0 | 1)), "e2fsck: {fsck:?}");
        assert!(self.mount("errors=remount-ro"));
    }

    /// What the kernel does after an ext4 error with `errors=remount-ro`: every write,
    /// through open descriptors too, fails with EROFS from now on.
    fn fail_read_only(&self) {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let name = Path::new(&dev)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        std::fs::write(format!("/sys/fs/ext4/{name}/trigger_fs_error"), "1").unwrap();
        assert!(std::fs::write(self.mnt.join("probe"), b"x").is_err());
    }

    fn root(&self) -> PathBuf {
        self.mnt.join("root")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// `devicelet serve` with its log outside the root (the root may turn read-only).
struct Serve {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Serve {
    fn spawn(root: &Path, log: &Path) -> Serve {
        let file = std::fs::File::create(log).unwrap();
        let child = tokio::process::Command::new(EXE)
            .args(["serve", "--metrics-address", "off", "--root-dir"])
            .arg(root)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Serve {
            child,
            log: log.to_path_buf(),
        }
    }

    async fn start(root: &Path, log: &Path) -> Serve {
        let serve = Serve::spawn(root, log);
        let deadline = tokio::time::Instant::now() + WAIT;
        while cli(root, &["get", "pods"]).await.0 != 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "serve did not come up:\n{}",
                serve.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        serve
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn exit(mut self) -> (i32, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("serve did not exit")
            .unwrap();
        (status.code().unwrap_or(-1), self.log())
    }

    async fn terminate(self) -> (i32, String) {
        let pid = rustix::process::Pid::from_raw(self.child.id().unwrap() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.exit().await
    }
}

fn manifest(dir: &Path, uid: &str) -> String {
    let path = dir.join(format!("{uid}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{uid}\n  namespace: default\n  uid: {uid}\nspec:\n  containers:\n  - name: main\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

async fn admit(fs: &Ext4, uid: &str) -> (i32, String) {
    let file = manifest(fs.dir.path(), uid);
    let (code, _, err) = cli(&fs.root(), &["admit", "-f", &file]).await;
    (code, err)
}

async fn pod_uids(root: &Path) -> Vec<String> {
    let (code, out, err) = cli(root, &["get", "pods", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut uids: Vec<String> = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"]["uid"].as_str().unwrap().to_owned())
        .collect();
    uids.sort();
    uids
}

/// Every state file under the root with its bytes.
fn state_files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for rel in [
        "cpu_manager_state",
        "dra_manager_state",
        "device-plugins/kubelet_internal_checkpoint",
        "devicelet/device-allocations.journal",
    ] {
        let path = root.join(rel);
        if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
    out
}

#[tokio::test]
async fn a2_12_read_only_root_at_start_is_a_clear_error_and_nothing_is_lost() {
    let Some(fs) = Ext4::new() else { return };
    let root = fs.root();
    let serve = Serve::start(&root, &fs.log("serve-1")).await;
    let (code, err) = admit(&fs, "uid-a").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(serve.terminate().await.0, 0);
    let before = state_files(&root);
    assert!(before.len() >= 3, "{before:?}");

    fs.umount();
    assert!(fs.mount("ro"));
    let (code, log) = Serve::spawn(&root, &fs.log("serve-ro")).exit().await;
    assert_ne!(code, 0, "serve on a read-only root must fail:\n{log}");
    assert!(log.contains("Read-only file system"), "{log}");
    assert!(log.contains(&root.display().to_string()), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    // The files are intact: an operator must not be sent to `state recover`, which would move
    // them aside.
    assert!(!log.contains("state recover"), "{log}");
    assert_eq!(state_files(&root), before, "nothing changed on disk");

    fs.umount();
    assert!(fs.mount("errors=remount-ro"));
    let serve = Serve::start(&root, &fs.log("serve-2")).await;
    assert_eq!(pod_uids(&root).await, vec!["uid-a"], "nothing lost");
    let (code, err) = admit(&fs, "uid-b").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(serve.terminate().await.0, 0);
}

#[tokio::test]
async fn a2_12_root_turning_read_only_mid_run_refuses_admission_cleanly_and_loses_nothing() {
    let Some(fs) = Ext4::new() else { return };
    let root = fs.root();
    let serve = Serve::start(&root, &fs.log("serve-1")).await;
    let (code, err) = admit(&fs, "uid-a").await;
    assert_eq!(code, 0, "{err}");

    fs.fail_read_only();
    let (code, err) = admit(&fs, "uid-b").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(err.contains("device-allocations.journal"), "{err}");
    // Still serving: reads work, the refused pod is not there, and a retry is refused the
    // same way (no crash, no hang).
    assert_eq!(pod_uids(&root).await, vec!["uid-a"]);
    let (code, err) = admit(&fs, "uid-b").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    let (code, log) = serve.terminate().await;
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("panicked"), "{log}");

    fs.repair_and_remount();
    let serve = Serve::start(&root, &fs.log("serve-2")).await;
    assert_eq!(
        pod_uids(&root).await,
        vec!["uid-a"],
        "nothing acknowledged lost"
    );
    let (code, err) = admit(&fs, "uid-b").await;
    assert_eq!(code, 0, "admission works again: {err}");
    assert_eq!(pod_uids(&root).await, vec!["uid-a", "uid-b"]);
    assert_eq!(serve.terminate().await.0, 0);
}

#[tokio::test]
async fn a_missing_root_directory_is_created_at_start() {
    let dir = tempfile::Builder::new()
        .prefix("dl-")
        .tempdir_in(common::scratch_dir())
        .unwrap();
    let root = dir.path().join("missing/parent/root");
    let serve = Serve::start(&root, &dir.path().join("serve.log")).await;
    let file = manifest(dir.path(), "uid-a");
    let (code, _, err) = cli(&root, &["admit", "-f", &file]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(pod_uids(&root).await, vec!["uid-a"]);
    assert_eq!(serve.terminate().await.0, 0);
}

/// `rm -rf R` while serving: before, the daemon ran on unreachable (the CLI said "devicelet is
/// not running"), journaled into a deleted file and retried compaction forever. Now it stops
/// with a clear error naming the root, and started again it sets up a fresh root and serves.
#[tokio::test]
async fn a_root_directory_removed_mid_run_stops_serve_with_a_clear_error() {
    let dir = tempfile::Builder::new()
        .prefix("dl-")
        .tempdir_in(common::scratch_dir())
        .unwrap();
    let root = dir.path().join("root");
    let serve = Serve::start(&root, &dir.path().join("serve-1.log")).await;
    let file = manifest(dir.path(), "uid-a");
    let (code, _, err) = cli(&root, &["admit", "-f", &file]).await;
    assert_eq!(code, 0, "{err}");
    std::fs::remove_dir_all(&root).unwrap();
    let (code, log) = serve.exit().await;
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains(&format!("root directory {} was removed", root.display())),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");

    let serve = Serve::start(&root, &dir.path().join("serve-2.log")).await;
    assert!(pod_uids(&root).await.is_empty(), "a fresh root");
    let (code, _, err) = cli(&root, &["admit", "-f", &file]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(serve.terminate().await.0, 0);
}
