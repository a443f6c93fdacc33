//! Client-side deadlines for calls to plugins and drivers (spec/ecosystem.md §C1 "Deadlines",
//! A5).
//!
//! `grpc-timeout` alone is advisory: a plugin stopped with SIGSTOP, or one that ignores the
//! header, never answers, and tonic's `Request::set_timeout` only sends the header. So every
//! unary call to a plugin is also bounded locally with `tokio::time::timeout`.

use std::future::Future;
use std::time::Duration;

/// Runs `fut` (a tonic call) and gives up after `deadline` with `DeadlineExceeded`, whatever the
/// peer does.
pub async fn call_with_deadline<T, F>(deadline: Duration, fut: F) -> Result<T, tonic::Status>
where
    F: Future<Output = Result<T, tonic::Status>>,
{
    match tokio::time::timeout(deadline, fut).await {
        Ok(result) => result,
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within the {deadline:?} deadline"
        ))),
    }
}

/// A request carrying `msg` whose `grpc-timeout` header tells the server about deadline `d`.
/// Pair it with [`call_with_deadline`] for the local bound.
pub fn request_with_deadline<M>(msg: M, d: Duration) -> tonic::Request<M> {
    let mut request = tonic::Request::new(msg);
    request.set_timeout(d);
    request
}
