//! Volumes whose contents come from the API server — `configMap`, `secret`, `projected`
//! (service account token, configMap, secret, downward API) — and `downwardAPI`, written with
//! the kubelet's atomic writer ([`crate::atomic_writer`]) under the pod's directory and kept up
//! to date. Also the `kubernetes` Service's env (`KUBERNETES_SERVICE_HOST`, …).
//!
//! Follows the kubelet's volume plugins `pkg/volume/configmap/configmap.go`,
//! `pkg/volume/secret/secret.go`, `pkg/volume/projected/projected.go`,
//! `pkg/volume/downwardapi/downwardapi.go` (`MakePayload`, `CollectData`), the token manager
//! `pkg/kubelet/token/token_manager.go` (`requiresRefresh`) and `pkg/kubelet/envvars/envvars.go`
//! (`FromServices`).
//!
//! Objects are read one by one with GET under the node identity ([`PodApi`]): the Node
//! authorizer lets a node read only the secrets and configmaps of pods bound to it, and asks
//! service account tokens only for those pods.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use devicelet_quantity::Quantity;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ResourceFieldSelector, Secret, Volume,
};

use crate::atomic_writer::{self, FileProjection, Payload};
use crate::error::RuntimeError;

/// How often a running pod's volumes are read again and rewritten when they changed (the
/// kubelet re-syncs every minute; devicelet sooner).
pub const VOLUME_REFRESH: Duration = Duration::from_secs(10);

/// The default mode of configMap, secret, projected and downwardAPI files (0644).
pub const DEFAULT_MODE: u32 = 0o644;

/// The shortest token lifetime the TokenRequest API grants (10 min).
pub const MIN_TOKEN_SECONDS: i64 = 600;

/// A token is refreshed at the latest this long after it was issued (the token manager's
/// `maxTTL`).
pub const TOKEN_MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// At most this much jitter brings a refresh forward (the token manager's `maxJitter`).
pub const TOKEN_MAX_JITTER: Duration = Duration::from_secs(10);

/// A service account token to ask for (TokenRequest, bound to the pod).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenSpec {
    /// The pod's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
    /// Audiences (empty: the API server's own).
    pub audiences: Vec<String>,
    /// Requested lifetime in seconds.
    pub expiration_seconds: i64,
    /// The pod it is bound to.
    pub pod_name: String,
    /// See `pod_name`.
    pub pod_uid: String,
}

/// A token the API server issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The token.
    pub token: String,
    /// When it expires.
    pub expires: SystemTime,
    /// The lifetime it was issued with (seconds).
    pub expiration_seconds: i64,
}

/// One port of the `kubernetes` Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Its name (`https`), possibly empty.
    pub name: String,
    /// The port.
    pub port: i32,
    /// `TCP` and so on (empty: TCP).
    pub protocol: String,
}

/// Where pods reach the API server: the `kubernetes` Service's address and ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAddress {
    /// The ClusterIP (or the host the node itself uses).
    pub host: String,
    /// Its ports, the first one the main one.
    pub ports: Vec<ServicePort>,
}

/// What the runtime reads from the API server for a pod (cluster mode): the seam to the
/// cluster front end.
pub trait PodApi: Send + Sync + 'static {
    /// ConfigMap `namespace/name`; `None` when it does not exist.
    fn config_map<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConfigMap>, String>>;
    /// Secret `namespace/name`; `None` when it does not exist.
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, String>>;
    /// A new token for `spec` (TokenRequest, bound to the pod).
    fn token<'a>(&'a self, spec: &'a TokenSpec) -> BoxFuture<'a, Result<IssuedToken, String>>;
    /// The API server's address for pods (the `kubernetes` Service in `default`).
    fn kubernetes_service(&self) -> BoxFuture<'_, Result<ServiceAddress, String>>;
}

/// A [`PodApi`] handle ([`crate::CriConfig::pod_api`]).
#[derive(Clone)]
pub struct PodApiHandle(pub Arc<dyn PodApi>);

