//! The plugin watcher on `R/plugins_registry` (`pkg/kubelet/pluginmanager`, spec
//! devicemanager.md §1.8). Registration sockets are found by inotify (`notify`) and by listing
//! the directory after the watch is installed and then every second (events are hints; the
//! listing is the truth, so sockets present at startup and missed events are handled). For
//! each new socket: dial, `GetInfo` (1 s), pick the handler by `PluginInfo.type`, validate,
//! register, `NotifyRegistrationStatus` (5 s). Failures are reported to the plugin and retried
//! with exponential backoff (0.5 s doubling up to 2 min 2 s). A removed or re-created socket
//! deregisters the plugin.
//!
//! Hostile or broken directories cost bounded work: one attempt at a time per path (a socket
//! re-created while its attempt runs waits for it), at most [`MAX_ATTEMPTS_IN_FLIGHT`] attempts
//! at all, at most one listing per [`MIN_LISTING_INTERVAL`] however many events arrive, and
//! one log line per non-socket entry or unreadable directory (not one per listing).
//!
//! Handlers are pluggable per type: [`DevicePluginHandler`] serves `"DevicePlugin"`; a DRA
//! handler registers under `"DRAPlugin"` the same way.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use devicelet_devicemanager::{
    DeviceManager, EndpointId, RegistrationError, RegistrationSource, validation,
};
use devicelet_dra::DraError;
use devicelet_proto::constants;
use devicelet_proto::pluginregistration::v1 as pb;
use devicelet_proto::pluginregistration::v1::registration_client::RegistrationClient;
use devicelet_transport::unix::file_kind;
use futures::FutureExt;
use futures::future::BoxFuture;
use notify::Watcher;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::error::RpcError;
use crate::transport;

const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const RECONCILE_PERIOD: Duration = Duration::from_secs(1);
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(122);
/// Registration attempts running at once. A plugin needs one for a few milliseconds; the bound
/// keeps a directory full of sockets that never answer (each attempt may wait for its
/// deadlines) from holding an unbounded number of tasks and connections.
pub const MAX_ATTEMPTS_IN_FLIGHT: usize = 64;
/// Shortest time between two listings of the directory: a storm of inotify events (sockets
/// created and removed a thousand times a second) costs at most 50 listings a second, and a
/// new socket waits at most this long.
pub const MIN_LISTING_INTERVAL: Duration = Duration::from_millis(20);

/// Why a handler refused a plugin. Its text is sent to the plugin in
/// `NotifyRegistrationStatus`, so the device plugin texts are the kubelet's.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The device plugin supports none of the API versions we serve.
    #[error("manager version, {ours}, is not among plugin supported versions {theirs:?}")]
    UnsupportedVersion {
        /// Our device plugin API version.
        ours: &'static str,
        /// The versions the plugin listed.
        theirs: Vec<String>,
    },
    /// The device plugin's name is not an extended resource name.
    #[error("invalid name of device plugin socket: {0}")]
    InvalidName(RegistrationError),
    /// The Device Manager refused the registration.
    #[error(transparent)]
    DevicePlugin(RegistrationError),
    /// The DRA driver registry refused the registration.
    #[error(transparent)]
    Dra(#[from] DraError),
}

/// What a plugin type's handler does (`PluginHandler` in `pluginmanager/cache/types.go`).
pub trait PluginHandler: Send + Sync + 'static {
    /// `ValidatePlugin`: the error text is sent to the plugin.
    fn validate(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), HandlerError>;
    /// `RegisterPlugin`.
    fn register(
        &self,
        name: String,
        endpoint: PathBuf,
        versions: Vec<String>,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
    /// `DeRegisterPlugin`: the registration of `name` made from `endpoint` is gone.
    fn deregister(&self, name: &str, endpoint: &Path);
}

/// Handler for `"DevicePlugin"` registrations (`dm/plugin/v1beta1/handler.go`).
#[derive(Debug, Clone)]
pub struct DevicePluginHandler {
    manager: DeviceManager,
    registered: Arc<Mutex<HashMap<(String, PathBuf), EndpointId>>>,
}

