//! Client-side deadlines for calls to plugins and drivers (spec/ecosystem.md §C1 "Deadlines",
//! A5).
//!
//! `grpc-timeout` alone is advisory: a plugin stopped with SIGSTOP, or one that ignores the
//! header, never answers, and tonic's `Request::set_timeout` only sends the header. So every
//! unary call to a plugin is also bounded locally with `tokio::time::timeout`.
//!
//! tonic's channel also enforces a `grpc-timeout` it sends, but reports the expiry as
//! `Cancelled` ("Timeout expired"); gRPC semantics call that `DeadlineExceeded`, which is what
//! callers (and the kubelet's error paths) test for, so we report it that way.

use std::future::Future;
use std::time::Duration;

/// Runs `fut` (a tonic call) and gives up after `deadline` with `DeadlineExceeded`, whatever the
/// peer does.
pub async fn call_with_deadline<T, F>(deadline: Duration, fut: F) -> Result<T, tonic::Status>
where
    F: Future<Output = Result<T, tonic::Status>>,
{
    let exceeded =
        || tonic::Status::deadline_exceeded(format!("no answer within the {deadline:?} deadline"));
    match tokio::time::timeout(deadline, fut).await {
        Ok(Err(status)) if is_local_timeout(&status) => Err(tonic::Status::deadline_exceeded(
            format!("no answer within the request's grpc-timeout (call deadline {deadline:?})"),
        )),
        Ok(result) => result,
        Err(_) => Err(exceeded()),
    }
}

/// Whether `status` is tonic's own client-side `grpc-timeout` expiry.
fn is_local_timeout(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// A request carrying `msg` whose `grpc-timeout` header tells the server about deadline `d`.
/// Pair it with [`call_with_deadline`] for the local bound.
pub fn request_with_deadline<M>(msg: M, d: Duration) -> tonic::Request<M> {
    let mut request = tonic::Request::new(msg);
    request.set_timeout(d);
    request
}