impl std::fmt::Debug for PodApiHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodApi")
    }
}

/// The kubelet's env for a Service (`FromServices` and `makeLinkVariables`), here for the
/// `kubernetes` Service: `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`,
/// `KUBERNETES_SERVICE_PORT_HTTPS`, `KUBERNETES_PORT`, `KUBERNETES_PORT_443_TCP{,_PROTO,_PORT,_ADDR}`.
pub fn service_env(service_name: &str, address: &ServiceAddress) -> Vec<(String, String)> {
    let prefix = env_name(service_name);
    let mut out = Vec::new();
    let Some(first) = address.ports.first() else {
        return out;
    };
    let host = &address.host;
    out.push((format!("{prefix}_SERVICE_HOST"), host.clone()));
    out.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
    for port in address.ports.iter().filter(|p| !p.name.is_empty()) {
        out.push((
            format!("{prefix}_SERVICE_PORT_{}", env_name(&port.name)),
            port.port.to_string(),
        ));
    }
    for (i, port) in address.ports.iter().enumerate() {
        let protocol = if port.protocol.is_empty() {
            "TCP"
        } else {
            &port.protocol
        };
        let host_port = if host.contains(':') {
            format!("[{host}]:{}", port.port)
        } else {
            format!("{host}:{}", port.port)
        };
        let url = format!("{}://{host_port}", protocol.to_lowercase());
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
        out.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
        out.push((format!("{port_prefix}_PORT"), port.port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), host.clone()));
        out.push((port_prefix, url));
    }
    out
}

fn env_name(name: &str) -> String {
    name.to_uppercase().replace('-', "_")
}

/// Whether the token manager asks for a new token (`requiresRefresh`): when `now` is past 80%
/// of its lifetime, or past 24 h after it was issued, each brought forward by `jitter`.
pub fn requires_refresh(token: &IssuedToken, now: SystemTime, jitter: Duration) -> bool {
    let ttl = Duration::from_secs(u64::try_from(token.expiration_seconds).unwrap_or(0));
    let Some(issued) = token.expires.checked_sub(ttl) else {
        return true;
    };
    let max_ttl_at = (issued + TOKEN_MAX_TTL)
        .checked_sub(jitter)
        .unwrap_or(issued);
    if now > max_ttl_at {
        return true;
    }
    let refresh_at = token
        .expires
        .checked_sub(ttl / 5 + jitter)
        .unwrap_or(issued);
    now > refresh_at
}

/// The kubelet's token manager: one token per pod, service account, audiences and lifetime,
/// asked again when [`requires_refresh`] says so.
#[derive(Debug, Default)]
pub struct TokenCache {
    tokens: Mutex<HashMap<TokenSpec, IssuedToken>>,
}

impl TokenCache {
    /// The token for `spec` at `now`: the cached one unless it needs a refresh. A failed
    /// refresh falls back to a cached token that has not expired yet.
    pub async fn get(
        &self,
        api: &dyn PodApi,
        spec: &TokenSpec,
        now: SystemTime,
        jitter: Duration,
    ) -> Result<IssuedToken, String> {
        let cached = self.lock().get(spec).cloned();
        if let Some(token) = &cached
            && !requires_refresh(token, now, jitter)
        {
            return Ok(token.clone());
        }
        match api.token(spec).await {
            Ok(token) => {
                self.lock().insert(spec.clone(), token.clone());
                Ok(token)
            }
            Err(e) => match cached {
                Some(token) if token.expires > now => {
                    tracing::warn!(pod_uid = %spec.pod_uid, error = %e,
                                   "service account token refresh failed; the current one is kept");
                    Ok(token)
                }
                _ => Err(e),
            },
        }
    }

