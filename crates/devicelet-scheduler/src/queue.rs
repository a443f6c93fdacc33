//! The scheduling queue (`pkg/scheduler/backend/queue/scheduling_queue.go`,
//! `backoff_queue.go`; spec scheduler.md S1-S9): activeQ ordered by priority then arrival,
//! backoffQ ordered by expiry, and the unschedulable pods, each waiting for a cluster event that
//! one of the plugins that rejected it cares about. Gated pods (PreEnqueue refused them) wait
//! with the unschedulable ones and are counted apart.
//!
//! Pure: the caller passes the time, so tests drive back-off and flushing without sleeping.
//! Events that arrive while a pod is in its scheduling cycle are kept for it and looked at
//! when the attempt fails, so no event is lost (S7).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodExtendedResourceClaimStatus, PodResourceClaimStatus};

use crate::framework::Plugin;

/// Back-off of the first retry (`podInitialBackoffSeconds`, S3).
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest back-off (`podMaxBackoffSeconds`, S3).
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Unschedulable pods are retried after this long without an event (S5).
pub const MAX_UNSCHEDULABLE_DURATION: Duration = Duration::from_secs(300);

/// A change in the cluster that may make pending pods schedulable (S8).
#[derive(Clone, Debug)]
pub enum ClusterEvent {
    NodeAdded,
    /// A node's labels, allocatable, taints or `unschedulable` changed.
    NodeChanged {
        labels: bool,
        allocatable: bool,
        taints: bool,
    },
    /// A pod bound to a node went away or finished: its resources are free.
    AssignedPodDeleted,
    /// A PersistentVolumeClaim, PersistentVolume or StorageClass was added or changed.
    VolumeChanged,
    /// A pod was seen bound to a node, or a bound pod's labels changed (upstream's
    /// `AssignedPod/Add` and `UpdatePodLabel`): pod affinity and spreading may change.
    AssignedPodChanged,
    /// A ResourceClaim was added or changed (`old` is `None` for an addition).
    ClaimChanged {
        namespace: String,
        name: String,
        /// It was allocated and no longer is (devices freed: S30 rule 2).
        deallocated: bool,
        created: bool,
        /// `status` changed (S30 rule 5).
        status_changed: bool,
    },
    ClassChanged,
    SliceChanged,
    /// The pod itself changed in a way scheduling can see (`change` says how).
    PodUpdated {
        uid: String,
        change: PodChange,
    },
    /// A PodGroup was added or changed (W9 `PodGroup/Add`).
    PodGroupChanged {
        namespace: String,
        name: String,
    },
    /// A pod of a group was added (W9 `Pod/Add`: the quorum may be there now).
    GroupMemberAdded {
        namespace: String,
        name: String,
    },
}

/// What an update of a pending pod changed, as far as scheduling goes (upstream's
/// `PodSchedulingPropertiesChange`). A status-only write changes none of it: the scheduler's
/// own `PodScheduled=False` condition, written after each failure, must not requeue the pod it
/// was written for (that would retry a waiting gang once per changed message).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodChange {
    pub labels: bool,
    /// Anything in `spec`: tolerations, requests, affinity, gates.
    pub spec: bool,
    /// `status.resourceClaimStatuses` or the extended-resource claim (DRA's
    /// `UpdatePodGeneratedResourceClaim`).
    pub claim_statuses: bool,
}

impl PodChange {
    pub fn between(old: &Pod, new: &Pod) -> Self {
        // A missing status and an empty one say the same.
        fn claims(
            p: &Pod,
        ) -> (
            Option<&Vec<PodResourceClaimStatus>>,
            Option<&PodExtendedResourceClaimStatus>,
        ) {
            let s = p.status.as_ref();
            (
                s.and_then(|s| s.resource_claim_statuses.as_ref())
                    .filter(|v| !v.is_empty()),
                s.and_then(|s| s.extended_resource_claim_status.as_ref()),
            )
        }
        PodChange {
            labels: old.metadata.labels != new.metadata.labels,
            spec: old.spec != new.spec,
            claim_statuses: claims(old) != claims(new),
        }
    }

    /// Whether any plugin could care.
    pub fn any(self) -> bool {
        self.labels || self.spec || self.claim_statuses
    }
}

