//! What a pod's containers should do next and what its status is, from what the runtime
//! reports (pure; no IO). Follows the kubelet's `pkg/kubelet/kuberuntime`
//! `kuberuntime_manager.go` (`computePodActions`: start what never ran, restart per
//! `restartPolicy` with the crash-loop back-off, init containers one at a time first) and
//! `pkg/kubelet/kubelet_pods.go` (`getPhase`, `convertToAPIContainerStatuses`).
//!
//! Sidecars (init containers with `restartPolicy: Always`) are run like app containers that
//! start first; their ordering guarantees (startup probes) are not modelled.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use crate::config::restart_policy;

/// The crash-loop back-off: 10 s after the first exit, doubling, at most 5 min
/// (`pkg/kubelet/kubelet.go` `backOffPeriod`, `MaxContainerBackOff`).
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// See [`BACKOFF_INITIAL`].
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// A container's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited with this code.
    Exited(i32),
    /// The runtime does not know.
    Unknown,
}

/// One attempt of one container, as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Runtime container ID.
    pub id: String,
    /// Restart attempt (CRI metadata `attempt`).
    pub attempt: u32,
    /// State.
    pub state: RunState,
    /// Nanoseconds since the epoch (0: not started / not finished).
    pub started_at: i64,
    /// See `started_at`.
    pub finished_at: i64,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// The runtime's message.
    pub message: String,
    /// Image reference the container runs.
    pub image_ref: String,
}

/// A container state as the API shows it (`v1.ContainerState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerState {
    /// Not running yet (or between restarts).
    Waiting {
        /// `ContainerCreating`, `CrashLoopBackOff`, `CreateContainerConfigError`, ...
        reason: String,
        /// Detail.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
    },
    /// Running since `started_at` (RFC 3339).
    #[serde(rename_all = "camelCase")]
    Running {
        /// RFC 3339.
        started_at: String,
    },
    /// Finished.
    #[serde(rename_all = "camelCase")]
    Terminated {
        /// Exit code.
        exit_code: i32,
        /// `Completed`, `Error`, ...
        reason: String,
        /// Detail.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
        /// RFC 3339.
        started_at: String,
        /// RFC 3339.
        finished_at: String,
    },
}

/// One container's status (`v1.ContainerStatus`, the fields devicelet fills).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// Container name.
    pub name: String,
    /// `containerd://<id>` (the runtime's name as scheme), empty before the first create.
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "String::is_empty"
    )]
    pub container_id: String,
    /// The spec's image.
    pub image: String,
    /// The image reference the runtime ran.
    #[serde(default, rename = "imageID")]
    pub image_id: String,
    /// Restarts so far.
    pub restart_count: u32,
    /// Current state.
    pub state: ContainerState,
    /// The previous attempt's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<ContainerState>,
    /// Running (devicelet runs no probes).
    pub ready: bool,
    /// Started.
    pub started: bool,
}

/// A pod's status as devicelet's runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRuntimeStatus {
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    /// The pod sandbox.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox_id: String,
    /// Init containers, in spec order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<ContainerStatus>,
    /// App containers, in spec order.
    pub containers: Vec<ContainerStatus>,
}

impl PodRuntimeStatus {
    /// Whether the pod reached `Succeeded` or `Failed`.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// What to do for a pod now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Containers to create and start: (name, attempt).
    pub start: Vec<(String, u32)>,
    /// The status after this look.
    pub status: PodRuntimeStatus,
    /// The earliest time (ns since the epoch) a back-off ends, for the caller's next look.
    pub next_backoff_end: Option<i64>,
}

/// Inputs of [`plan`] beside the pod.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Every attempt of each container, by name.
    pub observed: &'a BTreeMap<String, Vec<Observed>>,
    /// The last create/start error of each container (name → (reason, message)).
    pub errors: &'a BTreeMap<String, (String, String)>,
    /// The runtime's name for container IDs (`containerd`).
    pub runtime_name: &'a str,
    /// The sandbox ID (empty before it exists).
    pub sandbox_id: &'a str,
    /// Now, ns since the epoch.
    pub now: i64,
}

/// The crash-loop back-off after `restarts` restarts.
pub fn backoff(restarts: u32) -> Duration {
    let factor = 1u32.checked_shl(restarts.min(16)).unwrap_or(u32::MAX);
    BACKOFF_INITIAL.saturating_mul(factor).min(BACKOFF_MAX)
}

/// A container that ran this long before it exited starts its back-off afresh (the kubelet
/// forgets a back-off entry after twice the longest back-off).
pub const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// The back-off before restarting after `latest` exited.
fn backoff_after(latest: &Observed) -> Duration {
    let ran = latest.finished_at.saturating_sub(latest.started_at);
    if ran >= i64::try_from(BACKOFF_RESET.as_nanos()).unwrap_or(i64::MAX) {
        backoff(0)
    } else {
        backoff(latest.attempt)
    }
}

