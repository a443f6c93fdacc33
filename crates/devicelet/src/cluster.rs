//! Cluster mode wiring: the node core behind [`devicelet_kube::NodeCore`], so the cluster
//! front end (Node status, Lease, pods bound to the node) drives the same admission, release
//! and health as the local control API.

use std::collections::BTreeMap;
use std::sync::Arc;

use devicelet_kube::numa_resources::{NumaNodeResources, NumaResources};
use devicelet_kube::{AdmitStages, DeviceCapacity, NodeCore, Rejection, ReleaseError};
use devicelet_node::pods::{PodAdmitter, PodError};
use k8s_openapi::api::core::v1::{Pod, ResourceHealth, ResourceStatus};
use tokio::sync::watch;

/// The node core as the cluster front end sees it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pods: Arc<PodAdmitter>,
    /// Bumped after each admission or release (what each NUMA node can give changed).
    allocations: watch::Sender<u64>,
}

impl ClusterNode {
    /// Wraps the daemon's pod admitter.
    pub fn new(pods: Arc<PodAdmitter>) -> Self {
        ClusterNode {
            pods,
            allocations: watch::channel(0).0,
        }
    }

    fn allocations_changed(&self) {
        self.allocations.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The kubelet's reason and message for a refused pod ([`PodError::kubelet_rejection`]).
///
/// A claim that cannot be prepared is not a rejection: the kubelet prepares claims in pod
/// sync, after admission, and retries until it works (the claim may not be allocated or
/// reserved yet, the Node authorizer may not have linked it to the pod yet, the driver may be
/// restarting). The pod waits with the kubelet's `FailedPrepareDynamicResources` event.
pub fn rejection(err: &PodError) -> Rejection {
    if let PodError::Claims(e) = err {
        let retry_soon =
            matches!(e, devicelet_node::dra::DraNodeError::Dra(d) if d.is_claim_not_linked_yet());
        return Rejection {
            reason: "FailedPrepareDynamicResources".to_owned(),
            message: format!("Failed to prepare dynamic resources: {e}"),
            retry: true,
            retry_soon,
        };
    }
    let (reason, message) = err.kubelet_rejection();
    Rejection {
        reason: reason.to_owned(),
        message,
        retry: false,
        retry_soon: false,
    }
}

impl NodeCore for ClusterNode {
    async fn admit(&self, pod: &Pod) -> Result<AdmitStages, Rejection> {
        let (result, timings) = self.pods.admit_timed(pod).await;
        // A refusal may have held and released resources on the way: report either way.
        self.allocations_changed();
        result.map_err(|e| rejection(&e))?;
        Ok(AdmitStages {
            claim_get: timings.claims.claim_get,
            driver_prepare: timings.claims.driver,
            plugin_allocate: timings.plugin_allocate,
            checkpoint_write: timings.claims.checkpoint + timings.state_write,
        })
    }

    async fn release(&self, uid: &str) -> Result<(), ReleaseError> {
        let removed = self.pods.remove_with_claims(uid).await;
        self.allocations_changed();
        match removed {
            Ok(()) | Err(PodError::NotFound { .. }) => Ok(()),
            Err(e) => Err(Box::new(e)),
        }
    }

    fn numa_resources(&self) -> Option<NumaResources> {
        let alignment = self.pods.alignment();
        let (policy, scope) = alignment.topology_names();
        let numa_nodes: Vec<NumaNodeResources> = alignment
            .numa_free()
            .into_iter()
            .map(|f| NumaNodeResources {
                id: f.id as i64,
                cpus: f.cpus,
                memory: f.memory,
            })
            .collect();
        // Nothing to align, or nothing the scheduler could weigh: no annotation.
        if policy == "none"
            || numa_nodes
                .iter()
                .all(|n| n.cpus.is_none() && n.memory.is_none())
        {
            return None;
        }
        let pods = self
            .pods
            .snapshot()
            .iter()
            .filter(|p| {
                p.containers
                    .iter()
                    .any(|c| c.cpus.is_some() || !c.memory.is_empty())
            })
            .map(|p| p.pod.uid.clone())
            .collect();
        Some(NumaResources {
            topology_manager_policy: policy.to_owned(),
            topology_manager_scope: scope.to_owned(),
            numa_nodes,
            pods,
        })
    }

    fn allocation_changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.allocations.subscribe())
    }

    fn dra_drivers(&self) -> Vec<String> {
        let Some(dra) = self.pods.dra() else {
            return Vec::new();
        };
        let mut drivers: Vec<String> = dra
            .registry()
            .list()
            .into_iter()
            .map(|(d, _, _)| d)
            .collect();
        drivers.sort();
        drivers.dedup();
        drivers
    }

    fn claim_health_changes(&self) -> Option<watch::Receiver<u64>> {
        self.pods.dra().map(|d| d.health_changes())
    }

    fn is_admitted(&self, uid: &str) -> bool {
        self.pods.snapshot().iter().any(|p| p.pod.uid == uid)
    }

    fn admitted(&self) -> Vec<String> {
        self.pods
            .snapshot()
            .iter()
            .map(|p| p.pod.uid.clone())
            .collect()
    }

    fn awaiting_plugins(&self) -> Vec<String> {
        self.pods.manager().awaiting_reregistration()
    }

    fn capacity(&self) -> DeviceCapacity {
        let report = self.pods.manager().capacity();
        DeviceCapacity {
            capacity: report.capacity,
            allocatable: report.allocatable,
            deleted: report.deleted,
        }
    }