/// Whether `plugin`, having rejected a pod, wants it retried after `event` (the plugins'
/// `EventsToRegister` with their QueueingHints).
fn interested(plugin: Plugin, event: &ClusterEvent, pod: &QueuedPod) -> bool {
    use ClusterEvent as E;
    match plugin {
        Plugin::SchedulingGates => {
            matches!(event, E::PodUpdated { uid, change } if *uid == pod.uid && change.spec)
        }
        // A refused pod may be helped by its own update, or by a change of its PodGroup.
        Plugin::Unsupported => match event {
            E::PodUpdated { uid, change } => *uid == pod.uid && change.any(),
            // An unbound WaitForFirstConsumer claim may get bound by someone else.
            E::VolumeChanged => true,
            E::PodGroupChanged { namespace, name } => pod.is_in_group(namespace, name),
            _ => false,
        },
        Plugin::GangScheduling => match event {
            E::PodGroupChanged { namespace, name } | E::GroupMemberAdded { namespace, name } => {
                pod.is_in_group(namespace, name)
            }
            _ => false,
        },
        Plugin::NodeUnschedulable => {
            matches!(event, E::NodeAdded | E::NodeChanged { taints: true, .. })
        }
        // Upstream also registers `Pod/UpdatePodToleration` for the pod itself.
        Plugin::TaintToleration => {
            matches!(event, E::NodeAdded | E::NodeChanged { taints: true, .. })
                || matches!(event, E::PodUpdated { uid, change } if *uid == pod.uid && change.spec)
        }
        Plugin::NodeName => matches!(event, E::NodeAdded),
        // Score plugins never reject a pod.
        Plugin::NodeResourcesBalancedAllocation | Plugin::ImageLocality => false,
        Plugin::NodeAffinity => {
            matches!(event, E::NodeAdded | E::NodeChanged { labels: true, .. })
                || matches!(event, E::PodUpdated { uid, change } if *uid == pod.uid && change.spec)
        }
        Plugin::NodePorts => matches!(event, E::NodeAdded | E::AssignedPodDeleted),
        Plugin::VolumeBinding | Plugin::VolumeZone => matches!(
            event,
            E::VolumeChanged | E::NodeAdded | E::NodeChanged { labels: true, .. }
        ),
        // A ReadWriteOncePod claim is freed when the pod using it goes; an attached volume
        // when its pod or VolumeAttachment goes, a limit when a CSINode changes.
        Plugin::VolumeRestrictions | Plugin::NodeVolumeLimits => {
            matches!(event, E::VolumeChanged | E::AssignedPodDeleted)
        }
        // Both count pods per topology domain: any assigned pod's change, a node's labels
        // (its domain) or, for spreading, its taints (nodeTaintsPolicy), and the pod's own
        // labels.
        Plugin::PodTopologySpread | Plugin::InterPodAffinity => {
            matches!(
                event,
                E::NodeAdded
                    | E::NodeChanged { labels: true, .. }
                    | E::AssignedPodDeleted
                    | E::AssignedPodChanged
            ) || (plugin == Plugin::PodTopologySpread
                && matches!(event, E::NodeChanged { taints: true, .. }))
                || matches!(event, E::PodUpdated { uid, change } if *uid == pod.uid && change.labels)
        }
        Plugin::NodeResourcesFit => {
            matches!(
                event,
                E::NodeAdded
                    | E::NodeChanged {
                        allocatable: true,
                        ..
                    }
                    | E::AssignedPodDeleted
                    | E::ClassChanged
            ) || matches!(event, E::PodUpdated { uid, change } if *uid == pod.uid && change.spec)
        }
        Plugin::DynamicResources => match event {
            E::NodeAdded
            | E::NodeChanged { labels: true, .. }
            | E::NodeChanged {
                allocatable: true, ..
            }
            | E::ClassChanged
            | E::SliceChanged => true,
            E::NodeChanged { .. }
            | E::AssignedPodDeleted
            | E::AssignedPodChanged
            | E::VolumeChanged
            | E::PodGroupChanged { .. }
            | E::GroupMemberAdded { .. } => false,
            // A gated pod's claims were not resolvable: any new claim may be one of them
            // (PreEnqueue runs again before it is queued).
            E::ClaimChanged { created: true, .. } if pod.gated => true,
            // S30: a deallocation may free devices for anyone; otherwise only the pod's own
            // claims, when created or when their status changed.
            E::ClaimChanged {
                namespace,
                name,
                deallocated,
                created,
                status_changed,
            } => {
                *deallocated
                    || (pod.claim_names.contains(&(namespace.clone(), name.clone()))
                        && (*created || *status_changed))
            }
            // S31: the pod's own claim statuses.
            E::PodUpdated { uid, change } => *uid == pod.uid && change.claim_statuses,
        },
    }
}

/// A pending pod and its scheduling history.
#[derive(Clone, Debug)]
pub struct QueuedPod {
    pub pod: Arc<Pod>,
    pub uid: String,
    /// Scheduling attempts so far.
    pub attempts: u32,
    /// When it (re)entered the queue: the tie-breaker of activeQ (S2).
    pub timestamp: Instant,
    /// When it was first seen (for the scheduling SLI).
    pub initial: Instant,
    /// The plugins that rejected its last attempt.
    pub rejected_by: BTreeSet<Plugin>,
    /// The pod's claims (`namespace`, `name`) as resolved at its last attempt.
    pub claim_names: BTreeSet<(String, String)>,
    /// Gated: PreEnqueue refused it (scheduling gates, claims not there yet).
    pub gated: bool,
    /// Its last attempt failed with an error (or its binding failed): its back-off is kept
    /// (upstream's `podErrorBackoffQ`, never popped early by S6).
    error_backoff: bool,
    seq: u64,
}

