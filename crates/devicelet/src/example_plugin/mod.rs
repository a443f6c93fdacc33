//! The built-in example device plugin: a real separate process serving the v1beta1
//! `DevicePlugin` API on `R/device-plugins/<name>.sock` and registering through `kubelet.sock`,
//! the way the kubelet's Go stub (`dm/plugin/v1beta1/stub.go`) and real plugins do:
//! * it re-registers when `kubelet.sock` is re-created (devicelet restart; spec §1.7), starting
//!   a new server because the restart removed its socket;
//! * device health follows the control file `R/device-plugins/<name>.health` (lines
//!   `ID Healthy|Unhealthy`), polled every 200 ms and re-read at once on SIGUSR1;
//! * SIGTERM/SIGINT stop it and remove its socket.

pub mod devices;
pub mod service;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use devicelet_devicemanager::{Device, DevicePluginOptions, Health};
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_server::DevicePluginServer;
use devicelet_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use devicelet_rpc::{RootPaths, transport};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::cli::ExamplePluginArgs;

/// How often the plugin looks for a re-created `kubelet.sock`; tests that restart devicelet
/// hundreds of times shorten it with `DEVICELET_EXAMPLE_PLUGIN_POLL_MS`.
fn poll() -> Duration {
    std::env::var("DEVICELET_EXAMPLE_PLUGIN_POLL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_millis(200), Duration::from_millis)
}
/// How long the first registration keeps retrying while devicelet is not up yet.
const FIRST_REGISTRATION_PATIENCE: Duration = Duration::from_secs(30);

/// Runs the example plugin until SIGTERM/SIGINT.
pub async fn run(root_dir: &Path, args: ExamplePluginArgs) -> anyhow::Result<()> {
    let paths = RootPaths::new(root_dir);
    let socket_name = args
        .socket_name
        .clone()
        .unwrap_or_else(|| format!("{}.sock", args.resource.replace('/', "_")));
    if socket_name.contains('/') {
        bail!("--socket-name {socket_name:?} must be a file name, not a path");
    }
    let stem = socket_name
        .strip_suffix(".sock")
        .unwrap_or(&socket_name)
        .to_owned();
    let socket = paths.device_plugins.join(&socket_name);
    let health_file = paths.device_plugins.join(format!("{stem}.health"));
    let options = DevicePluginOptions {
        pre_start_required: args.pre_start,
        get_preferred_allocation_available: args.preferred_allocation,
    };
    let base = devices::build_devices(
        &args.resource,
        args.devices,
        args.numa_nodes,
        &args.unhealthy,
    );
    // The spec goes where devicelet reads specs unless told otherwise, so that the CDI names
    // `Allocate` returns resolve with `serve --runtime cri` and no extra flag.
    let cdi_dir = args.cdi_dir.clone().unwrap_or_else(|| root_dir.join("cdi"));
    write_cdi_spec(&cdi_dir, &args.resource, &base)?;
    let (devices_tx, devices_rx) = watch::channel(base.clone());
    std::fs::create_dir_all(&paths.device_plugins)
        .with_context(|| format!("create {}", paths.device_plugins.display()))?;

    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let mut usr1 = signal(SignalKind::user_defined1()).context("install SIGUSR1 handler")?;
    let reread = Arc::new(Notify::new());
    let health_task = tokio::spawn(watch_health_file(
        health_file.clone(),
        base,
        devices_tx,
        Arc::clone(&reread),
    ));
    info!(resource = %args.resource, socket = %socket.display(), health_file = %health_file.display(),
        devices = args.devices, "example device plugin starting");

    let register_as = args
        .register_resource
        .clone()
        .unwrap_or_else(|| args.resource.clone());
    let mut first = true;
    let result = loop {
        let (end_tx, end_rx) = watch::channel(false);
        let service = service::ExampleDevicePlugin {
            resource: args.resource.clone(),
            options,
            devices: devices_rx.clone(),
            session_end: end_rx.clone(),
            device_node: args.device_node.as_ref().map(|p| p.display().to_string()),
            mount_dir: args.mount_dir.as_ref().map(|p| p.display().to_string()),
        };
        let server = match start_server(&socket, service, end_rx) {
            Ok(server) => server,
            Err(err) => break Err(err),
        };
        let patience = if first {
            FIRST_REGISTRATION_PATIENCE
        } else {
            Duration::from_secs(120)
        };
        first = false;
        let registered = register(
            &paths.kubelet_socket,
            &socket_name,
            &register_as,
            options,
            patience,
        )
        .await;
        let kubelet_identity = match registered {
            Ok(identity) => identity,
            Err(err) => {
                let _ = end_tx.send(true);
                let _ = server.await;
                // A restarting devicelet removes every socket in the directory, ours too; if
                // it then could not dial us, serve again on a new socket and register again.
                if !socket.exists() {
                    warn!(error = %err, "our socket was removed while registering; restarting the server");
                    continue;
                }
                break Err(err);
            }
        };
        info!(resource = %register_as, "registered with devicelet");

        // Serve until asked to stop or until kubelet.sock is re-created.
        let stop = loop {
            tokio::select! {
                _ = terminate.recv() => break true,
                _ = interrupt.recv() => break true,
                _ = usr1.recv() => {
                    info!(file = %health_file.display(), "SIGUSR1: re-reading health file");
                    reread.notify_one();
                }
                _ = tokio::time::sleep(poll()) => {
                    if socket_identity(&paths.kubelet_socket) != Some(kubelet_identity) || !socket.exists() {
                        break false;
                    }
                }
            }
        };
        let _ = end_tx.send(true);
        let _ = server.await;
        if stop {
            break Ok(());
        }
        info!(
            "kubelet.sock was re-created (or our socket removed); restarting server and re-registering"
        );
        // Wait for the new kubelet.sock (devicelet may be restarting).
        let waited = loop {
            if socket_identity(&paths.kubelet_socket).is_some() {
                break Ok(false);
            }
            tokio::select! {
                _ = terminate.recv() => break Ok(true),
                _ = interrupt.recv() => break Ok(true),
                _ = tokio::time::sleep(poll()) => {}
            }
        };
        match waited {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(err) => break Err(err),
        }
    };
    health_task.abort();
    let _ = std::fs::remove_file(&socket);
    info!("example device plugin stopped");
    result
}

fn start_server(
    socket: &Path,
    service: service::ExampleDevicePlugin,
    mut end: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = transport::bind(socket).context("plugin socket")?;
    Ok(tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(transport::incoming(listener), async move {
                let _ = end.wait_for(|ended| *ended).await;
            })
            .await;
        if let Err(err) = result {
            warn!(error = %err, "plugin server failed");
        }
    }))
}

