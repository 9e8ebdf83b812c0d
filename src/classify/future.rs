use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;

use super::Classifier;
use crate::failure::{BoxError, Class, Code, Failure};

/// The inner service's future panicked; the source of a [`Class::POISON`] failure with
/// [`Code::Panic`]. Keeps the panic's message when it was a string. Private: the failure's
/// [`Code::Panic`] says what happened, and this source's `Display` gives the message.
#[derive(Debug)]
struct Panicked {
    message: String,
}

impl Panicked {
    fn new(message: &str) -> Self {
        Panicked {
            message: message.to_owned(),
        }
    }

    fn from_payload(payload: &(dyn Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&'static str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a payload that is not a string".to_owned());
        Panicked { message }
    }
}

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "inner service panicked: {}", self.message)
    }
}

impl std::error::Error for Panicked {}

pin_project! {
    /// Response future of [`Classify`](super::Classify).
    #[derive(Debug)]
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: F,
        classifier: C,
        panicked: bool,
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn new(inner: F, classifier: C) -> Self {
        ResponseFuture {
            inner,
            classifier,
            panicked: false,
        }
    }
}

impl<F, C, R, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<R, E>>,
    R: 'static,
    E: Into<BoxError>,
    C: Classifier<R>,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if *this.panicked {
            return Poll::Ready(Err(Failure::new(Class::POISON, Code::Panic).with_source(
                Panicked::new("polled again after its inner future panicked"),
            )));
        }
        let inner = this.inner;
        // A panicking inner future is caught here, once, and becomes a poison failure: it is
        // never retried, and the service keeps serving other requests. The inner future is not
        // polled again.
        let polled = panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx)));
        let polled = match polled {
            Ok(polled) => polled,
            Err(payload) => {
                *this.panicked = true;
                let error = Panicked::from_payload(&*payload);
                tracing::error!(error = %error, "inner service panicked; classified as poison");
                return Poll::Ready(Err(
                    Failure::new(Class::POISON, Code::Panic).with_source(error)
                ));
            }
        };
        match ready!(polled) {
            Ok(response) => match this.classifier.classify_response(&response) {
                None => Poll::Ready(Ok(response)),
                Some(verdict) => {
                    tracing::debug!(class = %verdict.class, code = %verdict.code, retry_after = ?verdict.retry_after, "response classified as failure");
                    Poll::Ready(Err(verdict.into_failure().with_response(response)))
                }
            },
            Err(error) => Poll::Ready(Err(super::classify_boxed(&*this.classifier, error.into()))),
        }
    }
}
