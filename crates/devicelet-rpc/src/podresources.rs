//! The PodResources API on `R/pod-resources/kubelet.sock` (spec devicemanager.md §5), following
//! the kubelet's `pkg/kubelet/apis/podresources` (`server_v1.go`, `server_v1alpha1.go`,
//! `grpc/ratelimit.go`) and the container manager's device conversion
//! (`cm/container_manager.go`): monitoring agents learn from it which container holds which
//! device, and which devices the node can hand out.
//!
//! What is filled, as the kubelet does:
//! - devices: one `ContainerDevices` per (device, NUMA node) with a single device ID and a
//!   single-node topology; a device without topology gives one entry with `topology` unset
//!   (spec §2 F1). For allocations the NUMA nodes are those recorded at allocation time.
//! - `cpu_ids`: a container's exclusive CPUs, and for `GetAllocatableResources` every CPU but
//!   the reserved ones, both from the static CPU manager (empty under the none policy).
//! - `memory`: a container's blocks from the memory manager (`Static` policy), and for
//!   `GetAllocatableResources` the allocatable memory of every NUMA node and resource; empty
//!   under the `None` policy. Each block lists all its NUMA nodes (`containerMemoryFromBlock`).
//! - `dynamic_resources`: the prepared devices of the container's claims, one `DynamicResource`
//!   per claim. Unlike the kubelet (E24, a CDI slice shared across one driver's devices) each
//!   `ClaimResource` lists only its own device's CDI IDs.
//!
//! All unary calls of both API versions share one token bucket (100 QPS, burst 10); an empty
//! bucket answers `ResourceExhausted` "rejected by rate limit". Plain errors (a pod not found
//! by `Get`) are `Unknown`, as a Go handler returning a non-status error gives.
//!
//! Isolation: the daemon serves this API from a runtime of its own, one thread at nice 19
//! ([`PodResourcesService::serve_isolated`]). Answering `List` on a node with thousands of
//! pods costs milliseconds of CPU to build and as much again to encode; on the daemon's few
//! async workers a burst of agents' calls would queue admissions (whose plugin `Allocate` RPCs
//! need a worker) behind that work. The kubelet's goroutines are preempted; tokio tasks are
//! not. A v1 answer is kept with the admitter's generation read before it was built and served
//! to every `List` that arrived at that generation or later, so 50 agents polling at once cost
//! one build, not 50, and no caller gets an answer older than its call.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::error::RpcError;
use devicelet_devicemanager::{ContainerKind, Device, PodAllocations, ResourceAllocation};
use devicelet_metrics::{PodResourcesMethod, PodResourcesVersion};
use devicelet_node::dra::DraNode;
use devicelet_proto::constants::podresources::{
    RATE_LIMIT_BURST, RATE_LIMIT_MESSAGE, RATE_LIMIT_QPS,
};
use devicelet_proto::podresources::{v1, v1alpha1};
use tonic::{Request, Response, Status};

use devicelet_node::pods::{AdmittedPod, PodAdmitter};

/// A token bucket with the semantics of Go's `rate.Limiter.Allow`: it starts full, refills
/// continuously at `rate` tokens per second up to `burst`, and each call takes one token.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `qps` per second.
    pub fn new(qps: u32, burst: u32) -> Self {
        TokenBucket {
            rate: f64::from(qps),
            burst: f64::from(burst),
            state: Mutex::new(BucketState {
                tokens: f64::from(burst),
                last: Instant::now(),
            }),
        }
    }

    /// Takes a token if one is there.
    pub fn allow(&self) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(state.last).as_secs_f64();
        state.last = now;
        state.tokens = (state.tokens + elapsed * self.rate).min(self.burst);
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A v1 `List` answer and the admitter generation it is current for.
type CachedList = (u64, Arc<Vec<v1::PodResources>>);

/// How much lower than the daemon's other threads the isolated server runs (`nice` units).
/// The lowest: at nice 10 a waking admission still waited behind a `List` being built (p99
/// x1.4-x2.7 in the load bench with the clients on the other CPU; at 19, x0.4-x1.2). The price
/// is on a CPU-saturated node, where agents' `List` calls wait rather than admissions.
const NICENESS: i32 = 19;

