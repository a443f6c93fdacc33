//! devicelet's own control API on `R/devicelet/devicelet.sock`: HTTP/1.1 + JSON over a Unix
//! socket, used by the CLI (`devicelet get resources`) and usable with
//! `curl --unix-socket R/devicelet/devicelet.sock http://localhost/v1/resources`.
//!
//! Routes (versioned under `/v1`, one collection per noun):
//! - `GET /v1/resources` → [`ResourcesSnapshot`] (DESIGN.md `get resources` JSON)
//! - `POST /v1/pods` (body: a Pod as JSON) → [`AdmittedPod`] (`admit`), 422 on rejection
//! - `GET /v1/pods` → [`PodList`] (`get pods`), app containers with `allocatedResourcesStatus`
//! - `GET /v1/pods/watch?since=REV&timeoutSeconds=N` → [`PodWatch`]: long poll, answers as soon
//!   as the pod list (devices or health) differs from revision `REV` (at once without `since`),
//!   or after `N` seconds (default 30) with the unchanged list (`get pods --watch`)
//! - `DELETE /v1/pods/{uid}` → 204 (`remove`)
//! - `POST /v1/pods/sync` (body: [`ActivePods`]) → [`PodSync`] (`sync-pods`): every admitted
//!   pod not listed is removed (the kubelet's `UpdateAllocatedDevices`)
//! - `POST /v1/pods/{uid}/containers/{name}/start` → [`RunContainerOptions`] (`start`)
//! - `GET /v1/pods/{uid}/runtime` → [`devicelet_runtime::PodRuntimeStatus`] (`serve --runtime
//!   cri`): the pod's phase and its containers' real states. With a CRI runtime, `admit` also
//!   hands the pod to the runtime, and `remove` and `sync-pods` stop containers (within the
//!   pod's grace period) before their devices are freed.
//! - DRA (when enabled, [`devicelet_node::dra`], routes in [`dra`]): `GET /v1/dra`, `POST|GET /v1/draobjects` (`apply`),
//!   `POST /v1/resourceslices/{driver}` (a driver publishes), `GET /v1/resourceslices` (what
//!   the drivers published for the node; in cluster mode read from the API server), `GET|DELETE
//!   /v1/resourceclaims/{namespace}/{name}`
//! - `GET /v1/picture` → [`NodePicture`] (`top --numa`): NUMA nodes with their CPUs, memory,
//!   devices and the pods holding them
//! - `GET /healthz` → `ok`
//!
//! Errors are JSON `{"error": "..."}` with a fitting status code.

pub mod dra;
mod response;

pub use response::error_response;

use std::path::{Path, PathBuf};

use std::sync::Arc;

use std::time::Duration;

use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use bytes::Bytes;
use devicelet_devicemanager::{DeviceManager, ResourcesSnapshot, RunContainerOptions};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::net::UnixStream;

use crate::error::ControlError;
use devicelet_node::health;
use devicelet_node::picture::NodePicture;
use devicelet_node::pods::{ActivePods, AdmittedPod, PodAdmitter, PodError, PodList, PodSync};

/// Shared state of the control API handlers.
#[derive(Debug, Clone)]
pub struct ControlState {
    /// The device manager whose inventory is served.
    pub devices: DeviceManager,
    /// Pod admission.
    pub pods: Arc<PodAdmitter>,
    /// The CRI runtime that runs admitted pods (`serve --runtime cri`); `None`: simulated.
    pub runtime: Option<Arc<devicelet_runtime::CriRuntime>>,
    /// Cluster mode: pods come from the API server, so the local `admit`, `remove` and
    /// `sync-pods` are refused (a local admission would take devices the scheduler believes
    /// are free; a local removal would free devices of a pod the API server still runs).
    pub pods_from_api_server: bool,
    /// Cluster mode: where `GET /v1/resourceslices` lists the node's slices.
    pub cluster_slices: Option<dra::SliceLister>,
}

/// The answer to a local pod change in cluster mode.
fn pods_come_from_api_server(action: &str) -> Response {
    error_response(
        StatusCode::CONFLICT,
        &format!(
            "{action} is refused in cluster mode: pods come from the API server (create or delete \
             the Pod object there; the scheduler decides where it runs)"
        ),
    )
}

