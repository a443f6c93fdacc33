//! `devicelet serve`: runs the daemon ([`devicelet_rpc::Daemon`]) until SIGTERM/SIGINT, then
//! stops it cleanly (plugin streams cancelled, sockets removed).
//!
//! `--config FILE` is read and must be a YAML/JSON mapping (KubeletConfiguration field names);
//! no field is acted upon yet and the log says so. `--metrics-address` serves capacity and
//! allocatable gauges per resource in the Prometheus text format.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use axum::extract::State;
use axum::routing::get;
use devicelet_devicemanager::DeviceManager;
use devicelet_rpc::{Daemon, DaemonConfig};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::cli::ServeArgs;

/// Runs `serve`.
pub async fn run(root_dir: &Path, args: ServeArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.config {
        check_config(path)?;
    }
    let mut config = DaemonConfig::new(root_dir);
    config.endpoint_grace_period = args.endpoint_grace_period;
    config.options_timeout = args.plugin_options_timeout;
    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;

    let mut daemon = Daemon::start(config)
        .await
        .with_context(|| format!("start devicelet on {}", root_dir.display()))?;
    let metrics = match args.metrics_address {
        Some(address) => Some(start_metrics(address, daemon.manager().clone()).await?),
        None => None,
    };
    info!(root = %root_dir.display(), "devicelet serving");

    let failure = tokio::select! {
        _ = terminate.recv() => { info!("SIGTERM received; stopping"); None }
        _ = interrupt.recv() => { info!("SIGINT received; stopping"); None }
        err = daemon.wait_for_failure() => Some(err),
    };
    if let Some(task) = metrics {
        task.abort();
    }
    let shutdown = daemon.shutdown().await;
    if let Some(err) = failure {
        return Err(err).context("devicelet server failed");
    }
    shutdown.context("stop devicelet")
}

fn check_config(path: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read config {}", path.display()))?;
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parse config {}", path.display()))?;
    let Some(mapping) = value.as_mapping() else {
        anyhow::bail!(
            "config {} is not a mapping of KubeletConfiguration fields",
            path.display()
        );
    };
    let fields: Vec<String> = mapping
        .keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    warn!(config = %path.display(), ?fields,
        "config file read; none of its fields is used yet (topology/CPU manager policies come with admission)");
    Ok(())
}

async fn start_metrics(
    address: SocketAddr,
    manager: DeviceManager,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("bind metrics address {address}"))?;
    let app = axum::Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(manager);
    info!(%address, "metrics listening on /metrics");
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            warn!(error = %err, "metrics server failed");
        }
    }))
}

async fn render_metrics(State(manager): State<DeviceManager>) -> String {
    let report = manager.capacity();
    let mut text = String::new();
    text.push_str(
        "# HELP devicelet_device_plugin_capacity Devices advertised per resource (GetCapacity).\n",
    );
    text.push_str("# TYPE devicelet_device_plugin_capacity gauge\n");
    for (name, value) in &report.capacity {
        text.push_str(&format!(
            "devicelet_device_plugin_capacity{{resource_name=\"{name}\"}} {value}\n"
        ));
    }
    text.push_str("# HELP devicelet_device_plugin_allocatable Healthy devices per resource while the plugin is connected.\n");
    text.push_str("# TYPE devicelet_device_plugin_allocatable gauge\n");
    for (name, value) in &report.allocatable {
        text.push_str(&format!(
            "devicelet_device_plugin_allocatable{{resource_name=\"{name}\"}} {value}\n"
        ));
    }
    text
}
