//! devicelet-metrics: the node's Prometheus metrics, one cloneable [`Metrics`] handle that every
//! manager records into and `devicelet serve --metrics-address` renders.
//!
//! Names, labels, help texts and buckets of the kubelet's own metrics follow
//! `pkg/kubelet/metrics/metrics.go` (device plugins, PodResources, Topology and CPU managers)
//! and the DRA manager's `pkg/kubelet/cm/dra/metrics` (spec dra-kubelet.md B15), so dashboards
//! and alerts written for a kubelet work unchanged. Help texts carry the `[ALPHA]` prefix the
//! kubelet's component-base adds. devicelet's own metrics are prefixed `devicelet_`.
//!
//! prometheus-client renders OpenMetrics, where every counter sample ends in `_total` (as
//! client_golang's OpenMetrics output does). [`Metrics::encode`] turns that into the Prometheus
//! text format 0.0.4 the kubelet serves by default, with every kubelet metric under its exact
//! kubelet name and type: counters the kubelet names without `_total`
//! (`kubelet_pod_resources_endpoint_requests_list`,
//! `kubelet_container_aligned_compute_resources_count`, ... see [`KUBELET_BARE_COUNTERS`]) keep
//! their bare name there. Those names (and `kubelet_topology_manager_admission_duration_ms`)
//! fail promtool's lint exactly as the kubelet's own do; upstream exempts them in
//! `component-base/metrics/testutil/promlint.go`. devicelet's own metrics are lint-clean.
//!
//! There is no global registry: a [`Metrics`] is created by whoever wires the node (the daemon)
//! and handed to each manager; clones share every series. Recording is lock-free per series
//! after its first use and never fails.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::encode`]'s output (Prometheus text format 0.0.4).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `Content-Type` of [`Metrics::encode_openmetrics`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counters the kubelet names without `_total` (`pkg/kubelet/metrics/metrics.go`): in the text
/// format their samples carry exactly this name, not `<name>_total`.
pub const KUBELET_BARE_COUNTERS: [&str; 8] = [
    "kubelet_pod_resources_endpoint_requests_list",
    "kubelet_pod_resources_endpoint_requests_get_allocatable",
    "kubelet_pod_resources_endpoint_requests_get",
    "kubelet_pod_resources_endpoint_errors_list",
    "kubelet_pod_resources_endpoint_errors_get_allocatable",
    "kubelet_pod_resources_endpoint_errors_get",
    "kubelet_container_aligned_compute_resources_count",
    "kubelet_container_aligned_compute_resources_failure_count",
];

/// client_golang's `DefBuckets`, used by the kubelet's device-plugin allocation histogram.
pub const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets of devicelet's checkpoint write histogram: 100 µs to ~3 s (one fsync is ≈4 ms on
/// a laptop disk, ≈0.1 ms on NVMe with a write cache).
fn checkpoint_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// `ExponentialBucketsRange(0.1, 40, 15)`: the DRA histograms (0.1 s … 40 s).
fn dra_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets_range(0.1, 40.0, 15))
}

fn def_buckets() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}

/// Buckets for calls that usually take well under a millisecond (plugin RPCs over a local
/// socket, admissions): 50 µs to ~1.6 s.
fn fast_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// `ExponentialBuckets(.05, 2, 15)`: `kubelet_topology_manager_admission_duration_ms`
/// (0.05 ms … 819.2 ms).
fn topology_admission_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 15))
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// `{resource_name}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource_name: String,
}

/// `{server_api_version}` of the PodResources counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiVersionLabel {
    server_api_version: String,
}

/// `{boundary, scope}` of `kubelet_container_aligned_compute_resources_*count` (the kubelet's
/// text output sorts label names, so `boundary` comes first).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlignLabels {
    boundary: String,
    scope: String,
}

/// `scope` label of the aligned-compute-resources counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignScope {
    /// Topology Manager scope `container`, or the CPU manager (always per container).
    Container,
    /// Topology Manager scope `pod`.
    Pod,
}

/// `boundary` label of the aligned-compute-resources counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignBoundary {
    /// Topology Manager `single-numa-node`.
    NumaNode,
    /// CPU manager `full-pcpus-only`.
    PhysicalCpu,
}

fn align_labels(scope: AlignScope, boundary: AlignBoundary) -> AlignLabels {
    AlignLabels {
        boundary: match boundary {
            AlignBoundary::NumaNode => "numa_node",
            AlignBoundary::PhysicalCpu => "physical_cpu",
        }
        .to_owned(),
        scope: match scope {
            AlignScope::Container => "container",
            AlignScope::Pod => "pod",
        }
        .to_owned(),
    }
}

/// `{operation_type}` of the kubelet's `runtime_operations_*` (the CRI method in snake case,
/// `run_podsandbox`, `create_container`, ...).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationTypeLabel {
    operation_type: String,
}

/// `{container_type}` of `kubelet_started_containers_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerTypeLabel {
    container_type: String,
}

/// `{code, container_type}` of `kubelet_started_containers_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartErrorLabels {
    code: String,
    container_type: String,
}

/// `{operation_name, is_error}` of `dra_operations_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DraOperationLabels {
    operation_name: String,
    is_error: String,
}

/// `{driver_name, method_name, grpc_status_code}` of `dra_grpc_operations_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DraGrpcLabels {
    driver_name: String,
    method_name: String,
    grpc_status_code: String,
}

/// `{driver_name}` of `dra_resource_claims_in_use`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriverLabel {
    driver_name: String,
}

/// `{reason}` of `devicelet_pod_rejections_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// `{operation, reason}` of `devicelet_api_server_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    operation: String,
    reason: String,
}

/// `{node}` of `kubelet_node_name`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

/// `{stage}` of `devicelet_pod_start_stage_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

/// 100 µs to ~52 s: pod start-up stages range from a cached write to a claim that waits.
fn pod_start_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// `{checkpoint}` of `devicelet_checkpoint_write_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckpointLabel {
    checkpoint: String,
}

