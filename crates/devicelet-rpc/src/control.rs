//! devicelet's own control API on `R/devicelet/devicelet.sock`: HTTP/1.1 + JSON over a Unix
//! socket, used by the CLI (`devicelet get resources`) and usable with
//! `curl --unix-socket R/devicelet/devicelet.sock http://localhost/v1/resources`.
//!
//! Routes (versioned under `/v1`, one resource collection per noun so pod admission slots in
//! as `POST /v1/pods`, `GET /v1/pods`, `DELETE /v1/pods/{uid}`,
//! `POST /v1/pods/{uid}/containers/{name}/start`):
//! - `GET /v1/resources` → [`ResourcesSnapshot`] (DESIGN.md `get resources` JSON)
//! - `GET /healthz` → `ok`
//!
//! Errors are JSON `{"error": "..."}` with a fitting status code.

use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use devicelet_devicemanager::{DeviceManager, ResourcesSnapshot};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

use crate::error::ControlError;

/// Shared state of the control API handlers.
#[derive(Debug, Clone)]
pub struct ControlState {
    /// The device manager whose inventory is served.
    pub devices: DeviceManager,
}

/// The control API router.
pub fn router(state: ControlState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/resources", get(get_resources))
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "no such route") })
        .with_state(state)
}

async fn get_resources(State(state): State<ControlState>) -> Json<ResourcesSnapshot> {
    Json(state.devices.snapshot())
}

/// A JSON error body `{"error": message}`.
pub fn error_response(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
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
            Err(ControlError::Status {
                path: path.to_owned(),
                status: status.as_u16(),
                body: String::from_utf8_lossy(&bytes).into_owned(),
            })
        }
    }
}