/// Both PodResources services over the admitted pods and the device manager. Cheap to clone;
/// clones share the rate limiter.
#[derive(Debug, Clone)]
pub struct PodResourcesService {
    pods: Arc<PodAdmitter>,
    limiter: Arc<TokenBucket>,
    /// The last v1 `List` answer and the admitter generation it is current for.
    v1_list: Arc<Mutex<Option<CachedList>>>,
}

impl PodResourcesService {
    /// The service with the kubelet's rate limit.
    pub fn new(pods: Arc<PodAdmitter>) -> Self {
        Self::with_rate_limit(pods, RATE_LIMIT_QPS, RATE_LIMIT_BURST)
    }

    /// The service with another rate limit (tests).
    pub fn with_rate_limit(pods: Arc<PodAdmitter>, qps: u32, burst: u32) -> Self {
        PodResourcesService {
            pods,
            limiter: Arc::new(TokenBucket::new(qps, burst)),
            v1_list: Arc::default(),
        }
    }

    /// The v1 `List` answer for a call that arrived at admitter generation `arrived`: the
    /// cached one when it is at least that new, else a fresh one. Calls are answered one at a
    /// time on the isolated server's single thread, so a burst shares one build.
    fn v1_list(&self, arrived: u64) -> Arc<Vec<v1::PodResources>> {
        let mut cache = self.v1_list.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, answer)) = cache.as_ref().filter(|(g, _)| *g >= arrived) {
            return Arc::clone(answer);
        }
        // Read before the pods: a change made during the build bumps it past this value.
        let generation = self.pods.generation();
        let answer: Arc<Vec<_>> = Arc::new(
            self.pods
                .snapshot()
                .iter()
                .map(|p| self.v1_pod(p))
                .collect(),
        );
        *cache = Some((generation, Arc::clone(&answer)));
        answer
    }

    /// Serves both API versions on `listener` until `shutdown`, from a runtime of its own: one
    /// thread at nice 19 (see the module docs). The returned task ends with the server.
    pub fn serve_isolated(
        &self,
        listener: tokio::net::UnixListener,
        socket: std::path::PathBuf,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<tokio::task::JoinHandle<Result<(), RpcError>>, RpcError> {
        let server_error = |message: String| RpcError::Server {
            path: socket.clone(),
            message,
        };
        // Moved to the new runtime's reactor below.
        let listener = listener
            .into_std()
            .map_err(|e| server_error(e.to_string()))?;
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let service = self.clone();
        let path = socket.clone();
        std::thread::Builder::new()
            .name("podresources".into())
            .spawn(move || {
                // Linux applies a thread ID's priority to that thread alone. Failing to lower
                // it (no permission, say) costs only fairness.
                if let Err(e) =
                    rustix::process::setpriority_process(Some(rustix::thread::gettid()), NICENESS)
                {
                    tracing::debug!(error = %e, "PodResources server keeps its priority");
                }
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())
                    .and_then(|runtime| {
                        runtime.block_on(async move {
                            let listener = tokio::net::UnixListener::from_std(listener)
                                .map_err(|e| e.to_string())?;
                            tonic::transport::Server::builder()
                                .add_service(service.v1_server())
                                .add_service(service.v1alpha1_server())
                                .serve_with_incoming_shutdown(
                                    crate::transport::incoming(listener),
                                    shutdown,
                                )
                                .await
                                .map_err(|e| e.to_string())
                        })
                    });
                let _ = done_tx.send(result);
            })
            .map_err(|e| server_error(e.to_string()))?;
        Ok(tokio::spawn(async move {
            match done_rx.await {
                Ok(result) => result.map_err(|message| RpcError::Server { path, message }),
                Err(_) => Err(RpcError::Server {
                    path,
                    message: "the PodResources server thread panicked".into(),
                }),
            }
        }))
    }

    /// The `v1.PodResourcesLister` gRPC service.
    pub fn v1_server(&self) -> v1::pod_resources_lister_server::PodResourcesListerServer<Self> {
        v1::pod_resources_lister_server::PodResourcesListerServer::new(self.clone())
    }

    /// The `v1alpha1.PodResourcesLister` gRPC service.
    pub fn v1alpha1_server(
        &self,
    ) -> v1alpha1::pod_resources_lister_server::PodResourcesListerServer<Self> {
        v1alpha1::pod_resources_lister_server::PodResourcesListerServer::new(self.clone())
    }

    fn admit_call(&self) -> Result<(), Status> {
        if self.limiter.allow() {
            Ok(())
        } else {
            Err(Status::resource_exhausted(RATE_LIMIT_MESSAGE))
        }
    }

    /// Counts a call that passed the rate limiter (`kubelet_pod_resources_endpoint_*`; the
    /// kubelet's limiter is an interceptor, so refused calls are not counted).
    fn count<T>(
        &self,
        version: PodResourcesVersion,
        method: PodResourcesMethod,
        result: Result<T, Status>,
    ) -> Result<T, Status> {
        self.pods
            .manager()
            .metrics()
            .pod_resources_request(version, method, result.is_err());
        result
    }

    /// v1 view of a pod: sidecars (restartable init containers), then app containers; regular
    /// init containers are left out.
    fn v1_pod(&self, pod: &AdmittedPod) -> v1::PodResources {
        let uid = &pod.pod.uid;
        // Read after the lock is released: copying the cached Allocate answers would dominate
        // the cost, and building under the lock would make admissions wait for this thread.
        let held = self.pods.manager().pod_allocations(uid);
        let containers = pod
            .containers
            .iter()
            .filter(|c| matches!(c.kind, ContainerKind::Sidecar | ContainerKind::App))
            .map(|c| v1::ContainerResources {
                name: c.name.clone(),
                devices: container_devices(held.as_deref(), &c.name),
                cpu_ids: self.pods.alignment().exclusive_cpus(uid, &c.name),
                memory: container_memory(self.pods.alignment().memory_blocks(uid, &c.name)),
                dynamic_resources: self
                    .pods
                    .dra()
                    .map(|dra| dynamic_resources(dra, uid, &c.name))
                    .unwrap_or_default(),
            })
            .collect();
        v1::PodResources {
            name: pod.pod.name.clone(),
            namespace: pod.pod.namespace.clone(),
            containers,
        }
    }
}

