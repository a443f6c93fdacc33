//! Wiring of the node agent's servers for one root directory (the `devicelet serve` body):
//! directories, stale-socket cleanup, the Registration server on `kubelet.sock`, the plugin
//! watcher, the PodResources API on `pod-resources/kubelet.sock`, and the control API; and a clean stop (streams cancelled, sockets removed).
//!
//! Start order follows the kubelet (`dm/plugin/v1beta1/server.go` `Start`): clean the
//! device-plugin directory, then bind `kubelet.sock`; the control socket is bound last so "the
//! control socket answers" means "plugins can register" (ecosystem.md A3 row 25).

use std::collections::HashSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use devicelet_devicemanager::{
    Clock, DEFAULT_DIAL_TIMEOUT, DEFAULT_ENDPOINT_GRACE_PERIOD, DEFAULT_OPTIONS_TIMEOUT,
    DeviceManager, DeviceManagerConfig, SystemClock,
};
use devicelet_dra::{DraPluginRegistry, ProcBootId};
use devicelet_proto::constants;
use devicelet_runtime::CriRuntime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::cleanup::remove_stale_sockets;
use crate::control::{self, ControlState};
use crate::dra_client::GrpcDraDialer;
use crate::dra_handler::DraHandler;
use crate::error::RpcError;
use crate::plugin_client::TonicPluginDialer;
use crate::plugin_watcher::{DevicePluginHandler, PluginWatcher};
use crate::podresources::PodResourcesService;
use crate::registration::RegistrationService;
use crate::transport;
use devicelet_node::alignment::{Alignment, AlignmentConfig};
use devicelet_node::dra::{ClaimOrigin, DraNode, UNPREPARE_RETRY_PERIOD};
use devicelet_node::durable::DurableState;
use devicelet_node::pods::PodAdmitter;

/// Every path devicelet uses under its root directory (DESIGN.md "Files on disk").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPaths {
    /// `R`.
    pub root: PathBuf,
    /// `R/device-plugins`.
    pub device_plugins: PathBuf,
    /// `R/device-plugins/kubelet.sock`.
    pub kubelet_socket: PathBuf,
    /// `R/plugins_registry`.
    pub plugins_registry: PathBuf,
    /// `R/devicelet`.
    pub control_dir: PathBuf,
    /// `R/devicelet/devicelet.sock`.
    pub control_socket: PathBuf,
    /// `R/pod-resources`.
    pub pod_resources_dir: PathBuf,
    /// `R/pod-resources/kubelet.sock`: the PodResources API.
    pub pod_resources_socket: PathBuf,
}

impl RootPaths {
    /// Paths under `root`. Unlike the kubelet, the device-plugin directory follows the root
    /// (so tests and several instances can run side by side); the default root
    /// `/var/lib/kubelet` gives the kubelet's paths.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let device_plugins = root.join("device-plugins");
        let control_dir = root.join("devicelet");
        RootPaths {
            kubelet_socket: device_plugins.join(constants::deviceplugin::KUBELET_SOCKET_NAME),
            plugins_registry: root.join(constants::pluginregistration::PLUGINS_REGISTRY_DIR_NAME),
            control_socket: control_dir.join("devicelet.sock"),
            pod_resources_dir: root.join(constants::podresources::POD_RESOURCES_DIR_NAME),
            pod_resources_socket: constants::pod_resources_socket(&root),
            device_plugins,
            control_dir,
            root,
        }
    }
}

/// Settings of the daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Root directory `R`.
    pub root_dir: PathBuf,
    /// How long a disconnected plugin's resource is kept (kubelet: 5 min).
    pub endpoint_grace_period: Duration,
    /// Deadline for `GetDevicePluginOptions` during `Register`.
    pub options_timeout: Duration,
    /// Deadline for dialing a plugin.
    pub dial_timeout: Duration,
    /// Run the plugin watcher on `R/plugins_registry`.
    pub plugin_watcher: bool,
    /// The node's metrics registry every manager records into.
    pub metrics: devicelet_metrics::Metrics,
    /// Topology Manager and CPU manager settings (`serve --config`).
    pub alignment: AlignmentConfig,
    /// Node name DRA ResourceSlices are matched against (default: the host name).
    pub node_name: String,
    /// File with the boot ID (a changed ID = reboot: DRA claims are prepared again).
    pub boot_id_file: PathBuf,
    /// How long published ResourceSlices survive their driver (kubelet: 30 s).
    pub dra_wipe_delay: Duration,
    /// Where DRA claims come from: the local store (default) or, in cluster mode, the API
    /// server.
    pub dra_claims: ClaimOrigin,
    /// Run admitted pods in a CRI runtime (`serve --runtime cri`); `None`: nothing runs them
    /// (the simulated runtime).
    pub runtime: Option<devicelet_runtime::CriConfig>,
    /// Bind the root's sockets even when a live process serves them (`serve --force`).
    pub take_over: bool,
    /// Cluster mode: pods come from the API server; the control API refuses local pod
    /// changes.
    pub pods_from_api_server: bool,
    /// Cluster mode: where `GET /v1/resourceslices` lists what the drivers published for the
    /// node (the API server); `None`: the slices published to the node itself.
    pub dra_slices: Option<crate::control::dra::SliceLister>,
}

