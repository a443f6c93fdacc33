//! `devicelet serve`: runs the daemon ([`devicelet_rpc::Daemon`]) until SIGTERM/SIGINT, then
//! stops it cleanly (plugin streams cancelled, sockets removed).
//!
//! `--config FILE` is a YAML/JSON KubeletConfiguration (field names as upstream): the Topology
//! Manager and CPU manager settings are used (docs/topology.md), other fields are ignored and
//! listed in the log. `--metrics-address` (default [`DEFAULT_METRICS_ADDRESS`]) serves the
//! node's metrics on `/metrics` (`devicelet_rpc::metrics`; list in docs/observability.md).
//! `--ui-address` (off by default; loopback unless `--ui-allow-remote`) serves the read-only
//! live page of the node's picture (`devicelet_rpc::ui`, docs/picture.md).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use devicelet_devicemanager::DeviceManager;
use devicelet_node::PodAdmitter;
use devicelet_node::{AlignmentConfig, ClaimOrigin};
use devicelet_rpc::ui::UiServer;
use devicelet_rpc::{DEFAULT_METRICS_ADDRESS, Daemon, DaemonConfig, MetricsServer, RootPaths};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::cli::{MetricsAddress, PodApiServerArg, RuntimeArg, ServeArgs};
use crate::cluster::{ClusterNode, ClusterRuntime};
use devicelet_kube::{
    ApiClaimSource, Cluster, ClusterConfig, ClusterMetrics, ClusterSource, Runtime,
};
use std::sync::Arc;

/// Runs `serve`.
pub async fn run(root_dir: &Path, args: ServeArgs) -> anyhow::Result<()> {
    // Refused before anything starts: a page for the whole network is never an accident.
    check_ui_address(args.ui_address, args.ui_allow_remote)?;
    let mut config = DaemonConfig::new(root_dir);
    if let Some(path) = &args.config {
        config.alignment = load_config(path)?;
    }
    config.endpoint_grace_period = args.endpoint_grace_period;
    config.options_timeout = args.plugin_options_timeout;
    if let Some(node) = args.node_name.clone() {
        config.node_name = node;
    }
    config.boot_id_file = args.boot_id_file.clone();
    config.dra_wipe_delay = args.dra_wipe_delay;
    config.runtime = cri_config(root_dir, &config.node_name, &config.metrics, &args);
    config.take_over = args.force;
    if args.max_pods.is_some() && args.capacity.is_some_and(|c| c.pods.is_some()) {
        anyhow::bail!(
            "--max-pods and --capacity pods=N both set the pods the Node accepts: give one"
        );
    }
    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;

    let node_name = config.node_name.clone();
    if args.capacity.is_some() && cluster_source(&args).is_none() {
        warn!("--capacity only changes what a Node advertises in cluster mode; ignored here");
    }
    if args.pod_api_server != PodApiServerArg::Service
        && (cluster_source(&args).is_none() || args.runtime != RuntimeArg::Cri)
    {
        warn!("--pod-api-server only matters in cluster mode with --runtime cri; ignored here");
    }
    // Cluster mode: the client exists before the daemon, whose DRA admission reads the pods'
    // ResourceClaims from the API server instead of the local store.
    let client = match cluster_source(&args) {
        Some(source) => {
            let client = match &args.bootstrap_kubeconfig {
                Some(bootstrap) => {
                    // The bootstrap writes under R/pki: not under a root another process
                    // serves. (With --force, Daemon::start logs the holder it takes over.)
                    if !args.force {
                        devicelet_rpc::check_root(&RootPaths::new(root_dir), false)
                            .await
                            .with_context(|| {
                                format!("start devicelet on {}", root_dir.display())
                            })?;
                    }
                    // The wait for a certificate may be long: a signal ends it.
                    tokio::select! {
                        client = bootstrapped_client(root_dir, &node_name, bootstrap, &args) => {
                            client.context("cluster mode: TLS bootstrap")?
                        }
                        _ = terminate.recv() => {
                            info!("SIGTERM received while waiting for a certificate; stopping");
                            return Ok(());
                        }
                        _ = interrupt.recv() => {
                            info!("SIGINT received while waiting for a certificate; stopping");
                            return Ok(());
                        }
                    }
                }
                None => devicelet_kube::connect(&source)
                    .await
                    .context("cluster mode: connect to the API server")?,
            };
            if let Some(runtime) = config.runtime.as_mut() {
                runtime.pod_api = Some(pod_api(&client, &source, &args).await?);
            }
            config.dra_claims = ClaimOrigin::Api(Arc::new(ApiClaimSource::new(client.clone())));
            config.pods_from_api_server = true;
            config.dra_slices = Some(devicelet_rpc::control::dra::SliceLister(Arc::new(
                devicelet_kube::slices::KubeSlices::new(client.clone(), &node_name),
            )));
            Some(client)
        }
        None => None,
    };
    let mut daemon = Daemon::start(config)
        .await
        .with_context(|| format!("start devicelet on {}", root_dir.display()))?;
    let metrics = start_metrics(args.metrics_address, daemon.manager()).await?;
    let ui = match args.ui_address {
        Some(address) => Some(start_ui(address, daemon.pods().clone()).await?),
        None => None,
    };
    let cluster = client.map(|client| start_cluster(&daemon, client, &node_name, &args));
    info!(root = %root_dir.display(), cluster = cluster.is_some(), "devicelet serving");

    let failure = tokio::select! {
        _ = terminate.recv() => { info!("SIGTERM received; stopping"); None }
        _ = interrupt.recv() => { info!("SIGINT received; stopping"); None }
        err = daemon.wait_for_failure() => Some(err),
    };
    if let Some(cluster) = cluster {
        cluster.stop().await;
    }
    if let Some(task) = metrics {
        task.abort();
    }
    if let Some(task) = ui {
        task.abort();
    }
    let shutdown = daemon.shutdown().await;
    if let Some(err) = failure {
        return Err(err).context("devicelet server failed");
    }
    shutdown.context("stop devicelet")
}