impl QueuedPod {
    /// Whether the pod belongs to PodGroup `namespace/name`.
    pub fn is_in_group(&self, namespace: &str, name: &str) -> bool {
        crate::gang::group_of(&self.pod).is_some_and(|(ns, n)| ns == namespace && n == name)
    }

    /// The pod's priority (activeQ order, W12 member order).
    pub fn priority(&self) -> i32 {
        self.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
    }

    /// The back-off after `attempts` attempts (S3): 1 s, 2 s, 4 s, 8 s, then 10 s.
    pub fn backoff(&self) -> Duration {
        self.backoff_between(INITIAL_BACKOFF, MAX_BACKOFF)
    }

    /// The back-off doubling from `initial` up to `max` (`podInitialBackoffSeconds`,
    /// `podMaxBackoffSeconds`).
    pub fn backoff_between(&self, initial: Duration, max: Duration) -> Duration {
        if self.attempts == 0 {
            return Duration::ZERO;
        }
        let shift = (self.attempts - 1).min(16);
        (initial * (1u32 << shift)).min(max)
    }
}

struct ActiveEntry {
    priority: i32,
    timestamp: Instant,
    seq: u64,
    uid: String,
}

impl PartialEq for ActiveEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for ActiveEntry {}
impl PartialOrd for ActiveEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ActiveEntry {
    /// Max-heap: higher priority first, then earlier timestamp, then earlier arrival.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.timestamp.cmp(&self.timestamp))
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

struct BackoffEntry {
    expiry: Instant,
    seq: u64,
    uid: String,
}

impl PartialEq for BackoffEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for BackoffEntry {}
impl PartialOrd for BackoffEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for BackoffEntry {
    /// Min-heap on expiry.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .expiry
            .cmp(&self.expiry)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Where a pod is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Active,
    Backoff,
    Unschedulable,
    /// Popped: in its scheduling cycle.
    InFlight,
}

/// Pod counts per queue, for `scheduler_pending_pods{queue}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
    pub gated: usize,
}

/// The queue. Heaps hold (uid, seq) and stale entries are skipped when popped.
#[derive(Default)]
pub struct SchedulingQueue {
    pods: HashMap<String, (QueuedPod, Place, Instant)>,
    active: BinaryHeap<ActiveEntry>,
    backoff: BinaryHeap<BackoffEntry>,
    /// Events seen while a pod was in flight.
    in_flight_events: HashMap<String, Vec<ClusterEvent>>,
    /// Pods handed to binding and not deleted since: a failed binding brings back only these.
    binding: HashSet<String>,
    seq: u64,
    /// `podInitialBackoffSeconds`, `podMaxBackoffSeconds`; `None`: 1 s and 10 s.
    backoff_limits: Option<(Duration, Duration)>,
}

impl std::fmt::Debug for SchedulingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulingQueue")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// The outcome of PreEnqueue for a pod: `None` to queue it, or the plugin that gates it and
/// why.
pub type Gate = Option<(Plugin, String)>;

/// Records PreEnqueue's outcome on the pod; `true` when it is gated (a gated pod waits for an
/// event of the plugin that gated it).
fn apply_gate(qp: &mut QueuedPod, gate: Gate) -> bool {
    match gate {
        None => {
            qp.gated = false;
            false
        }
        Some((plugin, _)) => {
            qp.gated = true;
            qp.rejected_by = BTreeSet::from([plugin]);
            true
        }
    }
}

