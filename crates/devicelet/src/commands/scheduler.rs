//! `devicelet scheduler`: the secondary scheduler of `devicelet_scheduler` in the foreground
//! until SIGTERM/SIGINT (issue 25).

use std::time::Duration;

use anyhow::Context;
use devicelet_scheduler::SchedulerConfig;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::SchedulerArgs;
use crate::commands::snapshot::source;

/// Runs the scheduler.
pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    // kube-scheduler's validation of DynamicResourcesArgs.bindingTimeout.
    if args.binding_timeout < Duration::from_secs(1) {
        anyhow::bail!("--binding-timeout must be at least 1s");
    }
    let client = devicelet_kube::connect(&source(&args.cluster)).await?;
    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let config = SchedulerConfig {
        name: args.scheduler_name,
        leader_elect: args.leader_elect,
        metrics_address: args.metrics_address,
        filter_timeout: (args.filter_timeout != Duration::ZERO).then_some(args.filter_timeout),
        binding_timeout: args.binding_timeout,
    };
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    devicelet_scheduler::run(client, config, shutdown)
        .await
        .context("devicelet scheduler")
}
