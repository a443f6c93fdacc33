//! `devicelet start POD_UID CONTAINER`: the runtime settings for a container start
//! (`POST /v1/pods/{uid}/containers/{name}/start`; PreStartContainer runs first when the
//! plugin asked for it).

use std::path::Path;

use anyhow::Context;
use devicelet_rpc::{ControlClient, RootPaths};

use crate::cli::StartArgs;
use crate::output;

/// Runs `start`.
pub async fn run(root_dir: &Path, args: StartArgs) -> anyhow::Result<()> {
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    let options = client
        .start(&args.pod_uid, &args.container)
        .await
        .with_context(|| format!("start pod {} container {}", args.pod_uid, args.container))?;
    output::print(args.output.output, &options, options_table)
}

/// The `start` table: one row per env, mount, device, annotation, CDI name, cpuset and
/// cpuset-mems.
pub fn options_table(o: &devicelet_devicemanager::RunContainerOptions) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    rows.extend(
        o.envs
            .iter()
            .map(|(k, v)| vec!["env".into(), format!("{k}={v}")]),
    );
    rows.extend(o.mounts.iter().map(|m| {
        vec![
            "mount".into(),
            format!("{} -> {}", m.host_path, m.container_path),
        ]
    }));
    rows.extend(o.devices.iter().map(|d| {
        vec![
            "device".into(),
            format!(
                "{} -> {} ({})",
                d.host_path, d.container_path, d.permissions
            ),
        ]
    }));
    rows.extend(
        o.annotations
            .iter()
            .map(|(k, v)| vec!["annotation".into(), format!("{k}={v}")]),
    );
    rows.extend(o.cdi_devices.iter().map(|n| vec!["cdi".into(), n.clone()]));
    rows.extend(
        o.cpuset_cpus
            .iter()
            .map(|c| vec!["cpuset".into(), c.clone()]),
    );
    rows.extend(
        o.cpuset_mems
            .iter()
            .map(|m| vec!["cpuset-mems".into(), m.clone()]),
    );
    output::render_table(&["KIND", "VALUE"], &rows)
}
