//! Cluster mode: devicelet as the device half of a node of a real Kubernetes cluster.
//!
//! A second front end of the node core, beside the local control API: it speaks to a real
//! kube-apiserver with the node's own identity (`system:node:<name>`, allowed by the Node
//! authorizer and the NodeRestriction admission plugin; no other permission is needed), and
//! does what the kubelet's device half does there (spec cluster.md):
//! - [`node`]: registers the Node and patches its status with device plugin resources
//!   (`pkg/kubelet/kubelet_node_status.go`, `nodestatus/setters.go`);
//! - [`numa_resources`]: what each NUMA node can still give, on the Node for the scheduler
//!   (devicelet's addition);
//! - [`lease`]: renews the node's Lease in `kube-node-lease` (`pkg/kubelet/nodelease`);
//! - [`pods`]: watches the pods bound to the node, admits them through [`NodeCore`],
//!   reports their status ([`pod_status`], [`status_manager`]), releases and deletes them;
//! - [`slices`]: deletes the ResourceSlices of DRA drivers that stay disconnected (30 s delay,
//!   also at start) as the kubelet's DRA plugin manager does;
//! - [`bootstrap`]: the node's client certificate from a bootstrap credential through a
//!   CertificateSigningRequest, and its rotation (the kubelet's TLS bootstrap);
//! - [`claims`]: the pods' ResourceClaims read from the API server (one GET each, node
//!   identity) for the node's DRA preparation;
//! - [`snapshot`] and [`explain`]: read-only tools for users, not part of the node: the
//!   cluster's DRA state as a replayable `AllocationScenario`, and why a pod's claims do not
//!   allocate (`devicelet snapshot`, `devicelet explain`);
//! - [`client`]: the connection (HTTP/2, one multiplexed connection) and per-call deadlines;
//!   [`protobuf`]: bindings and events written in the Kubernetes protobuf encoding;
//! - [`serving`] (feature `serving`): a control-plane component's secure port, TLS with
//!   authentication and authorization delegated to the API server (the scheduler's metrics).
//!
//! Everything the node decides goes through [`NodeCore`]; this crate holds no device state.
#![forbid(unsafe_code)]

pub mod backoff;
#[cfg(feature = "node")]
pub mod bootstrap;
#[cfg(feature = "node")]
pub mod claims;
pub mod client;
pub mod core;
pub mod error;
pub mod events;
pub mod explain;
pub mod lease;
pub mod machine;
pub mod metrics;
pub mod node;
pub mod node_status;
pub mod numa_resources;
pub mod pod_objects;
pub mod pod_status;
pub mod pods;
pub mod protobuf;
pub mod rate_limit;
#[cfg(feature = "serving")]
pub mod serving;
pub mod slices;
pub mod snapshot;
pub mod startup;
pub mod status_manager;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

#[cfg(feature = "node")]
pub use crate::claims::ApiClaimSource;
pub use crate::client::{ClusterSource, connect};
pub use crate::core::{
    AdmitStages, NodeCore, PodRuntime, Rejection, ReleaseError, RuntimePodStatus,
};
pub use crate::error::ClusterError;
pub use crate::metrics::ClusterMetrics;
pub use crate::node_status::{DeviceCapacity, MachineInfo, Readiness};
/// The API client cluster mode runs on (from [`connect`]).
pub use kube::Client;

/// What runs the pods' containers.
#[derive(Clone, Default)]
pub enum Runtime {
    /// Nothing runs them: an admitted pod is reported `Running` with ready containers (as
    /// kwok does), so schedulers, controllers and device plugins can be exercised at scale
    /// without containers.
    #[default]
    Simulated,
    /// A real container runtime runs them and reports their containers' states.
    Cri(Arc<dyn PodRuntime>),
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl Runtime {
    /// The name used on the command line and in the node's status (`simulated`, or the CRI
    /// runtime's own name).
    pub fn name(&self) -> String {
        match self {
            Runtime::Simulated => "simulated".to_owned(),
            Runtime::Cri(runtime) => runtime.name(),
        }
    }
}

/// Settings of cluster mode.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The Node's name (the identity's `system:node:<name>`).
    pub node_name: String,
    /// What runs containers.
    pub runtime: Runtime,
    /// The machine as reported in the Node's capacity.
    pub machine: MachineInfo,
}

/// The running cluster front end.
#[derive(Debug)]
pub struct Cluster {
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Cluster {
    /// Starts the Node reporter, the Lease keeper and the pod worker for `node` on the
    /// current tokio runtime.
    pub fn start<N: NodeCore>(
        client: kube::Client,
        config: ClusterConfig,
        node: Arc<N>,
        metrics: ClusterMetrics,
    ) -> Cluster {
        let (shutdown, stop) = watch::channel(false);
        let reporter = node::NodeReporter::new(
            client.clone(),
            &config.node_name,
            config.machine.clone(),
            Readiness::ready(&config.runtime.name()),
            node.clone(),
            metrics.clone(),
        );
        let lease = lease::LeaseKeeper::new(
            client.clone(),
            &config.node_name,
            reporter.node_uid(),
            metrics.clone(),
        );
        let statuses = status_manager::StatusManager::start(client.clone(), metrics.clone());
        let mut pods = pods::PodWorker::new(
            &config.node_name,
            &config.machine.internal_ip,
            node.clone(),
            statuses,
        );
        if let Runtime::Cri(runtime) = &config.runtime {
            pods = pods.with_runtime(Arc::clone(runtime));
        }
        let pods = pods.with_events(events::EventRecorder::new(
            client.clone(),
            &config.node_name,
            metrics.clone(),
        ));
        let janitor = slices::SliceJanitor::new(
            node,
            slices::KubeSlices::new(client.clone(), &config.node_name),
            &config.node_name,
            Some(metrics.clone()),
        );
        let tasks = vec![
            tokio::spawn(reporter.run(stop.clone())),
            tokio::spawn(lease.run(stop.clone())),
            tokio::spawn(janitor.run(stop.clone())),
            tokio::spawn(pods.run(client, metrics, stop)),
        ];
        Cluster { shutdown, tasks }
    }

    /// Stops every task and waits for them.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
