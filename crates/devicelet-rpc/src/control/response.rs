//! The control API's error body (`{"error": "..."}`), shared by every route.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A JSON error body `{"error": message}`.
pub fn error_response(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}