impl DevicePluginHandler {
    /// A handler registering into `manager`.
    pub fn new(manager: DeviceManager) -> Self {
        DevicePluginHandler {
            manager,
            registered: Arc::default(),
        }
    }
}

impl PluginHandler for DevicePluginHandler {
    fn validate(
        &self,
        name: &str,
        _endpoint: &Path,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        if !versions
            .iter()
            .any(|v| v == constants::deviceplugin::VERSION)
        {
            return Err(HandlerError::UnsupportedVersion {
                ours: constants::deviceplugin::VERSION,
                theirs: versions.to_vec(),
            });
        }
        validation::validate_resource_name(name).map_err(HandlerError::InvalidName)
    }

    fn register(
        &self,
        name: String,
        endpoint: PathBuf,
        _versions: Vec<String>,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        let manager = self.manager.clone();
        let registered = Arc::clone(&self.registered);
        async move {
            let id = manager
                .connect_plugin(&name, endpoint.clone(), RegistrationSource::PluginWatcher)
                .await
                .map_err(HandlerError::DevicePlugin)?;
            registered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((name, endpoint), id);
            Ok(())
        }
        .boxed()
    }

    fn deregister(&self, name: &str, endpoint: &Path) {
        let id = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(name.to_owned(), endpoint.to_path_buf()));
        if let Some(id) = id {
            // Only this registration's endpoint is stopped; a newer one for the same resource
            // (from kubelet.sock or another socket) is left alone.
            self.manager.endpoint_disconnected(
                name,
                id,
                "plugin-watcher registration socket removed",
            );
        }
    }
}

/// Identity of a socket file: a re-created socket at the same path is a new plugin instance.
type SocketIdentity = (u64, u64);

struct Registered {
    identity: SocketIdentity,
    plugin_type: String,
    name: String,
    endpoint: PathBuf,
}

struct Retry {
    identity: SocketIdentity,
    next_attempt: Instant,
    backoff: Duration,
}

enum AttemptResult {
    Registered(Registered),
    Failed {
        identity: SocketIdentity,
        error: String,
    },
}

/// Watches the plugin registry directory and dispatches registrations to handlers.
pub struct PluginWatcher {
    dir: PathBuf,
    handlers: HashMap<String, Arc<dyn PluginHandler>>,
}