/// The control API router.
pub fn router(state: ControlState) -> Router {
    let dra = state.pods.dra().map_or_else(Router::new, |node| {
        dra::router(node, state.cluster_slices.clone())
    });
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/resources", get(get_resources))
        .route("/v1/pods", post(admit_pod).get(list_pods))
        .route("/v1/pods/watch", get(watch_pods))
        .route("/v1/pods/sync", post(sync_pods))
        .route("/v1/pods/{uid}", delete(remove_pod))
        .route(
            "/v1/state",
            get(|State(state): State<ControlState>| async move {
                Json(state.pods.durable().status())
            }),
        )
        .route(
            "/v1/pods/{uid}/containers/{name}/start",
            post(start_container),
        )
        .route("/v1/pods/{uid}/runtime", get(pod_runtime_status))
        .route(
            "/v1/picture",
            get(|State(state): State<ControlState>| async move {
                Json(state.pods.picture().await)
            }),
        )
        .with_state(state)
        .merge(dra)
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "no such route") })
}

async fn get_resources(State(state): State<ControlState>) -> Json<ResourcesSnapshot> {
    Json(state.devices.snapshot())
}

async fn admit_pod(State(state): State<ControlState>, body: Bytes) -> Response {
    if state.pods_from_api_server {
        return pods_come_from_api_server("admit");
    }
    let pod: Pod = match serde_json::from_slice(&body) {
        Ok(pod) => pod,
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, &format!("body is not a Pod: {e}"));
        }
    };
    // A pod the runtime could never run is refused before it takes any device.
    if state.runtime.is_some()
        && let Err(err) = devicelet_runtime::config::check_pod(&pod)
    {
        return error_response(StatusCode::BAD_REQUEST, &format!("pod cannot run: {err}"));
    }
    match state.pods.admit(&pod).await {
        Ok(mut admitted) => {
            if let Some(runtime) = &state.runtime {
                // The pod keeps its devices; a pod the runtime cannot record is not run, and
                // the caller hears why (removing it frees its devices).
                if let Err(err) = runtime.run_pod(&pod) {
                    return error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("pod admitted but not handed to the container runtime: {err}"),
                    );
                }
            }
            health::annotate(&state.devices, std::slice::from_mut(&mut admitted));
            state
                .pods
                .annotate_claim_health(std::slice::from_mut(&mut admitted));
            Json(admitted).into_response()
        }
        Err(err) => pod_error(&err),
    }
}

fn shown_pods(state: &ControlState) -> PodList {
    let mut list = state.pods.list();
    health::annotate(&state.devices, &mut list.pods);
    state.pods.annotate_claim_health(&mut list.pods);
    list
}

async fn list_pods(State(state): State<ControlState>) -> Json<PodList> {
    Json(shown_pods(&state))
}

/// One answer of `GET /v1/pods/watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodWatch {
    /// Opaque revision of `pods`; pass it back as `since`.
    pub revision: String,
    /// The pods, as `GET /v1/pods`.
    #[serde(flatten)]
    pub list: PodList,
}

/// `since` and `timeoutSeconds` from the query string (plain tokens, no escaping needed).
fn watch_query(query: Option<&str>) -> (Option<String>, Option<u64>) {
    let mut since = None;
    let mut timeout = None;
    for pair in query.unwrap_or_default().split('&') {
        match pair.split_once('=') {
            Some(("since", value)) => since = Some(value.to_owned()),
            Some(("timeoutSeconds", value)) => timeout = value.parse().ok(),
            _ => {}
        }
    }
    (since, timeout)
}

fn revision(list: &PodList) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(list)
        .unwrap_or_default()
        .hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

async fn watch_pods(
    State(state): State<ControlState>,
    RawQuery(query): RawQuery,
) -> Json<PodWatch> {
    let (since, timeout_seconds) = watch_query(query.as_deref());
    let timeout = Duration::from_secs(timeout_seconds.unwrap_or(30).min(300));
    let deadline = tokio::time::Instant::now() + timeout;
    let mut changes = state.devices.subscribe();
    loop {
        let list = shown_pods(&state);
        let rev = revision(&list);
        if since.as_deref() != Some(rev.as_str()) || tokio::time::Instant::now() >= deadline {
            return Json(PodWatch {
                revision: rev,
                list,
            });
        }
        // Inventory changes (health, allocations) wake us at once; the pod map itself changes
        // without a signal, so look again at least every 250 ms.
        let wake = (tokio::time::Instant::now() + Duration::from_millis(250)).min(deadline);
        let _ = tokio::time::timeout_at(wake, changes.changed()).await;
    }
}

