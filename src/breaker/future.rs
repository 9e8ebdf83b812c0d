use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;

use super::state::{Outcome, Permit};
use crate::failure::{Class, Failure};

pin_project! {
    /// Response future of [`Breaker`](super::Breaker): the inner call with its permit, or a
    /// rejection that is ready at once.
    #[derive(Debug)]
    pub struct ResponseFuture<F, R> {
        #[pin]
        kind: Kind<F, R>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F, R> {
        Called {
            #[pin]
            future: F,
            permit: Option<Permit>,
        },
        Rejected {
            failure: Option<Failure<R>>,
        },
    }
}

impl<F, R> ResponseFuture<F, R> {
    pub(crate) fn called(future: F, permit: Permit) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn rejected(failure: Failure<R>) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                failure: Some(failure),
            },
        }
    }
}

impl<F, R, E> Future for ResponseFuture<F, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<Failure<R>>,
{
    type Output = Result<R, Failure<R>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, permit } => {
                let result = ready!(future.poll(cx)).map_err(Into::into);
                if let Some(permit) = permit.take() {
                    let outcome = match &result {
                        Ok(_) => Outcome::Success,
                        Err(f) if f.class() != Class::CIRCUIT_OPEN && permit_counts(&permit, f) => {
                            Outcome::Failure
                        }
                        Err(_) => Outcome::Ignored,
                    };
                    permit.complete(outcome);
                }
                Poll::Ready(result)
            }
            KindProj::Rejected { failure } => Poll::Ready(Err(failure
                .take()
                .expect("breaker future polled after completion"))),
        }
    }
}

fn permit_counts<R>(permit: &Permit, failure: &Failure<R>) -> bool {
    permit.counts(failure.class())
}
