//! `devicelet scheduler`: the secondary scheduler of `devicelet_scheduler` in the foreground
//! until SIGTERM/SIGINT (issue 25).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use devicelet_kube::ClusterSource;
use devicelet_kube::serving::{DelegatedAuth, ServingCertificate};
use devicelet_scheduler::config::{self, Profile};
use devicelet_scheduler::leader::LeaseSettings;
use devicelet_scheduler::{SchedulerConfig, SecureServing};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{MetricsAddress, SchedulerArgs};
use crate::commands::snapshot::source;

/// Runs the scheduler.
pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let plain = metrics_address(args.metrics_address);
    if let Some(address) = plain
        && !address.ip().is_loopback()
    {
        anyhow::bail!(
            "--metrics-address {address}: plain HTTP without authentication is served on a loopback address only; use --secure-address for {}",
            address.ip()
        );
    }
    let (mut config, kubeconfig) = match &args.config {
        Some(path) => from_file(path, plain)?,
        None => {
            // kube-scheduler's validation of DynamicResourcesArgs.bindingTimeout.
            if args.binding_timeout < Duration::from_secs(1) {
                anyhow::bail!("--binding-timeout must be at least 1s");
            }
            let mut profile = Profile::named(&args.scheduler_name);
            profile.filter_timeout =
                (args.filter_timeout != Duration::ZERO).then_some(args.filter_timeout);
            let config = SchedulerConfig {
                lease: LeaseSettings::named(&args.scheduler_name),
                profiles: vec![profile],
                leader_elect: args.leader_elect,
                metrics_address: plain,
                binding_timeout: args.binding_timeout,
                ..SchedulerConfig::default()
            };
            (config, None)
        }
    };
    let mut cluster = args.cluster.clone();
    if cluster.kubeconfig.is_none() {
        cluster.kubeconfig = kubeconfig;
    }
    let client = devicelet_kube::connect(&source(&cluster)).await?;
    config.secure = secure_serving(&args, &client).await?;
    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
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

/// `--secure-address` and its TLS and delegated-authentication flags.
async fn secure_serving(
    args: &SchedulerArgs,
    client: &kube::Client,
) -> anyhow::Result<Option<SecureServing>> {
    let Some(address) = metrics_address(args.secure_address) else {
        return Ok(None);
    };
    let certificate = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => ServingCertificate::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => ServingCertificate::self_signed_for(address),
    };
    let connect =
        async |kubeconfig: &Option<PathBuf>, what: &str| -> anyhow::Result<kube::Client> {
            match kubeconfig {
                Some(path) => devicelet_kube::connect(&ClusterSource::Kubeconfig(path.clone()))
                    .await
                    .with_context(|| format!("--{what}-kubeconfig {}", path.display())),
                None => Ok(client.clone()),
            }
        };
    let auth = DelegatedAuth::new(
        connect(&args.authentication_kubeconfig, "authentication").await?,
        connect(&args.authorization_kubeconfig, "authorization").await?,
        args.authorization_always_allow_paths.clone(),
    );
    Ok(Some(SecureServing {
        address,
        certificate,
        auth: Arc::new(auth),
    }))
}

/// `--config FILE`: the scheduler's settings and the kubeconfig it names (`--kubeconfig` wins).
fn from_file(
    path: &Path,
    metrics_address: Option<std::net::SocketAddr>,
) -> anyhow::Result<(SchedulerConfig, Option<PathBuf>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read config {}", path.display()))?;
    let file = config::parse(&text).with_context(|| format!("config {}", path.display()))?;
    let first = file
        .profiles
        .first()
        .context("config has no profile")?
        .clone();
    let le = file.leader_election;
    let lease = LeaseSettings {
        namespace: le.namespace,
        // W130: a secondary scheduler's Lease is its own unless the file names one.
        name: le.name.unwrap_or_else(|| first.scheduler_name.clone()),
        lease_duration: le.lease_duration,
        renew_deadline: le.renew_deadline,
        retry_period: le.retry_period,
    };
    let config = SchedulerConfig {
        binding_timeout: first
            .binding_timeout
            .unwrap_or(SchedulerConfig::default().binding_timeout),
        profiles: file.profiles,
        leader_elect: le.leader_elect,
        lease,
        metrics_address,
        secure: None,
        backoff: (file.pod_initial_backoff, file.pod_max_backoff),
        client_rate: file.client_rate,
        content_type: file.content_type,
    };
    Ok((config, file.kubeconfig))
}

/// `--metrics-address`: `off` (or absent) serves nothing.
fn metrics_address(flag: Option<MetricsAddress>) -> Option<std::net::SocketAddr> {
    match flag {
        Some(MetricsAddress::At(address)) => Some(address),
        Some(MetricsAddress::Off) | None => None,
    }
}