impl DaemonConfig {
    /// Kubelet defaults for `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        DaemonConfig {
            root_dir: root_dir.into(),
            endpoint_grace_period: DEFAULT_ENDPOINT_GRACE_PERIOD,
            options_timeout: DEFAULT_OPTIONS_TIMEOUT,
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            plugin_watcher: true,
            metrics: devicelet_metrics::Metrics::new(),
            alignment: AlignmentConfig::default(),
            node_name: host_name(),
            boot_id_file: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            dra_wipe_delay: devicelet_node::dra::DEFAULT_WIPE_DELAY,
            dra_claims: ClaimOrigin::Local,
            runtime: None,
            take_over: false,
            pods_from_api_server: false,
            dra_slices: None,
        }
    }
}

/// Refuses a root another live process is serving (a second devicelet, or a kubelet on
/// /var/lib/kubelet): binding would take its plugins away. With `take_over` (`serve --force`)
/// the holder is only logged. Front ends that write under the root before the daemon starts
/// (the TLS bootstrap's `R/pki`) call this first.
pub async fn check_root(paths: &RootPaths, take_over: bool) -> Result<(), RpcError> {
    let sockets = [
        paths.control_socket.as_path(),
        paths.kubelet_socket.as_path(),
        paths.pod_resources_socket.as_path(),
    ];
    if let Some(holder) = crate::root_guard::live_holder(&sockets).await {
        if !take_over {
            return Err(RpcError::RootInUse {
                root: paths.root.clone(),
                devicelet: holder.socket == paths.control_socket,
                holder,
            });
        }
        warn!(%holder, "--force: taking over the sockets of a live process");
    }
    Ok(())
}

/// The host name (lower case), as the kubelet's default node name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// A running daemon. Call [`Daemon::shutdown`] to stop it cleanly.
pub struct Daemon {
    paths: RootPaths,
    manager: DeviceManager,
    pods: Arc<PodAdmitter>,
    runtime: Option<Arc<CriRuntime>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<Result<(), RpcError>>)>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RpcError + 'a {
    move |source| RpcError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn make_dir(path: &Path, mode: u32) -> Result<(), RpcError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_err("create directory", path))
}

/// How often the root directory's identity is checked.
const ROOT_WATCH_PERIOD: Duration = Duration::from_secs(1);

/// Fails when the root directory is removed or replaced while the daemon runs. Without it the
/// daemon ran on unreachable (its sockets were gone: "devicelet is not running"), wrote its
/// journal into a deleted file and retried compaction forever; stopping with a clear error
/// lets the supervisor start it again on a fresh root.
async fn watch_root(root: PathBuf, mut shutdown: watch::Receiver<bool>) -> Result<(), RpcError> {
    use std::os::unix::fs::MetadataExt;
    let identity = |m: &std::fs::Metadata| (m.dev(), m.ino());
    let start = std::fs::metadata(&root)
        .map(|m| identity(&m))
        .map_err(io_err("stat", &root))?;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ROOT_WATCH_PERIOD) => {}
            _ = shutdown.changed() => return Ok(()),
        }
        let what = match std::fs::metadata(&root) {
            Ok(m) if identity(&m) == start => continue,
            Ok(_) => "replaced by another directory",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "removed",
            Err(e) => {
                warn!(root = %root.display(), error = %e, "cannot check the root directory");
                continue;
            }
        };
        let err = RpcError::RootGone { path: root, what };
        tracing::error!("{err}");
        return Err(err);
    }
}

impl Daemon {
    /// Prepares the root directory and starts every server; returns once all sockets are bound.
    pub async fn start(config: DaemonConfig) -> Result<Daemon, RpcError> {
        Self::start_with_clock(config, Arc::new(SystemClock)).await
    }

