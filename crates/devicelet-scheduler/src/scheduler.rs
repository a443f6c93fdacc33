//! The scheduler process (`cmd/kube-scheduler`, `pkg/scheduler/scheduler.go` → `Run`,
//! `schedule_one.go` → `ScheduleOne`): watches, leader election, the serial scheduling loop on
//! its own thread (S10), binding tasks on the async runtime, metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use devicelet_allocator::{
    AllocateOptions, AllocatedIndex, CelFeatures, ClusterSnapshot, Features, MonotonicClock,
    SelectorCache,
};
use devicelet_kube::serving::{DelegatedAuth, ServingCertificate};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};
use kube::Client;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use typed_arena::Arena;

use crate::binder::Binder;
use crate::config::Profile;
use crate::cycle::{CycleInputs, Decision, Engine};
use crate::leader::{self, Leadership, LeaseSettings};
use crate::metrics::{AttemptResult, SchedulerMetrics};
use crate::preemption::{self, PreemptionInputs, Verdict, actuate};
use crate::queue::QueuedPod;
use crate::report::FailureReason;
use crate::shared::Shared;

/// Claims copied into one engine's arena before it is rebuilt (bounds its memory).
const ARENA_LIMIT: usize = 4096;

/// Settings of `devicelet scheduler` (its flags, or `--config`).
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// The profiles (at least one): the pods whose `spec.schedulerName` names one of them, and
    /// nothing else; their scores and DRA timeouts (the same in every profile). The first
    /// names the scheduler (metrics, snapshot, the Lease by default).
    pub profiles: Vec<Profile>,
    /// Run leader election on `lease`.
    pub leader_elect: bool,
    pub lease: LeaseSettings,
    /// `/metrics`, the probes and `/debug/snapshot` in plain HTTP (loopback).
    pub metrics_address: Option<SocketAddr>,
    /// The same on a secure port: TLS, authentication and authorization by the API server.
    pub secure: Option<SecureServing>,
    /// How long PreBind waits for a device's binding conditions (KEP-5007, S54).
    pub binding_timeout: Duration,
    /// `podInitialBackoffSeconds`, `podMaxBackoffSeconds` (S3).
    pub backoff: (Duration, Duration),
    /// `clientConnection.qps`/`burst`: one token bucket for the scheduler's requests. The
    /// Lease is renewed outside it, as kube-scheduler's leader election has a client of its own
    /// (a backlog of bindings must not cost the leadership).
    pub client_rate: Option<crate::config::ClientRate>,
    /// `clientConnection.contentType`: bindings and events in protobuf (the default) or JSON.
    pub content_type: crate::config::ContentType,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            profiles: vec![Profile::named("devicelet-scheduler")],
            leader_elect: false,
            lease: LeaseSettings::named("devicelet-scheduler"),
            metrics_address: None,
            secure: None,
            binding_timeout: crate::binding_conditions::DEFAULT_BINDING_TIMEOUT,
            backoff: (crate::queue::INITIAL_BACKOFF, crate::queue::MAX_BACKOFF),
            client_rate: None,
            content_type: crate::config::ContentType::default(),
        }
    }
}

/// The secure port (`--secure-address`).
#[derive(Clone, Debug)]
pub struct SecureServing {
    pub address: SocketAddr,
    pub certificate: ServingCertificate,
    /// TokenReviews and SubjectAccessReviews, and the paths that need neither.
    pub auth: Arc<DelegatedAuth>,
}