impl std::fmt::Debug for PluginWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginWatcher")
            .field("dir", &self.dir)
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PluginWatcher {
    /// A watcher for `dir` without handlers.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PluginWatcher {
            dir: dir.into(),
            handlers: HashMap::new(),
        }
    }

    /// Registers the handler for a plugin type (`"DevicePlugin"`, `"DRAPlugin"`, ...).
    pub fn add_handler(&mut self, plugin_type: impl Into<String>, handler: Arc<dyn PluginHandler>) {
        self.handlers.insert(plugin_type.into(), handler);
    }

    /// Runs until `shutdown` turns true. Fails only if the directory cannot be watched.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), RpcError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| RpcError::Io {
            action: "create plugin registry directory",
            path: self.dir.clone(),
            source,
        })?;
        let (event_tx, mut event_rx) = mpsc::unbounded_channel::<()>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Access events (open, close-without-write) are ignored: listing the directory
                // below opens it, and waking on that made every idle daemon list it in a loop
                // (~40 times a second, ~8% of a core each).
                if let Ok(event) = event
                    && !matches!(event.kind, notify::EventKind::Access(_))
                {
                    let _ = event_tx.send(());
                }
            })
            .map_err(|e| RpcError::Watch {
                path: self.dir.clone(),
                message: e.to_string(),
            })?;
        watcher
            .watch(&self.dir, notify::RecursiveMode::Recursive)
            .map_err(|e| RpcError::Watch {
                path: self.dir.clone(),
                message: e.to_string(),
            })?;
        info!(dir = %self.dir.display(), "plugin watcher started");

        let handlers = Arc::new(self.handlers);
        let (result_tx, mut result_rx) = mpsc::unbounded_channel::<(PathBuf, AttemptResult)>();
        let mut registered: HashMap<PathBuf, Registered> = HashMap::new();
        let mut retries: HashMap<PathBuf, Retry> = HashMap::new();
        let mut in_flight: HashMap<PathBuf, SocketIdentity> = HashMap::new();
        let mut reported = Reported::default();
        let mut ticker = tokio::time::interval(RECONCILE_PERIOD);
        let mut last_listing: Option<Instant> = None;
        loop {
            if let Some(wait) =
                last_listing.map(|at| MIN_LISTING_INTERVAL.saturating_sub(at.elapsed()))
                && !wait.is_zero()
            {
                tokio::time::sleep(wait).await;
            }
            last_listing = Some(Instant::now());
            // Listing after the watch is installed: nothing created in between is missed.
            let listing = list_entries(&self.dir);
            reported.log_new(&listing);
            reconcile(
                &listing,
                &handlers,
                &mut registered,
                &mut retries,
                &mut in_flight,
                &result_tx,
            );
            tokio::select! {
                _ = shutdown.changed() => break,
                Some(()) = event_rx.recv() => {
                    while event_rx.try_recv().is_ok() {}
                }
                Some((path, result)) = result_rx.recv() => {
                    // Every result that is there, not one per listing: a listing may wait
                    // MIN_LISTING_INTERVAL, and up to MAX_ATTEMPTS_IN_FLIGHT results queue.
                    let mut next = Some((path, result));
                    while let Some((path, result)) = next {
                        record_result(path, result, &mut in_flight, &mut registered, &mut retries);
                        next = result_rx.try_recv().ok();
                    }
                }
                _ = ticker.tick() => {}
            }
        }
        for (path, entry) in registered.drain() {
            if let Some(handler) = handlers.get(&entry.plugin_type) {
                debug!(socket = %path.display(), "plugin watcher stopping: deregistering");
                handler.deregister(&entry.name, &entry.endpoint);
            }
        }
        drop(watcher);
        Ok(())
    }
}

/// Books the end of a registration attempt: registered, or a retry with back-off.
fn record_result(
    path: PathBuf,
    result: AttemptResult,
    in_flight: &mut HashMap<PathBuf, SocketIdentity>,
    registered: &mut HashMap<PathBuf, Registered>,
    retries: &mut HashMap<PathBuf, Retry>,
) {
    let Some(identity) = in_flight.remove(&path) else {
        return;
    };
    match result {
        AttemptResult::Registered(entry) => {
            retries.remove(&path);
            registered.insert(path, entry);
        }
        AttemptResult::Failed {
            identity: failed,
            error,
        } => {
            let backoff = retries
                .get(&path)
                .filter(|r| r.identity == identity)
                .map_or(INITIAL_BACKOFF, |r| (r.backoff * 2).min(MAX_BACKOFF));
            warn!(socket = %path.display(), %error, retry_in = ?backoff,
                "plugin registration failed");
            retries.insert(
                path,
                Retry {
                    identity: failed,
                    next_attempt: Instant::now() + backoff,
                    backoff,
                },
            );
        }
    }
}