/// The container's claims as `DynamicResource`s, in first-use order.
fn dynamic_resources(dra: &DraNode, uid: &str, container: &str) -> Vec<v1::DynamicResource> {
    let mut out: Vec<v1::DynamicResource> = Vec::new();
    for d in dra.container_claims(uid, container) {
        let resource = v1::ClaimResource {
            cdi_devices: d
                .cdi_devices
                .iter()
                .map(|name| v1::CdiDevice { name: name.clone() })
                .collect(),
            driver_name: d.driver,
            pool_name: d.pool,
            device_name: d.device,
            share_id: d.share_id,
        };
        match out
            .iter_mut()
            .find(|r| r.claim_name == d.claim && r.claim_namespace == d.namespace)
        {
            Some(r) => r.claim_resources.push(resource),
            None => out.push(v1::DynamicResource {
                claim_name: d.claim,
                claim_namespace: d.namespace,
                claim_resources: vec![resource],
            }),
        }
    }
    out
}

fn device_entry(resource: &str, id: &str, node: Option<i64>) -> v1::ContainerDevices {
    v1::ContainerDevices {
        resource_name: resource.to_owned(),
        device_ids: vec![id.to_owned()],
        topology: node.map(|id| v1::TopologyInfo {
            nodes: vec![v1::NumaNode { id }],
        }),
    }
}

/// `container`'s devices in `held` (what its pod holds), none when it holds nothing.
fn container_devices(held: Option<&PodAllocations>, container: &str) -> Vec<v1::ContainerDevices> {
    held.and_then(|pod| pod.get(container))
        .map(allocated_devices)
        .unwrap_or_default()
}

