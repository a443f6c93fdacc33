//! The pod lifecycle event generator's relist, in our own words after the kubelet's
//! `pkg/kubelet/pleg/generic.go` (`GenericPLEG.Relist`, `computeEvents`, `generateEvents`):
//! once a period the runtime is listed for all pods at once (one `ListPodSandbox`, one
//! `ListContainers`, filtered only by this devicelet's instance label), the answer is grouped by
//! pod UID ([`group`]) and compared with the previous relist ([`events`]); only the pods with an
//! event are synced. Pure: no IO.
//!
//! [`Schedule`] is the sync loop's bookkeeping (which pod is due, and why; when the loop must
//! wake next), also without IO: a pod is synced when its runtime state changed, when its
//! desired state changed (added, updated), when a back-off it waits out ends, or when its last
//! sync failed (on the next relist). A pod with none of these costs no runtime call.
//!
//! As upstream, a sandbox counts as one more "container" of its pod (`getContainersFromPods`):
//! a sandbox that is ready is running, one that is not ready has exited.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use devicelet_proto::cri::v1 as cri;
use tokio::time::Instant;

use crate::config::{LABEL_CONTAINER_NAME, LABEL_POD_UID};

/// A sandbox's or container's state as the relist sees it (upstream's `plegContainerState`,
/// with `created` kept apart from `unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Created, never started (containers only).
    Created,
    /// Running (a sandbox: ready).
    Running,
    /// Exited (a sandbox: not ready).
    Exited,
    /// The runtime does not say.
    Unknown,
}

impl State {
    /// A container's state from the CRI enum.
    pub fn of_container(state: i32) -> State {
        match cri::ContainerState::try_from(state) {
            Ok(cri::ContainerState::ContainerCreated) => State::Created,
            Ok(cri::ContainerState::ContainerRunning) => State::Running,
            Ok(cri::ContainerState::ContainerExited) => State::Exited,
            _ => State::Unknown,
        }
    }

    /// A sandbox's state from the CRI enum.
    pub fn of_sandbox(state: i32) -> State {
        match cri::PodSandboxState::try_from(state) {
            Ok(cri::PodSandboxState::SandboxReady) => State::Running,
            Ok(cri::PodSandboxState::SandboxNotready) => State::Exited,
            _ => State::Unknown,
        }
    }
}

/// One sandbox or container of a pod, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The runtime's ID.
    pub id: String,
    /// The container's name (empty for a sandbox).
    pub name: String,
    /// CRI metadata `attempt`.
    pub attempt: u32,
    /// State.
    pub state: State,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
}

/// What the runtime has of one pod, each list sorted by ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRecord {
    /// The pod's sandboxes.
    pub sandboxes: Vec<Entry>,
    /// The pod's containers, every attempt.
    pub containers: Vec<Entry>,
}

impl PodRecord {
    /// The newest ready sandbox's ID.
    pub fn ready_sandbox(&self) -> Option<&str> {
        self.sandboxes
            .iter()
            .filter(|s| s.state == State::Running)
            .max_by_key(|s| s.created_at)
            .map(|s| s.id.as_str())
    }

    /// The attempt the next sandbox gets (one past the highest so far).
    pub fn next_sandbox_attempt(&self) -> u32 {
        self.sandboxes
            .iter()
            .map(|s| s.attempt.saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    fn all(&self) -> impl Iterator<Item = &Entry> {
        self.sandboxes.iter().chain(self.containers.iter())
    }
}

/// One relist: every pod the runtime has (of this devicelet), by pod UID.
pub type Relist = BTreeMap<String, PodRecord>;

/// Groups one `ListPodSandbox` and one `ListContainers` answer by pod UID (the
/// `io.kubernetes.pod.uid` label; anything without it is not a pod's and is left out).
pub fn group(sandboxes: &[cri::PodSandbox], containers: &[cri::Container]) -> Relist {
    let mut out = Relist::new();
    for s in sandboxes {
        let Some(uid) = s.labels.get(LABEL_POD_UID) else {
            continue;
        };
        out.entry(uid.clone()).or_default().sandboxes.push(Entry {
            id: s.id.clone(),
            name: String::new(),
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            state: State::of_sandbox(s.state),
            created_at: s.created_at,
        });
    }
    for c in containers {
        let Some(uid) = c.labels.get(LABEL_POD_UID) else {
            continue;
        };
        let Some(name) = c
            .labels
            .get(LABEL_CONTAINER_NAME)
            .cloned()
            .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))
        else {
            continue;
        };
        out.entry(uid.clone()).or_default().containers.push(Entry {
            id: c.id.clone(),
            name,
            attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
            state: State::of_container(c.state),
            created_at: c.created_at,
        });
    }
    for record in out.values_mut() {
        record.sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
        record.containers.sort_by(|a, b| a.id.cmp(&b.id));
    }
    out
}

