//! Public inputs and error classes of the allocator, mirroring
//! `k8s.io/dynamic-resource-allocation/structured/internal/types.go` (`Features`),
//! `structured/schedulerapi/types.go` (`AllocatedState`) and the error texts of
//! `structured/internal/incubating/allocator_incubating.go`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::quantity::Quantity;

/// Allocator feature switches (Go: `internal.Features`). Omitted = off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Features {
    pub admin_access: bool,
    pub prioritized_list: bool,
    pub partitionable_devices: bool,
    pub device_taints: bool,
    pub device_binding_and_status: bool,
    pub consumable_capacity: bool,
    pub list_type_attributes: bool,
}

impl Features {
    /// The Kubernetes 1.36 default gate set (selects the incubating allocator).
    pub fn kubernetes_1_36_defaults() -> Self {
        Features {
            admin_access: true,
            prioritized_list: true,
            partitionable_devices: true,
            device_taints: true,
            device_binding_and_status: true,
            consumable_capacity: true,
            list_type_attributes: false,
        }
    }
}

/// Which behaviour to follow where upstream Kubernetes 1.36.1 has a known bug (spec §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// The corrected behaviour (default): counters are released after taint/constraint
    /// rejections and share rollbacks (upstream #140436), counter caches are keyed by
    /// (driver, pool) (upstream #140434) and distinctAttribute compares against every
    /// allocated device (upstream #140438).
    #[default]
    Fixed,
    /// Bit-compatible with the Go incubating allocator of Kubernetes v1.36.1, bugs included.
    GoCompat,
}

/// A device identity: driver, pool and device name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// The allocations of all claims that are not being allocated in this call.
#[derive(Clone, Debug, Default)]
pub struct AllocatedState {
    /// Devices allocated exclusively.
    pub devices: BTreeSet<DeviceId>,
    /// Shares of multi-allocatable devices: (device, shareID).
    pub shared_devices: BTreeSet<(DeviceId, String)>,
    /// Per device, the summed consumed capacity of all its shares.
    pub consumed_capacity: BTreeMap<DeviceId, BTreeMap<String, Quantity>>,
}

impl AllocatedState {
    /// Adds one allocation result the way the scheduler builds its state
    /// (`dynamicresources/allocateddevices.go`): admin-access results are skipped; with
    /// ConsumableCapacity a result with a shareID is a share (plus its consumed capacity),
    /// everything else is exclusive.
    pub fn add_result(
        &mut self,
        result: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
        consumable_capacity: bool,
    ) -> Result<(), crate::quantity::QuantityError> {
        if result.admin_access == Some(true) {
            return Ok(());
        }
        let id = DeviceId {
            driver: result.driver.clone(),
            pool: result.pool.clone(),
            device: result.device.clone(),
        };
        match (&result.share_id, consumable_capacity) {
            (Some(share), true) => {
                if let Some(cc) = &result.consumed_capacity {
                    let entry = self.consumed_capacity.entry(id.clone()).or_default();
                    for (name, q) in cc {
                        let v = Quantity::parse(&q.0)?;
                        let slot = entry.entry(name.clone()).or_insert(Quantity::ZERO);
                        *slot = slot.add(&v);
                    }
                }
                self.shared_devices.insert((id, share.clone()));
            }
            _ => {
                self.devices.insert(id);
            }
        }
        Ok(())
    }
}

/// Limits and sources of one allocation call. The search gives up with an
/// [`ErrorClass::Timeout`] error once it has visited `step_budget` nodes of its depth-first tree
/// (Go's `allocateOne` invocations) or once `time_limit` has passed, whichever comes first.
#[derive(Clone, Debug)]
pub struct AllocateOptions {
    /// Maximum number of search steps per call; `None`: no step bound. Deterministic: the same
    /// inputs stop at the same step on any machine.
    pub step_budget: Option<u64>,
    /// Maximum time per call, as the scheduler bounds its Filter call; `None`: no time bound.
    pub time_limit: Option<TimeLimit>,
    /// Where the shareIDs of new shares come from; `None` draws random UUIDs like Go.
    pub share_ids: Option<Arc<dyn ShareIdSource>>,
    /// devicelet's own, off by default (upstream takes devices in slice order): try first the
    /// partitions of physical devices already partly in use — devices that consume a shared
    /// counter set some allocated device consumes too — so that whole devices stay free for
    /// requests that need one. The results differ from upstream's only in which devices are
    /// picked, never in whether a claim fits.
    pub pack_partitions: bool,
    /// devicelet's own, off by default: only devices on this NUMA node
    /// (`resource.kubernetes.io/numaNode` is it, or a list holding it) or on none (no such
    /// attribute) may be allocated. The scheduler sets it to put a pod's devices where its
    /// node still has the pod's exclusive CPUs (issue 41, docs/topology.md).
    pub numa_node: Option<u8>,
}

/// A time bound for one allocation call and the clock that measures it. The allocator never
/// reads a clock of its own: it asks `clock` every [`TIME_CHECK_INTERVAL`] search steps.
#[derive(Clone, Debug)]
pub struct TimeLimit {
    pub limit: Duration,
    pub clock: Arc<dyn Clock>,
}

/// A monotonic clock: the time since some fixed origin (only differences are used).
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Duration;
}

