//! The claim cache's DRA metrics (spec dra-kubelet.md B15, as `pkg/kubelet/metrics` records them
//! for `pkg/kubelet/cm/dra/manager.go`): `dra_operations_duration_seconds`,
//! `dra_grpc_operations_duration_seconds` and `dra_resource_claims_in_use`.

use std::time::Duration;

use devicelet_metrics::Metrics;

use crate::client::grpc_code_name;
use crate::error::RpcCode;

use super::cache::ClaimCache;

impl ClaimCache {
    /// Records the DRA metrics (B15) into `metrics` from now on: `dra_operations_duration_seconds`
    /// per prepare/unprepare call, `dra_grpc_operations_duration_seconds` per driver RPC and
    /// `dra_resource_claims_in_use` (published at once, so restored claims count). Only the
    /// first call has an effect.
    pub fn set_metrics(&self, metrics: Metrics) {
        if self.shared.metrics.set(metrics).is_ok() {
            self.publish_in_use();
        }
    }

    fn publish_in_use(&self) {
        let Some(m) = self.shared.metrics.get() else {
            return;
        };
        let counts = self.claims_in_use();
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let total = counts.get("<any>").copied().unwrap_or_default();
        m.set_dra_claims_in_use(
            as_i64(total),
            counts
                .iter()
                .filter(|(d, _)| d.as_str() != "<any>")
                .map(|(d, n)| (d.as_str(), as_i64(*n))),
        );
    }

    /// `dra_operations_duration_seconds{operation_name, is_error}` plus the in-use gauge.
    pub(super) fn record_operation(&self, operation: &str, failed: bool, took: Duration) {
        if let Some(m) = self.shared.metrics.get() {
            m.dra_operation(operation, failed, took);
        }
        self.publish_in_use();
    }

    /// `dra_grpc_operations_duration_seconds{driver_name, method_name, grpc_status_code}`.
    pub(super) fn record_rpc(&self, driver: &str, method: &str, code: RpcCode, took: Duration) {
        if let Some(m) = self.shared.metrics.get() {
            m.dra_grpc_operation(driver, method, grpc_code_name(code), took);
        }
    }
}