/// A container's devices from its recorded allocation (`GetDevices`, spec §2 F1): each device
/// under each NUMA node it was recorded under, `-1` meaning no topology. Devices come in
/// allocation order, resources in name order.
fn allocated_devices(
    allocations: &BTreeMap<String, ResourceAllocation>,
) -> Vec<v1::ContainerDevices> {
    let mut out = Vec::new();
    for (resource, allocation) in allocations {
        let mut nodes_of: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for (node, ids) in &allocation.devices_per_numa {
            for id in ids {
                nodes_of.entry(id.as_str()).or_default().push(*node);
            }
        }
        for id in &allocation.device_ids {
            // Like the kubelet, only devices present in the per-NUMA record are reported.
            for node in nodes_of.get(id.as_str()).into_iter().flatten() {
                out.push(device_entry(resource, id, (*node >= 0).then_some(*node)));
            }
        }
    }
    out
}

/// Allocatable devices in the same layout; a device whose plugin sent an empty (not missing)
/// topology gives no entry, as in the kubelet.
fn allocatable_devices(devices: &BTreeMap<String, Vec<Device>>) -> Vec<v1::ContainerDevices> {
    let mut out = Vec::new();
    for (resource, devices) in devices {
        for device in devices {
            match &device.numa_nodes {
                None => out.push(device_entry(resource, &device.id, None)),
                Some(nodes) => {
                    for node in nodes {
                        out.push(device_entry(resource, &device.id, Some(*node)));
                    }
                }
            }
        }
    }
    out
}

// Upstream `List` first runs `UpdateAllocatedDevices` (drop allocations of pods no longer
// active). devicelet frees a pod's devices when the pod is removed, so the only allocations
// without an admitted pod belong to an admission in progress; collecting them here would
// free devices under a pod being admitted, so we skip that step.

#[tonic::async_trait]
impl v1::pod_resources_lister_server::PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _request: Request<v1::ListPodResourcesRequest>,
    ) -> Result<Response<v1::ListPodResourcesResponse>, Status> {
        self.admit_call()?;
        self.count(PodResourcesVersion::V1, PodResourcesMethod::List, Ok(()))?;
        // Every admitted pod is active: devicelet has no terminal pod phase.
        let answer = self.v1_list(self.pods.generation());
        Ok(Response::new(v1::ListPodResourcesResponse {
            pod_resources: answer.as_ref().clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<v1::AllocatableResourcesRequest>,
    ) -> Result<Response<v1::AllocatableResourcesResponse>, Status> {
        self.admit_call()?;
        self.count(
            PodResourcesVersion::V1,
            PodResourcesMethod::GetAllocatableResources,
            Ok(()),
        )?;
        let devices = allocatable_devices(&self.pods.manager().allocatable_devices());
        Ok(Response::new(v1::AllocatableResourcesResponse {
            devices,
            cpu_ids: self.pods.alignment().allocatable_cpus(),
            memory: container_memory(self.pods.alignment().allocatable_memory()),
        }))
    }

    async fn get(
        &self,
        request: Request<v1::GetPodResourcesRequest>,
    ) -> Result<Response<v1::GetPodResourcesResponse>, Status> {
        self.admit_call()?;
        let request = request.into_inner();
        let found = self
            .pods
            .get(&request.pod_namespace, &request.pod_name)
            .ok_or_else(|| {
                Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    request.pod_name, request.pod_namespace
                ))
            });
        let pod = self.count(PodResourcesVersion::V1, PodResourcesMethod::Get, found)?;
        Ok(Response::new(v1::GetPodResourcesResponse {
            pod_resources: Some(self.v1_pod(&pod)),
        }))
    }
}

