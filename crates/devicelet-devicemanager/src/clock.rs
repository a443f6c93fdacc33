//! Time source for the device manager. The 5-minute endpoint grace period
//! (`endpointStopGracePeriod`, `dm/types.go`) is measured with a [`Clock`] so tests can use
//! [`FakeClock`] instead of waiting.
//!
//! Durations are measured on the monotonic clock ([`Clock::now`], an [`Instant`]) and never on
//! the wall clock ([`Clock::wall`]): an NTP step, a manual `date -s` or a VM restored from a
//! snapshot moves the wall clock by hours in either direction, and a grace period measured on
//! it would then end at once (jump forward) or never (jump back). [`FakeClock`] moves the two
//! independently, so tests can check that wall-clock jumps change nothing.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// A time source: a monotonic clock for durations, a wall clock for timestamps shown to people.
pub trait Clock: Send + Sync + 'static {
    /// The current monotonic instant; every duration (grace periods) is measured on it.
    fn now(&self) -> Instant;

    /// The wall-clock time, only for timestamps shown to people; it can jump either way, so
    /// it must never measure a duration.
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The real monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to; shared by clones. Its wall clock moves with
/// [`FakeClock::advance`] and can also jump on its own ([`FakeClock::jump_wall_forward`],
/// [`FakeClock::jump_wall_back`]), as a real one does when NTP steps it.
#[derive(Debug, Clone)]
pub struct FakeClock {
    now: Arc<Mutex<(Instant, SystemTime)>>,
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeClock {
    /// A fake clock starting at the current real instant and wall-clock time.
    pub fn new() -> Self {
        FakeClock {
            now: Arc::new(Mutex::new((Instant::now(), SystemTime::now()))),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut (Instant, SystemTime)) -> R) -> R {
        f(&mut self.now.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Moves time forward (both clocks).
    pub fn advance(&self, by: Duration) {
        self.with(|(mono, wall)| {
            *mono += by;
            *wall += by;
        });
    }

    /// Steps the wall clock forward only (the monotonic clock does not move).
    pub fn jump_wall_forward(&self, by: Duration) {
        self.with(|(_, wall)| *wall += by);
    }

    /// Steps the wall clock back only (the monotonic clock does not move).
    pub fn jump_wall_back(&self, by: Duration) {
        self.with(|(_, wall)| *wall = wall.checked_sub(by).unwrap_or(SystemTime::UNIX_EPOCH));
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.with(|(mono, _)| *mono)
    }

    fn wall(&self) -> SystemTime {
        self.with(|(_, wall)| *wall)
    }
}

#[cfg(test)]
mod tests {
    //! Ecosystem A4 row 33 (the grace period of a plugin that went away) under wall-clock jumps.

    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::test_utils::{FakeDialer, FakePlugin};
    use crate::{Device, DeviceManager, DeviceManagerConfig, DevicePluginOptions, RegisterRequest};

    const RES: &str = "example.com/gpu";
    const GRACE: Duration = Duration::from_secs(300);

    async fn stopped_plugin() -> (DeviceManager, FakeClock) {
        let dialer = FakeDialer::new();
        let clock = FakeClock::new();
        let manager = DeviceManager::new(
            DeviceManagerConfig::new("/dp"),
            Arc::new(dialer.clone()),
            Arc::new(clock.clone()),
        );
        let plugin = FakePlugin::new(DevicePluginOptions::default());
        dialer.add(PathBuf::from("/dp/gpu.sock"), plugin.clone());
        manager
            .register(&RegisterRequest {
                version: "v1beta1".into(),
                endpoint: "gpu.sock".into(),
                resource_name: RES.into(),
            })
            .await
            .expect("register");
        plugin.send(vec![Device::healthy("dev-0"), Device::healthy("dev-1")]);
        settle(|| manager.capacity().allocatable.get(RES) == Some(&2)).await;
        plugin.close_streams();
        settle(|| manager.capacity().allocatable.get(RES) == Some(&0)).await;
        (manager, clock)
    }

    async fn settle(mut cond: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if cond() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("condition not reached");
    }

    fn in_grace(manager: &DeviceManager) -> bool {
        let report = manager.capacity();
        report.deleted.is_empty() && report.capacity.get(RES) == Some(&2)
    }

    #[tokio::test]
    async fn a4_33_a_wall_clock_jump_forward_does_not_end_the_grace_period_early() {
        let (manager, clock) = stopped_plugin().await;
        clock.jump_wall_forward(Duration::from_secs(24 * 3600));
        assert!(in_grace(&manager), "a day's jump ended the grace period");
        let view = manager.snapshot();
        let remaining = view
            .resource(RES)
            .and_then(|r| r.endpoint.as_ref())
            .and_then(|e| e.grace_remaining_seconds);
        assert_eq!(remaining, Some(GRACE.as_secs()));
        clock.advance(GRACE - Duration::from_secs(1));
        assert!(in_grace(&manager));
        clock.advance(Duration::from_secs(2));
        assert_eq!(manager.capacity().deleted, vec![RES.to_owned()]);
    }

    #[tokio::test]
    async fn a4_33_a_wall_clock_jump_back_does_not_stretch_the_grace_period() {
        let (manager, clock) = stopped_plugin().await;
        clock.advance(Duration::from_secs(100));
        clock.jump_wall_back(Duration::from_secs(24 * 3600));
        assert!(in_grace(&manager));
        // 301 s of real (monotonic) time after the disconnect, whatever the wall clock says.
        clock.advance(Duration::from_secs(201));
        assert_eq!(manager.capacity().deleted, vec![RES.to_owned()]);
    }

    #[test]
    fn fake_wall_clock_jumps_without_moving_the_monotonic_clock() {
        let clock = FakeClock::new();
        let (mono, wall) = (clock.now(), clock.wall());
        clock.jump_wall_forward(Duration::from_secs(60));
        clock.jump_wall_back(Duration::from_secs(3600));
        assert_eq!(clock.now(), mono);
        assert_eq!(
            wall.duration_since(clock.wall()).ok(),
            Some(Duration::from_secs(3540))
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now() - mono, Duration::from_secs(1));
    }
}