/// The CRI runtime's settings with `--runtime cri`.
fn cri_config(
    root_dir: &Path,
    node_name: &str,
    metrics: &devicelet_metrics::Metrics,
    args: &ServeArgs,
) -> Option<devicelet_runtime::CriConfig> {
    if args.runtime != RuntimeArg::Cri {
        return None;
    }
    let cdi_spec_dirs = devicelet_runtime::spec_dirs(root_dir, &args.cdi_spec_dirs);
    Some(devicelet_runtime::CriConfig {
        endpoint: args.container_runtime_endpoint.clone(),
        root: root_dir.to_path_buf(),
        cdi_spec_dirs,
        runtime_applies_cdi: args.runtime_applies_cdi,
        node_name: node_name.to_owned(),
        host_ip: devicelet_kube::machine::read_machine(args.max_pods).internal_ip,
        metrics: metrics.clone(),
        pod_api: None,
    })
}

/// Cluster mode with `--runtime cri`: the pods' configMaps, secrets, tokens and the API
/// server's address (`--pod-api-server`) come from the API server, under the node identity.
async fn pod_api(
    client: &devicelet_kube::Client,
    source: &ClusterSource,
    args: &ServeArgs,
) -> anyhow::Result<devicelet_runtime::PodApiHandle> {
    use devicelet_kube::pod_objects::{PodApiServer, PodObjects, host_and_port};
    let server = match args.pod_api_server {
        PodApiServerArg::Service => PodApiServer::Service,
        PodApiServerArg::FromKubeconfig => {
            let url = devicelet_kube::client::server_url(source)
                .await
                .context("--pod-api-server from-kubeconfig: read the API server's URL")?;
            let (host, port) = host_and_port(&url).with_context(|| {
                format!("--pod-api-server from-kubeconfig: no host in the API server URL {url}")
            })?;
            info!(host = %host, port, "pods are told the API server is the one this node uses");
            PodApiServer::Fixed { host, port }
        }
    };
    Ok(devicelet_runtime::PodApiHandle(Arc::new(
        crate::cluster::ClusterPodApi {
            objects: PodObjects::new(client.clone()),
            server,
        },
    )))
}