fn reconcile(
    listing: &Listing,
    handlers: &Arc<HashMap<String, Arc<dyn PluginHandler>>>,
    registered: &mut HashMap<PathBuf, Registered>,
    retries: &mut HashMap<PathBuf, Retry>,
    in_flight: &mut HashMap<PathBuf, SocketIdentity>,
    result_tx: &mpsc::UnboundedSender<(PathBuf, AttemptResult)>,
) {
    let desired = &listing.sockets;
    // Removed, re-created or replaced sockets: deregister.
    let gone: Vec<PathBuf> = registered
        .iter()
        .filter(|(path, entry)| desired.get(*path) != Some(&entry.identity))
        .map(|(path, _)| path.clone())
        .collect();
    for path in gone {
        if let Some(entry) = registered.remove(&path) {
            let what = match (desired.contains_key(&path), listing.other.get(&path)) {
                (true, _) => "re-created".to_owned(),
                (false, Some((file_type, _))) => format!("replaced by {}", file_kind(file_type)),
                (false, None) => "removed".to_owned(),
            };
            info!(socket = %path.display(), plugin = %entry.name, "registration socket {what}; deregistering plugin");
            if let Some(handler) = handlers.get(&entry.plugin_type) {
                handler.deregister(&entry.name, &entry.endpoint);
            }
        }
    }
    retries.retain(|path, retry| desired.get(path) == Some(&retry.identity));

    let now = Instant::now();
    for (path, identity) in desired {
        // One attempt per path at a time: a socket re-created during an attempt is tried once
        // that attempt reports (its result then no longer matches and is deregistered).
        if registered.contains_key(path) || in_flight.contains_key(path) {
            continue;
        }
        if in_flight.len() >= MAX_ATTEMPTS_IN_FLIGHT {
            debug!(
                waiting = %path.display(),
                "{MAX_ATTEMPTS_IN_FLIGHT} plugin registrations in flight; the rest wait"
            );
            break;
        }
        if let Some(retry) = retries.get(path)
            && retry.identity == *identity
            && now < retry.next_attempt
        {
            continue;
        }
        in_flight.insert(path.clone(), *identity);
        let path = path.clone();
        let identity = *identity;
        let handlers = Arc::clone(handlers);
        let result_tx = result_tx.clone();
        tokio::spawn(async move {
            let result = register_socket(&path, identity, &handlers).await;
            let _ = result_tx.send((path, result));
        });
    }
}

/// What one listing of the registry directory found.
#[derive(Debug, Default)]
struct Listing {
    /// Registration sockets.
    sockets: HashMap<PathBuf, SocketIdentity>,
    /// Everything else: directories (searched too) and files that are not sockets.
    other: HashMap<PathBuf, (std::fs::FileType, SocketIdentity)>,
    /// Directories (or entries) that could not be read, with the error.
    unreadable: Vec<(PathBuf, std::io::Error)>,
}

/// Lists everything under `dir` (recursively), skipping dot-names as the kubelet does.
fn list_entries(dir: &Path) -> Listing {
    let mut listing = Listing::default();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(e) => {
                listing.unreadable.push((current, e));
                continue;
            }
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                // Removed since read_dir returned it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    listing.unreadable.push((path, e));
                    continue;
                }
            };
            let identity = (meta.dev(), meta.ino());
            let file_type = meta.file_type();
            if file_type.is_socket() {
                listing.sockets.insert(path, identity);
            } else {
                if file_type.is_dir() {
                    pending.push(path.clone());
                }
                listing.other.insert(path, (file_type, identity));
            }
        }
    }
    listing
}

/// Entries already logged, so each non-socket file or unreadable directory is reported once
/// (again only after it changed), not once per listing.
#[derive(Debug, Default)]
struct Reported {
    ignored: HashSet<(PathBuf, SocketIdentity)>,
    unreadable: HashSet<(PathBuf, std::io::ErrorKind)>,
}

impl Reported {
    fn log_new(&mut self, listing: &Listing) {
        let mut ignored = HashSet::new();
        for (path, (file_type, identity)) in &listing.other {
            if file_type.is_dir() {
                continue;
            }
            let key = (path.clone(), *identity);
            if !self.ignored.contains(&key) {
                info!(path = %path.display(), "ignoring {} in the plugin registry: only Unix sockets register plugins", file_kind(file_type));
            }
            ignored.insert(key);
        }
        self.ignored = ignored;
        let mut unreadable = HashSet::new();
        for (path, error) in &listing.unreadable {
            let key = (path.clone(), error.kind());
            if !self.unreadable.contains(&key) {
                warn!(path = %path.display(), %error, "cannot read in the plugin registry; plugins below it are not found");
            }
            unreadable.insert(key);
        }
        self.unreadable = unreadable;
    }
}