/// The process's monotonic clock (`std::time::Instant`), for callers that run for real; tests
/// inject their own [`Clock`].
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn start() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// How many search steps pass between two readings of the clock of a [`TimeLimit`] (a step
/// costs about 0.5-2 µs, so a limit is overrun by a few milliseconds at most, and the hot loop
/// only counts).
pub const TIME_CHECK_INTERVAL: u64 = 1024;

/// The scheduler's bound on one DRA Filter call (`Allocate` under a context with this timeout):
/// `DynamicResourcesFilterTimeoutDefault` = 10 s in `pkg/scheduler/apis/config/types_pluginargs.go`
/// (feature DRASchedulerFilterTimeout), used by `pkg/scheduler/framework/plugins/dynamicresources`.
/// devicelet's runs (`devicelet allocate`, scenarios without `timeoutSeconds` or `stepBudget`)
/// give up at the same time, so that within the scheduler's own limit they prove what Go proves.
pub const SCHEDULER_FILTER_TIMEOUT: Duration = Duration::from_secs(10);

impl AllocateOptions {
    /// At most `steps` search steps per call, no time bound: deterministic.
    pub fn with_step_budget(steps: u64) -> Self {
        AllocateOptions {
            step_budget: Some(steps),
            ..AllocateOptions::unbounded()
        }
    }

    /// At most `limit` per call, measured by `clock`; no step bound.
    pub fn with_time_limit(limit: Duration, clock: Arc<dyn Clock>) -> Self {
        AllocateOptions {
            time_limit: Some(TimeLimit { limit, clock }),
            ..AllocateOptions::unbounded()
        }
    }

    /// The scheduler's bound ([`SCHEDULER_FILTER_TIMEOUT`]) measured by `clock`.
    pub fn scheduler_default(clock: Arc<dyn Clock>) -> Self {
        Self::with_time_limit(SCHEDULER_FILTER_TIMEOUT, clock)
    }

    /// No step bound, no time bound.
    pub fn unbounded() -> Self {
        AllocateOptions {
            step_budget: None,
            time_limit: None,
            share_ids: None,
            pack_partitions: false,
            numa_node: None,
        }
    }
}

/// The source of the shareIDs given to shares of multi-allocatable devices (consumable
/// capacity). Go draws a random UUID for each (`uuid.NewUUID()` in `allocateDevice`); inject
/// a [`SeededShareIds`] to make a run repeatable.
pub trait ShareIdSource: Send + Sync + std::fmt::Debug {
    /// The next shareID (a UUID in text form).
    fn next_share_id(&self) -> String;
}

/// Random version-4 UUIDs, as upstream.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomShareIds;

impl ShareIdSource for RandomShareIds {
    fn next_share_id(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }
}

/// A repeatable sequence of version-4 UUIDs from a seed (splitmix64): two runs that start
/// from the same seed and make the same calls get the same shareIDs. The sequence continues
/// across calls, so the shares of consecutive pods stay distinct.
#[derive(Debug)]
pub struct SeededShareIds {
    state: AtomicU64,
}

impl SeededShareIds {
    /// A sequence starting at `seed`.
    pub fn new(seed: u64) -> Self {
        SeededShareIds {
            state: AtomicU64::new(seed),
        }
    }

    fn next_u64(&self) -> u64 {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut z = self
            .state
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl ShareIdSource for SeededShareIds {
    fn next_share_id(&self) -> String {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string()
    }
}

/// Default bound on search steps per allocation call for callers without a clock
/// ([`AllocateOptions::default`]): 2 million steps. One step (one node of the depth-first tree,
/// scanning up to all candidate devices) costs about 0.5-2 µs in release builds, so the bound
/// is about 1-4 s per call. Go has no step bound, only the scheduler's time limit
/// ([`SCHEDULER_FILTER_TIMEOUT`]), which devicelet's own runs use instead.
pub const DEFAULT_STEP_BUDGET: u64 = 2_000_000;

/// The bound for callers without a clock: [`DEFAULT_STEP_BUDGET`] steps, no time limit.
impl Default for AllocateOptions {
    fn default() -> Self {
        Self::with_step_budget(DEFAULT_STEP_BUDGET)
    }
}

/// Stable error classes (spec §5.2 / corpus README).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorClass {
    CELCompile,
    CELRuntime,
    AllModeIncompletePool,
    AllModeInvalidPool,
    ConstraintMust,
    ClaimLimit,
    UnknownClass,
    MissingClassName,
    NodeSelectorParse,
    NodeSelectorTerms,
    FeatureDisabled,
    UnknownMode,
    EmptySelector,
    EmptyConstraint,
    UnknownRequestType,
    InvalidInput,
    /// Per-node, non-fatal: no solution and an invalid pool was seen.
    InvalidPools,
    /// Step budget or time limit exceeded.
    Timeout,
}

impl ErrorClass {
    /// The outcome token this class maps to.
    pub fn outcome(self) -> &'static str {
        match self {
            ErrorClass::InvalidPools => "UnschedulableOnNode",
            ErrorClass::Timeout => "Timeout",
            _ => "Error",
        }
    }
}

/// An allocation error with Go's message text and a stable class.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AllocError {
    pub class: ErrorClass,
    pub message: String,
}

impl AllocError {
    pub(crate) fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        AllocError {
            class,
            message: message.into(),
        }
    }
}