/// Registers; retries while devicelet is unreachable, fails at once when it refuses.
/// Returns the identity of the `kubelet.sock` registered with.
async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    options: DevicePluginOptions,
    patience: Duration,
) -> anyhow::Result<(u64, u64)> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let identity = socket_identity(kubelet_socket);
        let attempt = async {
            let channel = transport::dial(kubelet_socket, Duration::from_secs(5))
                .await
                .map_err(|e| {
                    (
                        true,
                        format!("cannot reach {}: {e}", kubelet_socket.display()),
                    )
                })?;
            let request = pb::RegisterRequest {
                version: devicelet_proto::constants::deviceplugin::VERSION.to_owned(),
                endpoint: endpoint.to_owned(),
                resource_name: resource.to_owned(),
                options: Some(pb::DevicePluginOptions {
                    pre_start_required: options.pre_start_required,
                    get_preferred_allocation_available: options.get_preferred_allocation_available,
                }),
            };
            match tokio::time::timeout(
                Duration::from_secs(30),
                RegistrationClient::new(channel).register(request),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                // A connection lost mid-call (devicelet killed while answering) carries the
                // transport error as its source; devicelet's own refusals have none.
                Ok(Err(status))
                    if status.code() == tonic::Code::Unavailable
                        || std::error::Error::source(&status).is_some() =>
                {
                    Err((true, format!("devicelet unavailable: {}", status.message())))
                }
                Ok(Err(status)) => {
                    Err((false, format!("registration refused: {}", status.message())))
                }
                Err(_) => Err((true, "Register did not answer within 30s".to_owned())),
            }
        };
        match (attempt.await, identity) {
            (Ok(()), Some(identity)) => return Ok(identity),
            (Ok(()), None) => {}
            (Err((false, message)), _) => bail!("{message}"),
            (Err((true, message)), _) => {
                if tokio::time::Instant::now() >= deadline {
                    bail!("{message}; gave up after {patience:?}");
                }
                warn!(%message, "registration failed; retrying");
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Polls the health control file and publishes the device list when it changes; `reread`
/// (SIGUSR1) skips the wait.
async fn watch_health_file(
    path: PathBuf,
    base: Vec<Device>,
    devices: watch::Sender<Vec<Device>>,
    reread: Arc<Notify>,
) {
    let mut last: Option<String> = None;
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if last.as_deref() != Some(text.as_str()) {
            match devices::parse_health_file(&text) {
                Ok(overrides) => {
                    let next = devices::apply_overrides(&base, &overrides);
                    let unhealthy = next
                        .iter()
                        .filter(|d| d.health == Health::Unhealthy)
                        .count();
                    devices.send_if_modified(|current| {
                        if *current == next {
                            false
                        } else {
                            *current = next;
                            true
                        }
                    });
                    info!(file = %path.display(), unhealthy, "health file applied");
                }
                Err(err) => {
                    warn!(file = %path.display(), error = %err, "ignoring invalid health file")
                }
            }
            last = Some(text);
        }
        tokio::select! {
            _ = tokio::time::sleep(poll()) => {}
            _ = reread.notified() => {}
        }
    }
}

/// The CDI spec of the plugin's devices (kind = the resource name, one device per ID, each
/// adding `EXAMPLE_CDI_<ID>=<ID>`), checked by the CDI library before it is written.
fn write_cdi_spec(dir: &Path, resource: &str, devices: &[Device]) -> anyhow::Result<()> {
    let env_name = |id: &str| {
        let id: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("EXAMPLE_CDI_{id}")
    };
    let cdi_devices: Vec<crate::example_driver::cdi::CdiDevice> = devices
        .iter()
        .map(|d| crate::example_driver::cdi::CdiDevice {
            name: d.id.clone(),
            env: vec![format!("{}={}", env_name(&d.id), d.id)],
            device_nodes: Vec::new(),
        })
        .collect();
    let spec = crate::example_driver::cdi::spec_of(resource, &cdi_devices);
    // Every device entry is made the same way: the library checks a spec of the first few
    // (its validation grows faster than linearly, and a plugin of 100 000 devices must not
    // wait on it).
    let sample =
        crate::example_driver::cdi::spec_of(resource, &cdi_devices[..cdi_devices.len().min(16)]);
    let problems = crate::example_driver::cdi::validate(&sample);
    if !problems.is_empty() {
        anyhow::bail!(
            "CDI spec for {resource} would be invalid: {}",
            problems.join("; ")
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let path = dir.join(format!("{}.json", resource.replace('/', "_")));
    crate::example_driver::write_spec(&path, &spec)
        .with_context(|| format!("write CDI spec {}", path.display()))?;
    info!(path = %path.display(), "CDI spec written");
    Ok(())
}