/// Why the scheduler stopped.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The metrics address could not be bound.
    #[error("metrics address {address}: {source}")]
    Metrics {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The secure port's certificate could not be loaded.
    #[error("secure port {address}: {source}")]
    Serving {
        address: SocketAddr,
        #[source]
        source: devicelet_kube::serving::ServingError,
    },
    /// The leader Lease was lost (another replica takes over).
    #[error("leader election lost")]
    LeadershipLost,
    /// The scheduling thread could not be started.
    #[error("scheduling thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Runs the scheduler until `shutdown` resolves (or the leader Lease is lost).
pub async fn run(
    client: Client,
    mut config: SchedulerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SchedulerError> {
    if config.profiles.is_empty() {
        config.profiles.push(Profile::named("devicelet-scheduler"));
    }
    let lease_client = client.clone();
    let client = match config.client_rate {
        Some(rate) => devicelet_kube::rate_limit::rate_limited(client, rate.qps, rate.burst),
        None => client,
    };
    let name = config.profiles[0].scheduler_name.clone();
    let metrics = SchedulerMetrics::new(&name);
    let mut shared = Shared::new(&name, metrics.clone(), config.binding_timeout);
    shared.content_type = config.content_type;
    shared.profiles = config
        .profiles
        .iter()
        .map(|p| p.scheduler_name.clone())
        .collect();
    let shared = Arc::new(shared);
    shared
        .queue()
        .set_backoff(config.backoff.0, config.backoff.1);
    if let Some(address) = config.metrics_address {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| SchedulerError::Metrics { address, source })?;
        let m = metrics.clone();
        let s = shared.clone();
        let snapshot = Arc::new(move |redact| s.snapshot(redact));
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(listener, m, snapshot).await {
                warn!(error = %e, "metrics server stopped");
            }
        });
    }
    if let Some(secure) = config.secure.clone() {
        let address = secure.address;
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| SchedulerError::Metrics { address, source })?;
        // A bad certificate file stops the start, not a task later.
        let tls = secure
            .certificate
            .server_config()
            .map_err(|source| SchedulerError::Serving { address, source })?;
        let s = shared.clone();
        let app =
            crate::metrics::router(metrics.clone(), Arc::new(move |redact| s.snapshot(redact)));
        info!(%address, "secure port: TLS, authentication and authorization by the API server");
        tokio::spawn(async move {
            if let Err(e) =
                devicelet_kube::serving::serve_secure(listener, tls, secure.auth, app).await
            {
                warn!(error = %e, "secure port stopped");
            }
        });
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let (leader_tx, mut leader_rx) = watch::channel(if config.leader_elect {
        Leadership::Candidate
    } else {
        Leadership::Leader
    });
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    // Without leader election the sender stays here: dropped, it would read as a lost lease.
    let mut _always_leader = None;
    let campaign = if !config.leader_elect {
        _always_leader = Some(leader_tx);
        None
    } else {
        let me = leader::identity();
        info!(identity = %me, lease = %format!("{}/{}", config.lease.namespace, config.lease.name), "campaigning for the leader lease");
        Some(Campaign {
            task: tokio::spawn(leader::run(
                lease_client.clone(),
                config.lease.clone(),
                me.clone(),
                leader_tx,
                stop_rx.clone(),
            )),
            client: lease_client,
            settings: config.lease.clone(),
            me,
        })
    };
    // SIGTERM is honoured while the caches fill (an unreachable API server must not keep a
    // rollout waiting for the whole grace period).
    tokio::pin!(shutdown);
    let watches = tokio::select! {
        w = crate::informer::start(client.clone(), shared.clone(), stop_rx.clone()) => w,
        _ = &mut shutdown => {
            info!("stopped before the caches synced");
            let _ = stop_tx.send(true);
            step_down(campaign, *leader_rx.borrow()).await;
            for t in tasks {
                t.abort();
            }
            return Ok(());
        }
    };
    tasks.extend(watches);
    info!(scheduler = %name, nodes = shared.cache().node_count(), "caches synced");
    metrics.set_ready(true);
    {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                shared.record_queue_metrics();
            }
        }));
    }
    // Wait for leadership (or shutdown).
    loop {
        if *leader_rx.borrow() == Leadership::Leader {
            break;
        }
        tokio::select! {
            _ = &mut shutdown => {
                metrics.set_ready(false);
                let _ = stop_tx.send(true);
                step_down(campaign, *leader_rx.borrow()).await;
                for t in tasks {
                    t.abort();
                }
                return Ok(());
            }
            changed = leader_rx.changed() => if changed.is_err() { break },
        }
    }
    metrics.set_leader(true);
    let stop = Arc::new(AtomicBool::new(false));
    let binder = Binder::new(client.clone(), shared.clone());
    let thread = {
        let (shared, stop, binder, handle) = (
            shared.clone(),
            stop.clone(),
            binder.clone(),
            Handle::current(),
        );
        let profiles = config.profiles.clone();
        std::thread::Builder::new()
            .name("scheduling-loop".into())
            .spawn(move || scheduling_loop(&shared, &binder, &handle, &stop, &profiles))
            .map_err(SchedulerError::Thread)?
    };
    let result = tokio::select! {
        _ = &mut shutdown => Ok(()),
        _ = async {
            loop {
                if leader_rx.changed().await.is_err() { break; }
                if *leader_rx.borrow() == Leadership::Lost { break; }
            }
        } => Err(SchedulerError::LeadershipLost),
    };
    metrics.set_leader(false);
    metrics.set_ready(false);
    if result.is_err() {
        metrics.set_healthy(false);
    }
    stop.store(true, Ordering::Relaxed);
    shared.notify();
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    // Bindings in flight finish or are undone before the Lease goes: a standby taking over
    // finds every pod bound or back in its queue, with its claims as they were.
    let abandoned = binder.drain(DRAIN_LIMIT).await;
    if abandoned > 0 {
        warn!(tasks = abandoned, limit = ?DRAIN_LIMIT, "shutdown: binding tasks still running are abandoned");
    } else {
        info!("shutdown: no binding in flight");
    }
    let _ = stop_tx.send(true);
    let held = if result.is_ok() {
        Leadership::Leader
    } else {
        Leadership::Lost
    };
    step_down(campaign, held).await;
    for t in tasks {
        t.abort();
    }
    result
}

