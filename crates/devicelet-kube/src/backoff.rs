//! Exponential back-off with jitter for retried API calls (the kubelet's loops use client-go
//! `wait.Backoff`; the DRA slice cleanup, for example, 1 s to 5 min).

use std::time::Duration;

/// Doubling delays from `initial` up to `max`, with up to 10 % jitter so that many nodes
/// restarted together do not retry in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    seed: u64,
}

impl Backoff {
    /// A back-off starting at `initial`, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let seed = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
        Backoff {
            initial,
            max,
            next: initial,
            seed,
        }
    }

    /// The delay before the next attempt; each call doubles the following one.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        // xorshift: cheap, good enough for jitter.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter_ms = (base.as_millis() as u64 / 10).max(1);
        (base + Duration::from_millis(self.seed % jitter_ms)).min(self.max)
    }

    /// Back to the initial delay after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let delays: Vec<u64> = (0..6).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 8, 8]);
        b.reset();
        assert_eq!(b.next_delay().as_secs(), 1);
    }
}
