//! `devicelet state inspect|import|recover|status`: the durable device state on disk
//! (`R/device-plugins/kubelet_internal_checkpoint` and devicelet's journal in `R/devicelet/`).
//! Follows the kubelet's checkpoint manager (`pkg/kubelet/checkpointmanager/`) for reading and
//! verifying; import and recover are devicelet's explicit operator steps (ecosystem.md A2:
//! never overwrite evidence, never guess ownership).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use devicelet_checkpoint::atomic_write::write_file_atomic;
use devicelet_checkpoint::device;
use devicelet_checkpoint::inspect::{self, InspectReport};
use devicelet_checkpoint::store::{RecoverAction, RecoverReport, StorePaths, recover};
use devicelet_node::durable::CheckpointStatus;
use devicelet_rpc::{ControlClient, RootPaths};

use crate::cli::{OutputFormat, RecoverFrom, StateArgs, StateWhat};
use crate::output;

/// Runs `state ...`.
pub async fn run(root_dir: &Path, args: StateArgs) -> anyhow::Result<()> {
    let paths = RootPaths::new(root_dir);
    let store = devicelet_node::durable::store_paths(&paths.device_plugins, &paths.control_dir);
    match args.what {
        StateWhat::Inspect { file, output } => {
            let file = file.unwrap_or_else(|| store.kubelet_file.clone());
            inspect_cmd(&file, output.output)
        }
        StateWhat::Import { file, output } => {
            refuse_if_running(&paths).await?;
            let report = import(&store, &file)?;
            print_recover(output.output, Some(&report), &[])
        }
        StateWhat::Recover {
            from,
            dra_only,
            output,
        } => {
            refuse_if_running(&paths).await?;
            let report = match from.filter(|_| !dra_only) {
                None => None,
                Some(from) => {
                    let action = match from {
                        RecoverFrom::KubeletFile => RecoverAction::ImportKubeletFile,
                        RecoverFrom::Empty => RecoverAction::StartEmpty,
                        RecoverFrom::Journal => RecoverAction::RebuildFromJournal,
                    };
                    Some(recover(&store, action).context("recover the device state")?)
                }
            };
            let dra = devicelet_node::dra::recover_dra(&paths.root)
                .context("clear the DRA quarantine")?;
            print_recover(output.output, report.as_ref(), &dra)
        }
        StateWhat::Status(output) => {
            let client = ControlClient::new(paths.control_socket);
            let status: CheckpointStatus = client
                .get_json("/v1/state")
                .await
                .context("ask the daemon for its state")?;
            output::print(output.output, &status, |s| {
                output::render_table(
                    &[
                        "HEALTH",
                        "COMMITS",
                        "FSYNCS",
                        "COMPACTIONS",
                        "ERRORS",
                        "LAG_MS",
                        "DETAIL",
                    ],
                    &[vec![
                        serde_json::to_value(s.health)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        s.commits.to_string(),
                        s.journal_syncs.to_string(),
                        s.compactions.to_string(),
                        s.errors_total.to_string(),
                        s.kubelet_file_lag_ms
                            .map_or_else(|| "0".into(), |l| format!("{l:.0}")),
                        s.detail.clone().unwrap_or_default(),
                    ]],
                )
            })
        }
    }
}

fn inspect_cmd(file: &Path, format: OutputFormat) -> anyhow::Result<()> {
    let report: InspectReport =
        inspect::inspect_file(file).with_context(|| format!("read {}", file.display()))?;
    output::print(format, &report, inspect::render_table)?;
    if !report.valid {
        bail!(
            "{}: {}",
            file.display(),
            report
                .error
                .as_deref()
                .unwrap_or("checkpoint does not verify")
        );
    }
    Ok(())
}

/// The store's files must not change under a running daemon.
async fn refuse_if_running(paths: &RootPaths) -> anyhow::Result<()> {
    if tokio::net::UnixStream::connect(&paths.control_socket)
        .await
        .is_ok()
    {
        bail!(
            "devicelet is running on {} (control socket answers); stop it first",
            paths.root.display()
        );
    }
    Ok(())
}

/// Takes over a kubelet's `kubelet_internal_checkpoint`: it must verify; it replaces ours (ours
/// and the journal are moved aside, never deleted).
fn import(store: &StorePaths, file: &Path) -> anyhow::Result<RecoverReport> {
    let bytes = std::fs::read(file).with_context(|| format!("read {}", file.display()))?;
    device::decode(&bytes)
        .with_context(|| format!("{} is not a valid device checkpoint", file.display()))?;
    let same = std::fs::canonicalize(file).ok() == std::fs::canonicalize(&store.kubelet_file).ok();
    let mut moved_ours: Option<(PathBuf, PathBuf)> = None;
    if !same {
        if store.kubelet_file.exists() {
            let aside = PathBuf::from(format!(
                "{}.replaced-{}",
                store.kubelet_file.display(),
                devicelet_checkpoint::store::utc_timestamp(std::time::SystemTime::now())
            ));
            std::fs::hard_link(&store.kubelet_file, &aside)
                .with_context(|| format!("keep {} aside", store.kubelet_file.display()))?;
            moved_ours = Some((store.kubelet_file.clone(), aside));
        }
        if let Some(dir) = store.kubelet_file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        write_file_atomic(&store.kubelet_file, &bytes)
            .with_context(|| format!("write {}", store.kubelet_file.display()))?;
    }
    let mut report =
        recover(store, RecoverAction::ImportKubeletFile).context("take over the checkpoint")?;
    report.moved.extend(moved_ours);
    Ok(report)
}

/// What `state recover` / `state import` did: the device state (absent with `--dra-only`)
/// and the DRA quarantine markers removed.
#[derive(serde::Serialize)]
struct RecoverOutput<'a> {
    #[serde(flatten)]
    device: Option<&'a RecoverReport>,
    dra_cleared_quarantine: &'a [PathBuf],
}

fn print_recover(
    format: OutputFormat,
    report: Option<&RecoverReport>,
    dra: &[PathBuf],
) -> anyhow::Result<()> {
    let out = RecoverOutput {
        device: report,
        dra_cleared_quarantine: dra,
    };
    output::print(format, &out, |o| {
        let mut text = String::new();
        if let Some(r) = o.device {
            for (from, to) in &r.moved {
                text.push_str(&format!("kept {} as {}\n", from.display(), to.display()));
            }
            if let Some(n) = r.imported_entries {
                text.push_str(&format!("imported {n} allocation entries\n"));
            }
            if let Some(b) = r.rebuilt {
                text.push_str(&format!(
                    "rebuilt {} pod(s), {} allocation entries from the journal ({} without cached runtime settings)\n",
                    b.pods, b.entries, b.entries_without_response
                ));
            }
            if r.cleared_quarantine {
                text.push_str("quarantine cleared\n");
            }
        }
        for marker in o.dra_cleared_quarantine {
            text.push_str(&format!("DRA quarantine cleared ({})\n", marker.display()));
        }
        text.push_str("the next `devicelet serve` starts from this state\n");
        text
    })
}
