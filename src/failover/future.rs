use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::failure::Failure;

pin_project! {
    /// Response future of [`Failover`](super::Failover): the primary's, or the fallback's when
    /// the primary's breaker rejected the call.
    #[derive(Debug)]
    pub struct FailoverFuture<P, F> {
        #[pin]
        kind: Route<P, F>,
    }
}

pin_project! {
    #[project = RouteProj]
    #[derive(Debug)]
    enum Route<P, F> {
        Primary {
            #[pin]
            future: P,
        },
        Fallback {
            #[pin]
            future: F,
        },
    }
}

impl<P, F> FailoverFuture<P, F> {
    #[inline]
    pub(crate) fn primary(future: P) -> Self {
        FailoverFuture {
            kind: Route::Primary { future },
        }
    }

    #[inline]
    pub(crate) fn fallback(future: F) -> Self {
        FailoverFuture {
            kind: Route::Fallback { future },
        }
    }
}

impl<P, F, R, E> Future for FailoverFuture<P, F>
where
    P: Future<Output = Result<R, Failure<R>>>,
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            RouteProj::Primary { future } => future.poll(cx),
            RouteProj::Fallback { future } => future.poll(cx).map_err(Into::into),
        }
    }
}