/// The machine the Node reports: this host's, with `--capacity` and `--max-pods` applied.
fn advertised_machine(args: &ServeArgs) -> devicelet_kube::node_status::MachineInfo {
    let capacity = args.capacity.unwrap_or_default();
    let mut machine = devicelet_kube::machine::read_machine(capacity.pods.or(args.max_pods));
    if let Some(cpu) = capacity.cpu {
        machine.cpus = cpu;
    }
    if let Some(memory) = capacity.memory_bytes {
        machine.memory_bytes = memory;
    }
    machine
}

/// A client with the node's own certificate, obtained with `--bootstrap-kubeconfig` when
/// `--kubeconfig` has none that is valid (the kubelet's TLS bootstrap).
async fn bootstrapped_client(
    root_dir: &Path,
    node_name: &str,
    bootstrap: &Path,
    args: &ServeArgs,
) -> anyhow::Result<devicelet_kube::Client> {
    let kubeconfig = args
        .kubeconfig
        .clone()
        .context("--bootstrap-kubeconfig needs --kubeconfig (the file to write)")?;
    // Absolute paths: the kubeconfig written names the certificate, and the store's link
    // points at it, from wherever they are read.
    let absolute = |path: &Path| {
        std::path::absolute(path).with_context(|| format!("resolve {}", path.display()))
    };
    let config = devicelet_kube::bootstrap::BootstrapConfig {
        bootstrap_kubeconfig: absolute(bootstrap)?,
        kubeconfig: absolute(&kubeconfig)?,
        cert_dir: absolute(&root_dir.join("pki"))?,
        node_name: node_name.to_owned(),
        wait: args.bootstrap_timeout,
        rotate: args.rotate_certificates,
        rotate_after: args.certificate_rotate_after,
    };
    Ok(devicelet_kube::bootstrap::connect_bootstrapped(&config).await?)
}

/// Where cluster mode's configuration comes from, if cluster mode is on.
fn cluster_source(args: &ServeArgs) -> Option<ClusterSource> {
    match (&args.kubeconfig, args.cluster) {
        (Some(path), _) => Some(ClusterSource::Kubeconfig(path.clone())),
        (None, true) => Some(ClusterSource::Infer),
        (None, false) => None,
    }
}

/// Starts the cluster front end on the daemon's node.
fn start_cluster(
    daemon: &Daemon,
    client: devicelet_kube::Client,
    node_name: &str,
    args: &ServeArgs,
) -> Cluster {
    let runtime = match daemon.runtime() {
        Some(cri) => Runtime::Cri(Arc::new(ClusterRuntime(Arc::clone(cri)))),
        None => Runtime::Simulated,
    };
    let mut machine = advertised_machine(args);
    machine.container_runtime_version = daemon.runtime().map(|r| r.runtime_version());
    let config = ClusterConfig {
        node_name: node_name.to_owned(),
        runtime,
        machine,
    };
    let metrics = ClusterMetrics::new(daemon.metrics().clone(), node_name);
    let node = Arc::new(ClusterNode::new(daemon.pods().clone()));
    info!(
        node = node_name,
        runtime = %config.runtime.name(),
        "cluster mode: joining the cluster"
    );
    Cluster::start(client, config, node, metrics)
}

/// Reads `--config`: YAML or JSON with KubeletConfiguration field names.
pub fn load_config(path: &Path) -> anyhow::Result<AlignmentConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read config {}", path.display()))?;
    let config = parse_config(&text).with_context(|| format!("config {}", path.display()))?;
    if !config.ignored.is_empty() {
        let fields: Vec<&String> = config.ignored.keys().collect();
        warn!(config = %path.display(), ?fields, "config fields devicelet does not use are ignored");
    }
    Ok(config)
}

/// Parses a KubeletConfiguration text; errors name the field (serde_yaml's path).
pub fn parse_config(text: &str) -> anyhow::Result<AlignmentConfig> {
    let value: serde_yaml::Value = serde_yaml::from_str(text).context("not valid YAML or JSON")?;
    if !value.is_mapping() {
        anyhow::bail!("is not a mapping of KubeletConfiguration fields");
    }
    // A KubeletConfiguration names itself; another kind in the file is a mistake worth an
    // error rather than a silently ignored file.
    if let Some(kind) = value.get("kind").and_then(serde_yaml::Value::as_str)
        && kind != "KubeletConfiguration"
    {
        anyhow::bail!("is a {kind:?}, not a KubeletConfiguration");
    }
    let mut config: AlignmentConfig = serde_yaml::from_str(text)?;
    // The type's own header is read, not ignored: no warning for it.
    config.ignored.remove("apiVersion");
    config.ignored.remove("kind");
    Ok(config)
}