    /// Forgets the tokens of pod `uid`.
    pub fn forget(&self, uid: &str) {
        self.lock().retain(|spec, _| spec.pod_uid != uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenSpec, IssuedToken>> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The directory kind of an API-backed volume (`kubernetes.io~configmap` and so on), `None`
/// for other volumes.
pub fn api_volume_kind(volume: &Volume) -> Option<&'static str> {
    if volume.config_map.is_some() {
        Some("kubernetes.io~configmap")
    } else if volume.secret.is_some() {
        Some("kubernetes.io~secret")
    } else if volume.projected.is_some() {
        Some("kubernetes.io~projected")
    } else if volume.downward_api.is_some() {
        Some("kubernetes.io~downward-api")
    } else {
        None
    }
}

/// Whether the volume needs the API server (everything but a plain downwardAPI volume).
fn needs_api(volume: &Volume) -> bool {
    volume.config_map.is_some() || volume.secret.is_some() || volume.projected.is_some()
}

fn mode_of(mode: Option<i32>, default: u32) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok()).unwrap_or(default) & 0o7777
}

/// Data of a configMap or secret by key.
type KeyData = BTreeMap<String, Vec<u8>>;

fn config_map_data(cm: &ConfigMap) -> KeyData {
    let mut out: KeyData = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

fn secret_data(secret: &Secret) -> KeyData {
    let mut out: KeyData = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

/// The files of a configMap or secret (`MakePayload`): every key, or the `items` asked for.
/// `data` is `None` when the object does not exist.
pub fn key_payload(
    what: &str,
    name: &str,
    data: Option<&KeyData>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    payload: &mut Payload,
) -> Result<(), String> {
    let Some(data) = data else {
        return if optional {
            Ok(())
        } else {
            Err(format!("{what} {name:?} not found"))
        };
    };
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (key, value) in data {
                payload.insert(
                    key.clone(),
                    FileProjection {
                        data: value.clone(),
                        mode: default_mode,
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let Some(value) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(format!(
                        "{what} {name:?} references non-existent key {:?}",
                        item.key
                    ));
                };
                payload.insert(
                    item.path.clone(),
                    FileProjection {
                        data: value.clone(),
                        mode: mode_of(item.mode, default_mode),
                    },
                );
            }
        }
    }
    Ok(())
}

/// Go's `%q` of a string (the downward API's `key="value"` lines).
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `key="value"` lines in key order (`fieldpath.FormatMap`).
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a downward API volume file (`CollectData`).
fn downward_value(pod: &Pod, item: &DownwardAPIVolumeFile) -> Result<String, String> {
    if let Some(field) = &item.field_ref {
        let m = &pod.metadata;
        return match field.field_path.as_str() {
            "metadata.labels" => Ok(format_map(m.labels.as_ref())),
            "metadata.annotations" => Ok(format_map(m.annotations.as_ref())),
            path => crate::downward::field_value(pod, path, "", "").map_err(|e| e.to_string()),
        };
    }
    if let Some(resource) = &item.resource_field_ref {
        return resource_value(pod, resource);
    }
    Err(format!(
        "downward API file {:?} has neither fieldRef nor resourceFieldRef",
        item.path
    ))
}

/// A `resourceFieldRef` (`ExtractContainerResourceValue`): the container's request or limit
/// divided by the divisor, rounded up. A limit the container does not set (the kubelet then
/// gives the node's allocatable) is refused.
fn resource_value(pod: &Pod, field: &ResourceFieldSelector) -> Result<String, String> {
    let container_name = field.container_name.as_deref().unwrap_or_default();
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == container_name)
        })
        .ok_or_else(|| format!("resourceFieldRef: no container {container_name:?}"))?;
    let (kind, resource) = field
        .resource
        .split_once('.')
        .ok_or_else(|| format!("resourceFieldRef {:?} is not supported", field.resource))?;
    let resources = container.resources.as_ref();
    let map = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => None,
    };
    let parse = |q: &str| Quantity::parse(q).map_err(|e| format!("quantity {q:?}: {e}"));
    let value = match map.and_then(|m| m.get(resource)) {
        Some(q) => parse(&q.0)?,
        None if kind == "requests" => {
            Quantity::from_int(0, devicelet_quantity::QuantityFormat::DecimalSI)
        }
        None => {
            return Err(format!(
                "resourceFieldRef {:?}: container {container_name:?} sets no such limit \
                 (devicelet does not give the node's allocatable instead)",
                field.resource
            ));
        }
    };
    let divisor = match &field.divisor {
        Some(d) => parse(&d.0)?,
        None => Quantity::from_int(1, devicelet_quantity::QuantityFormat::DecimalSI),
    };
    let (v, d) = if resource == "cpu" {
        (value.milli_value_ceil(), divisor.milli_value_ceil())
    } else {
        (value.value_ceil(), divisor.value_ceil())
    };
    if d <= 0 {
        return Err(format!(
            "resourceFieldRef {:?}: divisor must be positive",
            field.resource
        ));
    }
    Ok(((v + d - 1).div_euclid(d)).to_string())
}