async fn remove_pod(State(state): State<ControlState>, UrlPath(uid): UrlPath<String>) -> Response {
    if state.pods_from_api_server {
        return pods_come_from_api_server("remove");
    }
    // Containers stop (within the pod's grace period) before their devices are freed.
    if let Some(runtime) = &state.runtime
        && let Err(err) = runtime.kill_pod_gracefully(&uid).await
    {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("pod {uid} kept: its containers could not be stopped: {err}"),
        );
    }
    match state.pods.remove_with_claims(&uid).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        // Not an admission failure (issue 40): the pod and its devices are gone, its claims
        // wait for their driver.
        Err(PodError::Claims(err)) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "pod {uid} removed, but its DRA claims are not unprepared yet; devicelet retries \
                 in the background until the driver answers: {err}"
            ),
        ),
        Err(err) => pod_error(&err),
    }
}

async fn sync_pods(State(state): State<ControlState>, body: Bytes) -> Response {
    if state.pods_from_api_server {
        return pods_come_from_api_server("sync-pods");
    }
    let active: ActivePods = match serde_json::from_slice(&body) {
        Ok(active) => active,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &format!("body is not {{\"activePods\": [UID, ...]}}: {e}"),
            );
        }
    };
    let active = active.active_pods.into_iter().collect();
    if let Some(runtime) = &state.runtime
        && let Err(err) = runtime
            .retain(&active, devicelet_runtime::manager::ORPHAN_GRACE)
            .await
    {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("gone pods' containers could not be stopped: {err}"),
        );
    }
    match state.pods.retain_active(&active).await {
        Ok(sync) => Json(sync).into_response(),
        Err(err) => pod_error(&err),
    }
}

async fn start_container(
    State(state): State<ControlState>,
    UrlPath((uid, name)): UrlPath<(String, String)>,
) -> Response {
    match state.pods.start(&uid, &name).await {
        Ok(options) => Json(options).into_response(),
        Err(err) => pod_error(&err),
    }
}

async fn pod_runtime_status(
    State(state): State<ControlState>,
    UrlPath(uid): UrlPath<String>,
) -> Response {
    let Some(runtime) = &state.runtime else {
        return error_response(
            StatusCode::NOT_FOUND,
            "no container runtime: devicelet serves with --runtime simulated",
        );
    };
    match runtime.status(&uid) {
        Some(status) => Json(status).into_response(),
        None => error_response(
            StatusCode::NOT_FOUND,
            &format!("pod {uid} is not run by the container runtime (or not looked at yet)"),
        ),
    }
}