/// What the pod's containers should do next, and its status.
pub fn plan(pod: &Pod, facts: Facts<'_>) -> Plan {
    let policy = restart_policy(pod);
    let spec = pod.spec.as_ref();
    let empty = Vec::new();
    let inits: &Vec<Container> = spec
        .and_then(|s| s.init_containers.as_ref())
        .unwrap_or(&empty);
    let apps: &Vec<Container> = spec.map(|s| &s.containers).unwrap_or(&empty);
    let mut start = Vec::new();
    let mut next_backoff_end: Option<i64> = None;
    let mut note_backoff = |end: i64| {
        next_backoff_end = Some(next_backoff_end.map_or(end, |e: i64| e.min(end)));
    };

    // Init containers, one at a time; sidecars start with the app containers.
    let mut init_done = true;
    let mut init_failed = false;
    let mut init_statuses = Vec::new();
    for c in inits {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        let attempts = facts
            .observed
            .get(&c.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let latest = attempts.last();
        if !init_done || init_failed {
            init_statuses.push(status_of(c, attempts, facts, waiting("PodInitializing")));
            continue;
        }
        if sidecar {
            let step = decide(latest, "Always", facts.now);
            apply_step(&c.name, step, &mut start, &mut note_backoff);
            init_statuses.push(status_of(c, attempts, facts, waiting("ContainerCreating")));
            continue;
        }
        let step = decide(
            latest,
            if policy == "Never" {
                "Never"
            } else {
                "OnFailure"
            },
            facts.now,
        );
        match latest.map(|l| l.state) {
            Some(RunState::Exited(0)) => {}
            Some(RunState::Exited(_)) if policy == "Never" => init_failed = true,
            _ => init_done = false,
        }
        apply_step(&c.name, step, &mut start, &mut note_backoff);
        init_statuses.push(status_of(c, attempts, facts, waiting("ContainerCreating")));
    }

    let mut app_statuses = Vec::new();
    let (mut running, mut will_restart, mut succeeded, mut failed, mut pending) = (0, 0, 0, 0, 0);
    for c in apps {
        let attempts = facts
            .observed
            .get(&c.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let latest = attempts.last();
        if !init_done || init_failed {
            app_statuses.push(status_of(c, attempts, facts, waiting("PodInitializing")));
            pending += 1;
            continue;
        }
        let step = decide(latest, policy, facts.now);
        let backing_off = matches!(step, Step::Backoff(_));
        match (latest.map(|l| l.state), &step) {
            (Some(RunState::Running), _) => running += 1,
            (Some(RunState::Exited(_)), Step::Start(_) | Step::Backoff(_)) => will_restart += 1,
            (Some(RunState::Exited(0)), Step::Done) => succeeded += 1,
            (Some(RunState::Exited(_)), Step::Done) => failed += 1,
            _ => pending += 1,
        }
        apply_step(&c.name, step, &mut start, &mut note_backoff);
        let mut status = status_of(c, attempts, facts, waiting("ContainerCreating"));
        if backing_off {
            crash_loop(&mut status, &c.name, latest);
        }
        app_statuses.push(status);
    }
    let phase = if init_failed {
        "Failed"
    } else if !init_done {
        "Pending"
    } else if pending == 0 && running == 0 && will_restart == 0 && !apps.is_empty() {
        if failed == 0 { "Succeeded" } else { "Failed" }
    } else if pending > 0 {
        // The kubelet's getPhase: a container that never started keeps the pod Pending.
        "Pending"
    } else if running > 0 || will_restart > 0 || succeeded > 0 || failed > 0 {
        "Running"
    } else {
        "Pending"
    };
    if phase == "Failed" || phase == "Succeeded" {
        start.clear();
    }
    Plan {
        start,
        status: PodRuntimeStatus {
            phase: phase.to_owned(),
            sandbox_id: facts.sandbox_id.to_owned(),
            init_containers: init_statuses,
            containers: app_statuses,
        },
        next_backoff_end,
    }
}

/// What one container should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Create and start this attempt.
    Start(u32),
    /// Restart when the back-off ends (ns since the epoch).
    Backoff(i64),
    /// Nothing (running, or finished for good).
    Done,
}

fn decide(latest: Option<&Observed>, policy: &str, now: i64) -> Step {
    let Some(latest) = latest else {
        return Step::Start(0);
    };
    let restart = match latest.state {
        RunState::Exited(0) => policy == "Always",
        RunState::Exited(_) => policy != "Never",
        // A container created but never started (devicelet stopped in between) is replaced.
        RunState::Created => return Step::Start(latest.attempt + 1),
        RunState::Running | RunState::Unknown => false,
    };
    if !restart {
        return Step::Done;
    }
    let wait = i64::try_from(backoff_after(latest).as_nanos()).unwrap_or(i64::MAX);
    let end = latest.finished_at.saturating_add(wait);
    if now < end {
        Step::Backoff(end)
    } else {
        Step::Start(latest.attempt + 1)
    }
}

fn apply_step(
    name: &str,
    step: Step,
    start: &mut Vec<(String, u32)>,
    note_backoff: &mut impl FnMut(i64),
) {
    match step {
        Step::Start(attempt) => start.push((name.to_owned(), attempt)),
        Step::Backoff(end) => note_backoff(end),
        Step::Done => {}
    }
}

/// A container waiting out its restart back-off, as the kubelet shows it: waiting with
/// `CrashLoopBackOff`, the exit it restarts after in `lastState`.
fn crash_loop(status: &mut ContainerStatus, name: &str, latest: Option<&Observed>) {
    let Some(latest) = latest else {
        return;
    };
    let previous = std::mem::replace(
        &mut status.state,
        ContainerState::Waiting {
            reason: "CrashLoopBackOff".to_owned(),
            message: format!(
                "back-off {}s restarting failed container={name}",
                backoff_after(latest).as_secs()
            ),
        },
    );
    status.last_state = Some(previous);
    status.ready = false;
    status.started = false;
}

fn waiting(reason: &str) -> ContainerState {
    ContainerState::Waiting {
        reason: reason.to_owned(),
        message: String::new(),
    }
}

/// RFC 3339 of ns since the epoch, to the second as the API stores it.
pub fn rfc3339(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn state_of(o: &Observed, default_waiting: &ContainerState) -> ContainerState {
    match o.state {
        RunState::Running => ContainerState::Running {
            started_at: rfc3339(o.started_at),
        },
        RunState::Exited(code) => ContainerState::Terminated {
            exit_code: code,
            reason: if o.reason.is_empty() {
                if code == 0 { "Completed" } else { "Error" }.to_owned()
            } else {
                o.reason.clone()
            },
            message: o.message.clone(),
            started_at: rfc3339(o.started_at),
            finished_at: rfc3339(o.finished_at),
        },
        RunState::Created | RunState::Unknown => default_waiting.clone(),
    }
}

fn status_of(
    c: &Container,
    attempts: &[Observed],
    facts: Facts<'_>,
    default_waiting: ContainerState,
) -> ContainerStatus {
    let latest = attempts.last();
    let previous = attempts.len().checked_sub(2).and_then(|i| attempts.get(i));
    let error = facts.errors.get(&c.name);
    let mut state = latest.map_or_else(
        || default_waiting.clone(),
        |o| state_of(o, &default_waiting),
    );
    // A failed create, or a restart waiting out its back-off, shows as the kubelet shows it.
    if let Some((reason, message)) = error
        && !matches!(state, ContainerState::Running { .. })
    {
        state = ContainerState::Waiting {
            reason: reason.clone(),
            message: message.clone(),
        };
    }
    let running = matches!(state, ContainerState::Running { .. });
    ContainerStatus {
        name: c.name.clone(),
        container_id: latest.map_or_else(String::new, |o| {
            format!("{}://{}", facts.runtime_name, o.id)
        }),
        image: c.image.clone().unwrap_or_default(),
        image_id: latest.map(|o| o.image_ref.clone()).unwrap_or_default(),
        restart_count: latest.map_or(0, |o| o.attempt),
        state,
        last_state: previous.map(|o| state_of(o, &default_waiting)),
        ready: running,
        started: running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SEC: i64 = 1_000_000_000;

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
        let c = |n: &&str| json!({"name": n, "image": "busybox"});
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"restartPolicy": policy,
                     "initContainers": inits.iter().map(c).collect::<Vec<_>>(),
                     "containers": apps.iter().map(c).collect::<Vec<_>>()}
        }))
        .expect("pod")
    }

    fn obs(attempt: u32, state: RunState, finished_at: i64) -> Observed {
        Observed {
            id: format!("id{attempt}"),
            attempt,
            state,
            started_at: SEC,
            finished_at,
            reason: String::new(),
            message: String::new(),
            image_ref: "sha256:x".into(),
        }
    }

    fn run(pod: &Pod, observed: &[(&str, Vec<Observed>)], now: i64) -> Plan {
        let observed: BTreeMap<String, Vec<Observed>> = observed
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        plan(
            pod,
            Facts {
                observed: &observed,
                errors: &BTreeMap::new(),
                runtime_name: "containerd",
                sandbox_id: "sb",
                now,
            },
        )
    }

    #[test]
    fn a_new_pod_starts_its_first_init_container_only() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let plan = run(&p, &[], 0);
        assert_eq!(plan.start, vec![("i1".to_owned(), 0)]);
        assert_eq!(plan.status.phase, "Pending");
        let plan = run(
            &p,
            &[("i1", vec![obs(0, RunState::Exited(0), 2 * SEC)])],
            3 * SEC,
        );
        assert_eq!(plan.start, vec![("i2".to_owned(), 0)]);
    }

    #[test]
    fn never_finishes_succeeded_or_failed_with_the_exit_code() {
        let p = pod("Never", &[], &["a", "b"]);
        let plan = run(&p, &[], 0);
        assert_eq!(plan.start.len(), 2);
        let plan = run(
            &p,
            &[
                ("a", vec![obs(0, RunState::Exited(0), 2 * SEC)]),
                ("b", vec![obs(0, RunState::Running, 0)]),
            ],
            3 * SEC,
        );
        assert_eq!(
            (plan.status.phase.as_str(), plan.start.len()),
            ("Running", 0)
        );
        let plan = run(
            &p,
            &[
                ("a", vec![obs(0, RunState::Exited(0), 2 * SEC)]),
                ("b", vec![obs(0, RunState::Exited(3), 2 * SEC)]),
            ],
            3 * SEC,
        );
        assert_eq!(plan.status.phase, "Failed");
        assert!(plan.start.is_empty());
        match &plan.status.containers[1].state {
            ContainerState::Terminated {
                exit_code, reason, ..
            } => {
                assert_eq!((*exit_code, reason.as_str()), (3, "Error"));
            }
            other => panic!("{other:?}"),
        }
        let plan = run(
            &p,
            &[
                ("a", vec![obs(0, RunState::Exited(0), 2 * SEC)]),
                ("b", vec![obs(0, RunState::Exited(0), 2 * SEC)]),
            ],
            3 * SEC,
        );
        assert_eq!(plan.status.phase, "Succeeded");
    }

    #[test]
    fn always_restarts_after_the_crash_loop_backoff() {
        let p = pod("Always", &[], &["a"]);
        let exited = vec![obs(0, RunState::Exited(1), 100 * SEC)];
        let plan = run(&p, &[("a", exited.clone())], 105 * SEC);
        assert!(plan.start.is_empty());
        assert_eq!(plan.next_backoff_end, Some(110 * SEC));
        assert_eq!(plan.status.phase, "Running");
        let c = &plan.status.containers[0];
        assert!(
            matches!(&c.state, ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff"),
            "{c:?}"
        );
        assert!(
            matches!(
                &c.last_state,
                Some(ContainerState::Terminated { exit_code: 1, .. })
            ),
            "{c:?}"
        );
        let plan = run(&p, &[("a", exited)], 111 * SEC);
        assert_eq!(plan.start, vec![("a".to_owned(), 1)]);
        assert_eq!(backoff(1), Duration::from_secs(20));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[test]
    fn on_failure_keeps_a_success_and_restarts_a_failure() {
        let p = pod("OnFailure", &[], &["a"]);
        let plan = run(
            &p,
            &[("a", vec![obs(0, RunState::Exited(0), SEC)])],
            100 * SEC,
        );
        assert_eq!(
            (plan.status.phase.as_str(), plan.start.len()),
            ("Succeeded", 0)
        );
        let plan = run(
            &p,
            &[("a", vec![obs(0, RunState::Exited(2), SEC)])],
            100 * SEC,
        );
        assert_eq!(plan.start, vec![("a".to_owned(), 1)]);
        let status = &plan.status.containers[0];
        assert_eq!(status.restart_count, 0);
        assert_eq!(status.container_id, "containerd://id0");
    }

    #[test]
    fn a_container_that_never_started_keeps_the_pod_pending() {
        let p = pod("Never", &[], &["a", "b"]);
        let plan = run(&p, &[("a", vec![obs(0, RunState::Running, 0)])], SEC);
        assert_eq!(plan.status.phase, "Pending");
        assert_eq!(plan.start, vec![("b".to_owned(), 0)]);
    }

    #[test]
    fn a_long_run_resets_the_backoff() {
        let p = pod("Always", &[], &["a"]);
        let mut long = obs(8, RunState::Exited(1), 0);
        long.started_at = SEC;
        long.finished_at = SEC + 700 * SEC;
        let plan = run(&p, &[("a", vec![long])], SEC + 711 * SEC);
        assert_eq!(plan.start, vec![("a".to_owned(), 9)], "10 s, not 5 min");
    }

    #[test]
    fn a_failed_init_container_fails_a_never_pod() {
        let p = pod("Never", &["i"], &["a"]);
        let plan = run(
            &p,
            &[("i", vec![obs(0, RunState::Exited(1), SEC)])],
            2 * SEC,
        );
        assert_eq!(plan.status.phase, "Failed");
        assert!(plan.start.is_empty());
    }
}