/// A plugin in a private mount namespace whose `/var/lib/kubelet` directories are bind mounts
/// of this root's (docs/drivers.md, for drivers that hard-code the kubelet's paths) reports its
/// endpoint as it sees it. When that path does not exist here but the same path under this
/// root (the registration directory's parent) does, the root's path is the one meant.
fn endpoint_on_this_root(endpoint: PathBuf, registration_socket: &Path) -> PathBuf {
    const KUBELET_ROOT: &str = "/var/lib/kubelet";
    if endpoint.exists() {
        return endpoint;
    }
    let (Ok(rest), Some(root)) = (
        endpoint.strip_prefix(KUBELET_ROOT),
        registration_socket.parent().and_then(Path::parent),
    ) else {
        return endpoint;
    };
    let mapped = root.join(rest);
    if mapped.exists() { mapped } else { endpoint }
}

async fn register_socket(
    path: &Path,
    identity: SocketIdentity,
    handlers: &HashMap<String, Arc<dyn PluginHandler>>,
) -> AttemptResult {
    let failed = |error: String| AttemptResult::Failed { identity, error };
    let channel = match transport::dial(path, DIAL_TIMEOUT).await {
        Ok(channel) => channel,
        Err(e) => return failed(format!("dial failed: {e}")),
    };
    let mut client = RegistrationClient::new(channel);
    let info =
        match tokio::time::timeout(GET_INFO_TIMEOUT, client.get_info(pb::InfoRequest {})).await {
            Ok(Ok(info)) => info.into_inner(),
            Ok(Err(status)) => return failed(format!("GetInfo failed: {}", status.message())),
            Err(_) => {
                return failed(format!(
                    "GetInfo did not answer within {GET_INFO_TIMEOUT:?}"
                ));
            }
        };
    let Some(handler) = handlers.get(&info.r#type) else {
        let error = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {}",
            info.r#type,
            path.display()
        );
        notify_status(&mut client, false, &error).await;
        return failed(error);
    };
    // An empty endpoint means the registration socket also serves the plugin API; otherwise
    // the endpoint is used as given (an absolute host path), as the kubelet does.
    let endpoint = if info.endpoint.is_empty() {
        path.to_path_buf()
    } else {
        endpoint_on_this_root(PathBuf::from(&info.endpoint), path)
    };
    if let Err(e) = handler.validate(&info.name, &endpoint, &info.supported_versions) {
        let error = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
        notify_status(&mut client, false, &error).await;
        return failed(error);
    }
    if let Err(e) = handler
        .register(
            info.name.clone(),
            endpoint.clone(),
            info.supported_versions.clone(),
        )
        .await
    {
        let error = format!("RegisterPlugin error -- plugin registration failed with err: {e}");
        notify_status(&mut client, false, &error).await;
        return failed(error);
    }
    if !notify_status(&mut client, true, "").await {
        handler.deregister(&info.name, &endpoint);
        return failed("NotifyRegistrationStatus failed; plugin deregistered".to_owned());
    }
    info!(socket = %path.display(), plugin = %info.name, plugin_type = %info.r#type, "plugin registered through plugin watcher");
    AttemptResult::Registered(Registered {
        identity,
        plugin_type: info.r#type,
        name: info.name,
        endpoint,
    })
}

async fn notify_status(
    client: &mut RegistrationClient<tonic::transport::Channel>,
    registered: bool,
    error: &str,
) -> bool {
    let status = pb::RegistrationStatus {
        plugin_registered: registered,
        error: error.to_owned(),
    };
    matches!(
        tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(status)).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_seen_through_a_bind_mount_is_found_under_the_root() {
        let root = tempfile::tempdir().unwrap();
        let registration = root.path().join("plugins_registry/d-reg.sock");
        let socket = root.path().join("plugins/d/dra.sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        std::fs::write(&socket, b"").unwrap();
        let seen = PathBuf::from("/var/lib/kubelet/plugins/d/dra.sock");
        if seen.exists() {
            return; // a real kubelet's driver of that name: the path is used as given
        }
        assert_eq!(endpoint_on_this_root(seen, &registration), socket);
        // Missing under the root too, or not under the kubelet's root: as given.
        let other = PathBuf::from("/var/lib/kubelet/plugins/e/dra.sock");
        assert_eq!(endpoint_on_this_root(other.clone(), &registration), other);
        assert_eq!(endpoint_on_this_root(socket.clone(), &registration), socket);
    }
}