fn downward_payload(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    payload: &mut Payload,
) -> Result<(), String> {
    for item in items {
        let value = downward_value(pod, item)?;
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: mode_of(item.mode, default_mode),
            },
        );
    }
    Ok(())
}

/// Per pod: whether its volumes were written once, and when they were last read.
#[derive(Debug, Clone, Copy)]
struct Synced {
    ok_once: bool,
    at: tokio::time::Instant,
}

/// Writes and refreshes the API-backed volumes of the pods a runtime runs.
#[derive(Debug)]
pub struct VolumeManager {
    api: Option<PodApiHandle>,
    tokens: TokenCache,
    synced: Mutex<HashMap<String, Synced>>,
    refresh: Duration,
}

impl VolumeManager {
    /// A manager reading through `api` (`None`: local mode, no API server).
    pub fn new(api: Option<PodApiHandle>, refresh: Duration) -> Self {
        VolumeManager {
            api,
            tokens: TokenCache::default(),
            synced: Mutex::new(HashMap::new()),
            refresh,
        }
    }

    /// The API it reads through, if any.
    pub fn api(&self) -> Option<&Arc<dyn PodApi>> {
        self.api.as_ref().map(|h| &h.0)
    }

    fn synced(&self) -> std::sync::MutexGuard<'_, HashMap<String, Synced>> {
        self.synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Before a container starts: the pod's volumes, written now unless they were written
    /// once already (then the periodic refresh keeps them current). An error is the
    /// container's `CreateContainerConfigError`.
    pub async fn prepare(&self, pod: &Pod, volumes_dir: &Path) -> Result<(), RuntimeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.synced().get(&uid).is_some_and(|s| s.ok_once) {
            return Ok(());
        }
        self.write_all(pod, volumes_dir).await
    }

    /// The periodic refresh: every [`VOLUME_REFRESH`] the volumes are read again and rewritten
    /// where something changed, and at once for a pod not seen yet (one adopted after a
    /// restart of devicelet, whose token would otherwise expire). A failure keeps the files as
    /// they are (logged).
    pub async fn refresh(&self, pod: &Pod, volumes_dir: &Path) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let has_volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| api_volume_kind(v).is_some()));
        let due = has_volumes
            && self
                .synced()
                .get(&uid)
                .is_none_or(|s| s.at.elapsed() >= self.refresh);
        if !due {
            return;
        }
        if let Err(e) = self.write_all(pod, volumes_dir).await {
            tracing::warn!(pod_uid = %uid, error = %e, "refreshing the pod's volumes failed; the files stay as they were");
        }
    }

    /// When [`VolumeManager::refresh`] would next read pod `pod`'s volumes again (`None`: it
    /// has no API-backed volume), for a sync loop that does not look at every pod every second.
    pub fn refresh_due(&self, pod: &Pod) -> Option<tokio::time::Instant> {
        let has_volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| api_volume_kind(v).is_some()));
        if !has_volumes {
            return None;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        Some(
            self.synced()
                .get(&uid)
                .map_or_else(tokio::time::Instant::now, |s| s.at + self.refresh),
        )
    }

    /// Forgets pod `uid` (its files go with the pod's directory).
    pub fn forget(&self, uid: &str) {
        self.synced().remove(uid);
        self.tokens.forget(uid);
    }

    async fn write_all(&self, pod: &Pod, volumes_dir: &Path) -> Result<(), RuntimeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let result = self.write_volumes(pod, volumes_dir).await;
        let mut synced = self.synced();
        let entry = synced.entry(uid).or_insert(Synced {
            ok_once: false,
            at: tokio::time::Instant::now(),
        });
        entry.at = tokio::time::Instant::now();
        entry.ok_once |= result.is_ok();
        result
    }

    async fn write_volumes(&self, pod: &Pod, volumes_dir: &Path) -> Result<(), RuntimeError> {
        for volume in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(kind) = api_volume_kind(volume) else {
                continue;
            };
            let fail = |why: String| RuntimeError::Volume {
                volume: volume.name.clone(),
                why,
            };
            if needs_api(volume) && self.api.is_none() {
                return Err(fail(
                    "configMap, secret and projected volumes need cluster mode (an API server); \
                     this node runs in local mode"
                        .to_owned(),
                ));
            }
            let payload = self.payload(pod, volume).await.map_err(fail)?;
            let dir = volume_dir(volumes_dir, kind, &volume.name);
            atomic_writer::write(&dir, &payload).map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }

    /// The files of one volume.
    async fn payload(&self, pod: &Pod, volume: &Volume) -> Result<Payload, String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut payload = Payload::new();
        if let Some(source) = &volume.config_map {
            let data = self.config_map(namespace, &source.name).await?;
            key_payload(
                "configmap",
                &source.name,
                data.as_ref(),
                source.items.as_deref(),
                mode_of(source.default_mode, DEFAULT_MODE),
                source.optional.unwrap_or(false),
                &mut payload,
            )?;
        } else if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap_or_default();
            let data = self.secret(namespace, &name).await?;
            key_payload(
                "secret",
                &name,
                data.as_ref(),
                source.items.as_deref(),
                mode_of(source.default_mode, DEFAULT_MODE),
                source.optional.unwrap_or(false),
                &mut payload,
            )?;
        } else if let Some(source) = &volume.downward_api {
            downward_payload(
                pod,
                source.items.as_deref().unwrap_or_default(),
                mode_of(source.default_mode, DEFAULT_MODE),
                &mut payload,
            )?;
        } else if let Some(projected) = &volume.projected {
            let default_mode = mode_of(projected.default_mode, DEFAULT_MODE);
            for source in projected.sources.iter().flatten() {
                if let Some(cm) = &source.config_map {
                    let data = self.config_map(namespace, &cm.name).await?;
                    key_payload(
                        "configmap",
                        &cm.name,
                        data.as_ref(),
                        cm.items.as_deref(),
                        default_mode,
                        cm.optional.unwrap_or(false),
                        &mut payload,
                    )?;
                } else if let Some(secret) = &source.secret {
                    let data = self.secret(namespace, &secret.name).await?;
                    key_payload(
                        "secret",
                        &secret.name,
                        data.as_ref(),
                        secret.items.as_deref(),
                        default_mode,
                        secret.optional.unwrap_or(false),
                        &mut payload,
                    )?;
                } else if let Some(downward) = &source.downward_api {
                    downward_payload(
                        pod,
                        downward.items.as_deref().unwrap_or_default(),
                        default_mode,
                        &mut payload,
                    )?;
                } else if let Some(token) = &source.service_account_token {
                    let api = self.api().ok_or("no API server")?;
                    let spec = TokenSpec {
                        namespace: namespace.to_owned(),
                        service_account: pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.service_account_name.clone())
                            .filter(|s| !s.is_empty())
                            .unwrap_or_else(|| "default".to_owned()),
                        audiences: token
                            .audience
                            .clone()
                            .filter(|a| !a.is_empty())
                            .into_iter()
                            .collect(),
                        expiration_seconds: token
                            .expiration_seconds
                            .unwrap_or(3600)
                            .max(MIN_TOKEN_SECONDS),
                        pod_name: pod.metadata.name.clone().unwrap_or_default(),
                        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                    };
                    let jitter = TOKEN_MAX_JITTER.mul_f64(jitter_fraction());
                    let issued = self
                        .tokens
                        .get(api.as_ref(), &spec, SystemTime::now(), jitter)
                        .await
                        .map_err(|e| {
                            format!(
                                "service account token for {}/{}: {e}",
                                spec.namespace, spec.service_account
                            )
                        })?;
                    payload.insert(
                        token.path.clone(),
                        FileProjection {
                            data: issued.token.into_bytes(),
                            mode: default_mode,
                        },
                    );
                } else if source.cluster_trust_bundle.is_some() || source.pod_certificate.is_some()
                {
                    return Err(
                        "clusterTrustBundle and podCertificate projections are not supported by \
                         devicelet's CRI runtime"
                            .to_owned(),
                    );
                }
            }
        }
        Ok(payload)
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<KeyData>, String> {
        let api = self.api().ok_or("no API server")?;
        let cm = api
            .config_map(namespace, name)
            .await
            .map_err(|e| format!("configmap {namespace}/{name}: {e}"))?;
        Ok(cm.as_ref().map(config_map_data))
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<KeyData>, String> {
        let api = self.api().ok_or("no API server")?;
        let secret = api
            .secret(namespace, name)
            .await
            .map_err(|e| format!("secret {namespace}/{name}: {e}"))?;
        Ok(secret.as_ref().map(secret_data))
    }
}

