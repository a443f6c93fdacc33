//! `devicelet top`: a live per-resource allocation view from the control API
//! (`GET /v1/resources`): capacity, allocatable, allocated, unhealthy and the plugin state,
//! refreshed every `--interval` until interrupted, or printed once with `--once`. `--numa`
//! draws the node as a picture instead ([`crate::commands::numa`]).

use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::Context;
use devicelet_devicemanager::{HEALTHY, ResourcesSnapshot};
use devicelet_rpc::{ControlClient, RootPaths};
use serde::Serialize;

use crate::cli::{OutputFormat, TopArgs};
use crate::output;

/// One row of `top` (also its JSON/YAML shape: `{"resources":[{...}]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopRow {
    /// Resource name.
    pub name: String,
    /// Devices advertised.
    pub capacity: u64,
    /// Healthy devices while the plugin is connected.
    pub allocatable: u64,
    /// Devices held by admitted containers.
    pub allocated: u64,
    /// Devices not `Healthy`.
    pub unhealthy: u64,
    /// `Serving`, `Stopped`, `Restored` or `Inactive`.
    pub state: String,
}

/// `top`'s JSON/YAML document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopView {
    /// One row per resource, by name.
    pub resources: Vec<TopRow>,
}

/// The rows for a snapshot.
pub fn top_view(snapshot: &ResourcesSnapshot) -> TopView {
    TopView {
        resources: snapshot
            .resources
            .iter()
            .map(|r| TopRow {
                name: r.name.clone(),
                capacity: r.capacity,
                allocatable: r.allocatable,
                allocated: r.allocated,
                unhealthy: r.devices.iter().filter(|d| d.health != HEALTHY).count() as u64,
                state: if r.inactive {
                    "Inactive".to_owned()
                } else {
                    r.endpoint
                        .as_ref()
                        .map_or_else(String::new, |e| e.state.clone())
                },
            })
            .collect(),
    }
}

/// The table form: one row per resource with a usage bar of allocated over allocatable.
pub fn top_table(view: &TopView) -> String {
    if view.resources.is_empty() {
        return "No device-plugin resources registered.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = view
        .resources
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.capacity.to_string(),
                r.allocatable.to_string(),
                r.allocated.to_string(),
                r.unhealthy.to_string(),
                usage_bar(r.allocated, r.capacity),
                r.state.clone(),
            ]
        })
        .collect();
    output::render_table(
        &[
            "RESOURCE",
            "CAPACITY",
            "ALLOCATABLE",
            "ALLOCATED",
            "UNHEALTHY",
            "USED",
            "STATE",
        ],
        &rows,
    )
}

/// `[#####.....]  50%` of capacity in use.
fn usage_bar(used: u64, capacity: u64) -> String {
    const WIDTH: u64 = 10;
    if capacity == 0 {
        return "-".to_owned();
    }
    let used = used.min(capacity);
    let filled = (used * WIDTH).div_ceil(capacity).min(WIDTH) as usize;
    format!(
        "[{}{}] {:>3}%",
        "#".repeat(filled),
        ".".repeat(WIDTH as usize - filled),
        used * 100 / capacity
    )
}

/// Runs `top`.
pub async fn run(root_dir: &Path, args: TopArgs) -> anyhow::Result<()> {
    if args.numa {
        return crate::commands::numa::run(root_dir, args).await;
    }
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    let redraw =
        !args.once && args.output.output == OutputFormat::Table && std::io::stdout().is_terminal();
    loop {
        let snapshot = client.resources().await.context("top")?;
        let view = top_view(&snapshot);
        if redraw {
            // Clear the screen and go home, so the table updates in place.
            print!("\x1b[2J\x1b[H");
        }
        match args.output.output {
            // A stream of JSON documents is one compact object per line.
            OutputFormat::Json if !args.once => println!("{}", serde_json::to_string(&view)?),
            OutputFormat::Yaml if !args.once => print!("---\n{}", serde_yaml::to_string(&view)?),
            format => output::print(format, &view, top_table)?,
        }
        std::io::stdout().flush()?;
        if args.once {
            return Ok(());
        }
        tokio::time::sleep(args.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_bar_rounds_up_and_handles_zero_capacity() {
        assert_eq!(usage_bar(0, 8), "[..........]   0%");
        assert_eq!(usage_bar(1, 8), "[##........]  12%");
        assert_eq!(usage_bar(8, 8), "[##########] 100%");
        assert_eq!(usage_bar(3, 0), "-");
    }
}
