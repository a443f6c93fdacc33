//! devicelet-checkpoint: the kubelet's node-local checkpoint formats, byte-exact, and devicelet's
//! durable store for device allocations.
//!
//! Upstream references: `pkg/kubelet/checkpointmanager/`, `pkg/kubelet/util/store/filestore.go`,
//! `pkg/kubelet/cm/devicemanager/checkpoint/`, `pkg/kubelet/cm/dra/state/`,
//! `pkg/kubelet/cm/cpumanager/state/` (Kubernetes 1.36); `spec/devicemanager.md` §3 and
//! `spec/dra-kubelet.md` §3.1.
//!
//! * [`device`] — `kubelet_internal_checkpoint` (JSON + FNV-1a-over-go-spew checksum), v2 and the
//!   legacy pre-1.20 layout.
//! * [`dra`] — `dra_manager_state` (JSON envelope + CRC-32 of the inner JSON string).
//! * [`cpu`] — `cpu_manager_state` v1/v2, and [`cpuset`] strings such as `0-3,8`.
//! * [`memory`] — `memory_manager_state` (v1 and the pod-level v2 layout).
//! * [`atomic_write`] — durable whole-file replacement; [`aside`] — moving a damaged file aside
//!   (`<name>.corrupt-<UTC>[.n]`), never over an earlier one.
//! * [`fault`] — injectable write faults (`EIO`, `ENOSPC`) for tests, compiled only with the
//!   `fault-injection` feature.
//! * [`store`] — [`store::DeviceStore`]: a journal with per-commit fsync, compacted into the
//!   kubelet-format file, so an admission costs the same with 10 or 10 000 pods admitted.
//! * [`snapshot`] — `device-allocations.snapshot`: devicelet's binary restart snapshot, used
//!   only while the kubelet file and the journal hash as recorded.
//! * [`inspect`] — recognises and verifies any of these files for `devicelet state inspect`.

pub mod aside;
pub mod atomic_write;
pub mod base64;
pub mod cpu;
pub mod cpuset;
pub mod device;
pub mod dra;
pub mod error;
pub mod fault;
pub mod gojson;
pub mod hash;
pub mod inspect;
pub mod journal;
pub mod memory;
pub mod snapshot;
pub mod spew;
pub mod state;
pub mod store;

pub use error::DecodeError;