/// What happened to one sandbox or container between two relists (upstream's
/// `PodLifeCycleEventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Now running (`ContainerStarted`).
    Started,
    /// Now exited, or gone without being seen exited (`ContainerDied`).
    Died,
    /// Gone (`ContainerRemoved`).
    Removed,
    /// Now created or unknown (`ContainerChanged`).
    Changed,
}

/// One event of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The pod's UID.
    pub pod_uid: String,
    /// The sandbox's or container's ID.
    pub id: String,
    /// What happened.
    pub kind: EventKind,
}

/// Upstream's `generateEvents`: the events of one ID whose state went from `old` to `new`
/// (`None`: not there).
fn generate(pod_uid: &str, id: &str, old: Option<State>, new: Option<State>, out: &mut Vec<Event>) {
    if old == new {
        return;
    }
    let mut push = |kind| {
        out.push(Event {
            pod_uid: pod_uid.to_owned(),
            id: id.to_owned(),
            kind,
        });
    };
    match new {
        Some(State::Running) => push(EventKind::Started),
        Some(State::Exited) => push(EventKind::Died),
        Some(State::Created | State::Unknown) => push(EventKind::Changed),
        None if old == Some(State::Exited) => push(EventKind::Removed),
        None => {
            push(EventKind::Died);
            push(EventKind::Removed);
        }
    }
}

/// The events between relist `old` and relist `new`, by pod UID then ID (upstream's
/// `computeEvents` over every pod of either relist).
pub fn events(old: &Relist, new: &Relist) -> Vec<Event> {
    let empty = PodRecord::default();
    let uids: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let mut out = Vec::new();
    for uid in uids {
        let before = old.get(uid).unwrap_or(&empty);
        let after = new.get(uid).unwrap_or(&empty);
        if before == after {
            continue;
        }
        let states = |r: &PodRecord| -> BTreeMap<String, State> {
            r.all().map(|e| (e.id.clone(), e.state)).collect()
        };
        let (was, is) = (states(before), states(after));
        let ids: BTreeSet<&String> = was.keys().chain(is.keys()).collect();
        for id in ids {
            generate(uid, id, was.get(id).copied(), is.get(id).copied(), &mut out);
        }
    }
    out
}

/// The pods with at least one event.
pub fn changed_pods(events: &[Event]) -> BTreeSet<String> {
    events.iter().map(|e| e.pod_uid.clone()).collect()
}

/// Why a pod is to be synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Trigger {
    /// The relist saw a change, a back-off ended or the last sync failed: the last relist's
    /// record of the pod may be used (when no sync of it ran since).
    Runtime,
    /// The pod was added or updated: it is listed afresh (the last relist may predate it).
    Desired,
}

/// What the loop is to do for one pod now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// A sync; `use_relist`: the last relist's record of the pod is current for it (no sync
    /// of the pod ran since, nor was in flight while it was taken), so the sync need not list
    /// the runtime itself.
    Sync {
        /// The pod's UID.
        uid: String,
        /// See [`Job::Sync`].
        use_relist: bool,
    },
    /// Only the pod's configMap, secret and projected volumes are read again (no runtime
    /// call).
    Volumes {
        /// The pod's UID.
        uid: String,
    },
}

impl Job {
    /// The pod's UID.
    pub fn uid(&self) -> &str {
        match self {
            Job::Sync { uid, .. } | Job::Volumes { uid } => uid,
        }
    }
}

/// When a finished job wants its pod looked at again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wake {
    /// The earliest end of a back-off the pod waits out (a sync then).
    pub backoff: Option<Instant>,
    /// When the pod's API-backed volumes are due to be read again.
    pub volumes: Option<Instant>,
}

