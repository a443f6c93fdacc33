//! `devicelet get resources`: asks the running daemon over the control socket
//! (`GET /v1/resources`) and prints the inventory.

use std::path::Path;

use anyhow::Context;
use devicelet_devicemanager::ResourcesSnapshot;
use devicelet_rpc::{ControlClient, RootPaths};

use crate::cli::{GetArgs, GetWhat};
use crate::output;

/// Runs `get`.
pub async fn run(root_dir: &Path, args: GetArgs) -> anyhow::Result<()> {
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    match args.what {
        GetWhat::Resources(out) => {
            let snapshot = client.resources().await.context("get resources")?;
            output::print(out.output, &snapshot, resources_table)
        }
        GetWhat::Pods(out) => {
            let pods = client.pods().await.context("get pods")?;
            output::print(out.output, &pods, |list| {
                crate::commands::admit::pods_table(&list.pods)
            })
        }
    }
}

/// The table form of `get resources`: one row per resource, then one row per device.
pub fn resources_table(snapshot: &ResourcesSnapshot) -> String {
    if snapshot.resources.is_empty() {
        return "No device-plugin resources registered.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = snapshot
        .resources
        .iter()
        .map(|r| {
            let state = if r.inactive {
                "Inactive".to_owned()
            } else {
                r.endpoint
                    .as_ref()
                    .map_or_else(String::new, |e| match e.grace_remaining_seconds {
                        Some(left) => format!("{} (inactive in {left}s)", e.state),
                        None => e.state.clone(),
                    })
            };
            vec![
                r.name.clone(),
                r.capacity.to_string(),
                r.allocatable.to_string(),
                state,
            ]
        })
        .collect();
    let mut text = output::render_table(&["RESOURCE", "CAPACITY", "ALLOCATABLE", "STATE"], &rows);
    let device_rows: Vec<Vec<String>> = snapshot
        .resources
        .iter()
        .flat_map(|r| {
            r.devices.iter().map(|d| {
                let numa = if d.numa_nodes.is_empty() {
                    "-".to_owned()
                } else {
                    d.numa_nodes
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                };
                vec![r.name.clone(), d.id.clone(), d.health.clone(), numa]
            })
        })
        .collect();
    if !device_rows.is_empty() {
        text.push('\n');
        text.push_str(&output::render_table(
            &["RESOURCE", "DEVICE", "HEALTH", "NUMA"],
            &device_rows,
        ));
    }
    text
}
