//! The control API's DRA routes (`/v1/dra`, `/v1/draobjects`, `/v1/resourceslices`,
//! `/v1/resourceclaims`): the seam that stands in for the API server in local mode (drivers
//! publish their ResourceSlices and read claims here; docs/dra.md). Each handler decodes,
//! calls the node's [`DraNode`] and encodes. `GET /v1/resourceslices` lists what the drivers
//! published for the node: to the node itself, or in cluster mode to the API server.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use devicelet_dra::SliceSource;
use devicelet_node::dra::{DraNode, DraSnapshot, Objects};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::{Deserialize, Serialize};

/// Where the node's ResourceSlices are listed in cluster mode (the API server).
#[derive(Clone)]
pub struct SliceLister(pub Arc<dyn SliceSource>);

impl std::fmt::Debug for SliceLister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SliceLister")
    }
}

/// `GET /v1/resourceslices`'s answer, shaped as the API server's list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceList {
    /// `resource.k8s.io/v1`.
    pub api_version: String,
    /// `ResourceSliceList`.
    pub kind: String,
    /// The slices, by driver, pool and name.
    pub items: Vec<ResourceSlice>,
}

impl ResourceSliceList {
    /// A list of `items`, sorted by driver, pool and name.
    pub fn new(mut items: Vec<ResourceSlice>) -> Self {
        items.sort_by(|a, b| {
            (&a.spec.driver, &a.spec.pool.name, &a.metadata.name).cmp(&(
                &b.spec.driver,
                &b.spec.pool.name,
                &b.metadata.name,
            ))
        });
        ResourceSliceList {
            api_version: "resource.k8s.io/v1".into(),
            kind: "ResourceSliceList".into(),
            items,
        }
    }
}

#[derive(Clone)]
struct SliceState {
    dra: Arc<DraNode>,
    cluster: Option<SliceLister>,
}

/// The DRA routes over `dra`; `cluster` lists the node's slices in cluster mode.
pub fn router(dra: &Arc<DraNode>, cluster: Option<SliceLister>) -> Router {
    let list = Router::new()
        .route("/v1/resourceslices", get(list_slices))
        .with_state(SliceState {
            dra: Arc::clone(dra),
            cluster,
        });
    Router::new()
        .route("/v1/dra", get(get_dra))
        .route("/v1/draobjects", post(apply_objects).get(list_objects))
        .route("/v1/resourceslices/{driver}", post(publish_slices))
        .route(
            "/v1/resourceclaims/{namespace}/{name}",
            get(get_claim).delete(delete_claim),
        )
        .with_state(Arc::clone(dra))
        .merge(list)
}

async fn list_slices(State(state): State<SliceState>) -> Response {
    match &state.cluster {
        Some(SliceLister(source)) => match source.node_slices().await {
            Ok(items) => Json(ResourceSliceList::new(items)).into_response(),
            Err(e) => err_json(
                StatusCode::BAD_GATEWAY,
                &format!("listing the node's ResourceSlices on the API server failed: {e}"),
            ),
        },
        None => Json(ResourceSliceList::new(state.dra.slices())).into_response(),
    }
}

fn err_json(status: StatusCode, message: &str) -> Response {
    super::response::error_response(status, message)
}

async fn get_dra(State(dra): State<Arc<DraNode>>) -> Json<DraSnapshot> {
    Json(dra.snapshot())
}

async fn apply_objects(
    State(dra): State<Arc<DraNode>>,
    Json(docs): Json<Vec<serde_json::Value>>,
) -> Response {
    match dra.apply(docs) {
        Ok(names) => Json(names).into_response(),
        Err(e) => err_json(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn list_objects(State(dra): State<Arc<DraNode>>) -> Json<Objects> {
    Json(dra.store().snapshot())
}

async fn publish_slices(
    State(dra): State<Arc<DraNode>>,
    UrlPath(driver): UrlPath<String>,
    Json(slices): Json<Vec<ResourceSlice>>,
) -> Response {
    match dra.publish(&driver, slices) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => err_json(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn get_claim(
    State(dra): State<Arc<DraNode>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    match dra.store().claim(&namespace, &name) {
        Some(c) => Json(c).into_response(),
        None => err_json(
            StatusCode::NOT_FOUND,
            &format!(
                "resourceclaims.resource.k8s.io \"{name}\" not found in namespace {namespace}"
            ),
        ),
    }
}

async fn delete_claim(
    State(dra): State<Arc<DraNode>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    match dra.delete_claim(&namespace, &name) {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => err_json(StatusCode::NOT_FOUND, "no such ResourceClaim"),
        Err(e) => err_json(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
