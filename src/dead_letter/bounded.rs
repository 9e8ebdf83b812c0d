//! The bound on each store call a caller waits for: the layer's store timeout, in real time.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::store::StoreError;

/// Runs `write` for at most `bound` of real time: `None` when it has not answered by then.
/// tokio's timer wakes it, and the bound is read on the system's clock: a paused tokio clock (a
/// test's) that jumps ahead while a real store answers over the network or from a blocking
/// thread does not cut the write short; the real time left is waited instead.
pub(crate) async fn bounded<T>(bound: Duration, write: impl Future<Output = T>) -> Option<T> {
    let started = std::time::Instant::now();
    let mut write = std::pin::pin!(write);
    if let Ok(done) = tokio::time::timeout(bound, write.as_mut()).await {
        return Some(done);
    }
    let left = bound.saturating_sub(started.elapsed());
    if left.is_zero() {
        return None;
    }
    // tokio's clock ran ahead of the real one: it is paused, and auto-advanced. A thread waits
    // the real time left, woken at once when the write answers first (its sender dropped).
    let (answered, wait) = std::sync::mpsc::channel::<()>();
    let mut real = tokio::task::spawn_blocking(move || {
        let _ = wait.recv_timeout(left);
    });
    let _answered = answered;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(done) = write.as_mut().poll(cx) {
            return Poll::Ready(Some(done));
        }
        match Pin::new(&mut real).poll(cx) {
            Poll::Ready(_) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// The store call `call`, [`bounded`] by `bound`: its answer, or the error of a store that did
/// not answer in time ([`timed_out`]).
pub(crate) async fn bounded_call<T>(
    bound: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    bounded(bound, call)
        .await
        .unwrap_or_else(|| Err(timed_out(bound)))
}

/// The error of a store call that did not answer within `bound`.
pub(crate) fn timed_out(bound: Duration) -> StoreError {
    StoreError::new(format!(
        "dead-letter store did not answer within {}",
        humantime::format_duration(bound)
    ))
}

/// The wait before trying a failed store call again, after `failed` failures (1 for the first):
/// exponential from `base`, doubling, capped at `cap`, with "equal jitter" (half the delay,
/// plus uniform in the other half), the form of Marc Brooker's "Exponential Backoff And
/// Jitter" (AWS Architecture Blog, 2015) that never waits less than half: a fleet of processes
/// whose store came back does not hit it in step, and none hammers it while it is down.
pub(crate) fn store_retry(failed: u32, base: Duration, cap: Duration) -> Duration {
    let base = base.min(cap).max(Duration::from_millis(1));
    crate::retry::Backoff::exponential(base, cap)
        .jitter(crate::retry::Jitter::Equal)
        .delay(failed.max(1), None)
}
