//! `devicelet remove POD_UID`: the pod is gone; its devices are freed (`DELETE /v1/pods/{uid}`).

use std::path::Path;

use anyhow::Context;
use devicelet_rpc::{ControlClient, RootPaths};

use crate::cli::RemoveArgs;

/// Runs `remove`.
pub async fn run(root_dir: &Path, args: RemoveArgs) -> anyhow::Result<()> {
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    client
        .remove(&args.pod_uid)
        .await
        .with_context(|| format!("remove pod {}", args.pod_uid))?;
    println!("pod {} removed", args.pod_uid);
    Ok(())
}