impl SchedulingQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn push_active(&mut self, mut qp: QueuedPod, now: Instant) {
        qp.seq = self.next_seq();
        qp.timestamp = now;
        self.active.push(ActiveEntry {
            priority: qp.priority(),
            timestamp: now,
            seq: qp.seq,
            uid: qp.uid.clone(),
        });
        self.pods.insert(qp.uid.clone(), (qp, Place::Active, now));
    }

    /// Sets the back-off's start and ceiling (S3).
    pub fn set_backoff(&mut self, initial: Duration, max: Duration) {
        self.backoff_limits = Some((initial, max));
    }

    fn backoff_of(&self, qp: &QueuedPod) -> Duration {
        let (initial, max) = self
            .backoff_limits
            .unwrap_or((INITIAL_BACKOFF, MAX_BACKOFF));
        qp.backoff_between(initial, max)
    }

    fn push_backoff(&mut self, mut qp: QueuedPod, last_failure: Instant) {
        qp.seq = self.next_seq();
        self.backoff.push(BackoffEntry {
            expiry: last_failure + self.backoff_of(&qp),
            seq: qp.seq,
            uid: qp.uid.clone(),
        });
        self.pods
            .insert(qp.uid.clone(), (qp, Place::Backoff, last_failure));
    }

    fn park(&mut self, qp: QueuedPod, now: Instant) {
        self.pods
            .insert(qp.uid.clone(), (qp, Place::Unschedulable, now));
    }

    /// Moves a waiting pod to backoffQ if its back-off has not expired, else to activeQ.
    fn requeue(&mut self, qp: QueuedPod, last_failure: Instant, now: Instant) {
        if last_failure + self.backoff_of(&qp) > now {
            self.push_backoff(qp, last_failure);
        } else {
            self.push_active(qp, now);
        }
    }

    /// A pending pod of this scheduler was added (or seen for the first time).
    pub fn add(&mut self, pod: Arc<Pod>, gate: Gate, now: Instant) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.pods.contains_key(&uid) {
            self.update(pod, gate, now);
            return;
        }
        let mut qp = QueuedPod {
            pod,
            uid,
            attempts: 0,
            timestamp: now,
            initial: now,
            rejected_by: BTreeSet::new(),
            claim_names: BTreeSet::new(),
            gated: false,
            error_backoff: false,
            seq: 0,
        };
        if apply_gate(&mut qp, gate) {
            self.park(qp, now);
        } else {
            self.push_active(qp, now);
        }
    }

    /// The pod object changed. A gated pod is checked again; an unschedulable one is retried
    /// when a plugin that rejected it cares about its own updates.
    pub fn update(&mut self, pod: Arc<Pod>, gate: Gate, now: Instant) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some((mut qp, place, since)) = self.pods.remove(&uid) else {
            self.add(pod, gate, now);
            return;
        };
        let change = PodChange::between(&qp.pod, &pod);
        qp.pod = pod;
        match place {
            Place::Active | Place::Backoff => {
                self.pods.insert(uid, (qp, place, since));
            }
            Place::InFlight => {
                self.pods.insert(uid.clone(), (qp, place, since));
                if change.any() {
                    self.in_flight_events
                        .entry(uid.clone())
                        .or_default()
                        .push(ClusterEvent::PodUpdated { uid, change });
                }
            }
            Place::Unschedulable if qp.gated => {
                if apply_gate(&mut qp, gate) {
                    self.park(qp, now);
                } else {
                    self.push_active(qp, now);
                }
            }
            Place::Unschedulable => {
                let event = ClusterEvent::PodUpdated {
                    uid: uid.clone(),
                    change,
                };
                let wanted = qp.rejected_by.iter().any(|p| interested(*p, &event, &qp));
                if wanted {
                    self.admit_after_event(qp, gate, since, now);
                } else {
                    self.pods.insert(uid, (qp, place, since));
                }
            }
        }
    }

    /// After an event: gated again, or back with the back-off of its last failure at `since`.
    fn admit_after_event(&mut self, mut qp: QueuedPod, gate: Gate, since: Instant, now: Instant) {
        if apply_gate(&mut qp, gate) {
            self.park(qp, now);
        } else {
            self.requeue(qp, since, now);
        }
    }

    /// The pod is not pending for us (bound, assumed, or no longer ours).
    pub fn delete(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.in_flight_events.remove(uid);
    }

    /// A relist of pods ended with `names` (namespace, name) existing: queued pods not among
    /// them were deleted while the watch was down. Returns their UIDs.
    pub fn retain_pods(&mut self, names: &HashSet<(String, String)>) -> Vec<String> {
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, (qp, _, _))| !names.contains(&crate::cache::pod_key(&qp.pod)))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone {
            self.pod_deleted(uid);
        }
        gone
    }

    /// The pod was deleted from the API: also a binding in progress must not bring it back.
    pub fn pod_deleted(&mut self, uid: &str) {
        self.delete(uid);
        self.binding.remove(uid);
    }

    /// Every pod waiting in the queue (active, back-off, unschedulable or in flight).
    pub fn pending_pods(&self) -> Vec<Arc<Pod>> {
        self.pods
            .values()
            .map(|(qp, _, _)| qp.pod.clone())
            .collect()
    }

    /// Whether the queue holds the pod.
    pub fn contains(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// Moves expired back-offs to activeQ (every second upstream) and unschedulable pods
    /// parked for more than five minutes back (S5).
    pub fn flush(&mut self, now: Instant) {
        while let Some(top) = self.backoff.peek() {
            if top.expiry > now {
                break;
            }
            let Some(top) = self.backoff.pop() else { break };
            let live = matches!(self.pods.get(&top.uid), Some((qp, Place::Backoff, _)) if qp.seq == top.seq);
            if live && let Some((qp, _, _)) = self.pods.remove(&top.uid) {
                self.push_active(qp, now);
            }
        }
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, (qp, place, since))| {
                *place == Place::Unschedulable
                    && !qp.gated
                    && now.duration_since(*since) > MAX_UNSCHEDULABLE_DURATION
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            if let Some((qp, _, since)) = self.pods.remove(&uid) {
                self.requeue(qp, since, now);
            }
        }
    }

    /// When the next back-off expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.backoff.peek().map(|b| b.expiry)
    }

    /// Takes the next pod from activeQ (flush first). It stays known as in flight until
    /// [`SchedulingQueue::done`] or a failure puts it back.
    pub fn pop(&mut self, now: Instant) -> Option<QueuedPod> {
        self.flush(now);
        while let Some(top) = self.active.pop() {
            let live = matches!(self.pods.get(&top.uid), Some((qp, Place::Active, _)) if qp.seq == top.seq);
            if !live {
                continue;
            }
            let Some((qp, _, since)) = self.pods.get_mut(&top.uid).map(|e| {
                e.1 = Place::InFlight;
                e.clone()
            }) else {
                continue;
            };
            let _ = since;
            self.in_flight_events.insert(top.uid.clone(), Vec::new());
            let mut popped = qp;
            popped.attempts += 1;
            if let Some(entry) = self.pods.get_mut(&top.uid) {
                entry.0.attempts = popped.attempts;
            }
            return Some(popped);
        }
        self.pop_from_backoff()
    }

    /// S6 (`SchedulerPopFromBackoffQ`, on since 1.33): with activeQ empty, the backing-off pod
    /// whose back-off ends first goes at once. Only pods a plugin rejected (upstream's
    /// `podBackoffQ`; a pod that failed with an error keeps its back-off), and no PodGroup
    /// member: members go to backoffQ after every attempt (W10), and popping them early would
    /// retry a waiting group without pause (upstream's retry loop, A-L3).
    fn pop_from_backoff(&mut self) -> Option<QueuedPod> {
        let uid = self
            .backoff
            .iter()
            .filter(|b| {
                matches!(self.pods.get(&b.uid), Some((qp, Place::Backoff, _))
                    if qp.seq == b.seq
                        && !qp.error_backoff
                        && crate::gang::group_of(&qp.pod).is_none())
            })
            .min_by_key(|b| b.expiry)?
            .uid
            .clone();
        // Its heap entry goes stale (the pod is no longer in backoffQ) and is skipped later.
        let entry = self.pods.get_mut(&uid)?;
        entry.1 = Place::InFlight;
        entry.0.attempts += 1;
        let popped = entry.0.clone();
        self.in_flight_events.insert(uid, Vec::new());
        Some(popped)
    }

    /// W11: every other queued member of group `key` that PreEnqueue lets through, pulled out
    /// of activeQ, backoffQ or the unschedulable pods at once (their back-off is ignored) and
    /// marked in flight with the popped pod. Gated and in-flight members are skipped.
    pub fn take_group(&mut self, namespace: &str, name: &str) -> Vec<QueuedPod> {
        let uids: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, (qp, place, _))| {
                *place != Place::InFlight && !qp.gated && qp.is_in_group(namespace, name)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        let mut out = Vec::with_capacity(uids.len());
        for uid in uids {
            if let Some(entry) = self.pods.get_mut(&uid) {
                entry.1 = Place::InFlight;
                entry.0.attempts += 1;
                out.push(entry.0.clone());
                self.in_flight_events.insert(uid, Vec::new());
            }
        }
        out
    }

    /// The pod's attempt succeeded (assumed and handed to binding): it leaves the queue.
    pub fn done(&mut self, uid: &str) {
        self.in_flight_events.remove(uid);
        if self.pods.remove(uid).is_some() {
            self.binding.insert(uid.to_owned());
        }
    }

    /// Whether the pod is being bound (handed to binding and not deleted since).
    pub fn is_binding(&self, uid: &str) -> bool {
        self.binding.contains(uid)
    }

    /// The pod's binding ended: bound, or bound by someone else.
    pub fn binding_finished(&mut self, uid: &str) {
        self.binding.remove(uid);
    }

    /// The attempt was rejected by `plugins` (S7, S9): the pod waits for an event one of them
    /// cares about, unless such an event arrived during the attempt.
    pub fn unschedulable(
        &mut self,
        mut qp: QueuedPod,
        plugins: BTreeSet<Plugin>,
        claim_names: BTreeSet<(String, String)>,
        now: Instant,
    ) {
        let events = self.in_flight_events.remove(&qp.uid).unwrap_or_default();
        if !self.pods.contains_key(&qp.uid) {
            return; // deleted meanwhile
        }
        qp.rejected_by = plugins;
        qp.claim_names = claim_names;
        qp.error_backoff = false;
        if let Some((current, _, _)) = self.pods.get(&qp.uid) {
            qp.pod = current.pod.clone();
        }
        let wanted = events
            .iter()
            .any(|e| qp.rejected_by.iter().any(|p| interested(*p, e, &qp)));
        if wanted {
            self.push_backoff(qp, now);
        } else {
            self.park(qp, now);
        }
    }

    /// The attempt failed with an error, or binding failed (S9, S24): back-off, no event
    /// needed.
    pub fn error(&mut self, mut qp: QueuedPod, now: Instant) {
        self.in_flight_events.remove(&qp.uid);
        qp.error_backoff = true;
        if let Some((current, _, _)) = self.pods.get(&qp.uid) {
            qp.pod = current.pod.clone();
        }
        self.push_backoff(qp, now);
    }

    /// A pod whose binding failed comes back (it left the queue at [`SchedulingQueue::done`]),
    /// unless it was deleted meanwhile; `false` then.
    pub fn binding_failed(&mut self, mut qp: QueuedPod, now: Instant) -> bool {
        if !self.binding.remove(&qp.uid) {
            return false;
        }
        qp.error_backoff = true;
        self.push_backoff(qp, now);
        true
    }

    /// A cluster event: every unschedulable pod rejected by a plugin that cares moves to
    /// backoffQ or activeQ (S7); pods in flight remember it. `gate` re-runs PreEnqueue for
    /// gated pods.
    pub fn on_event(&mut self, event: &ClusterEvent, gate: impl Fn(&Pod) -> Gate, now: Instant) {
        for events in self.in_flight_events.values_mut() {
            events.push(event.clone());
        }
        let moving: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, (qp, place, _))| {
                *place == Place::Unschedulable
                    && qp.rejected_by.iter().any(|p| interested(*p, event, qp))
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in moving {
            if let Some((qp, _, since)) = self.pods.remove(&uid) {
                let g = gate(&qp.pod);
                self.admit_after_event(qp, g, since, now);
            }
        }
    }

    /// Unschedulable (not gated) pods per plugin that rejected them, for
    /// `scheduler_unschedulable_pods{plugin}`.
    pub fn unschedulable_by_plugin(&self) -> BTreeMap<Plugin, usize> {
        let mut out = BTreeMap::new();
        for (qp, place, _) in self.pods.values() {
            if *place == Place::Unschedulable && !qp.gated {
                for p in &qp.rejected_by {
                    *out.entry(*p).or_default() += 1;
                }
            }
        }
        out
    }

    /// Pod counts per queue.
    pub fn counts(&self) -> QueueCounts {
        let mut c = QueueCounts::default();
        for (qp, place, _) in self.pods.values() {
            match place {
                Place::Active => c.active += 1,
                Place::Backoff => c.backoff += 1,
                Place::Unschedulable if qp.gated => c.gated += 1,
                Place::Unschedulable => c.unschedulable += 1,
                Place::InFlight => {}
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(uid: &str, priority: i32) -> Arc<Pod> {
        let mut p = Pod {
            spec: Some(PodSpec {
                priority: Some(priority),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        p.metadata.uid = Some(uid.into());
        Arc::new(p)
    }

    #[test]
    fn s2_priority_then_arrival() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(pod("low", 0), None, t0);
        q.add(pod("high", 10), None, t0 + Duration::from_millis(1));
        q.add(pod("low2", 0), None, t0 + Duration::from_millis(2));
        let order: Vec<String> = (0..3)
            .filter_map(|_| q.pop(t0 + Duration::from_millis(3)).map(|p| p.uid))
            .collect();
        assert_eq!(order, vec!["high", "low", "low2"]);
    }

    #[test]
    fn a_pod_deleted_while_binding_is_not_brought_back() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        for uid in ["kept", "gone"] {
            q.add(pod(uid, 0), None, t0);
        }
        let a = q.pop(t0).expect("first");
        let b = q.pop(t0).expect("second");
        q.done(&a.uid);
        q.done(&b.uid);
        q.pod_deleted("gone");
        let (kept, gone) = if a.uid == "kept" { (a, b) } else { (b, a) };
        assert!(!q.binding_failed(gone, t0), "deleted while binding");
        assert!(q.binding_failed(kept, t0), "a live pod backs off");
        assert!(q.contains("kept") && !q.contains("gone"));
    }

    #[test]
    fn a_relist_drops_queued_pods_deleted_while_the_watch_was_down() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        for (uid, name) in [("u1", "a"), ("u2", "b")] {
            let mut p = (*pod(uid, 0)).clone();
            p.metadata.namespace = Some("ns".into());
            p.metadata.name = Some(name.into());
            q.add(Arc::new(p), None, t0);
        }
        let names = HashSet::from([("ns".to_owned(), "a".to_owned())]);
        assert_eq!(q.retain_pods(&names), vec!["u2".to_owned()]);
        assert!(q.contains("u1") && !q.contains("u2"));
    }

    #[test]
    fn s3_backoff_doubles_to_ten_seconds() {
        let mut qp = QueuedPod {
            pod: pod("p", 0),
            uid: "p".into(),
            attempts: 0,
            timestamp: Instant::now(),
            initial: Instant::now(),
            rejected_by: BTreeSet::new(),
            claim_names: BTreeSet::new(),
            gated: false,
            error_backoff: false,
            seq: 0,
        };
        let mut seen = Vec::new();
        for attempts in 0..7 {
            qp.attempts = attempts;
            seen.push(qp.backoff().as_secs());
        }
        assert_eq!(seen, vec![0, 1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn s7_only_events_a_rejecting_plugin_cares_about_move_the_pod() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(pod("p", 0), None, t0);
        let qp = q.pop(t0).expect("popped");
        q.unschedulable(
            qp,
            BTreeSet::from([Plugin::TaintToleration]),
            BTreeSet::new(),
            t0,
        );
        assert_eq!(q.counts().unschedulable, 1);
        assert_eq!(
            q.unschedulable_by_plugin(),
            BTreeMap::from([(Plugin::TaintToleration, 1)])
        );
        q.on_event(&ClusterEvent::SliceChanged, |_| None, t0);
        assert_eq!(q.counts().unschedulable, 1);
        q.on_event(
            &ClusterEvent::NodeChanged {
                labels: false,
                allocatable: false,
                taints: true,
            },
            |_| None,
            t0 + Duration::from_millis(100),
        );
        // Back-off (1 s after one attempt) has not expired: backoffQ.
        assert_eq!(q.counts().backoff, 1);
        // S6: a pod in activeQ goes first; with activeQ empty the backing-off pod goes at
        // once.
        q.add(pod("a", 0), None, t0 + Duration::from_millis(200));
        let first = q.pop(t0 + Duration::from_millis(500)).expect("popped");
        assert_eq!(first.uid, "a");
        let second = q.pop(t0 + Duration::from_millis(500)).expect("popped");
        assert_eq!(second.uid, "p");
        assert_eq!(second.attempts, 2);
        // Its stale backoffQ entry never brings it back.
        q.done("p");
        assert!(q.pop(t0 + Duration::from_millis(1001)).is_none());
    }

    #[test]
    fn s6_errors_and_group_members_keep_their_back_off() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        // Pops `uid`, NodeAffinity rejects it, and a node's labels change at `at`.
        let rejected_then_moved = |q: &mut SchedulingQueue, uid: &str, at: Instant| {
            let qp = q.pop(t0).expect("popped");
            assert_eq!(qp.uid, uid);
            q.unschedulable(
                qp,
                BTreeSet::from([Plugin::NodeAffinity]),
                BTreeSet::new(),
                t0,
            );
            q.on_event(
                &ClusterEvent::NodeChanged {
                    labels: true,
                    allocatable: false,
                    taints: false,
                },
                |_| None,
                at,
            );
        };
        // An error: backoffQ, not popped early; also after an earlier plugin rejection.
        q.add(pod("e", 0), None, t0);
        rejected_then_moved(&mut q, "e", t0);
        let qp = q.pop(t0).expect("S6: moved by an event, popped at once");
        q.error(qp, t0);
        assert_eq!(q.counts().backoff, 1);
        assert!(q.pop(t0 + Duration::from_millis(500)).is_none());
        assert!(q.pop(t0 + Duration::from_millis(2001)).is_some());
        // A PodGroup member rejected by a plugin and moved by an event: not popped early.
        let mut member = (*pod("m", 0)).clone();
        member
            .spec
            .get_or_insert_with(Default::default)
            .scheduling_group = Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
            pod_group_name: Some("g".into()),
        });
        q.add(Arc::new(member), None, t0);
        rejected_then_moved(&mut q, "m", t0 + Duration::from_millis(100));
        assert!(q.pop(t0 + Duration::from_millis(500)).is_none());
    }

    #[test]
    fn s31_the_schedulers_own_status_write_does_not_requeue_but_claim_statuses_do() {
        use k8s_openapi::api::core::v1::{PodCondition, PodResourceClaimStatus, PodStatus};
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(pod("p", 0), None, t0);
        let qp = q.pop(t0).expect("popped");
        q.unschedulable(
            qp,
            BTreeSet::from([Plugin::DynamicResources, Plugin::NodeResourcesFit]),
            BTreeSet::new(),
            t0,
        );
        let mut written = (*pod("p", 0)).clone();
        written.metadata.resource_version = Some("2".into());
        written.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                message: Some("0/6 nodes are available".into()),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        q.update(Arc::new(written.clone()), None, t0);
        assert_eq!(
            q.counts().unschedulable,
            1,
            "a status-only write is no event"
        );
        if let Some(status) = written.status.as_mut() {
            status.resource_claim_statuses = Some(vec![PodResourceClaimStatus {
                name: "gpu".into(),
                resource_claim_name: Some("p-gpu".into()),
            }]);
        }
        q.update(Arc::new(written), None, t0);
        assert_eq!(q.counts().backoff, 1, "its generated claim is");
    }

    #[test]
    fn s7_an_event_during_the_attempt_is_not_lost() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(pod("p", 0), None, t0);
        let qp = q.pop(t0).expect("popped");
        q.on_event(&ClusterEvent::SliceChanged, |_| None, t0);
        q.unschedulable(
            qp,
            BTreeSet::from([Plugin::DynamicResources]),
            BTreeSet::new(),
            t0,
        );
        assert_eq!(q.counts().backoff, 1);
    }

    #[test]
    fn s30_claim_events_move_only_the_pods_of_that_claim_unless_devices_were_freed() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(pod("p", 0), None, t0);
        let qp = q.pop(t0).expect("popped");
        let mine = BTreeSet::from([("ns".to_owned(), "mine".to_owned())]);
        q.unschedulable(qp, BTreeSet::from([Plugin::DynamicResources]), mine, t0);
        let change = |name: &str, deallocated: bool| ClusterEvent::ClaimChanged {
            namespace: "ns".into(),
            name: name.into(),
            deallocated,
            created: false,
            status_changed: true,
        };
        q.on_event(&change("other", false), |_| None, t0);
        assert_eq!(q.counts().unschedulable, 1);
        q.on_event(&change("other", true), |_| None, t0);
        assert_eq!(q.counts().backoff, 1);
    }

    #[test]
    fn gated_pods_wait_until_their_update_passes_pre_enqueue() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(
            pod("p", 0),
            Some((Plugin::SchedulingGates, "gated".into())),
            t0,
        );
        assert_eq!(q.counts().gated, 1);
        assert!(q.pop(t0).is_none());
        q.update(
            pod("p", 0),
            Some((Plugin::SchedulingGates, "gated".into())),
            t0,
        );
        assert_eq!(q.counts().gated, 1);
        q.update(pod("p", 0), None, t0);
        assert!(q.pop(t0).is_some());
    }

    fn member(uid: &str, group: &str) -> Arc<Pod> {
        let mut p = (*pod(uid, 0)).clone();
        p.metadata.namespace = Some("ns".into());
        if let Some(spec) = p.spec.as_mut() {
            spec.scheduling_group = Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
                pod_group_name: Some(group.into()),
            });
        }
        Arc::new(p)
    }

    #[test]
    fn w11_a_group_is_pulled_whole_ignoring_back_off_but_not_gates() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(member("a", "g"), None, t0);
        q.add(member("b", "g"), None, t0);
        q.add(
            member("c", "g"),
            Some((Plugin::SchedulingGates, "gated".into())),
            t0,
        );
        q.add(member("x", "other"), None, t0);
        // The first member failed before and is backing off.
        let failed = q.pop(t0).expect("popped");
        q.error(failed, t0);
        let first = q.pop(t0).expect("popped");
        let mut siblings: Vec<String> =
            q.take_group("ns", "g").into_iter().map(|p| p.uid).collect();
        siblings.push(first.uid.clone());
        siblings.sort();
        assert_eq!(
            siblings,
            vec!["a", "b"],
            "the member backing off comes along"
        );
        assert_eq!(q.counts().gated, 1, "the gated member stays");
    }

    #[test]
    fn a_l3_a_parked_group_waits_for_its_own_group_events() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(member("a", "g"), None, t0);
        let a = q.pop(t0).expect("popped");
        q.unschedulable(
            a,
            BTreeSet::from([Plugin::GangScheduling]),
            BTreeSet::new(),
            t0,
        );
        let later = t0 + Duration::from_secs(60);
        for other in ["other", "g2"] {
            q.on_event(
                &ClusterEvent::GroupMemberAdded {
                    namespace: "ns".into(),
                    name: other.into(),
                },
                |_| None,
                later,
            );
        }
        q.on_event(&ClusterEvent::SliceChanged, |_| None, later);
        assert_eq!(q.counts().unschedulable, 1, "nothing of its group happened");
        q.on_event(
            &ClusterEvent::GroupMemberAdded {
                namespace: "ns".into(),
                name: "g".into(),
            },
            |_| None,
            later,
        );
        assert!(q.pop(later).is_some());
    }

    #[test]
    fn s5_unschedulable_pods_are_retried_after_five_minutes() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::new();
        q.add(pod("p", 0), None, t0);
        let qp = q.pop(t0).expect("popped");
        q.unschedulable(qp, BTreeSet::from([Plugin::NodeName]), BTreeSet::new(), t0);
        assert!(q.pop(t0 + Duration::from_secs(299)).is_none());
        assert!(q.pop(t0 + Duration::from_secs(301)).is_some());
    }
}
