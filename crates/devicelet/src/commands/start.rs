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
    if !args.check_cdi {
        return output::print(args.output.output, &options, options_table);
    }
    let dirs = devicelet_runtime::spec_dirs(root_dir, &args.cdi_spec_dirs);
    let check = devicelet_runtime::CdiResolver::new(dirs).check(&options.cdi_devices);
    let checked = CheckedStart {
        options,
        cdi_check: check,
    };
    output::print(args.output.output, &checked, |c| {
        format!(
            "{}\n{}",
            options_table(&c.options),
            check_table(&c.cdi_check)
        )
    })?;
    let check = &checked.cdi_check;
    if !check.ok() {
        let mut message = format!(
            "unresolvable CDI device(s) {}: no valid spec in {:?} defines them",
            check.unresolved.join(", "),
            check.dirs
        );
        for (file, why) in &check.invalid_specs {
            message.push_str(&format!("; {file} is not a valid CDI spec: {why}"));
        }
        anyhow::bail!(message);
    }
    Ok(())
}

/// `start --check-cdi`'s answer: the runtime settings and the CDI check of their names.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct CheckedStart {
    #[serde(flatten)]
    options: devicelet_devicemanager::RunContainerOptions,
    cdi_check: devicelet_runtime::CdiCheck,
}

/// One row per CDI name (resolved by which file, or not) and per spec file the CDI library
/// refused.
fn check_table(check: &devicelet_runtime::CdiCheck) -> String {
    let mut rows: Vec<Vec<String>> = check
        .resolved
        .iter()
        .map(|(name, file)| vec![name.clone(), format!("resolved by {file}")])
        .collect();
    rows.extend(check.unresolved.iter().map(|name| {
        vec![
            name.clone(),
            format!("UNRESOLVED: no spec in {:?} defines it", check.dirs),
        ]
    }));
    rows.extend(
        check
            .invalid_specs
            .iter()
            .map(|(file, why)| vec![file.clone(), format!("INVALID SPEC: {why}")]),
    );
    if rows.is_empty() {
        return "CDI: the container gets no CDI device\n".into();
    }
    output::render_table(&["CDI", "CHECK"], &rows)
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