/// `{resource_name, method, code}` of `devicelet_device_plugin_rpc_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginRpcLabels {
    resource_name: String,
    method: String,
    code: String,
}

/// PodResources API version, the `server_api_version` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodResourcesVersion {
    /// `v1`.
    V1,
    /// `v1alpha1`.
    V1alpha1,
}

impl PodResourcesVersion {
    fn label(self) -> &'static str {
        match self {
            PodResourcesVersion::V1 => "v1",
            PodResourcesVersion::V1alpha1 => "v1alpha1",
        }
    }
}

/// PodResources method, selecting the per-method request and error counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodResourcesMethod {
    /// `List`.
    List,
    /// `GetAllocatableResources`.
    GetAllocatableResources,
    /// `Get`.
    Get,
}

/// Per-resource inventory figures, published as gauges (see [`Metrics::set_resources`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceFigures {
    /// Devices advertised (`GetCapacity` capacity).
    pub capacity: i64,
    /// Healthy devices while the plugin is connected (`GetCapacity` allocatable).
    pub allocatable: i64,
    /// Devices held by admitted containers.
    pub allocated: i64,
    /// Devices the plugin reports as not `Healthy`.
    pub unhealthy: i64,
}

struct Families {
    // kubelet: device plugins
    dp_registration: Family<ResourceLabel, Counter>,
    dp_alloc_duration: HistogramFamily<ResourceLabel>,
    // kubelet: PodResources
    pr_requests_total: Family<ApiVersionLabel, Counter>,
    pr_requests_list: Family<ApiVersionLabel, Counter>,
    pr_requests_get_allocatable: Family<ApiVersionLabel, Counter>,
    pr_requests_get: Family<ApiVersionLabel, Counter>,
    pr_errors_list: Family<ApiVersionLabel, Counter>,
    pr_errors_get_allocatable: Family<ApiVersionLabel, Counter>,
    pr_errors_get: Family<ApiVersionLabel, Counter>,
    // kubelet: Topology and CPU managers
    tm_admission_requests: Counter,
    tm_admission_errors: Counter,
    tm_admission_duration: Histogram,
    aligned: Family<AlignLabels, Counter>,
    aligned_failures: Family<AlignLabels, Counter>,
    cpu_pinning_requests: Counter,
    cpu_pinning_errors: Counter,
    memory_pinning_requests: Counter,
    memory_pinning_errors: Counter,
    // kubelet: DRA
    dra_operations: HistogramFamily<DraOperationLabels>,
    dra_grpc_operations: HistogramFamily<DraGrpcLabels>,
    dra_claims_in_use: Family<DriverLabel, Gauge>,
    // kubelet: container runtime
    runtime_operations: Family<OperationTypeLabel, Counter>,
    runtime_operation_errors: Family<OperationTypeLabel, Counter>,
    runtime_operation_duration: HistogramFamily<OperationTypeLabel>,
    started_containers: Family<ContainerTypeLabel, Counter>,
    started_container_errors: Family<StartErrorLabels, Counter>,
    // devicelet
    admissions: Counter,
    admission_duration: Histogram,
    rejections: Family<ReasonLabel, Counter>,
    node_name: Family<NodeLabel, Gauge>,
    api_errors: Family<ApiErrorLabels, Counter>,
    pod_watch_errors: Counter,
    checkpoint_write: HistogramFamily<CheckpointLabel>,
    pod_start_stage: HistogramFamily<StageLabel>,
    pod_start: Histogram,
    pod_start_own: Histogram,
    checkpoint_errors: Family<CheckpointLabel, Counter>,
    plugin_rpc: HistogramFamily<PluginRpcLabels>,
    capacity: Family<ResourceLabel, Gauge>,
    allocatable: Family<ResourceLabel, Gauge>,
    allocated: Family<ResourceLabel, Gauge>,
    unhealthy: Family<ResourceLabel, Gauge>,
}

struct Inner {
    registry: Registry,
    families: Families,
}

/// The node's metrics. Cheap to clone; clones share every series.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

