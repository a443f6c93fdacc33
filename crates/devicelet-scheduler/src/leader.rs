//! Leader election on a `coordination.k8s.io/v1` Lease (client-go `tools/leaderelection` with
//! the `leases` lock; spec S153-S155, W130): by default `kube-system/<scheduler name>`, so it
//! never competes with kube-scheduler's own `kube-scheduler` Lease; lease duration 15 s, renew
//! deadline 10 s, retry period 2 s (all of it set by `leaderElection` in `--config`); the holder
//! identity is `<hostname>_<uuid>`.
//!
//! A candidate takes the Lease when it is free or its holder has not renewed it for a lease
//! duration; every write is conflict-checked on resourceVersion, so two candidates never both
//! win. The leader renews every retry period; when it cannot renew within the renew deadline it
//! steps down, and the process stops scheduling (as kube-scheduler exits on a lost lease).
//!
//! On shutdown a leader releases the Lease (client-go's `ReleaseOnCancel`, which kube-scheduler
//! sets): no holder, a duration of 1 s, so a standby takes over at its next retry instead of
//! waiting out the lease duration.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

/// The namespace of the Lease (`SchedulerDefaultLockObjectNamespace`).
pub const NAMESPACE: &str = "kube-system";
/// `leaseDuration`.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// `renewDeadline`.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// `retryPeriod`.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Where the Lease is and its timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// The defaults for scheduler `name`.
    pub fn named(name: &str) -> Self {
        LeaseSettings {
            namespace: NAMESPACE.to_owned(),
            name: name.to_owned(),
            lease_duration: LEASE_DURATION,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY_PERIOD,
        }
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Leadership as seen by the rest of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    Candidate,
    Leader,
    /// Held and lost: the scheduler must stop.
    Lost,
}

/// The identity this replica writes as holder.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Whether `lease` is free for `me` (no holder, ours, or not renewed for its duration).
fn available(lease: &Lease, me: &str, default_duration: Duration) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return true;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() || holder == me {
        return true;
    }
    let duration = spec
        .lease_duration_seconds
        .map(|s| Duration::from_secs(s.max(0) as u64))
        .unwrap_or(default_duration);
    let Some(renew) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renew.0);
    age.as_secs_f64() > duration.as_secs_f64()
}

/// One try to take or renew the Lease. `Ok(true)`: we hold it now.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    me: &str,
) -> Result<bool, kube::Error> {
    let name = settings.name.as_str();
    let current = api.get_opt(name).await?;
    let Some(mut lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(settings.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.to_owned()),
                lease_duration_seconds: Some(settings.lease_seconds()),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    if !available(&lease, me, settings.lease_duration) {
        return Ok(false);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(me) {
        spec.holder_identity = Some(me.to_owned());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(settings.lease_seconds());
    spec.renew_time = Some(now());
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up if `me` holds it (`release` in client-go's leaderelection): the holder is
/// cleared and the duration set to 1 s. `Ok(false)`: someone else holds it, nothing written.
pub async fn release(
    client: Client,
    settings: &LeaseSettings,
    me: &str,
) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let Some(mut lease) = api.get_opt(&settings.name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(false);
    };
    if spec.holder_identity.as_deref() != Some(me) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(now());
    spec.renew_time = Some(now());
    // Conflict-checked: a Lease taken over meanwhile is left alone.
    match api
        .replace(&settings.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Campaigns for and keeps the Lease, publishing the state on `state`. Returns after
/// leadership is lost or `stop` turns true.
pub async fn run(
    client: Client,
    settings: LeaseSettings,
    me: String,
    state: watch::Sender<Leadership>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let name = format!("{}/{}", settings.namespace, settings.name);
    let mut leader_since_renew: Option<Instant> = None;
    loop {
        let attempt = tokio::time::timeout(
            settings.retry_period,
            try_acquire_or_renew(&api, &settings, &me),
        )
        .await;
        let held = match attempt {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                warn!(lease = %name, error = %e, "leader election: lease write failed");
                false
            }
            Err(_) => {
                warn!(lease = %name, timeout = ?settings.retry_period, "leader election: lease write timed out");
                false
            }
        };
        match (held, leader_since_renew) {
            (true, None) => {
                info!(lease = %name, identity = %me, "acquired the leader lease");
                let _ = state.send(Leadership::Leader);
                leader_since_renew = Some(Instant::now());
            }
            (true, Some(_)) => leader_since_renew = Some(Instant::now()),
            (false, Some(last)) if last.elapsed() > settings.renew_deadline => {
                warn!(lease = %name, "leader election lost: could not renew within the deadline");
                let _ = state.send(Leadership::Lost);
                return;
            }
            (false, _) => {}
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(settings.retry_period) => {}
        }
    }
}