/// How a job of the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A sync is done; when the pod wants to be looked at again.
    Done(Wake),
    /// A volume refresh is done; when the volumes are due again (a back-off the pod waits
    /// out stays as it was).
    Refreshed(Option<Instant>),
    /// The sync failed: the pod is synced again on the next relist.
    Failed,
}

/// The sync loop's bookkeeping: which pods are due, and when to wake next. No IO.
#[derive(Debug, Default)]
pub struct Schedule {
    known: HashSet<String>,
    dirty: BTreeMap<String, Trigger>,
    in_flight: HashSet<String>,
    /// Pods synced (or being synced) since the last relist: their record in it is stale.
    touched: HashSet<String>,
    /// Pods whose last sync failed: synced again on the next relist.
    retry: HashSet<String>,
    backoff: HashMap<String, Instant>,
    volumes: HashMap<String, Instant>,
    /// The last relist succeeded (its records can be used).
    relist_ok: bool,
}

impl Schedule {
    /// An empty schedule (no relist yet).
    pub fn new() -> Self {
        Schedule::default()
    }

    /// The pods the runtime runs now: new ones are due, gone ones forgotten.
    pub fn set_pods(&mut self, pods: &[String]) {
        let now: HashSet<&String> = pods.iter().collect();
        for uid in pods {
            if self.known.insert(uid.clone()) {
                self.dirty.insert(uid.clone(), Trigger::Desired);
            }
        }
        let gone: Vec<String> = self
            .known
            .iter()
            .filter(|u| !now.contains(u))
            .cloned()
            .collect();
        for uid in gone {
            self.known.remove(&uid);
            self.dirty.remove(&uid);
            self.retry.remove(&uid);
            self.backoff.remove(&uid);
            self.volumes.remove(&uid);
            self.touched.remove(&uid);
        }
    }

    /// The pods an earlier run recorded, at start-up before the first relist: each is due
    /// once, from that relist (nothing of theirs was synced yet).
    pub fn adopt(&mut self, pods: &[String]) {
        for uid in pods {
            self.known.insert(uid.clone());
            self.dirty.insert(uid.clone(), Trigger::Runtime);
        }
    }

    /// Pod `uid`'s object changed (added or updated): it is due, listed afresh.
    pub fn desired_changed(&mut self, uid: &str) {
        if self.known.contains(uid) {
            self.dirty.insert(uid.to_owned(), Trigger::Desired);
        }
    }

