//! The `/metrics` endpoint of `devicelet serve --metrics-address` (the kubelet serves its
//! metrics the same way, `pkg/kubelet/server/server.go` `/metrics`): refreshes the inventory
//! gauges from the [`DeviceManager`] and renders the node's [`Metrics`]. Prometheus text format
//! 0.0.4 by default; OpenMetrics when the scraper's `Accept` asks for it.

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use axum::routing::get;
use devicelet_devicemanager::{DeviceManager, HEALTHY};
use devicelet_metrics::{Metrics, OPENMETRICS_CONTENT_TYPE, ResourceFigures, TEXT_CONTENT_TYPE};
use tokio::net::TcpListener;

use crate::error::RpcError;

/// The default `--metrics-address`: loopback on the kubelet's read-only port, where the
/// kubelet's node e2e tests scrape `/metrics`.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:10255";

/// Sets the per-resource gauges (capacity, allocatable, allocated, unhealthy) from the
/// manager's inventory.
pub fn refresh_resource_gauges(manager: &DeviceManager) {
    let snapshot = manager.snapshot();
    manager
        .metrics()
        .set_resources(snapshot.resources.iter().map(|r| {
            let unhealthy = r.devices.iter().filter(|d| d.health != HEALTHY).count();
            (
                r.name.as_str(),
                ResourceFigures {
                    capacity: gauge(r.capacity),
                    allocatable: gauge(r.allocatable),
                    allocated: gauge(r.allocated),
                    unhealthy: gauge(unhealthy as u64),
                },
            )
        }));
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// One scrape in the Prometheus text format.
pub fn scrape(manager: &DeviceManager) -> String {
    refresh_resource_gauges(manager);
    manager.metrics().encode()
}

async fn serve_metrics(
    State(manager): State<DeviceManager>,
    headers: HeaderMap,
) -> impl IntoResponse {
    refresh_resource_gauges(&manager);
    let metrics: &Metrics = manager.metrics();
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            metrics.encode_openmetrics(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)],
            metrics.encode(),
        )
    }
}

/// A bound metrics listener; [`MetricsServer::serve`] runs it.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    manager: DeviceManager,
}

impl MetricsServer {
    /// Binds `address` (port 0 picks a free port).
    pub async fn bind(address: SocketAddr, manager: DeviceManager) -> Result<Self, RpcError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| RpcError::MetricsBind { address, source })?;
        Ok(MetricsServer { listener, manager })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves `GET /metrics` until the task is dropped or aborted.
    pub async fn serve(self) -> Result<(), RpcError> {
        let address = self.local_addr();
        let app = axum::Router::new()
            .route("/metrics", get(serve_metrics))
            .with_state(self.manager);
        axum::serve(self.listener, app)
            .await
            .map_err(|e| RpcError::MetricsServe {
                address: address.map(|a| a.to_string()).unwrap_or_default(),
                message: e.to_string(),
            })
    }
}