/// `volumes_dir/<kind>/<name>`.
pub fn volume_dir(volumes_dir: &Path, kind: &str, name: &str) -> PathBuf {
    volumes_dir.join(kind).join(name)
}

/// A fraction in [0, 1) from the clock (jitter needs no strong randomness).
fn jitter_fraction() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn token(expires: SystemTime, seconds: i64) -> IssuedToken {
        IssuedToken {
            token: "t".into(),
            expires,
            expiration_seconds: seconds,
        }
    }

    #[test]
    fn a_token_is_refreshed_after_80_percent_of_its_lifetime() {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let t = token(issued + Duration::from_secs(3600), 3600);
        let at = |s: u64| issued + Duration::from_secs(s);
        assert!(!requires_refresh(&t, at(0), Duration::ZERO));
        assert!(
            !requires_refresh(&t, at(2880), Duration::ZERO),
            "exactly 80%"
        );
        assert!(requires_refresh(&t, at(2881), Duration::ZERO));
        // Jitter brings it forward.
        assert!(requires_refresh(&t, at(2875), Duration::from_secs(10)));
        assert!(!requires_refresh(&t, at(2869), Duration::from_secs(10)));
    }

    #[test]
    fn a_long_lived_token_is_refreshed_after_24_hours() {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let week = 7 * 24 * 3600;
        let t = token(
            issued + Duration::from_secs(week),
            i64::try_from(week).expect("week"),
        );
        let at = |s: u64| issued + Duration::from_secs(s);
        assert!(!requires_refresh(&t, at(24 * 3600), Duration::ZERO));
        assert!(requires_refresh(&t, at(24 * 3600 + 1), Duration::ZERO));
    }

    /// A fake API server issuing tokens valid for their requested lifetime from a fake clock.
    struct FakeApi {
        ca: Mutex<String>,
        now: Mutex<SystemTime>,
        issued: AtomicUsize,
        fail: std::sync::atomic::AtomicBool,
    }

    impl PodApi for FakeApi {
        fn config_map<'a>(
            &'a self,
            _: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<ConfigMap>, String>> {
            Box::pin(async move {
                let ca = self.ca.lock().expect("ca").clone();
                Ok((name == "kube-root-ca.crt").then(|| ConfigMap {
                    data: Some(BTreeMap::from([("ca.crt".to_owned(), ca)])),
                    ..Default::default()
                }))
            })
        }
        fn secret<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Option<Secret>, String>> {
            Box::pin(async { Ok(None) })
        }
        fn token<'a>(&'a self, spec: &'a TokenSpec) -> BoxFuture<'a, Result<IssuedToken, String>> {
            Box::pin(async move {
                if self.fail.load(Ordering::SeqCst) {
                    return Err("unavailable".into());
                }
                let n = self.issued.fetch_add(1, Ordering::SeqCst);
                let now = *self.now.lock().expect("clock");
                let secs = u64::try_from(spec.expiration_seconds).expect("seconds");
                Ok(IssuedToken {
                    token: format!("token-{n}"),
                    expires: now + Duration::from_secs(secs),
                    expiration_seconds: spec.expiration_seconds,
                })
            })
        }
        fn kubernetes_service(&self) -> BoxFuture<'_, Result<ServiceAddress, String>> {
            Box::pin(async { Err("none".into()) })
        }
    }

    #[tokio::test]
    async fn the_token_cache_rotates_on_the_fake_clock() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let api = FakeApi {
            ca: Mutex::new("CA".into()),
            now: Mutex::new(start),
            issued: AtomicUsize::new(0),
            fail: false.into(),
        };
        let spec = TokenSpec {
            namespace: "ns".into(),
            service_account: "default".into(),
            audiences: vec![],
            expiration_seconds: 3600,
            pod_name: "p".into(),
            pod_uid: "u".into(),
        };
        let cache = TokenCache::default();
        let get = |now| cache.get(&api, &spec, now, Duration::ZERO);
        assert_eq!(get(start).await.expect("first").token, "token-0");
        let later = start + Duration::from_secs(2000);
        assert_eq!(get(later).await.expect("cached").token, "token-0");
        let rotate = start + Duration::from_secs(2900);
        *api.now.lock().expect("clock") = rotate;
        assert_eq!(get(rotate).await.expect("rotated").token, "token-1");
        // A failing API server: the current token is kept while it is valid, then the error.
        api.fail.store(true, Ordering::SeqCst);
        let due = rotate + Duration::from_secs(3000);
        assert_eq!(get(due).await.expect("kept").token, "token-1");
        let expired = rotate + Duration::from_secs(3601);
        assert!(get(expired).await.is_err());
        cache.forget("u");
        assert!(cache.lock().is_empty());
    }

    /// The volume the API server's ServiceAccount admission injects, as it injects it.
    fn kube_api_access_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "containers": [{"name": "c"}],
                "volumes": [{"name": "kube-api-access-abcde", "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt",
                                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                    ]}}]
            }
        }))
        .expect("pod")
    }

    #[tokio::test]
    async fn the_default_service_account_volume_is_written() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let api = Arc::new(FakeApi {
            ca: Mutex::new("CA".into()),
            now: Mutex::new(SystemTime::now()),
            issued: AtomicUsize::new(0),
            fail: false.into(),
        });
        let manager = VolumeManager::new(Some(PodApiHandle(api.clone())), VOLUME_REFRESH);
        let pod = kube_api_access_pod();
        manager.prepare(&pod, tmp.path()).await.expect("prepare");
        let dir = tmp
            .path()
            .join("kubernetes.io~projected/kube-api-access-abcde");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("file");
        assert_eq!(read("token"), "token-0");
        assert_eq!(read("ca.crt"), "CA");
        assert_eq!(read("namespace"), "ns");
        assert!(dir.join("..data").is_symlink());

        // A changed object reaches the files at the next refresh, not before.
        *api.ca.lock().expect("ca") = "CA2".into();
        manager.refresh(&pod, tmp.path()).await;
        assert_eq!(read("ca.crt"), "CA", "not due yet");
        tokio::time::pause();
        tokio::time::advance(VOLUME_REFRESH + Duration::from_secs(1)).await;
        manager.refresh(&pod, tmp.path()).await;
        assert_eq!(read("ca.crt"), "CA2");
        assert_eq!(read("token"), "token-0", "the token is still fresh");
        // A pod the manager has not seen (adopted after a restart) is refreshed at once.
        *api.ca.lock().expect("ca") = "CA3".into();
        let restarted = VolumeManager::new(Some(PodApiHandle(api.clone())), VOLUME_REFRESH);
        restarted.refresh(&pod, tmp.path()).await;
        assert_eq!(read("ca.crt"), "CA3");

        // Local mode: no API server, a clear error.
        let local = VolumeManager::new(None, VOLUME_REFRESH);
        let err = local
            .prepare(&pod, tmp.path())
            .await
            .expect_err("local mode")
            .to_string();
        assert!(err.contains("need cluster mode"), "{err}");
        assert_eq!(
            RuntimeError::Volume {
                volume: String::new(),
                why: String::new()
            }
            .waiting_reason(),
            "CreateContainerConfigError"
        );
    }

    #[test]
    fn items_modes_and_optional_keys() {
        let data: KeyData = [
            ("a".to_owned(), b"1".to_vec()),
            ("b".to_owned(), b"2".to_vec()),
        ]
        .into_iter()
        .collect();
        let mut all = Payload::new();
        key_payload("configmap", "c", Some(&data), None, 0o600, false, &mut all).expect("all");
        assert_eq!(all.len(), 2);
        assert_eq!(all["a"].mode, 0o600);

        let items: Vec<KeyToPath> = serde_json::from_value(json!([
            {"key": "a", "path": "dir/x", "mode": 0o400},
            {"key": "missing", "path": "y"}
        ]))
        .expect("items");
        let mut some = Payload::new();
        let err = key_payload(
            "configmap",
            "c",
            Some(&data),
            Some(&items),
            0o644,
            false,
            &mut some,
        )
        .expect_err("missing key");
        assert!(err.contains("non-existent key \"missing\""), "{err}");
        let mut some = Payload::new();
        key_payload(
            "configmap",
            "c",
            Some(&data),
            Some(&items),
            0o644,
            true,
            &mut some,
        )
        .expect("optional");
        assert_eq!(some.keys().collect::<Vec<_>>(), ["dir/x"]);
        assert_eq!(some["dir/x"].mode, 0o400);

        let mut none = Payload::new();
        let err =
            key_payload("secret", "s", None, None, 0o644, false, &mut none).expect_err("not found");
        assert!(err.contains("secret \"s\" not found"), "{err}");
        key_payload("secret", "s", None, None, 0o644, true, &mut none).expect("optional");
        assert!(none.is_empty());
    }

    #[test]
    fn downward_api_files_follow_the_kubelet_format() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                         "labels": {"b": "2", "a": "x\"y"}},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"memory": "64Mi", "cpu": "1500m"}}}]}
        }))
        .expect("pod");
        let items: Vec<DownwardAPIVolumeFile> = serde_json::from_value(json!([
            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}, "mode": 0o400}
        ]))
        .expect("items");
        let mut payload = Payload::new();
        downward_payload(&pod, &items, 0o644, &mut payload).expect("payload");
        let text = |k: &str| String::from_utf8(payload[k].data.clone()).expect("utf8");
        assert_eq!(text("namespace"), "ns");
        assert_eq!(text("labels"), "a=\"x\\\"y\"\nb=\"2\"");
        assert_eq!(text("mem"), "64");
        assert_eq!(text("cpu"), "2");
        assert_eq!(payload["cpu"].mode, 0o400);
    }

    #[test]
    fn the_kubernetes_service_env_is_the_kubelets() {
        let env = service_env(
            "kubernetes",
            &ServiceAddress {
                host: "10.0.0.1".into(),
                ports: vec![ServicePort {
                    name: "https".into(),
                    port: 443,
                    protocol: "TCP".into(),
                }],
            },
        );
        let map: BTreeMap<_, _> = env.into_iter().collect();
        let expect = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.0.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.0.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.0.0.1"),
        ];
        assert_eq!(map.len(), expect.len(), "{map:?}");
        for (k, v) in expect {
            assert_eq!(map.get(k).map(String::as_str), Some(v), "{k}");
        }
    }
}