/// How long shutdown waits for bindings in flight (a Deployment's default grace period is
/// 30 s; the API writes of one binding take milliseconds).
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How long shutdown waits to release the Lease.
const RELEASE_LIMIT: Duration = Duration::from_secs(2);

/// This replica's leader election.
struct Campaign {
    task: tokio::task::JoinHandle<()>,
    client: Client,
    settings: LeaseSettings,
    me: String,
}

/// Stops campaigning and, when this replica leads (`state`), releases the Lease so a standby
/// takes over at its next retry. `stop` must already be sent.
async fn step_down(campaign: Option<Campaign>, state: Leadership) {
    let Some(c) = campaign else {
        return;
    };
    // No renewal may land after the release.
    if tokio::time::timeout(RELEASE_LIMIT, c.task).await.is_err() {
        warn!("leader election did not stop in time");
    }
    if state != Leadership::Leader {
        return;
    }
    let lease = format!("{}/{}", c.settings.namespace, c.settings.name);
    match tokio::time::timeout(RELEASE_LIMIT, leader::release(c.client, &c.settings, &c.me)).await {
        Ok(Ok(true)) => info!(lease = %lease, "released the leader lease"),
        Ok(Ok(false)) => {
            debug!(lease = %lease, "leader lease held by another replica; not released")
        }
        Ok(Err(e)) => warn!(lease = %lease, error = %e, "leader lease not released"),
        Err(_) => warn!(lease = %lease, "leader lease not released in time"),
    }
}

/// Pops the next pod, waiting on the queue; `None` once `stop` is set.
fn next_pod(shared: &Shared, stop: &AtomicBool) -> Option<QueuedPod> {
    let mut queue = shared.queue();
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let now = Instant::now();
        if let Some(qp) = queue.pop(now) {
            return Some(qp);
        }
        let until = queue.next_expiry();
        queue = shared.wait(queue, until);
    }
}