fn pod_error(err: &PodError) -> Response {
    let status = match err {
        PodError::NotFound { .. } | PodError::NoSuchContainer { .. } => StatusCode::NOT_FOUND,
        PodError::Invalid(_) => StatusCode::BAD_REQUEST,
        PodError::UnknownResource { .. }
        | PodError::Admission { .. }
        | PodError::Alignment(_)
        | PodError::Claims(_) => StatusCode::UNPROCESSABLE_ENTITY,
        PodError::Durable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    if status == StatusCode::UNPROCESSABLE_ENTITY {
        // A refused pod: the kubelet's reason and message beside the detail.
        let (reason, message) = err.kubelet_rejection();
        let body =
            serde_json::json!({ "error": err.to_string(), "reason": reason, "message": message });
        return (status, Json(body)).into_response();
    }
    error_response(status, &err.to_string())
}

fn decode<T: DeserializeOwned>(path: &str, body: &[u8]) -> Result<T, ControlError> {
    serde_json::from_slice(body).map_err(|source| ControlError::Json {
        path: path.to_owned(),
        source,
    })
}

/// Client of the control API (one HTTP/1.1 connection per request).
#[derive(Debug, Clone)]
pub struct ControlClient {
    socket: PathBuf,
}

impl ControlClient {
    /// A client for the daemon listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        ControlClient {
            socket: socket.into(),
        }
    }

    /// The control socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /v1/resources`.
    pub async fn resources(&self) -> Result<ResourcesSnapshot, ControlError> {
        self.get_json("/v1/resources").await
    }

    /// `POST /v1/pods` with a Pod as JSON.
    pub async fn admit(&self, pod_json: Bytes) -> Result<AdmittedPod, ControlError> {
        let body = self
            .request(http::Method::POST, "/v1/pods", Some(pod_json))
            .await?;
        decode("/v1/pods", &body)
    }

    /// `GET /v1/pods`.
    pub async fn pods(&self) -> Result<PodList, ControlError> {
        self.get_json("/v1/pods").await
    }

    /// `GET /v1/picture`.
    pub async fn picture(&self) -> Result<NodePicture, ControlError> {
        self.get_json("/v1/picture").await
    }

    /// `GET /v1/pods/watch`: waits up to `timeout` for the pods to differ from `since`.
    pub async fn watch_pods(
        &self,
        since: Option<&str>,
        timeout: Duration,
    ) -> Result<PodWatch, ControlError> {
        let mut path = format!("/v1/pods/watch?timeoutSeconds={}", timeout.as_secs());
        if let Some(since) = since {
            path.push_str("&since=");
            path.push_str(since);
        }
        self.get_json(&path).await
    }

    /// `DELETE /v1/pods/{uid}`.
    pub async fn remove(&self, uid: &str) -> Result<(), ControlError> {
        self.request(http::Method::DELETE, &format!("/v1/pods/{uid}"), None)
            .await?;
        Ok(())
    }

    /// `POST /v1/pods/sync`: removes every admitted pod not in `active`.
    pub async fn sync_pods(&self, active: &[String]) -> Result<PodSync, ControlError> {
        let path = "/v1/pods/sync";
        let body = serde_json::to_vec(&ActivePods {
            active_pods: active.to_vec(),
        })
        .map_err(|source| ControlError::Json {
            path: path.to_owned(),
            source,
        })?;
        let out = self
            .request(http::Method::POST, path, Some(body.into()))
            .await?;
        decode(path, &out)
    }

    /// `POST /v1/pods/{uid}/containers/{name}/start`.
    pub async fn start(
        &self,
        uid: &str,
        container: &str,
    ) -> Result<RunContainerOptions, ControlError> {
        let path = format!("/v1/pods/{uid}/containers/{container}/start");
        let body = self.request(http::Method::POST, &path, None).await?;
        decode(&path, &body)
    }

    /// `POST /v1/draobjects`: stores DRA objects (`devicelet apply`); returns `kind/name`s.
    pub async fn apply(&self, docs: &[serde_json::Value]) -> Result<Vec<String>, ControlError> {
        let body = serde_json::to_vec(docs).map_err(|source| ControlError::Json {
            path: "/v1/draobjects".to_owned(),
            source,
        })?;
        let out = self
            .request(http::Method::POST, "/v1/draobjects", Some(body.into()))
            .await?;
        decode("/v1/draobjects", &out)
    }

    /// `POST /v1/resourceslices/{driver}`: a driver publishes its ResourceSlices.
    pub async fn publish_slices(
        &self,
        driver: &str,
        slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
    ) -> Result<(), ControlError> {
        let path = format!("/v1/resourceslices/{driver}");
        let body = serde_json::to_vec(slices).map_err(|source| ControlError::Json {
            path: path.clone(),
            source,
        })?;
        self.request(http::Method::POST, &path, Some(body.into()))
            .await?;
        Ok(())
    }

    /// `GET /v1/resourceclaims/{namespace}/{name}`: what a driver reads before preparing.
    pub async fn resource_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<k8s_openapi::api::resource::v1::ResourceClaim, ControlError> {
        self.get_json(&format!("/v1/resourceclaims/{namespace}/{name}"))
            .await
    }

    /// `GET path`, decoding a JSON body.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ControlError> {
        let body = self.request(http::Method::GET, path, None).await?;
        serde_json::from_slice(&body).map_err(|source| ControlError::Json {
            path: path.to_owned(),
            source,
        })
    }

    /// Sends one request; returns the body of a 2xx answer, or [`ControlError::Status`].
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Bytes, ControlError> {
        let http_err = |message: String| ControlError::Http {
            path: path.to_owned(),
            message,
        };
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ControlError::NotRunning {
                    path: self.socket.clone(),
                    source,
                })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| http_err(e.to_string()))?;
        let driver = tokio::spawn(connection);
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| http_err(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| http_err(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| http_err(e.to_string()))?
            .to_bytes();
        driver.abort();
        if status.is_success() {
            Ok(bytes)
        } else {
            // Prefer the `{"error": ...}` message over the raw body.
            let json = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
            let field = |name: &str| {
                json.as_ref()
                    .and_then(|v| v.get(name).and_then(|e| e.as_str()).map(str::to_owned))
            };
            let message =
                field("error").unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            tracing::debug!(path, status = status.as_u16(), error = %message, "control API answered an error");
            if let (Some(reason), Some(kubelet_message)) = (field("reason"), field("message")) {
                return Err(ControlError::Rejected {
                    reason,
                    message: kubelet_message,
                    detail: message,
                });
            }
            Err(ControlError::Status {
                path: path.to_owned(),
                status: status.as_u16(),
                body: message,
            })
        }
    }
}
