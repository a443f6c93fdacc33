//! devicelet-node: the node core. Everything the node *decides* lives here, and every front
//! end drives it: the local control API and PodResources (devicelet-rpc) and the cluster
//! watcher (devicelet-kube, through the binary's `ClusterNode`).
//!
//! - [`admitted`]: what the node shows of an admitted pod (`admit` / `get pods` JSON).
//! - [`pods`]: pod admission (the kubelet's admit path over the Topology, Device and CPU
//!   managers, then DRA claims), start, removal, sync and listing, idempotent by UID.
//! - [`alignment`]: the Topology Manager admit handler and the CPU manager as hint providers.
//! - [`durable`]: the admission's durable commit into the journalled device state, and the
//!   restore at start.
//! - [`dra`]: DRA claims on the node ([`DraNode`]): the local object store, admission of a
//!   pod's claims, the drivers' health, unprepare retries.
//! - [`health`]: KEP-4680 resource health for pod status.
//! - [`picture`]: the node as a picture ([`picture::NodePicture`]): NUMA nodes with their CPUs,
//!   memory, devices and the pods holding them (`top --numa`, the `serve --ui-address` page).
//!
//! This crate holds no wire types: no tonic, prost, axum or hyper (`cargo tree -p
//! devicelet-node`). Its API is typed domain calls; the servers in devicelet-rpc only decode,
//! call the node and encode. Where the node must store a wire encoding (the plugin's `Allocate`
//! answer inside the kubelet's checkpoint), the front end passes it in
//! ([`durable::AllocRespCodec`]).

pub mod admitted;
pub mod alignment;
pub mod dra;
pub mod durable;
pub mod health;
pub mod picture;
pub mod pods;

pub use admitted::{ActivePods, AdmittedPod, PodList, PodSync};
pub use alignment::{Alignment, AlignmentConfig, AlignmentError, ClaimTopology, MachineSource};
pub use dra::{ClaimOrigin, DraNode, DraNodeError};
pub use durable::{AllocRespCodec, DurableState};
pub use pods::{PodAdmitter, PodError};