#[tonic::async_trait]
impl v1alpha1::pod_resources_lister_server::PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _request: Request<v1alpha1::ListPodResourcesRequest>,
    ) -> Result<Response<v1alpha1::ListPodResourcesResponse>, Status> {
        self.admit_call()?;
        self.count(
            PodResourcesVersion::V1alpha1,
            PodResourcesMethod::List,
            Ok(()),
        )?;
        // v1alpha1 lists app containers only, with the v1 device entries minus topology.
        let pod_resources = {
            let manager = self.pods.manager();
            self.pods
                .snapshot()
                .iter()
                .map(|pod| {
                    let held = manager.pod_allocations(&pod.pod.uid);
                    v1alpha1::PodResources {
                        name: pod.pod.name.clone(),
                        namespace: pod.pod.namespace.clone(),
                        containers: pod
                            .containers
                            .iter()
                            .filter(|c| c.kind == ContainerKind::App)
                            .map(|c| v1alpha1::ContainerResources {
                                name: c.name.clone(),
                                devices: container_devices(held.as_deref(), &c.name)
                                    .into_iter()
                                    .map(|d| v1alpha1::ContainerDevices {
                                        resource_name: d.resource_name,
                                        device_ids: d.device_ids,
                                    })
                                    .collect(),
                            })
                            .collect(),
                    }
                })
                .collect()
        };
        Ok(Response::new(v1alpha1::ListPodResourcesResponse {
            pod_resources,
        }))
    }
}

/// Memory manager blocks as PodResources `ContainerMemory` (the kubelet's
/// `containerMemoryFromBlock`): every block carries a topology, empty or not.
fn container_memory(blocks: Vec<devicelet_memorymanager::MemoryBlock>) -> Vec<v1::ContainerMemory> {
    blocks
        .into_iter()
        .map(|b| v1::ContainerMemory {
            memory_type: b.resource,
            size: b.size,
            topology: Some(v1::TopologyInfo {
                nodes: b
                    .numa_affinity
                    .into_iter()
                    .map(|id| v1::NumaNode { id: id as i64 })
                    .collect(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(ids: &[&str], per_numa: &[(i64, &[&str])]) -> ResourceAllocation {
        ResourceAllocation {
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            devices_per_numa: per_numa
                .iter()
                .map(|(n, ids)| (*n, ids.iter().map(|s| (*s).to_owned()).collect()))
                .collect(),
            response: Default::default(),
        }
    }

    fn flat(devices: &[v1::ContainerDevices]) -> Vec<(String, Vec<String>, Option<Vec<i64>>)> {
        devices
            .iter()
            .map(|d| {
                (
                    d.resource_name.clone(),
                    d.device_ids.clone(),
                    d.topology
                        .as_ref()
                        .map(|t| t.nodes.iter().map(|n| n.id).collect()),
                )
            })
            .collect()
    }

    #[test]
    fn f1_one_entry_per_device_and_numa_node_none_for_no_topology() {
        let mut allocations = BTreeMap::new();
        allocations.insert(
            "r/a".to_owned(),
            allocation(
                &["d1", "d0", "d2"],
                &[(-1, &["d2"]), (0, &["d0", "d1"]), (1, &["d1"])],
            ),
        );
        let got = flat(&allocated_devices(&allocations));
        let e = |id: &str, t: Option<Vec<i64>>| ("r/a".to_owned(), vec![id.to_owned()], t);
        assert_eq!(
            got,
            vec![
                e("d1", Some(vec![0])),
                e("d1", Some(vec![1])),
                e("d0", Some(vec![0])),
                e("d2", None),
            ]
        );
    }

    #[test]
    fn allocatable_leaves_out_devices_with_empty_topology() {
        let mut devices = BTreeMap::new();
        devices.insert(
            "r/a".to_owned(),
            vec![
                Device {
                    numa_nodes: Some(vec![0, 1]),
                    ..Device::healthy("multi")
                },
                Device::healthy("none"),
                Device {
                    numa_nodes: Some(Vec::new()),
                    ..Device::healthy("empty")
                },
            ],
        );
        let got = flat(&allocatable_devices(&devices));
        let e = |id: &str, t: Option<Vec<i64>>| ("r/a".to_owned(), vec![id.to_owned()], t);
        assert_eq!(
            got,
            vec![
                e("multi", Some(vec![0])),
                e("multi", Some(vec![1])),
                e("none", None),
            ]
        );
    }

    #[test]
    fn token_bucket_allows_burst_then_refuses() {
        let bucket = TokenBucket::new(1, 3);
        assert!((0..3).all(|_| bucket.allow()));
        assert!(!bucket.allow());
    }
}