/// The serial scheduling loop (S10). An engine (snapshot of classes and slices, the devices
/// in use) is kept while the allocator's inputs do not change.
fn scheduling_loop(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    stop: &AtomicBool,
    profiles: &[Profile],
) {
    // The same in every profile (the configuration checks it).
    let filter_timeout = profiles.first().and_then(|p| p.filter_timeout);
    let features = Features::kubernetes_1_36_defaults();
    let selectors = Arc::new(SelectorCache::new(CelFeatures {
        enable_consumable_capacity: features.consumable_capacity,
        enable_list_type_attributes: features.list_type_attributes,
    }));
    let clock = Arc::new(MonotonicClock::start());
    let options = AllocateOptions {
        pack_partitions: profiles.first().is_some_and(|p| p.pack_partitions),
        ..match filter_timeout {
            Some(limit) => AllocateOptions::with_time_limit(limit, clock),
            None => AllocateOptions::unbounded(),
        }
    };
    let group_search_limit = filter_timeout.map_or(crate::gang::run::GROUP_SEARCH_LIMIT, |t| {
        t.min(crate::gang::run::GROUP_SEARCH_LIMIT)
    });
    let mut carry: Option<QueuedPod> = None;
    let mut next_start = 0;
    while !stop.load(Ordering::Relaxed) {
        let inputs = shared.cache().dra_inputs();
        let arena: Arena<ResourceClaim> = Arena::new();
        let snapshot = Arc::new(ClusterSnapshot::new(
            &inputs.classes,
            &inputs.slices,
            selectors.clone(),
        ));
        // One lock for the state and the log position, so no addition falls between them.
        let (generation, state, mut log_position) = {
            let cache = shared.cache();
            let (generation, log) = cache.allocation_log();
            (
                generation,
                cache.allocated_state(features.consumable_capacity),
                log.len(),
            )
        };
        let index = AllocatedIndex::new(&snapshot, &state);
        let mut engine = Engine::new(snapshot, index, &arena, features, options.clone(), profiles);
        engine.set_device_resources(crate::cycle::device_resources(
            profiles,
            shared.cache().classes(),
        ));
        engine.set_next_start(next_start);
        debug!(
            slices = inputs.slices.len(),
            classes = inputs.classes.len(),
            devices_in_use = state.devices.len(),
            "scheduling engine ready"
        );
        while let Some(qp) = carry.take().or_else(|| next_pod(shared, stop)) {
            let started = Instant::now();
            let cache = shared.cache();
            let (g, log) = cache.allocation_log();
            if cache.dra_generation() != inputs.generation
                || g != generation
                || engine.arena_claims() > ARENA_LIMIT
            {
                // Rebuild the engine first; the pod is scheduled right after.
                carry = Some(qp);
                break;
            }
            engine.add_allocations(&log[log_position.min(log.len())..]);
            log_position = log.len();
            let pod = qp.pod.clone();
            let uid = qp.uid.clone();
            if pod.metadata.deletion_timestamp.is_some() || cache.is_assigned(&uid) {
                // S11: being deleted, or already assumed.
                drop(cache);
                shared.queue().delete(&uid);
                if pod.metadata.deletion_timestamp.is_some() {
                    crate::gang::run::skip_deleting(binder, handle, &pod);
                }
                continue;
            }
            if let Some(key) = crate::gang::group_of(&pod) {
                crate::gang::run::run_group_cycle(
                    shared,
                    binder,
                    handle,
                    &mut engine,
                    cache,
                    qp,
                    key,
                    group_search_limit,
                    features.consumable_capacity,
                );
                continue;
            }
            let cycle_inputs = CycleInputs::read(&pod, &cache, shared.binding_timeout);
            drop(cache);
            let decision = engine.schedule(&pod, cycle_inputs);
            shared.metrics.algorithm(started.elapsed());
            let preemption = engine.profile_of(&pod).preemption;
            let verdict = match (&decision, preemption) {
                (Decision::Unschedulable { fit, .. }, Some(args)) => Some(post_filter_preemption(
                    shared,
                    &mut engine,
                    &pod,
                    fit,
                    args,
                    features.consumable_capacity,
                )),
                _ => None,
            };
            handle_decision(shared, binder, handle, qp, decision, verdict, started);
        }
        next_start = engine.next_start();
    }
}

/// DefaultPreemption after a failed cycle (W77): a dry run on the cache as it is now. The
/// DRA PostFilter's claim deallocation, decided in the cycle, runs beside it (W104).
fn post_filter_preemption(
    shared: &Shared,
    engine: &mut Engine<'_>,
    pod: &k8s_openapi::api::core::v1::Pod,
    fit: &crate::framework::FitError,
    args: crate::config::PreemptionArgs,
    consumable_capacity: bool,
) -> Verdict {
    shared.metrics_of(pod).preemption_attempt();
    let (cycle, inputs) = {
        let cache = shared.cache();
        let priority = crate::cache::priority_of(pod);
        if cache
            .lowest_priority()
            .is_none_or(|lowest| lowest >= priority)
            && cache
                .nomination(pod.metadata.uid.as_deref().unwrap_or(""))
                .is_none()
        {
            return preemption::without_victims(pod, fit);
        }
        (
            CycleInputs::read(pod, &cache, shared.binding_timeout),
            PreemptionInputs::read(&cache, pod, consumable_capacity),
        )
    };
    preemption::preempt(engine, pod, &cycle, fit, &inputs, args)
}

