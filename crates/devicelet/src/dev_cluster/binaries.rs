//! Finding the Kubernetes server binaries the user already has: `--bin-dir`, else `PATH`, else
//! the project's own control-plane build cache (`interop/cluster/build.sh` writes
//! `${DEVICELET_CACHE_DIR:-~/.cache/devicelet}/controlplane/KEY/bin`). devicelet never downloads
//! them.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The programs a dev cluster runs, found.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kube-apiserver`.
    pub apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub controller_manager: PathBuf,
    /// `kube-scheduler`, when it is the scheduler asked for.
    pub kube_scheduler: Option<PathBuf>,
    /// The Kubernetes minor version `kube-apiserver --version` reports.
    pub minor: u32,
    /// That version as printed (`v1.36.3`).
    pub version: String,
}

/// The oldest Kubernetes with `resource.k8s.io/v1` (DRA GA), which devicelet nodes speak.
const OLDEST_MINOR: u32 = 34;

/// Finds the programs: each in `bin_dir` when given (and nowhere else), else on `PATH`, else
/// in the newest complete build cache.
pub fn find(bin_dir: Option<&Path>, with_kube_scheduler: bool) -> anyhow::Result<Binaries> {
    let mut names = vec!["etcd", "kube-apiserver", "kube-controller-manager"];
    if with_kube_scheduler {
        names.push("kube-scheduler");
    }
    let dirs: Vec<PathBuf> = match bin_dir {
        Some(dir) => vec![dir.to_path_buf()],
        None => {
            let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default();
            dirs.extend(build_caches());
            dirs
        }
    };
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for name in &names {
        match dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p)) {
            Some(path) => found.push(path),
            None => missing.push(*name),
        }
    }
    if !missing.is_empty() {
        let looked = match bin_dir {
            Some(dir) => format!("in {}", dir.display()),
            None => "on PATH and in the build cache (interop/cluster/build.sh)".to_owned(),
        };
        bail!(
            "{} not found {looked}. Give --bin-dir DIR with the official Kubernetes server \
             binaries (kubernetes-server-linux-ARCH.tar.gz, kubernetes/server/bin) and etcd \
             (etcd-vX-linux-ARCH.tar.gz), or build them from source with `bash \
             interop/cluster/build.sh` in a devicelet checkout",
            missing.join(", ")
        );
    }
    let mut found = found.into_iter();
    let (Some(etcd), Some(apiserver), Some(controller_manager)) =
        (found.next(), found.next(), found.next())
    else {
        bail!("internal: binaries out of order");
    };
    let kube_scheduler = found.next();
    let version = version_of(&apiserver)?;
    let minor = minor_of(&version)
        .with_context(|| format!("{}: unexpected version {version:?}", apiserver.display()))?;
    if minor < OLDEST_MINOR {
        bail!(
            "{} is Kubernetes {version}: devicelet nodes need 1.{OLDEST_MINOR} or later \
             (resource.k8s.io/v1)",
            apiserver.display()
        );
    }
    Ok(Binaries {
        etcd,
        apiserver,
        controller_manager,
        kube_scheduler,
        minor,
        version,
    })
}

/// `${DEVICELET_CACHE_DIR:-~/.cache/devicelet}/controlplane/*/bin`, newest first.
fn build_caches() -> Vec<PathBuf> {
    let root = match std::env::var_os("DEVICELET_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(".cache/devicelet"),
            None => return Vec::new(),
        },
    };
    let Ok(entries) = std::fs::read_dir(root.join("controlplane")) else {
        return Vec::new();
    };
    let mut dirs: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter_map(|bin| Some((std::fs::metadata(&bin).ok()?.modified().ok()?, bin)))
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    dirs.into_iter().map(|(_, dir)| dir).collect()
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `kube-apiserver --version` → `v1.36.3`.
fn version_of(apiserver: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(apiserver)
        .arg("--version")
        .output()
        .with_context(|| format!("run {} --version", apiserver.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find(|w| w.starts_with("v1."))
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "{} --version printed no version: {}",
                apiserver.display(),
                text.trim()
            )
        })
}

fn minor_of(version: &str) -> Option<u32> {
    version.strip_prefix("v1.")?.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(minor_of("v1.36.3"), Some(36));
        assert_eq!(minor_of("v1.37.0-alpha.1"), Some(37));
        assert_eq!(minor_of("v2.0.0"), None);
    }

    #[test]
    fn a_missing_program_is_named_with_where_it_was_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let err = find(Some(dir.path()), true).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "etcd, kube-apiserver, kube-controller-manager, kube-scheduler not found in"
            ),
            "{err}"
        );
        assert!(err.contains("--bin-dir"), "{err}");
    }
}