    /// Like [`Daemon::start`] with an explicit clock.
    pub async fn start_with_clock(
        config: DaemonConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Daemon, RpcError> {
        let paths = RootPaths::new(&config.root_dir);
        make_dir(&paths.root, 0o755)?;
        make_dir(&paths.device_plugins, 0o750)?;
        make_dir(&paths.control_dir, 0o750)?;

        check_root(&paths, config.take_over).await?;

        // Resource managers first: a bad configuration or CPU state stops startup, as in the
        // kubelet, before any socket is bound.
        let alignment = Arc::new(Alignment::new(&config.alignment, &paths.root)?);

        let removed = remove_stale_sockets(&paths.device_plugins)?;
        if !removed.is_empty() {
            info!(
                count = removed.len(),
                "removed stale sockets; running plugins will re-register"
            );
        }

        let manager_config = DeviceManagerConfig {
            plugin_dir: paths.device_plugins.clone(),
            endpoint_grace_period: config.endpoint_grace_period,
            dial_timeout: config.dial_timeout,
            options_timeout: config.options_timeout,
            allocate_timeout: devicelet_devicemanager::DEFAULT_ALLOCATE_TIMEOUT,
        };
        let manager = DeviceManager::with_metrics(
            manager_config,
            Arc::new(TonicPluginDialer::new(config.dial_timeout)),
            clock,
            config.metrics.clone(),
        );
        // Durable state before any server takes requests (spec §3.4: read the checkpoint in
        // Start, before the registration server; plugins re-register into restored resources).
        let (durable, restored) = DurableState::open_and_restore(
            devicelet_node::durable::store_paths(&paths.device_plugins, &paths.control_dir),
            &manager,
            Arc::new(crate::convert::ProtoAllocResp),
        );
        let durable = Arc::new(durable);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // Registration server on kubelet.sock.
        let listener = transport::bind(&paths.kubelet_socket)?;
        let registration = RegistrationService::new(manager.clone()).into_server();
        let mut rx = shutdown_rx.clone();
        let socket = paths.kubelet_socket.clone();
        tasks.push((
            "registration",
            tokio::spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(registration)
                    .serve_with_incoming_shutdown(transport::incoming(listener), async move {
                        let _ = rx.changed().await;
                    })
                    .await
                    .map_err(|e| RpcError::Server {
                        path: socket,
                        message: e.to_string(),
                    })
            }),
        ));
        info!(socket = %paths.kubelet_socket.display(), "device plugin registration server listening");

        // DRA: claim cache (restart recovery from R/dra_manager_state), local objects, drivers.
        make_dir(&paths.root.join("plugins"), 0o750)?;
        let dra = DraNode::open(
            &paths.root,
            &config.node_name,
            DraPluginRegistry::new(Arc::new(GrpcDraDialer)),
            &ProcBootId::at(&config.boot_id_file),
            config.dra_wipe_delay,
            config.dra_claims.clone(),
        )
        .map_err(|e| RpcError::Server {
            path: paths.root.clone(),
            message: format!("DRA state: {e}"),
        })?;
        dra.cache().set_metrics(config.metrics.clone());
        // Cluster mode: the NUMA attribute of claim devices is read from the slices the API
        // server holds for the node too (the Topology Manager's DRA hints).
        if let Some(slices) = &config.dra_slices {
            dra.set_slice_source(Arc::clone(&slices.0));
        }
        let (dra_run, rx) = (Arc::clone(&dra), shutdown_rx.clone());
        tasks.push((
            "dra",
            tokio::spawn(async move {
                dra_run.run(UNPREPARE_RETRY_PERIOD, rx).await;
                Ok(())
            }),
        ));

        if config.plugin_watcher {
            make_dir(&paths.plugins_registry, 0o750)?;
            let mut watcher = PluginWatcher::new(&paths.plugins_registry);
            watcher.add_handler(
                constants::pluginregistration::DEVICE_PLUGIN,
                Arc::new(DevicePluginHandler::new(manager.clone())),
            );
            watcher.add_handler(
                constants::pluginregistration::DRA_PLUGIN,
                Arc::new(DraHandler::new(Arc::clone(&dra))),
            );
            tasks.push((
                "plugin-watcher",
                tokio::spawn(watcher.run(shutdown_rx.clone())),
            ));
        }

        tasks.push((
            "registered-resources-sync",
            tokio::spawn({
                let durable = durable.clone();
                let manager = manager.clone();
                let rx = shutdown_rx.clone();
                async move {
                    durable.sync_registered(manager, rx).await;
                    Ok(())
                }
            }),
        ));
        let pods = Arc::new(
            PodAdmitter::with_alignment(manager.clone(), alignment)
                .with_durable(durable, restored)
                .with_dra(dra),
        );

        // PodResources API (spec §5.1: directory 0750, both API versions on one server).
        make_dir(&paths.pod_resources_dir, 0o750)?;
        let listener = transport::bind_atomic(&paths.pod_resources_socket)?;
        let pod_resources = PodResourcesService::new(pods.clone());
        let mut rx = shutdown_rx.clone();
        tasks.push((
            "pod-resources",
            pod_resources.serve_isolated(
                listener,
                paths.pod_resources_socket.clone(),
                async move {
                    let _ = rx.changed().await;
                },
            )?,
        ));
        info!(socket = %paths.pod_resources_socket.display(), "PodResources API listening");

        tasks.push((
            "root-watch",
            tokio::spawn(watch_root(paths.root.clone(), shutdown_rx.clone())),
        ));