    fn inventory_changes(&self) -> watch::Receiver<u64> {
        self.pods.manager().subscribe()
    }

    fn resource_health(&self, uid: &str) -> BTreeMap<String, Vec<ResourceStatus>> {
        let Some(pod) = self.pods.snapshot().into_iter().find(|p| p.pod.uid == uid) else {
            return BTreeMap::new();
        };
        let mut pods = [devicelet_node::pods::AdmittedPod::clone(&pod)];
        devicelet_node::health::annotate(self.pods.manager(), &mut pods);
        self.pods.annotate_claim_health(&mut pods);
        let [pod] = pods;
        pod.containers
            .into_iter()
            .filter(|c| !c.allocated_resources_status.is_empty())
            .map(|c| {
                let statuses = c
                    .allocated_resources_status
                    .into_iter()
                    .map(|s| ResourceStatus {
                        name: s.name,
                        resources: Some(
                            s.resources
                                .into_iter()
                                .map(|r| ResourceHealth {
                                    resource_id: r.resource_id,
                                    health: Some(r.health),
                                    // 1.36 `message` (DRA only); a change of it alone changes
                                    // the desired status, so the status manager writes it.
                                    message: r.message,
                                })
                                .collect(),
                        ),
                    })
                    .collect();
                (c.name, statuses)
            })
            .collect()
    }
}

/// devicelet's CRI runtime as the cluster front end sees it ([`devicelet_kube::PodRuntime`]).
#[derive(Debug, Clone)]
pub struct ClusterRuntime(pub Arc<devicelet_runtime::CriRuntime>);

impl devicelet_kube::PodRuntime for ClusterRuntime {
    fn name(&self) -> String {
        self.0.runtime_name().to_owned()
    }

    fn run_pod(&self, pod: &Pod) -> Result<(), ReleaseError> {
        self.0.run_pod(pod).map_err(Into::into)
    }

    fn kill_pod<'a>(
        &'a self,
        uid: &'a str,
        grace: std::time::Duration,
    ) -> devicelet_kube::core::RuntimeFuture<'a> {
        Box::pin(async move { self.0.kill_pod(uid, grace).await.map_err(Into::into) })
    }

    fn status(&self, uid: &str) -> Option<devicelet_kube::RuntimePodStatus> {
        let status = self.0.status(uid)?;
        let to_json = |list: &[devicelet_runtime::ContainerStatus]| {
            list.iter()
                .filter_map(|c| serde_json::to_value(c).ok())
                .collect()
        };
        Some(devicelet_kube::RuntimePodStatus {
            sandbox_ready: !status.sandbox_id.is_empty() && !status.is_terminal(),
            init_container_statuses: to_json(&status.init_containers),
            container_statuses: to_json(&status.containers),
            phase: status.phase,
        })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.0.changes()
    }
}

/// The runtime's reads from the API server for pods' volumes and env
/// ([`devicelet_runtime::PodApi`]), under the node identity.
#[derive(Debug, Clone)]
pub struct ClusterPodApi {
    /// The reads.
    pub objects: devicelet_kube::pod_objects::PodObjects,
    /// Where pods are told the API server is.
    pub server: devicelet_kube::pod_objects::PodApiServer,
}

impl devicelet_runtime::PodApi for ClusterPodApi {
    fn config_map<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<k8s_openapi::api::core::v1::ConfigMap>, String>>
    {
        Box::pin(async move {
            self.objects
                .config_map(namespace, name)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<k8s_openapi::api::core::v1::Secret>, String>>
    {
        Box::pin(async move {
            self.objects
                .secret(namespace, name)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn token<'a>(
        &'a self,
        spec: &'a devicelet_runtime::TokenSpec,
    ) -> futures::future::BoxFuture<'a, Result<devicelet_runtime::IssuedToken, String>> {
        Box::pin(async move {
            let token = self
                .objects
                .token(
                    &spec.namespace,
                    &spec.service_account,
                    &spec.audiences,
                    spec.expiration_seconds,
                    &spec.pod_name,
                    &spec.pod_uid,
                )
                .await
                .map_err(|e| e.to_string())?;
            let expires = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(u64::try_from(token.expires_unix).unwrap_or(0));
            Ok(devicelet_runtime::IssuedToken {
                token: token.token,
                expires,
                expiration_seconds: token.expiration_seconds,
            })
        })
    }

    fn kubernetes_service(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<devicelet_runtime::ServiceAddress, String>> {
        Box::pin(async move {
            match &self.server {
                devicelet_kube::pod_objects::PodApiServer::Fixed { host, port } => {
                    Ok(devicelet_runtime::ServiceAddress {
                        host: host.clone(),
                        ports: vec![devicelet_runtime::ServicePort {
                            name: "https".to_owned(),
                            port: i32::from(*port),
                            protocol: "TCP".to_owned(),
                        }],
                    })
                }
                devicelet_kube::pod_objects::PodApiServer::Service => {
                    let (host, ports) = self
                        .objects
                        .kubernetes_service()
                        .await
                        .map_err(|e| e.to_string())?;
                    if host.is_empty() || host == "None" || ports.is_empty() {
                        return Err(
                            "the kubernetes Service in default has no ClusterIP or port".to_owned()
                        );
                    }
                    Ok(devicelet_runtime::ServiceAddress {
                        host,
                        ports: ports
                            .into_iter()
                            .map(|(name, port, protocol)| devicelet_runtime::ServicePort {
                                name,
                                port,
                                protocol,
                            })
                            .collect(),
                    })
                }
            }
        })
    }
}
