//! devicelet's own control API on `R/devicelet/devicelet.sock`: HTTP/1.1 + JSON over a Unix
//! socket, used by the CLI (`devicelet get resources`) and usable with
//! `curl --unix-socket R/devicelet/devicelet.sock http://localhost/v1/resources`.
//!
//! Routes (versioned under `/v1`, one collection per noun):
//! - `GET /v1/resources` → [`ResourcesSnapshot`] (DESIGN.md `get resources` JSON)
//! - `POST /v1/pods` (body: a Pod as JSON) → [`AdmittedPod`] (`admit`), 422 on rejection
//! - `GET /v1/pods` → [`PodList`] (`get pods`)
//! - `DELETE /v1/pods/{uid}` → 204 (`remove`)
//! - `POST /v1/pods/{uid}/containers/{name}/start` → [`RunContainerOptions`] (`start`)
//! - `GET /healthz` → `ok`
//!
//! Errors are JSON `{"error": "..."}` with a fitting status code.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
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
use tokio::net::UnixStream;

use crate::error::ControlError;
use crate::pods::{AdmittedPod, PodAdmitter, PodError, PodList};

/// Shared state of the control API handlers.
#[derive(Debug, Clone)]
pub struct ControlState {
    /// The device manager whose inventory is served.
    pub devices: DeviceManager,
    /// Pod admission.
    pub pods: Arc<PodAdmitter>,
}

/// The control API router.
pub fn router(state: ControlState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/resources", get(get_resources))
        .route("/v1/pods", post(admit_pod).get(list_pods))
        .route("/v1/pods/{uid}", delete(remove_pod))
        .route(
            "/v1/pods/{uid}/containers/{name}/start",
            post(start_container),
        )
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "no such route") })
        .with_state(state)
}

async fn get_resources(State(state): State<ControlState>) -> Json<ResourcesSnapshot> {
    Json(state.devices.snapshot())
}

async fn admit_pod(State(state): State<ControlState>, body: Bytes) -> Response {
    let pod: Pod = match serde_json::from_slice(&body) {
        Ok(pod) => pod,
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, &format!("body is not a Pod: {e}"));
        }
    };
    match state.pods.admit(&pod).await {
        Ok(admitted) => Json(admitted).into_response(),
        Err(err) => pod_error(&err),
    }
}

async fn list_pods(State(state): State<ControlState>) -> Json<PodList> {
    Json(state.pods.list())
}

async fn remove_pod(State(state): State<ControlState>, UrlPath(uid): UrlPath<String>) -> Response {
    match state.pods.remove(&uid) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
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

fn pod_error(err: &PodError) -> Response {
    let status = match err {
        PodError::NotFound { .. } | PodError::NoSuchContainer { .. } => StatusCode::NOT_FOUND,
        PodError::Invalid(_) => StatusCode::BAD_REQUEST,
        PodError::UnknownResource { .. } | PodError::Admission { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
    };
    error_response(status, &err.to_string())
}

/// A JSON error body `{"error": message}`.
pub fn error_response(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
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

    /// `DELETE /v1/pods/{uid}`.
    pub async fn remove(&self, uid: &str) -> Result<(), ControlError> {
        self.request(http::Method::DELETE, &format!("/v1/pods/{uid}"), None)
            .await?;
        Ok(())
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
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            Err(ControlError::Status {
                path: path.to_owned(),
                status: status.as_u16(),
                body: message,
            })
        }
    }
}
