//! Where the binding cycles of one group cycle meet (devicelet's answer to A-L5). Upstream's
//! members wait at Permit, each with its own 5-minute timer, and a member that fails after
//! Permit (a claim write, a binding condition) fails alone, so a gang can end up bound short of
//! its `minCount` (W28, W30). Here every member placed by the group cycle writes its claims
//! (PreBind), then waits here until all have; only if the group still has its quorum does any
//! member go on to `pods/binding`. Otherwise every member undoes its reservations and the group
//! goes back to the queue as a whole.

use std::time::Duration;

use tokio::sync::watch;

/// The rendezvous of one group cycle's members.
#[derive(Debug)]
pub struct GroupBarrier {
    expected: usize,
    /// How many members may fail PreBind with the group still at its quorum.
    may_fail: usize,
    state: watch::Sender<Arrivals>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Arrivals {
    arrived: usize,
    failed: usize,
    /// A member gave up waiting: the group does not bind.
    abandoned: bool,
}

impl GroupBarrier {
    /// A barrier for `expected` members of which `may_fail` may fail.
    pub fn new(expected: usize, may_fail: usize) -> Self {
        GroupBarrier {
            expected,
            may_fail,
            state: watch::Sender::new(Arrivals::default()),
        }
    }

    /// Reports this member's PreBind (`ok`) and waits for the others, at most `timeout`.
    /// `true`: the group keeps its quorum and this member may bind.
    pub async fn arrive(&self, ok: bool, timeout: Duration) -> bool {
        self.state.send_modify(|s| {
            s.arrived += 1;
            if !ok {
                s.failed += 1;
            }
        });
        let mut rx = self.state.subscribe();
        let expected = self.expected;
        let waited = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| s.arrived >= expected || s.abandoned),
        )
        .await;
        let done = match waited {
            Ok(Ok(s)) => *s,
            _ => {
                self.state.send_modify(|s| s.abandoned = true);
                *self.state.borrow()
            }
        };
        !done.abandoned && done.failed <= self.may_fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn all_bind_when_every_member_wrote_its_claims() {
        let b = Arc::new(GroupBarrier::new(3, 0));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let b = b.clone();
                tokio::spawn(async move { b.arrive(true, Duration::from_secs(5)).await })
            })
            .collect();
        for h in handles {
            assert!(h.await.expect("task"));
        }
    }

    #[tokio::test]
    async fn one_failure_stops_a_group_at_its_quorum_but_not_one_above_it() {
        for (may_fail, want) in [(0, false), (1, true)] {
            let b = Arc::new(GroupBarrier::new(3, may_fail));
            let handles: Vec<_> = (0..3)
                .map(|i| {
                    let b = b.clone();
                    tokio::spawn(async move { b.arrive(i != 1, Duration::from_secs(5)).await })
                })
                .collect();
            for h in handles {
                assert_eq!(h.await.expect("task"), want);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_never_arrives_abandons_the_group() {
        let b = Arc::new(GroupBarrier::new(2, 0));
        assert!(!b.arrive(true, Duration::from_secs(300)).await);
        // The late member sees the group abandoned.
        assert!(!b.arrive(true, Duration::from_secs(300)).await);
    }
}
