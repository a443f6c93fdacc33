//! `devicelet snapshot -o FILE`: the cluster's DRA state as an `AllocationScenario` that
//! `devicelet allocate -f FILE` replays offline (issue 19, item 2). Read-only; the API part is
//! `devicelet_kube::snapshot`.

use anyhow::Context;
use devicelet_kube::ClusterSource;
use devicelet_kube::snapshot::{ScenarioOptions, read_state, scenario_value, to_scenario};

use crate::cli::{ClusterArgs, SnapshotArgs};

/// Where the client configuration comes from.
pub fn source(args: &ClusterArgs) -> ClusterSource {
    match &args.kubeconfig {
        Some(path) => ClusterSource::Kubeconfig(path.clone()),
        None => ClusterSource::Infer,
    }
}

/// Runs the command.
pub async fn run(args: SnapshotArgs) -> anyhow::Result<()> {
    let client = devicelet_kube::connect(&source(&args.cluster)).await?;
    let state = read_state(&client, args.namespace.as_deref()).await?;
    for w in &state.warnings {
        eprintln!("warning: {w}");
    }
    let name = format!(
        "snapshot of {}",
        args.namespace
            .as_deref()
            .map(|ns| format!("namespace {ns}"))
            .unwrap_or_else(|| "the cluster".into())
    );
    let scenario = to_scenario(
        &state,
        &ScenarioOptions {
            name,
            redact_config: args.redact_config,
        },
    );
    let value = scenario_value(&scenario)?;
    let json = args
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let text = if json {
        let mut t = serde_json::to_string_pretty(&value)?;
        t.push('\n');
        t
    } else {
        serde_yaml::to_string(&value)?
    };
    let summary = format!(
        "{} nodes, {} device classes, {} resource slices, {} allocated claims, {} pending pods with {} claims to allocate",
        scenario.nodes.len(),
        scenario.device_classes.len(),
        scenario.resource_slices.len(),
        scenario.allocated.claims.len(),
        scenario.pods.len(),
        scenario.claims.len()
    );
    if args.output.as_os_str() == "-" {
        print!("{text}");
        eprintln!("{summary}");
    } else {
        std::fs::write(&args.output, text)
            .with_context(|| format!("writing {}", args.output.display()))?;
        eprintln!(
            "wrote {}: {summary}; replay with: devicelet allocate -f {} --explain",
            args.output.display(),
            args.output.display()
        );
    }
    Ok(())
}