        // The container runtime before the control API, so every admitted pod is run. Pods the
        // runtime has that the node no longer admits (removed while devicelet was down) go.
        let runtime = match config.runtime.clone() {
            Some(cri) => {
                let settings: Arc<dyn devicelet_runtime::ContainerSettings> = pods.clone();
                let runtime = CriRuntime::connect(cri, settings).await?;
                let admitted: HashSet<String> =
                    pods.list().pods.into_iter().map(|p| p.pod.uid).collect();
                // A gone pod whose containers will not stop is logged and left for the next
                // `sync-pods`; it must not keep the node from starting.
                if let Err(e) = runtime
                    .retain(&admitted, devicelet_runtime::manager::ORPHAN_GRACE)
                    .await
                {
                    warn!(error = %e, "containers of pods removed while devicelet was down could not all be removed");
                }
                tasks.push((
                    "runtime",
                    tokio::spawn({
                        let runtime = Arc::clone(&runtime);
                        let rx = shutdown_rx.clone();
                        async move {
                            runtime.run(rx).await;
                            Ok(())
                        }
                    }),
                ));
                Some(runtime)
            }
            None => None,
        };

        // Control API last: when it answers, everything else is ready.
        // A stale control socket (crashed daemon) is replaced; nobody answered on it above.
        let control_listener = transport::bind(&paths.control_socket)?;
        let app = control::router(ControlState {
            devices: manager.clone(),
            pods: pods.clone(),
            runtime: runtime.clone(),
            pods_from_api_server: config.pods_from_api_server,
            cluster_slices: config.dra_slices.clone(),
        });
        let mut rx = shutdown_rx.clone();
        let socket = paths.control_socket.clone();
        tasks.push((
            "control",
            tokio::spawn(async move {
                axum::serve(control_listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = rx.changed().await;
                    })
                    .await
                    .map_err(io_err("serve control API on", &socket))
            }),
        ));
        info!(socket = %paths.control_socket.display(), "control API listening");

        Ok(Daemon {
            paths,
            manager,
            pods,
            runtime,
            shutdown,
            tasks,
        })
    }

    /// The device manager.
    pub fn manager(&self) -> &DeviceManager {
        &self.manager
    }

    /// The pod admitter behind the control API and the PodResources API.
    pub fn pods(&self) -> &Arc<PodAdmitter> {
        &self.pods
    }

    /// The CRI runtime running the admitted pods, when `runtime` was configured.
    pub fn runtime(&self) -> Option<&Arc<CriRuntime>> {
        self.runtime.as_ref()
    }

    /// The node's metrics registry.
    pub fn metrics(&self) -> &devicelet_metrics::Metrics {
        self.manager.metrics()
    }

    /// The daemon's paths.
    pub fn paths(&self) -> &RootPaths {
        &self.paths
    }

    /// Waits until a server task ends on its own (an error), for `serve` to report.
    pub async fn wait_for_failure(&mut self) -> RpcError {
        loop {
            if self.tasks.is_empty() {
                return RpcError::Server {
                    path: self.paths.root.clone(),
                    message: "no server running".to_owned(),
                };
            }
            let (result, index, _) =
                futures::future::select_all(self.tasks.iter_mut().map(|(_, handle)| handle)).await;
            let (name, _) = self.tasks.remove(index);
            match result {
                Ok(Err(err)) => return err,
                Ok(Ok(())) => warn!(task = name, "server task ended"),
                Err(join) => {
                    return RpcError::Server {
                        path: self.paths.root.clone(),
                        message: format!("{name} task failed: {join}"),
                    };
                }
            }
        }
    }

    /// Stops everything: plugin streams are cancelled, servers stop, sockets are removed.
    pub async fn shutdown(self) -> Result<(), RpcError> {
        // Signal the tasks first: the registered-resources sync must not record the empty
        // device lists that stopping the plugin endpoints leaves behind.
        let _ = self.shutdown.send(true);
        self.manager.stop();
        let mut first_error = None;
        for (name, handle) in self.tasks {
            match tokio::time::timeout(Duration::from_secs(5), handle).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => {
                    warn!(task = name, error = %err, "server ended with an error during shutdown");
                    first_error.get_or_insert(err);
                }
                Ok(Err(join)) => warn!(task = name, error = %join, "server task failed"),
                Err(_) => warn!(task = name, "server did not stop within 5s"),
            }
        }
        for socket in [
            &self.paths.kubelet_socket,
            &self.paths.pod_resources_socket,
            &self.paths.control_socket,
        ] {
            match std::fs::remove_file(socket) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(socket = %socket.display(), error = %e, "cannot remove socket"),
            }
        }
        self.pods.durable().shutdown();
        info!("devicelet stopped");
        first_error.map_or(Ok(()), Err)
    }
}