    /// A relist succeeded; `changed` are the pods with events. Pods whose last sync failed are
    /// due again.
    pub fn relisted<'a>(&mut self, changed: impl IntoIterator<Item = &'a String>) {
        self.relist_ok = true;
        self.touched = self.in_flight.clone();
        let retry = std::mem::take(&mut self.retry);
        let changed = changed.into_iter().cloned();
        for uid in changed.chain(retry) {
            if self.known.contains(&uid) {
                self.dirty.entry(uid).or_insert(Trigger::Runtime);
            }
        }
    }

    /// A relist failed: no record can be trusted until the next one succeeds; pods whose sync
    /// failed stay due for then.
    pub fn relist_failed(&mut self) {
        self.relist_ok = false;
    }

    /// The jobs due at `now` (each pod at most one, none for a pod with a job in flight).
    pub fn take_due(&mut self, now: Instant) -> Vec<Job> {
        let ended: Vec<String> = self
            .backoff
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in ended {
            self.backoff.remove(&uid);
            self.dirty.entry(uid).or_insert(Trigger::Runtime);
        }
        let mut jobs = Vec::new();
        let ready: Vec<(String, Trigger)> = self
            .dirty
            .iter()
            .filter(|(uid, _)| !self.in_flight.contains(*uid))
            .map(|(uid, t)| (uid.clone(), *t))
            .collect();
        for (uid, trigger) in ready {
            self.dirty.remove(&uid);
            // A sync refreshes the volumes too.
            self.volumes.remove(&uid);
            let use_relist =
                self.relist_ok && trigger == Trigger::Runtime && !self.touched.contains(&uid);
            self.touched.insert(uid.clone());
            self.in_flight.insert(uid.clone());
            jobs.push(Job::Sync { uid, use_relist });
        }
        let refresh: Vec<String> = self
            .volumes
            .iter()
            .filter(|(uid, at)| **at <= now && !self.in_flight.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in refresh {
            self.volumes.remove(&uid);
            self.in_flight.insert(uid.clone());
            jobs.push(Job::Volumes { uid });
        }
        jobs
    }

    /// Pod `uid`'s job ended.
    pub fn finished(&mut self, uid: &str, outcome: Outcome) {
        self.in_flight.remove(uid);
        if !self.known.contains(uid) {
            return;
        }
        match outcome {
            Outcome::Done(wake) => {
                // Each sync recomputes every back-off of the pod: its answer replaces the last.
                match wake.backoff {
                    Some(at) => {
                        self.backoff.insert(uid.to_owned(), at);
                    }
                    None => {
                        self.backoff.remove(uid);
                    }
                }
                match wake.volumes {
                    Some(at) => {
                        self.volumes.insert(uid.to_owned(), at);
                    }
                    None => {
                        self.volumes.remove(uid);
                    }
                }
            }
            Outcome::Refreshed(Some(at)) => {
                self.volumes.insert(uid.to_owned(), at);
            }
            Outcome::Refreshed(None) => {
                self.volumes.remove(uid);
            }
            Outcome::Failed => {
                self.retry.insert(uid.to_owned());
            }
        }
    }

    /// The earliest back-off end or volume refresh the loop must wake for (`None`: none).
    pub fn next_wake(&self) -> Option<Instant> {
        let backoff = self.backoff.values();
        let volumes = self
            .volumes
            .iter()
            .filter(|(uid, _)| !self.in_flight.contains(*uid))
            .map(|(_, at)| at);
        backoff.chain(volumes).min().copied()
    }

    /// Whether a job is due now without waiting (a pod marked and not in flight).
    pub fn has_ready(&self) -> bool {
        self.dirty.keys().any(|uid| !self.in_flight.contains(uid))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::config::LABEL_MANAGED;

    fn labels(uid: &str, name: Option<&str>) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (LABEL_MANAGED.to_owned(), "node.abc".to_owned()),
            (LABEL_POD_UID.to_owned(), uid.to_owned()),
        ]);
        if let Some(n) = name {
            l.insert(LABEL_CONTAINER_NAME.to_owned(), n.to_owned());
        }
        l
    }

    fn sandbox(id: &str, uid: &str, ready: bool) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.to_owned(),
            state: if ready {
                cri::PodSandboxState::SandboxReady as i32
            } else {
                cri::PodSandboxState::SandboxNotready as i32
            },
            labels: labels(uid, None),
            ..Default::default()
        }
    }

    fn container(id: &str, uid: &str, name: &str, state: cri::ContainerState) -> cri::Container {
        cri::Container {
            id: id.to_owned(),
            state: state as i32,
            labels: labels(uid, Some(name)),
            ..Default::default()
        }
    }

    use cri::ContainerState::{ContainerExited as Exited, ContainerRunning as Running};

    #[test]
    fn one_listing_is_grouped_by_pod_uid_and_unlabelled_objects_are_left_out() {
        let mut stray = container("x", "u9", "app", Running);
        stray.labels.remove(LABEL_POD_UID);
        let relist = group(
            &[sandbox("s2", "u2", true), sandbox("s1", "u1", true)],
            &[
                container("c3", "u1", "b", Running),
                container("c1", "u1", "a", Exited),
                container("c2", "u2", "app", Running),
                stray,
            ],
        );
        assert_eq!(relist.keys().collect::<Vec<_>>(), ["u1", "u2"]);
        let u1 = &relist["u1"];
        assert_eq!(
            u1.containers
                .iter()
                .map(|c| (c.id.as_str(), c.name.as_str(), c.state))
                .collect::<Vec<_>>(),
            [("c1", "a", State::Exited), ("c3", "b", State::Running)],
            "sorted by ID, named by the container-name label"
        );
        assert_eq!(u1.ready_sandbox(), Some("s1"));
        assert_eq!(u1.next_sandbox_attempt(), 1);
    }

    #[test]
    fn an_unchanged_relist_has_no_events_whatever_the_listing_order() {
        let a = group(
            &[sandbox("s1", "u1", true)],
            &[
                container("c1", "u1", "a", Running),
                container("c2", "u1", "b", Running),
            ],
        );
        let b = group(
            &[sandbox("s1", "u1", true)],
            &[
                container("c2", "u1", "b", Running),
                container("c1", "u1", "a", Running),
            ],
        );
        assert!(events(&a, &b).is_empty());
        assert!(changed_pods(&events(&a, &b)).is_empty());
    }

    #[test]
    fn exits_starts_appearances_and_removals_are_events_of_their_pod_only() {
        let before = group(
            &[
                sandbox("s1", "u1", true),
                sandbox("s2", "u2", true),
                sandbox("s3", "u3", true),
            ],
            &[
                container("c1", "u1", "app", Running),
                container("c2", "u2", "app", Running),
                container("c3", "u3", "app", Exited),
            ],
        );
        let after = group(
            &[
                sandbox("s1", "u1", true),
                sandbox("s2", "u2", true),
                sandbox("s4", "u4", true),
            ],
            &[
                // u1 unchanged; u2's container exited; u3 gone; u4 new.
                container("c1", "u1", "app", Running),
                container("c2", "u2", "app", Exited),
                container("c4", "u4", "app", Running),
            ],
        );
        let ev = events(&before, &after);
        let got: Vec<(&str, &str, EventKind)> = ev
            .iter()
            .map(|e| (e.pod_uid.as_str(), e.id.as_str(), e.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("u2", "c2", EventKind::Died),
                // An exited container that goes is only removed; a running one (and the ready
                // sandbox) died first, as generateEvents says.
                ("u3", "c3", EventKind::Removed),
                ("u3", "s3", EventKind::Died),
                ("u3", "s3", EventKind::Removed),
                ("u4", "c4", EventKind::Started),
                ("u4", "s4", EventKind::Started),
            ]
        );
        assert_eq!(
            changed_pods(&ev).into_iter().collect::<Vec<_>>(),
            ["u2", "u3", "u4"]
        );
    }

    #[test]
    fn a_replaced_container_and_a_stopped_sandbox_are_changes() {
        let before = group(
            &[sandbox("s1", "u1", true)],
            &[container("c1", "u1", "app", Exited)],
        );
        let restarted = group(
            &[sandbox("s1", "u1", true)],
            &[
                container("c1", "u1", "app", Exited),
                container("c2", "u1", "app", cri::ContainerState::ContainerCreated),
            ],
        );
        assert_eq!(
            events(&before, &restarted)
                .iter()
                .map(|e| (e.id.as_str(), e.kind))
                .collect::<Vec<_>>(),
            [("c2", EventKind::Changed)]
        );
        let stopped = group(
            &[sandbox("s1", "u1", false)],
            &[container("c1", "u1", "app", Exited)],
        );
        assert_eq!(
            events(&before, &stopped)
                .iter()
                .map(|e| (e.id.as_str(), e.kind))
                .collect::<Vec<_>>(),
            [("s1", EventKind::Died)]
        );
    }

    fn uids(jobs: &[Job]) -> Vec<(String, bool)> {
        jobs.iter()
            .map(|j| match j {
                Job::Sync { uid, use_relist } => (uid.clone(), *use_relist),
                Job::Volumes { uid } => (format!("volumes:{uid}"), false),
            })
            .collect()
    }

    fn pods(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_new_changed_updated_failed_or_backed_off_pods_are_synced() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        s.set_pods(&pods(&["a", "b", "c"]));
        s.relisted(&[]);
        // New pods: listed afresh.
        assert_eq!(
            uids(&s.take_due(t0)),
            [
                ("a".into(), false),
                ("b".into(), false),
                ("c".into(), false)
            ]
        );
        assert!(s.take_due(t0).is_empty(), "in flight: nothing twice");
        s.finished("a", Outcome::Done(Wake::default()));
        s.finished("b", Outcome::Failed);
        s.finished(
            "c",
            Outcome::Done(Wake {
                backoff: Some(t0 + Duration::from_secs(10)),
                volumes: None,
            }),
        );
        assert!(s.take_due(t0).is_empty(), "no change: no sync");
        assert_eq!(s.next_wake(), Some(t0 + Duration::from_secs(10)));

        // A relist where nothing changed: only the failed pod is tried again; its sync ran
        // after the previous relist, but this relist is newer, so its record is used.
        s.relisted(&[]);
        assert_eq!(uids(&s.take_due(t0)), [("b".into(), true)]);
        s.finished("b", Outcome::Done(Wake::default()));
        // A relist where `a` changed.
        s.relisted(&["a".to_owned()]);
        assert_eq!(uids(&s.take_due(t0)), [("a".into(), true)]);
        s.finished("a", Outcome::Done(Wake::default()));
        // An update of `a`: listed afresh.
        s.desired_changed("a");
        assert_eq!(uids(&s.take_due(t0)), [("a".into(), false)]);
        s.finished("a", Outcome::Done(Wake::default()));
        // The back-off of `c` ended: synced; its record is current (no sync since the relist).
        assert!(s.take_due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(
            uids(&s.take_due(t0 + Duration::from_secs(10))),
            [("c".into(), true)]
        );
        s.finished(
            "c",
            Outcome::Done(Wake {
                backoff: Some(t0 + Duration::from_secs(11)),
                volumes: None,
            }),
        );
        // A second sync before the next relist may not use the relist's (now stale) record.
        assert_eq!(
            uids(&s.take_due(t0 + Duration::from_secs(11))),
            [("c".into(), false)]
        );
        s.finished("c", Outcome::Done(Wake::default()));
        assert_eq!(s.next_wake(), None);
    }

    #[test]
    fn a_change_seen_while_the_pod_is_in_flight_is_synced_after_it_with_a_fresh_listing() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        s.set_pods(&pods(&["a"]));
        s.relisted(&[]);
        assert_eq!(s.take_due(t0).len(), 1);
        s.relisted(&["a".to_owned()]);
        assert!(s.take_due(t0).is_empty(), "in flight");
        assert!(!s.has_ready());
        s.finished("a", Outcome::Done(Wake::default()));
        assert!(s.has_ready());
        assert_eq!(
            uids(&s.take_due(t0)),
            [("a".into(), false)],
            "the relist was taken while a sync ran: its record may be stale"
        );
    }

    #[test]
    fn volumes_are_refreshed_without_a_sync_and_removed_pods_are_forgotten() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        s.set_pods(&pods(&["a"]));
        s.relisted(&[]);
        s.take_due(t0);
        s.finished(
            "a",
            Outcome::Done(Wake {
                backoff: Some(t0 + Duration::from_secs(30)),
                volumes: Some(t0 + Duration::from_secs(10)),
            }),
        );
        assert_eq!(s.next_wake(), Some(t0 + Duration::from_secs(10)));
        assert_eq!(
            uids(&s.take_due(t0 + Duration::from_secs(10))),
            [("volumes:a".into(), false)]
        );
        s.finished("a", Outcome::Refreshed(Some(t0 + Duration::from_secs(20))));
        assert_eq!(
            uids(&s.take_due(t0 + Duration::from_secs(20))),
            [("volumes:a".into(), false)]
        );
        s.finished("a", Outcome::Refreshed(None));
        assert_eq!(
            s.next_wake(),
            Some(t0 + Duration::from_secs(30)),
            "a refresh leaves the back-off as it was"
        );
        // A volume refresh is no sync: the relist still predates the pod's first sync.
        assert_eq!(
            uids(&s.take_due(t0 + Duration::from_secs(30))),
            [("a".into(), false)]
        );
        s.finished("a", Outcome::Done(Wake::default()));
        s.set_pods(&[]);
        s.relisted(&["a".to_owned()]);
        assert!(s.take_due(t0 + Duration::from_secs(60)).is_empty());
        assert_eq!(s.next_wake(), None);
    }

    #[test]
    fn pods_adopted_at_start_up_are_synced_once_from_the_first_relist() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        s.adopt(&pods(&["a", "b"]));
        s.set_pods(&pods(&["a", "b", "c"]));
        s.relisted(&["a".to_owned()]);
        assert_eq!(
            uids(&s.take_due(t0)),
            [("a".into(), true), ("b".into(), true), ("c".into(), false)]
        );
    }

    #[test]
    fn after_a_failed_relist_syncs_list_for_themselves() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        s.set_pods(&pods(&["a"]));
        s.relisted(&[]);
        s.take_due(t0);
        s.finished(
            "a",
            Outcome::Done(Wake {
                backoff: Some(t0),
                volumes: None,
            }),
        );
        s.relisted(&[]);
        s.relist_failed();
        assert_eq!(uids(&s.take_due(t0)), [("a".into(), false)]);
    }
}
