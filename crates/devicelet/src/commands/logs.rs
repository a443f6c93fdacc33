//! `devicelet logs POD CONTAINER`: a container's log from `R/logs` (the kubelet's layout,
//! `<namespace>_<name>_<uid>/<container>/<attempt>.log`, written by the CRI runtime), decoded
//! from the CRI log format. Reads the files directly: works with the daemon stopped.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use devicelet_runtime::logs::{decode_cri_log, find_pod_log_dir};

use crate::cli::LogsArgs;

/// Runs `logs`.
pub fn run(root_dir: &Path, args: &LogsArgs) -> anyhow::Result<()> {
    if !devicelet_runtime::config::is_path_safe(&args.container) {
        bail!("{:?} is not a container name", args.container);
    }
    let logs = root_dir.join("logs");
    let pod_dir = find_pod(&logs, &args.pod)?;
    let container_dir = pod_dir.join(&args.container);
    let mut attempts: Vec<(u32, PathBuf)> = std::fs::read_dir(&container_dir)
        .with_context(|| {
            format!(
                "no logs of container {:?} of pod {} (looked in {})",
                args.container,
                args.pod,
                container_dir.display()
            )
        })?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let attempt = e.file_name().to_str()?.strip_suffix(".log")?.parse().ok()?;
            Some((attempt, e.path()))
        })
        .collect();
    attempts.sort();
    let pick = if args.previous {
        attempts.len().checked_sub(2)
    } else {
        attempts.len().checked_sub(1)
    };
    let Some((_, path)) = pick.and_then(|i| attempts.get(i)) else {
        bail!(
            "container {:?} of pod {} has no {}log yet",
            args.container,
            args.pod,
            if args.previous { "previous " } else { "" }
        );
    };
    let raw = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let text = decode_cri_log(&String::from_utf8_lossy(&raw));
    std::io::stdout()
        .write_all(text.as_bytes())
        .context("write to stdout")?;
    Ok(())
}

/// The log directory of `pod`: a UID, `NAME` or `NAMESPACE/NAME`.
fn find_pod(logs: &Path, pod: &str) -> anyhow::Result<PathBuf> {
    if let Some(dir) = find_pod_log_dir(logs, pod) {
        return Ok(dir);
    }
    let (namespace, name) = pod.split_once('/').unwrap_or(("default", pod));
    let prefix = format!("{namespace}_{name}_");
    let matches: Vec<PathBuf> = std::fs::read_dir(logs)
        .with_context(|| {
            format!(
                "no container logs in {} (is serve running with --runtime cri?)",
                logs.display()
            )
        })?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .is_some_and(|uid| !uid.contains('_'))
        })
        .map(|e| e.path())
        .collect();
    match matches.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no logs of pod {pod} in {}", logs.display()),
        _ => bail!(
            "{} pods named {namespace}/{name} have logs; give the UID",
            matches.len()
        ),
    }
}