/// Starts `/metrics`. An explicit address that cannot be bound is an error. The default
/// address being taken (another devicelet or a kubelet on this host) moves the endpoint to a
/// free port on the same interface, said in the log, rather than running without metrics.
async fn start_metrics(
    address: Option<MetricsAddress>,
    manager: &DeviceManager,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let (address, explicit) = match address {
        Some(MetricsAddress::Off) => return Ok(None),
        Some(MetricsAddress::At(address)) => (address, true),
        None => (
            DEFAULT_METRICS_ADDRESS
                .parse::<SocketAddr>()
                .context("default metrics address")?,
            false,
        ),
    };
    let server = match MetricsServer::bind(address, manager.clone()).await {
        Ok(server) => server,
        Err(err) if !explicit => {
            let free = SocketAddr::new(address.ip(), 0);
            let server = MetricsServer::bind(free, manager.clone())
                .await
                .context("start metrics endpoint on a free port")?;
            warn!(
                taken = %address,
                error = %err,
                address = %server.local_addr().unwrap_or(free),
                "default metrics port taken (another devicelet or a kubelet?): metrics on a free port; \
                 pass --metrics-address HOST:PORT to choose one"
            );
            server
        }
        Err(err) => {
            return Err(err).with_context(|| {
                format!(
                    "start metrics endpoint: {address} is taken or unusable; pass another \
                     --metrics-address HOST:PORT, or `off`"
                )
            });
        }
    };
    info!(address = %server.local_addr().unwrap_or(address), "metrics listening on /metrics");
    Ok(Some(tokio::spawn(async move {
        if let Err(err) = server.serve().await {
            warn!(error = %err, "metrics server failed");
        }
    })))
}

/// `--ui-address` must be loopback unless `--ui-allow-remote` says otherwise.
fn check_ui_address(address: Option<SocketAddr>, allow_remote: bool) -> anyhow::Result<()> {
    match address {
        Some(address) if !address.ip().is_loopback() && !allow_remote => anyhow::bail!(
            "--ui-address {address} is not a loopback address: the page has no authentication \
             and shows every pod and device of the node; use 127.0.0.1:PORT (or [::1]:PORT), \
             or add --ui-allow-remote to serve it to the network"
        ),
        _ => Ok(()),
    }
}

/// Starts the page. An address that cannot be bound is an error (it was asked for).
async fn start_ui(
    address: SocketAddr,
    pods: Arc<PodAdmitter>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let server = UiServer::bind(address, pods)
        .await
        .with_context(|| format!("start the page: {address} is taken or unusable"))?;
    let bound = server.local_addr().unwrap_or(address);
    if !bound.ip().is_loopback() {
        warn!(address = %bound, "the node's page is served beyond loopback (--ui-allow-remote)");
    }
    info!(url = %format!("http://{bound}/"), "node page listening");
    Ok(tokio::spawn(async move {
        if let Err(err) = server.serve().await {
            warn!(error = %err, "node page server failed");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_page_needs_the_explicit_flag() {
        let remote: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let err = check_ui_address(Some(remote), false).unwrap_err();
        assert!(err.to_string().contains("--ui-allow-remote"), "{err}");
        assert!(check_ui_address(Some(remote), true).is_ok());
        assert!(check_ui_address(Some("127.0.0.1:0".parse().unwrap()), false).is_ok());
        assert!(check_ui_address(Some("[::1]:0".parse().unwrap()), false).is_ok());
        assert!(check_ui_address(None, false).is_ok());
    }

    #[test]
    fn a_kubelet_configuration_header_is_not_reported_as_ignored() {
        let config = parse_config(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cpuManagerPolicy: static\nsyncFrequency: 1m\n",
        )
        .unwrap();
        assert_eq!(config.ignored.keys().collect::<Vec<_>>(), ["syncFrequency"]);
        let err = parse_config("apiVersion: v1\nkind: Pod\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("is a \"Pod\", not a KubeletConfiguration"),
            "{err}"
        );
    }
}
