//! `devicelet sync-pods [POD_UID...] [-f FILE] [--none]`: tells the daemon which pods are
//! still active (`POST /v1/pods/sync`); every other admitted pod is removed and its devices,
//! CPUs and claims freed. This is the kubelet's `UpdateAllocatedDevices` (spec devicemanager.md
//! §2.C C7) with the active-pod set coming from whoever runs the containers, and the step that
//! frees pods that went away while devicelet was down (§3.4).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use anyhow::Context;
use devicelet_rpc::{ControlClient, RootPaths};

use crate::cli::SyncPodsArgs;
use crate::output;

/// Runs `sync-pods`.
pub async fn run(root_dir: &Path, args: SyncPodsArgs) -> anyhow::Result<()> {
    let active = active_pods(&args)?;
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    let sync = client
        .sync_pods(&active)
        .await
        .context("sync active pods")?;
    output::print(args.output.output, &sync, |s| {
        let mut rows: Vec<Vec<String>> = s
            .removed
            .iter()
            .map(|uid| {
                let state = if s.pending_unprepare.contains(uid) {
                    "removed (claims pending unprepare)"
                } else {
                    "removed"
                };
                vec![uid.clone(), state.to_owned()]
            })
            .collect();
        rows.push(vec![format!("{} active pod(s)", s.kept), "kept".to_owned()]);
        output::render_table(&["POD UID", "STATE"], &rows)
    })
}

/// The active UIDs from the arguments and the file, deduplicated; an empty set only with
/// `--none`.
fn active_pods(args: &SyncPodsArgs) -> anyhow::Result<Vec<String>> {
    let mut uids: BTreeSet<String> = args.active.iter().cloned().collect();
    if let Some(file) = &args.file {
        let text = if file.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("read active pod UIDs from stdin")?;
            text
        } else {
            std::fs::read_to_string(file)
                .with_context(|| format!("read active pod UIDs from {}", file.display()))?
        };
        uids.extend(parse_uid_list(&text));
    }
    if uids.is_empty() && !args.none {
        anyhow::bail!(
            "no active pod UID given: pass --none to remove every admitted pod on purpose"
        );
    }
    Ok(uids.into_iter().collect())
}

/// One UID per line; blank lines and `#` comments are skipped.
fn parse_uid_list(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_lists_skip_blanks_and_comments() {
        let text = "# active pods\nuid-a\n\n  uid-b  # trailing\n#uid-c\n";
        let uids: Vec<String> = parse_uid_list(text).collect();
        assert_eq!(uids, ["uid-a", "uid-b"]);
    }
}
