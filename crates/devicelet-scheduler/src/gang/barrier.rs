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

#[derive(Clone, Debug, Default)]
struct Arrivals {
    arrived: usize,
    failed: usize,
    /// Members whose PreBind succeeded.
    written: Vec<String>,
    /// The group's verdict, decided once by the last member to arrive (or by the first to give
    /// up waiting), so every member acts on the same one.
    verdict: Option<bool>,
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

    /// Reports member `uid`'s PreBind (`ok`) and waits for the others, at most `timeout`.
    /// `gone` (run by the last member to arrive) counts the members among those whose PreBind
    /// succeeded that were deleted meanwhile (they count as failed: a member deleted while its
    /// group waits takes the group below its quorum). `true`: the group keeps its quorum and
    /// this member may bind.
    pub async fn arrive(
        &self,
        uid: &str,
        ok: bool,
        timeout: Duration,
        gone: impl AsyncFnOnce(Vec<String>) -> usize,
    ) -> bool {
        let mut last = false;
        self.state.send_modify(|s| {
            s.arrived += 1;
            if ok {
                s.written.push(uid.to_owned());
            } else {
                s.failed += 1;
            }
            last = s.arrived >= self.expected;
        });
        if last {
            let written = self.state.borrow().written.clone();
            let deleted = gone(written).await;
            let may_fail = self.may_fail;
            self.state.send_if_modified(|s| {
                if s.verdict.is_some() {
                    return false;
                }
                s.verdict = Some(s.failed + deleted <= may_fail);
                true
            });
        }
        let mut rx = self.state.subscribe();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|s| s.verdict.is_some())).await;
        if let Ok(Ok(s)) = waited {
            return s.verdict == Some(true);
        }
        self.state.send_if_modified(|s| {
            if s.verdict.is_some() {
                return false;
            }
            s.verdict = Some(false);
            true
        });
        self.state.borrow().verdict == Some(true)
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
                tokio::spawn(async move {
                    b.arrive("m", true, Duration::from_secs(5), async |_| 0)
                        .await
                })
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
                    tokio::spawn(async move {
                        b.arrive(
                            &format!("m{i}"),
                            i != 1,
                            Duration::from_secs(5),
                            async |_| 0,
                        )
                        .await
                    })
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
        assert!(
            !b.arrive("a", true, Duration::from_secs(300), async |_| 0)
                .await
        );
        // The late member sees the group abandoned.
        assert!(
            !b.arrive("b", true, Duration::from_secs(300), async |_| 0)
                .await
        );
    }

    #[tokio::test]
    async fn a_member_deleted_while_its_group_waits_stops_the_whole_group() {
        let b = Arc::new(GroupBarrier::new(3, 0));
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move {
                    b.arrive(
                        &format!("m{i}"),
                        true,
                        Duration::from_secs(5),
                        async |w: Vec<String>| w.iter().filter(|u| *u == "m2").count(),
                    )
                    .await
                })
            })
            .collect();
        for h in handles {
            assert!(!h.await.expect("task"));
        }
    }
}
