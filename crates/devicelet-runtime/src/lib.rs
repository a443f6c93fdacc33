//! devicelet's CRI runtime: pods the node admitted run in a real container runtime
//! (containerd, CRI-O) over the CRI v1 API, with what devicelet decided for each container —
//! device plugin envs, mounts, device nodes and annotations, CDI devices, exclusive CPUs and
//! memory nodes — and their containers' real states reported back.
//!
//! Follows the kubelet's `pkg/kubelet/kuberuntime` (sandbox and container configs, `SyncPod`,
//! `KillPod`), `pkg/kubelet/pleg` (the relist) and `pkg/kubelet/kubelet_pods.go` (phase and
//! container statuses).
//!
//! - [`cri`]: the CRI client;
//! - [`config`]: a pod's sandbox and container configs (pure);
//! - [`status`]: what to start and the pod's status from what the runtime reports (pure);
//! - [`cdi`]: CDI names resolved by devicelet for runtimes that do not apply CDI;
//! - [`logs`]: the kubelet's log layout and the CRI log format;
//! - [`atomic_writer`]: the kubelet's atomic writer layout for projected files;
//! - [`volumes`]: configMap, secret, projected and downwardAPI volumes, service account
//!   tokens and the `kubernetes` Service's env (cluster mode);
//! - [`pleg`]: the relist (one listing of all pods, diffed with the previous one) and the
//!   sync loop's schedule (pure);
//! - [`manager`]: [`CriRuntime`], which owns the pods it runs.

pub mod atomic_writer;
pub mod cdi;
pub mod config;
pub mod cri;
pub mod downward;
pub mod error;
pub mod logs;
pub mod manager;
pub mod pleg;
pub mod status;
pub mod volumes;

pub use cdi::{CdiCheck, CdiEdits, CdiResolver, default_spec_dirs, spec_dirs};
pub use cri::CriClient;
pub use error::RuntimeError;
pub use manager::{ContainerSettings, CriConfig, CriRuntime};
pub use status::{ContainerState, ContainerStatus, PodRuntimeStatus};
pub use volumes::{IssuedToken, PodApi, PodApiHandle, ServiceAddress, ServicePort, TokenSpec};
