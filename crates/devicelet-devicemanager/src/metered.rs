//! A [`DevicePluginClient`] wrapper that times every call to a plugin into the node's
//! [`Metrics`]: `devicelet_device_plugin_rpc_duration_seconds{resource_name, method, code}` for
//! each method, and for `Allocate` also the kubelet's
//! `kubelet_device_plugin_alloc_duration_seconds{resource_name}` (`dm/endpoint.go` `allocate`
//! times the RPC only). A call abandoned by its caller's deadline is recorded with code
//! `DeadlineExceeded` when its future is dropped, so a frozen plugin shows up in the metrics.

use std::sync::Arc;
use std::time::Instant;

use devicelet_metrics::Metrics;
use futures::future::BoxFuture;

use crate::error::PluginError;
use crate::plugin::{DevicePluginClient, DeviceUpdateStream};
use crate::types::{ContainerAllocateResponse, DevicePluginOptions, PreferredAllocationRequest};

/// Times the calls of `inner` for `resource`.
pub(crate) struct MeteredClient {
    inner: Arc<dyn DevicePluginClient>,
    resource: String,
    metrics: Metrics,
}

impl MeteredClient {
    pub(crate) fn wrap(
        inner: Arc<dyn DevicePluginClient>,
        resource: &str,
        metrics: &Metrics,
    ) -> Arc<dyn DevicePluginClient> {
        Arc::new(MeteredClient {
            inner,
            resource: resource.to_owned(),
            metrics: metrics.clone(),
        })
    }

    fn timer(&self, method: &'static str) -> CallTimer<'_> {
        CallTimer {
            client: self,
            method,
            start: Instant::now(),
            done: false,
        }
    }
}

/// The gRPC code name of a failed plugin call.
pub(crate) fn error_code(err: &PluginError) -> &str {
    match err {
        PluginError::Rpc { code, .. } => code,
        PluginError::DeadlineExceeded(_) => "DeadlineExceeded",
        PluginError::Connect(_) => "Unavailable",
        PluginError::InvalidResponse(_) => "InvalidResponse",
        PluginError::OverLimit { .. } => "OverLimit",
    }
}

struct CallTimer<'a> {
    client: &'a MeteredClient,
    method: &'static str,
    start: Instant,
    done: bool,
}

impl CallTimer<'_> {
    fn finish<T>(mut self, result: &Result<T, PluginError>) {
        self.done = true;
        let code = result.as_ref().err().map_or("OK", error_code);
        self.record(code);
    }

    fn record(&self, code: &str) {
        let took = self.start.elapsed();
        let c = self.client;
        c.metrics
            .device_plugin_rpc(&c.resource, self.method, code, took);
        if self.method == "Allocate" {
            c.metrics.device_plugin_allocation(&c.resource, took);
        }
    }
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.record("DeadlineExceeded");
        }
    }
}

impl DevicePluginClient for MeteredClient {
    fn get_device_plugin_options(&self) -> BoxFuture<'_, Result<DevicePluginOptions, PluginError>> {
        Box::pin(async move {
            let timer = self.timer("GetDevicePluginOptions");
            let result = self.inner.get_device_plugin_options().await;
            timer.finish(&result);
            result
        })
    }

    fn list_and_watch(&self) -> BoxFuture<'_, Result<DeviceUpdateStream, PluginError>> {
        Box::pin(async move {
            let timer = self.timer("ListAndWatch");
            let result = self.inner.list_and_watch().await;
            timer.finish(&result);
            result
        })
    }

    fn allocate(
        &self,
        container_device_ids: Vec<Vec<String>>,
    ) -> BoxFuture<'_, Result<Vec<ContainerAllocateResponse>, PluginError>> {
        Box::pin(async move {
            let timer = self.timer("Allocate");
            let result = self.inner.allocate(container_device_ids).await;
            timer.finish(&result);
            result
        })
    }

    fn get_preferred_allocation(
        &self,
        requests: Vec<PreferredAllocationRequest>,
    ) -> BoxFuture<'_, Result<Vec<Vec<String>>, PluginError>> {
        Box::pin(async move {
            let timer = self.timer("GetPreferredAllocation");
            let result = self.inner.get_preferred_allocation(requests).await;
            timer.finish(&result);
            result
        })
    }

    fn pre_start_container(
        &self,
        device_ids: Vec<String>,
    ) -> BoxFuture<'_, Result<(), PluginError>> {
        Box::pin(async move {
            let timer = self.timer("PreStartContainer");
            let result = self.inner.pre_start_container(device_ids).await;
            timer.finish(&result);
            result
        })
    }
}