impl Metrics {
    /// A fresh registry with every metric registered (and no series yet).
    pub fn new() -> Self {
        let f = Families {
            dp_registration: Family::default(),
            dp_alloc_duration: Family::new_with_constructor(def_buckets),
            pr_requests_total: Family::default(),
            pr_requests_list: Family::default(),
            pr_requests_get_allocatable: Family::default(),
            pr_requests_get: Family::default(),
            pr_errors_list: Family::default(),
            pr_errors_get_allocatable: Family::default(),
            pr_errors_get: Family::default(),
            tm_admission_requests: Counter::default(),
            tm_admission_errors: Counter::default(),
            tm_admission_duration: topology_admission_buckets(),
            aligned: Family::default(),
            aligned_failures: Family::default(),
            cpu_pinning_requests: Counter::default(),
            cpu_pinning_errors: Counter::default(),
            memory_pinning_requests: Counter::default(),
            memory_pinning_errors: Counter::default(),
            dra_operations: Family::new_with_constructor(dra_buckets),
            runtime_operations: Family::default(),
            runtime_operation_errors: Family::default(),
            runtime_operation_duration: Family::new_with_constructor(def_buckets),
            started_containers: Family::default(),
            started_container_errors: Family::default(),
            dra_grpc_operations: Family::new_with_constructor(dra_buckets),
            dra_claims_in_use: Family::default(),
            admissions: Counter::default(),
            admission_duration: fast_buckets(),
            rejections: Family::default(),
            node_name: Family::default(),
            api_errors: Family::default(),
            pod_watch_errors: Counter::default(),
            checkpoint_write: Family::new_with_constructor(checkpoint_buckets),
            pod_start_stage: Family::new_with_constructor(pod_start_buckets),
            pod_start: pod_start_buckets(),
            pod_start_own: pod_start_buckets(),
            checkpoint_errors: Family::default(),
            plugin_rpc: Family::new_with_constructor(fast_buckets),
            capacity: Family::default(),
            allocatable: Family::default(),
            allocated: Family::default(),
            unhealthy: Family::default(),
        };
        let mut r = Registry::default();
        // Counter names are registered without `_total`; the encoder appends it.
        r.register(
            "kubelet_device_plugin_registration",
            alpha("Cumulative number of device plugin registrations. Broken down by resource name"),
            f.dp_registration.clone(),
        );
        r.register(
            "kubelet_device_plugin_alloc_duration_seconds",
            alpha("Duration in seconds to serve a device plugin Allocation request. Broken down by resource name"),
            f.dp_alloc_duration.clone(),
        );
        for (name, help, family) in [
            (
                "kubelet_pod_resources_endpoint_requests",
                "Cumulative number of requests to the PodResource endpoint. Broken down by server api version",
                &f.pr_requests_total,
            ),
            (
                "kubelet_pod_resources_endpoint_requests_list",
                "Number of requests to the PodResource List endpoint. Broken down by server api version",
                &f.pr_requests_list,
            ),
            (
                "kubelet_pod_resources_endpoint_requests_get_allocatable",
                "Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version",
                &f.pr_requests_get_allocatable,
            ),
            (
                "kubelet_pod_resources_endpoint_errors_list",
                "Number of requests to the PodResource List endpoint which returned error. Broken down by server api version",
                &f.pr_errors_list,
            ),
            (
                "kubelet_pod_resources_endpoint_errors_get_allocatable",
                "Number of requests to the PodResource GetAllocatableResources endpoint which returned error. Broken down by server api version",
                &f.pr_errors_get_allocatable,
            ),
            (
                "kubelet_pod_resources_endpoint_requests_get",
                "Number of requests to the PodResource Get endpoint. Broken down by server api version",
                &f.pr_requests_get,
            ),
            (
                "kubelet_pod_resources_endpoint_errors_get",
                "Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version",
                &f.pr_errors_get,
            ),
        ] {
            r.register(name, alpha(help), family.clone());
        }
        r.register(
            "kubelet_topology_manager_admission_requests",
            alpha("The number of admission requests where resources have to be aligned"),
            f.tm_admission_requests.clone(),
        );
        r.register(
            "kubelet_topology_manager_admission_errors",
            alpha("The number of admission request failures where resources could not be aligned"),
            f.tm_admission_errors.clone(),
        );
        r.register(
            "kubelet_topology_manager_admission_duration_ms",
            alpha("Duration in milliseconds to serve a pod admission request"),
            f.tm_admission_duration.clone(),
        );
        r.register(
            "kubelet_container_aligned_compute_resources_count",
            alpha("Cumulative number of aligned compute resources allocated to containers by alignment type"),
            f.aligned.clone(),
        );
        r.register(
            "kubelet_container_aligned_compute_resources_failure_count",
            alpha("Cumulative number of failures to allocate aligned compute resources to containers by alignment type"),
            f.aligned_failures.clone(),
        );
        // The kubelet's topology manager (always created) makes these four series exist at
        // zero from the start (`topology_manager.go` initializeMetrics).
        for scope in [AlignScope::Container, AlignScope::Pod] {
            let labels = align_labels(scope, AlignBoundary::NumaNode);
            drop(f.aligned.get_or_create(&labels));
            drop(f.aligned_failures.get_or_create(&labels));
        }
        r.register(
            "kubelet_cpu_manager_pinning_requests",
            alpha("The number of cpu core allocations which required pinning"),
            f.cpu_pinning_requests.clone(),
        );
        r.register(
            "kubelet_cpu_manager_pinning_errors",
            alpha("The number of cpu core allocations which required pinning failed"),
            f.cpu_pinning_errors.clone(),
        );
        r.register(
            "kubelet_memory_manager_pinning_requests",
            alpha("The number of memory pages allocations which required pinning."),
            f.memory_pinning_requests.clone(),
        );
        r.register(
            "kubelet_memory_manager_pinning_errors",
            alpha("The number of memory pages allocations which required pinning that failed."),
            f.memory_pinning_errors.clone(),
        );
        r.register(
            "kubelet_runtime_operations",
            alpha("Cumulative number of runtime operations by operation type"),
            f.runtime_operations.clone(),
        );
        r.register(
            "kubelet_runtime_operations_errors",
            alpha("Cumulative number of runtime operation errors by operation type"),
            f.runtime_operation_errors.clone(),
        );
        r.register(
            "kubelet_runtime_operations_duration_seconds",
            alpha("Duration in seconds of runtime operations. Broken down by operation type"),
            f.runtime_operation_duration.clone(),
        );
        r.register(
            "kubelet_started_containers",
            alpha("Cumulative number of containers started"),
            f.started_containers.clone(),
        );
        r.register(
            "kubelet_started_containers_errors",
            alpha("Cumulative number of errors when starting containers"),
            f.started_container_errors.clone(),
        );
        r.register(
            "dra_operations_duration_seconds",
            alpha("Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count"),
            f.dra_operations.clone(),
        );
        r.register(
            "dra_grpc_operations_duration_seconds",
            alpha("Duration in seconds of the DRA gRPC operations"),
            f.dra_grpc_operations.clone(),
        );
        r.register(
            "dra_resource_claims_in_use",
            alpha("The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name"),
            f.dra_claims_in_use.clone(),
        );
        r.register(
            "devicelet_pod_admissions",
            "Pods admitted (devices allocated to every container)",
            f.admissions.clone(),
        );
        r.register(
            "devicelet_pod_admission_duration_seconds",
            "Duration in seconds of a successful pod admission, including plugin Allocate calls and the durable commit",
            f.admission_duration.clone(),
        );
        r.register(
            "devicelet_pod_rejections",
            "Pods refused at admission, by reason",
            f.rejections.clone(),
        );
        r.register(
            "kubelet_node_name",
            "The node's name. The count is always 1.",
            f.node_name.clone(),
        );
        r.register(
            "devicelet_api_server_errors",
            "Failed API server calls in cluster mode, by operation and reason (denied: the node identity lacks the permission; deadline: no answer in time)",
            f.api_errors.clone(),
        );
        r.register(
            "devicelet_pod_watch_errors",
            "Errors of the watch of the pods bound to this node (each is retried with back-off; 410 Gone relists)",
            f.pod_watch_errors.clone(),
        );
        r.register(
            "devicelet_pod_start_stage_duration_seconds",
            "Duration in seconds of each stage of a pod's start in cluster mode, from the node first seeing the bound pod to its Running status written: claim_wait (until its claims could be prepared), claim_get, driver_prepare (the DRA drivers' own time), plugin_allocate (the device plugins' own time), checkpoint_write, admission (devices, CPUs, memory), status_write",
            f.pod_start_stage.clone(),
        );
        r.register(
            "devicelet_pod_start_duration_seconds",
            "Duration in seconds from the node first seeing a bound pod to its Running status written, in cluster mode",
            f.pod_start.clone(),
        );
        r.register(
            "devicelet_pod_start_own_duration_seconds",
            "devicelet_pod_start_duration_seconds minus the DRA drivers' NodePrepareResources and the device plugins' Allocate time: devicelet's share of a pod's start",
            f.pod_start_own.clone(),
        );
        r.register(
            "devicelet_checkpoint_write_duration_seconds",
            "Duration in seconds of one durable checkpoint write (data and directory fsync), by checkpoint file",
            f.checkpoint_write.clone(),
        );
        r.register(
            "devicelet_checkpoint_errors",
            "Failed reads (corrupt, unknown version) and writes (e.g. a full disk) of a checkpoint; device state that cannot be read refuses admission",
            f.checkpoint_errors.clone(),
        );
        r.register(
            "devicelet_device_plugin_rpc_duration_seconds",
            "Duration in seconds of calls to device plugins, by resource, gRPC method and result code",
            f.plugin_rpc.clone(),
        );
        r.register(
            "devicelet_device_plugin_capacity",
            "Devices advertised per resource (GetCapacity capacity)",
            f.capacity.clone(),
        );
        r.register(
            "devicelet_device_plugin_allocatable",
            "Healthy devices per resource while the plugin is connected (GetCapacity allocatable)",
            f.allocatable.clone(),
        );
        r.register(
            "devicelet_device_plugin_allocated",
            "Devices per resource held by admitted containers",
            f.allocated.clone(),
        );
        r.register(
            "devicelet_device_plugin_unhealthy",
            "Devices per resource the plugin reports as not Healthy",
            f.unhealthy.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry: r,
                families: f,
            }),
        }
    }

    fn f(&self) -> &Families {
        &self.inner.families
    }

    /// Every metric in the OpenMetrics text format ([`OPENMETRICS_CONTENT_TYPE`], ends with
    /// `# EOF`).
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail, and our label types cannot produce an encoder
        // error; should one ever happen the scrape still ends properly.
        if prometheus_client::encoding::text::encode(&mut out, &self.inner.registry).is_err() {
            out.push_str("# EOF\n");
        }
        out
    }

    /// Every metric in the Prometheus text format 0.0.4 ([`TEXT_CONTENT_TYPE`]), what
    /// `promtool check metrics` reads and what the kubelet serves by default. Counters are
    /// named with their `_total` suffix on the `# HELP`/`# TYPE` lines too.
    pub fn encode(&self) -> String {
        openmetrics_to_text(&self.encode_openmetrics())
    }

    // ---- kubelet: device plugins -----------------------------------------------------------

    /// `kubelet_device_plugin_registration_total{resource_name}`: a `Register` call arrived on
    /// `kubelet.sock` (counted before validation, as the kubelet does).
    pub fn device_plugin_registration(&self, resource: &str) {
        self.f()
            .dp_registration
            .get_or_create(&resource_label(resource))
            .inc();
    }

    /// `kubelet_device_plugin_alloc_duration_seconds{resource_name}`: one `Allocate` RPC.
    pub fn device_plugin_allocation(&self, resource: &str, took: Duration) {
        self.f()
            .dp_alloc_duration
            .get_or_create(&resource_label(resource))
            .observe(took.as_secs_f64());
    }

    // ---- kubelet: PodResources -------------------------------------------------------------

    /// A PodResources call that passed the rate limiter: `..._requests_total` and the
    /// per-method request counter, plus the per-method error counter when `failed`.
    pub fn pod_resources_request(
        &self,
        version: PodResourcesVersion,
        method: PodResourcesMethod,
        failed: bool,
    ) {
        let f = self.f();
        let label = ApiVersionLabel {
            server_api_version: version.label().to_owned(),
        };
        f.pr_requests_total.get_or_create(&label).inc();
        let (requests, errors) = match method {
            PodResourcesMethod::List => (&f.pr_requests_list, &f.pr_errors_list),
            PodResourcesMethod::GetAllocatableResources => {
                (&f.pr_requests_get_allocatable, &f.pr_errors_get_allocatable)
            }
            PodResourcesMethod::Get => (&f.pr_requests_get, &f.pr_errors_get),
        };
        requests.get_or_create(&label).inc();
        if failed {
            errors.get_or_create(&label).inc();
        }
    }

    // ---- kubelet: Topology and CPU managers ------------------------------------------------

    /// One Topology Manager admission, as the kubelet's `Admit` counts it (every pod, any
    /// policy): `kubelet_topology_manager_admission_requests_total`, `..._errors_total` when
    /// it was refused or an allocation failed, and `kubelet_topology_manager_admission_duration_ms`.
    /// Upstream observes whole milliseconds (`Duration.Milliseconds()`); we keep the fraction,
    /// since devicelet's admissions are mostly well under 1 ms.
    pub fn topology_admission(&self, failed: bool, took: Duration) {
        let f = self.f();
        f.tm_admission_requests.inc();
        if failed {
            f.tm_admission_errors.inc();
        }
        f.tm_admission_duration.observe(took.as_secs_f64() * 1000.0);
    }

    /// `kubelet_container_aligned_compute_resources_count{boundary, scope}` (or
    /// `..._failure_count` when `failed`): an allocation whose alignment is guaranteed
    /// (`single-numa-node`: NUMA; `full-pcpus-only`: physical CPUs) succeeded or failed.
    pub fn aligned_compute_resources(
        &self,
        scope: AlignScope,
        boundary: AlignBoundary,
        failed: bool,
    ) {
        let f = self.f();
        let family = if failed {
            &f.aligned_failures
        } else {
            &f.aligned
        };
        family.get_or_create(&align_labels(scope, boundary)).inc();
    }

    /// One CPU manager allocation that required pinning.
    pub fn cpu_pinning(&self, failed: bool) {
        let f = self.f();
        f.cpu_pinning_requests.inc();
        if failed {
            f.cpu_pinning_errors.inc();
        }
    }

    /// One Static memory manager allocation for a Guaranteed pod's container
    /// (`memory_manager_pinning_requests_total`, `..._errors_total`).
    pub fn memory_pinning(&self, failed: bool) {
        let f = self.f();
        f.memory_pinning_requests.inc();
        if failed {
            f.memory_pinning_errors.inc();
        }
    }

    // ---- kubelet: DRA ----------------------------------------------------------------------

    /// `dra_operations_duration_seconds{operation_name, is_error}`: handling all claims of a
    /// pod; `operation` is `PrepareResources` or `UnprepareResources`.
    pub fn dra_operation(&self, operation: &str, failed: bool, took: Duration) {
        self.f()
            .dra_operations
            .get_or_create(&DraOperationLabels {
                operation_name: operation.to_owned(),
                is_error: failed.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// `dra_grpc_operations_duration_seconds{driver_name, method_name, grpc_status_code}`: one
    /// unary RPC to a DRA driver; `method` is the full gRPC path
    /// (`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`), `code` the gRPC
    /// code name (`OK`, `DeadlineExceeded`, ...).
    pub fn dra_grpc_operation(&self, driver: &str, method: &str, code: &str, took: Duration) {
        self.f()
            .dra_grpc_operations
            .get_or_create(&DraGrpcLabels {
                driver_name: driver.to_owned(),
                method_name: method.to_owned(),
                grpc_status_code: code.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// `dra_resource_claims_in_use{driver_name}`: sets the prepared-claim counts. `total` is
    /// the `<any>` series (always present); drivers missing from `per_driver` are dropped.
    pub fn set_dra_claims_in_use<'a>(
        &self,
        total: i64,
        per_driver: impl IntoIterator<Item = (&'a str, i64)>,
    ) {
        let family = &self.f().dra_claims_in_use;
        family.clear();
        family
            .get_or_create(&DriverLabel {
                driver_name: "<any>".to_owned(),
            })
            .set(total);
        for (driver, count) in per_driver {
            family
                .get_or_create(&DriverLabel {
                    driver_name: driver.to_owned(),
                })
                .set(count);
        }
    }

    // ---- devicelet -------------------------------------------------------------------------

    /// `devicelet_pod_admissions_total` and `devicelet_pod_admission_duration_seconds`.
    pub fn pod_admitted(&self, took: Duration) {
        let f = self.f();
        f.admissions.inc();
        f.admission_duration.observe(took.as_secs_f64());
    }

    /// `devicelet_pod_rejections_total{reason}`; `reason` is a short CamelCase word as the
    /// kubelet uses for pod status reasons (`UnexpectedAdmissionError`, `TopologyAffinityError`,
    /// `UnknownResource`, ...).
    pub fn pod_rejected(&self, reason: &str) {
        self.f()
            .rejections
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    // ---- kubelet: container runtime (serve --runtime cri) ---------------------------------

    /// `kubelet_runtime_operations_total`, `..._errors_total` and
    /// `..._duration_seconds{operation_type}`: one CRI call; `operation` is the kubelet's
    /// operation type (`run_podsandbox`, `create_container`, `start_container`, ...).
    pub fn runtime_operation(&self, operation: &str, failed: bool, took: Duration) {
        let label = OperationTypeLabel {
            operation_type: operation.to_owned(),
        };
        let f = self.f();
        f.runtime_operations.get_or_create(&label).inc();
        if failed {
            f.runtime_operation_errors.get_or_create(&label).inc();
        }
        f.runtime_operation_duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    /// `kubelet_started_containers_total{container_type}` and, with an error `code` (the
    /// kubelet's waiting reason, e.g. `CreateContainerConfigError`),
    /// `kubelet_started_containers_errors_total{code, container_type}`; `container_type` is
    /// `container` or `init_container`.
    pub fn container_started(&self, container_type: &str, error: Option<&str>) {
        let f = self.f();
        f.started_containers
            .get_or_create(&ContainerTypeLabel {
                container_type: container_type.to_owned(),
            })
            .inc();
        if let Some(code) = error {
            f.started_container_errors
                .get_or_create(&StartErrorLabels {
                    code: code.to_owned(),
                    container_type: container_type.to_owned(),
                })
                .inc();
        }
    }

    // ---- cluster mode ----------------------------------------------------------------------

    /// `kubelet_node_name{node}` = 1: this process is node `node` of a cluster.
    pub fn set_node_name(&self, node: &str) {
        self.f()
            .node_name
            .get_or_create(&NodeLabel {
                node: node.to_owned(),
            })
            .set(1);
    }

    /// `devicelet_api_server_errors_total{operation, reason}`: an API server call failed;
    /// `operation` is a fixed word (`node_status`, `lease`, `pod_status`, ...), `reason` one of
    /// `denied`, `not_found`, `conflict`, `throttled`, `server_error`, `deadline`, `other`.
    pub fn api_server_error(&self, operation: &str, reason: &str) {
        self.f()
            .api_errors
            .get_or_create(&ApiErrorLabels {
                operation: operation.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// `devicelet_pod_start_stage_duration_seconds{stage}`: one stage of a pod's start.
    pub fn pod_start_stage(&self, stage: &str, took: Duration) {
        self.f()
            .pod_start_stage
            .get_or_create(&StageLabel {
                stage: stage.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// `devicelet_pod_start_duration_seconds` (`total`) and
    /// `devicelet_pod_start_own_duration_seconds` (`own`, without the drivers' time).
    pub fn pod_started(&self, total: Duration, own: Duration) {
        let f = self.f();
        f.pod_start.observe(total.as_secs_f64());
        f.pod_start_own.observe(own.as_secs_f64());
    }

    /// `devicelet_pod_watch_errors_total`: the watch of the node's pods failed once.
    pub fn pod_watch_error(&self) {
        self.f().pod_watch_errors.inc();
    }

    /// `devicelet_checkpoint_write_duration_seconds{checkpoint}`: one durable write of the
    /// named checkpoint (`kubelet_internal_checkpoint`, `dra_manager_state`, ...).
    pub fn checkpoint_write(&self, checkpoint: &str, took: Duration) {
        self.f()
            .checkpoint_write
            .get_or_create(&CheckpointLabel {
                checkpoint: checkpoint.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// `devicelet_checkpoint_errors_total{checkpoint}`: a checkpoint could not be read or written.
    pub fn checkpoint_error(&self, checkpoint: &str) {
        self.f()
            .checkpoint_errors
            .get_or_create(&CheckpointLabel {
                checkpoint: checkpoint.to_owned(),
            })
            .inc();
    }

    /// `devicelet_device_plugin_rpc_duration_seconds{resource_name, method, code}`: one call to
    /// a device plugin (`method` like `Allocate`; `code` `OK` or the failure's gRPC code name).
    pub fn device_plugin_rpc(&self, resource: &str, method: &str, code: &str, took: Duration) {
        self.f()
            .plugin_rpc
            .get_or_create(&PluginRpcLabels {
                resource_name: resource.to_owned(),
                method: method.to_owned(),
                code: code.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Replaces the per-resource inventory gauges (`devicelet_device_plugin_capacity`,
    /// `_allocatable`, `_allocated`, `_unhealthy`); resources not listed disappear.
    pub fn set_resources<'a>(
        &self,
        resources: impl IntoIterator<Item = (&'a str, ResourceFigures)>,
    ) {
        let f = self.f();
        for family in [&f.capacity, &f.allocatable, &f.allocated, &f.unhealthy] {
            family.clear();
        }
        for (resource, figures) in resources {
            let label = resource_label(resource);
            f.capacity.get_or_create(&label).set(figures.capacity);
            f.allocatable.get_or_create(&label).set(figures.allocatable);
            f.allocated.get_or_create(&label).set(figures.allocated);
            f.unhealthy.get_or_create(&label).set(figures.unhealthy);
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text into the Prometheus text format 0.0.4: drops
/// `# EOF` and `# UNIT`, and gives counter families their sample name (`x_total`) on the
/// `# HELP`/`# TYPE` lines, since the 0.0.4 parser ties samples to families by exact name;
/// the kubelet's [`KUBELET_BARE_COUNTERS`] instead lose `_total` on their samples.
fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut family: Vec<&str> = Vec::new();
    for line in openmetrics.lines() {
        if line.starts_with("# HELP ") {
            flush_family(&mut out, &family);
            family.clear();
        }
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        family.push(line);
    }
    flush_family(&mut out, &family);
    out
}

fn flush_family(out: &mut String, lines: &[&str]) {
    let counter = lines
        .iter()
        .any(|l| l.starts_with("# TYPE ") && l.ends_with(" counter"));
    let bare = counter
        .then(|| {
            lines.iter().find_map(|l| {
                let name = l.strip_prefix("# TYPE ")?.strip_suffix(" counter")?;
                KUBELET_BARE_COUNTERS.contains(&name).then_some(name)
            })
        })
        .flatten();
    if let Some(name) = bare {
        let sample = format!("{name}_total");
        for line in lines {
            match line.strip_prefix(sample.as_str()) {
                Some(rest) if rest.starts_with(['{', ' ']) => {
                    out.push_str(name);
                    out.push_str(rest);
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        return;
    }
    for line in lines {
        let header = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|p| line.starts_with(*p));
        match header {
            Some(prefix) if counter => {
                let rest = &line[prefix.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total ");
                out.push_str(tail);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
}

fn resource_label(resource: &str) -> ResourceLabel {
    ResourceLabel {
        resource_name: resource.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_value(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn a1_registration_counter_has_the_kubelet_name_and_label() {
        let m = Metrics::new();
        m.device_plugin_registration("example.com/gpu");
        m.clone().device_plugin_registration("example.com/gpu");
        let text = m.encode();
        assert!(
            text.contains("# HELP kubelet_device_plugin_registration_total [ALPHA] Cumulative number of device plugin registrations. Broken down by resource name."),
            "{text}"
        );
        assert!(
            text.contains("# TYPE kubelet_device_plugin_registration_total counter"),
            "{text}"
        );
        assert_eq!(
            line_value(
                &text,
                "kubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"}"
            ),
            Some(2.0)
        );
        assert!(!text.contains("# EOF"));
        let open = m.encode_openmetrics();
        assert!(
            open.contains("# TYPE kubelet_device_plugin_registration counter"),
            "{open}"
        );
        assert!(open.ends_with("# EOF\n"));
    }

    #[test]
    fn allocation_histogram_uses_the_kubelet_default_buckets() {
        let m = Metrics::new();
        m.device_plugin_allocation("r/a", Duration::from_millis(30));
        let text = m.encode();
        let label = "resource_name=\"r/a\"";
        for (le, want) in [("0.025", 0.0), ("0.05", 1.0), ("10.0", 1.0), ("+Inf", 1.0)] {
            let prefix = format!(
                "kubelet_device_plugin_alloc_duration_seconds_bucket{{le=\"{le}\",{label}}}"
            );
            assert_eq!(line_value(&text, &prefix), Some(want), "{prefix}\n{text}");
        }
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("kubelet_device_plugin_alloc_duration_seconds_bucket"))
            .count();
        assert_eq!(buckets, DEF_BUCKETS.len() + 1);
    }

    #[test]
    fn pod_resources_counters_split_by_method_and_version() {
        let m = Metrics::new();
        m.pod_resources_request(PodResourcesVersion::V1, PodResourcesMethod::List, false);
        m.pod_resources_request(PodResourcesVersion::V1, PodResourcesMethod::Get, true);
        m.pod_resources_request(
            PodResourcesVersion::V1alpha1,
            PodResourcesMethod::List,
            false,
        );
        let text = m.encode();
        let v1 = "{server_api_version=\"v1\"}";
        let alpha1 = "{server_api_version=\"v1alpha1\"}";
        let get = |name: &str, l: &str| line_value(&text, &format!("{name}{l}"));
        assert_eq!(
            get("kubelet_pod_resources_endpoint_requests_total", v1),
            Some(2.0)
        );
        assert_eq!(
            get("kubelet_pod_resources_endpoint_requests_total", alpha1),
            Some(1.0)
        );
        assert_eq!(
            get("kubelet_pod_resources_endpoint_requests_list", v1),
            Some(1.0)
        );
        assert_eq!(
            get("kubelet_pod_resources_endpoint_requests_get", v1),
            Some(1.0)
        );
        assert_eq!(
            get("kubelet_pod_resources_endpoint_errors_get", v1),
            Some(1.0)
        );
        assert_eq!(get("kubelet_pod_resources_endpoint_errors_list", v1), None);
    }

    #[test]
    fn b15_dra_metrics_names_labels_and_buckets() {
        let m = Metrics::new();
        m.dra_operation("PrepareResources", false, Duration::from_millis(200));
        m.dra_grpc_operation(
            "gpu.example.com",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            "OK",
            Duration::from_millis(150),
        );
        m.set_dra_claims_in_use(1, [("gpu.example.com", 1)]);
        let text = m.encode();
        assert_eq!(
            line_value(
                &text,
                "dra_operations_duration_seconds_count{operation_name=\"PrepareResources\",is_error=\"false\"}"
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            line_value(
                &text,
                "dra_grpc_operations_duration_seconds_count{driver_name=\"gpu.example.com\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources\",grpc_status_code=\"OK\"}"
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            line_value(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
            Some(1.0)
        );
        // 15 buckets from 0.1 to 40 s, plus +Inf.
        let les: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("dra_operations_duration_seconds_bucket"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(les.len(), 16, "{les:?}");
        assert_eq!(les[0], "0.1");
        assert!(
            les[14].starts_with("40") || les[14].starts_with("39.99"),
            "{les:?}"
        );
        m.set_dra_claims_in_use(0, []);
        let text = m.encode();
        assert_eq!(
            line_value(&text, "dra_resource_claims_in_use{driver_name=\"<any>\"}"),
            Some(0.0)
        );
        assert!(!text.contains("dra_resource_claims_in_use{driver_name=\"gpu.example.com\"}"));
    }

    #[test]
    fn resource_gauges_are_replaced_and_gone_resources_dropped() {
        let m = Metrics::new();
        let figures = |c, a, al, u| ResourceFigures {
            capacity: c,
            allocatable: a,
            allocated: al,
            unhealthy: u,
        };
        m.set_resources([("r/a", figures(4, 3, 1, 1)), ("r/b", figures(2, 2, 0, 0))]);
        let text = m.encode();
        assert_eq!(
            line_value(
                &text,
                "devicelet_device_plugin_capacity{resource_name=\"r/a\"}"
            ),
            Some(4.0)
        );
        assert_eq!(
            line_value(
                &text,
                "devicelet_device_plugin_allocated{resource_name=\"r/a\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            line_value(
                &text,
                "devicelet_device_plugin_unhealthy{resource_name=\"r/a\"}"
            ),
            Some(1.0)
        );
        m.set_resources([("r/a", figures(4, 3, 1, 1))]);
        let text = m.encode();
        assert_eq!(
            line_value(
                &text,
                "devicelet_device_plugin_capacity{resource_name=\"r/b\"}"
            ),
            None
        );
    }

    #[test]
    fn devicelet_own_metrics_record() {
        let m = Metrics::new();
        m.pod_admitted(Duration::from_millis(2));
        m.pod_rejected("UnexpectedAdmissionError");
        m.checkpoint_write("kubelet_internal_checkpoint", Duration::from_millis(4));
        m.device_plugin_rpc("r/a", "Allocate", "OK", Duration::from_micros(300));
        m.topology_admission(true, Duration::from_micros(300));
        m.cpu_pinning(false);
        let text = m.encode();
        assert_eq!(
            line_value(&text, "devicelet_pod_admissions_total"),
            Some(1.0)
        );
        assert_eq!(
            line_value(&text, "devicelet_pod_admission_duration_seconds_count"),
            Some(1.0)
        );
        assert_eq!(
            line_value(
                &text,
                "devicelet_pod_rejections_total{reason=\"UnexpectedAdmissionError\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            line_value(
                &text,
                "devicelet_checkpoint_write_duration_seconds_count{checkpoint=\"kubelet_internal_checkpoint\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            line_value(
                &text,
                "devicelet_device_plugin_rpc_duration_seconds_count{resource_name=\"r/a\",method=\"Allocate\",code=\"OK\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            line_value(&text, "kubelet_topology_manager_admission_errors_total"),
            Some(1.0)
        );
        assert_eq!(
            line_value(&text, "kubelet_cpu_manager_pinning_requests_total"),
            Some(1.0)
        );
    }

    /// Every kubelet metric comes out of [`Metrics::encode`] under its exact kubelet name and
    /// type (`pkg/kubelet/metrics/metrics.go`, `pkg/kubelet/cm/dra/metrics`).
    #[test]
    fn kubelet_metrics_have_the_kubelet_names_and_types() {
        let m = Metrics::new();
        m.device_plugin_registration("r/a");
        m.device_plugin_allocation("r/a", Duration::from_millis(3));
        for method in [
            PodResourcesMethod::List,
            PodResourcesMethod::GetAllocatableResources,
            PodResourcesMethod::Get,
        ] {
            m.pod_resources_request(PodResourcesVersion::V1, method, true);
        }
        m.topology_admission(true, Duration::from_micros(1500));
        m.aligned_compute_resources(AlignScope::Container, AlignBoundary::NumaNode, false);
        m.aligned_compute_resources(AlignScope::Pod, AlignBoundary::NumaNode, true);
        m.cpu_pinning(true);
        m.memory_pinning(true);
        m.memory_pinning(false);
        m.dra_operation("PrepareResources", false, Duration::from_millis(200));
        m.dra_grpc_operation("d", "/m", "OK", Duration::from_millis(1));
        m.set_dra_claims_in_use(0, []);
        let text = m.encode();
        let kubelet = [
            ("kubelet_device_plugin_registration_total", "counter"),
            ("kubelet_device_plugin_alloc_duration_seconds", "histogram"),
            ("kubelet_pod_resources_endpoint_requests_total", "counter"),
            ("kubelet_pod_resources_endpoint_requests_list", "counter"),
            (
                "kubelet_pod_resources_endpoint_requests_get_allocatable",
                "counter",
            ),
            ("kubelet_pod_resources_endpoint_requests_get", "counter"),
            ("kubelet_pod_resources_endpoint_errors_list", "counter"),
            (
                "kubelet_pod_resources_endpoint_errors_get_allocatable",
                "counter",
            ),
            ("kubelet_pod_resources_endpoint_errors_get", "counter"),
            (
                "kubelet_topology_manager_admission_requests_total",
                "counter",
            ),
            ("kubelet_topology_manager_admission_errors_total", "counter"),
            (
                "kubelet_topology_manager_admission_duration_ms",
                "histogram",
            ),
            (
                "kubelet_container_aligned_compute_resources_count",
                "counter",
            ),
            (
                "kubelet_container_aligned_compute_resources_failure_count",
                "counter",
            ),
            ("kubelet_cpu_manager_pinning_requests_total", "counter"),
            ("kubelet_cpu_manager_pinning_errors_total", "counter"),
            ("kubelet_memory_manager_pinning_requests_total", "counter"),
            ("kubelet_memory_manager_pinning_errors_total", "counter"),
            ("dra_operations_duration_seconds", "histogram"),
            ("dra_grpc_operations_duration_seconds", "histogram"),
            ("dra_resource_claims_in_use", "gauge"),
        ];
        for (name, kind) in kubelet {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind}\n{text}"
            );
            assert!(text.contains(&format!("# HELP {name} [ALPHA] ")), "{name}");
            let sample = match kind {
                "histogram" => format!("{name}_count"),
                _ => name.to_owned(),
            };
            assert!(
                text.lines().any(|l| l
                    .strip_prefix(sample.as_str())
                    .is_some_and(|r| r.starts_with(['{', ' ']))),
                "no sample of {name}\n{text}"
            );
        }
        // No other family: only these kubelet names and devicelet's own.
        for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = family.split(' ').next().unwrap_or_default();
            assert!(
                name.starts_with("devicelet_") || kubelet.iter().any(|(n, _)| *n == name),
                "unexpected family {family}"
            );
        }
        for name in KUBELET_BARE_COUNTERS {
            assert!(!text.contains(&format!("{name}_total")), "{name}_total");
        }
        let v1 = "{server_api_version=\"v1\"}";
        for name in KUBELET_BARE_COUNTERS.iter().take(6) {
            assert_eq!(
                line_value(&text, &format!("{name}{v1}")),
                Some(1.0),
                "{name}"
            );
        }
        let aligned = "kubelet_container_aligned_compute_resources";
        for (series, want) in [
            ("_count{boundary=\"numa_node\",scope=\"container\"}", 1.0),
            ("_count{boundary=\"numa_node\",scope=\"pod\"}", 0.0),
            (
                "_failure_count{boundary=\"numa_node\",scope=\"container\"}",
                0.0,
            ),
            ("_failure_count{boundary=\"numa_node\",scope=\"pod\"}", 1.0),
        ] {
            assert_eq!(
                line_value(&text, &format!("{aligned}{series}")),
                Some(want),
                "{series}\n{text}"
            );
        }
        // Milliseconds, ExponentialBuckets(.05, 2, 15): 1.5 ms lands in le=1.6.
        let duration = "kubelet_topology_manager_admission_duration_ms_bucket";
        assert_eq!(
            line_value(&text, &format!("{duration}{{le=\"0.8\"}}")),
            Some(0.0)
        );
        assert_eq!(
            line_value(&text, &format!("{duration}{{le=\"1.6\"}}")),
            Some(1.0)
        );
        assert_eq!(text.lines().filter(|l| l.starts_with(duration)).count(), 16);
        // OpenMetrics keeps `_total` on every counter sample, as client_golang does there.
        let open = m.encode_openmetrics();
        assert!(
            open.contains(&format!(
                "kubelet_pod_resources_endpoint_requests_list_total{v1} 1"
            )),
            "{open}"
        );
    }

    #[test]
    fn topology_series_exist_at_zero_before_any_admission() {
        let text = Metrics::new().encode();
        for series in [
            "kubelet_topology_manager_admission_requests_total",
            "kubelet_topology_manager_admission_errors_total",
            "kubelet_topology_manager_admission_duration_ms_count",
            "kubelet_container_aligned_compute_resources_count{boundary=\"numa_node\",scope=\"container\"}",
            "kubelet_container_aligned_compute_resources_failure_count{boundary=\"numa_node\",scope=\"pod\"}",
        ] {
            assert_eq!(line_value(&text, series), Some(0.0), "{series}\n{text}");
        }
    }
}

/// A duration as milliseconds for a log field, rounded to the microsecond: `0.61`, not the
/// float noise of `0.6095090000000001`.
pub fn log_ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod log_ms_tests {
    #[test]
    fn log_fields_carry_no_float_noise() {
        let d = std::time::Duration::from_nanos(609_509);
        assert_eq!(super::log_ms(d).to_string(), "0.61");
        assert_eq!(
            super::log_ms(std::time::Duration::from_millis(3)).to_string(),
            "3"
        );
    }
}
