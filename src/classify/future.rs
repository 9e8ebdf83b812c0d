use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;

use super::Classifier;
use crate::failure::{BoxError, Failure};

pin_project! {
    /// Response future of [`Classify`](super::Classify).
    #[derive(Debug)]
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: F,
        classifier: C,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn new(inner: F, classifier: C) -> Self {
        ResponseFuture { inner, classifier }
    }
}

impl<F, C, R, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
    C: Classifier<R>,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match ready!(this.inner.poll(cx)) {
            Ok(response) => match this.classifier.classify_response(&response) {
                None => Poll::Ready(Ok(response)),
                Some(verdict) => {
                    tracing::debug!(class = %verdict.class, code = %verdict.code, retry_after = ?verdict.retry_after, "response classified as failure");
                    Poll::Ready(Err(verdict.into_failure().with_response(response)))
                }
            },
            Err(error) => {
                let error: BoxError = error.into();
                let verdict = this.classifier.classify_error(&*error);
                tracing::debug!(class = %verdict.class, code = %verdict.code, error = %error, "error classified");
                Poll::Ready(Err(verdict.into_failure().with_source(error)))
            }
        }
    }
}