/// Reserve and hand over to binding, or record the failure (with what preemption decided).
fn handle_decision(
    shared: &Arc<Shared>,
    binder: &Binder,
    handle: &Handle,
    qp: QueuedPod,
    decision: Decision,
    preemption: Option<Verdict>,
    started: Instant,
) {
    let pod = qp.pod.clone();
    let uid = qp.uid.clone();
    match decision {
        Decision::Place(placement) => {
            {
                let mut cache = shared.cache();
                // The special claim is keyed by its temporary UID until PreBind creates it.
                for (claim, allocation) in placement.allocating() {
                    let mut c = claim.clone();
                    c.status
                        .get_or_insert_with(ResourceClaimStatus::default)
                        .allocation = Some(allocation.clone());
                    cache.add_pending(&uid, c);
                }
                cache.assume_pod(&pod, &placement.node);
                shared.queue().done(&uid);
            }
            binder.spawn(handle, binder.clone().bind(qp, placement, started));
        }
        Decision::Unschedulable {
            mut fit,
            deallocate,
            claim_names,
        } => {
            shared
                .metrics_of(&pod)
                .attempt(AttemptResult::Unschedulable, started.elapsed());
            let mut nominate = None;
            let mut clear_nomination = false;
            match preemption {
                // W87: a nomination ends PostFilter with success, and no PostFilter message.
                Some(Verdict::Nominate(candidate)) => {
                    fit.post_filter_msg = None;
                    nominate = Some(candidate);
                }
                // W77: an unschedulable PostFilter's reasons follow the DRA plugin's.
                Some(Verdict::Fail {
                    message,
                    clear_nomination: clear,
                }) => {
                    fit.post_filter_msg = Some(match fit.post_filter_msg.take() {
                        Some(dra) => format!("{dra}, {message}"),
                        None => message,
                    });
                    clear_nomination = clear;
                }
                None => {}
            }
            let message = fit.message();
            let plugins: Vec<&str> = fit.plugins().iter().map(|p| p.name()).collect();
            debug!(pod = ?pod.metadata.name, ?plugins, %message, "unschedulable");
            let mut lower = Vec::new();
            {
                let mut cache = shared.cache();
                if let Some(c) = &nominate {
                    // Counted on its node at once (W92); the victims' deletion follows.
                    lower = cache.lower_nominations(&c.node, crate::cache::priority_of(&pod));
                    for p in &lower {
                        cache.clear_nomination(p.metadata.uid.as_deref().unwrap_or(""));
                    }
                    cache.nominate_holding(&pod, &c.node, c.devices.clone());
                    shared.metrics_of(&pod).preemption_victims(c.victims.len());
                } else if clear_nomination {
                    cache.clear_nomination(&uid);
                }
            }
            {
                let mut queue = shared.queue();
                queue.unschedulable(qp, fit.plugins(), claim_names, Instant::now());
            }
            let had_nomination = pod
                .status
                .as_ref()
                .and_then(|s| s.nominated_node_name.as_deref())
                .is_some_and(|n| !n.is_empty());
            binder.spawn_with(handle, move |binder| async move {
                if let Some(candidate) = nominate {
                    let node = candidate.node.clone();
                    let client = binder.client().clone();
                    let reporter = binder.reporter().clone();
                    match actuate::actuate(client, reporter, (*pod).clone(), candidate, lower).await
                    {
                        Ok(n) => debug!(pod = ?pod.metadata.name, %node, victims = n, "preemption"),
                        Err(e) => {
                            warn!(pod = ?pod.metadata.name, %node, error = %e, "preemption failed")
                        }
                    }
                } else if clear_nomination
                    && had_nomination
                    && let Err(e) = actuate::set_nomination(binder.client(), &pod, None).await
                {
                    debug!(error = %e, "nomination not cleared");
                }
                if let Some(claim) = deallocate
                    && let Err(e) = binder.deallocate(&claim).await
                {
                    warn!(error = %e, "PostFilter deallocation failed");
                }
                binder
                    .reporter()
                    .failed(&pod, FailureReason::Unschedulable, &message)
                    .await;
            });
        }
        Decision::Error(e) => {
            shared
                .metrics_of(&pod)
                .attempt(AttemptResult::Error, started.elapsed());
            shared.queue().error(qp, Instant::now());
            binder.spawn_with(handle, move |binder| async move {
                binder
                    .reporter()
                    .failed(&pod, FailureReason::SchedulerError, &e)
                    .await;
            });
        }
    }
}
