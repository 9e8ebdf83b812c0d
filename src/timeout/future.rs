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
        after: Duration,
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(crate) fn new(response: F, after: Duration) -> Self {
        ResponseFuture {
            response,
            sleep: None,
            after,
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
            this.sleep.set(Some(tokio::time::sleep(*this.after)));
        }
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            tracing::debug!(timeout = ?this.after, "attempt timed out");
            return Poll::Ready(Err(Box::new(Elapsed::new(*this.after))));
        }
        Poll::Pending
    }
}
