use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::Elapsed;
use crate::failure::BoxError;

pin_project! {
    /// Response future of [`Timeout`](super::Timeout): the inner future raced against a timer
    /// stored inline (no allocation).
    ///
    /// The timer is lazy: it is created, and the clock read, only when the inner future first
    /// answers `Pending`. A call whose inner future is ready at its first poll never touches
    /// tokio's timer or clock. The timeout therefore counts from the end of the first poll that
    /// returned `Pending`, not from [`call`](tower_service::Service::call): the time before that
    /// poll and the synchronous work of that poll itself are not counted.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        response: F,
        #[pin]
        sleep: Option<Sleep>,
        // The timeout in nanoseconds, saturated at `u64::MAX` (about 584 years, far past what
        // tokio's timer can reach, so nothing is lost): 8 bytes instead of a `Duration`'s 16
        // keeps the future small enough for a caller's `.await` to move it without a call to
        // `memmove`.
        after_nanos: u64,
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(crate) fn new(response: F, after: Duration) -> Self {
        ResponseFuture {
            response,
            sleep: None,
            after_nanos: u64::try_from(after.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(result) = this.response.poll(cx) {
            return Poll::Ready(result.map_err(Into::into));
        }
        if this.sleep.is_none() {
            // The first `Pending`: start the timer now. `tokio::time::sleep` saturates a
            // deadline past its far future (about 30 years), so `Duration::MAX` never fires and
            // never panics; a zero timeout fires at this poll.
            this.sleep.set(Some(tokio::time::sleep(Duration::from_nanos(
                *this.after_nanos,
            ))));
        }
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            let after = Duration::from_nanos(*this.after_nanos);
            tracing::debug!(timeout = ?after, "attempt timed out");
            return Poll::Ready(Err(Box::new(Elapsed::new(after))));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::future::Ready;
    use std::mem::size_of;

    use super::*;

    #[test]
    fn the_future_is_the_inner_future_a_timer_and_one_word() {
        type Inner = Ready<Result<&'static str, BoxError>>;
        assert!(
            size_of::<ResponseFuture<Inner>>()
                <= size_of::<Inner>() + size_of::<Option<Sleep>>() + size_of::<u64>()
        );
    }
}
