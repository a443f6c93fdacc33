//! Client-side rate limiting: `clientConnection.qps` and `burst` of a component configuration,
//! as client-go applies them (`rest.Config.QPS`/`Burst` → `flowcontrol.NewTokenBucketRateLimiter`:
//! a bucket of `burst` tokens refilled at `qps` per second; every request, a watch's first
//! included, waits for a token).
//!
//! The client is wrapped as a tower service ([`rate_limited`]), so every user of it — informers,
//! binder, reporter, leader election — shares one bucket, as client-go's components share their
//! rest client's limiter.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube::Client;

/// A token bucket: up to `burst` requests at once, then `qps` per second.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens left (negative: requests already waiting for future tokens) as of the instant.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket. A `qps` of 0 or less waits for ever (an hour per request); a `burst` of
    /// 0 counts as 1 (one request may always go).
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token at `now`: how long its request must wait for it. Tokens are reserved in
    /// order, so waiting requests go in the order they asked (as `rate.Limiter.Wait`).
    pub fn reserve(&self, now: Instant) -> Duration {
        let mut state = match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (tokens, at) = *state;
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        let tokens = (tokens + elapsed * self.qps).min(self.burst) - 1.0;
        *state = (tokens, now.max(at));
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            // A qps too small to be meaningful waits an hour rather than overflowing.
            Duration::try_from_secs_f64(-tokens / self.qps).unwrap_or(Duration::from_secs(3600))
        }
    }

    /// Waits for one token.
    pub async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// `client` with every request waiting for a token of one bucket of `qps` and `burst`.
pub fn rate_limited(client: Client, qps: f64, burst: u32) -> Client {
    let namespace = client.default_namespace().to_owned();
    let service = RateLimitedClient {
        inner: client,
        bucket: Arc::new(TokenBucket::new(qps, burst)),
    };
    Client::new(service, namespace)
}

#[derive(Clone)]
struct RateLimitedClient {
    inner: Client,
    bucket: Arc<TokenBucket>,
}

impl tower::Service<http::Request<kube::client::Body>> for RateLimitedClient {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.inner.clone();
        let bucket = self.bucket.clone();
        Box::pin(async move {
            bucket.acquire().await;
            client.send(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_qps_per_second() {
        let bucket = TokenBucket::new(10.0, 3);
        let t0 = Instant::now();
        // The state starts at construction, a moment before t0: refilling is capped at burst.
        for _ in 0..3 {
            assert_eq!(bucket.reserve(t0), Duration::ZERO);
        }
        // The next ones wait 0.1 s, 0.2 s, ... behind each other.
        let w1 = bucket.reserve(t0);
        let w2 = bucket.reserve(t0);
        assert!((w1.as_secs_f64() - 0.1).abs() < 1e-3, "{w1:?}");
        assert!((w2.as_secs_f64() - 0.2).abs() < 1e-3, "{w2:?}");
        // A second later the debt (2 tokens) is paid and 8 more accrued, capped at 3.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(t1), Duration::ZERO);
        }
        assert!(bucket.reserve(t1) > Duration::ZERO);
    }

    #[test]
    fn a_zero_burst_still_lets_one_request_through() {
        let bucket = TokenBucket::new(1.0, 0);
        let t0 = Instant::now();
        assert_eq!(bucket.reserve(t0), Duration::ZERO);
        let w = bucket.reserve(t0);
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-3, "{w:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_sleeps_for_the_reserved_wait() {
        let bucket = TokenBucket::new(4.0, 1);
        let start = tokio::time::Instant::now();
        bucket.acquire().await;
        bucket.acquire().await;
        bucket.acquire().await;
        // Two waits of 0.25 s on the paused clock.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(490), "{took:?}");
    }
}
