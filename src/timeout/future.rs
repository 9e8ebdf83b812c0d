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
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        response: F,
        #[pin]
        sleep: Sleep,
        after: Duration,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(response: F, after: Duration) -> Self {
        ResponseFuture {
            response,
            sleep: tokio::time::sleep(after),
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.response.poll(cx) {
            return Poll::Ready(result.map_err(Into::into));
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => {
                tracing::debug!(timeout = ?this.after, "attempt timed out");
                Poll::Ready(Err(Box::new(Elapsed::new(*this.after))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
