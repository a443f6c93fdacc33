//! Container logs in the kubelet's layout (`pkg/kubelet/kuberuntime` `BuildPodLogsDirectory`,
//! `BuildContainerLogsDirectory`): `<logs>/<namespace>_<name>_<uid>/<container>/<attempt>.log`,
//! written by the runtime in the CRI log format (`<RFC 3339 nano time> <stream> <P|F> <text>`,
//! `pkg/kubelet/kuberuntime/logs`).

use std::path::{Path, PathBuf};

/// The directory of a pod's logs.
pub fn pod_log_dir(logs_root: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    logs_root.join(format!("{namespace}_{name}_{uid}"))
}

/// The newest attempt's log file of `container` in a pod's log directory.
pub fn latest_log(pod_dir: &Path, container: &str) -> Option<PathBuf> {
    let dir = pod_dir.join(container);
    std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let attempt: u32 = name.to_str()?.strip_suffix(".log")?.parse().ok()?;
            Some((attempt, e.path()))
        })
        .max_by_key(|(attempt, _)| *attempt)
        .map(|(_, path)| path)
}

/// The pod log directory of pod `uid` under `logs_root` (its name ends with `_<uid>`).
pub fn find_pod_log_dir(logs_root: &Path, uid: &str) -> Option<PathBuf> {
    let suffix = format!("_{uid}");
    std::fs::read_dir(logs_root)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(&suffix)))
        .map(|e| e.path())
}

/// The text of a CRI log: partial lines (`P`) joined with the line that ends them (`F`);
/// lines not in the CRI format are kept as they are.
pub fn decode_cri_log(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for line in raw.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(_time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        if !matches!(stream, "stdout" | "stderr") {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        out.push_str(parts.next().unwrap_or_default());
        if tag != "P" {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_logs_decode_to_the_container_output() {
        let raw = "2026-11-26T23:00:00.1Z stdout F hello world\n\
                   2026-11-26T23:00:00.2Z stderr P part\n\
                   2026-11-26T23:00:00.3Z stderr F ial\n\
                   2026-11-26T23:00:00.4Z stdout F \n";
        assert_eq!(decode_cri_log(raw), "hello world\npartial\n\n");
    }

    #[test]
    fn the_newest_attempt_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = pod_log_dir(dir.path(), "ns", "p", "u1");
        std::fs::create_dir_all(pod.join("c")).expect("mkdir");
        for n in ["0.log", "2.log", "10.log", "x.log"] {
            std::fs::write(pod.join("c").join(n), "").expect("write");
        }
        assert_eq!(latest_log(&pod, "c"), Some(pod.join("c/10.log")));
        assert_eq!(latest_log(&pod, "other"), None);
        assert_eq!(find_pod_log_dir(dir.path(), "u1"), Some(pod));
    }
}
